"""``ShortConv``: LFM2's gated short convolution (Liquid AI), a sequence mixer that mixes each token with the few
before it through a depthwise causal convolution between two input-dependent gates:

    [b | c | h] = x W_in          three d_model-wide projections of the token
    u           = b ⊙ h            the input gate
    v           = conv_K(u)        depthwise, causal, K taps (LFM2: 3)
    y           = (c ⊙ v) W_out     the output gate

A position reads only the ``K - 1`` before it, so decoding keeps those ``K - 1`` gated inputs (a constant size).
"""

import torch
from torch import nn

from components._checks import check_flags, check_mixer_input, check_positive
from components.context import Context
from components.sequence.causal_conv import causal_conv


class ShortConv(nn.Module):
    """LFM2's gated short convolution, ``[B, T, d_model] → [B, T, d_model]``.

    Padded positions pass nothing on: their input and their gated input ``u`` are zeroed (transformers' LFM2 zeroes
    the input alone, the same without biases), and with packed documents a position reads none of another document's.

    Args:
        d_model: model width.
        kernel_size: taps of the causal convolution, the position itself included (default 3, LFM2's ``conv_L_cache``).
        bias: biases on both projections and the convolution (default False, LFM2's ``conv_bias``).
    """

    mixer_slot = "sequence"  # the block slot it fills; a pattern placing it in the other is refused

    def __init__(self, d_model: int, *, kernel_size: int = 3, bias: bool = False):
        super().__init__()
        check_positive("ShortConv", d_model=d_model, kernel_size=kernel_size)
        check_flags("ShortConv", bias=bias)
        self.d_model, self.bias = d_model, bias
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)  # rows [b | c | h]
        self.conv = nn.Conv1d(d_model, d_model, kernel_size, groups=d_model, bias=bias)  # weights only: causal_conv
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        check_mixer_input(type(self).__name__, x, self.d_model, self.out_proj.weight, sequence=True)
        context = Context.for_input(type(self).__name__, x, context)
        x = context.zero_padding(x)  # a padded position passes 0 on, whatever it held
        b, c, h = self.in_proj(x).chunk(3, dim=-1)  # 3 × [B, T, d]
        # (padding's gated input zeroed too: with biases it would be bias ⊙ bias, which a later token's taps would read)
        u = context.zero_padding(b * h)  # [B, T, d]
        v = causal_conv(self, self.conv, u, context.cache, context.document_ids)  # [B, T, d]
        return self.out_proj(c * v)

    def fused_row_blocks(self) -> dict[str, tuple[int, ...]]:
        """``in_proj`` fuses three projections along its rows: ``[b | c | h]``."""
        return {"in_proj.weight": (self.d_model,) * 3}

    def extra_repr(self) -> str:
        return f"kernel_size={self.conv.kernel_size[0]}, bias={self.bias}"
