"""What ``--ckpt_path`` names, and a checkpoint's record read against the recipe that names it: the run folders a
logger writes (:func:`run_logger`), which checkpoint ``last``/``best``/``swa`` is (:func:`recipe_checkpoint`), what
makes a checkpoint another model's (:func:`model_differences`), the training settings a resume sets aside, and the
model flags a checkpoint takes from the command line (:data:`OVERRIDABLE`, :data:`MIXER_HOW`) or leaves to it
(:data:`HOW_NOT_WHAT`). Shared by ``fit``/``validate``/``test`` (recipes/cli.py) and the tools that read a trained
run (recipes/runs.py)."""

import contextlib
import re
import sys
from pathlib import Path

from recipes.checkpoints import CheckpointError, load_checkpoint
from recipes.optimizer import recorded_form
from recipes.recipe_files import flat_settings
from recipes.training import run_checkpoints

RUN_LOGGERS = ("TensorBoardLogger", "CSVLogger")  # loggers whose folders are <save_dir>/<name>/<version>/

# Model arguments that say how to compute, not what: a resumed or evaluated run takes them from the command
# line and recipe rather than from the checkpoint.
HOW_NOT_WHAT = ("compile", "loss_positions", "sample_tokens")
# Model arguments that change no weight: a checkpoint's value holds unless the command line gives one, which is taken
# with a note (the lengths a checkpoint is validated or generated at; activation checkpointing; the MFU's peak).
OVERRIDABLE = ("max_seq_len", "extrapolate", "checkpoint_blocks", "peak_flops")
# A mixer's arguments that choose how it computes, not what (the kernel; the SSD's chunk length, which the chunked
# form's result does not depend on): overridable as the above (``--model.mixers.A.init_args.backend reference``, to
# check a GPU run's kernels against the reference), and not what makes a checkpoint another model's.
MIXER_HOW = ("backend", "chunk_size")


def explicit_model_flags(args: list[str]) -> list[str]:
    """The dotted keys under ``model.`` that the command line sets itself (``--model.d_model 64`` → ``d_model``)."""
    return [arg[len("--model."):].split("=", 1)[0] for arg in args if arg.startswith("--model.")]


def dotted_get(tree, key: str):
    """``tree["a"]["b"]`` for ``key = "a.b"``, through mappings and namespaces; ``KeyError`` when absent."""
    for part in key.split("."):
        tree = vars(tree) if hasattr(tree, "__dict__") and not isinstance(tree, dict) else tree
        if not isinstance(tree, dict) or part not in tree:
            raise KeyError(key)
        tree = tree[part]
    return tree


def plain(value):
    """A jsonargparse namespace as a dict, a tuple as a list: the forms a checkpoint records values in."""
    if hasattr(value, "as_dict"):
        return value.as_dict()
    return list(value) if isinstance(value, tuple) else value


def differs(given, recorded) -> bool:
    """Whether a configured value contradicts a recorded one; for mappings (a binding), only the keys both
    state are compared, since each side may leave defaults out."""
    given, recorded = plain(given), plain(recorded)
    if isinstance(given, str) and isinstance(recorded, str) and "×" in given + recorded:  # a pattern, either spelling
        given, recorded = given.replace("×", "x"), recorded.replace("×", "x")
    if isinstance(given, dict) and isinstance(recorded, dict):
        return any(differs(given[k], recorded[k]) for k in given.keys() & recorded.keys())
    if isinstance(given, list) and isinstance(recorded, list):
        return len(given) != len(recorded) or any(differs(g, r) for g, r in zip(given, recorded))
    return given != recorded


def mixer_name(spec) -> str | None:
    """The class name a binding names (``components.MLP`` → ``MLP``): a recipe and a checkpoint may spell the same
    class's module path differently (a package's re-export)."""
    path = spec if isinstance(spec, str) else spec.get("class_path") if isinstance(spec, dict) else None
    return path.rsplit(".", 1)[-1] if isinstance(path, str) else None


