"""The optimiser a run trains with: AdamW by default, or any ``torch.optim.Optimizer`` a recipe names.

Whatever the class, the run keeps the zoo's two parameter groups (matrices decayed by ``weight_decay``; vectors —
norm scales, biases, SSD's ``A_log`` and ``D`` — not decayed) and its learning-rate schedule from ``lr`` (warm-up,
then cosine or warm-up-stable-decay). So a recipe names only the class and its other arguments::

    model:
      optimizer: {class_path: torch.optim.SGD, init_args: {momentum: 0.9, nesterov: true}}
      lr: 0.05

(``--model.optimizer SGD`` on the command line: a name in ``torch.optim``, or a dotted path to your own class.)
The learning rate and the weight decay are ``lr`` and ``weight_decay``, never the optimiser's ``init_args``, because
the schedule and the groups are built from them; ``betas`` and ``eps`` are AdamW's (the default, or named), and
another class takes its own (in ``init_args``, else its defaults). The spec is recorded in the checkpoint as plain
values.

``torch.optim.Muon`` orthogonalises the update of a weight matrix, and is meant for the hidden layers' matrices only:
it takes the weight of every ``nn.Linear`` inside the blocks, and AdamW (``betas``, ``eps``) the rest — embeddings,
head, vectors, and the tensors that are banks or tables rather than one matrix (a MoE's ``[E, d, f]`` experts,
CDMoE's one-neuron experts and keys, the SSD's convolution) — as one optimiser, :class:`MuonWithAdamW`, on one
schedule. Its ``adjust_lr_fn`` defaults to ``match_rms_adamw`` (Moonlight's scaling), so one ``lr`` and one
``weight_decay`` fit both. A weight that fuses several projections along its rows (a gated MLP's ``[W | V]``,
attention's keys and values, the SSD's ``[X | B | C | Δ | z]``: each module's ``fused_row_blocks()``) is updated as
those projections, each orthogonalised and scaled as the matrix it is, not as one matrix that couples them.
"""

import inspect
import math
from collections.abc import Iterable, Mapping, MutableMapping

import torch

from components.bindings import check_plain, class_path, import_class
from recipes.argtypes import did_you_mean

ADAMW_BETAS, ADAMW_EPS = (0.9, 0.98), 1e-6
"""The default AdamW's ``betas`` and ``eps`` (``--model.betas``, ``--model.eps``)."""

MUON = "torch.optim.Muon"
"""Muon's recorded class path: trained as :class:`MuonWithAdamW`."""

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


def recorded_form(optimizer: str | Mapping) -> dict:
    """``optimizer`` as a checkpoint records it, ``{class_path, init_args}`` with torch's classes at their short path
    (``SGD`` → ``torch.optim.SGD``), so a command line that names it again compares equal."""
    if isinstance(optimizer, str):
        optimizer = {"class_path": optimizer}
    keys = set(optimizer) if isinstance(optimizer, Mapping) else set()
    if "class_path" not in keys or keys - {"class_path", "init_args"}:
        raise ValueError(f"optimizer={optimizer!r} must be a class name (SGD), a dotted path, or "
                         "{class_path: ..., init_args: {...}}")
    cls = optimizer_class(optimizer["class_path"])
    short = f"torch.optim.{cls.__name__}" if getattr(torch.optim, cls.__name__, None) is cls else class_path(cls)
    return {"class_path": short, "init_args": dict(optimizer.get("init_args") or {})}


def optimizer_spec(optimizer: str | Mapping | None, *, weight_decay: float, betas_or_eps_set: bool) -> dict | None:
    """``optimizer`` (None, a class name or path, or ``{class_path, init_args}``) as the plain spec a checkpoint
    records, checked now rather than when the optimiser is built after the model and data; None is AdamW."""
    if optimizer is None:
        return None
    spec = recorded_form(optimizer)
    cls, init_args = optimizer_class(spec["class_path"]), spec["init_args"]
    name = cls.__name__
    muon = is_muon(cls)
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
    adamw = cls is torch.optim.AdamW
    if betas_or_eps_set and not (muon or adamw):  # (Muon's AdamW half, and AdamW named, take them)
        raise ValueError(f"optimizer {name}: --model.betas and --model.eps are the default AdamW's; give {name}'s own "
                         "in its init_args")
    if betas_or_eps_set and adamw and {"betas", "eps"} & set(init_args):
        raise ValueError("optimizer AdamW: betas and eps given twice, by --model.betas/--model.eps and in init_args; "
                         "give them once")
    check_plain(f"optimizer {name}", init_args, "init_args")
    return spec


def is_muon(cls: type) -> bool:
    return cls is getattr(torch.optim, "Muon", object())


