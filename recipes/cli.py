"""``python -m recipes fit|validate|test --config FILE``: LightningCLI over ``LanguageModel``.

On top of LightningCLI (docs/training.md):
- ``--config NAME.yaml`` also finds the bundled recipes (``recipes/configs/``) from any folder;
- every ``fit`` writes checkpoints by :class:`recipes.training.CheckpointPolicy`, configured under
  ``checkpoint:`` (``--checkpoint.every_n_steps 50``), atomically;
- ``--ckpt_path last`` is the newest ``last.ckpt`` of the recipe's runs, of its model where another recipe's runs share
  the folder (:func:`recipes.ckpt_path.recipe_checkpoint`; an error when there is none; without a logger, the one in
  the working folder's ``checkpoints/``),
  and ``fit`` from a run's checkpoint continues that run: same log folder, same TensorBoard curves;
- gradients are clipped at norm 1.0 unless the recipe says otherwise;
- the progress bar shows no negative epoch total when ``max_steps`` ends the run (StepProgressBar);
- a diverged or interrupted run exits with a message, not a traceback, and a non-zero status;
- a checkpoint is read as data only, and the model is rebuilt from its hyper-parameters only when every
  class they name is trusted (the zoo's ``components``, the recipe's own bindings, ``--allow_classes``),
  checked before anything is imported (recipes/checkpoints.py).
"""

import argparse
import functools
import logging
import os
import re
import sys
from pathlib import Path

import yaml

import lightning as L
from lightning.pytorch.callbacks import BatchSizeFinder, LearningRateFinder
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from recipes.argtypes import did_you_mean
from recipes.ckpt_path import (HOW_NOT_WHAT, MIXER_HOW, OVERRIDABLE, differs, dotted_get, explicit_model_flags, plain,
                               recipe_checkpoint, run_logger, run_version, say_if_another_model,
                               say_if_the_recipe_changed)
from recipes.cli_errors import (LIGHTNING_OPTIMIZER, UNION_HEADER, class_misses, mixer_misses, near_misses,
                                parse_error_message, short_epoch_message)
from recipes.checkpoints import (CheckpointError, check_hyperparameters, class_paths, consolidate_hint,
                                 is_checkpoint, is_sharded_checkpoint, load_checkpoint, not_a_checkpoint_folder)
from components.bindings import import_class, upgrade_specs
from recipes.module import LanguageModel, language_model_arguments
from recipes.optimizer import recorded_form
from recipes.recipe_files import read_config, resolve_config
from recipes.run_report import FitSummaryInWorker, choose_threads, fit_summary, lacks_loader, trains_in_workers
from recipes.training import (AtomicCheckpointIO, CheckpointPolicy, DivergenceError, RunConfigCallback, RunFolderLock,
                              TrainingInterrupted, ValidateFinalStep, averaged_weights_note, check_averaging_unsharded,
                              NAMED_CHECKPOINTS, checkpoint_folder, checkpoints_problem, default_progress_bar,
                              loggerless_checkpoint, release_process_group)

DESCRIPTION = ("Train, validate and test the zoo's models (Lightning's CLI; a recipe is a --config file, bundled ones "
               "by name). Also: `python -m recipes generate --help` (continue a prompt), `python -m recipes eval "
               "--help` (tasks, suites); docs/training.md.")
# Lightning's ``predict`` is left out: a language model's predictions are ``generate`` (a continuation) or ``eval``
SUBCOMMANDS = ("fit", "validate", "test")
COMMANDS = (*SUBCOMMANDS, "generate", "eval")  # those of ``python -m recipes`` (recipes/__main__.py)


def check_bindings(configs: list[tuple[str, dict]]) -> None:
    """Every letter a recipe binds gets a ``class_path`` in that file or an earlier one (later files may then
    change only its ``init_args``)."""
    bound: set[str] = set()
    for path, data in configs:
        mixers = (data.get("model") or {}).get("mixers") if isinstance(data.get("model"), dict) else None
        for letter, binding in (mixers or {}).items() if isinstance(mixers, dict) else ():
            if isinstance(binding, dict) and "class_path" not in binding and letter not in bound:
                raise ValueError(f"config file {path}: model.mixers.{letter} has no class_path, and no earlier config "
                                 f"binds {letter!r}; write {letter}: {{class_path: components.QCAttention, "
                                 "init_args: {...}} (the class the letter stands for)")
            if isinstance(binding, (dict, str)) and (isinstance(binding, str) or "class_path" in binding):
                bound.add(letter)
            if isinstance(binding, dict):
                check_moved_arguments(path, letter, binding)


