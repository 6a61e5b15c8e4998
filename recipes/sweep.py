"""Run a family of recipes and compare them: ``python -m recipes.sweep FOLDER``.

    python -m recipes.sweep positions                          # every recipes/configs/positions/*.yaml
    python -m recipes.sweep positions --only ssd_rope ssd_conv  # a subset
    python -m recipes.sweep positions --set trainer.max_steps=50  # any override, for every run
    python -m recipes.sweep positions --table-only              # tabulate the latest existing runs
    python -m recipes.sweep positions --seeds 3 --jobs 2 --baseline ssd_rope   # statistics over seeds

Each recipe runs as its own ``python -m recipes fit`` process, logging into a run folder named for
this sweep (``<logger root>/sweep_<time>``; its output goes to ``runs/sweep-logs/<time>/NAME.log``);
then one markdown table is printed from exactly those folders: final validation loss, perplexity and
accuracy, parameters, and median training tokens per second. A run that failed is marked FAILED in the
table (with its exit status and log), and the sweep then exits with status 1.

With ``--seeds N`` each recipe runs N times (``seed_everything`` 0 … N-1), ``--jobs J`` at a time, each
process given ``cores // J`` threads so the runs do not oversubscribe the machine. The table then
gives, per recipe, the final validation loss and accuracy as mean ± standard deviation with a 95%
interval of the mean, the number of runs behind each cell (of those launched), and with
``--baseline NAME`` the difference of mean loss to that recipe with the p-value of Welch's t-test
(:mod:`recipes.stats`). The cells come from exactly the runs launched; a failed run is named under the
table and left out of its recipe's cells.
"""

import argparse
import concurrent.futures
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from recipes.cli import CONFIG_DIR


def recipe_files(folder: str) -> list[Path]:
    path = Path(folder) if Path(folder).is_dir() else CONFIG_DIR / folder
    if not path.is_dir():
        bundled = sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir())
        raise FileNotFoundError(f"recipe folder {folder!r} not found (bundled folders: {', '.join(bundled)})")
    files = sorted(path.glob("*.yaml"))
    if not files:
        raise FileNotFoundError(f"recipe folder {str(path)!r} holds no .yaml recipes")
    return files


def logger_root(config: Path) -> Path:
    """The folder that holds the versions of the TensorBoard logger the recipe names."""
    logger = yaml.safe_load(config.read_text())["trainer"]["logger"]["init_args"]
    return Path(logger.get("save_dir", "runs")) / logger.get("name", config.stem)


