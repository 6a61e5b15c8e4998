"""Routed mixtures of experts, composed from a router, a bank of experts, and optionally a shared
expert (SEI) or a shared cross-domain transform whose output the experts read (OTCE).

    y = Σ_{i ∈ topk(x)} g_i(x) · expert_i(x, s(x))  +  shared_expert(x)        s = cross-domain state

Every variant is the one :class:`MoE` engine with different parts; the named classes only build
the parts. Dropless: every token reaches its ``top_k`` experts, with no capacity limit. Tokens are
grouped by expert with one sort, and every expert matmul is one grouped matmul over all experts:
no Python loop, no host sync.
"""

from collections.abc import Mapping

import torch
from torch import nn

from components.bindings import binding_factory
from components.state.experts import GATE_FORMS, CohesiveExperts, ExpansiveExperts, MLPExperts, SharedGate
from components.state.mlp import ACTIVATIONS, GATES, MLP, default_d_ff
from components._checks import check_choice, check_flags, check_mixer_input
from components.state.router import (ForwardRecords, Routing, SigmoidRouter, TopKRouter, router_z_loss,
                                     sequence_balancing_loss, sequence_loads, switch_balancing_loss, valid_tokens)

BALANCE_SCOPES = ("batch", "sequence")  # what the balancing loss evens out: the batch's load, or each sequence's


def dispatch(experts: nn.Module, x: torch.Tensor, shared: torch.Tensor | None, routing: Routing) -> torch.Tensor:
    """``Σ_k gates[m,k] · expert_{ids[m,k]}(x_m, shared_m)`` for ``x [M, d]`` → ``[M, d]``.

    The ``M·k`` assignments are sorted by expert once; where each expert's run ends is found on the
    device (a search in the sorted ids), so nothing waits for the host."""
    M, k = routing.experts.shape
    ids, order = torch.sort(routing.experts.reshape(-1), stable=True)  # [M·k] expert ids, grouped
    token = order // k  # [M·k] the token of each sorted assignment
    ends = torch.searchsorted(ids, torch.arange(experts.n_experts, device=ids.device), right=True)  # [E]
    y = experts(x[token], shared[token] if shared is not None else None, ends.to(torch.int32))  # [M·k, d]
    y = y * routing.gates.reshape(-1)[order].unsqueeze(-1)
    return torch.zeros_like(x).index_add_(0, token, y.to(x.dtype))


