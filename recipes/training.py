"""Training that can be trusted (docs/training.md): the checkpoint policy, atomic checkpoint writes, the
signals that save before stopping, and the errors a run stops with. docs/training.md explains them.

    runs/<name>/<version>/checkpoints/last.ckpt   every ``every_n_steps`` optimizer steps, at the end of
                                                  training, and on SIGINT/SIGTERM before exiting
    runs/<name>/<version>/checkpoints/best.ckpt   whenever the monitored validation metric improves
"""

import importlib.util
import logging
import math
import os
import random
import shutil
import signal
import sys
import threading
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Checkpoint, ProgressBar, RichProgressBar, StochasticWeightAveraging
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException

from recipes.checkpoints import is_checkpoint, load_checkpoint
from recipes.code_version import CODE_FILE, code_version, read_code, record_code, resume_note
from recipes.recipe_files import RUN_CHECKPOINTS

log = logging.getLogger(__name__)


class DivergenceError(RuntimeError):
    """The loss or the gradient norm stopped being finite. Raised before the optimizer step, so the
    weights (and any checkpoint) keep their last finite values."""

    def __init__(self, step: int, loss: float, grad_norm: float | None):
        self.step, self.loss, self.grad_norm = step, loss, grad_norm
        norm = "" if grad_norm is None else f", gradient norm {grad_norm}"
        super().__init__(
            f"training diverged at step {step}: loss {loss}{norm}. This step's update was not applied and no "
            "checkpoint was written from it. Lower the learning rate, raise the warm-up, or use a wider precision."
        )


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM stopped training at a step boundary, after ``last.ckpt`` was written."""

    def __init__(self, signum: int, step: int, path: str | None):
        self.signum, self.step, self.path = signum, step, path
        saved = f"; last checkpoint: {path}" if path else ""
        super().__init__(f"{signal.Signals(signum).name} received: stopped after step {step}{saved}")


FAULT = "HYBRID_ZOO_FAULT"
"""``HYBRID_ZOO_FAULT=<point>@<step>`` kills this process (SIGKILL) when training reaches ``point`` at optimizer
step ``step``: how the tests show that a crash at that moment loses nothing. Points: ``after_last_write``
(last.ckpt just written), ``validation`` (the first batch of a validation), ``best_write`` (best.ckpt
written to its temporary file, not yet renamed)."""


class StepProgressBar(RichProgressBar):
    """Lightning's rich progress bar without the "Epoch 0/-2" it shows when ``max_steps`` ends training: a
    step-limited run has ``max_epochs`` -1, which that bar prints as a total of -2 (fixed in Lightning after
    2.6.6). With no epoch limit the description is the epoch alone; otherwise it is Lightning's own. The run's
    version shows as ``v_num: 3``, not ``3.000``."""

    def _get_train_description(self, current_epoch: int) -> str:
        max_epochs = self.trainer.max_epochs
        if max_epochs is not None and max_epochs < 0:
            return f"Epoch {current_epoch}".ljust(len(self.validation_description))
        return super()._get_train_description(current_epoch)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        """Lightning's, with the run's version as text: the rich bar formats every number as a float, so
        ``version_3`` showed as ``v_num: 3.000``."""
        metrics = super().get_metrics(trainer, pl_module)
        if isinstance(metrics.get("v_num"), int):
            metrics["v_num"] = str(metrics["v_num"])
        return metrics


def release_process_group() -> None:
    """Destroy torch.distributed's default process group if this process made one (a DDP or FSDP rank). Lightning
    leaves it to the interpreter's exit, as torch advises against: there, in full test runs, a finished FSDP resume
    and a finished ``ddp_spawn`` worker each aborted once ("terminate called without an active exception", exit -6),
    which a sweep would have taken for a failed run. The command calls it at its end; a ``ddp_spawn`` worker, which
    never returns there, at its exit (:meth:`recipes.module.LanguageModel.setup` registers it)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def step_ended(trainer: L.Trainer, batch_idx: int) -> bool:
    """Whether the batch that just ended completed an optimizer step (the last micro-batch under accumulation)."""
    return (batch_idx + 1) % trainer.accumulate_grad_batches == 0


