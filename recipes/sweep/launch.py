"""Finding a family's recipes and launching them: each recipe (and seed) as its own ``python -m recipes fit``
process, ``jobs`` at a time on this machine's cores, one per GPU group, or as a submitit job array; the manifest
and record rewritten as each run ends, and the progress reported while they run."""

import concurrent.futures
import contextlib
import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from recipes.argtypes import did_you_mean
from recipes.recipe_files import CONFIG_DIR, sweep_root
from recipes.launchers import (RECIPE_EDITED, RecipeJob, check_slurm, device_groups, gpu_arguments, python_command,
                               recipe_changed, recipe_edit, recipe_hash, resume_arguments, submitit_executor,
                               visible_gpus)
from recipes.sweep.records import Run, read_manifest, scalar_series, stored_numbers, write_manifest, write_record


def recipe_files(folder: str) -> list[Path]:
    path = Path(folder) if Path(folder).is_dir() else CONFIG_DIR / folder
    if not path.is_dir():
        bundled = sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir())
        families = {str(p.parent.relative_to(CONFIG_DIR)) for p in CONFIG_DIR.rglob("*.yaml")} - {"."}
        hint = did_you_mean([folder], families, n=3) or f"bundled folders: {', '.join(bundled)}"
        raise FileNotFoundError(f"recipe folder {folder!r} not found ({hint})")
    files = family_recipes(path)
    if not files:
        raise FileNotFoundError(f"recipe folder {str(path)!r} holds no .yaml recipes")
    return files


def family_recipes(folder: Path) -> list[Path]:
    """The recipes of a family's folder, by name (``_family.yaml`` is not one)."""
    return sorted(f for f in Path(folder).glob("*.yaml") if not f.name.startswith("_"))


