"""One table of a domain-transfer family: pre-training, fine-tuning and the from-scratch control, joined by model
and seed (OTCE Tables 2 and 6 report their largest gaps after fine-tuning).

    python -m recipes.transfer --pretrain runs/sweep-logs/<stage 1> --finetune runs/sweep-logs/<stage 2> \\
        --control runs/sweep-logs/<control> [--baseline jamba] [--only MODEL …] [--out table.md] [--plot curves.png]

Each option takes the log folders or records (``record.json``, such as those kept in docs/results/records/) of one
or more sweeps: a family run a seed at a time gives one of each per piece. The three stages are the sweeps of
``english/transfer/pretrain``, of ``english/transfer/finetune --init-from <stage 1>`` and of
``english/transfer/finetune --init-from none`` (docs/results.md).

Per model, over its seeds: the pre-training validation loss (on the pre-training domains), the fine-tuned one and
the control's (both on the held-out domain), and the **gain from pre-training**, control − fine-tuned, taken per
seed (the same seed's two runs: a paired difference, so the model's seed-to-seed spread cancels). Against
``--baseline``: each column's difference of means, and for the fine-tuned loss and the gain Welch's p with Holm's
adjustment over the models (:mod:`recipes.stats`).

The join is checked, not assumed: every fine-tuned run must have started from the last checkpoint of the given
pre-training run of its model and seed, and every control from scratch; what does not fit is named, all of it,
in one error. A failed or unfinished run is named under the table and left out of its cells (a seed whose
fine-tuned or control run is missing gives no gain).
"""

import argparse
import math
import sys
from pathlib import Path

from recipes.figures import png_figure
from recipes.stats import detectable_effect, holm, summarize, welch
from recipes.sweep.launch import family_settings
from recipes.sweep.records import Run, code_note, data_note, finished_result, pooling_problem, read_manifest
from recipes.sweep.report import val_curves

STAGES = ("pretrain", "finetune", "control")


def stage_runs(sources: list[Path]) -> list[Run]:
    """The runs of one stage: every run of the given sweeps (log folders or records)."""
    return [run for source in sources for run in read_manifest(Path(source))[1]]


def join(stages: dict[str, list[Run]]) -> tuple[dict[str, dict[str, dict[int | None, float]]], list[str]]:
    """``{model: {stage: {seed: final validation loss}}}`` over the finished runs, and the notes for the runs left
    out. Raises ValueError naming every fine-tuned run that did not start from the given pre-training run of its
    model and seed, every control that did not start from scratch or is not a recipe of the fine-tuning family, and
    every model and seed given twice in a stage."""
    losses: dict[str, dict[str, dict[int | None, float]]] = {}
    notes, problems = [], []
    pretrained = {Path(run.folder).resolve(): (run.config.stem, run.seed) for run in stages["pretrain"]}
    tuned_on = {Path(run.config).parent.resolve() for run in stages["finetune"]}
    for stage in STAGES:
        for run in stages[stage]:
            name, seed = run.config.stem, run.seed
            which = name + ("" if seed is None else f" seed {seed}")
            label = f"{stage} {which}"
            if stage == "finetune":
                source = None if run.init_from is None else pretrained.get(Path(run.init_from).resolve().parent.parent)
                if source != (name, seed):
                    problems.append(f"{label} started from {run.init_from or 'scratch'}, not from the last checkpoint of "
                                    f"a --pretrain run of {which}")
                    continue
            if stage == "control" and run.init_from is not None:
                problems.append(f"{label} started from {run.init_from}: a control trains from scratch "
                                "(--init-from none)")
                continue
            if stage == "control" and tuned_on and Path(run.config).parent.resolve() not in tuned_on:
                problems.append(f"{label} is a recipe of {Path(run.config).parent}, not of the fine-tuning family "
                                f"({', '.join(sorted(map(str, tuned_on)))}): the control trains the same recipe from scratch")
                continue
            cells = losses.setdefault(name, {s: {} for s in STAGES})[stage]
            if seed in cells:
                problems.append(f"{label} is given twice")
                continue
            result, why = finished_result(run)
            if result is None or math.isnan(result["val_loss"]):
                notes.append(f"{label} {why or 'logged no validation loss'}")
                continue
            cells[seed] = result["val_loss"]
    if problems:
        raise ValueError("; ".join(problems))
    return losses, notes


def gains(cells: dict[str, dict[int | None, float]]) -> dict[int | None, float]:
    """Per seed with both runs finished: the control's loss minus the fine-tuned one (what pre-training is worth)."""
    return {seed: cells["control"][seed] - loss for seed, loss in cells["finetune"].items() if seed in cells["control"]}


