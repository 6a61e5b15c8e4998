"""``SigmoidGated``: a module whose output each token scales by a learned sigmoid gate of its own input,
``y = σ(x · w) · inner(x)`` — Qwen2-MoE's gated shared expert, as a part a :class:`~components.ComposedMoE` takes."""

from collections.abc import Mapping

import torch
from torch import nn

from components.bindings import binding_factory


class SigmoidGated(nn.Module):
    """``[..., d_model] → [..., d_model]``: ``inner``'s output times ``σ(x · w)``, one scalar gate per token.

    Args:
        d_model: token width.
        inner: the gated module's spec ``{class_path, init_args}``, built with ``d_model`` (which its ``init_args``
            leave out): plain values, so a checkpoint records and rebuilds it.
    """

    mixer_slot = "state"  # it acts on each token alone

    def __init__(self, d_model: int, *, inner: Mapping):
        super().__init__()
        if not isinstance(inner, Mapping):
            raise ValueError(f"SigmoidGated: inner={inner!r} must be a spec {{class_path: ..., init_args: {{...}}}}")
        try:
            self.inner = binding_factory("inner", inner)(d_model)
        except (TypeError, ValueError) as error:
            raise ValueError(f"SigmoidGated: inner: {error}") from None
        self.gate = nn.Linear(d_model, 1, bias=False)  # w: one gate logit per token

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.gate(x)) * self.inner(x)  # [..., 1] · [..., d_model]
