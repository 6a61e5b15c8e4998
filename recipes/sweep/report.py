"""A sweep's tables and figures: one row per run (:func:`table`), or per recipe over seeds with the statistical
protocol (:func:`seed_table`: Welch, Holm, the detectable difference, TOST, the best loss), the validation curves
(mean ± std over seeds) and a final metric against a hyper-parameter."""

import math
import re
import statistics
from pathlib import Path

from recipes.figures import png_figure
from recipes.sweep.records import (CONFIG_SECTIONS, Run, code_note, data_note, finished_result, hparam, run_curve,
                                   run_result)


def speed(tokens_per_sec: float) -> str:
    """A median speed for a table; "-" for a run that logged none (fewer steps than ``log_every_n_steps``)."""
    return "-" if math.isnan(tokens_per_sec) else f"{tokens_per_sec:,.0f}"


def number(value: float, digits: int = 4) -> str:
    """A loss, perplexity or accuracy for a table; "-" for one the run never logged."""
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


NO_VALIDATION = ("ran no validation (a trainer.check_val_every_n_epoch past the epochs it trained? "
                 "--set trainer.check_val_every_n_epoch=1 validates at least at the last step)")
"""The note under a table for a run that finished without a validation loss (a run validates its last step, except
in an epoch that ``check_val_every_n_epoch`` skips), whose table cells would otherwise just be empty."""


NO_SPEED = ("logged no training speed (timed over each logging window of trainer.log_every_n_steps steps after the "
            "first: a shorter run has none)")


def with_notes(rows: list[str], notes: list[str], quiet: list[str], balance: str | None = None) -> str:
    """A table's rows, then its notes as a list, the recipes that logged no speed (``quiet``) in one of them, then
    the experts' balance where the runs logged one (:func:`balance_line`)."""
    notes = notes + ([f"{', '.join(quiet)} {NO_SPEED}"] if quiet else [])
    return "\n".join(rows + ([""] + [f"- {line}" for line in notes] if notes else [])
                     + (["", balance] if balance else []))


def balance_line(results: dict[str, list[dict]]) -> str | None:
    """Under a table of MoE runs: per recipe, the busiest expert's load over the mean at the last logged step (1
    uniform, ``E`` collapsed), averaged over the MoE blocks, as mean ± std over its runs; None where no run logged
    one (a family without MoE, or records written before 2026-12-05); beside each, where its runs logged it (from
    2026-12-06 on), the same within each sequence, averaged over the sequences."""
    cells, sequences = [], False
    for name, finished in results.items():
        loads = [r["max_load"] for r in finished if not math.isnan(r.get("max_load", math.nan))]
        within = [r["max_load_sequence"] for r in finished if not math.isnan(r.get("max_load_sequence", math.nan))]
        if loads:
            cells.append(f"{name} {mean_and_spread(loads)}" + (f" (within a sequence {mean_and_spread(within)})"
                                                              if within else ""))
            sequences = sequences or bool(within)
    if not cells:
        return None
    explained = "; within a sequence: the same in each sequence, averaged over them" if sequences else ""
    return ("Experts' balance (the busiest expert's load over the mean at the last logged step, 1 = uniform, "
            f"averaged over the MoE blocks{explained}): " + "; ".join(cells))


def mean_and_spread(values: list[float]) -> str:
    """``mean ± std`` to two decimals (the mean alone for one value)."""
    return f"{statistics.fmean(values):.2f}" + (f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else "")


def table(runs: list[Run]) -> str:
    rows = ["| recipe | pattern | params | active | steps | val loss | val ppl | val acc | train tok/s |",
            "|---|---|---|---|---|---|---|---|---|"]
    notes, quiet, finished = [], [], {}
    for run in runs:
        name = run.config.stem
        r, why = finished_result(run)
        if r is None:
            rows.append(f"| {name} | {why} |  |  |  |  |  |  |  |")
            continue
        if math.isnan(r["val_loss"]):
            notes.append(f"{name} {NO_VALIDATION}")
        if math.isnan(r["tok_s"]):
            quiet.append(name)
        rows.append(
            f"| {name} | `{r['pattern']}` | {r['params']:,} | {r['active']:,} | {r['steps']} | "
            f"{number(r['val_loss'])} | {number(r['val_ppl'], 3)} | {number(r['val_acc'], 3)} | {speed(r['tok_s'])} |"
        )
        finished.setdefault(name, []).append(r)
    return with_notes(rows, notes, quiet, balance_line(finished))