def transfer_table(losses: dict[str, dict[str, dict[int | None, float]]], baseline: str | None = None,
                   notes: list[str] = ()) -> str:
    """The markdown table of :func:`join`'s losses: each cell mean ± std over seeds (with its Δ against
    ``baseline``'s mean in brackets), and for the fine-tuned loss and the gain Welch's p, Holm's adjustment over
    the models and the difference detectable with 80% power at the observed spreads."""
    if baseline is not None and baseline not in losses:
        raise ValueError(f"--baseline {baseline!r} is not one of the models ({', '.join(losses)})")
    columns = {name: {**{stage: list(cells[stage].values()) for stage in STAGES},
                      "gain": list(gains(cells).values())} for name, cells in losses.items()}
    compared = [name for name in columns if baseline is not None and name != baseline]
    tests = {}
    for column in ("finetune", "gain"):
        raw = {name: welch(columns[name][column], columns[baseline][column])[1] for name in compared}
        tests[column] = {name: (raw[name], adjusted) for name, adjusted in zip(compared, holm(list(raw.values())))}

    def cell(name: str, column: str) -> str:
        s = summarize(columns[name][column])
        if s.n == 0:
            return "-"
        text = str(s)
        if name in compared and columns[baseline][column]:
            text += f" ({s.mean - summarize(columns[baseline][column]).mean:+.4f})"
        return text

    def p(name: str, column: str) -> str:
        if name not in compared:
            return "(baseline)" if name == baseline else "-"
        raw, adjusted = tests[column][name]
        if math.isnan(raw):
            return "< 2 runs"
        a, b = summarize(columns[name][column]), summarize(columns[baseline][column])
        return f"{raw:.3g} / {adjusted:.3g} ({detectable_effect(a.std, a.n, b.std, b.n):.3f})"

    rows = ["| model | seeds | pre-training val loss | fine-tuned val loss | p / Holm (detectable Δ) | from scratch | "
            "gain from pre-training | p / Holm (detectable Δ) |",
            "|---|---|---|---|---|---|---|---|"]
    for name in columns:
        seeds = sorted({seed for stage in STAGES for seed in losses[name][stage]}, key=lambda s: (s is None, s))
        rows.append(f"| {name} | {', '.join('-' if s is None else str(s) for s in seeds)} | {cell(name, 'pretrain')} | "
                    f"{cell(name, 'finetune')} | {p(name, 'finetune')} | {cell(name, 'control')} | "
                    f"{cell(name, 'gain')} | {p(name, 'gain')} |")
    bracket = (f" In brackets: the difference of means against {baseline}; after the p-values, the difference a "
               "Welch test would detect 80% of the time at these spreads." if baseline else "")
    legend = ("Validation loss at the end of each stage, mean ± std over seeds; the gain is the control's loss minus "
              f"the fine-tuned one, per seed.{bracket}")
    return "\n".join(rows + ["", legend] + ([""] + [f"- {line}" for line in notes] if notes else []))


def transfer_curves(stages: dict[str, list[Run]], models: list[str]) -> dict[tuple[str, str], tuple]:
    """``{(model, "finetune" or "control"): (steps, mean, std, n_runs)}``: each model's validation curve on the
    held-out domain in the two stages that train on it, over its finished runs (:func:`recipes.sweep.report.val_curves`)."""
    curves = {}
    for stage in ("finetune", "control"):
        found = val_curves([run for run in stages[stage] if run.config.stem in models])
        curves.update({(name, stage): found[name] for name in models if name in found})
    return curves


def plot_transfer(stages: dict[str, list[Run]], models: list[str], path: Path) -> None:
    """The held-out domain's validation loss along fine-tuning (solid) and along the control's training from scratch
    (dashed), one colour per model, the mean over its seeds: the gap between a model's two lines is what
    pre-training is worth at each step."""
    with png_figure(path, figsize=(10, 4.8)) as (_, axes):
        for (name, stage), (steps, mean, _, n) in transfer_curves(stages, models).items():
            style, what = ("-", "fine-tuned") if stage == "finetune" else ("--", "from scratch")
            axes.plot(steps, mean, style, color=f"C{models.index(name) % 10}", marker="o", markersize=2,
                      label=f"{name}, {what} (n={n})")
        axes.set(xlabel="training step on the held-out domain", ylabel="validation loss (held-out domain)",
                 title="fine-tuned (solid) against trained from scratch (dashed)")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: inside it hid curves


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.transfer",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for stage, what in (("pretrain", "the pre-training sweeps"), ("finetune", "the fine-tuning sweeps "
                        "(run with --init-from the pre-training ones)"), ("control", "the from-scratch sweeps "
                        "(--init-from none)")):
        parser.add_argument(f"--{stage}", nargs="+", action="extend", required=True, type=Path, metavar="LOGS",
                            help=f"{what}: runs/sweep-logs/<time> folders or record.json files")
    parser.add_argument("--baseline", default=None,
                        help="the model the others are compared with (default: the fine-tuning family's _family.yaml)")
    parser.add_argument("--only", nargs="+", action="extend", default=None, metavar="MODEL",
                        help="these models only (Holm's adjustment then runs over their comparisons): e.g. the MoE "
                             "variants against routed")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this markdown file")
    parser.add_argument("--plot", type=Path, default=None, metavar="PNG",
                        help="also draw the fine-tuning and from-scratch validation curves of each model here")
    args = parser.parse_args(argv)
    try:
        stages = {stage: stage_runs(getattr(args, stage)) for stage in STAGES}
        losses, notes = join(stages)
        for stage in STAGES:  # a stage's sweeps pool as seeds: not runs of one model under other settings
            problem = pooling_problem([(str(source), read_manifest(source)[1]) for source in getattr(args, stage)])
            if problem:
                raise ValueError(f"--{stage}: {problem.removeprefix('--from: ')}")
        if args.only:
            unknown = sorted(set(args.only) - set(losses))
            if unknown:
                raise ValueError(f"--only names {unknown}, not models of these sweeps ({', '.join(losses)})")
            losses = {name: cells for name, cells in losses.items() if name in args.only}
            notes = [line for line in notes if line.split()[1] in args.only]
        # (each stage's runs of a model read one corpus; the stages read two, by design: data compared per stage)
        notes += [f"{stage}: {note}" for stage in STAGES if (note := data_note(stages[stage]))]
        notes += [note for note in [code_note([run for stage in STAGES for run in stages[stage]])] if note]
        baseline = args.baseline
        if baseline is None and stages["finetune"]:
            default = family_settings(Path(stages["finetune"][0].config).parent).get("baseline")
            baseline = default if default in losses else None
        text = transfer_table(losses, baseline, notes)
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    if args.plot is not None:
        plot_transfer(stages, list(losses), args.plot)


if __name__ == "__main__":
    main()
