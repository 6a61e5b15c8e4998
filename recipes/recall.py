"""``python -m recipes.recall``: who recalls, and whose loss ranks lower, over sweep records where runs jump.

    python -m recipes.recall docs/results/records/mqar_hard-*.json --treatment ifa ifa_mask --baseline qcattn

Made for ``mqar_hard`` (Wonderful Matrices v2's IFA against QCAttention on multi-query recall), where a run either
stays at chance or jumps to recall and a mean ± std of a cell is a meaningless band between two modes. Recipes are
named ``<variant>_d<width>``; the treatment's variants are pooled into one kind. For each width, and over the
widths both kinds ran at, it counts:

- **recall**: runs whose final ``val_acc`` exceeds ``--threshold`` (default 0.5; chance is 1/64 there), the
  treatment's against the baseline's, with Fisher's exact two-sided test of the 2×2 table;
- **loss ranks**: of every (treatment run, baseline run) pair at one width, how many end with the treatment's
  ``val_loss`` lower, with the exact two-sided Mann-Whitney test (per width only: losses of different widths do not
  compare).

A run that failed (no stored result) is named and left out. Every record holds one seed's (or a few seeds') runs;
give them all.
"""

import argparse
import re
from collections import defaultdict
from pathlib import Path

from scipy import stats as scipy_stats

from recipes.sweep.records import code_note, data_note, pooling_problem, read_record

RECIPE = re.compile(r"(?P<variant>.+)_d(?P<width>\d+)$")


def read_runs(paths: list[Path]) -> tuple[list[dict], list[str]]:
    """``([{variant, width, seed, val_loss, val_acc}], [what was left out and why])`` from sweep records
    (read by the sweep's own :func:`recipes.sweep.records.read_record`, which refuses a file that is not one, by name)."""
    runs, left_out, seen = [], [], {}
    for path in paths:
        for run in read_record(path)[1]:
            name = run.config.stem
            match = RECIPE.match(name)
            result = (run.stored or {}).get("result")
            if match is None:
                left_out.append(f"{path.name}: {name} (not <variant>_d<width>)")
            elif not result or "val_loss" not in result or "val_acc" not in result:
                left_out.append(f"{path.name}: {name} seed {run.seed} (no stored result)")
            else:
                key = (name, run.seed)
                if key in seen:  # one run counted twice would weigh its seed double
                    raise ValueError(f"{name} seed {key[1]} has results in both {seen[key]} and {path.name}: "
                                     "give each run's record once")
                seen[key] = path.name
                runs.append({"variant": match["variant"], "width": int(match["width"]), "seed": run.seed,
                             "val_loss": result["val_loss"], "val_acc": result["val_acc"]})
    return runs, left_out


def recall_table(treated: list[dict], base: list[dict], threshold: float) -> dict:
    """Recall counts of both kinds and Fisher's exact two-sided p of the 2×2 table."""
    hits = lambda runs: sum(r["val_acc"] > threshold for r in runs)  # noqa: E731
    a, b = hits(treated), hits(base)
    p = float(scipy_stats.fisher_exact([[a, len(treated) - a], [b, len(base) - b]]).pvalue) if treated and base else float("nan")
    return {"treated": (a, len(treated)), "base": (b, len(base)), "p": p}


