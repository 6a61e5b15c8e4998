"""RMSNorm (all the papers use it in place of LayerNorm)."""

import torch
from torch import nn


class RMSNorm(nn.Module):
    """``y = x / rms(x) * weight`` over the last dimension, computed in fp32.

    Args:
        dim: the normalised (last) dimension.
        eps: added to the mean square (default 1e-6).
    """

    def __init__(self, dim: int, *, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)
