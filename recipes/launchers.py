"""Where a sweep's runs execute: this machine's cores (``local``), its GPUs (``gpus``), or a SLURM cluster through
submitit (``slurm``). Each run is the same ``python -m recipes fit`` command whichever launcher starts it, so a
family's table does not depend on the launcher (docs/training.md, "Sweeps on GPUs and clusters")."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from recipes.recipe_files import RUN_CHECKPOINTS

LAUNCHERS = ("local", "gpus", "slurm")


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
    the run's ``last.ckpt`` (the recipes write it when SIGTERM arrives, and every ``checkpoint.every_n_steps``)."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path, folder: Path, cwd: Path):
        self.command, self.env, self.log, self.folder, self.cwd = command, env, Path(log), Path(folder), Path(cwd)

    def __call__(self) -> int:
        command = resume_arguments(self.command, self.folder)
        with open(self.log, "a") as log:
            return subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                                   cwd=self.cwd)

    def checkpoint(self):
        import submitit

        return submitit.helpers.DelayedSubmission(RecipeJob(self.command, self.env, self.log, self.folder, self.cwd))


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