class ValidateFinalStep(L.Callback):
    """Validate the weights a run ends with. Lightning validates every ``val_check_interval`` batches and at the
    end of an epoch, so a run whose ``max_steps`` is no multiple of the interval ended unvalidated: its reported
    "final" ``val/loss`` (the fit summary, a sweep's table) was that of a model up to ``interval - 1`` steps
    older. Asking Lightning to stop at the last step makes it validate there (its rule for a requested stop);
    a run whose last step is a validation step validates once, as before."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if not step_ended(trainer, batch_idx):
            return
        if trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True


def default_progress_bar(callbacks: list, enabled: bool | None) -> ProgressBar | None:
    """The bar a run gets when the recipe names none: :class:`StepProgressBar` where ``rich`` is installed
    (Lightning's own choice would be its rich bar there), else None (Lightning's tqdm bar, which has no -2)."""
    if enabled is False or any(isinstance(c, ProgressBar) for c in callbacks):
        return None
    return StepProgressBar() if importlib.util.find_spec("rich") is not None else None


def fault_point(point: str, step: int) -> None:
    if os.environ.get(FAULT) == f"{point}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_orphans(folder: Path, pattern: str) -> list[Path]:
    """Delete what interrupted writers left in ``folder``: names matching ``pattern`` (ending in ``-<pid>``)
    whose process no longer runs. Returns what was deleted."""
    removed = []
    for path in Path(folder).glob(pattern):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            removed.append(path)
    return removed


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes a checkpoint to a temporary file beside its destination, flushes it to disk, then renames
    it into place, so a reader (or a resume after a crash) never sees a partial file. Reads one as data
    only (``weights_only=True``, whatever the caller or torch's default says), with an error that names
    a file that is not a checkpoint (:func:`recipes.checkpoints.load_checkpoint`)."""

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        if "://" in str(path):  # a remote file (fsspec): Lightning's reader, still without pickle
            return super().load_checkpoint(path, map_location=map_location, weights_only=True)
        # A mapping of tensors alone is what ddp_spawn's workers write for the main process to load their weights
        return load_checkpoint(path, map_location=map_location, bare_weights=True)

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            try:
                with open(tmp, "wb") as f:
                    torch.save(checkpoint, f)
                    f.flush()
                    os.fsync(f.fileno())
            except (OSError, RuntimeError) as error:  # torch reports a full disk as "enforce fail at inline_container.cc"
                free = shutil.disk_usage(path.parent).free
                reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
                raise OSError(f"writing the checkpoint {path} failed: {reason}. {free / 2**20:,.0f} MiB are free on "
                              f"that disk (a full disk?); the previous {path.name}, if any, is unchanged") from None
            if path.name == "best.ckpt":
                fault_point("best_write", int(checkpoint.get("global_step", -1)))
            os.replace(tmp, path)  # atomic on POSIX within one filesystem
        finally:
            tmp.unlink(missing_ok=True)


class RunConfigCallback(SaveConfigCallback):
    """Saves the resolved configuration as ``config.yaml`` in the run's folder, replacing only a file that a run
    wrote there before (a resumed run's own). Without a logger that folder is the working one, where a user's own
    ``config.yaml`` — perhaps the very recipe this run reads — may be: that is refused with a ``ValueError`` that
    names the file, before training starts, rather than overwritten with the resolved dump (its comments lost).
    (A folder that holds another run's checkpoints is refused before this, by :func:`checkpoints_problem`.)"""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.already_saved:
            path = Path(trainer.log_dir) / self.config_filename  # (collective under DDP: every process asks)
            problem = own_file_problem(path, self.config.get("config") or []) if trainer.is_global_zero else None
            problem = trainer.strategy.broadcast(problem)
            if problem:
                raise ValueError(problem)
        super().setup(trainer, pl_module, stage)

    code: list[dict] | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The code this run trains with, and its data's fingerprint, into its folder's ``code.json``
        (:mod:`recipes.code_version`): after a resume's restore, so a resumed run on changed code says from which
        step. Without a logger there is no run folder to write it in (and :attr:`code`, the entries, stays None)."""
        folder = trainer.log_dir if trainer.loggers else None  # (collective under DDP: every process asks)
        if folder is not None and trainer.is_global_zero:
            fingerprint = getattr(trainer.datamodule, "data_fingerprint", None)  # (a data module of the user's: none)
            version = {**code_version(), "data": fingerprint() if callable(fingerprint) else None}
            before = read_code(Path(folder)) or []
            self.code = record_code(Path(folder), trainer.global_step, version)
            change = resume_note(before[-1], self.code[-1]) if before else None  # (None: resumed on the same)
            if change:  # (a requeue after the code was pulled, a corpus made again: said, not only recorded)
                print(change, file=sys.stderr, flush=True)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        """A checkpoint carries its run's ``code.json`` entries under ``"code"``: a file copied away from its run
        folder still says which code trained it."""
        if self.code:
            checkpoint["code"] = self.code

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """A run that fails before its first step (its data, a refused configuration, the first forward) leaves
        no empty ``version_N`` behind: Lightning creates the folder and its events file before anything is
        checked, and an empty run would then sit in TensorBoard and in the version count."""
        if not trainer.is_global_zero or not trainer.loggers or (trainer.state.fn == "fit" and trainer.global_step):
            return
        folder = Path(trainer.log_dir)
        if folder.is_dir() and written_by_this_process_only(folder):
            shutil.rmtree(folder, ignore_errors=True)
            log.warning("removed %s: the run failed before its first step and it held nothing else", folder)


def written_by_this_process_only(folder: Path) -> bool:
    """Whether ``folder`` holds only what this process wrote while starting a run: TensorBoard events files
    with this process's id in their name (at least one: the folder is this run's, not a resumed one's), and
    its ``hparams.yaml``, ``config.yaml`` and ``code.json``, and a ``checkpoints`` folder that holds only the fit's
    lock (:class:`RunFolderLock`). A checkpoint, another process's events, any other file: no."""
    pid, ours = os.getpid(), False
    for entry in folder.iterdir():
        if entry.is_file() and entry.name.startswith("events.out.tfevents.") and f".{pid}." in entry.name:
            ours = True
        elif entry.is_dir() and entry.name == "checkpoints" and {p.name for p in entry.iterdir()} <= {RUN_LOCK}:
            continue
        elif not (entry.is_file() and entry.name in ("hparams.yaml", "config.yaml", CODE_FILE)):
            return False
    return ours


