"""Reading a checkpoint as data: no pickle, and no import of a class the file names unless it is trusted.

A checkpoint is read with ``torch.load(weights_only=True)`` — tensors and plain values, never pickled
objects — whatever torch's default is (an environment variable flips it). Its hyper-parameters, from
which the model is rebuilt, name classes (each mixer binding's ``class_path``); rebuilding imports them,
and importing a module runs its top-level code. So before anything is parsed or imported, every class
path the hyper-parameters name must be *trusted*: in the zoo's own ``components`` package, or in the
allow-list the user passes (``--allow_classes mypkg`` on the command line, ``allow_classes=["mypkg"]``
in Python; an entry is a package, a module or a full class path). A string that could be read as an
import path or a file path anywhere else in the hyper-parameters is refused too, because jsonargparse
turns such strings into classes or reads the file they name. docs/training.md ("Loading checkpoints").
"""

import os
import pickle
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from recipes.outputs import refuse_overwrite

TRUSTED_PACKAGES = ("components", "torch.optim")
"""Packages whose classes a checkpoint may name without the user's say-so: the zoo's mixers, and torch's optimisers
(a run's ``optimizer``; importing torch.optim runs nothing that torch itself has not)."""

ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since torch 1.6 is a zip archive
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


class CheckpointError(ValueError):
    """A file that is not a checkpoint the zoo can read, or one that names something it must not load."""


SHARDED_META = "meta.pt"  # what Lightning's ModelParallelStrategy writes beside the shards: everything but the tensors


def is_sharded_checkpoint(path: str | Path) -> bool:
    """A folder of shards written by a sharded run (FSDP2, ``save_distributed_checkpoint``): ``meta.pt``, ``.metadata``
    and one ``.distcp`` per process."""
    path = Path(path)
    return path.is_dir() and (path / SHARDED_META).is_file() and (path / ".metadata").is_file()


def is_checkpoint(path: str | Path) -> bool:
    """A checkpoint file, or a sharded checkpoint's folder: what ``--ckpt_path`` may name."""
    return Path(path).is_file() or is_sharded_checkpoint(path)


# What a sharded checkpoint's ``.metadata`` may name. torch's distributed checkpoint reads that file with plain
# pickle (on resume and on consolidation), so it is checked first, by a pickle reader that builds nothing.
SHARD_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": None,  # every class of the module: the plan's records
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},  # and the dtypes, below
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


def check_shard_metadata(folder: Path) -> None:
    """Refuse, naming the file, a sharded checkpoint whose ``.metadata`` names anything beyond
    :data:`SHARD_METADATA_CLASSES`: it is read here by an unpickler that resolves nothing else, before torch
    reads it with plain pickle (which would import and call whatever it names)."""

    class Restricted(pickle.Unpickler):
        def find_class(self, module: str, name: str):
            allowed = SHARD_METADATA_CLASSES.get(module, set())
            dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
            if not (allowed is None or name in allowed or dtype):
                raise CheckpointError(f"{path} names {module}.{name}, which a sharded checkpoint's index never "
                                      "contains: refused before torch reads it with pickle (which would run it)")
            return super().find_class(module, name)

    path = Path(folder) / ".metadata"
    with open(path, "rb") as f:
        try:
            Restricted(f).load()
        except CheckpointError:
            raise
        except Exception as error:  # noqa: BLE001 - any unreadable index is refused alike, by name
            raise CheckpointError(f"{path} is not a readable checkpoint index ({type(error).__name__}: {error})") from None


def not_a_checkpoint_folder(path: str | Path) -> str:
    return (f"{path} is a folder, not a checkpoint file, nor a sharded checkpoint (a folder holding {SHARDED_META} and "
            ".metadata beside its shards)")


def consolidate_hint(path: str | Path) -> str:
    return (f"{path} is a sharded checkpoint (a folder of shards): resume its run from it with the same strategy "
            f"(--ckpt_path), or make one file of it first: python -m recipes.consolidate {path} (it writes "
            f"{Path(path).name}.consolidated beside it) and use that file")


