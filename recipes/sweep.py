"""Run a family of recipes and compare them: ``python -m recipes.sweep FOLDER``.

    python -m recipes.sweep positions                          # every recipes/configs/positions/*.yaml
    python -m recipes.sweep positions --only ssd_rope ssd_conv  # a subset
    python -m recipes.sweep positions --set trainer.max_steps=50  # any override, for every run
    python -m recipes.sweep positions --table-only              # tabulate the latest existing runs

Each recipe runs as its own ``python -m recipes fit`` process, logging into a run folder named for
this sweep (``<logger root>/sweep_<time>``; its output goes to ``runs/sweep-logs/<time>/NAME.log``);
then one markdown table is printed from exactly those folders: final validation loss, perplexity and
accuracy, parameters, and median training tokens per second. A run that failed is marked FAILED in the
table (with its exit status and log), and the sweep then exits with status 1.
"""

import argparse
import math
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


def launch(configs: list[Path], overrides: list[str]) -> list[Run]:
    """Run each recipe as its own process, each into a run folder named for this sweep."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = Path("runs") / "sweep-logs" / stamp
    logs.mkdir(parents=True, exist_ok=True)
    runs = []
    for config in configs:
        version = f"sweep_{stamp}"
        run = Run(config, logger_root(config) / version, log=logs / f"{config.stem}.log")
        start = time.perf_counter()
        command = [sys.executable, "-m", "recipes", "fit", "--config", str(config),
                   "--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.version", version, *overrides]
        with open(run.log, "w") as log:
            run.returncode = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
        status = "ok" if not run.failed else f"FAILED (exit {run.returncode}; see {run.log})"
        print(f"{config.stem}: {status} in {time.perf_counter() - start:.0f} s", flush=True)
        runs.append(run)
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="a folder of recipes: a path, or a bundled name such as 'positions'")
    parser.add_argument("--only", nargs="+", default=None, help="recipe names (file stems) to run")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="overrides for every run")
    parser.add_argument("--table-only", action="store_true", help="do not run; tabulate the latest runs")
    args = parser.parse_args(argv)
    try:
        configs = recipe_files(args.folder)
    except FileNotFoundError as error:
        sys.exit(f"error: {error}")
    if args.only:
        unknown = set(args.only) - {c.stem for c in configs}
        if unknown:
            sys.exit(f"error: --only names {sorted(unknown)} not in {args.folder} ({', '.join(c.stem for c in configs)})")
        configs = [c for c in configs if c.stem in args.only]
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
        runs = launch(configs, overrides)
    print(table(runs))
    failed = [run.config.stem for run in runs if run.failed]
    if failed:
        sys.exit(f"error: {len(failed)} of {len(runs)} runs failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
