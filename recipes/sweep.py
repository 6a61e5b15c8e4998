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

With ``--seeds N`` each recipe runs N times (``seed_everything`` 0 … N-1; ``--first-seed K``: K … K+N-1, to
add seeds to an earlier sweep and tabulate both with ``--from``), ``--jobs J`` at a time, each
process given ``cores // J`` threads so the runs do not oversubscribe the machine. The table then
gives, per recipe, the final validation loss and accuracy as mean ± standard deviation with a 95%
interval of the mean, the number of runs behind each cell (of those launched), and with
``--baseline NAME`` the difference of mean loss to that recipe with the p-value of Welch's t-test
(:mod:`recipes.stats`). The cells come from exactly the runs launched; a failed run is named under the
table and left out of its recipe's cells.

Every sweep writes ``runs/sweep-logs/<time>/``: the runs' logs, ``sweep.json`` (the runs it launched:
recipe, seed, run folder, exit status; rewritten as each run ends), ``table.md`` (the table printed),
and ``val_loss.png``, each recipe's validation-loss curve (with seeds: the mean over seeds and a band
of ± one standard deviation). ``--from runs/sweep-logs/<time> …`` tabulates and plots earlier sweeps
again from their ``sweep.json``, exactly their runs (several folders: one table, in the first).

Each sweep also writes ``record.json``, rewritten as each run ends: the manifest with every finished run's
numbers (final and best validation loss, accuracy, speed, validation-loss curve, hyper-parameters). ``--from``
takes such a file as well as a folder, so a sweep can be tabulated and plotted again once its run folders are
gone — on another machine, or from the copy kept with the results (``docs/results/records/``, one per sweep
quoted in docs/results.md).

``--vs KEY`` adds ``<metric>_vs_<KEY>.png``: the
final ``--metric`` (default ``val_acc``) against a model hyper-parameter such as ``d_model``, one line
per recipe name without its last ``_`` part (``ssd_T64_d16``, ``ssd_T64_d32`` → line ``ssd_T64``).

``--launcher gpus`` runs one recipe per visible GPU (or group of ``--devices-per-run``) at a time;
``--launcher slurm`` submits the runs as a submitit job array, requeued from their ``last.ckpt`` on
preemption, and tabulates them when the array is done (:mod:`recipes.launchers`, docs/training.md).

TensorBoard: every run logs to ``<save_dir>/<family>/<recipe>/sweep_<time>[_seed<k>]``, so
``tensorboard --logdir runs/<family>`` overlays the family's recipes and seeds (filter on
``sweep_<time>`` for one sweep); the sweep prints that command.

Fine-tuning a family's runs: ``--init-from runs/sweep-logs/<time> …`` starts each run from the ``last.ckpt`` of
the earlier sweep's run with the same recipe name and seed (``--model.init_from``; all are checked before
anything launches). A family whose ``_family.yaml`` says ``starts_from: FOLDER`` (english/transfer/finetune)
is only run that way, from a sweep of that folder, or with ``--init-from none``: from scratch, the control.
"""

import argparse
import concurrent.futures
import json
import math
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from recipes.cli import CONFIG_DIR
from recipes.launchers import (LAUNCHERS, RecipeJob, device_groups, gpu_arguments, python_command, submitit_executor,
                               visible_gpus)


def recipe_files(folder: str) -> list[Path]:
    path = Path(folder) if Path(folder).is_dir() else CONFIG_DIR / folder
    if not path.is_dir():
        bundled = sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir())
        raise FileNotFoundError(f"recipe folder {folder!r} not found (bundled folders: {', '.join(bundled)})")
    files = sorted(f for f in path.glob("*.yaml") if not f.name.startswith("_"))  # _family.yaml is not a recipe
    if not files:
        raise FileNotFoundError(f"recipe folder {str(path)!r} holds no .yaml recipes")
    return files


def family_settings(folder: Path) -> dict:
    """What a family declares in ``_family.yaml`` beside its recipes: ``baseline`` (the recipe the others are
    compared with) and ``equivalence_margin`` (nats; closeness claims are tested as equivalence within it)."""
    path = Path(folder) / "_family.yaml"
    if not path.is_file():
        return {}
    settings = yaml.safe_load(path.read_text()) or {}
    unknown = set(settings) - {"baseline", "equivalence_margin", "claims", "starts_from"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)} (known: baseline, equivalence_margin, claims, "
                         "starts_from)")
    return settings


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
    returncode: int | None = 0  # None: still running
    log: Path | None = None
    seed: int | None = None
    init_from: Path | None = None  # the checkpoint whose weights start the run (fine-tuning), if any
    stored: dict | None = None  # read from a sweep's record (no run folder needed): its result, curves, hparams

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    @property
    def ending(self) -> str:
        """How a run that did not succeed ended, for the table's notes."""
        if self.returncode is None:
            return f"NOT FINISHED (the sweep stopped before this run ended; log {self.log})"
        return f"FAILED (exit {self.returncode}; log {self.log})"