def load_weights(path: str | Path, *, map_location: Any = "cpu") -> dict[str, Any]:
    """The ``state_dict`` of the checkpoint at ``path``; a sharded checkpoint is refused with the way to convert it."""
    checkpoint = load_checkpoint(path, map_location=map_location)
    if "state_dict" not in checkpoint:
        raise CheckpointError(consolidate_hint(path) if is_sharded_checkpoint(path) else f"{path} holds no state_dict")
    return checkpoint["state_dict"]


def load_checkpoint(path: str | Path, *, map_location: Any = "cpu", mmap: bool = False,
                    bare_weights: bool = False) -> dict:
    """The checkpoint at ``path`` as a dict, read with ``weights_only=True``. For a sharded checkpoint (a folder,
    :func:`is_sharded_checkpoint`) it is the run's state without the tensors — hyper-parameters, step, loops,
    callbacks (its ``meta.pt``); :func:`load_weights` refuses one by name. With ``bare_weights`` a file holding
    only a mapping of names to tensors is taken as it is (Lightning's ``ddp_spawn`` hands the trained weights
    back to the main process so); otherwise a file without a ``state_dict`` is refused.

    Raises ``FileNotFoundError`` for a missing file and :class:`CheckpointError`, naming the file, for an
    empty, truncated, corrupted or foreign one, for a folder that is not a sharded checkpoint, or for one that holds
    pickled objects (which a checkpoint never needs; such a file is refused, never loaded "unsafely").
    """
    path = Path(path)
    sharded = is_sharded_checkpoint(path)
    if sharded:
        check_shard_metadata(path)  # every reader of the folder (resume, consolidate) comes through here first
        path = path / SHARDED_META
    elif path.is_dir():
        raise CheckpointError(not_a_checkpoint_folder(path))
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"{path} is empty (0 bytes): not a checkpoint (was its write interrupted?)")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != ZIP_MAGIC:
        raise CheckpointError(f"{path} is not a checkpoint: a checkpoint is a zip archive written by torch.save, and "
                              f"this file ({size} bytes) starts with {magic!r}")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        found = re.search(r"unsupported GLOBAL (\S+)", str(error)) or re.search(r"Unsupported (?:global|operand)[^.\n]*",
                                                                                str(error))
        what = f" (it names {found.group(1) if found.lastindex else found.group(0)})" if found else ""
        raise CheckpointError(
            f"{path} holds pickled Python objects{what}, which a checkpoint of the zoo never contains: it is refused. "
            "Loading it without weights_only would run whatever code it carries; only tensors and plain values are read"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError) as error:
        reason = str(error).splitlines()[0][:160] if str(error) else type(error).__name__
        raise CheckpointError(f"{path} is not a readable checkpoint ({size} bytes; truncated or corrupted?): {reason}") \
            from None
    tensors_alone = isinstance(checkpoint, Mapping) and all(isinstance(v, torch.Tensor) for v in checkpoint.values())
    if bare_weights and tensors_alone:
        return dict(checkpoint)
    if not isinstance(checkpoint, Mapping) or ("state_dict" not in checkpoint and not sharded):
        keys = sorted(checkpoint)[:6] if isinstance(checkpoint, Mapping) else type(checkpoint).__name__
        raise CheckpointError(f"{path} is not a model checkpoint: it has no 'state_dict' (found {keys})")
    return dict(checkpoint)


def trusted(path: str, allow: Iterable[str] = ()) -> bool:
    """Whether class path ``path`` lies in a trusted package or under an entry of ``allow``."""
    return any(path == prefix or path.startswith(prefix + ".") for prefix in (*TRUSTED_PACKAGES, *allow))


def untrusted_references(tree: Any, allow: Iterable[str] = (), where: str = "") -> list[str]:
    """Every ``where=value`` in ``tree`` that would import something untrusted or read a file: a
    ``class_path`` outside the trusted packages and ``allow``, and any other string — a value, or a mapping
    key (InnerFuncAttention's parts are named by keys: ``inner: {yourpkg.Value: {...}}``) — that reads as a
    dotted import path or a file path (``a.b``, ``x/y``)."""
    allow = tuple(allow)
    found = []
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            at = f"{where}.{key}" if where else str(key)
            if key in ("class_path", "_class_path") and not (isinstance(value, str) and DOTTED.fullmatch(value)
                                                               and trusted(value, allow)):
                found.append(f"{at}={value!r}")
            elif key not in ("class_path", "_class_path"):
                found += untrusted_references(key, allow, f"{at} (a key)") if isinstance(key, str) else []
                found += untrusted_references(value, allow, at)
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            found += untrusted_references(value, allow, f"{where}[{i}]")
    elif isinstance(tree, str) and not NUMBER.fullmatch(tree.strip()):
        if (DOTTED.fullmatch(tree) and not trusted(tree, allow)) or any(c in tree for c in "/\\") or tree.startswith("~"):
            found.append(f"{where}={tree!r}")
    return found


