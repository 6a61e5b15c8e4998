"""``TokenShift``: each position mixes itself with the position before it (RWKV's token shift, as a
sequence mixer). The smallest mixer that mixes tokens; the worked example of docs/architecture.md,
"Adding a mixer"."""

import math

import torch
import torch.nn as nn

from components._checks import check_mixer_input, check_number, check_positive
from components.context import Context


class TokenShift(nn.Module):
    """``y_t = W_out (x_t + μ ⊙ (x_{t−1} − x_t))`` with a learned per-channel ``μ``.

    ``x_{−1} = 0``, and the position before a document start or a padded one reads 0. Decoding keeps
    the last input in the cache. Shapes: ``x [B, T, d_model] → [B, T, d_model]``.

    Args:
        d_model: model width.
        mix: initial ``μ`` (every channel; default 0.5).
    """

    mixer_slot = "sequence"  # the block slot it fills; a pattern placing it in the other is refused

    def __init__(self, d_model: int, *, mix: float = 0.5):
        super().__init__()
        check_positive("TokenShift", d_model=d_model)
        check_number("TokenShift", "mix", mix, low=-math.inf)  # any finite start: μ is learned
        self.d_model = d_model
        self.mix = nn.Parameter(torch.full((d_model,), float(mix)))
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        check_mixer_input(type(self).__name__, x, self.d_model, self.out_proj.weight, sequence=True)
        context = Context.for_input(type(self).__name__, x, context)
        x = context.zero_padding(x)  # a padded position passes 0 on, whatever it held
        cached = context.cache.state(self) if context.cache is not None else None
        before = cached.get("last") if cached is not None else None  # [B, 1, d]: decoding
        if before is None:
            before = x.new_zeros(x.shape[0], 1, self.d_model)
        previous = torch.cat([before, x[:, :-1]], dim=1)  # [B, T, d]
        if cached is not None and x.shape[1] > 0:
            # a copy, not a view into this call's x, which would keep the prompt's whole input alive
            context.cache.keep(self, "last", x[:, -1:].contiguous(), x.shape[1])
        starts = context.document_starts  # [B, T] or None
        if starts is not None:  # selected away, not multiplied by 0: a NaN in the last document stays there
            previous = torch.where(starts[..., None], 0.0, previous)
        return self.out_proj(x + self.mix * (previous - x))