def newest_run(config: Path) -> Path:
    """The most recently written run folder of the recipe (for ``--table-only``)."""
    root = logger_root(config)
    runs = sorted((p for p in root.glob("*") if (p / "hparams.yaml").is_file()), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise FileNotFoundError(f"no run of {config.name} under {root}")
    return runs[-1]


@dataclass
class Run:
    """One launched (or found) run: its recipe, its folder, and how its process ended."""

    config: Path
    folder: Path
    returncode: int = 0
    log: Path | None = None
    seed: int | None = None

    @property
    def failed(self) -> bool:
        return self.returncode != 0


def read_run(run: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not (run / "hparams.yaml").is_file():
        raise FileNotFoundError(f"{run} holds no run")
    events = EventAccumulator(str(run))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    last = lambda tag: events.Scalars(tag)[-1].value if tag in tags else math.nan  # noqa: E731
    speeds = [e.value for e in events.Scalars("train/tokens_per_sec")] if "train/tokens_per_sec" in tags else []
    hparams = yaml.safe_load((run / "hparams.yaml").read_text())
    return {
        "pattern": hparams.get("pattern", "?"),
        "params": hparams.get("n_params", math.nan),
        "active": hparams.get("n_active_params", math.nan),
        "steps": events.Scalars("val/loss")[-1].step + 1 if "val/loss" in tags else 0,
        "val_loss": last("val/loss"),
        "val_ppl": last("val/ppl"),
        "val_acc": last("val/acc"),
        "tok_s": statistics.median(speeds) if speeds else math.nan,
    }


def table(runs: list[Run]) -> str:
    rows = ["| recipe | pattern | params | active | steps | val loss | val ppl | val acc | train tok/s |",
            "|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        name = run.config.stem
        if run.failed:
            rows.append(f"| {name} | FAILED (exit {run.returncode}; log {run.log}) |  |  |  |  |  |  |  |")
            continue
        try:
            r = read_run(run.folder)
        except (FileNotFoundError, KeyError) as error:
            rows.append(f"| {name} | no results in {run.folder} ({error}) |  |  |  |  |  |  |  |")
            continue
        rows.append(
            f"| {name} | `{r['pattern']}` | {r['params']:,} | {r['active']:,} | {r['steps']} | "
            f"{r['val_loss']:.4f} | {r['val_ppl']:.3f} | {r['val_acc']:.3f} | {r['tok_s']:,.0f} |"
        )
    return "\n".join(rows)


def launch(configs: list[Path], overrides: list[str], seeds: int | None = None, jobs: int = 1) -> list[Run]:
    """Run each recipe (once, or once per seed ``0 … seeds-1``) as its own process, ``jobs`` at a time,
    each into a run folder named for this sweep (and seed)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = Path("runs") / "sweep-logs" / stamp
    logs.mkdir(parents=True, exist_ok=True)
    runs = []
    for config in configs:
        for seed in range(seeds) if seeds else [None]:
            suffix = "" if seed is None else f"_seed{seed}"
            runs.append(Run(config, logger_root(config) / f"sweep_{stamp}{suffix}",
                            log=logs / f"{config.stem}{suffix}.log", seed=seed))
    threads = max(1, (os.cpu_count() or 1) // jobs)  # each process's share of the cores

    def one(run: Run) -> None:
        start = time.perf_counter()
        command = [sys.executable, "-m", "recipes", "fit", "--config", str(run.config),
                   "--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.version", run.folder.name,
                   *([] if run.seed is None else ["--seed_everything", str(run.seed)]), *overrides]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        with open(run.log, "w") as log:
            run.returncode = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        status = "ok" if not run.failed else f"FAILED (exit {run.returncode}; see {run.log})"
        print(f"{run.config.stem}{'' if run.seed is None else f' seed {run.seed}'}: {status} in "
              f"{time.perf_counter() - start:.0f} s", flush=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, runs))
    return runs


def seed_table(runs: list[Run], baseline: str | None = None) -> str:
    """Per recipe, over its runs that finished: mean ± std and the 95% interval of the final validation
    loss and accuracy, the runs behind them, and the difference to ``baseline`` with Welch's p-value."""
    from recipes.stats import summarize, welch

    results: dict[str, list[dict]] = {}
    launched: dict[str, int] = {}
    failed = []
    for run in runs:
        name = run.config.stem
        launched[name] = launched.get(name, 0) + 1
        results.setdefault(name, [])
        if run.failed:
            failed.append(f"{name} seed {run.seed} FAILED (exit {run.returncode}; log {run.log})")
            continue
        try:
            results[name].append(read_run(run.folder))
        except (FileNotFoundError, KeyError) as error:
            failed.append(f"{name} seed {run.seed}: no results in {run.folder} ({error})")
    if baseline is not None and baseline not in results:
        raise ValueError(f"--baseline {baseline!r} is not one of the recipes run ({', '.join(results)})")
    loss = lambda name: [r["val_loss"] for r in results[name] if not math.isnan(r["val_loss"])]  # noqa: E731
    rows = ["| recipe | runs | val loss, mean ± std | 95% interval | val acc, mean ± std | train tok/s | "
            f"Δ loss vs {baseline or '-'} | p (Welch) |", "|---|---|---|---|---|---|---|---|"]
    for name, finished in results.items():
        s = summarize(loss(name))
        acc = summarize([r["val_acc"] for r in finished if not math.isnan(r["val_acc"])])
        speeds = [r["tok_s"] for r in finished if not math.isnan(r["tok_s"])]
        diff, p = welch(loss(name), loss(baseline)) if baseline and name != baseline else (math.nan, math.nan)
        rows.append(f"| {name} | {s.n} of {launched[name]} | {s.mean:.4f} ± {s.std:.4f} | [{s.low:.4f}, {s.high:.4f}] | "
                    f"{acc.mean:.4f} ± {acc.std:.4f} | {statistics.median(speeds) if speeds else math.nan:,.0f} | "
                    f"{diff:+.4f} | {p:.3g} |")
    return "\n".join(rows + ([""] + [f"- {line}" for line in failed] if failed else []))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="a folder of recipes: a path, or a bundled name such as 'positions'")
    parser.add_argument("--only", nargs="+", default=None, help="recipe names (file stems) to run")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="overrides for every run")
    parser.add_argument("--table-only", action="store_true", help="do not run; tabulate the latest runs")
    parser.add_argument("--seeds", type=int, default=None, help="run each recipe with seeds 0 … N-1; statistics")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (threads split between them)")
    parser.add_argument("--baseline", default=None, help="with --seeds: the recipe the others are compared with")
    args = parser.parse_args(argv)
    if args.seeds is not None and args.seeds < 1 or args.jobs < 1:
        sys.exit(f"error: --seeds {args.seeds} and --jobs {args.jobs} must be >= 1")
    if args.seeds is not None and args.table_only:
        sys.exit("error: --table-only reads one run per recipe; --seeds launches new ones")
    try:
        configs = recipe_files(args.folder)
    except FileNotFoundError as error:
        sys.exit(f"error: {error}")
    if args.only:
        unknown = set(args.only) - {c.stem for c in configs}
        if unknown:
            sys.exit(f"error: --only names {sorted(unknown)} not in {args.folder} ({', '.join(c.stem for c in configs)})")
        configs = [c for c in configs if c.stem in args.only]
    if args.baseline is not None and args.baseline not in {c.stem for c in configs}:
        sys.exit(f"error: --baseline {args.baseline!r} is not one of the recipes ({', '.join(c.stem for c in configs)})")
    overrides = []
    for item in args.set:
        if "=" not in item:
            sys.exit(f"error: --set takes KEY=VALUE; got {item!r}")
        key, value = item.split("=", 1)
        overrides += [f"--{key}", value]

    if args.table_only:
        runs = []
        for config in configs:
            try:
                runs.append(Run(config, newest_run(config)))
            except FileNotFoundError as error:
                runs.append(Run(config, logger_root(config), returncode=-1, log=str(error)))
    else:
        runs = launch(configs, overrides, args.seeds, args.jobs)
    print(seed_table(runs, args.baseline) if args.seeds else table(runs))
    failed = [run.config.stem for run in runs if run.failed]
    if failed:
        sys.exit(f"error: {len(failed)} of {len(runs)} runs failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
