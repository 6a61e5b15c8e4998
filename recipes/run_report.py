"""What a run says about itself beside the progress bar: the torch threads it takes, and the summary at the end of
``fit`` (losses with their steps, speed, where the files are), printed by the worker where the strategy trains in
workers."""

import os
import statistics
import time
from pathlib import Path

import lightning as L

from recipes.code_version import code_label, read_code
from recipes.training import CheckpointPolicy, averages_weights, stochastic_average_taken


def busy_cores(cpus: set[int], window: float = 0.3, stat: str = "/proc/stat") -> float | None:
    """How many of ``cpus`` other processes keep busy: the share of their time not idle over the next ``window``
    seconds (Linux's per-CPU counters in ``stat``), less this process's own. None where there are no such counters.

    Not the load average: that one-minute mean still counts, a minute later, a run that has just ended, so a run
    started after it took half the cores of an idle machine."""

    def not_idle_and_all() -> tuple[int, int]:  # clock ticks over ``cpus``: (not idle, all), since boot
        busy = total = 0
        with open(stat) as lines:
            for line in lines:
                name, *fields = line.split()
                if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
                    continue
                ticks = [int(field) for field in fields[:8]]  # user nice system idle iowait irq softirq steal
                busy, total = busy + sum(ticks) - ticks[3] - ticks[4], total + sum(ticks)
        return busy, total

    try:
        busy, total = not_idle_and_all()
        own = time.process_time()
        time.sleep(window)
        busy_after, total_after = not_idle_and_all()
        own, tick = time.process_time() - own, os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    if total_after <= total:
        return None
    seconds = (total_after - total) / len(cpus) / tick  # the window, in the counters' own clock
    return max(0.0, len(cpus) * (busy_after - busy) / (total_after - total) - own / seconds)


def choose_threads(requested: int | None) -> str | None:
    """Set torch's threads: ``requested``, else OMP_NUM_THREADS (torch reads it), else the cores no other
    process is busy with (``busy_cores``, else the one-minute load average where the CPU has no counters to
    read): on a shared CPU torch's default, one thread per core, oversubscribes it (docs/training.md:
    ablate_moe took 140 s a step so, 11 s with one thread). Returns what to tell the user, or None when nothing
    changed."""
    import torch

    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores = len(cpus)
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--threads {requested} must be >= 1")
        torch.set_num_threads(requested)
        return f"torch threads: {requested} (--threads)"
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    if cores > 1 and torch.get_num_threads() > 1:  # (else there is nothing to take away)
        measured = busy_cores(cpus)
        if measured is None:
            measured = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    else:
        measured = 0.0
    busy = min(round(measured), cores - 1)
    threads = max(1, cores - busy)
    if threads >= torch.get_num_threads():
        return None
    torch.set_num_threads(threads)
    return (f"torch threads: {threads} of {cores} cores (about {busy} busy with other processes); "
            "--threads N or OMP_NUM_THREADS=N chooses")


def lacks_loader(data, name: str) -> bool:
    """Whether the data module ``data`` (None: no module) leaves Lightning's ``name`` (``val_dataloader``,
    ``test_dataloader``) unimplemented: Lightning would say only "`name` must be implemented"."""
    return data is not None and getattr(type(data), name) is getattr(L.LightningDataModule, name)