EARLY_BEST = (0.8, 0.005)
"""A run's best validation loss "lies well before its end" when it came at or before 80% of its steps and the
final loss is worse by at least 0.005 nats: the run was overfitting or unstable, and its final loss is not
what the recipe can reach."""


def early_best(result: dict) -> bool:
    fraction, gap = EARLY_BEST
    return (result["best_step"] <= fraction * result["steps"]
            and result["val_loss"] - result["best_val_loss"] >= gap)


def seed_table(runs: list[Run], baseline: str | None = None, margin: float | None = None) -> str:
    """Per recipe, over its runs that finished: mean ± std and the 95% interval of the final validation
    loss, the best validation loss (mean over runs, with the median step it came at), accuracy and speed;
    against ``baseline``: the difference of mean final loss with Welch's p, Holm's adjustment over the
    family's comparisons, the difference detectable with 80% power at the observed spreads, and with
    ``margin`` the TOST p-value of equivalence within ± margin (:mod:`recipes.stats`). Runs whose best
    loss lies well before their end (:data:`EARLY_BEST`) are listed under the table."""
    from recipes.stats import detectable_effect, holm, summarize, tost, welch

    results: dict[str, list[dict]] = {}
    launched: dict[str, int] = {}
    notes, quiet = [], []  # (quiet: the recipes whose runs logged no speed, said in one note)
    for run in runs:
        name = run.config.stem
        launched[name] = launched.get(name, 0) + 1
        results.setdefault(name, [])
        result, why = finished_result(run)
        if result is None:
            notes.append(f"{name} seed {run.seed} {why}")
            continue
        results[name].append(result)
        if math.isnan(result["val_loss"]):
            notes.append(f"{name} seed {run.seed} {NO_VALIDATION}")
        elif not math.isnan(result["best_val_loss"]) and early_best(result):
            notes.append(f"{name} seed {run.seed}: best val loss {result['best_val_loss']:.4f} at step "
                         f"{result['best_step']} of {result['steps']}; final {result['val_loss']:.4f}")
    if baseline is not None and baseline not in results:
        raise ValueError(f"--baseline {baseline!r} is not one of the recipes run ({', '.join(results)})")
    loss = lambda name: [r["val_loss"] for r in results[name] if not math.isnan(r["val_loss"])]  # noqa: E731
    compared = [name for name in results if baseline is not None and name != baseline]
    welch_p = {name: welch(loss(name), loss(baseline))[1] for name in compared}
    holm_p = dict(zip(compared, holm([welch_p[name] for name in compared])))
    # (the five comparison columns only against a baseline: without one they held nothing but dashes)
    versus_heads = ("" if baseline is None else f"Δ loss vs {baseline} | p (Welch) | p (Holm) | detectable Δ (80%) | "
                    f"TOST p{f' (±{margin})' if margin is not None else ''} | ")
    rows = ["| recipe | runs | params | active | val loss, mean ± std | 95% interval | val acc, mean ± std | "
            f"train tok/s | {versus_heads}best val loss (step) |",
            "|---" * (9 + 5 * (baseline is not None)) + "|"]
    fmt = lambda p: "< 2 runs" if math.isnan(p) else f"{p:.3g}"  # noqa: E731
    for name, finished in results.items():
        s = summarize(loss(name))
        acc = summarize([r["val_acc"] for r in finished if not math.isnan(r["val_acc"])])
        speeds = [r["tok_s"] for r in finished if not math.isnan(r["tok_s"])]
        bests = [r["best_val_loss"] for r in finished if not math.isnan(r["best_val_loss"])]
        best = (f"{statistics.fmean(bests):.4f} ({statistics.median(r['best_step'] for r in finished):.0f})"
                if bests else "-")
        if baseline is None:
            versus = ""
        elif name == baseline:
            versus = "(baseline) | - | - | - | - | "
        else:
            diff = welch(loss(name), loss(baseline))[0]
            b = summarize(loss(baseline))
            mde = detectable_effect(s.std, s.n, b.std, b.n)
            equivalence = "-" if margin is None else fmt(tost(loss(name), loss(baseline), margin))
            # NaN p: fewer than two finished runs on a side, so no test; say so rather than print "nan".
            versus = (f"{'-' if math.isnan(diff) else f'{diff:+.4f}'} | {fmt(welch_p[name])} | {fmt(holm_p[name])} | "
                      f"{'-' if math.isnan(mde) else f'{mde:.4f}'} | {equivalence} | ")
        interval = f"[{s.low:.4f}, {s.high:.4f}]" if s.n > 1 else "-"
        if finished and not speeds:
            quiet.append(name)
        sizes = f"{counts(finished, 'params')} | {counts(finished, 'active')}"
        rows.append(f"| {name} | {s.n} of {launched[name]} | {sizes} | {s} | {interval} | "
                    f"{acc} | {speed(statistics.median(speeds) if speeds else math.nan)} | "
                    f"{versus}{best} |")
    return with_notes(rows, notes, quiet, balance_line(results))