def decay_groups(parameters: list[torch.nn.Parameter], weight_decay: float) -> list[dict]:
    """The zoo's two groups: matrices (2-D and up) decayed by ``weight_decay``, vectors not."""
    return [{"params": [p for p in parameters if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0}]


def fused_row_blocks(module: torch.nn.Module) -> list[tuple[torch.nn.Parameter, tuple[int, ...]]]:
    """``(weight, row counts)`` for each weight under ``module`` that fuses several projections along its rows, as
    the modules that own them declare (``fused_row_blocks() -> {weight name: row counts}``)."""
    found = []
    for owner in module.modules():
        declared = getattr(owner, "fused_row_blocks", None)
        for name, rows in (declared() if callable(declared) else {}).items():
            weight = owner.get_parameter(name)
            if weight.dim() != 2 or min(rows, default=0) < 1 or sum(rows) != weight.shape[0]:
                raise ValueError(f"{type(owner).__name__}.fused_row_blocks(): {name} {tuple(weight.shape)} does not "
                                 f"split along its rows into {tuple(rows)} (positive counts that sum to its rows)")
            found.append((weight, tuple(rows)))
    return found


def newton_schulz(matrix: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float) -> torch.Tensor:
    """``matrix [m, n]`` → a matrix of its shape with its singular vectors and singular values near 1: Muon's quintic
    Newton–Schulz iteration (Keller Jordan's), in bfloat16, on the wide orientation, as ``torch.optim.Muon`` runs
    it."""
    a, b, c = coefficients
    x = matrix.to(torch.bfloat16, copy=True)  # (a copy: a bf16 momentum buffer is not divided in place)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T  # [n, m]
    x.div_(x.norm().clamp(min=eps))  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def muon_lr(lr: float, adjust_lr_fn: str | None, rows: int, columns: int) -> float:
    """Muon's rate for a ``[rows, columns]`` matrix: ``original`` (None) scales by √max(1, rows/columns),
    ``match_rms_adamw`` by 0.2·√max(rows, columns) (Moonlight's, so the update has AdamW's RMS)."""
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, columns))
    return lr * math.sqrt(max(1.0, rows / columns))


@torch.no_grad()
def muon_step(muon: torch.optim.Optimizer, row_blocks: Mapping[int, tuple[int, ...]]) -> None:
    """One step of ``torch.optim.Muon``'s update over ``muon``'s groups and state, with each weight whose ``id`` is in
    ``row_blocks`` taken as the projections it fuses: momentum (and weight decay) over the whole weight, then each
    projection's rows orthogonalised and scaled as a matrix of their own. A weight not listed is one matrix, which
    makes this torch's step exactly (tests/recipes/test_optimizer.py)."""
    for group in muon.param_groups:
        lr, momentum = group["lr"], group["momentum"]
        for weight in group["params"]:
            if weight.grad is None:
                continue
            state = muon.state[weight]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(weight.grad, memory_format=torch.preserve_format)
            buffer = state["momentum_buffer"]
            buffer.lerp_(weight.grad, 1 - momentum)
            update = weight.grad.lerp(buffer, momentum) if group["nesterov"] else buffer
            weight.mul_(1 - lr * group["weight_decay"])
            start, columns = 0, weight.shape[1]
            for rows in row_blocks.get(id(weight), (weight.shape[0],)):
                block = slice(start, start + rows)
                orthogonal = newton_schulz(update[block], group["ns_coefficients"], group["ns_steps"], group["eps"])
                weight[block].add_(orthogonal, alpha=-muon_lr(lr, group["adjust_lr_fn"], rows, columns))
                start += rows