def write_manifest(folder: Path, family: str, runs: list[Run]) -> None:
    """``folder/sweep.json``: the runs of this sweep and how each ended (``returncode`` None: not yet)."""
    record = {"family": family, "runs": [manifest_entry(run) for run in runs]}
    write_json(folder / "sweep.json", record)


def manifest_entry(run: Run) -> dict:
    return {"config": str(Path(run.config).resolve()), "folder": str(Path(run.folder).resolve()),
            "returncode": run.returncode, "log": None if run.log is None else str(run.log), "seed": run.seed,
            "init_from": None if run.init_from is None else str(run.init_from)}


def write_json(path: Path, record: dict) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(record, indent=1, default=str))
    temporary.replace(path)  # a reader never sees half a file


def read_manifest(folder: Path) -> tuple[str, list[Run]]:
    """The family and runs an earlier sweep recorded in ``folder/sweep.json``; a run that never ended
    (the sweep was stopped) keeps ``returncode`` None: named NOT FINISHED, and left out of the cells.
    ``folder`` may also be a sweep's record (:func:`write_record`), or a log folder whose run folders are gone
    but whose ``record.json`` is there: the runs then carry their stored numbers."""
    folder = Path(folder)
    if folder.is_file() or folder.suffix == ".json":
        return read_record(folder)
    path = folder / "sweep.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: --from takes a folder a sweep wrote (runs/sweep-logs/<time>) "
                                "or a sweep's record.json")
    record = json.loads(path.read_text())
    runs = [Run(Path(r["config"]), Path(r["folder"]), r["returncode"],
                r["log"] and Path(r["log"]), r["seed"], r.get("init_from") and Path(r["init_from"]))
            for r in record["runs"]]
    if (folder / "record.json").is_file() and any(not run.failed and not Path(run.folder).is_dir() for run in runs):
        return read_record(folder / "record.json")
    return record["family"], runs


RECORD_FORMAT = 1


def write_record(folder: Path, family: str, runs: list[Run]) -> Path:
    """``folder/record.json``: the sweep's manifest with each finished run's numbers — its final and best
    validation figures, speed, validation-loss curve and hyper-parameters — so that the sweep can be tabulated and
    plotted again (``--from``) where its run folders are not: on another machine, from a copy kept with the
    results (docs/results/records/). Recipes under the bundled configs are named relative to them."""
    entries = []
    for run in runs:
        entry = manifest_entry(run)
        config = Path(run.config).resolve()
        if config.is_relative_to(CONFIG_DIR.resolve()):
            entry["config"] = config.relative_to(CONFIG_DIR.resolve()).as_posix()
        stored = stored_numbers(run)
        if stored is not None:
            entry["stored"] = stored
        entries.append(entry)
    path = Path(folder) / "record.json"
    write_json(path, {"family": family, "format": RECORD_FORMAT, "runs": entries})
    return path


def stored_numbers(run: Run) -> dict | None:
    """What a record keeps of a finished run: its figures (:func:`read_run`), validation-loss curve and
    hyper-parameters; None for a run that failed or did not finish, or left nothing to read (its table cell then
    says so, as from its folder)."""
    if run.stored is not None:
        return run.stored
    if run.failed:
        return None
    try:
        return {"result": run_result(run), "curves": {"val/loss": sorted(run_curve(run).items())},
                "hparams": run_hparams(run)}
    except (FileNotFoundError, KeyError):
        return None


def read_record(path: Path) -> tuple[str, list[Run]]:
    """The family and runs of a sweep's ``record.json`` (:func:`write_record`), each finished run with its
    stored numbers. A file that is not such a record is refused, named, with what is wrong."""
    try:
        record = json.loads(Path(path).read_text())
        if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
            raise ValueError(f"not a sweep record of format {RECORD_FORMAT}")
        runs = [Run(CONFIG_DIR / r["config"], Path(r["folder"]), r["returncode"], r["log"] and Path(r["log"]),
                    r["seed"], r.get("init_from") and Path(r["init_from"]), r.get("stored"))
                for r in record["runs"]]  # (an absolute config path stays absolute under the / operator)
        return record["family"], runs
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: {error}") from error


