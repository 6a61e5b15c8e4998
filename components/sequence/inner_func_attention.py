"""InnerFuncAttention: attention whose value is an inner function of the input, with a dynamic mask."""

import torch
import torch.nn.functional as F
from torch import nn

from components._checks import check_choice, check_divisible, check_mixer_input, check_on_device, check_positive
from components.context import Context
from components.flops import attention_flops_per_token
from components.sequence.attention import QueryKeyPositions
from components.sequence.ssd import SSD
from kernels._backend import check_backend
from kernels.attention import attention

INNERS = ("linear", "retrieval", "ssd")
MASKS = ("content", "content_exp", "cheems", "position", "none")


class RetrievedValue(nn.Module):
    """Wonderful Matrices v2 §3.2's retrieval inner function, ``[..., d] → [..., d]``::

        g = (x W_vQ) θ_vKᵀ ∈ [..., n_values]      top-k of g → indices i_j, scores g_j
        V = x ⊙ Σ_j softmax(g_topk)_j E[i_j]       E ∈ [n_values, d]

    Weighting the retrieved rows by the softmax of their scores (as PEER does) gives ``W_vQ`` and
    ``θ_vK`` a gradient; the paper's listing sums them unweighted and leaves both untrained.
    """

    def __init__(self, d_model: int, *, n_values: int, d_retrieval: int, top_k: int):
        super().__init__()
        check_positive("InnerFuncAttention", n_values=n_values, d_retrieval=d_retrieval, top_k=top_k)
        if top_k > n_values:
            raise ValueError(f"InnerFuncAttention: top_k={top_k} exceeds n_values={n_values}")
        self.top_k = top_k
        self.query = nn.Linear(d_model, d_retrieval, bias=False)  # W_vQ
        self.keys = nn.Parameter(torch.randn(n_values, d_retrieval) / d_retrieval**0.5)  # θ_vK
        self.values = nn.Embedding(n_values, d_model)  # E

    def extra_flops_per_token(self, seq_len: int) -> int:
        """Scoring every value key, and mixing the ``top_k`` retrieved rows (:mod:`components.flops`)."""
        n_values, d_retrieval = self.keys.shape
        return 2 * d_retrieval * n_values + 2 * self.top_k * self.values.embedding_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.query(x) @ self.keys.T  # [..., n_values]
        top, index = scores.topk(self.top_k, dim=-1)  # [..., k] each
        weights = torch.softmax(top, dim=-1)  # [..., k]
        mixed = torch.einsum("...k,...kd->...d", weights, self.values(index))  # [..., d]
        return x * mixed


