"""Rotary position embedding (RoPE), one table shared by every layer (TransXSSM's unified RoPE).

Rotate-half convention over an even dimension ``d``, ``θ_i = base^(-2i/d)``. Attention applies it to
Q and K over the head dim, SSD to C and B over the state dim, so ``<R_t c, R_s b>`` depends on
``t - s`` only. Past ``max_position`` the base is stretched NTK-style (Wonderful Matrices v1, listing A.1, the same
formula as Hugging Face's "dynamic" RoPE), per sequence: each sequence's stretch comes from its own
last position, never from the other sequences of the batch.
"""

import torch
from torch import nn

from components._checks import check_number


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, T, H, d]`` by tables ``cos, sin [B, T, d]`` (broadcast over heads)."""
    if cos.shape != (x.shape[0], x.shape[1], x.shape[-1]) or sin.shape != cos.shape:
        raise ValueError(f"apply_rotary: x [B, T, H, d] = {tuple(x.shape)} needs cos and sin [B, T, d]; got "
                         f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [B, T, 1, d]
    y = x * cos + rotate_half(x) * sin
    return y if y.dtype == x.dtype else y.to(x.dtype)


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
        check_number("RotaryEmbedding", "base", base, low=0, above=True)
        check_number("RotaryEmbedding", "scaling_factor", scaling_factor, low=0, above=True)
        self.max_position = max_position
        self.base = base
        self.scaling_factor = scaling_factor

    def inv_freq(self, dim: int, seq_len, device: torch.device) -> torch.Tensor:
        """Frequencies ``base^(-2i/dim)``, ``[..., dim/2]`` for ``seq_len`` an int or a tensor ``[...]`` of
        lengths; the base is NTK-stretched where the length exceeds ``max_position``:
        ``base · (f·L/max − (f − 1))^(dim/(dim−2))`` with ``f`` the scaling factor."""
        if dim <= 0 or dim % 2 != 0:
            raise ValueError(f"RotaryEmbedding: the rotary dimension must be even and positive; got {dim}")
        length = torch.as_tensor(seq_len, device=device, dtype=torch.float64)
        stretch = self.scaling_factor * length / self.max_position - (self.scaling_factor - 1)
        stretch = torch.where(length > self.max_position, stretch, torch.ones_like(stretch))
        base = self.base * stretch ** (dim / (dim - 2) if dim > 2 else 1.0)  # [...]
        exponent = torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim  # [dim/2]
        return (1.0 / base[..., None] ** exponent).float()  # [..., dim/2]

    def forward(self, position_ids: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``position_ids [B, T]`` → ``(cos, sin)`` each ``[B, T, dim]`` in fp32."""
        if position_ids.shape[-1] == 0:
            empty = position_ids.new_zeros(*position_ids.shape, dim, dtype=torch.float32)
            return empty, empty
        lengths = position_ids.amax(dim=-1) + 1  # [B] each sequence's own extent, no host sync
        inv_freq = self.inv_freq(dim, lengths, position_ids.device)  # [B, dim/2]
        angles = position_ids.float()[..., None] * inv_freq[:, None, :]  # [B, T, dim/2]
        angles = torch.cat((angles, angles), dim=-1)  # [B, T, dim]
        return angles.cos(), angles.sin()

    def extra_repr(self) -> str:
        return f"max_position={self.max_position}, base={self.base}, scaling_factor={self.scaling_factor}"