def build_optimizer(spec: Mapping | None, parameters: Iterable[torch.nn.Parameter],
                    hidden_matrices: Iterable[torch.nn.Parameter], *, lr: float, weight_decay: float, betas,
                    eps: float, row_blocks: Iterable[tuple[torch.nn.Parameter, tuple[int, ...]]] = ()
                    ) -> torch.optim.Optimizer:
    """The optimiser over the trainable ``parameters`` in :func:`decay_groups`: AdamW with ``betas`` and ``eps`` for
    ``spec`` None, else the spec's class with its ``init_args``; for Muon, :class:`MuonWithAdamW` with Muon on
    ``hidden_matrices`` (the blocks' linear weights), the fused ones (``row_blocks``, :func:`fused_row_blocks`)
    as their projections."""
    trainable = [p for p in parameters if p.requires_grad]
    if spec is None:
        return torch.optim.AdamW(decay_groups(trainable, weight_decay), lr=lr, betas=tuple(betas), eps=eps)
    cls = optimizer_class(spec["class_path"])
    if cls is torch.optim.AdamW:  # named, it is the default one: the zoo's betas and eps unless init_args give them
        return cls(decay_groups(trainable, weight_decay), lr=lr, **{"betas": tuple(betas), "eps": eps,
                                                                    **spec["init_args"]})
    if not is_muon(cls):
        return cls(decay_groups(trainable, weight_decay), lr=lr, **spec["init_args"])
    hidden = {id(p) for p in hidden_matrices}
    muon = [p for p in trainable if id(p) in hidden]
    return MuonWithAdamW([{"params": muon, "weight_decay": weight_decay}],
                         decay_groups([p for p in trainable if id(p) not in hidden], weight_decay),
                         lr=lr, betas=tuple(betas), eps=eps, muon_args=spec["init_args"], row_blocks=row_blocks)


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon on ``muon_groups`` and AdamW on ``adamw_groups``, as one optimiser: Lightning steps it, clips its
    gradients and checkpoints it, and one learning-rate schedule drives both (its ``param_groups`` are the two
    optimisers' own group dicts, Muon's first). ``state_dict()`` is ``{"muon": ..., "adamw": ...}``, each in torch's
    format.

    Args:
        muon_groups, adamw_groups: parameter groups (``params``, ``weight_decay``); Muon's hold 2-D tensors only.
        lr: the learning rate of both. betas, eps: AdamW's.
        muon_args: Muon's other arguments (``momentum``, ``nesterov``, ``ns_steps``…; ``adjust_lr_fn`` defaults to
            ``match_rms_adamw``, under which Muon's update has AdamW's scale).
        row_blocks: ``(weight, row counts)`` of Muon's weights that fuse several projections along their rows
            (:func:`fused_row_blocks`): each projection is orthogonalised and scaled as its own matrix
            (:func:`muon_step`; torch's ``Muon`` holds the groups and the state, in its format).
    """

    def __init__(self, muon_groups: list[dict], adamw_groups: list[dict], *, lr: float, betas=ADAMW_BETAS,
                 eps: float = ADAMW_EPS, muon_args: Mapping | None = None,
                 row_blocks: Iterable[tuple[torch.nn.Parameter, tuple[int, ...]]] = ()):
        muon_args = {"adjust_lr_fn": "match_rms_adamw", **(muon_args or {})}
        self.muon = torch.optim.Muon(muon_groups, lr=lr, **muon_args)
        self.row_blocks = {id(weight): tuple(rows) for weight, rows in row_blocks}
        self.adamw = torch.optim.AdamW(adamw_groups, lr=lr, betas=betas, eps=eps)
        super().__init__(self.muon.param_groups + self.adamw.param_groups, {})  # the same group dicts
        self._link()

    def _link(self) -> None:
        """Point ``param_groups`` and ``state`` at the two optimisers' (again after they load a state)."""
        self.param_groups = self.muon.param_groups + self.adamw.param_groups
        self.state = JoinedState(self.muon.state, self.adamw.state)

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        muon_step(self.muon, self.row_blocks)
        self.adamw.step()
        return loss

    def state_dict(self) -> dict:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state_dict: Mapping) -> None:
        if set(state_dict) != {"muon", "adamw"}:
            raise ValueError("MuonWithAdamW: the optimiser state is not Muon-with-AdamW's (keys "
                             f"{sorted(state_dict)}): the checkpoint was trained with another optimiser")
        self.muon.load_state_dict(state_dict["muon"])
        self.adamw.load_state_dict(state_dict["adamw"])
        self._link()


class JoinedState(MutableMapping):
    """Two optimisers' per-parameter states read as one (``optimizer.state``, which Lightning walks to move it to the
    device); a write goes to the state that holds the parameter."""

    def __init__(self, *states: MutableMapping):
        self.states = states

    def _owner(self, key) -> MutableMapping:
        for state in self.states:
            if key in state:
                return state
        raise KeyError(key)

    def __getitem__(self, key):
        return self._owner(key)[key]

    def __setitem__(self, key, value) -> None:
        self._owner(key)[key] = value

    def __delitem__(self, key) -> None:
        del self._owner(key)[key]

    def __iter__(self):
        return (key for state in self.states for key in state)

    def __len__(self) -> int:
        return sum(len(state) for state in self.states)


def describe(spec: Mapping | None) -> str:
    """``SGD(momentum=0.9)``: the optimiser in one line, for TensorBoard's hyper-parameters."""
    if spec is None:
        return "AdamW"
    name = "Muon with AdamW" if spec["class_path"] == MUON else spec["class_path"].rsplit(".", 1)[-1]
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in spec['init_args'].items())})"
