"""``python -m recipes fit|validate|test --config FILE``: LightningCLI over ``LanguageModel``.

On top of LightningCLI (docs/training.md):
- ``--config NAME.yaml`` also finds the bundled recipes (``recipes/configs/``) from any folder;
- every ``fit`` writes checkpoints by :class:`recipes.training.CheckpointPolicy`, configured under
  ``checkpoint:`` (``--checkpoint.every_n_steps 50``), atomically;
- ``--ckpt_path last`` is the newest ``last.ckpt`` of the recipe's runs (an error when there is none),
  and ``fit`` from a run's checkpoint continues that run: same log folder, same TensorBoard curves;
- gradients are clipped at norm 1.0 unless the recipe says otherwise;
- a diverged or interrupted run exits with a message, not a traceback, and a non-zero status.
"""

import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import SIGTERMException

from recipes.module import LanguageModel
from recipes.training import AtomicCheckpointIO, CheckpointPolicy, DivergenceError, TrainingInterrupted, newest_checkpoint

CONFIG_DIR = Path(__file__).parent / "configs"
RUN_LOGGERS = ("TensorBoardLogger", "CSVLogger")  # loggers whose folders are <save_dir>/<name>/<version>/


def bundled_configs() -> list[str]:
    return sorted(str(p.relative_to(CONFIG_DIR)) for p in CONFIG_DIR.rglob("*.yaml"))


def resolve_config(value: str) -> str:
    """An existing path stays; otherwise ``NAME.yaml`` resolves to the bundled ``recipes/configs/NAME.yaml``."""
    if Path(value).is_file():
        return value
    bundled = CONFIG_DIR / value
    if bundled.is_file():
        return str(bundled)
    raise FileNotFoundError(
        f"config file {value!r} not found: it is not a path to a file, nor a bundled config "
        f"(bundled: {', '.join(bundled_configs())})"
    )


def resolve_config_args(args: list[str]) -> list[str]:
    """Rewrite every ``--config X`` / ``--config=X`` / ``-c X`` argument through :func:`resolve_config`."""
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        if arg in ("--config", "-c") and i + 1 < len(args):
            out += [arg, resolve_config(args[i + 1])]
            i += 2
            continue
        if arg.startswith("--config="):
            arg = "--config=" + resolve_config(arg.split("=", 1)[1])
        out.append(arg)
        i += 1
    return out


def run_logger(trainer_config):
    """The trainer's first logger config when it writes ``<save_dir>/<name>/<version>/`` folders, with
    the folder that holds its versions: ``(logger namespace or None, root or None)``."""
    logger = trainer_config.get("logger")
    if isinstance(logger, list):
        logger = logger[0] if logger else False
    default_root = Path(trainer_config.get("default_root_dir") or ".")
    if logger is None or logger is True:  # Lightning's default: TensorBoard in lightning_logs/
        return None, default_root / "lightning_logs"
    if logger is False or not hasattr(logger, "class_path"):
        return None, None
    if logger.class_path.rsplit(".", 1)[-1] not in RUN_LOGGERS:
        return None, None
    args = logger.init_args
    save_dir = getattr(args, "save_dir", None) or str(default_root)
    name = getattr(args, "name", None)
    return logger, Path(save_dir) / name if name else Path(save_dir)


class HybridCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        # The vocabulary is the data's business; the model takes it from the instantiated data module.
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        parser.add_class_arguments(CheckpointPolicy, "checkpoint")

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand is not None:
            self._resolve_checkpoint(subcommand, self.config[subcommand])

    def _resolve_checkpoint(self, subcommand: str, config) -> None:
        """``--ckpt_path last`` (``best``) → the newest ``last.ckpt`` (``best.ckpt``) of this recipe's runs; a ``fit`` from a run's
        checkpoint logs into that run's folder (TensorBoard drops the killed run's events after it)."""
        ckpt_path = config.get("ckpt_path")
        if not ckpt_path:
            return
        logger, root = run_logger(config.trainer)
        if ckpt_path in ("last", "best"):
            found = newest_checkpoint(root, f"{ckpt_path}.ckpt") if root is not None else None
            if found is None:
                where = f"under {root}/*/checkpoints/" if root is not None else "(this trainer writes no run folders)"
                sys.exit(f"error: --ckpt_path {ckpt_path}: no {ckpt_path}.ckpt {where}; train first, or pass the "
                         "path of a checkpoint file")
            config.ckpt_path = ckpt_path = str(found)
            print(f"resuming from {found}" if subcommand == "fit" else f"checkpoint: {found}", flush=True)
        path = Path(ckpt_path)
        if not path.is_file():
            sys.exit(f"error: --ckpt_path {ckpt_path}: no such checkpoint file")
        in_run = (root is not None and path.parent.name == "checkpoints"
                  and path.parent.parent.parent.resolve() == root.resolve())
        if subcommand == "fit" and logger is not None and in_run:
            logger.init_args.version = path.parent.parent.name
            if logger.class_path.endswith("TensorBoardLogger"):
                step = torch.load(path, map_location="cpu", weights_only=True, mmap=True)["global_step"]
                logger.dict_kwargs = {**(getattr(logger, "dict_kwargs", None) or {}), "purge_step": step}

    def instantiate_trainer(self, **kwargs) -> L.Trainer:
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        callbacks = config["trainer"].get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
        if config["trainer"].get("enable_checkpointing") is not False:  # (in validate too: it restores its state)
            callbacks.append(config["checkpoint"])
        trainer = super().instantiate_trainer(callbacks=callbacks, **kwargs)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        return trainer


def main(args: list[str] | None = None, *, run: bool = True) -> HybridCLI:
    """Run the CLI on ``args`` (default: the command line). With ``run=False`` the arguments hold no
    subcommand and the CLI only parses and instantiates (model, data, trainer)."""
    try:
        if args is None:
            sys.argv[1:] = resolve_config_args(sys.argv[1:])
        else:
            args = resolve_config_args(args)
    except FileNotFoundError as error:
        sys.exit(f"error: {error}")
    try:
        return HybridCLI(
            LanguageModel,
            L.LightningDataModule,
            subclass_mode_data=True,
            args=args,
            run=run,
            # Our own per-block summary (printed by LanguageModel.on_fit_start) replaces Lightning's.
            trainer_defaults={"enable_model_summary": False, "gradient_clip_val": 1.0},
            save_config_kwargs={"overwrite": True},
        )
    except DivergenceError as error:
        sys.exit(f"error: {error}")
    except TrainingInterrupted as error:
        print(f"{error}; resume with --ckpt_path last", file=sys.stderr, flush=True)
        sys.exit(128 + error.signum)
    except SIGTERMException:
        print("SIGTERM received: training stopped", file=sys.stderr, flush=True)
        sys.exit(143)
