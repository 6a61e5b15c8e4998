"""A long-context suite, or lm-eval tasks, over every run of a sweep, and their statistics over seeds
(``python -m recipes.sweep --from runs/sweep-logs/<time> --suite length`` or ``--tasks T1,T2``;
docs/evaluation.md).

Each finished run's ``last.ckpt`` is evaluated with ``python -m recipes eval`` (results in
``<logs>/<suite or tasks>/<recipe>_seed<k>.json``, reused when present and of the checkpoint's step); then per
recipe, mode and length (or metric and task) the mean ± std over seeds, the difference to the baseline recipe
with Welch's p and Holm's adjustment over the family's comparisons at that length (task), and a figure.
"""

import contextlib
import json
import math
import statistics
from pathlib import Path

from recipes.figures import png_figure
from recipes.stats import holm, summarize, welch


def evaluate_runs(runs, logs: Path, suite: str, extra: list[str]) -> dict[tuple[str, int | None], dict]:
    """``{(recipe, seed): result}`` for every finished run, computing the missing ones. ``suite`` is a suite's
    name, or ``"tasks"`` with ``extra`` naming them (``--tasks T1,T2 --include_path DIR``): then the result is
    the harness's ``{"results": …}``."""
    from recipes.code_version import code_label, code_version
    from recipes.evaluation.cli import main as evaluate, parser, score_settings, shared_task_index
    from recipes.evaluation.suites import result_paths

    tasks = suite == "tasks"
    folder = Path(logs) / result_name(suite, extra)
    folder.mkdir(parents=True, exist_ok=True)
    flags = [*([] if tasks else ["--suite", suite, "--extrapolate"]), *extra]
    # what a stored result must have been scored with (the same for every run: read, and its files hashed, once)
    wanted = score_settings(parser().parse_args(["--config", "-", "--ckpt_path", "-", *flags]))
    results, now, other_code = {}, code_version(), {}  # (other_code: {its label: the runs whose scores it computed})
    with shared_task_index() if tasks else contextlib.nullcontext():  # the harness's task index built once
        for run in runs:
            if run.failed:
                continue
            checkpoint = Path(run.folder) / "checkpoints" / "last.ckpt"
            out = folder / f"{run.config.stem}_seed{run.seed}"
            written = result_paths(out)[0]
            argv = ["--config", str(run.config), "--ckpt_path", str(checkpoint), "--out", str(out), "--force", *flags]
            # a stored result is reused only if it scored this checkpoint's step with these settings (a result of
            # `--multiples 1 2` was returned for `--multiples 1 2 4 8`, a `--limit 8` one for `--limit 100`)
            if not written.is_file():
                why = ""
            elif stale_step(written, checkpoint):
                why = " (trained on since)"
            elif stored(written, "settings") not in (None, wanted):
                why = " (other settings)"
            else:
                why = None  # the stored result stands
                code = stored(written, "code")
                if code is not None and code != now:
                    other_code.setdefault(code_label([code]), []).append(f"{run.config.stem} seed {run.seed}")
            if why is not None:
                print(f"evaluating {run.config.stem} seed {run.seed}: {suite}{why}", flush=True)
                # (--force: the sweep's own folder, whose JSON is missing or stale; its table or figure may be left)
                evaluate(argv)
            results[run.config.stem, run.seed] = json.loads(written.read_text())["harness" if tasks else "suite"]
    if other_code:  # (kept, not redone: most commits change no score, and a family's evaluation takes long)
        print(f"note: stored scores reused from other code than this ({code_label([now])}): "
              + "; ".join(f"{label}: {', '.join(names)}" for label, names in other_code.items())
              + f"; delete {folder}/ to score them again with this code", flush=True)
    return results


def stored(result: Path, key: str):
    """What an ``eval --out`` JSON keeps under ``key`` — ``step`` (the training step of the checkpoint it scored),
    ``settings`` (the options its scores depend on) —, or None in results written before it was kept."""
    return json.loads(result.read_text()).get(key)


def stale_step(result: Path, checkpoint: Path) -> bool:
    """Whether the run has trained on since ``result`` scored its checkpoint."""
    return stored(result, "step") not in (None, trained_step(checkpoint))


def trained_step(checkpoint: Path) -> int:
    from recipes.checkpoints import load_checkpoint

    return int(load_checkpoint(checkpoint, mmap=True).get("global_step", 0))


