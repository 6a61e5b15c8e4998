"""What the tools that work on a trained run share (``generate``, ``eval``, ``hf export``): its recipe, its
checkpoint (``last``/``best``/``swa`` resolved as ``fit`` does), its run folder, and the data module it trained on."""

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from jsonargparse import dict_to_namespace

from recipes.ckpt_path import recipe_checkpoint, recorded_model, run_logger
from recipes.recipe_files import read_config, resolve_config, sweep_root
from recipes.training import NAMED_CHECKPOINTS, loggerless_checkpoint


def load_recipe(config: str | Sequence[str]) -> dict:
    """A recipe's mapping: one file (or bundled name) as it is written; several, as ``fit --config A --config B``
    merges them (by fit's own parser: a later file's settings override an earlier one's, and the result holds every
    default, as a run's ``config.yaml`` does). Before, a tool given several ``--config`` read the last alone: its
    checkpoint was looked for under another recipe's runs, or its model read without the first file's bindings."""
    paths = [config] if isinstance(config, str) else list(config)
    if len(paths) == 1:
        return read_config(resolve_config(paths[0]))
    from recipes.cli import parse_recipe

    cli = parse_recipe([arg for path in paths for arg in ("--config", path)])
    return yaml.safe_load(cli.parser.dump(cli.config))


def checkpoint_path(recipe: dict, ckpt_path: str, config: str | Sequence[str] | None = None) -> str:
    """A checkpoint file, or the newest ``last``/``best``/``swa`` of the recipe's runs (of its model, when another
    recipe's runs share the folder: :func:`recipes.ckpt_path.recipe_checkpoint`, whose note goes to stderr): under its
    logger's folder,
    and for a recipe (file ``config``) that names no logger, under Lightning's ``lightning_logs/`` and the sweep's
    folder (a sweep runs one file: several ``config`` have none); for a recipe with ``logger: false``, the one in
    ``<default_root_dir or .>/checkpoints/``, as ``fit`` finds it."""
    if config is not None and not isinstance(config, str):
        config = config[0] if len(config) == 1 else None
    if ckpt_path not in NAMED_CHECKPOINTS:
        return ckpt_path
    trainer = recipe.get("trainer") or {}
    name = f"{ckpt_path}.ckpt"
    if trainer.get("logger") is False:  # as fit resolves it: such a run writes into <default_root_dir>/checkpoints/
        folder, found = loggerless_checkpoint(trainer.get("default_root_dir"), name)
        if found is not None:
            return str(found)
        raise FileNotFoundError(f"--ckpt_path {ckpt_path}: no {name} in {folder}/ (where a run without a logger "
                                "writes them); train first")
    logger, root = run_logger(dict_to_namespace(trainer))
    roots = [root] if root is not None else []
    if config is not None and logger is None and root is not None:  # Lightning's default logger: fit's runs
        roots.append(sweep_root(Path(resolve_config(config))))
    found, note = recipe_checkpoint(roots, ckpt_path, recipe.get("model"))
    if found is None:
        where = " or ".join(f"{r}/*/checkpoints/" for r in roots) or "no run folder (the recipe logs nothing)"
        _, loose = loggerless_checkpoint(None, name)
        # (a run without a logger wrote it, of whichever recipe: named by path only, not taken as this recipe's)
        advice = (f"{loose}, of a run without a logger, is here: pass its path, --ckpt_path {loose}"
                  if loose is not None else "train first")
        raise FileNotFoundError(f"--ckpt_path {ckpt_path}: no {name} under {where}; {advice}")
    if note:
        print(note, file=sys.stderr, flush=True)
    return str(found)


def trusted_classes(recipe: dict, allow_classes=()) -> list[str]:
    """The classes a checkpoint read for this recipe may name: the recipe's own model bindings (the recipe is yours,
    as for ``fit``/``validate``) and ``allow_classes`` (``--allow_classes``)."""
    from recipes.checkpoints import class_paths

    return [*allow_classes, *class_paths(recipe.get("model") or {})]


