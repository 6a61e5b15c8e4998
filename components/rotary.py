"""Rotary position embedding (RoPE), one table shared by every layer (TransXSSM's unified RoPE).

Rotate-half convention over an even dimension ``d``, ``θ_i = base^(-2i/d)``. Attention applies it to
Q and K over the head dim, SSD to C and B over the state dim, so ``<R_t c, R_s b>`` depends on
``t - s`` only. Past ``max_position`` the base is stretched NTK-style (seed 001, listing A.1).
"""

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, T, H, d]`` by tables ``cos, sin [B, T, d]`` (broadcast over heads)."""
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [B, T, 1, d]
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Cos/sin tables for any even dimension from one set of hyper-parameters.

    Args:
        max_position: positions the model is trained for; beyond it the base is scaled NTK-style.
        base: the RoPE base (default 10000).
        scaling_factor: NTK scaling factor for extrapolation (default 1.0).
    """

    def __init__(self, max_position: int = 2048, *, base: float = 10000.0, scaling_factor: float = 1.0):
        super().__init__()
        if max_position < 1:
            raise ValueError(f"RotaryEmbedding: max_position={max_position} must be >= 1")
        self.max_position = max_position
        self.base = base
        self.scaling_factor = scaling_factor

    def inv_freq(self, dim: int, seq_len: int, device: torch.device) -> torch.Tensor:
        """``[dim/2]`` frequencies ``base^(-2i/dim)``, NTK-scaled when ``seq_len > max_position``."""
        if dim <= 0 or dim % 2 != 0:
            raise ValueError(f"RotaryEmbedding: the rotary dimension must be even and positive; got {dim}")
        base = self.base
        if seq_len > self.max_position:
            stretch = self.scaling_factor * seq_len / self.max_position - (self.scaling_factor - 1)
            base = base * stretch ** (dim / (dim - 2)) if dim > 2 else base * stretch
        exponent = torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim
        return (1.0 / base**exponent).float()

    def forward(self, position_ids: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``position_ids [B, T]`` → ``(cos, sin)`` each ``[B, T, dim]`` in fp32."""
        seq_len = int(position_ids.max()) + 1 if position_ids.numel() else 0
        inv_freq = self.inv_freq(dim, seq_len, position_ids.device)  # [dim/2]
        angles = position_ids.float()[..., None] * inv_freq  # [B, T, dim/2]
        angles = torch.cat((angles, angles), dim=-1)  # [B, T, dim]
        return angles.cos(), angles.sin()

    def extra_repr(self) -> str:
        return f"max_position={self.max_position}, base={self.base}, scaling_factor={self.scaling_factor}"