def tasks_named(extra: list[str]) -> str:
    """The ``--tasks`` value among a command's arguments."""
    for i, argument in enumerate(extra):
        if argument == "--tasks" and i + 1 < len(extra):
            return extra[i + 1]
        if argument.startswith("--tasks="):
            return argument.partition("=")[2]
    raise ValueError("name the tasks to evaluate: --tasks T1,T2")


def result_name(suite: str, extra: list[str]) -> str:
    """Where a sweep's results of ``suite`` go under its log folder: the suite's name, or ``tasks_<T1>_<T2>``."""
    return "tasks_" + tasks_named(extra).replace(",", "_") if suite == "tasks" else suite


def is_harness(result: dict) -> bool:
    return "results" in result


def points(result: dict) -> dict[tuple[str, int], float]:
    """A suite result as ``{(mode or depth, length): value}``: the loss (length) or accuracy (passkey, mqar);
    a harness result as ``{(metric, task): value}`` (every ``metric,filter`` score but the standard errors; not
    lm-eval's bookkeeping such as ``sample_len``)."""
    if is_harness(result):
        return {(metric.split(",")[0], task): float(value) for task, metrics in result["results"].items()
                for metric, value in metrics.items()
                if "," in metric and isinstance(value, (int, float)) and not metric.split(",")[0].endswith("_stderr")}
    if result["suite"] == "length":
        return {(row["mode"], row["length"]): row["loss"] for row in result["rows"]}
    if result["suite"] == "passkey":
        by_length = {}
        for cell in result["cells"]:
            by_length.setdefault(cell["length"], []).append(cell["accuracy"])
        return {("all depths", length): statistics.fmean(values) for length, values in by_length.items()}
    if result["suite"] in ("sink", "entropy"):
        return {(row["layer"], row["length"]): row["share" if result["suite"] == "sink" else "entropy"]
                for row in result["rows"]}
    return {("-", row["length"]): row["accuracy"] for row in result["rows"]}


def table(results: dict, baseline: str | None) -> str:
    by_recipe: dict[str, dict[tuple, list[float]]] = {}
    for (recipe, _), result in results.items():
        for key, value in points(result).items():
            by_recipe.setdefault(recipe, {}).setdefault(key, []).append(value)
    keys = sorted({key for values in by_recipe.values() for key in values}, key=lambda k: (k[1], k[0]))
    first = next(iter(results.values()))
    metric = ("value" if is_harness(first) else "loss" if first["suite"] == "length" else
              "first token's share" if first["suite"] == "sink" else
              "entropy ÷ log(keys)" if first["suite"] == "entropy" else "accuracy")
    mode_name, column = ("metric", "task") if is_harness(first) else (
        "layer" if first["suite"] in ("sink", "entropy") else "mode", "length")
    versus_heads = f" Δ vs {baseline} | p (Welch) | p (Holm, per {column}) |" if baseline else ""  # (else only dashes)
    rows = [f"| recipe | {mode_name} | {column} | runs | {metric}, mean ± std |{versus_heads}",
            "|---" * (5 + 3 * bool(baseline)) + "|"]
    for mode, length in keys:
        compared = [r for r in by_recipe if baseline and r != baseline and (mode, length) in by_recipe[r]
                    and (mode, length) in by_recipe.get(baseline, {})]
        raw = {r: welch(by_recipe[r][mode, length], by_recipe[baseline][mode, length]) for r in compared}
        adjusted = dict(zip(compared, holm([raw[r][1] for r in compared])))
        for recipe in sorted(by_recipe):
            values = by_recipe[recipe].get((mode, length))
            if not values:
                continue
            s = summarize(values)
            if recipe in raw:
                diff, p = raw[recipe]
                versus = f"{diff:+.4f} | {'< 2 runs' if math.isnan(p) else f'{p:.3g}'} | " \
                         f"{'< 2 runs' if math.isnan(adjusted[recipe]) else f'{adjusted[recipe]:.3g}'}"
            else:
                versus = "(baseline) | - | -" if recipe == baseline else "- | - | -"
            versus = f" {versus} |" if baseline else ""
            rows.append(f"| {recipe} | {mode} | {length} | {s.n} | {s.mean:.4f} ± {0 if math.isnan(s.std) else s.std:.4f} |"
                        + versus)
    return "\n".join(rows)


