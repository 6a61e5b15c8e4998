"""Banks of routed experts, weights stacked on a leading expert dim ``[E, ...]``.

A bank maps routed tokens, sorted by expert, to the experts' outputs:
``bank(x, shared, ends) -> [R, d]`` for ``x [R, d]`` the ``R`` routed assignments grouped by expert,
``ends [E]`` (int32) where each expert's rows end, and ``shared [R, ...]`` their rows of the state a
cross-domain transform computed once per token (None when the MoE has no such transform). The
:class:`~components.state.moe.MoE` engine sorts the assignments once and calls the bank once; every
expert matmul is one :func:`zoo_kernels.grouped_matmul.grouped_matmul` over all experts, which reads
the group sizes on the device (no host sync, no Python loop over experts).

Initialisation follows ``nn.Linear``'s default, ``U(±1/√fan_in)`` per expert.
"""

import math

import torch
from torch import nn

from components._checks import check_choice, check_positive
from components.state.mlp import ACTIVATIONS, GATES
from zoo_kernels.grouped_matmul import grouped_matmul


def _linear_init(shape: tuple[int, ...], fan_in: int) -> nn.Parameter:
    bound = 1.0 / math.sqrt(fan_in)
    return nn.Parameter(torch.empty(shape).uniform_(-bound, bound))


EXPERT_FORMS = (*GATES, "plain")


class MLPExperts(nn.Module):
    """``E`` private MLPs: expert ``i`` is ``(act(x W_i) ⊙ gate(x V_i)) W₂ᵢ``, or ``act(x W_i) W₂ᵢ`` in the
    ``plain`` form (two matrices, as Nemotron-H's experts).

    Args:
        d_model: token width.
        n_experts: ``E``.
        d_ff: hidden width of each expert.
        activation: ``swiglu`` | ``swisig`` | ``switanh`` (the gate: identity, σ, tanh) | ``plain`` (no gate).
        act: ``silu`` | ``gelu`` | ``relu`` | ``relu2``.
    """

    def __init__(self, d_model: int, n_experts: int, d_ff: int, *, activation: str = "swiglu", act: str = "silu"):
        super().__init__()
        check_positive("MLPExperts", d_model=d_model, n_experts=n_experts, d_ff=d_ff)
        check_choice("MLPExperts", "activation", activation, EXPERT_FORMS)
        check_choice("MLPExperts", "act", act, ACTIVATIONS)
        self.n_experts, self.d_ff, self.activation = n_experts, d_ff, activation
        self.act, self.gate = ACTIVATIONS[act], GATES.get(activation)
        n_in = 1 if self.gate is None else 2
        self.w_in = _linear_init((n_experts, d_model, n_in * d_ff), d_model)  # [E, d, W | V], or [E, d, W] plain
        self.w_out = _linear_init((n_experts, d_ff, d_model), d_ff)  # [E, d_ff, d]

    def forward(self, x: torch.Tensor, shared: torch.Tensor | None, ends: torch.Tensor) -> torch.Tensor:
        h = grouped_matmul(x, self.w_in, ends)  # [R, d_ff] plain, [R, 2·d_ff] gated
        if self.gate is None:
            return grouped_matmul(self.act(h), self.w_out, ends)  # [R, d]
        h, v = h.chunk(2, dim=-1)  # 2 × [R, d_ff]
        return grouped_matmul(self.act(h) * self.gate(v), self.w_out, ends)  # [R, d]

    def params_per_expert(self) -> int:
        return (self.w_in.numel() + self.w_out.numel()) // self.n_experts

    def extra_repr(self) -> str:
        return f"n_experts={self.n_experts}, d_ff={self.d_ff}, activation={self.activation}"


class CohesiveExperts(nn.Module):
    """OTCE eq. 18: expert ``i`` is ``(act(x W_iᵖ) ⊙ shared) W₂ᵢᵖ``, where ``shared = tanh(x Vˢ)``
    ``[m, d_ff]`` comes from one matrix every expert shares (:class:`SharedGate`)."""

    def __init__(self, d_model: int, n_experts: int, d_ff: int, *, act: str = "silu"):
        super().__init__()
        check_positive("CohesiveExperts", d_model=d_model, n_experts=n_experts, d_ff=d_ff)
        check_choice("CohesiveExperts", "act", act, ACTIVATIONS)
        self.n_experts, self.d_ff, self.act = n_experts, d_ff, ACTIVATIONS[act]
        self.w_in = _linear_init((n_experts, d_model, d_ff), d_model)  # [E, d, d_ff]  W_iᵖ
        self.w_out = _linear_init((n_experts, d_ff, d_model), d_ff)  # [E, d_ff, d]  W₂ᵢᵖ

    def forward(self, x: torch.Tensor, shared: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        h = self.act(grouped_matmul(x, self.w_in, ends)) * shared  # [R, d_ff]
        return grouped_matmul(h, self.w_out, ends)  # [R, d]

    def params_per_expert(self) -> int:
        return (self.w_in.numel() + self.w_out.numel()) // self.n_experts

    def extra_repr(self) -> str:
        return f"n_experts={self.n_experts}, d_ff={self.d_ff}"


class SharedGate(nn.Module):
    """The cohesive experts' shared half: ``gate(x Vˢ)``, ``[..., d_model] → [..., d_ff]``."""

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "switanh"):
        super().__init__()
        check_choice("SharedGate", "activation", activation, GATES)
        self.gate, self.activation = GATES[activation], activation
        self.proj = nn.Linear(d_model, d_ff, bias=False)  # Vˢ

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.proj(x))


GATE_FORMS = ("matrix", "scalar")


class ExpansiveExperts(nn.Module):
    """OTCE eq. 19: expert ``i`` reads the shared FFN's output ``h = shared`` ``[m, d_model]``, gates
    it with its own ``W₃ᵢ``, ``u = h ⊙ σ(h W₃ᵢ)``, and applies its private gated MLP to ``u``.

    ``gate="matrix"``: ``W₃ᵢ ∈ R^{d×d}`` (the paper's equation); ``gate="scalar"``: ``w₃ᵢ ∈ R^d``, one
    gate value per token, ``u = h · σ(h · w₃ᵢ)`` (the authors' code: ``shared_expert_gate = Linear(d, 1)``),
    which costs ``d`` parameters per expert instead of ``d²``."""

    def __init__(self, d_model: int, n_experts: int, d_ff: int, *, activation: str = "switanh", act: str = "silu",
                 gate: str = "matrix"):
        super().__init__()
        check_choice("ExpansiveExperts", "gate", gate, GATE_FORMS)
        self.private = MLPExperts(d_model, n_experts, d_ff, activation=activation, act=act)
        self.n_experts, self.gate = n_experts, gate
        width = d_model if gate == "matrix" else 1
        self.w_gate = _linear_init((n_experts, d_model, width), d_model)  # [E, d, d | 1]  W₃ᵢ

    def forward(self, x: torch.Tensor, shared: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        u = shared * torch.sigmoid(grouped_matmul(shared, self.w_gate, ends))  # [R, d]
        return self.private(u, None, ends)

    def params_per_expert(self) -> int:
        return self.w_gate.numel() // self.n_experts + self.private.params_per_expert()