def loss_ranks(treated: list[dict], base: list[dict]) -> dict:
    """Pairs where the treatment's loss is lower (ties count half), and the exact two-sided Mann-Whitney p."""
    if not treated or not base:
        return {"below": float("nan"), "pairs": 0, "p": float("nan")}
    t, b = [r["val_loss"] for r in treated], [r["val_loss"] for r in base]
    below = sum((x < y) + 0.5 * (x == y) for x in t for y in b)
    exact = "exact" if len(set(t + b)) == len(t + b) else "asymptotic"  # ties: no exact distribution
    p = float(scipy_stats.mannwhitneyu(t, b, alternative="two-sided", method=exact).pvalue)
    return {"below": below, "pairs": len(t) * len(b), "p": p}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.recall",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("records", nargs="+", type=Path, help="sweep records (record.json), one or more seeds each")
    parser.add_argument("--treatment", nargs="+", action="extend", required=True,
                        help="variants pooled as the treatment kind")
    parser.add_argument("--baseline", required=True, help="the variant compared against")
    parser.add_argument("--threshold", type=float, default=0.5, help="val_acc above which a run recalls")
    args = parser.parse_args(argv)
    if not 0 <= args.threshold < 1:  # val_acc lies in [0, 1]: at 1 or above no run recalls, below 0 every run does
        parser.error(f"--threshold {args.threshold}: an accuracy, in [0, 1)")
    if args.baseline in args.treatment:
        parser.error(f"--baseline {args.baseline} is also a --treatment variant: a kind compared with itself")
    missing = [str(p) for p in args.records if not p.is_file()]
    if missing:
        parser.error(f"no such record: {', '.join(missing)}")
    try:
        runs, left_out = read_runs(args.records)
        # (what pooling sweeps' tables refuse: runs of one recipe under other settings, other recipe files, ...)
        problem = pooling_problem([(path.name, read_record(path)[1]) for path in args.records])
    except ValueError as error:
        parser.error(str(error))
    if problem:
        parser.error(problem.removeprefix("--from: "))
    variants = sorted({r["variant"] for r in runs})
    unknown = [v for v in [*args.treatment, args.baseline] if v not in variants]
    if unknown:
        parser.error(f"no runs of {', '.join(unknown)} in these records; they hold {', '.join(variants) or 'none'}")
    by_width = defaultdict(lambda: ([], []))
    for r in runs:
        if r["variant"] in args.treatment:
            by_width[r["width"]][0].append(r)
        elif r["variant"] == args.baseline:
            by_width[r["width"]][1].append(r)
    seeds = sorted({r["seed"] for r in runs if r["seed"] is not None})
    print(f"{len(runs)} runs, seeds {seeds[0]}-{seeds[-1]} ({len(seeds)}); treatment {' + '.join(args.treatment)}, "
          f"baseline {args.baseline}; recall: val_acc > {args.threshold}\n")
    print("| width | treatment recalls | baseline recalls | Fisher p | pairs with lower treatment loss | Mann-Whitney p |\n"
          "|---|---|---|---|---|---|")
    for width in sorted(by_width):
        treated, base = by_width[width]
        rec, ranks = recall_table(treated, base, args.threshold), loss_ranks(treated, base)
        # a width only one kind was run at has nothing to test: dashes, not nan
        tests = (f"{rec['p']:.2g} | {ranks['below']:g} of {ranks['pairs']} | {ranks['p']:.2g}" if treated and base
                 else f"- | - | - (no {'baseline' if treated else 'treatment'} runs at this width)")
        print(f"| d{width} | {rec['treated'][0]} of {rec['treated'][1]} | {rec['base'][0]} of {rec['base'][1]} "
              f"| {tests} |")
    # pooled over the widths both kinds ran at: a width one kind lacks would weigh the other's count alone
    matched = [both for both in by_width.values() if all(both)]
    treated = [r for t, _ in matched for r in t]
    base = [r for _, b in matched for r in b]
    rec = recall_table(treated, base, args.threshold)
    p = f"{rec['p']:.2g}" if matched else "- (no width has runs of both)"
    print(f"| all | {rec['treated'][0]} of {rec['treated'][1]} | {rec['base'][0]} of {rec['base'][1]} | {p} | - | - |")
    for line in left_out:
        print(f"left out: {line}")
    pooled = [run for path in args.records for run in read_record(path)[1]]
    for note in filter(None, [data_note(pooled), code_note(pooled)]):  # (as under a sweep's table)
        print(f"note: {note}")


if __name__ == "__main__":
    main()
