"""``Context``: what a sequence mixer may need beyond its input, made once per model forward."""

from dataclasses import dataclass, field

import torch

from components.rotary import RotaryEmbedding


@dataclass
class Context:
    """Per-forward information shared by all sequence mixers.

    Attributes:
        position_ids: ``[B, T]`` integer positions.
        padding_mask: ``[B, T]`` bool, True where the token is padding; None for no padding.
        rotary: the model's one RotaryEmbedding; its tables are computed once per dimension.
    """

    position_ids: torch.Tensor
    padding_mask: torch.Tensor | None = None
    rotary: RotaryEmbedding = field(default_factory=RotaryEmbedding)
    _tables: dict = field(default_factory=dict, repr=False)

    @classmethod
    def default(cls, x: torch.Tensor, rotary: RotaryEmbedding | None = None) -> "Context":
        """Positions ``0..T-1`` and no padding for ``x [B, T, ...]``: what a mixer assumes alone."""
        B, T = x.shape[:2]
        position_ids = torch.arange(T, device=x.device).expand(B, T)  # [B, T]
        return cls(position_ids=position_ids, rotary=rotary or RotaryEmbedding())

    def rotary_tables(self, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` each ``[B, T, dim]`` for this context's positions, shared across layers."""
        if dim not in self._tables:
            self._tables[dim] = self.rotary(self.position_ids, dim)
        return self._tables[dim]