def seed_list(seeds: int | None, first_seed: int = 0) -> list[int | None]:
    """The seeds a sweep runs each recipe with: ``first_seed … first_seed+seeds-1``, or ``[None]`` (the recipe's own)."""
    return list(range(first_seed, first_seed + seeds)) if seeds else [None]


def starting_checkpoints(configs: list[Path], seeds: list[int | None], sweeps: list[Path],
                         family: str | None = None) -> dict[tuple[str, int | None], Path]:
    """For fine-tuning: (recipe name, seed) → the ``last.ckpt`` of the run with that recipe name and seed in the
    earlier ``sweeps`` (their ``runs/sweep-logs/<time>`` folders); with ``family`` (a recipe folder such as
    ``english/transfer/pretrain``), those runs must be of its recipes. Every pair must have one finished run
    with its checkpoint: what is missing is named, all of it, in one error."""
    found: dict[tuple[str, int | None], Path] = {}
    problems = []
    for folder in sweeps:
        _, runs = read_manifest(folder)
        for run in runs:
            if family is not None and Path(run.config).parent.parts[-len(Path(family).parts):] != Path(family).parts:
                problems.append(f"{folder} ran {run.config}, not a recipe of {family}")
            elif not run.failed:
                found.setdefault((run.config.stem, run.seed), run.folder / "checkpoints" / "last.ckpt")
    points = {}
    for config in configs:
        for seed in seeds:
            name = config.stem + ("" if seed is None else f" seed {seed}")
            checkpoint = found.get((config.stem, seed))
            if checkpoint is None:
                problems.append(f"no finished run of {name} in {', '.join(map(str, sweeps))}")
            elif not checkpoint.is_file():
                problems.append(f"{name}: {checkpoint} is missing")
            else:
                points[(config.stem, seed)] = checkpoint
    if problems:
        raise ValueError("--init-from: " + "; ".join(dict.fromkeys(problems)))
    return points


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
    curve = [(e.step, e.value) for e in events.Scalars("val/loss")] if "val/loss" in tags else []
    best_step, best = min(curve, key=lambda point: (point[1], point[0])) if curve else (-1, math.nan)
    return {
        "pattern": hparams.get("pattern", "?"),
        "params": hparams.get("n_params", math.nan),
        "active": hparams.get("n_active_params", math.nan),
        "steps": events.Scalars("val/loss")[-1].step + 1 if "val/loss" in tags else 0,
        "val_loss": last("val/loss"),
        "best_val_loss": best,
        "best_step": best_step + 1,
        "val_ppl": last("val/ppl"),
        "val_acc": last("val/acc"),
        "tok_s": statistics.median(speeds) if speeds else math.nan,
    }


def run_result(run: Run) -> dict:
    """A finished run's figures (:func:`read_run`): from its record if it came from one, else from its folder."""
    return run.stored["result"] if run.stored is not None else read_run(Path(run.folder))


def run_curve(run: Run, tag: str = "val/loss") -> dict[int, float]:
    """``{step: value}`` of ``tag`` from the run's folder, or from its record (which keeps ``val/loss``)."""
    if run.stored is not None:
        return {int(step): value for step, value in run.stored["curves"].get(tag, [])}
    return scalar_series(Path(run.folder), tag)


def run_hparams(run: Run) -> dict:
    if run.stored is not None:
        return run.stored["hparams"]
    return yaml.safe_load((Path(run.folder) / "hparams.yaml").read_text())


