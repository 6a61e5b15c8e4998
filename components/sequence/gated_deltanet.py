"""``GatedDeltaNet``: the gated delta rule as a sequence mixer (Yang, Kautz and Hatamizadeh, "Gated Delta Networks:
Improving Mamba2 with Delta Rule"; the linear-attention layer of Qwen3-Next's and Kimi Linear's hybrids)."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from components._checks import check_divisible, check_flags, check_mixer_input, check_number, check_positive
from components.context import Context
from components.flops import gated_delta_flops_per_token
from components.norm import RMSNorm, at_least_fp32
from components.sequence.causal_conv import causal_conv
from zoo_kernels._backend import check_backend
from zoo_kernels.gated_delta import REFERENCE_CHUNK, gated_delta_rule, gated_delta_step


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet, ``[B, T, d_model] → [B, T, d_model]``.

    Per head ``h`` (``n_heads`` value heads of dim ``V``; queries and keys of dim ``K`` in ``n_k_heads`` heads, each
    read by ``n_heads / n_k_heads`` value heads)::

        [q | k | v] = silu(conv_K(x [W_q | W_k | W_v]))    depthwise causal conv, no bias
        q, k ← q / |q|, k / |k|                             unit queries and keys
        beta = sigmoid(x W_β) (× 2)    g = -exp(A_log) · softplus(x W_a + Δ_bias)      [B, T, H]
        S_t = exp(g_t) (I - beta_t k_t k_tᵀ) S_{t-1} + beta_t k_t v_tᵀ           state [K, V] per head
        y_t = S_tᵀ q_t / √K
        out = (rms_norm(y) · w ⊙ silu(x W_z)) W_out          the norm per head (one gain of V shared by the heads)

    The state is a fixed ``[H, K, V]`` per sequence: decoding keeps it and the conv window. The chunked form and its
    derivation: ``zoo_kernels/gated_delta``. The layer follows flash-linear-attention's ``GatedDeltaNet`` and
    transformers' ``Qwen3NextGatedDeltaNet`` (checked against the latter on copied weights).

    Args:
        d_model: model width.
        n_heads: value heads (default ``d_model // head_dim``).
        head_dim: query and key dim ``K`` per head (default ``min(64, d_model)``).
        n_k_heads: query and key heads (default ``n_heads``); must divide ``n_heads`` (Qwen3-Next: 16 for 32).
        v_head_dim: value dim ``V`` per head (default ``head_dim``).
        conv_kernel: taps of the causal conv over ``[q | k | v]`` (default 4).
        gate: the output gate ``silu(x W_z)`` after the norm (default True; False keeps the norm alone).
        allow_neg_eigval: ``beta = 2 · sigmoid(x W_β)``, in ``(0, 2)`` (default False: ``(0, 1)``), so the transition
            ``I - beta k kᵀ`` reaches eigenvalue -1 along ``k``: Grazzi et al., "Unlocking State-Tracking in Linear RNNs
            Through Negative Eigenvalues" (ICLR 2025); flash-linear-attention's and OLMo-Hybrid's option of that name.
        norm_eps: epsilon of the output RMSNorm (default 1e-6).
        chunk_size: chunk length of the rule's chunked form (default 64).
        backend: ``auto`` | ``reference`` | ``triton`` for the rule's recurrence over chunks (``auto``: the Triton
            kernel on CUDA, the plain-torch loop elsewhere; zoo_kernels/gated_delta).

    Initialisation: ``A_log = log U(0.01, 16)`` (Qwen3-Next's; flash-linear-attention draws ``U(0, 16)``), ``Δ_bias``
    so that ``softplus(Δ_bias)`` is log-uniform in ``[1e-3, 1e-1]`` (flash-linear-attention's, Mamba-2's).
    """

    mixer_slot = "sequence"  # the block slot it fills; a pattern placing it in the other is refused

    def __init__(self, d_model: int, *, n_heads: int | None = None, head_dim: int | None = None,
                 n_k_heads: int | None = None, v_head_dim: int | None = None, conv_kernel: int = 4, gate: bool = True,
                 allow_neg_eigval: bool = False, norm_eps: float = 1e-6, chunk_size: int = 64,
                 backend: str = "auto"):
        super().__init__()
        check_backend(backend, "GatedDeltaNet")
        check_positive("GatedDeltaNet", d_model=d_model, conv_kernel=conv_kernel, chunk_size=chunk_size)
        check_flags("GatedDeltaNet", gate=gate, allow_neg_eigval=allow_neg_eigval)
        check_number("GatedDeltaNet", "norm_eps", norm_eps, low=0)
        head_dim = min(64, d_model) if head_dim is None else head_dim
        check_positive("GatedDeltaNet", head_dim=head_dim)
        if n_heads is None:
            check_divisible("GatedDeltaNet", "d_model", d_model, "head_dim", head_dim)
            n_heads = d_model // head_dim
        n_k_heads = n_heads if n_k_heads is None else n_k_heads
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        check_positive("GatedDeltaNet", n_heads=n_heads, n_k_heads=n_k_heads, v_head_dim=v_head_dim)
        check_divisible("GatedDeltaNet", "n_heads", n_heads, "n_k_heads", n_k_heads)
        self.d_model, self.n_heads, self.n_k_heads, self.chunk_size = d_model, n_heads, n_k_heads, chunk_size
        self.backend = backend
        self.head_dim, self.v_head_dim, self.gate, self.allow_neg_eigval = head_dim, v_head_dim, gate, allow_neg_eigval
        self.d_key, self.d_value = n_k_heads * head_dim, n_heads * v_head_dim
        self.d_qkv = 2 * self.d_key + self.d_value
        # One fused input projection: [q | k | v | z | β | a] (z with gate).
        self.in_proj = nn.Linear(d_model, self.d_qkv + (self.d_value if gate else 0) + 2 * n_heads, bias=False)
        self.conv = nn.Conv1d(self.d_qkv, self.d_qkv, conv_kernel, groups=self.d_qkv, bias=False)  # causal_conv's taps
        self.A_log = nn.Parameter(torch.empty(n_heads).uniform_(0.01, 16).log())
        dt = torch.exp(torch.empty(n_heads).uniform_(math.log(1e-3), math.log(1e-1)))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        self.norm = RMSNorm(v_head_dim, eps=norm_eps)
        self.out_proj = nn.Linear(self.d_value, d_model, bias=False)

    def forward(self, x: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        check_mixer_input(type(self).__name__, x, self.d_model, self.in_proj.weight, sequence=True)
        context = Context.for_input(type(self).__name__, x, context)
        x = context.zero_padding(x)  # padding puts nothing into the state (nor NaN, whatever it held)
        batch, T, _ = x.shape
        H, Hk, K, V = self.n_heads, self.n_k_heads, self.head_dim, self.v_head_dim
        qkv, z, b, a = self.in_proj(x).split([self.d_qkv, self.d_value if self.gate else 0, H, H], dim=-1)
        qkv = F.silu(causal_conv(self, self.conv, qkv, context.cache, context.document_ids))  # [b, T, d_qkv]
        q, k, v = qkv.split([self.d_key, self.d_key, self.d_value], dim=-1)
        q, k = (_unit(t.reshape(batch, T, Hk, K)).repeat_interleave(H // Hk, dim=2) for t in (q, k))  # [b, T, H, K]
        v = v.reshape(batch, T, H, V)  # [b, T, H, V]
        beta = torch.sigmoid(b) * (2.0 if self.allow_neg_eigval else 1.0)  # [b, T, H]
        g = -torch.exp(at_least_fp32(self.A_log)) * F.softplus(at_least_fp32(a) + self.dt_bias)  # [b, T, H], <= 0
        if context.padding_mask is not None:  # a padded position neither decays nor writes the state
            beta = beta.masked_fill(context.padding_mask[..., None], 0.0)
            g = g.masked_fill(context.padding_mask[..., None], 0.0)
        cached = context.cache.state(self) if context.cache is not None else None  # decoding: conv window, state
        if cached is None:
            y = gated_delta_rule(q, k, v, g, beta, chunk_size=self.chunk_size, document_starts=context.document_starts,
                                 backend=self.backend)
        elif T == 1 and "state" in cached:  # a decoding step: one token of the recurrence
            y, state = gated_delta_step(cached["state"], q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], scale=K ** -0.5)
            y = y[:, None]  # [b, 1, H, V]
        else:  # prefill, or several new tokens: the chunked form from the cached state
            y, state = gated_delta_rule(q, k, v, g, beta, chunk_size=self.chunk_size,
                                        initial_state=cached.get("state"), return_final_state=True,
                                        backend=self.backend)
        if cached is not None:
            context.cache.keep(self, "state", state, T)
        y = self.norm(y)  # [b, T, H, V], each head normalised over its V
        if self.gate:
            y = (at_least_fp32(y) * F.silu(at_least_fp32(z.reshape(batch, T, H, V)))).to(y.dtype)
        return self.out_proj(y.reshape(batch, T, self.d_value))

    def fused_row_blocks(self) -> dict[str, tuple[int, ...]]:
        """``in_proj`` fuses its projections along its rows: ``[q | k | v | z | β | a]`` (``z`` with ``gate``)."""
        gate = (self.d_value,) if self.gate else ()
        return {"in_proj.weight": (self.d_key, self.d_key, self.d_value, *gate, self.n_heads, self.n_heads)}

    def extra_flops_per_token(self, seq_len: int) -> float:
        """The chunked rule's products beyond the projections and the conv (:mod:`components.flops`)."""
        return gated_delta_flops_per_token(seq_len, min(self.chunk_size, REFERENCE_CHUNK), self.n_heads,
                                           self.head_dim, self.v_head_dim)

    def extra_repr(self) -> str:
        return (f"n_heads={self.n_heads}, n_k_heads={self.n_k_heads}, head_dim={self.head_dim}, "
                f"v_head_dim={self.v_head_dim}, conv_kernel={self.conv.kernel_size[0]}, gate={self.gate}, "
                f"chunk_size={self.chunk_size}" + (", allow_neg_eigval=True" if self.allow_neg_eigval else ""))


def _unit(t: torch.Tensor) -> torch.Tensor:
    """``t [..., K]`` scaled to unit length, as flash-linear-attention's ``l2norm``: ``t / sqrt(|t|² + 1e-6)``."""
    t32 = at_least_fp32(t)
    return (t32 * torch.rsqrt(t32.pow(2).sum(-1, keepdim=True) + 1e-6)).to(t.dtype)