def counts(finished: list[dict], key: str) -> str:
    """The parameter count ``key`` of a recipe's finished runs: one number (seeds build the same model), a range
    where they differ (a recipe edited between runs), "-" for none."""
    values = sorted({r[key] for r in finished if not math.isnan(r[key])})  # (NaN: a run that recorded none)
    return "-" if not values else f"{values[0]:,}" if len(values) == 1 else f"{values[0]:,}–{values[-1]:,}"


def val_curves(runs: list[Run], tag: str = "val/loss") -> dict[str, tuple[list[int], list[float], list[float], int]]:
    """Per recipe, over its finished runs: ``(steps, mean, std, n_runs)`` of ``tag`` at the steps every
    one of those runs validated at (std is 0 for a single run). A step is the number of optimizer steps done, as
    in the tables' ``steps`` and ``best step``: TensorBoard's step of a validation is one less."""
    series: dict[str, list[dict[int, float]]] = {}
    for run in runs:
        if not run.failed:
            values = run_curve(run, tag)
            if values:
                series.setdefault(run.config.stem, []).append(values)
    curves = {}
    for name, per_run in series.items():
        steps = sorted(set.intersection(*(set(v) for v in per_run)))
        mean = [statistics.fmean(v[step] for v in per_run) for step in steps]
        std = [statistics.stdev(v[step] for v in per_run) if len(per_run) > 1 else 0.0 for step in steps]
        curves[name] = ([step + 1 for step in steps], mean, std, len(per_run))
    return curves


def plot_curves(curves: dict, path: Path, title: str) -> None:
    """Validation curves, the mean over seeds with a band of ± one standard deviation, into ``path`` (PNG)."""
    with png_figure(path, figsize=(7, 4.5)) as (_, axes):
        for name, (steps, mean, std, n) in curves.items():
            line, = axes.plot(steps, mean, marker="o", markersize=3, label=f"{name} (n={n})")
            axes.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                              color=line.get_color(), alpha=0.2)
        axes.set(xlabel="training step", ylabel="validation loss", title=title)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)


def less_value(name: str, key: str) -> str | None:
    """``name`` less the part that names ``key``'s value, or None where it has none: ``recipes.sweep.grid``'s
    ``optimizer-SGD_lr0.02`` → ``optimizer-SGD``, a one-axis grid's ``lr0.02`` → ``lr``, a hand-written
    ``dense_lr4x`` → ``dense``."""
    label = key.rsplit(".", 1)[-1].replace("_", "")
    head, _, last = name.rpartition("_")
    if re.fullmatch(rf"{re.escape(label)}[-+.]?\d.*", last):
        return head or key.rsplit(".", 1)[-1]
    return None


def vs_line(name: str, key: str, values_named: bool = False) -> str:
    """The line of a ``--vs key`` figure a recipe's point joins: :func:`less_value`'s name where the name names the
    value; where other recipes' names do (``values_named``), the name whole — a family's recipe at its own value,
    ``ablate_moe`` beside ``ablate_moe_lr4x``, and ``routed_switanh`` apart from ``routed``; else the name less its
    last ``_`` part (``ssd_T64_d16`` → ``ssd_T64``, a grid by hand whose names say the value otherwise)."""
    stripped = less_value(name, key)
    if stripped is not None:
        return stripped
    return name if values_named else name.rpartition("_")[0] or name


