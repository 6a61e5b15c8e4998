"""What a sweep's runs are and what they leave behind: the :class:`Run` of each launched (or found) process,
the sweep's ``sweep.json`` (its runs and how each ended) and ``record.json`` (each finished run's numbers, so the
sweep can be tabulated again where its run folders are not), and the reading of a run's figures, curves and
hyper-parameters — from its TensorBoard files, or from a record."""

import json
import math
import signal
import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml

from recipes.code_version import code_label, read_code
from recipes.launchers import RECIPE_EDITED
from recipes.recipe_files import CONFIG_DIR, flat_settings


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
    args: list[str] | None = None  # what it was launched with after ``python -m recipes fit`` (to resume it)
    pid: int | None = None  # its process's id while it runs on this machine (named if the sweep dies before it)

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    @property
    def ending(self) -> str:
        """How a run that did not succeed ended, for the table's notes."""
        if self.returncode is None:
            return f"NOT FINISHED (the sweep stopped before this run ended; log {self.log})"
        if self.returncode in (128 + signal.SIGINT, 128 + signal.SIGTERM):
            return (f"INTERRUPTED (stopped by a signal, after writing its last.ckpt unless a second one came; "
                    f"log {self.log})")
        if self.returncode == RECIPE_EDITED:
            return f"NOT STARTED (its recipe changed since the sweep began; log {self.log})"
        return f"FAILED (exit {self.returncode}; log {self.log})"


def write_manifest(folder: Path, family: str, runs: list[Run]) -> None:
    """``folder/sweep.json``: the runs of this sweep and how each ended (``returncode`` None: not yet)."""
    record = {"family": family, "runs": [manifest_entry(run) for run in runs]}
    write_json(folder / "sweep.json", record)