def family_settings(folder: Path) -> dict:
    """What a family declares in ``_family.yaml`` beside its recipes: ``baseline`` (the recipe the others are
    compared with), ``equivalence_margin`` (nats; closeness claims are tested as equivalence within it),
    ``starts_from`` (the family whose runs it fine-tunes) and ``claims`` (the papers' claims it tests, as text).
    Each is checked here, naming the file: a misspelt baseline would otherwise leave the table without its
    comparison, and say nothing."""
    path = Path(folder) / "_family.yaml"
    if not path.is_file():
        return {}
    try:
        settings = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"{path} is not valid YAML: {str(error).splitlines()[0]}") from None
    settings = {} if settings is None else settings
    if not isinstance(settings, dict):
        raise ValueError(f"{path} holds a {type(settings).__name__}; write a mapping (baseline: NAME, ...)")
    unknown = set(settings) - {"baseline", "equivalence_margin", "claims", "starts_from"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {sorted(unknown)} (known: baseline, equivalence_margin, claims, "
                         "starts_from)")
    baseline = settings.get("baseline")
    recipes = [f.stem for f in family_recipes(folder)]
    if baseline is not None and recipes and baseline not in recipes:  # (a record's runs may outlive their files)
        hint = did_you_mean([str(baseline)], recipes, n=1) or f"the recipes: {', '.join(recipes)}"
        raise ValueError(f"{path}: baseline {baseline!r} is not a recipe of the folder ({hint})")
    margin = settings.get("equivalence_margin")
    if margin is not None and not (isinstance(margin, (int, float)) and not isinstance(margin, bool)
                                   and 0 < margin < math.inf):
        raise ValueError(f"{path}: equivalence_margin {margin!r} must be a positive number of nats (0.01, say)")
    if not isinstance(settings.get("starts_from", ""), str):
        raise ValueError(f"{path}: starts_from {settings['starts_from']!r} must be a recipe folder's name")
    claims = settings.get("claims", [])
    if not (isinstance(claims, list) and all(isinstance(claim, str) for claim in claims)):
        raise ValueError(f"{path}: claims must be a list of sentences (- \"...\")")
    return settings


def recipe_logger(config: Path) -> dict | None:
    """The ``trainer.logger`` a recipe names, or None when it names none (the sweep then gives its runs one,
    :func:`logger_flags`). A recipe that turns logging off is refused: the sweep tabulates the runs' logs."""
    logger = ((yaml.safe_load(config.read_text()) or {}).get("trainer") or {}).get("logger")
    if logger is None or logger is True:
        return None
    if not isinstance(logger, dict) or "class_path" not in logger:
        raise ValueError(f"{config}: trainer.logger is {logger!r}; a sweep reads each run's TensorBoard logs, so its "
                         "recipes name a TensorBoardLogger (or none, and the sweep gives them one)")
    return logger


def logger_flags(config: Path) -> list[str]:
    """For a recipe that names no logger: the flags giving it the TensorBoard logger of :func:`logger_root` (Lightning's
    default would put every recipe of the family in one ``lightning_logs/``, where a run is no recipe's)."""
    if recipe_logger(config) is not None:
        return []
    return ["--trainer.logger", "lightning.pytorch.loggers.TensorBoardLogger",
            "--trainer.logger.init_args.save_dir", "runs",
            "--trainer.logger.init_args.name", sweep_root(config).relative_to("runs").as_posix(),
            "--trainer.logger.init_args.default_hp_metric", "false"]


def logger_root(config: Path) -> Path:
    """The folder that holds the versions of the recipe's TensorBoard logger: the one it names, else
    ``runs/<family folder>/<recipe>`` (:func:`logger_flags`)."""
    logger = recipe_logger(config)
    if logger is None:
        return sweep_root(config)
    args = logger.get("init_args") or {}
    return Path(args.get("save_dir", "runs")) / args.get("name", config.stem)


def newest_run(config: Path) -> Path:
    """The most recently written run folder of the recipe (for ``--table-only``)."""
    root = logger_root(config)
    runs = sorted((p for p in root.glob("*") if (p / "hparams.yaml").is_file()), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise FileNotFoundError(f"no run of {config.name} under {root}")
    return runs[-1]


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
        losses = scalar_series(Path(run.folder), "train/loss")  # (empty before the run's folder exists)
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
    and its runs. A progress table prints every ``progress_every`` seconds while runs go on; 0 prints none.
    Stopped (Ctrl+C, SIGTERM), it raises :class:`SweepInterrupted` once its running runs have written their
    checkpoints; :func:`resume` goes on from there."""
    # (checked before the log folder exists: a sweep that cannot start leaves nothing behind)
    found = device_groups(visible_gpus(), devices_per_run) if launcher == "gpus" else []
    if launcher == "slurm":
        check_slurm(submitit_cluster)
    logs = new_log_folder(Path("runs") / "sweep-logs", time.strftime("%Y%m%d-%H%M%S"))
    stamp = logs.name
    runs = []
    for config in configs:
        for seed in seed_list(seeds, first_seed):
            suffix = "" if seed is None else f"_seed{seed}"
            run = Run(config, logger_root(config) / f"sweep_{stamp}{suffix}", returncode=None,
                      log=logs / f"{config.stem}{suffix}.log", seed=seed,
                      init_from=None if init_from is None else init_from[(config.stem, seed)])
            run.args = ["--config", str(run.config), "--trainer.enable_progress_bar", "false",
                        *logger_flags(run.config), "--trainer.logger.init_args.version", run.folder.name,
                        *([] if run.seed is None else ["--seed_everything", str(run.seed)]),
                        *([] if run.init_from is None else ["--model.init_from", str(Path(run.init_from).resolve())]),
                        *overrides]
            runs.append(run)
    write_manifest(logs, family, runs)
    recipes = {str(Path(config).resolve()): recipe_hash(config) for config in configs}  # (each run checks its own)
    how = dict(launcher=launcher, devices_per_run=devices_per_run, submitit_cluster=submitit_cluster, slurm=slurm or {},
               cwd=str(Path.cwd()),  # (the runs' paths, logs and logger folders are relative to it)
               recipes=recipes)
    (logs / "launcher.json").write_text(json.dumps(how, indent=1))  # (a resume launches as the sweep did)
    command_of = lambda run: [*python_command(), *run.args]  # noqa: E731
    with sweep_lock(logs) as held:
        if launcher == "slurm":
            return logs, submit(runs, command_of, logs, family, jobs, share_of_cores(threads, jobs), devices_per_run,
                                submitit_cluster, slurm or {}, progress_every, recipes=recipes)
        run_here(runs, command_of, logs, family, jobs, threads, found if launcher == "gpus" else None, progress_every,
                 held=held, recipes=recipes)
    return logs, runs


def new_log_folder(parent: Path, stamp: str) -> Path:
    """``parent/stamp``, made now and by this sweep alone: two sweeps started in the same second (a script that
    launches families side by side) take ``stamp``, ``stamp-2``, … — one folder each, and run folders named apart."""
    parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        folder = parent / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            folder.mkdir()  # (atomic: of two sweeps asking for one name, one gets it)
            return folder
        except FileExistsError:
            continue
    raise FileExistsError(f"{parent}: {stamp} and 998 more names are taken")


@contextlib.contextmanager
def sweep_lock(logs: Path):
    """Hold ``logs/sweep.lock`` (an exclusive ``flock``) while the sweep runs; the runs it starts share it (their
    processes inherit it), so it stays held until the sweep and every run it started are gone, however they end — a
    sweep killed outright leaves its runs going. Yields the held file; raises ValueError where it is held already,
    naming the runs recorded as running. On a file system without locks (a cluster's, mounted so) it warns and yields
    None: the sweep runs, unguarded."""
    import fcntl

    with open(logs / "sweep.lock", "a") as held:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _, runs = read_manifest(logs)
            running = [f"{run.config.stem}{'' if run.seed is None else f' seed {run.seed}'} (process {run.pid})"
                       for run in runs if run.returncode is None and run.pid is not None]
            who = ", ".join(running) or f"`fuser {logs}/sweep.lock` names the processes"
            raise ValueError(f"{logs}: the sweep or a run it started still runs ({who}); a second writer would share "
                             "its run folders: stop it (kill -INT <process>, which writes its last.ckpt) or let it end, "
                             "then resume") from None
        except OSError as error:  # (ENOLCK, EOPNOTSUPP, ENOSYS: no locks there; a sweep must not fail for want of one)
            print(f"sweep: {logs}/sweep.lock cannot be locked on this file system ({error.strerror}): a --resume will "
                  "not see whether this sweep still runs", file=sys.stderr, flush=True)
            yield None
            return
        yield held


def resume(logs: Path, jobs: int = 1, threads: int | None = None, progress_every: float = 60.0, *,
           launcher: str | None = None, devices_per_run: int | None = None, submitit_cluster: str | None = None,
           slurm: dict | None = None) -> tuple[str, list[Run]]:
    """Go on with a stopped sweep (its log folder ``logs``): each run that did not finish runs again with the
    arguments it was launched with, from its ``last.ckpt`` where it wrote one (exactly where it stopped, into its
    own run folder) and from the start where it did not; its log grows. It runs where the sweep ran its runs (its
    ``launcher.json``: the launcher, devices per run, submitit's cluster and SLURM parameters); those given here
    replace what was recorded (None: as recorded). The runs go on in the folder the sweep was launched from, wherever
    the resume is given: their logs, logger folders and recipe paths are relative to it. Returns the family and all
    the runs."""
    logs = Path(logs).resolve()
    recorded = json.loads((logs / "launcher.json").read_text()) if (logs / "launcher.json").is_file() else {}
    home = recorded.pop("cwd", None)
    recipes = recorded.pop("recipes", {})
    if home is not None and not Path(home).is_dir():
        raise FileNotFoundError(f"{logs}: the sweep was launched from {home}, which is gone; its runs' paths are "
                                "relative to it")
    with contextlib.chdir(home) if home is not None else contextlib.nullcontext():
        given = dict(launcher=launcher, devices_per_run=devices_per_run, submitit_cluster=submitit_cluster, slurm=slurm)
        return _resume(logs, {**recorded, **{key: value for key, value in given.items() if value is not None}}, jobs,
                       threads, progress_every, recipes)


def edited_recipes(runs: list[Run], recipes: dict[str, str]) -> list[str]:
    """The names of ``runs``' recipe files whose bytes are not those the sweep began with (``recipes``: path → hash,
    as its ``launcher.json`` records them): its runs left would train another recipe than its finished ones did."""
    return sorted({Path(run.config).name for run in runs if recipe_changed(*recipe_of(run, recipes))})


def _resume(logs: Path, settings: dict, jobs: int, threads: int | None, progress_every: float,
            recipes: dict[str, str] | None = None) -> tuple[str, list[Run]]:
    family, runs = read_manifest(logs)
    if any(run.stored is not None for run in runs):
        raise ValueError(f"{logs}: a sweep's record holds its runs' numbers, not the runs; give the log folder of a "
                         "sweep whose run folders are on this machine")
    how = {"launcher": "local", "devices_per_run": 1, "submitit_cluster": None, "slurm": {}, **settings}
    pending = [run for run in runs if run.returncode != 0]
    edited = edited_recipes(pending, recipes or {})
    if edited:
        raise ValueError(f"{logs}: {', '.join(edited)} changed since the sweep began (or is gone): its runs left would "
                         "train another recipe than the sweep's other runs did; put it back as it was, or start a new "
                         "sweep of the edited family")
    unrecorded = [run.config.stem for run in pending if run.args is None]
    if unrecorded:
        raise ValueError(f"{logs}: the runs {', '.join(unrecorded)} were launched before a sweep recorded its runs' "
                         "arguments, so they cannot be resumed from here; run the family again")
    if not pending:
        return family, runs
    found = device_groups(visible_gpus(), how["devices_per_run"]) if how["launcher"] == "gpus" else None

    def command_of(run: Run) -> list[str]:
        return resume_arguments([*python_command(), *run.args], Path(run.folder))

    with sweep_lock(logs) as held:
        for run in pending:
            run.returncode = None
        write_manifest(logs, family, runs)
        if how["launcher"] == "slurm":  # (a job appends its own --ckpt_path, as on a requeue)
            submit(pending, command_of, logs, family, jobs, share_of_cores(threads, jobs),
                   how["devices_per_run"], how["submitit_cluster"], how["slurm"], progress_every, manifest=runs,
                   recipes=recipes)
        else:
            run_here(runs, command_of, logs, family, jobs, threads, found, progress_every, only=pending, held=held,
                     recipes=recipes)
    return family, runs


def share_of_cores(threads: int | None, jobs: int) -> int:
    """Threads per run: ``threads`` if given, else this machine's cores divided between ``jobs`` runs at a time."""
    return threads or max(1, (os.cpu_count() or 1) // jobs)


def run_here(runs: list[Run], command_of, logs: Path, family: str, jobs: int, threads: int | None,
             gpu_groups: list[list[str]] | None, progress_every: float, only: list[Run] | None = None,
             held=None, recipes: dict[str, str] | None = None) -> None:
    """Run ``only`` (default: all of ``runs``) on this machine, ``jobs`` at a time (one per GPU group with
    ``gpu_groups``), rewriting the manifest and record of all ``runs`` as each ends; each run's process shares
    ``held``, the sweep's lock file (:func:`sweep_lock`). A run whose recipe file is no longer as ``recipes`` (path →
    hash) recorded it at the launch does not start: it ends with exit status ``RECIPE_EDITED``, the reason in its log
    (:func:`recipes.launchers.recipe_edit`)."""
    todo = runs if only is None else only
    lock = threading.Lock()
    groups: queue.Queue | None = None
    if gpu_groups is not None:  # one run per group of GPUs at a time, each run given its group alone
        jobs, groups = len(gpu_groups), queue.Queue()
        for group in gpu_groups:
            groups.put(group)
    threads = share_of_cores(threads, jobs)
    running: set[int] = set()
    finished = threading.Event()
    stopping = threading.Event()  # Ctrl+C or SIGTERM: no run starts, the running ones are asked to stop
    processes: dict[int, subprocess.Popen] = {}

    def monitor() -> None:
        while not finished.wait(progress_every):
            with lock:
                snapshot = set(running)
            print("\n".join(progress_lines(runs, snapshot, logs)), flush=True)

    def start_and_wait(run: Run, index: int, command: list[str], env: dict[str, str]) -> int:
        with open(run.log, "w" if only is None else "a") as log:  # (a resumed run's log grows)
            # In a session of its own, so a terminal's Ctrl+C reaches the sweep alone, which passes exactly one
            # on (a run stops at once, without writing its checkpoint, on a second).
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True, pass_fds=() if held is None else (held.fileno(),))
            with lock:
                processes[index] = process
                run.pid = process.pid
                write_manifest(logs, family, runs)  # (named by a resume while it runs on past a killed sweep)
                if stopping.is_set():  # the sweep was stopped while this run started
                    process.send_signal(signal.SIGINT)
            return process.wait()

    def one(run: Run) -> None:
        if stopping.is_set():
            return  # stopped before this run began: it stays unstarted (returncode None)
        start = time.perf_counter()
        index = runs.index(run)
        with lock:
            running.add(index)
        command = command_of(run)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        group = groups.get() if groups is not None else None
        try:
            edit = recipe_edit(*recipe_of(run, recipes or {}), logs)  # (read now: the run reads it now)
            if edit is not None:
                with open(run.log, "w" if only is None else "a") as log:
                    log.write(f"{edit}\n")
                returncode = RECIPE_EDITED
            else:
                if group is not None:
                    gpu_env, flags = gpu_arguments(group)
                    env, command = {**env, **gpu_env}, [*command, *flags]
                returncode = start_and_wait(run, index, command, env)
        finally:
            if group is not None:
                groups.put(group)
        with lock:  # the record grows as runs end: a sweep stopped halfway keeps its finished runs' numbers
            run.returncode, run.pid = returncode, None
            run.stored = stored_numbers(run)  # read once, here
            running.discard(index)
            write_manifest(logs, family, runs)
            write_record(logs, family, runs)
        status = "ok" if not run.failed else run.ending
        if run.failed and stopping.is_set():  # (a run stopped before its training began exits 1, not 130)
            status = f"stopped by the sweep (exit {run.returncode}; log {run.log})"
        print(f"{run.config.stem}{'' if run.seed is None else f' seed {run.seed}'}: {status} in "
              f"{time.perf_counter() - start:.0f} s", flush=True)

    where = "" if groups is None else f" on GPUs {', '.join(','.join(g) for g in list(groups.queue))}"
    print(f"sweep: {len(todo)} runs, {jobs} at a time{where}, {threads} thread(s) each; logs in {logs}/", flush=True)
    if progress_every > 0:  # 0 means no table: a zero wait would print in a tight loop for the whole sweep
        threading.Thread(target=monitor, daemon=True).start()

    def stop() -> None:
        with lock:
            first = not stopping.is_set()
            stopping.set()
            live = [process for process in processes.values() if process.poll() is None]
            for process in live:
                process.send_signal(signal.SIGINT)
        print(f"\nsweep: stopping; no run starts, and the {len(live)} running write their last.ckpt and stop (Ctrl+C "
              "again: at once, without writing)" if first else f"\nsweep: stopping the {len(live)} running at once",
              flush=True)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs)
    futures = [pool.submit(one, run) for run in todo]
    on_term = signal.getsignal(signal.SIGTERM)
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:  # a scheduler's SIGTERM stops the sweep as Ctrl+C does
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            try:
                concurrent.futures.wait(futures)
                break
            except KeyboardInterrupt:
                stop()
    finally:
        finished.set()
        pool.shutdown()
        if in_main:
            signal.signal(signal.SIGTERM, on_term)
    for future in futures:
        future.result()  # (a run's bookkeeping that raised, raised here)
    if stopping.is_set():
        raise SweepInterrupted(logs, family, runs)


def recipe_of(run: Run, recipes: dict[str, str]) -> tuple[str, str | None]:
    """A run's recipe file (absolute) and its hash at the sweep's launch (None: not recorded)."""
    config = str(Path(run.config).resolve())
    return config, recipes.get(config)


class SweepInterrupted(Exception):
    """The sweep was stopped (Ctrl+C, SIGTERM): its ``logs`` folder, ``family`` and ``runs`` as they ended, the
    unstarted with returncode None; its manifest and record hold the same."""

    def __init__(self, logs: Path, family: str, runs: list[Run]):
        super().__init__(f"sweep stopped; its runs are recorded in {logs}/")
        self.logs, self.family, self.runs = logs, family, runs


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def submit(runs: list[Run], command_of, logs: Path, family: str, parallel: int, threads: int, devices_per_run: int,
           cluster: str | None, slurm: dict, progress_every: float, manifest: list[Run] | None = None,
           recipes: dict[str, str] | None = None) -> list[Run]:
    """The runs as one submitit job array (SLURM, or local processes with ``cluster="local"``); waits for every
    job, then the sweep tabulates exactly these runs as any other (``--from`` on its folder later works too).
    ``manifest``: all the sweep's runs, of which ``runs`` are some (a resume), recorded as they end (default ``runs``).
    ``recipes`` (path → hash at the sweep's launch): a job whose recipe is edited by the time it starts, or is
    requeued, does not run (:class:`recipes.launchers.RecipeJob`)."""
    executor = submitit_executor(logs / "submitit", cluster=cluster, devices_per_run=devices_per_run,
                                 parallel=parallel, slurm=slurm)
    env = {"OMP_NUM_THREADS": str(threads)}
    with executor.batch():
        submitted = [executor.submit(RecipeJob(command_of(run), env, run.log, run.folder, Path.cwd(),
                                               recipe_of(run, recipes or {}))) for run in runs]
    print(f"sweep: {len(runs)} runs submitted as a job array ({executor.cluster}, {parallel} at a time); logs in "
          f"{logs}/, submitit's in {logs / 'submitit'}/", flush=True)
    reported = time.monotonic()
    while not all(job.done() for job in submitted):
        time.sleep(0.5)  # (a job's state is a file submitit reads; the table prints every progress_every seconds)
        if progress_every and time.monotonic() - reported >= progress_every:
            reported = time.monotonic()
            waiting = {i for i, job in enumerate(submitted) if not job.done()}
            print("\n".join(progress_lines(runs, waiting, logs)), flush=True)
    for run, job in zip(runs, submitted):
        try:
            run.returncode = int(job.result())
        except Exception as error:  # noqa: BLE001 - a job that died is a failed run, named in the table
            run.returncode = -1
            reason = str(error).splitlines()[-1] if str(error) else repr(error)  # (an empty message: the class)
            with open(run.log, "a") as log:
                log.write(f"\nsubmitit: the job failed: {reason}\n")
    write_manifest(logs, family, runs if manifest is None else manifest)
    return runs
