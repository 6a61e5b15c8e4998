"""Run a family of recipes and compare them: ``python -m recipes.sweep FOLDER``.

    python -m recipes.sweep positions                          # every recipes/configs/positions/*.yaml
    python -m recipes.sweep positions --only ssd_rope ssd_conv  # a subset
    python -m recipes.sweep positions --set trainer.max_steps=50  # any override, for every run
    python -m recipes.sweep positions --table-only              # tabulate the latest existing runs

Each recipe runs as its own ``python -m recipes fit`` process (its log goes to
``runs/sweep-logs/NAME.log``); then one markdown table is printed from the TensorBoard logs: final
validation loss, perplexity and accuracy, parameters, and median training tokens per second.
"""

import argparse
import math
import statistics
import subprocess
import sys
import time
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


def log_dir(config: Path) -> Path:
    """The newest ``version_N`` folder of the TensorBoard logger the recipe names."""
    logger = yaml.safe_load(config.read_text())["trainer"]["logger"]["init_args"]
    root = Path(logger.get("save_dir", "runs")) / logger.get("name", config.stem)
    versions = sorted(root.glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    if not versions:
        raise FileNotFoundError(f"no run of {config.name} under {root}")
    return versions[-1]


def read_run(run: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    last = lambda tag: events.Scalars(tag)[-1].value if tag in tags else math.nan  # noqa: E731
    speeds = [e.value for e in events.Scalars("train/tokens_per_sec")] if "train/tokens_per_sec" in tags else []
    hparams = yaml.safe_load((run / "hparams.yaml").read_text()) if (run / "hparams.yaml").is_file() else {}
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


def table(configs: list[Path]) -> str:
    rows = ["| recipe | pattern | params | active | steps | val loss | val ppl | val acc | train tok/s |",
            "|---|---|---|---|---|---|---|---|---|"]
    for config in configs:
        try:
            r = read_run(log_dir(config))
        except FileNotFoundError as error:
            rows.append(f"| {config.stem} | ({error}) |  |  |  |  |  |  |  |")
            continue
        rows.append(
            f"| {config.stem} | `{r['pattern']}` | {r['params']:,} | {r['active']:,} | {r['steps']} | "
            f"{r['val_loss']:.4f} | {r['val_ppl']:.3f} | {r['val_acc']:.3f} | {r['tok_s']:,.0f} |"
        )
    return "\n".join(rows)


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

    if not args.table_only:
        logs = Path("runs") / "sweep-logs"
        logs.mkdir(parents=True, exist_ok=True)
        for config in configs:
            start = time.perf_counter()
            command = [sys.executable, "-m", "recipes", "fit", "--config", str(config),
                       "--trainer.enable_progress_bar", "false", *overrides]
            with open(logs / f"{config.stem}.log", "w") as log:
                code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
            status = "ok" if code == 0 else f"FAILED (exit {code}; see {logs / (config.stem + '.log')})"
            print(f"{config.stem}: {status} in {time.perf_counter() - start:.0f} s", flush=True)
    print(table(configs))


if __name__ == "__main__":
    main()