def check_moved_arguments(path: str, letter: str, binding: dict) -> None:
    """A zoo class whose arguments moved (``upgrade_init_args``) names the form to write instead of the old one."""
    target, init_args = str(binding.get("class_path", "")), binding.get("init_args")
    if not target.startswith("components.") or not isinstance(init_args, dict):
        return
    try:
        upgrade = getattr(import_class(target), "upgrade_init_args", None)
    except ValueError:
        return  # an unknown class is named when the recipe is parsed
    if upgrade is not None and (today := upgrade(init_args)) != init_args:
        moved = sorted(set(init_args) - set(today))
        raise ValueError(f"config file {path}: model.mixers.{letter}: {', '.join(moved)} moved into the parts of "
                         f"{target.rsplit('.', 1)[-1]}; write init_args: {yaml.safe_dump(today, default_flow_style=True).strip()}")


def resolve_config_args(args: list[str]) -> list[str]:
    """Rewrite every ``--config X`` / ``--config=X`` / ``-c X`` argument through :func:`resolve_config`, and
    check the files it names (:func:`read_config`, :func:`check_bindings`)."""
    out, configs, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg in ("--config", "-c") and i + 1 < len(args):
            path = resolve_config(args[i + 1])
            configs.append((path, read_config(path)))
            out += [arg, path]
            i += 2
            continue
        if arg.startswith("--config="):
            path = resolve_config(arg.split("=", 1)[1])
            configs.append((path, read_config(path)))
            arg = "--config=" + path
        out.append(arg)
        i += 1
    check_bindings(configs)
    return out


RUN_LOCKS: list[RunFolderLock] = []  # the run folders this process's fit holds (released when its command ends)


def zoo_mixers() -> list[str]:
    """``components.X`` for every mixer class the zoo exports."""
    import components
    from torch import nn

    return [f"components.{name}" for name in sorted(components.__all__)
            if isinstance(getattr(components, name), type) and issubclass(getattr(components, name), nn.Module)
            and name not in ("Block", "HybridLM", "RMSNorm", "RotaryEmbedding", "TopKRouter", "MoE")]


def check_limit_flags(args: list[str]) -> None:
    """``--trainer.limit_val_batches 1`` reaches Lightning as the float 1.0, which means every batch, not one:
    refused, with both ways to say what was meant."""
    for i, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if name.startswith("--trainer.limit_") and name.endswith("_batches"):
            value = value if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
            if value.strip() == "1":
                raise ValueError(f"{name} 1 is read as the fraction 1.0 (every batch), not one batch; write 1.0 for "
                                 "every batch, or a count of 2 or more")


def check_run_name(logger) -> None:
    """A run's name or version is a folder under the logger's root: no ``..``, no absolute path."""
    args = getattr(logger, "init_args", None)
    for field in ("name", "version", "sub_dir"):
        value = getattr(args, field, None)
        if isinstance(value, str) and (Path(value).is_absolute() or ".." in Path(value).parts or value.startswith("~")):
            raise ValueError(f"logger {field}={value!r} would write outside the logger's save_dir: a run's {field} "
                             "must be a relative folder name without '..'")


def names_a_learning_rate_finder(trainer_config) -> bool:
    """Whether the parsed (not yet built) trainer configuration lists Lightning's LearningRateFinder callback."""
    callbacks = trainer_config.get("callbacks") or []
    callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
    return any(str(getattr(c, "class_path", "")).endswith(".LearningRateFinder") for c in callbacks)


def without_tuners(callbacks: list) -> list:
    """``callbacks`` less Lightning's tuners, for a resumed fit: they choose what a run starts with, and on a resume
    Lightning runs them before it restores the optimizer and the step, so they would train a hundred steps more to
    set a learning rate the restored schedule then overrides (while the checkpoint recorded it)."""
    tuners = [c for c in callbacks if isinstance(c, (LearningRateFinder, BatchSizeFinder))]
    if tuners:
        kept = {LearningRateFinder: "the learning rate its checkpoint records",
                BatchSizeFinder: "the batch size its configuration gives (--data.init_args.batch_size N keeps the one "
                                 "the finder chose)"}
        print(f"note: resuming: {', '.join(type(c).__name__ for c in tuners)} not run again: the run goes on with "
              f"{' and '.join(dict.fromkeys(kept[type(c)] for c in tuners))}", file=sys.stderr, flush=True)
    return [c for c in callbacks if c not in tuners]


