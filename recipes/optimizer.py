"""The optimiser a run trains with: AdamW by default, or any ``torch.optim.Optimizer`` a recipe names.

Whatever the class, the run keeps the zoo's two parameter groups (matrices decayed by ``weight_decay``; vectors —
norm scales, biases, SSD's ``A_log`` and ``D`` — not decayed) and its warm-up-then-cosine schedule from ``lr``. So a
recipe names only the class and its other arguments::

    model:
      optimizer: {class_path: torch.optim.SGD, init_args: {momentum: 0.9, nesterov: true}}
      lr: 0.05

(``--model.optimizer SGD`` on the command line: a name in ``torch.optim``, or a dotted path to your own class.)
The learning rate and the weight decay are ``lr`` and ``weight_decay``, never the optimiser's ``init_args``, because
the schedule and the groups are built from them; ``betas`` and ``eps`` are the default AdamW's, and another class
takes its own (in ``init_args``, else its defaults). The spec is recorded in the checkpoint as plain values.
"""

import inspect
from collections.abc import Iterable, Mapping

import torch

from components.bindings import check_plain, class_path, import_class
from recipes.argtypes import did_you_mean

ADAMW_BETAS, ADAMW_EPS = (0.9, 0.98), 1e-6
"""The default AdamW's ``betas`` and ``eps`` (``--model.betas``, ``--model.eps``)."""

OWNED = {"lr": "--model.lr", "weight_decay": "--model.weight_decay", "params": "the model's parameters"}
"""Arguments the zoo passes itself, with where a user sets them."""


def optimizer_class(name: str) -> type:
    """A class of ``torch.optim`` by its name (``SGD``), or any class by its dotted path."""
    if "." not in name:
        cls = getattr(torch.optim, name, None)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            known = [n for n in dir(torch.optim) if isinstance(getattr(torch.optim, n), type)
                     and issubclass(getattr(torch.optim, n), torch.optim.Optimizer) and n != "Optimizer"]
            same = [n for n in known if n.lower() == name.lower()]
            hint = f"did you mean {same[0]}?" if same else did_you_mean([name], known)
            raise ValueError(f"optimizer={name!r} is not an optimiser of torch.optim ({', '.join(sorted(known))})"
                             + (f"; {hint}" if hint else "") + "; or give a dotted path to your own class")
        return cls
    cls = import_class(name)
    if not issubclass(cls, torch.optim.Optimizer):
        raise ValueError(f"optimizer={name!r} is not a torch.optim.Optimizer")
    return cls


def optimizer_spec(optimizer: str | Mapping | None, *, weight_decay: float, betas_or_eps_set: bool) -> dict | None:
    """``optimizer`` (None, a class name or path, or ``{class_path, init_args}``) as the plain spec a checkpoint
    records, checked now rather than when the optimiser is built after the model and data; None is AdamW."""
    if optimizer is None:
        return None
    if isinstance(optimizer, str):
        optimizer = {"class_path": optimizer}
    if not isinstance(optimizer, Mapping) or "class_path" not in optimizer or set(optimizer) - {"class_path", "init_args"}:
        raise ValueError(f"optimizer={optimizer!r} must be a class name (SGD), a dotted path, or "
                         "{class_path: ..., init_args: {...}}")
    cls = optimizer_class(optimizer["class_path"])
    init_args = dict(optimizer.get("init_args") or {})
    name = cls.__name__
    if cls is getattr(torch.optim, "Muon", None):
        raise ValueError("optimizer Muon takes 2-D weight matrices only and is meant for the blocks' matrices, beside "
                         "another optimiser for the embeddings, the head and the vectors (norm scales, SSD's A_log); "
                         "the zoo trains every parameter with one optimiser, so it does not offer Muon")
    owned = sorted(set(init_args) & set(OWNED))
    if owned:
        raise ValueError(f"optimizer {name}: init_args.{owned[0]} is set by the zoo from {OWNED[owned[0]]} (the "
                         "learning-rate schedule and the decayed parameter group are built from it); set it there")
    accepted = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    for key in init_args:
        if key not in accepted and not takes_any:
            hint = did_you_mean([key], [k for k in accepted if k not in ("self", *OWNED)])
            raise ValueError(f"optimizer {name} takes no argument {key!r}" + (f" ({hint})" if hint else ""))
    if weight_decay > 0 and "weight_decay" not in accepted and not takes_any:
        raise ValueError(f"optimizer {name} takes no weight_decay, and --model.weight_decay is {weight_decay}: "
                         "set --model.weight_decay 0")
    if betas_or_eps_set:
        raise ValueError(f"optimizer {name}: --model.betas and --model.eps are the default AdamW's; give {name}'s own "
                         "in its init_args")
    check_plain(f"optimizer {name}", init_args, "init_args")
    short = f"torch.optim.{name}" if getattr(torch.optim, name, None) is cls else class_path(cls)
    return {"class_path": short, "init_args": init_args}


def build_optimizer(spec: Mapping | None, groups: Iterable[dict], *, lr: float, betas, eps: float):
    """The optimiser over ``groups`` (each with its ``params`` and ``weight_decay``): AdamW with ``betas`` and
    ``eps`` for ``spec`` None, else the spec's class with its ``init_args``."""
    if spec is None:
        return torch.optim.AdamW(list(groups), lr=lr, betas=tuple(betas), eps=eps)
    return optimizer_class(spec["class_path"])(list(groups), lr=lr, **spec["init_args"])


def describe(spec: Mapping | None) -> str:
    """``SGD(momentum=0.9)``: the optimiser in one line, for TensorBoard's hyper-parameters."""
    if spec is None:
        return "AdamW"
    args = ", ".join(f"{k}={v!r}" for k, v in spec["init_args"].items())
    return f"{spec['class_path'].rsplit('.', 1)[-1]}({args})"