class MoE(ForwardRecords, nn.Module):
    """The routed-MoE engine, ``[B, T, d_model] → [B, T, d_model]``.

    After each forward, ``aux_loss`` holds the balancing loss (summed into the training loss by the recipe, times its
    ``aux_loss_coef``; docs/architecture.md): Switch's over the batch, or DeepSeek-V3's within each sequence;
    ``router_z_loss`` ST-MoE's router z-loss (the recipe's ``router_z_loss`` coefficient weighs it; None for a router
    whose :class:`Routing` has no logits), ``expert_load [E]`` the fraction of assignments each expert took and
    ``sequence_load [B, E]`` the same within each sequence (a flat ``[M, d]`` input is one sequence; in training mode,
    None in eval).
    ``forward(x, padding_mask=None)``: with ``padding_mask [B, T]`` (True at padding; the block passes
    the model's), padded tokens are zeroed and count in neither the load nor the two losses.

    Args:
        router: a :class:`TopKRouter`, or a :class:`SigmoidRouter` (which, in training, is handed each forward's
            load to balance itself by).
        experts: a bank (:mod:`components.state.experts`): ``n_experts``, ``params_per_expert()``, and
            ``experts(xs, shareds)`` mapping per-expert lists of routed tokens to outputs.
        shared_expert: a module added on every token (SEI), or None.
        cross_domain: a module computing, once per token, the shared state the experts read, or None.
        balance: what ``aux_loss`` evens out: ``batch`` (default; Switch Transformer's loss over every token of the
            batch) | ``sequence`` (DeepSeek-V3's sequence-wise loss: the same within each sequence, averaged; an
            input ``[B, T, d]`` is ``B`` sequences, any other shape one).
    """

    mixer_slot = "state"  # the block slot it fills; a pattern placing it in the other is refused

    def __init__(self, router: TopKRouter | SigmoidRouter, experts: nn.Module, *, shared_expert: nn.Module | None = None,
                 cross_domain: nn.Module | None = None, balance: str = "batch"):
        super().__init__()
        check_choice(type(self).__name__, "balance", balance, BALANCE_SCOPES)
        missing = [name for name in ("n_experts", "params_per_expert") if not hasattr(experts, name)]
        if missing:  # an MLP or a Linear passed as the bank would fail at the first forward, inside dispatch
            raise ValueError(f"MoE: experts={type(experts).__name__} is not an expert bank (it lacks "
                             f"{', '.join(missing)}); give one of components.state.experts, such as MLPExperts")
        missing = [name for name in ("n_experts", "top_k", "centroids") if not hasattr(router, name)]
        if missing:  # an MLP passed as the router would fail at the first forward
            raise ValueError(f"MoE: router={type(router).__name__} is not a router (it lacks {', '.join(missing)}); "
                             "give a TopKRouter, or a class with those and forward(x) -> Routing")
        for name, part in (("shared_expert", shared_expert), ("cross_domain", cross_domain)):
            if getattr(part, "mixer_slot", None) == "sequence":  # it sees tokens one by one, never a sequence
                raise ValueError(f"MoE: {name}={type(part).__name__} is a sequence mixer; the parts of a MoE work "
                                 "token by token (an MLP, say)")
        if router.n_experts != experts.n_experts:
            raise ValueError(f"MoE: the router has {router.n_experts} experts, the bank {experts.n_experts}")
        self.router, self.experts = router, experts
        self.shared_expert, self.cross_domain, self.balance = shared_expert, cross_domain, balance
        self.aux_loss: torch.Tensor | None = None
        self.router_z_loss: torch.Tensor | None = None
        self.expert_load: torch.Tensor | None = None
        self.sequence_load: torch.Tensor | None = None

    reads_padding_mask = True  # the block passes the model's, so padding counts in no expert's load

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        owner = type(self).__name__
        check_mixer_input(owner, x, self.router.centroids.in_features, self.router.centroids.weight, sequence=False)
        valid = valid_tokens(padding_mask, x.shape, owner)  # [M] or None
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # [M, d], M = B·T
        if valid is not None:
            flat = flat.masked_fill(valid[:, None] == 0, 0.0)
        shared = self.cross_domain(flat) if self.cross_domain is not None else None
        routing = self.router(flat)
        y = dispatch(self.experts, flat, shared, routing)
        if self.shared_expert is not None:
            y = y + self.shared_expert(flat)
        self.expert_load = routing.load(self.router.n_experts, valid)
        sequences = shape[0] if x.dim() == 3 else 1
        # (in training, where it is logged: a decoding step, one token a sequence, does not pay for it)
        self.sequence_load = (sequence_loads(routing.experts.detach(), self.router.n_experts, sequences, valid)
                              if self.training else None)
        if self.balance == "sequence":
            self.aux_loss = sequence_balancing_loss(routing.probs, routing.experts, sequences, valid, self.sequence_load)
        else:
            self.aux_loss = switch_balancing_loss(routing.probs, self.expert_load, valid)
        self.router_z_loss = None if routing.logits is None else router_z_loss(routing.logits, valid)
        if self.training and hasattr(self.router, "observe"):  # a router that balances itself (SigmoidRouter)
            self.router.observe(self.expert_load)
        return y.view(shape)

    def extra_flops_per_token(self, seq_len: int) -> int:
        """The ``top_k`` experts a token is routed to, each weight used once per row (:mod:`components.flops`);
        the router and shared parts are linear layers, counted as such."""
        return self.router.top_k * 2 * self.experts.params_per_expert()

    def active_parameters(self) -> int:
        """Router, shared parts, and ``top_k`` experts: what one token uses."""
        always = [m for m in (self.router, self.shared_expert, self.cross_domain) if m is not None]
        always = sum(p.numel() for m in always for p in m.parameters())
        return always + self.router.top_k * self.experts.params_per_expert()


def _check_options(owner: str, *, act: str, normalize: bool, **gates: str) -> None:
    """A named MoE's options, checked under its own name: a bad one would otherwise be reported by a part the user
    never named (``MLPExperts``, ``SharedGate``, ``TopKRouter``)."""
    check_choice(owner, "act", act, ACTIVATIONS)
    check_flags(owner, normalize=normalize)
    for name, value in gates.items():
        check_choice(owner, name, value, GATES)