def options_given(line: list[str]):
    """``(name, value)`` for each option of a command line, in order: ``--name=value``, or ``--name value`` (the next
    argument; None for an option last on the line)."""
    for i, arg in enumerate(line):
        name, equals, value = arg.partition("=")
        yield name, value if equals else (line[i + 1] if i + 1 < len(line) else None)


def recipe_model(path: str) -> dict:
    """The ``model:`` mapping of a ``--config`` file ({} where it has none, or the path is not a file)."""
    model = read_config(path).get("model") if Path(path).is_file() else None
    return model if isinstance(model, dict) else {}


def dropped_bindings(command_line: list[str], mixers, pattern) -> str | None:
    """A note when a letter of ``pattern`` was bound by a recipe file or flag on ``command_line`` and a later mapping
    given whole (another ``--config``'s ``model.mixers``, a ``--model.mixers '{…}'``) replaced ``model.mixers``
    without it, so that ``mixers`` (the parsed result) leaves it to the zoo's default with default arguments.
    jsonargparse replaces a mapping given whole: ``--model.mixers '{T: …}'`` beside quickstart.yaml dropped its
    ``A: {n_heads: 4}`` and built 8 heads, without a word. ``None`` when nothing the pattern uses was lost."""
    from components.model import DEFAULT_MIXERS
    from components.pattern import PatternError, parse_tokens

    try:
        used = {letter for token in parse_tokens(pattern) for letter in (token.seq, token.state) if letter}
    except (PatternError, TypeError):  # (the model's own check names a bad pattern)
        return None
    lost, bound = {}, {}  # letter -> (where it was bound, what replaced the mapping); letter -> where bound
    for name, value in options_given(command_line):
        if name in ("--config", "-c") and value is not None:
            whole, where = recipe_model(value).get("mixers"), Path(value).name
        elif name == "--model.mixers":
            whole, where = yaml.safe_load(value) if value else None, "--model.mixers"
        elif name.startswith("--model.mixers.") and len(name.split(".")) >= 3:
            bound[name.split(".")[2]] = name
            continue
        else:
            continue
        if not isinstance(whole, dict):
            continue
        for letter, source in bound.items():
            if letter not in whole:
                lost[letter] = (source, where)
        bound = dict.fromkeys(whole, where)
    # (a letter bound again after, alone or in a later mapping, is in the parsed result)
    lost = {letter: how for letter, how in lost.items() if letter in used and letter not in (mixers or {})}
    if not lost:
        return None
    said = "; ".join(f"{letter}, bound by {source}, dropped by {where}: "
                     + (f"now the default {DEFAULT_MIXERS[letter].__name__} with default arguments"
                        if letter in DEFAULT_MIXERS else "now unbound")
                     for letter, (source, where) in sorted(lost.items()))
    return (f"note: model.mixers given whole replaces the mapping before it, and the pattern's letters lost their "
            f"bindings: {said}. To add or change one letter and keep the others, give it alone "
            "(--model.mixers.T '{class_path: components.TokenShift}'), or repeat in the later mapping the letters "
            "to keep")


def mixers_help() -> str:
    return (", a mapping letter → {class_path, init_args}; the zoo's components: " + ", ".join(zoo_mixers())
            + " (any nn.Module class taking d_model works). One letter alone keeps the recipe's others: "
            "--model.mixers.T '{class_path: components.TokenShift}'; a mapping given whole replaces them")