def model_differences(recipe_model, hparams: dict) -> list[str]:
    """What makes the model a checkpoint records (``hparams``) another than the recipe's: the pattern, the width, the
    size target, and for each letter both bind, the mixer's class and each argument the recipe states. An argument
    the recipe leaves None (a default), the width ``size_to`` solves and the kernel settings (:data:`MIXER_HOW`) are
    not compared; ``[]``: the same model as far as the recipe says."""
    mine = plain(recipe_model) or {}
    found = [f"{key} {plain(mine.get(key))!r} here, {hparams[key]!r} there" for key in ("pattern", "d_model")
             if key in hparams and differs(mine.get(key), hparams[key])]
    # (a crafted file may hold anything where a mapping or a list is expected: read only what has the right shape)
    solved = hparams.get("size_to") if isinstance(hparams.get("size_to"), dict) else {}
    solved_letters = solved.get("letters") if isinstance(solved.get("letters"), (list, str)) else ()
    target = (plain(mine.get("size_to")) or {}).get("params")
    if "size_to" in hparams and target != solved.get("params"):
        found.append(f"size_to.params {target!r} here, {solved.get('params')!r} there")
    recorded = hparams.get("mixers") if isinstance(hparams.get("mixers"), dict) else {}
    for letter, spec in sorted((plain(mine.get("mixers")) or {}).items()):
        theirs = recorded.get(letter)
        if not isinstance(theirs, dict):  # (a letter the recorded pattern does not use: the pattern's difference says
            continue  # so; or no spec, which the trust check refuses by name)
        if mixer_name(spec) != mixer_name(theirs):
            found.append(f"{letter} {mixer_name(spec)} here, {mixer_name(theirs)} there")
            continue
        stated = {key: value for key, value in ((spec.get("init_args") if isinstance(spec, dict) else None) or {}).items()
                  if value is not None and key not in MIXER_HOW
                  and not (letter in solved_letters and key == solved.get("arg"))}
        args = theirs.get("init_args") if isinstance(theirs.get("init_args"), dict) else {}
        found += [f"{letter}.{key} {plain(stated[key])!r} here, {args[key]!r} there"
                  for key in sorted(stated.keys() & args.keys()) if differs(stated[key], args[key])]
    return found


def recorded_model(path) -> dict:
    """The model hyper-parameters the checkpoint at ``path`` records (``{}`` when it records none or cannot be
    read: the command that uses it says why)."""
    try:
        hparams = load_checkpoint(path, mmap=True).get("hyper_parameters")
    except (CheckpointError, OSError):
        return {}
    return hparams if isinstance(hparams, dict) else {}


def recipe_checkpoint(roots: list[Path], ckpt_path: str, recipe_model) -> tuple[Path | None, str | None]:
    """``--ckpt_path last`` (``best``, ``swa``): the newest such checkpoint under the ``roots`` (``<root>/<version>/
    checkpoints/``) whose model is the recipe's (:func:`model_differences`), with a note when a newer one of another
    model was passed over: a recipe layered on another (``--config quickstart.yaml --config mine.yaml``) logs into
    the same folder, and "the newest" alone would be whichever ran last. When none is the recipe's model, the newest,
    with a note that says how it differs (a width given by flag when the run began and not repeated). ``(None,
    None)`` when there is none."""
    name = f"{ckpt_path}.ckpt"
    candidates = run_checkpoints(roots, name)
    if not candidates:
        return None, None
    newest = model_differences(recipe_model, recorded_model(candidates[0]))
    if not newest:
        return candidates[0], None
    for rank, path in enumerate(candidates[1:], 1):
        if not model_differences(recipe_model, recorded_model(path)):
            others = "a newer" if rank == 1 else f"{rank} newer"
            return path, (f"note: --ckpt_path {ckpt_path} is {path}, the newest {name} of this recipe's model: {others} "
                          f"{name} in the same folder is another model's, {candidates[0]} ({'; '.join(newest)}); "
                          "pass its path to use it")
    return candidates[0], (f"note: --ckpt_path {ckpt_path}: no {name} there is of the model this recipe states; the "
                           f"newest, {candidates[0]}, is taken, with the model it records ({'; '.join(newest)}: a "
                           "width given by flag when the run began, or another recipe's run in the same folder)")


