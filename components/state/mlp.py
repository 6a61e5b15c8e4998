"""Dense MLP state mixers: SwiGLU, OTCE's double-gated DGLU (SwiSig, SwiTanh), and the GELU FFN."""

import torch
import torch.nn.functional as F
from torch import nn

from components._checks import check_choice, check_mixer_input, check_positive


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """``relu(x)²``: Primer's squared ReLU, Nemotron-H's MLP activation."""
    return F.relu(x).square()


ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu, "relu2": relu_squared}


def _identity(v: torch.Tensor) -> torch.Tensor:
    return v


# The second (gate) branch of each gated form; the GELU FFN has none. Named functions, not lambdas, so that
# a module holding one pickles (torch.save of a whole model, Lightning's ddp_spawn).
GATES = {"swiglu": _identity, "swisig": torch.sigmoid, "switanh": torch.tanh}
FORMS = (*GATES, "gelu", "plain")


def default_d_ff(d_model: int, activation: str) -> int:
    """Width at which every form has about ``8·d_model²`` parameters: ``4·d`` for the two-matrix
    forms (GELU, plain), ``8/3·d`` (rounded up to a multiple of 8) for the three-matrix gated forms."""
    if activation in ("gelu", "plain"):
        return 4 * d_model
    return -(-8 * d_model // 3 // 8) * 8


class MLP(nn.Module):
    """Position-wise feed-forward state mixer, ``[..., d_model] → [..., d_model]``.

    Forms (``activation``), with ``act`` the nonlinearity (default SiLU, i.e. Swish)::

        swiglu   (act(xW) ⊙ xV) W₂
        swisig   (act(xW) ⊙ σ(xV)) W₂        OTCE eq. 13a
        switanh  (act(xW) ⊙ tanh(xV)) W₂     OTCE eq. 13b
        gelu     gelu(xW) W₂                 (two matrices; ``act`` is ignored)
        plain    act(xW) W₂                  (two matrices; CDMoE's cross-domain MLP in Wonderful Matrices v2)

    Args:
        d_model: model width.
        d_ff: hidden width (default :func:`default_d_ff`, equal parameters across forms).
        activation: one of ``swiglu``, ``swisig``, ``switanh``, ``gelu``, ``plain`` (default ``swiglu``).
        act: ``silu`` | ``gelu`` | ``relu`` | ``relu2`` (squared ReLU) for the gated and plain forms (default ``silu``).
    """

    mixer_slot = "state"  # the block slot it fills; a pattern placing it in the other is refused

    def __init__(self, d_model: int, *, d_ff: int | None = None, activation: str = "swiglu", act: str = "silu"):
        super().__init__()
        check_choice("MLP", "activation", activation, FORMS)
        check_choice("MLP", "act", act, ACTIVATIONS)
        d_ff = default_d_ff(d_model, activation) if d_ff is None else d_ff
        check_positive("MLP", d_model=d_model, d_ff=d_ff)
        self.d_model, self.activation, self.act_name, self.d_ff = d_model, activation, act, d_ff
        self.act = F.gelu if activation == "gelu" else ACTIVATIONS[act]
        self.gate = GATES.get(activation)
        n_in = 1 if self.gate is None else 2
        self.in_proj = nn.Linear(d_model, n_in * d_ff, bias=False)  # [W | V] fused
        self.out_proj = nn.Linear(d_ff, d_model, bias=False)  # W₂

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_mixer_input(type(self).__name__, x, self.d_model, self.out_proj.weight, sequence=False)
        if self.gate is None:
            return self.out_proj(self.act(self.in_proj(x)))
        h, v = self.in_proj(x).chunk(2, dim=-1)  # 2 × [..., d_ff]
        return self.out_proj(self.act(h) * self.gate(v))

    def fused_row_blocks(self) -> dict[str, tuple[int, ...]]:
        """The gated form's ``in_proj`` fuses ``W`` and ``V`` along its rows: ``{"in_proj.weight": (d_ff, d_ff)}``
        (an optimiser that treats each projection as its own matrix, as Muon should, reads it)."""
        return {"in_proj.weight": (self.d_ff, self.d_ff)} if self.gate is not None else {}

    def extra_repr(self) -> str:
        return f"activation={self.activation}, act={self.act_name}, d_ff={self.d_ff}"