def fit_summary(trainer, module, log_dir: str | None = None) -> str:
    """Best and last validation loss with their steps, speed, time, and where the run's files are."""
    history = getattr(module, "history", {}) or {}
    steps, first = trainer.global_step, history.get("first_step", 0)
    done = f"{steps} step{'s' * (steps != 1)}" if steps else "no step"
    if first and steps == first:  # resumed with nothing left to do
        reached = trainer.max_steps == steps
        done += (f", all before this run (max_steps {steps} was reached already: raise --trainer.max_steps to train on)"
                 if reached else ", all before this run")
    elif first:
        done += f" ({steps - first} in this run, resumed at step {first})"
    lines = ["", "fit finished: " + done]
    val = history.get("val") or []
    if val:
        best_step, best = min(val, key=lambda item: item[1])
        last_step, last = val[-1]
        lines.append(f"  val/loss   last {last:.4f} (step {last_step})   best {best:.4f} (step {best_step})")
        accuracy = history.get("val_acc") or []
        if accuracy:  # (next-token accuracy: MQAR's measure, where the loss says little)
            best_step, best = max(accuracy, key=lambda item: item[1])
            last_step, last = accuracy[-1]
            lines.append(f"  val/acc    last {last:.4f} (step {last_step})   best {best:.4f} (step {best_step})")
    elif steps > first and trainer.limit_val_batches:  # the last step validates, unless its epoch may not
        data = getattr(trainer, "datamodule", None)
        if lacks_loader(data, "val_dataloader"):
            lines.append(f"  val/loss   none: the data module {type(data).__name__} has no val_dataloader")
        else:
            lines.append(f"  val/loss   none: no validation ran in these steps (check_val_every_n_epoch "
                         f"{trainer.check_val_every_n_epoch} skips this epoch's; --trainer.check_val_every_n_epoch 1, "
                         "or null with --trainer.val_check_interval N: every N steps)")
    speeds = history.get("tokens_per_sec") or []
    started = history.get("started")
    timing = []
    if speeds:
        timing.append(f"median {statistics.median(speeds):,.0f} tokens/s")
    elif steps > first:  # speed is measured over whole logging windows, the first of which opens at the first step
        every = getattr(trainer, "log_every_n_steps", None)
        timing.append(f"tokens/s not measured: no logging window (--trainer.log_every_n_steps {every}) closed in "
                      + (f"these {steps - first} steps" if steps - first != 1 else "this one step"))
    if started is not None:
        timing.append(f"wall time {time.perf_counter() - started:,.0f} s")
    if timing:
        lines.append("  speed      " + ", ".join(timing))
    lines += averaging_lines(trainer.callbacks)
    policy = next((c for c in trainer.callbacks if isinstance(c, CheckpointPolicy)), None)
    if policy is not None and policy.dirpath is not None:  # the files there (none under fast_dev_run, for one)
        this_run = {"last.ckpt": not trainer.fast_dev_run, "best.ckpt": bool(policy.best_path),
                    "swa.ckpt": bool(policy.average_path)}
        written = [name for name, ours in this_run.items() if ours and (Path(policy.dirpath) / name).exists()]
        lines.append(f"  checkpoints {policy.dirpath}/ ({', '.join(written)})" if written else "  checkpoints none written")
    code = read_code(Path(log_dir)) if log_dir and trainer.loggers else None
    if code:  # (which code trained it, recipes.code_version: the first thing to ask of a result that surprises)
        lines.append(f"  code       {code_label(code[-1:])}")
    tensorboard = any(type(logger).__name__ == "TensorBoardLogger" for logger in trainer.loggers)
    if log_dir and trainer.loggers:  # (without a logger, log_dir is only the folder the checkpoints went to)
        lines.append(f"  TensorBoard tensorboard --logdir {log_dir}" if tensorboard else f"  logs       {log_dir}")
    return "\n".join(lines)


def averaging_lines(callbacks: list) -> list[str]:
    """What a weight-averaging callback made of the numbers above and of the checkpoints."""
    lines = []
    for callback in callbacks:
        name = type(callback).__name__
        if averages_weights(callback):
            lines.append(f"  weights    {name}'s average: validated above and saved as each checkpoint's weights "
                         "(the trained ones beside them, for a resume)")
        elif stochastic_average_taken(callback):
            lines.append(f"  weights    {name}'s average, put in at the end: no validation above saw it; swa.ckpt "
                         "holds it (validate or eval it), last.ckpt the trained weights, to resume")
    return lines


def trains_in_workers(trainer) -> bool:
    """Whether the strategy trains in processes it starts (``ddp_spawn``, ``ddp_notebook``), this one only waiting:
    the weights come back to it, but not the run's history, step or checkpoint folder. (Lightning's launcher class is
    private: it is found by name, so that a Lightning without it gives the summary of this process, not an error.)"""
    launcher = getattr(trainer.strategy, "launcher", None)
    return any(cls.__name__ == "_MultiProcessingLauncher" for cls in type(launcher).__mro__)


class FitSummaryInWorker(L.Callback):
    """Prints :func:`fit_summary` from the worker of rank 0 where the strategy trains in workers; elsewhere the
    command prints it after ``fit`` returns (then also after a Ctrl+C, which ends the fit before ``on_fit_end``)."""

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trains_in_workers(trainer):
            return
        log_dir = trainer.log_dir  # (collective: every process asks)
        if trainer.is_global_zero:
            print(fit_summary(trainer, pl_module, log_dir), flush=True)