# The first line of every config.yaml a run writes (LightningCLI's dump header), without its version: a run
# resumed after a Lightning upgrade still owns the file its earlier part wrote.
RUN_CONFIG_HEADER = "# lightning.pytorch=="


def own_file_problem(path: Path, inputs) -> str | None:
    """Why the run must not write its resolved configuration to ``path``, or None: the file exists and is one of
    the run's ``--config`` files, or was not written by a run (its first line is not :data:`RUN_CONFIG_HEADER`)."""
    if not path.is_file():
        return None
    read = any(_resolved(given) == path.resolve() for given in inputs)
    with open(path, errors="replace") as f:
        written_by_run = f.readline().startswith(RUN_CONFIG_HEADER)
    if not read and written_by_run:
        return None
    what = "is this run's --config file" if read else "is not a configuration a run wrote"
    return (f"{path} {what}; the run saves its resolved configuration in its folder ({path.parent}: the working "
            "folder when the trainer has no logger) and will not overwrite it. Rename the file, or give "
            "--trainer.default_root_dir FOLDER, or let the run log (drop --trainer.logger false)")


def loggerless_checkpoint(default_root_dir: str | None, name: str) -> tuple[Path, Path | None]:
    """Where a run without a logger writes its checkpoints, ``<default_root_dir or .>/checkpoints``, and the
    checkpoint ``name`` there (a file or a sharded folder), or None: what ``--ckpt_path last`` finds for such a run."""
    folder = Path(default_root_dir or ".") / "checkpoints"
    return folder, (folder / name if is_checkpoint(folder / name) else None)


def checkpoint_folder(trainer: L.Trainer) -> Path:
    """Where :class:`CheckpointPolicy` writes: ``<log dir>/checkpoints``, the working folder's without a logger."""
    return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints"


def checkpoints_problem(folder: Path, resumed_from, *, logged: bool = True) -> str | None:
    """Why a ``fit`` must not write its checkpoints into ``folder``, or None: the folder holds a run's
    checkpoints and this fit does not resume from one of them (``resumed_from``, its ``--ckpt_path``), so it
    would replace them — an earlier run's work — with its own. ``logged``: whether the run has a logger (the
    advice differs: without one the folder is the working one)."""
    found = [name for name in RUN_CHECKPOINTS if (folder / name).exists()]
    if not found or (resumed_from and _resolved(resumed_from).parent == folder.resolve()):
        return None
    elsewhere = ("--trainer.default_root_dir FOLDER, or let the run log (drop --trainer.logger false)" if not logged
                 else "a logger version of its own")
    resume = f"resume that run with --ckpt_path {folder / 'last.ckpt'}, or " if "last.ckpt" in found else ""
    return (f"{folder} holds {', '.join(found)} of an earlier run, whose files this run would overwrite; {resume}"
            f"give this one another folder: {elsewhere}")


