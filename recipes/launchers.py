"""Where a sweep's runs execute: this machine's cores (``local``), its GPUs (``gpus``), or a SLURM cluster through
submitit (``slurm``). Each run is the same ``python -m recipes fit`` command whichever launcher starts it, so a
family's table does not depend on the launcher (docs/training.md, "Sweeps on GPUs and clusters")."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from recipes.recipe_files import RUN_CHECKPOINTS

LAUNCHERS = ("local", "gpus", "slurm")
RECIPE_EDITED = 75  # a run's exit status where its recipe changed before it started (sysexits' EX_TEMPFAIL)


def recipe_hash(config: Path) -> str:
    """16 hex digits of the SHA-256 of a recipe file's bytes."""
    return hashlib.sha256(Path(config).read_bytes()).hexdigest()[:16]


def recipe_changed(config: Path, recorded: str | None) -> bool:
    """Whether a recipe file's bytes are no longer those the sweep began with (``recorded``, their
    :func:`recipe_hash`; None: not recorded, nothing to compare), or the file is gone."""
    path = Path(config)
    return recorded is not None and (not path.is_file() or recipe_hash(path) != recorded)


def recipe_edit(config: Path, recorded: str | None, logs: Path) -> str | None:
    """Why a run of ``config`` must not start now, or None: :func:`recipe_changed`. A run started hours into a sweep
    (a slot freed locally, a job array's task scheduled, a job requeued) reads its recipe then, and an edit meant for
    the next experiment would make it train another recipe than the sweep's other runs did, and be tabulated as
    theirs."""
    path = Path(config)
    if not recipe_changed(path, recorded):
        return None
    return (f"sweep: {path.name} changed since the sweep began (or is gone), so this run did not start: it would train "
            "another recipe than the sweep's other runs did; put the recipe back as it was and resume the sweep "
            f"(python -m recipes.sweep --resume {logs}), or start a new sweep of the edited family")


def device_groups(visible: list[str], per_run: int) -> list[list[str]]:
    """The visible GPUs in groups of ``per_run``, one group per concurrent run (leftover GPUs stay idle)."""
    if per_run < 1:
        raise ValueError(f"--devices-per-run={per_run} must be >= 1")
    if len(visible) < per_run:
        raise ValueError(f"--launcher gpus: {len(visible)} visible GPU(s), fewer than --devices-per-run={per_run}")
    return [visible[i:i + per_run] for i in range(0, len(visible) - per_run + 1, per_run)]


def visible_gpus() -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else every device torch sees."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d for d in listed.split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_arguments(group: list[str]) -> tuple[dict[str, str], list[str]]:
    """The environment and trainer flags that give one run exactly the GPUs of ``group``."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(group)}, ["--trainer.accelerator", "gpu", "--trainer.devices", str(len(group))]


def resume_arguments(command: list[str], folder: Path) -> list[str]:
    """``command`` continued from its own run's ``last.ckpt`` when one was written (a requeued job, a resumed sweep),
    else as it was: from the start. Starting again, the run's folder is cleared of the checkpoints an earlier
    attempt left without a ``last.ckpt`` (a ``best.ckpt`` written before a process killed outright could write
    one): they are this run's own, its restart with the same seed writes them again, and a fresh ``fit`` refuses
    to write over a folder's checkpoints."""
    checkpoints = folder / "checkpoints"
    if "--ckpt_path" in command:
        return command
    if (checkpoints / "last.ckpt").exists():
        return [*command, "--ckpt_path", str(checkpoints / "last.ckpt")]
    for name in RUN_CHECKPOINTS:
        stale = checkpoints / name
        if stale.is_dir():  # (a sharded checkpoint)
            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    return command


class RecipeJob:
    """One run as a submitit job: ``python -m recipes fit …`` in a child process, its output in the run's log.

    On preemption or timeout submitit calls :meth:`checkpoint`, which requeues the same command continued from
    the run's ``last.ckpt`` (the recipes write it when SIGTERM arrives, and every ``checkpoint.every_n_steps``).
    ``recipe``: the run's recipe file and its hash at the sweep's launch; a job that finds the file edited since
    does not run (exit :data:`RECIPE_EDITED`, the reason in its log)."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path, folder: Path, cwd: Path,
                 recipe: tuple[str, str | None] | None = None):
        self.command, self.env, self.log, self.folder, self.cwd = command, env, Path(log), Path(folder), Path(cwd)
        self.recipe = recipe

    def __call__(self) -> int:
        edit = None if self.recipe is None else recipe_edit(self.cwd / self.recipe[0], self.recipe[1], self.log.parent)
        if edit is not None:
            with open(self.log, "a") as log:
                log.write(f"\n{edit}\n")
            return RECIPE_EDITED
        command = resume_arguments(self.command, self.folder)
        with open(self.log, "a") as log:
            return subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                                   cwd=self.cwd)

    def checkpoint(self):
        import submitit

        return submitit.helpers.DelayedSubmission(RecipeJob(self.command, self.env, self.log, self.folder, self.cwd,
                                                            self.recipe))


def check_slurm(cluster: str | None):
    """submitit (the module), where ``--launcher slurm`` can submit: an ImportError without it, and a ValueError
    where ``cluster`` is None (SLURM) and SLURM is not there — submitit would take its local executor and run the
    whole array on this machine, a login node say, with no word but the executor's name."""
    try:
        import submitit
    except ImportError:
        raise ImportError('--launcher slurm needs submitit: pip install "hybrid-zoo[slurm]" (or submitit)') from None
    if cluster is None and not submitit.SlurmExecutor.affinity() > 0:
        raise ValueError("--launcher slurm: SLURM is not available here (submitit finds no srun on the PATH); run the "
                         "sweep where SLURM is, or --launcher local, or --submitit-cluster local to run the array as "
                         "local processes")
    return submitit


def submitit_executor(folder: Path, *, cluster: str | None, devices_per_run: int, parallel: int, slurm: dict):
    """A submitit executor for the sweep's job array: ``cluster`` None is SLURM, which must be there ("local" runs
    the jobs as local processes, for tests); ``slurm`` holds more ``update_parameters`` keywords
    (``slurm_partition``, ``timeout_min``, ``cpus_per_task``…)."""
    submitit = check_slurm(cluster)
    executor = submitit.AutoExecutor(folder=str(folder), cluster=cluster or "slurm")
    parameters = {"timeout_min": 24 * 60, "slurm_array_parallelism": parallel, **slurm}
    if executor.cluster == "slurm":
        parameters.setdefault("gpus_per_node", devices_per_run)
        parameters.setdefault("tasks_per_node", devices_per_run)  # Lightning runs one process per task
    executor.update_parameters(**parameters)
    return executor


def python_command() -> list[str]:
    return [sys.executable, "-m", "recipes", "fit"]