def check_tokenizer(data, checkpoint: str | Path) -> None:
    """A ``ValueError`` when ``data`` tokenizes text otherwise than the run of ``checkpoint`` did
    (:func:`recipes.data.corpus.tokenizer_problem`): its continuations and scores would be of other tokens."""
    from recipes.checkpoints import load_checkpoint
    from recipes.data.corpus import tokenizer_problem

    problem = tokenizer_problem(data, load_checkpoint(checkpoint, mmap=True).get("tokenizer"))
    if problem:
        raise ValueError(f"{checkpoint}: {problem}")


def run_folder(checkpoint: Path) -> Path | None:
    """The run folder a recipe's checkpoint lives in (``<run>/checkpoints/x.ckpt``), or None."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else None


TRUSTED_DATA = ("recipes.data",)
"""Where a run folder's ``config.yaml`` may take its data module from without the user's say-so: the zoo's own."""


def with_run_data(recipe: dict, checkpoint: Path, allow_classes: Sequence[str] = ()) -> dict:
    """The recipe with the ``data`` section the checkpoint's run was trained with, when its run folder kept the
    resolved ``config.yaml`` (command-line overrides included: the training length is the run's, not the file's).

    A run folder may come from someone else, and its data section is built: importing a class runs its module, and
    ``subprocess.Popen`` with ``{args: ..., shell: true}`` is a class too. So every ``class_path`` in it must be the
    zoo's (``recipes.data``), one the recipe's own data section names, or under ``allow_classes``; any other is
    refused (:class:`recipes.checkpoints.CheckpointError`) before anything is imported."""
    from recipes.checkpoints import DOTTED, CheckpointError, class_paths, trusted

    folder = run_folder(checkpoint)
    config = folder / "config.yaml" if folder is not None else None
    if config is None or not config.is_file():
        return recipe
    data = (yaml.safe_load(config.read_text()) or {}).get("data")
    if not (isinstance(data, dict) and data.get("class_path")):
        return recipe
    own = class_paths(recipe.get("data"))  # (the recipe is the user's)
    named = class_paths(data) if isinstance(data["class_path"], str) else [repr(data["class_path"])]
    refused = [path for path in named if path not in own
               and not (DOTTED.fullmatch(path) and trusted(path, (*TRUSTED_DATA, *allow_classes)))]
    if refused:
        allowed = ", ".join((*TRUSTED_DATA, *own, *allow_classes))
        raise CheckpointError(f"{config}: refused before importing anything: its data section names "
                              f"{', '.join(refused)}. A run folder's data module may be one of {allowed} only. If you "
                              "trust this run folder and the code it names, allow it: --allow_classes PACKAGE (CLI) "
                              "or allow_classes=['PACKAGE'] (load_run)")
    return {**recipe, "data": data}


def data_module(recipe: dict, *, text_only: bool = False):
    """The recipe's data module, built from its ``data:`` section (the recipe is yours: its classes are trusted).
    ``text_only``: only its ``encode``/``decode`` will be used (``generate``, lm-eval tasks), so a
    ``TokenizedCorpus`` with a tokenizer file is built without its corpus, which need not be on this machine (a model
    imported from Hugging Face, before any fine-tuning data is)."""
    from recipes.data.corpus import TokenizedCorpus

    data = recipe.get("data") or {}
    module_name, _, class_name = data.get("class_path", "").rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name, None) if module_name else None
    if not isinstance(cls, type):
        raise ValueError(f"the recipe's data section names no data module class (class_path {data.get('class_path')!r})")
    init_args = dict(data.get("init_args") or {})
    if text_only and issubclass(cls, TokenizedCorpus) and init_args.get("tokenizer"):
        init_args = {k: v for k, v in init_args.items() if k not in ("paths", "dataset", "domains")}
    return cls(**init_args)


class LoadedRun(NamedTuple):
    """A trained run, as :func:`load_run` reads it."""
    lm: Any  # the LanguageModel, in eval mode on the device asked for; its HybridLM is ``lm.model``
    data: Any  # the data module it trained with: ``encode(text) -> ids``, ``decode(ids) -> text`` for text
    checkpoint: Path  # the file read
    recipe: dict  # the recipe, with the run's own data section (its config.yaml) when the run kept one