def manifest_entry(run: Run) -> dict:
    return {"config": str(Path(run.config).resolve()), "folder": str(Path(run.folder).resolve()),
            "returncode": run.returncode, "log": None if run.log is None else str(run.log), "seed": run.seed,
            "init_from": None if run.init_from is None else str(run.init_from), "args": run.args, "pid": run.pid}


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
        raise FileNotFoundError(f"{path} not found: give a folder a sweep wrote (runs/sweep-logs/<time>) "
                                "or a sweep's record.json")
    record = json.loads(path.read_text())
    runs = [Run(Path(r["config"]), Path(r["folder"]), r["returncode"],
                r["log"] and Path(r["log"]), r["seed"], r.get("init_from") and Path(r["init_from"]), args=r.get("args"),
                pid=r.get("pid"))
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
        entry.pop("args")  # (this machine's paths; the record travels)
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
        stored = {"result": run_result(run), "curves": {"val/loss": sorted(run_curve(run).items())},
                  "hparams": run_hparams(run)}
    except (FileNotFoundError, KeyError):
        return None
    config = Path(run.folder) / "config.yaml"
    if config.is_file():  # (its data and trainer settings: --vs data.init_args.seq_len reads them)
        stored["config"] = {k: v for k, v in (yaml.safe_load(config.read_text()) or {}).items() if k in CONFIG_SECTIONS}
    code = readable_code(run)  # (a damaged code.json keeps none: the table from the folders names it)
    if code is not None:
        stored["code"] = code
    return stored


def run_code(run: Run) -> list[dict] | None:
    """The code a run trained with (:mod:`recipes.code_version`), from its record or its folder; None where it
    recorded none. A ``code.json`` that cannot be read is a ValueError naming it."""
    return run.stored.get("code") if run.stored is not None else read_code(Path(run.folder))


def readable_code(run: Run) -> list[dict] | None:
    """:func:`run_code`, or None where the run's ``code.json`` cannot be read: one damaged file does not stop a table
    (:func:`code_note` names it) or a pooling check."""
    try:
        return run_code(run)
    except ValueError:
        return None


def code_note(runs: list[Run]) -> str | None:
    """A note where a table's runs come from more than one version of the code (another commit, uncommitted edits,
    another torch), naming which runs ran which; None where they all ran one (or none recorded its code)."""
    versions: dict[str, dict[str, list[int | None]]] = {}  # {label: {recipe: its seeds}}
    for run in runs:
        if run.failed:  # (not in the cells)
            continue
        try:
            code = run_code(run)
        except ValueError as error:  # a damaged code.json: said under the table, which it does not stop
            label = f"unreadable ({error})"
        else:
            label = code_label(code) if code else "not recorded (runs from before 2026-12-04 did not record their code)"
        versions.setdefault(label, {}).setdefault(run.config.stem, []).append(run.seed)
    if len(versions) < 2:
        return None
    return (f"the runs come from {len(versions)} versions of the code (a commit, +edits: uncommitted changes by hash, "
            "the torch that ran them), which may not compute the same: "
            + "; ".join(f"{label}: {', '.join(seeds_named(name, seeds) for name, seeds in recipes.items())}"
                        for label, recipes in versions.items()))


def data_note(runs: list[Run]) -> str | None:
    """A note where runs of one recipe in a table read other data (their ``code.json``'s content hashes differ: a
    corpus made again while the sweep ran, or on another Python), naming which read which; None where each recipe's
    runs read one (runs that recorded no hash are not compared)."""
    recipes: dict[str, dict[str, list[int | None]]] = {}  # {recipe: {data hash: its seeds}}
    for run in runs:
        code = None if run.failed else readable_code(run)
        if code and code[-1].get("data"):
            recipes.setdefault(run.config.stem, {}).setdefault(code[-1]["data"], []).append(run.seed)
    mixed = {name: hashes for name, hashes in recipes.items() if len(hashes) > 1}
    if not mixed:
        return None
    return ("runs of one recipe read other data (the data's content hash differs), so they are not seeds of one "
            "experiment: " + "; ".join(", ".join(f"{seeds_named(name, seeds)} read {data[:8]}" for data, seeds in
                                                 hashes.items()) for name, hashes in mixed.items()))


def seeds_named(name: str, seeds: list[int | None]) -> str:
    """``a seeds 0-4, 7`` (runs of recipe ``a``, consecutive seeds as a range); ``a`` for one unseeded run."""
    known = sorted({seed for seed in seeds if seed is not None})
    spans: list[list[int]] = []
    for seed in known:
        if spans and seed == spans[-1][1] + 1:
            spans[-1][1] = seed
        else:
            spans.append([seed, seed])
    parts = [f"{low}" if low == high else f"{low}-{high}" for low, high in spans]
    parts += ["unseeded"] * (None in seeds)
    if not known:
        return name if len(seeds) == 1 else f"{name} ({len(seeds)} runs)"
    return f"{name} seed{'s' * (len(known) > 1 or None in seeds)} {', '.join(parts)}"


def read_record(path: Path) -> tuple[str, list[Run]]:
    """The family and runs of a sweep's ``record.json`` (:func:`write_record`), each finished run with its
    stored numbers. A file that is not such a record is refused, named, with what is wrong."""
    try:
        try:
            record = json.loads(Path(path).read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as error:  # (a checkpoint or log given by mistake)
            raise ValueError(f"not a sweep record, nor a sweep's log folder: not JSON text ({error})") from None
        if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
            raise ValueError(f"not a sweep record of format {RECORD_FORMAT}")
        runs = [Run(CONFIG_DIR / r["config"], Path(r["folder"]), r["returncode"], r["log"] and Path(r["log"]),
                    r["seed"], r.get("init_from") and Path(r["init_from"]), r.get("stored"))
                for r in record["runs"]]  # (an absolute config path stays absolute under the / operator)
        return record["family"], runs
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}: {error}") from error


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
    # each MoE block's last busiest-expert load over the mean (1 uniform, E collapsed), averaged over the blocks
    loads = [last(tag) for tag in sorted(tags) if tag.startswith("moe/") and tag.endswith("/max_over_mean_load")]
    # and within each sequence (logged from 2026-12-06 on), likewise
    within = [last(tag) for tag in sorted(tags)
              if tag.startswith("moe/") and tag.endswith("/max_over_mean_load_per_sequence")]
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
        "max_load": statistics.fmean(loads) if loads else math.nan,
        "max_load_sequence": statistics.fmean(within) if within else math.nan,
    }