def _expert_width(d_ff: int | None, d_model: int) -> int:
    return default_d_ff(d_model, "swiglu") if d_ff is None else d_ff  # every expert form is gated


class RoutedMoE(MoE):
    """Top-k routed MoE of gated-MLP experts (OTCE eq. 15-17, Switch/GShard routing).

    Args:
        d_model: model width.
        n_experts: number of experts (default 8).
        top_k: experts per token (default 2).
        d_ff: each expert's hidden width (default: the dense MLP's, :func:`default_d_ff`).
        activation: ``swiglu`` | ``swisig`` | ``switanh`` (default ``swiglu``).
        act: ``silu`` | ``gelu`` | ``relu`` (default ``silu``).
        normalize: renormalise the top-k gates to sum to 1 (default False).
    """

    def __init__(self, d_model: int, *, n_experts: int = 8, top_k: int = 2, d_ff: int | None = None,
                 activation: str = "swiglu", act: str = "silu", normalize: bool = False):
        _check_options("RoutedMoE", act=act, normalize=normalize, activation=activation)
        d_ff = _expert_width(d_ff, d_model)
        super().__init__(
            TopKRouter(d_model, n_experts, top_k, normalize=normalize),
            MLPExperts(d_model, n_experts, d_ff, activation=activation, act=act),
        )


class SharedExpertMoE(MoE):
    """Shared-expert isolation (DeepSeekMoE, "SEI"): :class:`RoutedMoE` plus ``n_shared`` experts that
    every token uses with gate 1. The ``n_shared`` always-on experts of width ``d_ff`` are one MLP of
    width ``n_shared·d_ff`` (the same function and parameters).

    Args:
        n_shared: always-on experts (default 1; 0 gives a plain RoutedMoE).
        others: as :class:`RoutedMoE`.
    """

    def __init__(self, d_model: int, *, n_experts: int = 8, top_k: int = 2, n_shared: int = 1,
                 d_ff: int | None = None, activation: str = "swiglu", act: str = "silu", normalize: bool = False):
        if not isinstance(n_shared, int) or n_shared < 0:
            raise ValueError(f"SharedExpertMoE: n_shared={n_shared!r} must be a non-negative integer")
        _check_options("SharedExpertMoE", act=act, normalize=normalize, activation=activation)
        d_ff = _expert_width(d_ff, d_model)
        super().__init__(
            TopKRouter(d_model, n_experts, top_k, normalize=normalize),
            MLPExperts(d_model, n_experts, d_ff, activation=activation, act=act),
            shared_expert=MLP(d_model, d_ff=n_shared * d_ff, activation=activation, act=act) if n_shared else None,
        )


class CohesiveMoE(MoE):
    """OTCE's cohesive cross-domain MoE (eq. 18): expert ``i`` is ``(act(x W_iᵖ) ⊙ tanh(x Vˢ)) W₂ᵢᵖ``
    with one ``Vˢ`` for all experts, computed once per token. The shared share of the parameters is
    fixed by ``n_experts`` (``Vˢ`` is as wide as every expert).

    Args:
        d_model: model width.
        n_experts, top_k, normalize: as :class:`RoutedMoE` (defaults 8, 2, False).
        d_ff: the experts' (and ``Vˢ``'s) width (default: the dense MLP's).
        gate: the shared half's squashing, ``switanh`` (default, eq. 18) | ``swisig`` | ``swiglu``.
        act: ``silu`` | ``gelu`` | ``relu``.
    """

    def __init__(self, d_model: int, *, n_experts: int = 8, top_k: int = 2, d_ff: int | None = None,
                 gate: str = "switanh", act: str = "silu", normalize: bool = False):
        _check_options("CohesiveMoE", act=act, normalize=normalize, gate=gate)
        d_ff = _expert_width(d_ff, d_model)
        super().__init__(
            TopKRouter(d_model, n_experts, top_k, normalize=normalize),
            CohesiveExperts(d_model, n_experts, d_ff, act=act),
            cross_domain=SharedGate(d_model, d_ff, activation=gate),
        )