def check_hyperparameters(hparams: Mapping, source: str | Path, allow: Iterable[str] = ()) -> None:
    """Refuse, before anything is imported, hyper-parameters that name an untrusted class or a path.

    Every mixer binding must be a ``{class_path, init_args}`` mapping (never a bare string, which
    jsonargparse would import or read as a file)."""
    allow = tuple(allow)
    mixers = hparams.get("mixers")
    problems = []
    if mixers is not None:
        if not isinstance(mixers, Mapping):
            problems.append(f"mixers={type(mixers).__name__}")
        else:
            problems += [f"mixers.{letter}={type(spec).__name__} (not a {{class_path, init_args}} mapping)"
                         for letter, spec in mixers.items() if not isinstance(spec, Mapping)]
    problems += untrusted_references(hparams, allow)
    if problems:
        allowed = ", ".join((*TRUSTED_PACKAGES, *allow))
        raise CheckpointError(
            f"{source}: refused before importing anything: its hyper-parameters name {'; '.join(problems[:4])}"
            f"{' …' if len(problems) > 4 else ''}. A checkpoint may name classes from {allowed} only. If you trust "
            "this file and the code it names, allow it: --allow_classes PACKAGE (CLI) or "
            "allow_classes=['PACKAGE'] (LanguageModel.load_from_checkpoint)"
        )


def class_paths(tree: Any) -> list[str]:
    """Every ``class_path`` value in a (recipe) configuration tree."""
    if isinstance(tree, Mapping):
        own = [tree["class_path"]] if isinstance(tree.get("class_path"), str) else []
        return own + [p for value in tree.values() for p in class_paths(value)]
    if isinstance(tree, (list, tuple)):
        return [p for value in tree for p in class_paths(value)]
    return []


def consolidate(folder: str | Path, out: str | Path | None = None, *, overwrite: bool = False) -> Path:
    """A sharded checkpoint's weights and run record (hyper-parameters, step) as one file, ``<folder>.consolidated``
    by default: what ``load_from_checkpoint``, ``--model.init_from``, ``generate``, ``eval`` and ``recipes.hf export``
    read. The optimizer's state stays in the folder (its shards are keyed by parameter name, not in the layout a
    single process resumes from): resume the sharded run from the folder itself.

    An ``out`` already there is replaced only when it was consolidated from this same folder (the run trained on
    since) or with ``overwrite``: it may be another run's checkpoint."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folder = Path(folder)
    if not is_sharded_checkpoint(folder):
        raise CheckpointError(f"{folder} is not a sharded checkpoint (a folder with {SHARDED_META}, .metadata and "
                              "the .distcp shards a ModelParallelStrategy run writes)")
    out = Path(out) if out is not None else folder.with_name(folder.name + ".consolidated")
    if out.is_dir():
        raise IsADirectoryError(f"--out {out} is a folder: name the file to write")
    if out.exists() and not overwrite and consolidated_from(out) != folder.resolve():
        refuse_overwrite([out], lost="it is not a consolidation of this folder")
    meta = load_checkpoint(folder)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        dcp_to_torch_save(folder, tmp)  # every tensor of the shards, assembled (no process group needed)
        tensors = torch.load(tmp, map_location="cpu", weights_only=True)
        torch.save({**meta, "state_dict": tensors["state_dict"], "consolidated_from": str(folder.resolve())}, tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def consolidated_from(path: Path) -> Path | None:
    """The sharded folder a file was consolidated from (:func:`consolidate`), or None for any other file."""
    try:
        folder = load_checkpoint(path, mmap=True).get("consolidated_from")
    except (CheckpointError, OSError):
        return None
    return Path(folder).resolve() if isinstance(folder, str) else None