def say_if_another_model(path, recipe_model, hparams: dict, subcommand: str = "fit") -> None:
    """A ``--ckpt_path`` from outside this recipe's runs is the checkpoint's model, whatever the recipe says: ``fit``
    resumes it (the checkpoint is a run to resume), ``validate`` and ``test`` score it on the recipe's data. When
    the two differ (:func:`model_differences`) that may not be what was meant — starting this recipe's model from
    those weights is ``--model.init_from`` — so say so, on stderr."""
    differing = model_differences(recipe_model, hparams)
    if not differing:
        return
    if subcommand == "fit":
        print(f"note: --ckpt_path {path} is another recipe's run ({'; '.join(differing)}): fit resumes that model, "
              "not this recipe's: drop --ckpt_path to train this recipe's model (--model.init_from FILE starts it from "
              "a checkpoint's weights where the shapes agree)",
              file=sys.stderr, flush=True)
    else:
        print(f"note: --ckpt_path {path} is another recipe's run ({'; '.join(differing)}): {subcommand} scores that "
              "model, on this recipe's data", file=sys.stderr, flush=True)


TRAINING_SETTINGS = ("lr", "betas", "eps", "weight_decay", "optimizer", "schedule", "warmup_fraction", "decay_fraction",
                     "final_lr_fraction", "aux_loss_coef")
"""Model arguments that steer the training, not the model's shapes: what a recipe edited during a run would change."""


def say_if_the_recipe_changed(path, recipe_model, hparams: dict, lr_found: bool = False) -> None:
    """A ``fit --ckpt_path`` of this recipe's own run goes on with the training settings the checkpoint records (the
    optimiser's, the schedule's, :data:`TRAINING_SETTINGS`): a recipe file edited since — a learning rate, a weight
    decay — does not change the run (a flag that would is refused: :meth:`HybridCLI._check_flags_agree`). Say which
    of the recipe's values are set aside, on stderr. (A width given by flag when the run began and not repeated is the
    run's, and no news: the model's shapes are not compared. ``lr_found``: a learning-rate finder's rate replaced the
    recipe's in the checkpoint.)"""
    recipe, recorded = {}, {}
    for side, source in ((recipe, plain(recipe_model)), (recorded, hparams)):
        side.update({key: plain(source[key]) for key in TRAINING_SETTINGS if key in source})
        if side.get("optimizer") is not None:
            with contextlib.suppress(ValueError):
                side["optimizer"] = recorded_form(side["optimizer"])
    mine, theirs = flat_settings(recipe), flat_settings(recorded)
    changed = [f"model.{key} {mine[key]!r} (the checkpoint's {theirs[key]!r})"
               for key in sorted(mine.keys() & theirs.keys())
               if not (key == "lr" and lr_found) and differs(mine[key], theirs[key])]
    if changed:
        print(f"note: the recipe says {'; '.join(changed)}: fit resumes {path} with the checkpoint's, as its run was "
              "trained (a recipe edited since the run began does not change it; start a new run, or --model.init_from "
              "the checkpoint, to train with the recipe's)", file=sys.stderr, flush=True)


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


def run_version(folder: str) -> int | str:
    """A run folder's logger version: ``version_3`` → 3 (so the progress bar shows ``v_num=3``, not the
    string's last characters ``on_3``), any other name as it is."""
    match = re.fullmatch(r"version_(\d+)", folder)
    return int(match.group(1)) if match else folder
