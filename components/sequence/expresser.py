"""OTCE's Expresser (OTCE §3.3, Fig. 9): the model's last block, as the authors' code defines it."""

import torch
from torch import nn

from components._checks import check_choice, check_flags, check_mixer_input
from components.block import WholeBlock
from components.context import Context
from components.norm import RMSNorm
from components.sequence.attention import QCAttention
from components.state.mlp import ACTIVATIONS, MLP


class Expresser(WholeBlock):
    """A whole block that re-attends over everything the SSD layers aggregated, then projects,
    ``[B, T, d_model] → [B, T, d_model]``::

        h = x + attention(norm₁(x))
        h = h + mlp(norm₂(h))                       SwiTanh MLP, as OTCE's other MLPs
        y = W_p · act(W_d · (norm₃(h) + x))         no residual around it: y replaces the stream

    This is ``CheemsExpressionLayer`` of LoserCheems/OTCE (the paper's figure leaves the last step
    ambiguous; the code adds the block input back after ``norm₃`` and then applies the dense layer,
    the activation and the projection, with no residual after them). It computes its own norms and
    residuals, so it is a :class:`components.block.WholeBlock`: the model places it as a block of its
    own, on the raw stream. Bind it to a letter and end the pattern with it:
    ``"SM + SX×11 + AX×2 + SX×8 + SM + O-"``.

    Args:
        d_model: model width.
        n_heads, n_kv_heads, rope, qk_norm, backend: of its :class:`QCAttention`.
        d_ff, activation, act: of its :class:`MLP` (default ``switanh``, the authors' ``CheemsMLP``);
            ``act`` is also the activation between the dense layer and the projection.
        norm_eps: its three RMSNorms' epsilon (default 1e-6).
    """

    def __init__(self, d_model: int, *, n_heads: int = 8, n_kv_heads: int | None = None, rope: bool = True,
                 qk_norm: bool = False, d_ff: int | None = None, activation: str = "switanh", act: str = "silu",
                 norm_eps: float = 1e-6, backend: str = "auto"):
        super().__init__()
        check_choice("Expresser", "act", act, ACTIVATIONS)
        check_flags("Expresser", rope=rope, qk_norm=qk_norm)
        self.d_model, self.act_name, self.act = d_model, act, ACTIVATIONS[act]
        self.attention_norm = RMSNorm(d_model, eps=norm_eps)
        self.attention = QCAttention(d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, rope=rope, qk_norm=qk_norm,
                                     norm_eps=norm_eps, backend=backend)
        self.mlp_norm = RMSNorm(d_model, eps=norm_eps)
        self.mlp = MLP(d_model, d_ff=d_ff, activation=activation, act=act)
        self.dense_norm = RMSNorm(d_model, eps=norm_eps)
        self.dense = nn.Linear(d_model, d_model, bias=False)  # W_d
        self.projection = nn.Linear(d_model, d_model, bias=False)  # W_p

    def forward(self, x: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        check_mixer_input("Expresser", x, self.d_model, self.dense.weight, sequence=True)
        context = Context.for_input("Expresser", x, context)
        x = context.zero_padding(x)  # before its own norms: a NaN at a padded position must not reach a gradient
        h = x + self.attention(self.attention_norm(x), context)
        h = h + self.mlp(self.mlp_norm(h))
        return self.projection(self.act(self.dense(self.dense_norm(h) + x)))

    def extra_repr(self) -> str:
        return f"act={self.act_name}"