RUN_LOCK = ".fit.lock"  # in a run's checkpoints folder while a fit writes it (RunFolderLock)


class RunFolderLock:
    """An exclusive ``flock`` on ``<folder>/.fit.lock``, held while a fit writes ``folder`` (its checkpoints; with
    the logger's files beside): a second ``fit`` into the same folder — a ``--ckpt_path last`` of a run still going in
    another terminal, two runs without a logger in one working folder — is refused by name instead of writing the same
    checkpoints and curves. The kernel releases a ``flock`` when its process ends, however it ends, so a run killed
    outright leaves no stale lock. On a file system without locks it warns and guards nothing.

    :meth:`release` removes the file (a run killed outright leaves it, unlocked: the next fit takes it) and what
    :meth:`hold` created if the run wrote nothing there (a fit refused before its first step leaves no empty version
    folder behind)."""

    def __init__(self, folder: Path):
        self.folder, self.file, self.created = Path(folder), None, []

    def hold(self) -> "RunFolderLock":
        import fcntl

        self.created = [p for p in (self.folder.parent, self.folder) if not p.exists()]
        self.folder.mkdir(parents=True, exist_ok=True)
        held = open(self.folder / RUN_LOCK, "a+")
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.seek(0)
            who = held.read().strip() or "another process"
            held.close()
            raise ValueError(f"{self.folder}: a fit is writing this run now ({who}); a second would write the same "
                             "checkpoints and curves. Let it end, or stop it (Ctrl+C, or kill -INT on its process: it "
                             "writes last.ckpt), then resume with --ckpt_path last") from None
        except OSError as error:  # (ENOLCK, EOPNOTSUPP: no locks on this file system; a run must not fail for it)
            held.close()
            print(f"note: {self.folder / RUN_LOCK} cannot be locked on this file system ({error.strerror}): nothing "
                  "stops a second fit from writing this run at the same time", file=sys.stderr, flush=True)
            return self
        held.seek(0)
        held.truncate()
        held.write(f"process {os.getpid()}: python -m recipes {' '.join(sys.argv[1:])}\n")
        held.flush()
        self.file = held
        return self

    def release(self) -> None:
        if self.file is None:
            return
        (self.folder / RUN_LOCK).unlink(missing_ok=True)  # (while held: the run has stopped writing by now)
        self.file.close()
        self.file = None
        for folder in reversed(self.created):  # (the checkpoints folder, then the version folder above it)
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()


def _resolved(given) -> Path:
    """A ``--config`` path as jsonargparse keeps it (its ``absolute``, a str, from the folder it was given in)."""
    found = getattr(given, "absolute", given)
    return Path(found() if callable(found) else found).resolve()


def validation_follows(trainer: L.Trainer) -> bool:
    """Whether Lightning validates right after the training step that just ended (asked at
    ``on_train_batch_end``, with the rule Lightning applies a moment later)."""
    loop = trainer.fit_loop
    return bool(loop.epoch_loop._should_check_val_fx(loop._data_fetcher))


def pending_step_log(trainer: L.Trainer) -> dict | None:
    """What Lightning logs for the step that just ended, right after ``on_train_batch_end`` returns:
    ``{"step": logging step, "metrics": {name: value}}``, or None on a step that logs nothing. A checkpoint
    written at ``on_train_batch_end`` carries it, so a run killed before the log reached the events file
    writes it on resume (:meth:`CheckpointPolicy.on_train_start`)."""
    from lightning.fabric.utilities.apply_func import convert_tensors_to_scalars

    connector = trainer._logger_connector
    if not trainer.loggers or not (connector.should_update_logs or trainer.fast_dev_run):
        return None
    metrics = convert_tensors_to_scalars(connector.metrics["log"])
    metrics.setdefault("epoch", trainer.current_epoch)
    return {"step": int(trainer.fit_loop.epoch_loop._batches_that_stepped), "metrics": metrics}


def tensors_finite(tensors) -> bool:
    """Whether every floating-point tensor among ``tensors`` is finite."""
    return all(bool(torch.isfinite(t).all()) for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point())


def parameters_finite(module: torch.nn.Module) -> bool:
    return tensors_finite(module.parameters())


def averages_weights(callback: L.Callback) -> bool:
    """Whether ``callback`` is one of Lightning's ``WeightAveraging`` callbacks (``EMAWeightAveraging``; Lightning
    2.6 and later), named by class rather than imported so that earlier Lightning releases still load this module."""
    return any(cls.__name__ == "WeightAveraging" for cls in type(callback).__mro__)