class ExpansiveMoE(MoE):
    """OTCE's expansive cross-domain MoE (eq. 19): a shared gated FFN ``h = FFNˢ(x)`` computed once per
    token; expert ``i`` gates it, ``u = h ⊙ σ(h W₃ᵢ)``, and applies its private gated FFN to ``u``.

    Args:
        d_model: model width.
        n_experts, top_k, normalize: as :class:`RoutedMoE` (defaults 8, 2, False).
        d_ff: each private expert's width (default: the dense MLP's).
        d_shared: the shared FFN's width, free of ``d_ff`` so the shared/private ratio can be set
            (default: the dense MLP's).
        activation: ``switanh`` (default, eq. 19) | ``swisig`` | ``swiglu``, for both FFNs.
        act: ``silu`` | ``gelu`` | ``relu``.
        gate: each expert's gate on the shared output, ``matrix`` (``d×d``, eq. 19; default) |
            ``scalar`` (one ``d``-vector per expert, the authors' code; what the recipes use).
    """

    def __init__(self, d_model: int, *, n_experts: int = 8, top_k: int = 2, d_ff: int | None = None,
                 d_shared: int | None = None, activation: str = "switanh", act: str = "silu", normalize: bool = False,
                 gate: str = "matrix"):
        _check_options("ExpansiveMoE", act=act, normalize=normalize, activation=activation)
        check_choice("ExpansiveMoE", "gate", gate, GATE_FORMS)
        d_ff, d_shared = _expert_width(d_ff, d_model), _expert_width(d_shared, d_model)
        super().__init__(
            TopKRouter(d_model, n_experts, top_k, normalize=normalize),
            ExpansiveExperts(d_model, n_experts, d_ff, activation=activation, act=act, gate=gate),
            cross_domain=MLP(d_model, d_ff=d_shared, activation=activation, act=act),
        )


class ComposedMoE(MoE):
    """The :class:`MoE` engine with its parts named in a recipe: each part a spec ``{class_path, init_args}``
    built with the model's ``d_model`` (which its ``init_args`` leave out), so a new variant is a YAML binding
    rather than a class. The specs are plain values, so a checkpoint records and rebuilds them.

    .. code-block:: yaml

        Q:
          class_path: components.ComposedMoE
          init_args:
            router: {class_path: components.TopKRouter, init_args: {n_experts: 4, top_k: 1}}
            experts: {class_path: components.state.MLPExperts, init_args: {n_experts: 4, d_ff: 64}}
            shared_expert: {class_path: components.MLP, init_args: {d_ff: 64}}   # optional

    Args:
        d_model: model width.
        router: the router's spec (a :class:`TopKRouter` or :class:`SigmoidRouter`, or a class with its ``n_experts``, ``top_k``,
            ``centroids`` and ``forward(x) -> Routing``).
        experts: the expert bank's spec (:mod:`components.state.experts`).
        shared_expert: an always-on module's spec, added on every token (SEI), or None.
        cross_domain: the spec of a module computing the shared state the experts read, or None.
        balance: what the balancing loss evens out, ``batch`` (default) | ``sequence`` (as :class:`MoE`).
    """

    def __init__(self, d_model: int, *, router: Mapping, experts: Mapping, shared_expert: Mapping | None = None,
                 cross_domain: Mapping | None = None, balance: str = "batch"):
        parts = {"router": router, "experts": experts, "shared_expert": shared_expert, "cross_domain": cross_domain}
        built = {name: None if spec is None else _built_part(name, spec, d_model) for name, spec in parts.items()}
        super().__init__(built["router"], built["experts"], shared_expert=built["shared_expert"],
                         cross_domain=built["cross_domain"], balance=balance)


def _built_part(name: str, spec: Mapping, d_model: int) -> nn.Module:
    """One part of a :class:`ComposedMoE`, from its spec; a problem names the part."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"ComposedMoE: {name}={spec!r} must be a spec {{class_path: ..., init_args: {{...}}}} (plain "
                         "values, so a checkpoint can rebuild it); in Python, MoE takes the built modules")
    try:
        return binding_factory(name, spec)(d_model)
    except (TypeError, ValueError) as error:
        raise ValueError(f"ComposedMoE: {name}: {error}") from None
