"""Letter bindings as data: ``{"class_path": ..., "init_args": {...}}`` ↔ a factory ``d_model -> nn.Module``.

A recipe binds each pattern letter to a mixer factory. A factory (a class, a ``functools.partial``, the
callable jsonargparse builds from YAML) cannot be written into a checkpoint or a YAML file, so what a
model records is its *spec*, the same ``class_path`` + ``init_args`` a recipe writes, made only of
plain values. :func:`binding_spec` turns a factory into its spec and :func:`binding_factory` a spec
back into a factory, so a checkpoint rebuilds exactly the modules it was trained with.
"""

import functools
import importlib
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

MixerFactory = Callable[[int], nn.Module]
"""Builds one mixer from ``d_model``: a class, a ``functools.partial``, or a jsonargparse binding."""

PLAIN = (str, int, float, bool, type(None))


def class_path(cls: type) -> str:
    """``cls``'s import path, the short public one when its top-level package exports it
    (``components.QCAttention`` rather than ``components.sequence.attention.QCAttention``)."""
    top = cls.__module__.split(".")[0]
    try:
        if getattr(importlib.import_module(top), cls.__qualname__, None) is cls:
            return f"{top}.{cls.__qualname__}"
    except ImportError:
        pass
    return f"{cls.__module__}.{cls.__qualname__}"


def import_class(path: str) -> type:
    """The class named by ``path`` (``package.module.Class``), with an error that names what is missing."""
    module_name, _, name = path.rpartition(".")
    if not module_name:
        raise ValueError(f"class_path {path!r} must be a dotted path such as 'components.QCAttention'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"class_path {path!r}: cannot import module {module_name!r} ({error})") from error
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise ValueError(f"class_path {path!r}: module {module_name!r} has no class {name!r}")
    return cls


def check_plain(owner: str, value: Any, where: str) -> None:
    """Recorded arguments must survive YAML and ``torch.load(weights_only=True)``: plain values only.
    ``owner`` begins the message (``binding of letter 'A'``)."""
    if isinstance(value, PLAIN):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_plain(owner, item, f"{where}[{i}]")
        return
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        for key, item in value.items():
            check_plain(owner, item, f"{where}.{key}")
        return
    raise ValueError(
        f"{owner}: argument {where}={value!r} ({type(value).__name__}) cannot be recorded in a "
        "checkpoint; pass plain values (numbers, strings, booleans, lists, dicts)"
    )


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def binding_spec(letter: str, factory: MixerFactory | Mapping) -> dict:
    """``{"class_path": str, "init_args": dict}`` of a binding.

    Accepted: a spec already (a mapping with ``class_path`` and optional ``init_args``), a class, or a
    ``functools.partial`` of a class with keyword arguments (jsonargparse's bindings are of this kind).
    Anything else (a lambda, a partial with positional arguments) is refused by name, because it
    could not be rebuilt from a checkpoint.
    """
    if isinstance(factory, Mapping):
        unknown = set(factory) - {"class_path", "init_args"}
        if "class_path" not in factory or unknown:
            raise ValueError(
                f"binding of letter {letter!r}: a spec is {{class_path: ..., init_args: {{...}}}}; got keys {sorted(factory)}"
            )
        cls, kwargs = import_class(factory["class_path"]), dict(factory.get("init_args") or {})
    elif isinstance(factory, type):
        cls, kwargs = factory, {}
    elif isinstance(factory, functools.partial) and isinstance(factory.func, type) and not factory.args:
        cls, kwargs = factory.func, dict(factory.keywords)
    elif isinstance(factory, functools.partial) and factory.args and isinstance(factory.args[-1], type):
        # jsonargparse's binding: partial(<its caller>, <its instantiator>, cls, **init_args)
        cls, kwargs = factory.args[-1], dict(factory.keywords)
    else:
        raise ValueError(
            f"binding of letter {letter!r}: {factory!r} cannot be recorded in a checkpoint; bind a class, "
            "functools.partial(Class, **keywords), or {'class_path': ..., 'init_args': {...}}"
        )
    if not issubclass(cls, nn.Module):
        raise ValueError(f"binding of letter {letter!r}: {class_path(cls)} is not an nn.Module")
    upgrade = getattr(cls, "upgrade_init_args", None)  # a class whose arguments moved reads the old form
    if upgrade is not None:
        kwargs = upgrade(kwargs)
    if "d_model" in kwargs:
        raise ValueError(f"binding of letter {letter!r}: init_args must not set d_model (the model passes it)")
    check_plain(f"binding of letter {letter!r}", kwargs, "init_args")
    return {"class_path": class_path(cls), "init_args": _plain(kwargs)}


def upgrade_specs(specs: Mapping[str, Mapping] | None) -> dict | None:
    """Recorded letter specs in today's form (each class's ``upgrade_init_args``), for a checkpoint
    written before a class's arguments moved. Imports the classes: check them first."""
    return None if specs is None else {letter: binding_spec(letter, spec) for letter, spec in specs.items()}


def binding_factory(letter: str, binding: MixerFactory | Mapping) -> MixerFactory:
    """A factory ``d_model -> nn.Module`` from a spec; a factory is returned as it is."""
    if isinstance(binding, Mapping):
        spec = binding_spec(letter, binding)
        return functools.partial(import_class(spec["class_path"]), **spec["init_args"])
    if isinstance(binding, nn.Module):  # callable, but called with d_model it would run a forward on an int
        name = type(binding).__name__
        raise TypeError(f"HybridLM: the binding of letter {letter!r} is a {name} module; bind a factory that builds "
                        f"one from d_model (the class, or functools.partial({name}, …)): every block gets its own")
    if not callable(binding):
        raise TypeError(f"HybridLM: the binding of letter {letter!r} is not callable: {binding!r}")
    if isinstance(binding, functools.partial) and binding.args and isinstance(binding.args[-1], type):
        # jsonargparse's binding, partial(<its caller>, <its instantiator>, cls, **init_args): the instantiator holds
        # the whole command line (the CLI, its data module, the trainer), which a copy of the model (an EMA twin)
        # copied with it (under DDP, failing on the launcher's lock) and a pickle carried. The class and its
        # arguments are what it calls.
        return functools.partial(binding.args[-1], **binding.keywords)
    return binding