def table(runs: list[Run]) -> str:
    rows = ["| recipe | pattern | params | active | steps | val loss | val ppl | val acc | train tok/s |",
            "|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        name = run.config.stem
        if run.failed:
            rows.append(f"| {name} | {run.ending} |  |  |  |  |  |  |  |")
            continue
        try:
            r = run_result(run)
        except (FileNotFoundError, KeyError) as error:
            rows.append(f"| {name} | no results in {run.folder} ({error}) |  |  |  |  |  |  |  |")
            continue
        rows.append(
            f"| {name} | `{r['pattern']}` | {r['params']:,} | {r['active']:,} | {r['steps']} | "
            f"{r['val_loss']:.4f} | {r['val_ppl']:.3f} | {r['val_acc']:.3f} | {r['tok_s']:,.0f} |"
        )
    return "\n".join(rows)


def progress_lines(runs: list[Run], running: set[int], logs: Path) -> list[str]:
    """What the sweep says while it runs: how many runs are done, running, failed and waiting, and each running
    run's last logged step and training loss, with where its log is."""
    done = sum(1 for i, r in enumerate(runs) if r.returncode is not None and not r.failed)
    failed = sum(1 for r in runs if r.returncode is not None and r.failed)
    waiting = len(runs) - done - failed - len(running)
    lines = [f"[sweep {time.strftime('%H:%M:%S')}] {done} done, {len(running)} running, {failed} failed, "
             f"{waiting} waiting; logs in {logs}/"]
    for i in sorted(running):
        run = runs[i]
        losses = scalar_series(Path(run.folder), "train/loss") if Path(run.folder).is_dir() else {}
        where = f"step {max(losses) + 1}, train loss {losses[max(losses)]:.4f}" if losses else "starting"
        lines.append(f"  {run.config.stem}{'' if run.seed is None else f' seed {run.seed}'}: {where} ({run.log})")
    return lines


def launch(configs: list[Path], overrides: list[str], seeds: int | None = None, jobs: int = 1,
           family: str = "", progress_every: float = 60.0, threads: int | None = None, launcher: str = "local",
           devices_per_run: int = 1, submitit_cluster: str | None = None,
           slurm: dict | None = None, first_seed: int = 0,
           init_from: dict[tuple[str, int | None], Path] | None = None) -> tuple[Path, list[Run]]:
    """Run each recipe (once, or once per seed ``first_seed … first_seed+seeds-1``) as its own process, ``jobs`` at a time,
    each into a run folder named for this sweep (and seed); with ``init_from`` ((recipe name, seed) → checkpoint,
    :func:`starting_checkpoints`), each run starts from its checkpoint's weights. Returns the sweep's log folder
    and its runs."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = Path("runs") / "sweep-logs" / stamp
    logs.mkdir(parents=True, exist_ok=True)
    runs = []
    for config in configs:
        for seed in seed_list(seeds, first_seed):
            suffix = "" if seed is None else f"_seed{seed}"
            runs.append(Run(config, logger_root(config) / f"sweep_{stamp}{suffix}", returncode=None,
                            log=logs / f"{config.stem}{suffix}.log", seed=seed,
                            init_from=None if init_from is None else init_from[(config.stem, seed)]))
    lock = threading.Lock()
    write_manifest(logs, family, runs)
    groups: queue.Queue | None = None
    if launcher == "gpus":  # one run per group of GPUs at a time, each run given its group alone
        found = device_groups(visible_gpus(), devices_per_run)
        jobs, groups = len(found), queue.Queue()
        for group in found:
            groups.put(group)
    threads = threads or max(1, (os.cpu_count() or 1) // jobs)  # each process's share of the cores

    def command_of(run: Run) -> list[str]:
        return [*python_command(), "--config", str(run.config), "--trainer.enable_progress_bar", "false",
                "--trainer.logger.init_args.version", run.folder.name,
                *([] if run.seed is None else ["--seed_everything", str(run.seed)]),
                *([] if run.init_from is None else ["--model.init_from", str(Path(run.init_from).resolve())]), *overrides]

    if launcher == "slurm":
        return logs, submit(runs, command_of, logs, family, jobs, threads, devices_per_run, submitit_cluster,
                            slurm or {}, progress_every)
    running: set[int] = set()
    finished = threading.Event()

    def monitor() -> None:
        while not finished.wait(progress_every):
            with lock:
                snapshot = set(running)
            print("\n".join(progress_lines(runs, snapshot, logs)), flush=True)

    def one(run: Run) -> None:
        start = time.perf_counter()
        index = runs.index(run)
        with lock:
            running.add(index)
        command = command_of(run)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        group = groups.get() if groups is not None else None
        try:
            if group is not None:
                gpu_env, flags = gpu_arguments(group)
                env, command = {**env, **gpu_env}, [*command, *flags]
            with open(run.log, "w") as log:
                returncode = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        finally:
            if group is not None:
                groups.put(group)
        with lock:  # the record grows as runs end: a sweep stopped halfway keeps its finished runs' numbers
            run.returncode = returncode
            run.stored = stored_numbers(run)  # read once, here
            running.discard(index)
            write_manifest(logs, family, runs)
            write_record(logs, family, runs)
        status = "ok" if not run.failed else f"FAILED (exit {run.returncode}; see {run.log})"
        print(f"{run.config.stem}{'' if run.seed is None else f' seed {run.seed}'}: {status} in "
              f"{time.perf_counter() - start:.0f} s", flush=True)

    where = "" if groups is None else f" on GPUs {', '.join(','.join(g) for g in list(groups.queue))}"
    print(f"sweep: {len(runs)} runs, {jobs} at a time{where}, {threads} thread(s) each; logs in {logs}/", flush=True)
    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, runs))
    finally:
        finished.set()
    return logs, runs


def submit(runs: list[Run], command_of, logs: Path, family: str, parallel: int, threads: int, devices_per_run: int,
           cluster: str | None, slurm: dict, progress_every: float) -> list[Run]:
    """The runs as one submitit job array (SLURM, or local processes with ``cluster="local"``); waits for every
    job, then the sweep tabulates exactly these runs as any other (``--from`` on its folder later works too)."""
    executor = submitit_executor(logs / "submitit", cluster=cluster, devices_per_run=devices_per_run,
                                 parallel=parallel, slurm=slurm)
    env = {"OMP_NUM_THREADS": str(threads)}
    with executor.batch():
        submitted = [executor.submit(RecipeJob(command_of(run), env, run.log, run.folder, Path.cwd())) for run in runs]
    print(f"sweep: {len(runs)} runs submitted as a job array ({executor.cluster}, {parallel} at a time); logs in "
          f"{logs}/, submitit's in {logs / 'submitit'}/", flush=True)
    while not all(job.done() for job in submitted):
        time.sleep(min(progress_every, 5.0) if progress_every else 5.0)
        waiting = {i for i, job in enumerate(submitted) if not job.done()}
        if progress_every:
            print("\n".join(progress_lines(runs, waiting, logs)), flush=True)
    for run, job in zip(runs, submitted):
        try:
            run.returncode = int(job.result())
        except Exception as error:  # noqa: BLE001 - a job that died is a failed run, named in the table
            run.returncode = -1
            with open(run.log, "a") as log:
                log.write(f"\nsubmitit: the job failed: {str(error).splitlines()[-1] if str(error) else error!r}\n")
    write_manifest(logs, family, runs)
    return runs


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
    notes = []
    for run in runs:
        name = run.config.stem
        launched[name] = launched.get(name, 0) + 1
        results.setdefault(name, [])
        if run.failed:
            notes.append(f"{name} seed {run.seed} {run.ending}")
            continue
        try:
            result = run_result(run)
        except (FileNotFoundError, KeyError) as error:
            notes.append(f"{name} seed {run.seed}: no results in {run.folder} ({error})")
            continue
        results[name].append(result)
        if not math.isnan(result["best_val_loss"]) and early_best(result):
            notes.append(f"{name} seed {run.seed}: best val loss {result['best_val_loss']:.4f} at step "
                         f"{result['best_step']} of {result['steps']}; final {result['val_loss']:.4f}")
    if baseline is not None and baseline not in results:
        raise ValueError(f"--baseline {baseline!r} is not one of the recipes run ({', '.join(results)})")
    loss = lambda name: [r["val_loss"] for r in results[name] if not math.isnan(r["val_loss"])]  # noqa: E731
    compared = [name for name in results if baseline is not None and name != baseline]
    welch_p = {name: welch(loss(name), loss(baseline))[1] for name in compared}
    holm_p = dict(zip(compared, holm([welch_p[name] for name in compared])))
    rows = ["| recipe | runs | val loss, mean ± std | 95% interval | val acc, mean ± std | train tok/s | "
            f"Δ loss vs {baseline or '-'} | p (Welch) | p (Holm) | detectable Δ (80%) | "
            f"TOST p (±{margin if margin is not None else '-'}) | best val loss (step) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda p: "< 2 runs" if math.isnan(p) else f"{p:.3g}"  # noqa: E731
    for name, finished in results.items():
        s = summarize(loss(name))
        acc = summarize([r["val_acc"] for r in finished if not math.isnan(r["val_acc"])])
        speeds = [r["tok_s"] for r in finished if not math.isnan(r["tok_s"])]
        bests = [r["best_val_loss"] for r in finished if not math.isnan(r["best_val_loss"])]
        best = (f"{statistics.fmean(bests):.4f} ({statistics.median(r['best_step'] for r in finished):.0f})"
                if bests else "-")
        if baseline is None:
            versus = "- | - | - | - | -"
        elif name == baseline:
            versus = "(baseline) | - | - | - | -"
        else:
            diff = welch(loss(name), loss(baseline))[0]
            b = summarize(loss(baseline))
            mde = detectable_effect(s.std, s.n, b.std, b.n)
            equivalence = "-" if margin is None else fmt(tost(loss(name), loss(baseline), margin))
            # NaN p: fewer than two finished runs on a side, so no test; say so rather than print "nan".
            versus = (f"{diff:+.4f} | {fmt(welch_p[name])} | {fmt(holm_p[name])} | "
                      f"{'-' if math.isnan(mde) else f'{mde:.4f}'} | {equivalence}")
        rows.append(f"| {name} | {s.n} of {launched[name]} | {s.mean:.4f} ± {s.std:.4f} | [{s.low:.4f}, {s.high:.4f}] | "
                    f"{acc.mean:.4f} ± {acc.std:.4f} | {statistics.median(speeds) if speeds else math.nan:,.0f} | "
                    f"{versus} | {best} |")
    return "\n".join(rows + ([""] + [f"- {line}" for line in notes] if notes else []))


def scalar_series(run: Path, tag: str) -> dict[int, float]:
    """``{step: value}`` of one scalar of a run's TensorBoard events (empty when the run never logged it)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run))
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)} if tag in events.Tags()["scalars"] else {}