class InnerFuncAttention(nn.Module):
    """Causal attention with an inner-function value and a dynamic mask, ``[B,T,d] → [B,T,d]``.

    Q and K exactly as :class:`QCAttention` (GQA, RoPE or not, optional QK-norm). The value, by ``inner``:
        ``linear``    — ``V = x W_V`` (with ``mask="content"``, Doge's attention);
        ``retrieval`` — :class:`RetrievedValue` (Wonderful Matrices v2 §3.2);
        ``ssd``       — ``V = SSD(x)`` (Wonderful Matrices v1 §4.2), a selective recurrent summary.
    The dynamic mask, by ``mask``, an additive bias per head and key:
        ``content``  — ``bias[b,h,j] = A_h · softplus((V W_δ)[b,j,h])``, one ``A`` per query head,
                       initialised to 0 so training starts as plain attention;
        ``content_exp`` — ``bias[b,h,j] = exp(A_g · softplus((V W_δ)[b,j,g]))`` with one ``A`` (and one
                       δ) per key/value head ``g`` of query head ``h``: the released Doge models'
                       form (Hugging Face ``DogeAttention``); at ``A = 0`` the bias is 1 everywhere;
        ``cheems``   — ``bias[b,h,j] = exp(A_h · softplus((V W_δ)[b,j,h]))`` with one ``A`` per query head,
                       initialised to 1: the authors' Cheems code (WonderfulMatrices ``modeling_cheems``), without
                       its ratio threshold, which ranks every key of the sequence, the future ones included;
        ``position`` — ``bias[h,j] = θ[h, position_j]``, learned over ``max_position`` positions;
        ``none``     — causal and padding only.
    ``keep_window=w``: each query keeps only its ``w`` allowed keys with the largest bias.

    Args:
        d_model: model width.
        n_heads: query heads (default 8); ``d_model`` must be divisible by it.
        n_kv_heads: key heads (default ``n_heads``). The ``linear`` value has ``n_kv_heads`` heads; the
            ``retrieval`` and ``ssd`` values map ``d_model → d_model`` and so have ``n_heads`` heads,
            and the keys are repeated to match them.
        inner: ``linear`` | ``retrieval`` | ``ssd`` (default ``linear``).
        mask: ``content`` | ``content_exp`` | ``cheems`` | ``position`` | ``none`` (default ``content``).
        keep_window: at most this many keys per query (default None: all).
        n_values, d_retrieval, top_k: the retrieval value's table size, query width and top-k
            (defaults 2, ``d_model // 2``, 2; Wonderful Matrices v2 Table 6
            has 2 values. With ``top_k = 1`` the softmax of one score is 1 and the retrieval query and
            keys get no gradient, as in the paper's listing).
        max_position: positions the ``position`` mask covers (default 2048).
        rope, qk_norm, norm_eps: as :class:`QCAttention`.
        ssd: keyword arguments of the inner :class:`SSD` (default ``{}``: RoPE positions).
        backend: attention kernel, ``auto`` | ``reference`` | ``triton``.
    """

    def __init__(
        self,
        d_model: int,
        *,
        n_heads: int = 8,
        n_kv_heads: int | None = None,
        inner: str = "linear",
        mask: str = "content",
        keep_window: int | None = None,
        n_values: int = 2,
        d_retrieval: int | None = None,
        top_k: int = 2,
        max_position: int = 2048,
        ssd: dict | None = None,
        rope: bool = True,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        backend: str = "auto",
    ):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        check_choice("InnerFuncAttention", "inner", inner, INNERS)
        check_choice("InnerFuncAttention", "mask", mask, MASKS)
        check_backend(backend)
        check_positive("InnerFuncAttention", d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads,
                       max_position=max_position)
        check_divisible("InnerFuncAttention", "d_model", d_model, "n_heads", n_heads)
        check_divisible("InnerFuncAttention", "n_heads", n_heads, "n_kv_heads", n_kv_heads)
        if keep_window is not None and (not isinstance(keep_window, int) or keep_window < 1):
            raise ValueError(f"InnerFuncAttention: keep_window={keep_window!r} must be an integer >= 1 (or None)")
        self.head_dim = d_model // n_heads
        self.positions = QueryKeyPositions("InnerFuncAttention", self.head_dim, rope=rope, qk_norm=qk_norm,
                                           norm_eps=norm_eps)
        self.d_model, self.n_heads, self.n_kv_heads, self.inner, self.mask = d_model, n_heads, n_kv_heads, inner, mask
        self.keep_window, self.max_position, self.backend = keep_window, max_position, backend
        self.v_heads = n_kv_heads if inner == "linear" else n_heads

        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        if inner == "linear":
            self.value = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        elif inner == "retrieval":
            d_retrieval = d_model // 2 if d_retrieval is None else d_retrieval
            self.value = RetrievedValue(d_model, n_values=n_values, d_retrieval=d_retrieval, top_k=top_k)
        else:
            self.value = SSD(d_model, **(ssd or {}))
        if mask in ("content", "content_exp", "cheems"):
            n_bias = self.v_heads if mask == "content_exp" else n_heads  # one δ and A per kv / per query head
            self.delta_proj = nn.Linear(self.v_heads * self.head_dim, n_bias, bias=False)  # W_δ
            self.A = nn.Parameter(torch.ones(n_bias) if mask == "cheems" else torch.zeros(n_bias))
        elif mask == "position":
            self.position_bias = nn.Parameter(torch.zeros(n_heads, max_position))  # θ
        self.out_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)

    def forward(self, x: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        check_mixer_input(type(self).__name__, x, self.d_model, self.q_proj.weight, sequence=True)
        context = context or Context.default(x)
        x = context.zero_padding(x)
        batch, T, _ = x.shape
        q = self.q_proj(x).view(batch, T, self.n_heads, self.head_dim)  # [b, T, H, Dh]
        k = self.k_proj(x).view(batch, T, self.n_kv_heads, self.head_dim)  # [b, T, Hkv, Dh]
        v_flat = self.value(x, context) if self.inner == "ssd" else self.value(x)  # [b, T, v_heads·Dh]
        v = v_flat.view(batch, T, self.v_heads, self.head_dim)  # [b, T, Hv, Dh]
        q, k = self.positions(q, k, context)
        y = context.attend(self, q, k, v, bias=self.dynamic_bias(v_flat, context), keep_window=self.keep_window,
                           backend=self.backend)  # [b, T, H, Dh]
        return self.out_proj(y.reshape(batch, T, self.n_heads * self.head_dim))

    def dynamic_bias(self, v_flat: torch.Tensor, context: Context) -> torch.Tensor | None:
        """The additive key bias ``[B, H, T]`` of the chosen mask, or None."""
        if self.mask == "content":
            # heads-first before the softplus: with a transposed gradient, softplus_backward's real strides
            # differ from the ones aot_autograd traces, and the compiled backward fails on a view
            delta = self.delta_proj(v_flat).transpose(1, 2).contiguous()  # [b, T, H] → [b, H, T]
            return self.A[:, None] * F.softplus(delta)  # [b, H, T]
        if self.mask == "content_exp":
            delta = self.delta_proj(v_flat).transpose(1, 2).contiguous()  # [b, T, Hv] → [b, Hv, T], as above
            bias = torch.exp(self.A[:, None] * F.softplus(delta))  # [b, Hv, T]
            return bias.repeat_interleave(self.n_heads // self.v_heads, dim=1)  # [b, H, T]
        if self.mask == "cheems":
            delta = self.delta_proj(v_flat).transpose(1, 2).contiguous()  # [b, T, H] → [b, H, T], as above
            return torch.exp(self.A[:, None] * F.softplus(delta))  # [b, H, T]
        if self.mask == "position":
            if context.position_ids.numel():
                last = context.position_ids.max()
                rule = f"InnerFuncAttention: positions must lie below the position mask's max_position={self.max_position}"
                check_on_device(last < self.max_position, rule, sync=not self.training, message=lambda: (
                    f"InnerFuncAttention: position {int(last)} is past the position mask's max_position={self.max_position}"))
            return self.position_bias[:, context.position_ids].transpose(0, 1)  # [b, H, T]
        return None

    def extra_flops_per_token(self, seq_len: int) -> int:
        """Scores and weighted sum beyond the projections and the value's own work (:mod:`components.flops`)."""
        return attention_flops_per_token(seq_len, self.n_heads, self.head_dim)

    def extra_repr(self) -> str:
        return (f"inner={self.inner}, mask={self.mask}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
                f"keep_window={self.keep_window}")