class HybridCLI(LightningCLI):
    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {name: keys for name, keys in LightningCLI.subcommands().items() if name in SUBCOMMANDS}

    def add_arguments_to_parser(self, parser) -> None:
        # The vocabulary is the data's business; the model takes it from the instantiated data module.
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        parser.add_class_arguments(CheckpointPolicy, "checkpoint")
        mixers = next((a for a in parser._actions if a.dest == "model.mixers"), None)
        if mixers is not None:  # the zoo's components, not every nn.Module subclass jsonargparse can find (440 lines)
            mixers.extra_help = mixers_help  # a function of the module, not a lambda: ddp_spawn pickles the parser
        parser.add_argument(
            "--threads", type=int | None, default=None,
            help="torch threads (default: the cores no other process is busy with, from the load average; "
                 "OMP_NUM_THREADS is respected)")
        parser.add_argument(
            "--allow_classes", type=list[str], default=[],
            help="packages, modules or class paths (beyond the zoo's components and the recipe's own bindings) "
                 "whose classes a --ckpt_path checkpoint may name; checked before anything is imported")

    def parse_arguments(self, parser, args) -> None:
        self._command_line = list(sys.argv[1:] if args is None else args)
        check_limit_flags(self._command_line)
        try:
            super().parse_arguments(parser, args)
        except argparse.ArgumentError as error:  # condensed here, where the options a typo may have meant are known
            first = self._command_line[0] if self._command_line else None
            subcommand = first if first in SUBCOMMANDS else None
            parsers = getattr(self, "_subcommand_parsers", {})  # (none with run=False)
            options = [o for a in (parsers.get(subcommand) or parser)._actions for o in a.option_strings]
            message = parse_error_message(error)
            hint = near_misses(message, options) or mixer_misses(message, error) or class_misses(message)
            raise argparse.ArgumentError(None, message + hint) from error
        subcommand = self.config.get("subcommand")
        self._resolve_init_from(self.config[subcommand] if subcommand is not None else self.config)
        if subcommand is not None:
            config = self.config[subcommand]
            check_run_name(run_logger(config.trainer)[0])
            defaults = {"every_n_steps": 100, "keep_best": True, "monitor": "val/loss", "mode": None}  # CheckpointPolicy's
            changed = {k: config.checkpoint[k] for k, v in defaults.items() if config.checkpoint.get(k, v) != v}
            if config.trainer.get("enable_checkpointing") is False and changed:
                raise ValueError(f"checkpoint options {changed} have no effect with trainer.enable_checkpointing false; "
                                 "drop one of the two")
            seed = config.get("seed_everything")
            if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed < 2**32:
                raise ValueError(f"--seed_everything {seed}: a seed lies in [0, 2**32 - 1] (numpy's range); "
                                 "true draws one at random, false sets none")
            if config.get("weights_only") is False:
                raise ValueError("--weights_only false is refused: the zoo's checkpoints hold tensors and plain values "
                                 "only, and reading pickled objects would run the code a file carries")
            self._resolve_checkpoint(subcommand, config)

    def _resolve_init_from(self, config) -> None:
        """A relative ``model.init_from`` written in a recipe file is relative to that file (so the recipe works from
        any folder); one given on the command line is relative to the working folder. Whichever of the two comes last
        on the command line gave the value, as in jsonargparse."""
        if not config.model.get("init_from"):
            return
        source = None  # (recipe file, its init_from), or None: the flag gave the value
        for name, value in options_given(self._command_line):
            if name == "--model.init_from":
                source = None
            elif name in ("--config", "-c") and value is not None and "init_from" in (model := recipe_model(value)):
                source = (value, model["init_from"])
        if source is not None and source[1] == config.model.init_from and not Path(source[1]).is_absolute():
            config.model.init_from = str(Path(source[0]).parent / source[1])

    def _parse_ckpt_path(self) -> None:
        """Rebuild the model from the checkpoint's hyper-parameters, as Lightning does, but read the file as data
        only and refuse, before importing anything, a class that is not trusted; refuse a command-line model
        flag that the checkpoint contradicts (it would be dropped silently)."""
        subcommand = self.config.get("subcommand")
        if not subcommand or not self.config[subcommand].get("ckpt_path"):
            return
        config = self.config[subcommand]
        path = config.ckpt_path
        checkpoint = load_checkpoint(path, mmap=True)
        if subcommand == "fit" and "consolidated_from" in checkpoint:
            raise CheckpointError(f"{path} was consolidated from the sharded checkpoint {checkpoint['consolidated_from']} "
                                  "and holds no optimizer state: resume the sharded run from that folder, or start a "
                                  f"new run from these weights with --model.init_from {path}")
        if "pytorch-lightning_version" not in checkpoint:
            raise CheckpointError(f"{path} holds weights only (as python -m recipes.hf writes), not a training run: "
                                  f"start a run from it with --model.init_from {path}, without --ckpt_path")
        hparams = {k: v for k, v in (checkpoint.get("hyper_parameters") or {}).items()
                   if k != "_instantiator" and k not in HOW_NOT_WHAT}
        if not hparams:
            return
        unknown = sorted(set(hparams) - language_model_arguments())
        if unknown:
            raise CheckpointError(f"{path}: hyper-parameters {unknown} are not LanguageModel's: not a checkpoint of this zoo")
        recipe_classes = class_paths(plain(config.model))
        check_hyperparameters(hparams, path, [*config.allow_classes, *recipe_classes])
        if hparams.get("mixers"):  # after the check: reading a spec's class imports it
            hparams["mixers"] = upgrade_specs(hparams["mixers"])
        finder = subcommand == "fit" and names_a_learning_rate_finder(config.trainer)
        self._check_flags_agree(path, config.model, hparams, lr_found=finder)
        if not getattr(self, "_ckpt_in_run", True):
            say_if_another_model(path, config.model, hparams, subcommand)
        elif subcommand == "fit":
            say_if_the_recipe_changed(path, config.model, hparams, lr_found=finder)
        self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)

    def _check_flags_agree(self, path, model_config, hparams: dict, lr_found: bool = False) -> None:
        """Each ``--model.`` flag against the checkpoint's ``hparams``: one of :data:`OVERRIDABLE` that differs is
        taken into ``hparams`` with a note; any other that differs is refused. ``lr_found``: the command names a
        LearningRateFinder, whose rate the checkpoint records in place of the command's ``--model.lr``."""
        conflicts = []
        for key in explicit_model_flags(self._command_line):
            if key.split(".")[0] in HOW_NOT_WHAT:
                continue
            try:
                recorded = dotted_get(hparams, key)
                given = dotted_get(model_config, key)
            except KeyError:
                continue
            if key == "optimizer" and given is not None:  # `--model.optimizer SGD` names what the checkpoint records
                given = recorded_form(plain(given))
            if not differs(given, recorded):
                continue
            if key == "lr" and lr_found:
                print(f"note: --model.lr {plain(given)!r} is the rate the learning-rate finder replaced: the run goes "
                      f"on at the checkpoint's {recorded!r}, the finder's", file=sys.stderr, flush=True)
                continue
            if key in OVERRIDABLE or (key.startswith("mixers.") and key.rsplit(".", 1)[-1] in MIXER_HOW):
                print(f"note: --model.{key} {plain(given)!r} over the checkpoint's {recorded!r} (it changes no weight)",
                      file=sys.stderr, flush=True)
                *parents, last = key.split(".")
                functools.reduce(dict.__getitem__, parents, hparams)[last] = plain(given)
            else:
                conflicts.append(f"--model.{key} {plain(given)!r} (the checkpoint has {plain(recorded)!r})")
        if conflicts:
            raise ValueError(f"--ckpt_path {path}: {'; '.join(conflicts)}. A checkpoint's model is the one it was "
                             "trained as; drop the flag to use it, or start a new run (without --ckpt_path) to change it")

    def _resolve_checkpoint(self, subcommand: str, config) -> None:
        """``--ckpt_path last`` (``best``, ``swa``) → the newest ``last.ckpt`` (``best.ckpt``, ``swa.ckpt``) of this
        recipe's runs; a ``fit`` from a run's checkpoint logs into that run's folder (TensorBoard drops the killed
        run's events after it)."""
        ckpt_path = config.get("ckpt_path")
        if not ckpt_path:
            return
        logger, root = run_logger(config.trainer)
        if ckpt_path in NAMED_CHECKPOINTS:
            name = f"{ckpt_path}.ckpt"
            note = None
            if root is not None:
                (found, note), where = recipe_checkpoint([root], ckpt_path, config.model), f"under {root}/*/checkpoints/"
            elif config.trainer.get("logger") is False:  # such a run writes into <default_root_dir>/checkpoints/
                folder, found = loggerless_checkpoint(config.trainer.get("default_root_dir"), name)
                where = f"in {folder}/ (where a run without a logger writes them)"
            else:
                found, where = None, "(this trainer writes no run folders)"
            if found is None:
                sys.exit(f"error: --ckpt_path {ckpt_path}: no {ckpt_path}.ckpt {where}; train first, or pass the "
                         "path of a checkpoint file")
            config.ckpt_path = ckpt_path = str(found)
            print(f"resuming from {found}" if subcommand == "fit" else f"checkpoint: {found}", flush=True)
            if note:
                print(note, file=sys.stderr, flush=True)
        path = Path(ckpt_path)
        if is_sharded_checkpoint(path) and subcommand != "fit":
            sys.exit(f"error: --ckpt_path {ckpt_path}: {consolidate_hint(path)}")
        if path.is_dir() and not is_sharded_checkpoint(path):
            sys.exit(f"error: --ckpt_path {not_a_checkpoint_folder(ckpt_path)}")
        if not is_checkpoint(path):
            sys.exit(f"error: --ckpt_path {ckpt_path}: no such checkpoint file")
        in_run = (root is not None and path.parent.name == "checkpoints"
                  and path.parent.parent.parent.resolve() == root.resolve())
        self._ckpt_in_run = in_run
        if subcommand != "fit" and logger is not None and in_run and logger.class_path.endswith("TensorBoardLogger"):
            # validate/test log into the run they evaluate (its <subcommand>/ folder), not a new version_N
            logger.init_args.version = run_version(path.parent.parent.name)
            logger.dict_kwargs = {**(getattr(logger, "dict_kwargs", None) or {}), "sub_dir": subcommand}
        if subcommand == "fit" and logger is not None and in_run:
            logger.init_args.version = run_version(path.parent.parent.name)
            if logger.class_path.endswith("TensorBoardLogger"):
                checkpoint = load_checkpoint(path, mmap=True)
                # from the first step the checkpoint has not seen logged: its own step's metrics when it was
                # written before Lightning logged them (it carries them, and the resumed run writes them)
                step = (checkpoint.get("pending_log") or {}).get("step", checkpoint.get("global_step", 0))
                logger.dict_kwargs = {**(getattr(logger, "dict_kwargs", None) or {}), "purge_step": step}

    def before_instantiate_classes(self) -> None:
        config = self.config[self.config.subcommand] if self.config.get("subcommand") else self.config
        message = choose_threads(config.get("threads"))
        if message:
            print(message, flush=True)
        if not config.get("ckpt_path"):  # (a checkpoint's model is its own: its mixers are the recorded ones)
            dropped = dropped_bindings(self._command_line, config.model.get("mixers"), config.model.get("pattern"))
            if dropped:
                print(dropped, file=sys.stderr, flush=True)

    def instantiate_classes(self) -> None:
        super().instantiate_classes()
        data = self.datamodule
        if data is not None and getattr(data, "vocab_size", None) is None:
            # jsonargparse skips a link whose source lacks the attribute, without a word: the model was built at
            # its default vocabulary, and a recipe cannot set model.vocab_size itself (a link's target)
            raise ValueError(f"the data module {type(data).__name__} has no vocab_size: the model's vocabulary is "
                             "taken from it (data.vocab_size is linked to model.vocab_size, which a recipe cannot set), "
                             f"so give {type(data).__name__} a vocab_size attribute or property, the number of token ids "
                             "it yields (docs/data.md)")

    def before_fit(self) -> None:
        """Refuse a folder that holds another run's checkpoints (before the logger writes there); then the resolved
        configuration as text in TensorBoard, beside the curves it produced."""
        if not self.trainer.fast_dev_run:  # (without checkpointing, it would still replace the run's config.yaml)
            problem = checkpoints_problem(checkpoint_folder(self.trainer), self.config["fit"].get("ckpt_path"),
                                          logged=bool(self.trainer.loggers))
            if problem:
                raise ValueError(problem)
            remote = "://" in str(self.trainer.log_dir or self.trainer.default_root_dir)  # (no flock on s3://)
            if self.trainer.is_global_zero and not remote:  # (the other ranks write into the folder rank zero holds)
                RUN_LOCKS.append(RunFolderLock(checkpoint_folder(self.trainer)).hold())
        config = self._parser("fit").dump(self.config["fit"], skip_none=False, skip_link_targets=False)
        for logger in self.trainer.loggers:
            if hasattr(logger.experiment, "add_text"):
                logger.experiment.add_text("config", "```yaml\n" + config + "\n```", self.trainer.global_step)

    def before_validate(self) -> None:
        data = self.datamodule
        if lacks_loader(data, "val_dataloader"):
            # (Lightning's own words: "`val_dataloader` must be implemented to be used with the Lightning Trainer")
            raise ValueError(f"{type(data).__name__} has no val_dataloader, the split validate scores: give it one "
                             "(docs/data.md: a data module of your own)")
        self._say_if_untrained("validate")
        self._say_if_averaged("validate")

    def before_test(self) -> None:
        data = self.datamodule
        if lacks_loader(data, "test_dataloader"):
            # (Lightning's own words: "`test_dataloader` must be implemented to be used with the Lightning Trainer")
            raise ValueError(f"{type(data).__name__} has no test split (its documents are split into training and "
                             "validation alone): python -m recipes validate scores the held-out validation text, and "
                             "python -m recipes eval --suite length --text FILE a file of your own")
        self._say_if_untrained("test")
        self._say_if_averaged("test")

    def _say_if_averaged(self, subcommand: str) -> None:
        """A checkpoint of a run with a weight-averaging callback scores its average: said, since beside another
        run's trained weights it is not like for like."""
        path = self.config[subcommand].get("ckpt_path")
        if path and Path(path).is_file() and self.trainer.is_global_zero:
            note = averaged_weights_note(load_checkpoint(path, mmap=True), path)
            if note:
                print(note, file=sys.stderr, flush=True)

    def _say_if_untrained(self, subcommand: str) -> None:
        """Without ``--ckpt_path`` (or ``model.init_from``) validate and test score the recipe's fresh model — the
        loss of an untrained one, a useful baseline only when meant: a forgotten flag printed it as if trained."""
        config = self.config[subcommand]
        if not config.get("ckpt_path") and not config.model.get("init_from") and self.trainer.is_global_zero:
            print(f"note: no --ckpt_path: {subcommand} scores the recipe's freshly initialised, untrained model; "
                  "--ckpt_path last, best or a file scores a trained one", file=sys.stderr, flush=True)

    def after_fit(self) -> None:
        if trains_in_workers(self.trainer):  # this process holds none of the run: its worker said it
            return
        log_dir = self.trainer.log_dir  # (collective under DDP: every process asks)
        if self.trainer.is_global_zero:
            print(fit_summary(self.trainer, self.model, log_dir), flush=True)

    def instantiate_trainer(self, **kwargs) -> L.Trainer:
        config = self.config_init[self.subcommand] if self.subcommand else self.config_init
        if config["trainer"].get("barebones"):  # (else Lightning refuses the recipe's settings one error at a time)
            raise ValueError("--trainer.barebones true turns off what a recipe's run is made of: the logging every step "
                             "does (its loss, tokens/s, MFU), the callbacks and the checkpoints. A run reports its speed "
                             "itself (the summary at the end, TensorBoard); python -m recipes.benchmarks.models times a "
                             "training step against its Hugging Face twin (docs/performance.md)")
        callbacks = config["trainer"].get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
        if self.subcommand == "fit" and config.get("ckpt_path"):
            callbacks = without_tuners(callbacks)
        callbacks.append(ValidateFinalStep())  # (Lightning runs it before the checkpoint policy, which asks what follows)
        callbacks.append(FitSummaryInWorker())
        if config["trainer"].get("enable_checkpointing") is not False:  # (in validate too: it restores its state)
            callbacks.append(config["checkpoint"])
        progress_bar = default_progress_bar(callbacks, config["trainer"].get("enable_progress_bar"))
        if progress_bar is not None:
            callbacks.append(progress_bar)
        trainer = super().instantiate_trainer(callbacks=callbacks, **kwargs)
        check_averaging_unsharded(trainer.callbacks, trainer.strategy)  # before any process starts
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        return trainer