def val_curves(runs: list[Run], tag: str = "val/loss") -> dict[str, tuple[list[int], list[float], list[float], int]]:
    """Per recipe, over its finished runs: ``(steps, mean, std, n_runs)`` of ``tag`` at the steps every
    one of those runs validated at (std is 0 for a single run)."""
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
        curves[name] = (steps, mean, std, len(per_run))
    return curves


def plot_curves(curves: dict, path: Path, title: str) -> None:
    """Validation curves, the mean over seeds with a band of ± one standard deviation, into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, (steps, mean, std, n) in curves.items():
        line, = axes.plot(steps, mean, marker="o", markersize=3, label=f"{name} (n={n})")
        axes.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                          color=line.get_color(), alpha=0.2)
    axes.set(xlabel="training step", ylabel="validation loss", title=title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def hparam(run: Run, key: str):
    """A (dotted) key of a run's hyper-parameters (its ``hparams.yaml``), e.g. ``d_model``."""
    value = run_hparams(run)
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(f"hyper-parameter {key!r} not in {run.folder}/hparams.yaml")
        value = value[part]
    return value


def metric_vs(runs: list[Run], key: str, metric: str = "val_acc") -> dict[str, list[tuple[float, float, float, int]]]:
    """Per line (a recipe's name without its last ``_`` part), the points ``(x, mean, std, n)`` of the
    final ``metric`` over the finished runs of each recipe, ``x`` its hyper-parameter ``key``, sorted by x."""
    values: dict[tuple[str, float], list[float]] = {}
    for run in runs:
        if run.failed:
            continue
        line = run.config.stem.rsplit("_", 1)[0]
        value = run_result(run)[metric]
        if not math.isnan(value):
            values.setdefault((line, float(hparam(run, key))), []).append(value)
    lines: dict[str, list] = {}
    for (line, x), v in sorted(values.items(), key=lambda item: (item[0][0], item[0][1])):
        lines.setdefault(line, []).append((x, statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0, len(v)))
    return lines