def run_result(run: Run) -> dict:
    """A finished run's figures (:func:`read_run`): from its record if it came from one, else from its folder."""
    return run.stored["result"] if run.stored is not None else read_run(Path(run.folder))


def finished_result(run: Run) -> tuple[dict | None, str]:
    """``(figures, "")`` for a run that finished and left figures to read (:func:`run_result`); else ``(None, why)``:
    how it ended (FAILED, NOT FINISHED) or what is missing, for the notes under a table."""
    if run.failed:
        return None, run.ending
    try:
        return run_result(run), ""
    except (FileNotFoundError, KeyError) as error:
        return None, f"has no results in {run.folder} ({error})"


def recipe_file(config: Path) -> str:
    """A run's recipe file as sweeps can be compared on it: relative to the bundled configs where it lies in a
    ``recipes/configs/`` folder (a record kept on another machine names it absolutely), else its resolved path."""
    parts = Path(config).parts
    for i in range(len(parts) - 1):
        if parts[i:i + 2] == ("recipes", "configs"):
            return "/".join(parts[i + 2:])
    return str(Path(config).resolve())


def pooling_problem(sweeps: list[tuple[str, list[Run]]]) -> str | None:
    """Why the runs of several sweeps (``(folder, runs)`` each) cannot be pooled into one table, else None: a recipe
    name that stands for two recipe files (``positions/ssd_rope`` and ``english/positions/ssd_rope``: other
    experiments, counted as seeds of one), for fine-tuned runs in one sweep and runs from scratch in another (a
    transfer family's stages and its control), or a seed of a recipe that finished in two of them (counted twice).
    A seed that failed or stopped in one sweep and finished in another (run again) is pooled once."""
    if len(sweeps) < 2:
        return None
    files: dict[str, dict[str, str]] = {}
    starts: dict[str, dict[bool, str]] = {}
    places: dict[tuple[str, int | None], list[tuple[str, Run]]] = {}
    for folder, runs in sweeps:
        for run in runs:
            name = run.config.stem
            files.setdefault(name, {}).setdefault(recipe_file(run.config), folder)
            starts.setdefault(name, {}).setdefault(run.init_from is not None, folder)
            places.setdefault((name, run.seed), []).append((folder, run))
    for name, where in files.items():
        if len(where) > 1:
            (first, one), (second, other) = list(where.items())[:2]
            return (f"--from: {name} is {first} in {one} and {second} in {other}: other recipes under one name, whose "
                    "runs would count as seeds of one; give sweeps of one family")
    for name, where in starts.items():
        if len(where) > 1:
            return (f"--from: {name}'s runs start from a checkpoint (--init-from) in {where[True]} and from scratch in "
                    f"{where[False]}: a fine-tuning and its control are two rows, not seeds of one; give one of them")
    results = {id(run): finished_result(run)[0] for _, runs in sweeps for run in runs}  # (read once: the events)
    settings: dict[str, tuple[str, dict]] = {}  # {recipe name: (the first sweep, its run's settings)}
    for folder, runs in sweeps:
        for run in runs:
            mine = settings_of(run, results[id(run)])
            first = settings.setdefault(run.config.stem, (folder, mine))
            differ = [key for key in sorted(set(first[1]) & set(mine)) if first[1][key] != mine[key]]
            if differ and first[0] != folder:
                key, more = differ[0], f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""
                return (f"--from: {run.config.stem}'s runs differ in {key}{more}: {first[1][key]} in {first[0]}, "
                        f"{mine[key]} in {folder}: runs of other settings would count as seeds of one; give sweeps "
                        "run alike (or tabulate each alone)")
    for (name, seed), found in places.items():
        finished = [folder for folder, run in found if results[id(run)] is not None]
        if len(finished) > 1:
            seed_name = f" seed {seed}" if seed is not None else ""
            return (f"--from: {name}{seed_name} finished in {' and in '.join(finished)}: pooled, it would count twice; "
                    "leave one of them out (new seeds: recipes.sweep --first-seed)")
    return None