def metric_vs(runs: list[Run], key: str, metric: str = "val_acc") -> dict[str, list[tuple[float, float, float, int]]]:
    """Per line (:func:`vs_line`), the points ``(x, mean, std, n)`` of the final ``metric`` over the finished runs of
    each recipe, ``x`` its hyper-parameter ``key``, sorted by x."""
    values_named = any(less_value(run.config.stem, key) is not None for run in runs)
    values: dict[tuple[str, float], list[float]] = {}
    for run in runs:
        if run.failed:
            continue
        line = vs_line(run.config.stem, key, values_named)
        value = run_result(run)[metric]
        if not math.isnan(value):
            x = hparam(run, key)
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                what = "setting" if key.split(".")[0] in CONFIG_SECTIONS else "hyper-parameter"
                raise ValueError(f"{what} {key!r} is {x!r} in {run.folder}, not a number")
            values.setdefault((line, float(x)), []).append(value)
    lines: dict[str, list] = {}
    for (line, x), v in sorted(values.items(), key=lambda item: (item[0][0], item[0][1])):
        lines.setdefault(line, []).append((x, statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0, len(v)))
    return lines


def plot_vs(lines: dict, path: Path, key: str, metric: str, title: str) -> None:
    """``metric`` against ``key``, one line per entry of :func:`metric_vs`, error bars ± one std."""
    with png_figure(path, figsize=(6, 4.5)) as (_, axes):
        for name, points in lines.items():
            xs, mean, std, _ = zip(*points)
            axes.errorbar(xs, mean, yerr=std, marker="o", capsize=3, label=name)
        axes.set_xscale("log", base=2)
        axes.set_xticks(sorted({x for points in lines.values() for x, *_ in points}))
        axes.xaxis.set_major_formatter("{x:g}")  # the widths themselves, not powers of two
        axes.set(xlabel=key, ylabel=metric.replace("_", " "), title=title)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)


def vs_table(lines: dict, key: str, metric: str) -> str:
    """:func:`metric_vs`'s points as a table, a row a line and a column a value of ``key``: mean ± std (runs), each
    row's best in bold (the least loss or perplexity, the most accuracy) and its value named in the last column."""
    xs = sorted({x for points in lines.values() for x, *_ in points})
    label = key.rsplit(".", 1)[-1]
    rows = [f"| {metric.replace('_', ' ')} against {label} | " + " | ".join(f"{x:g}" for x in xs) + " | best |",
            "|---" * (len(xs) + 2) + "|"]
    pick = max if metric == "val_acc" else min
    for name, points in lines.items():
        best = pick(points, key=lambda point: point[1])
        cells = {x: f"{number(mean)} ± {number(std)} ({n})" for x, mean, std, n in points}
        cells[best[0]] = f"**{cells[best[0]]}**"
        rows.append(f"| {name} | " + " | ".join(cells.get(x, "-") for x in xs) + f" | {best[0]:g} |")
    return "\n".join(rows)


def report(runs: list[Run], logs: Path, family: str, seeds: bool, baseline: str | None,
           vs: str | None, metric: str, margin: float | None = None, notes: list[str] = ()) -> str:
    """The table (printed and written to ``logs/table.md``), ``notes`` under it (and one where a recipe's runs read
    other data, or the runs come from more than one version of the code: :func:`~recipes.sweep.records.data_note`,
    :func:`~recipes.sweep.records.code_note`), and the figures beside it. A ``vs``
    figure that cannot be drawn (a key the runs do not record, or not a number) is a note under the table, not the
    table lost."""
    text = seed_table(runs, baseline, margin) if seeds else table(runs)
    notes = [*notes, *filter(None, [data_note(runs), code_note(runs)])]
    if notes:  # (a blank line after the table's last row; none after its own notes)
        text += ("\n" if text.endswith("|") else "") + "".join(f"\n- {note}" for note in notes)
    logs.mkdir(parents=True, exist_ok=True)
    curves = val_curves(runs)
    if curves:
        plot_curves(curves, logs / "val_loss.png", f"{family}: validation loss" + (" (mean ± std over seeds)" if seeds else ""))
    if vs:
        try:
            lines = metric_vs(runs, vs, metric)
        except ValueError as error:
            lines = {}
            text += f"\n\nno {metric} against {vs} figure: {error} (--from this sweep's logs with another --vs redraws it)"
        if lines:
            plot_vs(lines, logs / f"{metric}_vs_{vs.replace('.', '_')}.png", vs, metric, f"{family}: {metric} against {vs}")
            text += "\n\n" + vs_table(lines, vs, metric)
    (logs / "table.md").write_text(f"# {family}\n\n{text}\n")
    return text
