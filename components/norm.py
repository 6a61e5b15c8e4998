"""RMSNorm (all the papers use it in place of LayerNorm), and Mamba-2's grouped, gated form."""

import torch
import torch.nn.functional as F
from torch import nn

from components._checks import check_number, check_positive


def at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in fp32, or in its own dtype if wider (float64 stays float64, for gradcheck)."""
    wide = torch.promote_types(t.dtype, torch.float32)
    return t if t.dtype == wide else t.to(wide)  # (a no-op .to still costs a dispatch, per call of a decoding step)


class RMSNorm(nn.Module):
    """``y = x / rms(x) * weight`` over the last dimension, computed in fp32.

    Args:
        dim: the normalised (last) dimension.
        eps: added to the mean square (default 1e-6).
    """

    def __init__(self, dim: int, *, eps: float = 1e-6):
        super().__init__()
        check_positive("RMSNorm", dim=dim)
        check_number("RMSNorm", "eps", eps, low=0)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch's fused rms_norm: x · rsqrt(mean(x²) + eps) · weight, bit for bit the written-out form in
        # fp32, at half its cost per call (what a decoding step, one token wide, pays for).
        return F.rms_norm(at_least_fp32(x), self.weight.shape, at_least_fp32(self.weight), self.eps).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}"


class GroupedRMSNorm(nn.Module):
    """RMSNorm over each of ``groups`` equal groups of the last dimension, then one gain per channel
    (Mamba-2's gate norm with ``n_groups``; ``groups=1`` is plain RMSNorm). Computed in fp32.

    Args:
        dim: the normalised (last) dimension, a multiple of ``groups``.
        groups: how many groups (default 1).
        eps: added to each group's mean square (default 1e-6).
    """

    def __init__(self, dim: int, groups: int = 1, *, eps: float = 1e-6):
        super().__init__()
        check_positive("GroupedRMSNorm", dim=dim, groups=groups)
        check_number("GroupedRMSNorm", "eps", eps, low=0)
        if dim % groups:
            raise ValueError(f"GroupedRMSNorm: dim={dim} is not divisible by groups={groups}")
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        """``x [..., dim]``; with ``gate`` (same shape) normalises ``x ⊙ silu(gate)`` (Mamba-2's order)."""
        x32 = at_least_fp32(x)
        if gate is not None:
            x32 = x32 * F.silu(at_least_fp32(gate))
        # (reshape, not Tensor.unflatten: a Python method that torch.compile cannot trace under a torch function
        # mode, which a compiled CPU decoding step runs in)
        x32 = x32.reshape(*x32.shape[:-1], self.groups, x32.shape[-1] // self.groups)  # [..., dim] → [..., groups, dim / groups]
        y = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).flatten(-2)  # [..., dim]
        return (y * at_least_fp32(self.weight)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, groups={self.groups}, eps={self.eps}"