def plot(results: dict, path: Path, title: str) -> None:
    if is_harness(next(iter(results.values()))):
        return plot_tasks(results, path, title)
    if next(iter(results.values()))["suite"] in ("sink", "entropy"):
        return plot_sink(results, path, title)
    by_line: dict[tuple[str, str], dict[int, list[float]]] = {}
    for (recipe, _), result in results.items():
        for (mode, length), value in points(result).items():
            by_line.setdefault((recipe, mode), {}).setdefault(length, []).append(value)
    with png_figure(path, figsize=(7.5, 4.5)) as (_, axes):
        for (recipe, mode), values in sorted(by_line.items()):
            lengths = sorted(values)
            mean = [statistics.fmean(values[n]) for n in lengths]
            std = [statistics.stdev(values[n]) if len(values[n]) > 1 else 0.0 for n in lengths]
            axes.errorbar(lengths, mean, yerr=std, marker="o", markersize=3, capsize=2,
                          linestyle="--" if mode == "ntk" else "-", label=f"{recipe} ({mode})")
        axes.set_xscale("log", base=2)
        metric = {"length": "validation loss", "sink": "weight on the first token",
                  "entropy": "attention entropy ÷ log(keys)"}.get(
            next(iter(results.values()))["suite"], "accuracy")
        axes.set(xlabel="evaluation length (tokens)", ylabel=metric, title=title)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=6, ncol=2)


def plot_sink(results: dict, path: Path, title: str) -> None:
    """The sink (or entropy) suite over seeds: per recipe and length a line over the layers (mean ± std of the first
    token's share, or of the entropy), the even spread dashed."""
    by_line: dict[tuple[str, int], dict[str, list[float]]] = {}
    uniform = {}
    sink = next(iter(results.values()))["suite"] == "sink"
    for (recipe, _), result in results.items():
        uniform.update(result.get("uniform", {}) if sink else {"even": 1.0})
        for (layer, length), value in points(result).items():
            by_line.setdefault((recipe, length), {}).setdefault(layer, []).append(value)
    with png_figure(path, figsize=(7.5, 4.5)) as (_, axes):
        for (recipe, length), values in sorted(by_line.items()):
            layers = list(values)  # (in the order the suite gives them: by layer, the mean last)
            axes.errorbar(range(len(layers)), [statistics.fmean(values[n]) for n in layers],
                          yerr=[statistics.stdev(values[n]) if len(values[n]) > 1 else 0.0 for n in layers],
                          marker="o", markersize=3, capsize=2, label=f"{recipe} (length {length})")
            axes.set_xticks(range(len(layers)), layers, fontsize=6, rotation=30)
        for length, share in uniform.items():
            axes.axhline(share, color="grey", linewidth=0.8, linestyle="--")
        axes.set(xlabel="attention layer", ylabel="weight on the first token" if sink else "attention entropy ÷ log(keys)",
                 title=f"{title} (grey: an even spread)")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=6)


def plot_tasks(results: dict, path: Path, title: str) -> None:
    """One bar per recipe, task and metric (mean ± std over seeds), runs as dots."""
    by_bar: dict[tuple[str, str, str], list[float]] = {}
    for (recipe, _), result in results.items():
        for (metric, task), value in points(result).items():
            by_bar.setdefault((task, metric, recipe), []).append(value)
    with png_figure(path, figsize=(7.5, 4.5)) as (_, axes):
        for x, (_, values) in enumerate(sorted(by_bar.items())):
            axes.bar(x, statistics.fmean(values), yerr=statistics.stdev(values) if len(values) > 1 else 0, capsize=3,
                     color="C0", alpha=0.6)
            axes.plot([x] * len(values), values, "k.", markersize=3)
        axes.set_xticks(range(len(by_bar)), [f"{recipe}\n{task} {metric}" for task, metric, recipe in sorted(by_bar)],
                        fontsize=6)
        axes.set(ylabel="score", title=title)
        axes.grid(alpha=0.3, axis="y")


def report(runs, logs: Path, family: str, suite: str, baseline: str | None, extra: list[str]) -> str:
    """Evaluate every finished run (``suite``: a suite's name, or ``"tasks"`` with ``--tasks`` in ``extra``),
    write ``<logs>/<name>.md`` and ``.png``, and return the table."""
    results = evaluate_runs(runs, logs, suite, extra)
    if not results:
        return f"no finished run to evaluate in {logs}"
    text = table(results, baseline)
    name = result_name(suite, extra)
    what = f"tasks {tasks_named(extra)}" if suite == "tasks" else f"{suite} suite"
    (Path(logs) / f"{name}.md").write_text(f"# {family}: {what}\n\n{text}\n")
    plot(results, Path(logs) / f"{name}.png", f"{family}: {what} (mean ± std over seeds{'; dashed: NTK' if suite == 'length' else ''})")
    return text