def stochastic_average_taken(callback: L.Callback) -> bool:
    """Whether ``callback`` is a ``StochasticWeightAveraging`` that has averaged any weights (its average is then put
    in at the end of training, and written to swa.ckpt)."""
    return isinstance(callback, StochasticWeightAveraging) and int(callback.n_averaged or 0) > 0


def weight_averaging(callbacks: list) -> str | None:
    """The names of the weight-averaging callbacks among ``callbacks`` (Lightning's ``WeightAveraging`` kinds and
    ``StochasticWeightAveraging``), joined, or None."""
    names = [type(c).__name__ for c in callbacks if averages_weights(c) or isinstance(c, StochasticWeightAveraging)]
    return ", ".join(names) or None


NAMED_CHECKPOINTS = ("last", "best", "swa")
"""What ``--ckpt_path`` may name instead of a file: the newest ``<name>.ckpt`` of the recipe's runs."""

AVERAGE_ONLY = "weights_average"
"""The key of a checkpoint that holds a weight average alone (``swa.ckpt``): the name of the callback it is of."""


def averaged_weights(checkpoint: dict) -> str | None:
    """The name of the callback whose average a checkpoint's weights are — a ``WeightAveraging`` one (it keeps the
    trained ones beside them, under ``current_model_state``) or the ``StochasticWeightAveraging`` of a ``swa.ckpt``
    — or None for trained weights."""
    if AVERAGE_ONLY in checkpoint:
        return str(checkpoint[AVERAGE_ONLY])
    if "current_model_state" not in checkpoint:
        return None
    names = [key.split("{")[0] for key in checkpoint.get("callbacks") or {} if "Averaging" in key]
    return names[0] if names else "WeightAveraging"


def averaged_weights_note(checkpoint: dict, path) -> str | None:
    """What a command that scores or samples a checkpoint says when its weights are an average."""
    name = averaged_weights(checkpoint)
    if name is not None and AVERAGE_ONLY in checkpoint:
        return (f"note: {path} holds its run's {name} average, put in at the end of training (no validation of the "
                "run scored it); the trained weights are in last.ckpt beside it")
    return None if name is None else (f"note: {path} holds its run's {name} average as its weights (what its "
                                      "validations scored); the trained weights beside them serve only a resume")


def check_averaging_resumed(checkpoint: dict, callbacks: list) -> None:
    """Refuse to resume training from a checkpoint a ``WeightAveraging`` callback wrote when no such callback runs
    now: its ``state_dict`` holds the average and the trained weights wait under ``current_model_state`` for that
    callback to put back, so training would go on from the average, silently."""
    name = averaged_weights(checkpoint)
    if name is not None and AVERAGE_ONLY in checkpoint:
        raise ValueError(f"this checkpoint holds {name}'s average alone, written at the end of its run, without the "
                         "optimizer's state: resume from last.ckpt beside it (the trained weights), or start a new run "
                         "from the average with --model.init_from <the checkpoint>")
    if name is None or any(averages_weights(c) for c in callbacks):
        return
    raise ValueError(
        f"this checkpoint was written by a run with {name}: its weights are that callback's average, and the "
        f"trained weights beside them are restored only by it. Resume with the same callback "
        f"(--trainer.callbacks+={name} and its settings), or start a new run from the averaged "
        "weights with --model.init_from <the checkpoint>")


def check_averaging_unsharded(callbacks: list, strategy) -> None:
    """Refuse a weight-averaging callback under a strategy that shards the model (Lightning's
    ``ModelParallelStrategy``, ``FSDPStrategy``): a ``WeightAveraging`` callback keeps a whole copy of the model,
    made by copying the module, and FSDP cannot copy a sharded one (torch's "FSDP does not support deepcopy", from
    every process); ``StochasticWeightAveraging`` copies the module before it is sharded, and its first average of
    the sharded parameters into that copy fails (torch's "got mixed torch.Tensor and DTensor"), after the steps
    before it were spent."""
    if type(strategy).__name__ not in ("ModelParallelStrategy", "FSDPStrategy"):
        return
    for callback in callbacks:
        if averages_weights(callback):
            raise ValueError(f"{type(callback).__name__} keeps a whole copy of the model, made by copying the module, "
                             f"and FSDP cannot copy the module {type(strategy).__name__} shards: average weights "
                             "under DDP (--trainer.strategy ddp), or drop the callback")
        if isinstance(callback, StochasticWeightAveraging):
            raise ValueError(f"{type(callback).__name__} averages into a whole copy of the model, which the parameters "
                             f"{type(strategy).__name__} shards cannot be averaged into (FSDP): average weights under "
                             "DDP (--trainer.strategy ddp), or drop the callback")