class ParseOnlyCLI(HybridCLI):
    """The command line parsed as ``fit`` parses it, and nothing more: no seed set, no threads chosen, nothing built
    (what ``recipes.sweep`` checks its ``--set`` overrides with before it launches runs)."""

    def _set_seed(self) -> None:
        pass

    def before_instantiate_classes(self) -> None:
        pass

    def instantiate_classes(self) -> None:
        pass


class DropAdvert(logging.Filter):
    """Drops Lightning's advertisement for its cloud logger (``litlogger``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


def quiet_lightning() -> None:
    """Lightning's advertisement for its cloud logger and a deprecation inside Lightning itself, printed on every
    run, say nothing about the run; nor its warning that a weight-averaging callback does not shard a model that
    overrides ``configure_model`` (the recipes' does so only to shard, and refuse averaging there)."""
    import warnings

    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropAdvert) for f in logger.filters):  # (one, however many commands a process runs)
            logger.addFilter(DropAdvert())
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    warnings.filterwarnings("ignore", message=r"You're using the WeightAveraging callback with a model that overrides")


def main(args: list[str] | None = None, *, run: bool = True, parse_only: bool = False) -> HybridCLI:
    """Run the CLI on ``args`` (default: the command line). With ``run=False`` the arguments hold no
    subcommand and the CLI only parses and instantiates (model, data, trainer); with ``parse_only`` too, it only
    parses (:class:`ParseOnlyCLI`). A wrong argument exits with its one-line error."""
    try:
        if args is None:
            sys.argv[1:] = resolve_config_args(sys.argv[1:])
        else:
            args = resolve_config_args(args)
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
    given = sys.argv[1:2] if args is None else args[:1]
    lightning_optimizer = [a for a in (sys.argv[1:] if args is None else args)
                           if a.split("=", 1)[0].split(".", 1)[0] in ("--optimizer", "--lr_scheduler")]
    if lightning_optimizer:
        # Lightning's would replace the zoo's configure_optimizers: no decay-free group, no warm-up-cosine schedule
        sys.exit(f"error: {lightning_optimizer[0].split('=', 1)[0]} {LIGHTNING_OPTIMIZER}")
    if run and given == ["predict"]:
        sys.exit("error: predict is not a subcommand here (Lightning's needs a forward that yields predictions): "
                 "`python -m recipes generate` continues a prompt, `python -m recipes eval` scores tasks and "
                 "per-position losses")
    if run and not (given and (given[0] in SUBCOMMANDS or given[0].startswith("-"))):
        # Lightning's own message named fit, validate and test only, and sent a misspelt command to its --help
        what = f"{given[0]!r} is not a command" if given else "name a command"
        hint = did_you_mean(given, COMMANDS, cutoff=0.5)
        sys.exit(f"error: {what}: python -m recipes {{{','.join(COMMANDS)}}} …" + (f" ({hint})" if hint else "")
                 + "; python -m recipes fit --help lists the options")
    quiet_lightning()
    try:
        return (ParseOnlyCLI if parse_only else HybridCLI)(
            LanguageModel,
            L.LightningDataModule,
            subclass_mode_data=True,
            auto_configure_optimizers=False,  # the optimiser is the model's (--model.optimizer)
            args=args,
            run=run,
            # Our own per-block summary (printed by LanguageModel.on_fit_start) replaces Lightning's.
            trainer_defaults={"enable_model_summary": False, "gradient_clip_val": 1.0},
            save_config_callback=RunConfigCallback,
            save_config_kwargs={"overwrite": True},  # a run's own earlier file only: RunConfigCallback refuses others
            # a wrong option raises (and is printed below in a few lines) instead of printing the whole usage
            parser_kwargs={"exit_on_error": False, "allow_abbrev": False, "prog": "python -m recipes",
                           "description": DESCRIPTION,
                           **{c: {"exit_on_error": False} for c in SUBCOMMANDS}},
        )
    except argparse.ArgumentError as error:
        if os.environ.get("HYBRID_ZOO_DEBUG"):
            raise
        command = [a for a in (args if args is not None else sys.argv[1:])[:1] if a in SUBCOMMANDS] or ["fit"]
        lightning_key = re.search(r"option '(optimizer|lr_scheduler)\b", str(error))  # the key in a config file
        if lightning_key:
            sys.exit(f"error: {parse_error_message(error)}: a config's `{lightning_key[1]}:` {LIGHTNING_OPTIMIZER}")
        sys.exit(f"error: {parse_error_message(error)} (python -m recipes {command[0]} --help lists the options)")
    except DivergenceError as error:
        sys.exit(f"error: {error}")
    except (ValueError, FileNotFoundError) as error:  # a named configuration or input error: its message, no trace
        if os.environ.get("HYBRID_ZOO_DEBUG"):
            raise
        message = parse_error_message(error) if UNION_HEADER in str(error) else short_epoch_message(error) or error
        sys.exit(f"error: {message}")
    except MisconfigurationException as error:  # Lightning's own refusal (a GPU asked for on a machine without one)
        if os.environ.get("HYBRID_ZOO_DEBUG"):
            raise
        hint = (": --trainer.accelerator gpu needs a CUDA (or Apple MPS) device, and torch sees none here; drop the "
                "flag, or --trainer.accelerator cpu" if "gpu backend" in str(error) else "")
        sys.exit(f"error: {error}{hint}")
    except TrainingInterrupted as error:
        print(f"{error}; resume with --ckpt_path last", file=sys.stderr, flush=True)
        sys.exit(128 + error.signum)
    except SIGTERMException:
        print("SIGTERM received: training stopped", file=sys.stderr, flush=True)
        sys.exit(143)
    except KeyboardInterrupt:  # before training (parsing, building, tokenizing) or after it: training has its own stop
        if os.environ.get("HYBRID_ZOO_DEBUG"):
            raise
        print("interrupted (Ctrl+C) outside training: no checkpoint was due", file=sys.stderr, flush=True)
        sys.exit(130)
    finally:
        while RUN_LOCKS:  # (however the command ended: the next fit in this process may write the same folder)
            RUN_LOCKS.pop().release()
        release_process_group()


def parse_recipe(args: list[str]) -> HybridCLI:
    """``args`` (``--config FILE``, repeatable, and overrides) parsed as ``fit`` parses them; nothing built. For the
    tools that read a recipe without training it (``recipes.sweep``, ``generate``'s several ``--config``)."""
    import warnings

    with warnings.catch_warnings():  # Lightning's note that sys.argv (the calling tool's own) is not what it parses
        warnings.filterwarnings("ignore", message=".*args parameter is intended to run from within Python")
        return main(args, run=False, parse_only=True)
