"""QCAttention: quadratic causal self-attention with grouped-query heads and RoPE."""

import torch
from torch import nn

from components._checks import check_divisible, check_mixer_input, check_positive
from components.context import Context
from components.rotary import apply_rotary
from kernels._backend import check_backend
from kernels.attention import attention


class QCAttention(nn.Module):
    """Causal multi-head self-attention, ``[B, T, d_model] → [B, T, d_model]``.

    Args:
        d_model: model width.
        n_heads: query heads (default 8); ``d_model`` must be divisible by it.
        n_kv_heads: key/value heads for grouped-query attention (default ``n_heads``); must divide
            ``n_heads``.
        backend: attention kernel, ``auto`` | ``reference`` | ``triton``.

    RoPE from the context's shared table is applied to Q and K over the head dim, which must be even.
    """

    def __init__(self, d_model: int, *, n_heads: int = 8, n_kv_heads: int | None = None, backend: str = "auto"):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        check_positive("QCAttention", d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads)
        check_divisible("QCAttention", "d_model", d_model, "n_heads", n_heads)
        check_divisible("QCAttention", "n_heads", n_heads, "n_kv_heads", n_kv_heads)
        check_backend(backend)
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        if self.head_dim % 2 != 0:
            raise ValueError(
                f"QCAttention: head_dim = d_model / n_heads = {self.head_dim} must be even for RoPE"
            )
        self.d_model, self.backend = d_model, backend
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.kv_proj = nn.Linear(d_model, 2 * n_kv_heads * self.head_dim, bias=False)
        self.out_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)

    def forward(self, x: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        check_mixer_input(type(self).__name__, x, self.d_model, self.q_proj.weight, sequence=True)
        context = context or Context.default(x)
        x = context.zero_padding(x)
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)  # [B, T, H, Dh]
        k, v = self.kv_proj(x).view(B, T, 2, self.n_kv_heads, self.head_dim).unbind(2)  # 2 × [B, T, Hkv, Dh]
        cos, sin = context.rotary_tables(self.head_dim)  # [B, T, Dh]
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = attention(q, k, v, causal=True, key_padding_mask=context.padding_mask, backend=self.backend)
        return self.out_proj(y.reshape(B, T, self.n_heads * self.head_dim))  # [B, T, d_model]

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}"