class WriteLastBeforeTrainEnd(L.Callback):
    """Writes ``policy``'s final ``last.ckpt`` at the end of training before any other callback's ``on_train_end``:
    a weight-averaging callback (Lightning's ``EMAWeightAveraging``, ``StochasticWeightAveraging``) copies its
    average over the trained weights there, and Lightning calls a checkpoint callback's hooks after all others', so
    the policy's own write came after the copy and a run resumed to train longer went on from the average. Placed
    first by :meth:`CheckpointPolicy.setup`."""

    def __init__(self, policy: "CheckpointPolicy"):
        self.policy = policy

    def on_train_end(self, trainer, pl_module) -> None:
        self.policy._save_last(trainer)


class CheckpointPolicy(Checkpoint):
    """What a recipe's run writes, in ``<log dir>/checkpoints/`` (the logger's version folder):

    - ``last.ckpt`` every ``every_n_steps`` optimizer steps, at the end of training, and when SIGINT
      (Ctrl+C) or SIGTERM arrives: training finishes the current step, writes it, and the process
      exits with 128 + the signal number (unless that step was the last one). A second Ctrl+C stops
      at once, without writing.
    - ``best.ckpt`` whenever ``monitor`` (default ``val/loss``) reaches a new best: a minimum, or a maximum for
      ``mode="max"`` (the default for an accuracy, a metric whose name ends in ``acc`` or ``accuracy``). A
      ``monitor`` that validation never logs is named in a warning at the first validation (no best.ckpt).

    Nothing is lost whenever the process dies. A ``last.ckpt`` due at a step that Lightning validates
    after is written once that validation (and ``best.ckpt``) is done, so a crash during either resumes
    from the previous one and runs them again; one due at any other step carries the metrics Lightning
    logs just after it is written, which the resumed run writes if the crash came first. Temporary files
    of interrupted writes are deleted at the next start.

    A checkpoint is never written from non-finite weights, so the last one on disk is always usable.
    ``python -m recipes fit --ckpt_path last`` resumes from ``last.ckpt`` (recipes/cli.py).

    Args:
        every_n_steps: optimizer steps between two writes of ``last.ckpt`` (default 100; 0: only at the
            end and on a signal).
        keep_best: also keep ``best.ckpt`` (default True).
        monitor: the validation metric ``best.ckpt`` follows (default ``val/loss``).
        mode: ``"min"`` or ``"max"``: whether a lower or a higher ``monitor`` is better (default: ``"max"`` for
            an accuracy, else ``"min"``).
    """

    def __init__(self, every_n_steps: int = 100, keep_best: bool = True, monitor: str = "val/loss",
                 mode: str | None = None):
        if not isinstance(every_n_steps, int) or every_n_steps < 0:
            raise ValueError(f"CheckpointPolicy: every_n_steps={every_n_steps!r} must be an integer >= 0")
        if mode not in (None, "min", "max"):
            raise ValueError(f"CheckpointPolicy: mode={mode!r} is not one of 'min', 'max' (or None: from the monitor)")
        self.every_n_steps, self.keep_best, self.monitor = every_n_steps, keep_best, monitor
        # an accuracy is better higher: minimising it, best.ckpt kept the worst model
        self.mode = mode or ("max" if monitor.lower().endswith(("acc", "accuracy")) else "min")
        self.dirpath: Path | None = None
        self.last_path: str | None = None
        self.last_step: int | None = None
        self.best_score: float = self._worst
        self._monitor_missing_said = False
        self.best_path: str | None = None
        self.average_path: str | None = None  # swa.ckpt, once written
        self._signal: int | None = None
        self._stop_pending = False
        self._previous_handlers: dict[int, object] = {}
        self._world_size = 1
        self._after_validation = False  # last.ckpt is due once the running step's validation is done
        self._pending_log: dict | None = None  # what the checkpoint being written must carry
        self._relog: dict | None = None  # what the checkpoint resumed from carried

    # ---- where ---------------------------------------------------------------------------------

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.dirpath = Path(trainer.strategy.broadcast(str(checkpoint_folder(trainer))))
        if trainer.is_global_zero:
            for path in remove_orphans(self.dirpath, ".*.ckpt.tmp-*"):
                log.info("removed %s, left by an interrupted checkpoint write", path)
        if not any(isinstance(c, WriteLastBeforeTrainEnd) and c.policy is self for c in trainer.callbacks):
            # a new list: Lightning is iterating over the old one, calling each callback's setup
            trainer.callbacks = [WriteLastBeforeTrainEnd(self), *trainer.callbacks]

    def _skip(self, trainer: L.Trainer) -> bool:
        return bool(trainer.fast_dev_run) or trainer.sanity_checking or self.dirpath is None

    def _save(self, trainer: L.Trainer, name: str) -> str | None:
        """Write ``name`` (every rank takes part: saving is collective under DDP/FSDP)."""
        finite = parameters_finite(trainer.lightning_module)  # of this process's shard under FSDP
        if trainer.world_size > 1:  # all processes save, or none: saving is collective
            finite = trainer.strategy.reduce_boolean_decision(finite, all=True)
        if not finite:
            log.error("CheckpointPolicy: the weights are not finite at step %d; %s not written", trainer.global_step, name)
            return None
        path = str(self.dirpath / name)
        trainer.save_checkpoint(path, weights_only=False)  # the full training state
        return path

    def _save_last(self, trainer: L.Trainer, before_log: bool = False) -> None:
        """Write last.ckpt; ``before_log``: Lightning has not yet logged this step's metrics (they travel along)."""
        if self._skip(trainer) or self.last_step == trainer.global_step:
            return
        self._pending_log = pending_step_log(trainer) if before_log else None
        try:
            path = self._save(trainer, "last.ckpt")
        finally:
            self._pending_log = None
        if path is not None:
            self.last_path, self.last_step = path, trainer.global_step
            fault_point("after_last_write", trainer.global_step)

    # ---- when ----------------------------------------------------------------------------------

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not step_ended(trainer, batch_idx):
            return  # mid-accumulation: no optimizer step has completed, nothing to write or stop at
        due = bool(self.every_n_steps) and trainer.global_step % self.every_n_steps == 0
        stop = self._signal is not None
        if trainer.world_size > 1:  # every rank must take the same decision: saving is collective
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if stop and not self._stop_pending:
            self._stop_pending, due = True, True
        if not due or self._skip(trainer):
            return
        if validation_follows(trainer):
            self._after_validation = True  # written in on_validation_end
        else:
            self._save_last(trainer, before_log=True)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # The logging step of the step about to run is its global step. Lightning's restart logic adds one to it after
        # a resume from a checkpoint written at the end of training (a run resumed to train longer): its curves then
        # skipped a step and stood one step right of the checkpoints'. A run's logging step never differs otherwise.
        loop = trainer.fit_loop.epoch_loop
        if loop._batches_that_stepped != trainer.global_step:
            loop._batches_that_stepped = trainer.global_step
        # Stop here rather than at the end of the step that saved: by now Lightning has logged that step
        # (and run its validation if one was due), so the curves have no hole where the run stopped.
        if self._stop_pending:
            raise TrainingInterrupted(self._signal or signal.SIGTERM, trainer.global_step, self.last_path)

    def on_train_end(self, trainer, pl_module) -> None:
        self._save_last(trainer)
        self._save_averages(trainer)
        self._restore_handlers()

    def _save_averages(self, trainer: L.Trainer) -> None:
        """Write ``swa.ckpt``: a ``StochasticWeightAveraging`` callback's average, which it puts into the model only
        now, after the last validation and last.ckpt, and keeps nowhere else but in its own state. The checkpoint
        holds the weights alone (no optimizer state: it scores and samples; a resume takes last.ckpt), marked with
        the callback's name so that ``validate``, ``test`` and ``eval`` say what they score."""
        averages = [c for c in trainer.callbacks if stochastic_average_taken(c)]
        if self._skip(trainer) or not averages:
            return
        average = averages[0].state_dict()["average_model_state"]  # the LightningModule's state_dict, averaged
        if not tensors_finite(average.values()):
            log.error("CheckpointPolicy: the StochasticWeightAveraging average is not finite; swa.ckpt not written")
            return
        # Lightning's save_checkpoint, with the average for the weights and the mark added
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=True)
        checkpoint["state_dict"], checkpoint[AVERAGE_ONLY] = average, type(averages[0]).__name__
        code = next((c.code for c in trainer.callbacks if isinstance(c, RunConfigCallback) and c.code), None)
        if code:  # (a weights-only dump calls no callback's on_save_checkpoint)
            checkpoint["code"] = code
        path = str(self.dirpath / "swa.ckpt")
        trainer.strategy.save_checkpoint(checkpoint, path)
        trainer.strategy.barrier("swa.ckpt")
        self.average_path = path

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if batch_idx == 0 and trainer.state.fn == "fit" and not trainer.sanity_checking:
            fault_point("validation", trainer.global_step)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._skip(trainer) or trainer.state.fn != "fit":
            return
        value = trainer.callback_metrics.get(self.monitor)
        if self.keep_best and value is None and not self._monitor_missing_said and trainer.is_global_zero:
            self._monitor_missing_said = True
            logged = sorted(name for name in trainer.callback_metrics if name.startswith("val/"))
            log.warning("CheckpointPolicy: monitor %r is not a validation metric (logged: %s); no best.ckpt is written",
                        self.monitor, ", ".join(logged) or "none")
        if (self.keep_best and value is not None and math.isfinite(float(value))
                and self._better(float(value))):
            # best before last: a crash between the two resumes from the previous last.ckpt, which
            # runs this validation again and rewrites best.ckpt
            previous, self.best_score = self.best_score, float(value)  # the checkpoint written records it
            path = self._save(trainer, "best.ckpt")
            if path is not None:
                self.best_path = path
            else:
                self.best_score = previous
        if self._after_validation:
            self._after_validation = False
            self._save_last(trainer)

    @property
    def _worst(self) -> float:
        return math.inf if self.mode == "min" else -math.inf

    def _better(self, value: float) -> bool:
        return value < self.best_score if self.mode == "min" else value > self.best_score

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        if self._pending_log is not None:
            checkpoint["pending_log"] = self._pending_log

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        self._relog = checkpoint.get("pending_log")

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._restore_handlers()
        if isinstance(exception, SIGTERMException):
            # Lightning's own SIGTERM stop (under DDP), raised between two steps: a safe point to save.
            self._save_last(trainer)
            if trainer.is_global_zero and self.last_path:
                log.warning("wrote %s (step %d); resume with --ckpt_path last", self.last_path, self.last_step)
        if isinstance(exception, DivergenceError) and trainer.is_global_zero:
            where = (f"{self.last_path} (step {self.last_step}), not overwritten" if self.last_path
                     else "none was written in this run")
            log.error("last finite checkpoint: %s", where)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._restore_handlers()

    # ---- signals -------------------------------------------------------------------------------

    def on_train_start(self, trainer, pl_module) -> None:
        self._signal, self._stop_pending, self._world_size = None, False, trainer.world_size
        if self._relog is not None:  # the step the resumed checkpoint was written in, logged as it would have been
            for logger in trainer.loggers:
                logger.log_metrics(self._relog["metrics"], step=self._relog["step"])
                logger.save()
            self._relog = None
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be installed from the main thread
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous_handlers[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self._signal is not None:
            raise KeyboardInterrupt  # a second Ctrl+C: stop now, without saving
        self._signal = signum
        previous = self._previous_handlers.get(signum)
        if signum == signal.SIGTERM and self._world_size > 1 and callable(previous):
            previous(signum, frame)  # Lightning's own: tells the other DDP processes
        log.warning("%s received: stopping after this step and writing last.ckpt", signal.Signals(signum).name)

    def _restore_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in self._previous_handlers.items():
                signal.signal(signum, handler)
        self._previous_handlers = {}

    # ---- resume --------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {"best_score": self.best_score, "best_path": self.best_path,
                "last_path": self.last_path, "last_step": self.last_step}

    def load_state_dict(self, state_dict: dict) -> None:
        self.best_score = state_dict.get("best_score", self._worst)
        self.best_path = state_dict.get("best_path")
        self.last_path, self.last_step = state_dict.get("last_path"), state_dict.get("last_step")


# ---- random number generators ------------------------------------------------------------------

def rng_states() -> dict:
    """Every global RNG this process uses, in a form ``torch.load(weights_only=True)`` reads back."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
        "python": list(random.getstate()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    name, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = states["python"]
    random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


# ---- finding a run's last checkpoint -------------------------------------------------------------

def run_checkpoints(roots: list[Path], name: str = "last.ckpt") -> list[Path]:
    """Every ``<root>/<version>/checkpoints/<name>`` of the ``roots``, the most recently written first."""
    candidates = [p for root in roots for p in root.glob(f"*/checkpoints/{name}") if is_checkpoint(p)]
    return sorted(candidates, key=lambda p: p.stat().st_mtime, reverse=True)
