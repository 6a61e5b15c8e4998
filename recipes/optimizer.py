"""The optimiser a run trains with: AdamW by default, or any ``torch.optim.Optimizer`` a recipe names.

Whatever the class, the run keeps the zoo's two parameter groups (matrices decayed by ``weight_decay``; vectors —
norm scales, biases, SSD's ``A_log`` and ``D`` — not decayed) and its learning-rate schedule from ``lr`` (warm-up,
then cosine or warm-up-stable-decay). So a recipe names only the class and its other arguments::

    model:
      optimizer: {class_path: torch.optim.SGD, init_args: {momentum: 0.9, nesterov: true}}
      lr: 0.05

(``--model.optimizer SGD`` on the command line: a name in ``torch.optim``, or a dotted path to your own class.)
The learning rate and the weight decay are ``lr`` and ``weight_decay``, never the optimiser's ``init_args``, because
the schedule and the groups are built from them; ``betas`` and ``eps`` are the default AdamW's, and another class
takes its own (in ``init_args``, else its defaults). The spec is recorded in the checkpoint as plain values.

``torch.optim.Muon`` orthogonalises the update of a weight matrix, and is meant for the hidden layers' matrices only:
it takes the weight of every ``nn.Linear`` inside the blocks, and AdamW (``betas``, ``eps``) the rest — embeddings,
head, vectors, and the tensors that are banks or tables rather than one matrix (a MoE's ``[E, d, f]`` experts,
CDMoE's one-neuron experts and keys, the SSD's convolution) — as one optimiser, :class:`MuonWithAdamW`, on one
schedule. Its ``adjust_lr_fn`` defaults to ``match_rms_adamw`` (Moonlight's scaling), so one ``lr`` and one
``weight_decay`` fit both.
"""

import inspect
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
    if betas_or_eps_set and not muon:  # (Muon's AdamW half takes them)
        raise ValueError(f"optimizer {name}: --model.betas and --model.eps are the default AdamW's; give {name}'s own "
                         "in its init_args")
    check_plain(f"optimizer {name}", init_args, "init_args")
    return spec


def is_muon(cls: type) -> bool:
    return cls is getattr(torch.optim, "Muon", object())


def decay_groups(parameters: list[torch.nn.Parameter], weight_decay: float) -> list[dict]:
    """The zoo's two groups: matrices (2-D and up) decayed by ``weight_decay``, vectors not."""
    return [{"params": [p for p in parameters if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0}]


def build_optimizer(spec: Mapping | None, parameters: Iterable[torch.nn.Parameter],
                    hidden_matrices: Iterable[torch.nn.Parameter], *, lr: float, weight_decay: float, betas,
                    eps: float) -> torch.optim.Optimizer:
    """The optimiser over the trainable ``parameters`` in :func:`decay_groups`: AdamW with ``betas`` and ``eps`` for
    ``spec`` None, else the spec's class with its ``init_args``; for Muon, :class:`MuonWithAdamW` with Muon on
    ``hidden_matrices`` (the blocks' linear weights)."""
    trainable = [p for p in parameters if p.requires_grad]
    if spec is None:
        return torch.optim.AdamW(decay_groups(trainable, weight_decay), lr=lr, betas=tuple(betas), eps=eps)
    cls = optimizer_class(spec["class_path"])
    if not is_muon(cls):
        return cls(decay_groups(trainable, weight_decay), lr=lr, **spec["init_args"])
    hidden = {id(p) for p in hidden_matrices}
    muon = [p for p in trainable if id(p) in hidden]
    return MuonWithAdamW([{"params": muon, "weight_decay": weight_decay}],
                         decay_groups([p for p in trainable if id(p) not in hidden], weight_decay),
                         lr=lr, betas=tuple(betas), eps=eps, muon_args=spec["init_args"])


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
    """

    def __init__(self, muon_groups: list[dict], adamw_groups: list[dict], *, lr: float, betas=ADAMW_BETAS,
                 eps: float = ADAMW_EPS, muon_args: Mapping | None = None):
        muon_args = {"adjust_lr_fn": "match_rms_adamw", **(muon_args or {})}
        self.muon = torch.optim.Muon(muon_groups, lr=lr, **muon_args)
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
        self.muon.step()
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