SAME_RESULT = {"compile", "checkpoint_blocks", "peak_flops", "sample_tokens", "backend", "recompute"}
"""Model settings that change how a run computes, not what (compilation, recomputation, a kernel's backend, what it
logs): runs that differ in them pool as seeds of one recipe."""


def run_settings(run: Run) -> dict:
    """A finished run's model settings (its hparams, dotted), its data's :data:`POOLED_DATA` and content hash (where
    its ``code.json`` has one) and its step count, as sweeps are compared on them before their runs are pooled (empty
    for a run with no results)."""
    return settings_of(run, finished_result(run)[0])


def settings_of(run: Run, result: dict | None) -> dict:
    """:func:`run_settings` of a run whose :func:`finished_result` figures (``result``, None: none) are read."""
    try:
        hparams = run_hparams(run) if result is not None else None
    except (OSError, KeyError, TypeError):
        hparams = None
    if not isinstance(hparams, dict):  # (no results, or no hparams: nothing to compare)
        return dict()
    found = {key: value for key, value in flat_settings(hparams).items()
             if key.rsplit(".", 1)[-1] not in SAME_RESULT and "/" not in key}  # ("mixers/S": the same, as text)
    config = flat_settings(run_config(run) or {})  # (a record from before kept none: compared without them)
    found.update({key: config[key] for key in POOLED_DATA if key in config})
    code = readable_code(run)  # (the text's own hash: a corpus re-made, or Python's bundled text of another version)
    if code and code[-1].get("data"):
        found["the data's content hash"] = code[-1]["data"]
    return {**found, "steps": result.get("steps")}


POOLED_DATA = ("data.class_path", "data.init_args.seq_len", "data.init_args.batch_size")
"""The data settings runs pooled as seeds of one recipe must share (the rest — a cache folder, loader workers, a
corpus path written otherwise on another machine — change no result, or cannot be compared across machines)."""


def run_curve(run: Run, tag: str = "val/loss") -> dict[int, float]:
    """``{step: value}`` of ``tag`` from the run's folder, or from its record (which keeps ``val/loss``)."""
    if run.stored is not None:
        return {int(step): value for step, value in run.stored["curves"].get(tag, [])}
    return scalar_series(Path(run.folder), tag)


def run_hparams(run: Run) -> dict:
    if run.stored is not None:
        return run.stored["hparams"]
    return yaml.safe_load((Path(run.folder) / "hparams.yaml").read_text())


def scalar_series(run: Path, tag: str) -> dict[int, float]:
    """``{step: value}`` of one scalar of a run's TensorBoard events (empty when the run never logged it, or its
    folder is gone: the table names such a run, and the curves leave it out)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not Path(run).is_dir():  # (TensorBoard's reader raises DirectoryDeletedError)
        return {}
    events = EventAccumulator(str(run))
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)} if tag in events.Tags()["scalars"] else {}


CONFIG_SECTIONS = ("data", "trainer")
"""The parts of a run's ``config.yaml`` that ``--vs`` reads besides its model's hyper-parameters."""


def run_config(run: Run) -> dict | None:
    """A run's ``config.yaml`` — from its record, which keeps its data and trainer parts, or from its folder —, or
    None where neither holds one."""
    if run.stored is not None:
        return run.stored.get("config")
    path = Path(run.folder) / "config.yaml"
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def hparam(run: Run, key: str):
    """A (dotted) key of a run's hyper-parameters (its ``hparams.yaml``), e.g. ``d_model``, or of its data or trainer
    settings (its ``config.yaml``), e.g. ``data.init_args.seq_len``."""
    if key.split(".")[0] in CONFIG_SECTIONS:
        where, value = "config.yaml", run_config(run)
        if value is None and run.stored is not None:
            raise ValueError(f"{key!r}: the record of {run.folder} keeps no config.yaml (written before records "
                             "kept the runs' data and trainer settings)")
    else:
        where, value = "hparams.yaml", run_hparams(run)
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ValueError(f"{'setting' if where == 'config.yaml' else 'hyper-parameter'} {key!r} is not in "
                             f"{run.folder}/{where}")
        value = value[part]
    return value