def plot_vs(lines: dict, path: Path, key: str, metric: str, title: str) -> None:
    """``metric`` against ``key``, one line per entry of :func:`metric_vs`, error bars ± one std."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4.5))
    for name, points in lines.items():
        xs, mean, std, _ = zip(*points)
        axes.errorbar(xs, mean, yerr=std, marker="o", capsize=3, label=name)
    axes.set_xscale("log", base=2)
    axes.set_xticks(sorted({x for points in lines.values() for x, *_ in points}))
    axes.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axes.set(xlabel=key, ylabel=metric.replace("_", " "), title=title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def report(runs: list[Run], logs: Path, family: str, seeds: bool, baseline: str | None,
           vs: str | None, metric: str, margin: float | None = None) -> str:
    """The table (printed and written to ``logs/table.md``) and the figures beside it."""
    text = seed_table(runs, baseline, margin) if seeds else table(runs)
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "table.md").write_text(f"# {family}\n\n{text}\n")
    curves = val_curves(runs)
    if curves:
        plot_curves(curves, logs / "val_loss.png", f"{family}: validation loss" + (" (mean ± std over seeds)" if seeds else ""))
    if vs:
        lines = metric_vs(runs, vs, metric)
        if lines:
            plot_vs(lines, logs / f"{metric}_vs_{vs.replace('.', '_')}.png", vs, metric, f"{family}: {metric} against {vs}")
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", nargs="?", help="a folder of recipes: a path, or a bundled name such as 'positions'")
    parser.add_argument("--from", dest="from_logs", metavar="LOGS", nargs="+", default=None,
                        help="tabulate and plot earlier sweeps again: their runs/sweep-logs/<time> folders "
                             "(several: one table of all their runs, written into the first)")
    parser.add_argument("--only", nargs="+", default=None, help="recipe names (file stems) to run")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="overrides for every run")
    parser.add_argument("--table-only", action="store_true", help="do not run; tabulate the latest runs")
    parser.add_argument("--seeds", type=int, default=None, help="run each recipe with seeds 0 … N-1; statistics")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="with --seeds: start at this seed (seeds K … K+N-1), to add seeds to an earlier sweep, "
                             "then tabulate both with --from")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (threads split between them)")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="local",
                        help="local: this machine's cores; gpus: one run per visible GPU (or group of --devices-per-run); "
                             "slurm: a submitit job array (pip install submitit), requeued from last.ckpt on preemption")
    parser.add_argument("--devices-per-run", type=int, default=1, help="GPUs per run (gpus, slurm)")
    parser.add_argument("--slurm", nargs="+", default=[], metavar="KEY=VALUE",
                        help="submitit parameters for --launcher slurm: slurm_partition=gpu timeout_min=600 …")
    parser.add_argument("--submitit-cluster", choices=["slurm", "local", "debug"], default=None,
                        help="with --launcher slurm: force submitit's executor (local: processes here, for a test)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads per run (default: the cores divided by --jobs); fewer leaves cores free")
    parser.add_argument("--baseline", default=None, help="with --seeds: the recipe the others are compared with "
                        "(default: the family's _family.yaml)")
    parser.add_argument("--margin", type=float, default=None,
                        help="with --seeds: the equivalence margin in nats for the TOST column (default: the family's)")
    parser.add_argument("--vs", default=None, metavar="KEY",
                        help="also plot the final --metric against this hyper-parameter (e.g. d_model)")
    parser.add_argument("--suite", choices=["length", "passkey", "mqar"], default=None,
                        help="with --from: run this long-context suite on every finished run's last.ckpt and tabulate "
                             "it over seeds (docs/evaluation.md)")
    parser.add_argument("--tasks", default=None, metavar="T1,T2",
                        help="with --from: run these lm-eval tasks on every finished run's last.ckpt and tabulate them "
                             "over seeds (a local task's folder in --suite-args \"--include_path DIR\")")
    parser.add_argument("--suite-args", default="", metavar="ARGS",
                        help="more arguments for the suite or tasks, in one string: --suite-args \"--multiples 1 2 4 --windows 4\"")
    parser.add_argument("--init-from", nargs="+", default=None, metavar="LOGS",
                        help="fine-tune: start each run from the last.ckpt of the run with the same recipe name and seed "
                             "in these earlier sweeps (their runs/sweep-logs/<time> folders); 'none': from scratch")
    parser.add_argument("--progress", type=float, default=60.0, metavar="SECONDS",
                        help="how often the sweep reports its runs' progress (default 60)")
    parser.add_argument("--metric", default="val_acc", choices=["val_acc", "val_loss", "val_ppl"],
                        help="what --vs plots (default val_acc)")
    args = parser.parse_args(argv)
    if args.from_logs is not None:
        try:
            sweeps = [read_manifest(Path(folder)) for folder in args.from_logs]
        except (FileNotFoundError, ValueError) as error:
            sys.exit(f"error: {error}")
        for folder, (name, found) in zip(args.from_logs, sweeps):  # an older sweep gains its record
            if Path(folder).is_dir() and not (Path(folder) / "record.json").is_file() and all(
                    run.failed or (Path(run.folder) / "hparams.yaml").is_file() for run in found):
                write_record(Path(folder), name, found)
        family, runs = sweeps[0][0], [run for _, found in sweeps for run in found]
        seeded = any(run.seed is not None for run in runs)
        try:
            settings = family_settings(Path(runs[0].config).parent) if runs else {}
        except ValueError as error:
            sys.exit(f"error: {error}")
        if settings.get("baseline") in {run.config.stem for run in runs}:
            args.baseline = args.baseline or settings["baseline"]
        args.margin = args.margin if args.margin is not None else settings.get("equivalence_margin")
        if args.baseline is not None and args.baseline not in {run.config.stem for run in runs}:
            sys.exit(f"error: --baseline {args.baseline!r} is not one of the recipes of that sweep")
        if args.suite and args.tasks:
            sys.exit("error: --suite or --tasks, one at a time")
        if (args.suite or args.tasks) and any(run.stored is not None for run in runs):
            sys.exit("error: --suite and --tasks evaluate the runs' checkpoints; a sweep's record holds only their "
                     "numbers: give the log folders of runs still on this machine")
        if args.suite or args.tasks:
            from recipes.evaluation.family import report as suite_report

            import shlex

            extra = shlex.split(args.suite_args) + (["--tasks", args.tasks] if args.tasks else [])
            print(suite_report(runs, Path(args.from_logs[0]), family, args.suite or "tasks", args.baseline, extra))
            return
        out = Path(args.from_logs[0])
        if not out.is_dir():  # a record kept elsewhere: the table and figures go to a new log folder
            out = Path("runs") / "sweep-logs" / time.strftime("%Y%m%d-%H%M%S-record")
        print(report(runs, out, family, seeded, args.baseline, args.vs, args.metric, args.margin))
        print(f"\ntable and figures: {out}/")
        return
    if args.folder is None:
        sys.exit("error: name a folder of recipes (or --from a sweep's log folder)")
    if args.suite or args.tasks:
        sys.exit("error: --suite and --tasks evaluate a finished sweep: give its log folder with --from")
    if args.seeds is not None and args.seeds < 1 or args.jobs < 1:
        sys.exit(f"error: --seeds {args.seeds} and --jobs {args.jobs} must be >= 1")
    if args.first_seed < 0 or args.first_seed and args.seeds is None:
        sys.exit(f"error: --first-seed {args.first_seed} must be >= 0, and goes with --seeds")
    if args.seeds is not None and args.table_only:
        sys.exit("error: --table-only reads one run per recipe; --seeds launches new ones")
    if args.init_from is not None and args.table_only:
        sys.exit("error: --init-from starts new runs; --table-only launches none")
    try:
        configs = recipe_files(args.folder)
    except FileNotFoundError as error:
        sys.exit(f"error: {error}")
    try:
        settings = family_settings(configs[0].parent)
    except ValueError as error:
        sys.exit(f"error: {error}")
    if args.only:
        unknown = set(args.only) - {c.stem for c in configs}
        if unknown:
            sys.exit(f"error: --only names {sorted(unknown)} not in {args.folder} ({', '.join(c.stem for c in configs)})")
        configs = [c for c in configs if c.stem in args.only]
    starts_from = settings.get("starts_from")
    if starts_from is not None and args.init_from is None and not args.table_only:
        sys.exit(f"error: {args.folder} fine-tunes the runs of {starts_from}: run that family first "
                 f"(python -m recipes.sweep {starts_from} --seeds N), then give its log folder with "
                 f"--init-from runs/sweep-logs/<time> (--init-from none: from scratch, the no-transfer control)")
    init_from = None
    if args.init_from == ["none"]:
        args.init_from = None  # from scratch, said out loud
    elif args.init_from is not None:
        try:
            init_from = starting_checkpoints(configs, seed_list(args.seeds, args.first_seed),
                                             [Path(f) for f in args.init_from], starts_from)
        except (FileNotFoundError, ValueError) as error:
            sys.exit(f"error: {error}")
    if args.seeds is not None:
        if settings.get("baseline") in {c.stem for c in configs}:  # (not when --only leaves it out)
            args.baseline = args.baseline or settings["baseline"]
        args.margin = args.margin if args.margin is not None else settings.get("equivalence_margin")
    if args.baseline is not None and args.baseline not in {c.stem for c in configs}:
        sys.exit(f"error: --baseline {args.baseline!r} is not one of the recipes ({', '.join(c.stem for c in configs)})")
    overrides = []
    for item in args.set:
        if "=" not in item:
            sys.exit(f"error: --set takes KEY=VALUE; got {item!r}")
        key, value = item.split("=", 1)
        overrides += [f"--{key}", value]

    family = Path(args.folder).name
    if args.table_only:
        logs = Path("runs") / "sweep-logs" / time.strftime("%Y%m%d-%H%M%S-table")
        runs = []
        for config in configs:
            try:
                runs.append(Run(config, newest_run(config)))
            except FileNotFoundError as error:
                runs.append(Run(config, logger_root(config), returncode=-1, log=str(error)))
    else:
        slurm = dict(item.split("=", 1) for item in args.slurm if "=" in item)
        if len(slurm) != len(args.slurm):
            parser.error(f"--slurm takes KEY=VALUE items; got {args.slurm}")
        slurm = {k: int(v) if v.isdigit() else v for k, v in slurm.items()}
        logs, runs = launch(configs, overrides, args.seeds, args.jobs, family, args.progress, args.threads,
                            args.launcher, args.devices_per_run, args.submitit_cluster, slurm, args.first_seed,
                            init_from)
        write_record(logs, family, runs)
    print(report(runs, logs, family, bool(args.seeds), args.baseline, args.vs, args.metric, args.margin))
    roots = {logger_root(run.config).parent for run in runs}
    print(f"\ntable, figures and record.json (the runs' numbers, to keep with the results): {logs}/  TensorBoard: tensorboard --logdir {' '.join(map(str, sorted(roots)))}")
    failed = [run.config.stem for run in runs if run.failed]
    if failed:
        sys.exit(f"error: {len(failed)} of {len(runs)} runs failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