def load_run(config: str | Sequence[str], ckpt_path: str = "last", *, device: str = "cpu", allow_classes: list[str] = (),
             text_only: bool = True) -> LoadedRun:
    """A recipe's checkpoint with the tokenizer it trained with, as ``generate`` and ``eval`` read it:

        run = load_run("quickstart.yaml", "last")
        ids = run.lm.model.generate(torch.tensor([run.data.encode("def ")]), 50)  # [1, 4 + 50]
        print(run.data.decode(ids[0].tolist()))

    ``config``: the recipe (a file, or a bundled name; a list of them merged as ``fit`` merges several
    ``--config``); ``ckpt_path``: a checkpoint file, or ``last``/``best``/``swa``
    (the newest of the recipe's runs, as for ``fit``); ``device``: where the weights go (``map_location``);
    ``allow_classes``: packages the checkpoint may name beyond the zoo's and the recipe's bindings; ``text_only``:
    the data module is used only to tokenize (a ``TokenizedCorpus`` with a tokenizer file is then built without
    its corpus; ``False`` when its data will be read). The data comes from the run's ``config.yaml`` when its folder
    kept one (a ``fit --data.paths mine.jsonl`` run's BPE is the one trained on ``mine.jsonl``), and a checkpoint
    trained on text another tokenizer made is refused (``ValueError``). A missing checkpoint is a
    ``FileNotFoundError`` that says where it was looked for.
    """
    from recipes.module import LanguageModel

    recipe = load_recipe(config)
    path = Path(checkpoint_path(recipe, ckpt_path, config))
    recipe = with_run_data(recipe, path, allow_classes)
    data = data_module(recipe, text_only=text_only)
    check_tokenizer(data, path)
    overrides, note = kernels_for(device, recorded_model(path))
    if note:
        print(note, file=sys.stderr, flush=True)
    lm = LanguageModel.load_from_checkpoint(str(path), map_location=device,
                                            allow_classes=trusted_classes(recipe, allow_classes), **overrides)
    return LoadedRun(lm.eval(), data, path, recipe)


def kernels_for(device: str, hparams: dict) -> tuple[dict, str | None]:
    """``load_from_checkpoint``'s overrides for a checkpoint whose mixers were built with ``backend='triton'`` (a GPU
    run's explicit choice) read onto a device without CUDA, where the kernel cannot run: those mixers are built with
    ``auto`` (the plain-torch reference there: the same math), with a note. ``({}, None)`` otherwise."""
    mixers = hparams.get("mixers") if isinstance(hparams.get("mixers"), dict) else {}
    # (only a well-formed spec: anything else is the trust check's to refuse, in load_from_checkpoint, by name)
    pinned = sorted(letter for letter, spec in mixers.items() if isinstance(spec, dict)
                    and isinstance(spec.get("init_args"), dict) and spec["init_args"].get("backend") == "triton")
    if not pinned or str(device).startswith("cuda"):
        return {}, None
    rebuilt = {letter: {**spec, "init_args": {**spec["init_args"], "backend": "auto"}} if letter in pinned else spec
               for letter, spec in mixers.items()}
    return {"mixers": rebuilt}, (f"note: the checkpoint's {', '.join(pinned)} {'was' if len(pinned) == 1 else 'were'} "
                                 f"built with backend='triton', which needs CUDA: on {device} "
                                 f"{'it runs' if len(pinned) == 1 else 'they run'} the plain-torch reference "
                                 "(backend='auto'; the same math)")


def text_tokenizer(data, what: str):
    """``data`` when it turns text into tokens and back (``encode``/``decode``), else a ``ValueError`` saying that
    ``what`` (``generate``, ``--tasks``, …) needs text."""
    if not (hasattr(data, "encode") and hasattr(data, "decode")):
        raise ValueError(f"{what} needs text, and the recipe's data module {type(data).__name__} has no text tokenizer "
                         "(encode/decode): a synthetic task's model is scored by its suite (`python -m recipes eval "
                         "--suite mqar`), or from Python with HybridLM.generate on token ids")
    return data
