"""QCAttention: quadratic causal self-attention with grouped-query heads, RoPE and optional QK-norm."""

import torch
from torch import nn

from components._checks import check_divisible, check_flags, check_mixer_input, check_number, check_positive
from components.context import Context
from components.flops import attention_flops_per_token
from components.norm import RMSNorm
from components.rotary import apply_rotary
from zoo_kernels._backend import check_backend
from zoo_kernels.attention import attention_weights


QK_NORM_SPANS = ("head", "all_heads")
"""What a QK-norm normalises: each head's channels (one gain per head channel, shared by the heads; Doge's and Qwen3's)
or every head's together (one gain per channel of the projection; OLMo 2's)."""


class QueryKeyPositions(nn.Module):
    """What Q and K go through before the scores, shared by QCAttention and InnerFuncAttention:
    an optional RMSNorm (``qk_norm``) per head (Doge's attention; one gain per head channel, shared by
    the heads) or, with ``heads=(H, Hkv)``, over all the heads' channels together (OLMo 2's: the norm of the whole
    projection, a gain per channel), and then RoPE from the context's shared table (unless ``rope=False``, as Jamba's
    attention, which has no positional encoding) on the first ``rope_fraction`` of each head's channels
    (GPT-NeoX's partial rotary; Bamba rotates half); the others carry no position."""

    def __init__(self, owner: str, head_dim: int, *, rope: bool, qk_norm: bool, norm_eps: float,
                 rope_fraction: float = 1.0, heads: tuple[int, int] | None = None):
        super().__init__()
        check_flags(owner, rope=rope, qk_norm=qk_norm)
        check_number(owner, "rope_fraction", rope_fraction, low=0, above=True)
        if rope_fraction > 1:
            raise ValueError(f"{owner}: rope_fraction={rope_fraction!r} must be at most 1 (the share of a head RoPE turns)")
        rope_dim = head_dim * rope_fraction
        if rope and rope_fraction == 1 and head_dim % 2 != 0:
            raise ValueError(f"{owner}: head_dim = d_model / n_heads = {head_dim} must be even for RoPE")
        if rope and (rope_dim != int(rope_dim) or int(rope_dim) % 2 != 0):
            raise ValueError(f"{owner}: head_dim·rope_fraction = {head_dim}·{rope_fraction:g} = {rope_dim:g} must be an "
                             "even whole number of channels for RoPE")
        self.head_dim, self.rope, self.rope_fraction = head_dim, rope, rope_fraction
        self.rope_dim = int(rope_dim)
        q_width, k_width = (head_dim, head_dim) if heads is None else (heads[0] * head_dim, heads[1] * head_dim)
        self.norm_span = "head" if heads is None else "all_heads"
        self.q_norm = RMSNorm(q_width, eps=norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(k_width, eps=norm_eps) if qk_norm else None

    def forward(self, q: torch.Tensor, k: torch.Tensor, context: Context) -> tuple[torch.Tensor, torch.Tensor]:
        """``q [B,T,H,Dh]``, ``k [B,T,Hkv,Dh]`` → the same, normed and rotated."""
        if self.q_norm is not None and self.norm_span == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        elif self.q_norm is not None:  # over every head's channels: [B, T, H, Dh] → [B, T, H·Dh] → back
            q, k = self.q_norm(q.flatten(-2)).view_as(q), self.k_norm(k.flatten(-2)).view_as(k)
        if self.rope:
            cos, sin = context.rotary_tables(self.rope_dim)  # [B, T, rope_dim]
            q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        return q, k

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.rope_dim == self.head_dim:
            return apply_rotary(x, cos, sin)
        turned, kept = x.split([self.rope_dim, self.head_dim - self.rope_dim], dim=-1)  # [..., rope_dim], [..., rest]
        return torch.cat((apply_rotary(turned, cos, sin), kept), dim=-1)

    @property
    def rotary_dim(self) -> int | None:
        """The dimension of the rotary table this module reads (None: no RoPE)."""
        return self.rope_dim if self.rope else None

    def extra_repr(self) -> str:
        part = f", rope_fraction={self.rope_fraction:g}" if self.rope and self.rope_fraction != 1 else ""
        span = ", over all heads" if self.q_norm is not None and self.norm_span == "all_heads" else ""
        return f"rope={self.rope}{part}, qk_norm={self.q_norm is not None}{span}"


class QCAttention(nn.Module):
    """Causal multi-head self-attention, ``[B, T, d_model] → [B, T, d_model]``.

    Args:
        d_model: model width.
        n_heads: query heads (default 8); ``d_model`` must be divisible by it unless ``head_dim`` is given.
        n_kv_heads: key/value heads for grouped-query attention (default ``n_heads``); must divide
            ``n_heads``.
        head_dim: each head's width (default ``d_model / n_heads``). Another value decouples the heads from
            the width, as Qwen3's (``n_heads · head_dim`` need not be ``d_model``).
        rope: RoPE on Q and K over the head dim, from the context's shared table (default True; the
            head dim must then be even). False: no positional encoding (Jamba).
        qk_norm: RMSNorm on Q and K before RoPE (default False; Doge, Qwen3, OLMo 2).
        qk_norm_over: what that norm normalises (:data:`QK_NORM_SPANS`): ``"head"`` each head's channels, one gain per
            head channel shared by the heads (default; Doge, Qwen3), or ``"all_heads"`` the whole query (and key)
            projection, a gain per channel (OLMo 2, OLMo 3, OLMo-Hybrid).
        norm_eps: that norm's epsilon (default 1e-6).
        rope_fraction: the share of each head's channels RoPE turns, the first ones (default 1.0: all;
            Bamba 0.5, as GPT-NeoX's partial rotary); ``head_dim · rope_fraction`` must be even.
        sliding_window: each query sees only the last ``sliding_window`` keys, itself included (default None:
            every key; Mistral, Qwen3's windowed layers). Padding takes no place in the window; for a left-padded
            batch that is transformers' window, which counts positions. It is the attention's ``keep_window``
            without a bias (whose ties go to the most recent keys), so every backend and the decoding cache
            take it as they are.
        qkv_bias: a learned bias on the query, key and value projections, none on the output (default False;
            Qwen2's attention).
        output_gate: scale each head's output, channel by channel, by ``sigmoid(x W_g)`` of the token's own input
            before the output projection (default False). Qiu et al.'s gated attention, in Qwen3-Next: a
            head-specific non-linearity between the value and output projections that keeps heads from dumping
            weight on the first token. Its ``gate_proj`` has ``n_heads · head_dim`` rows (with ``qkv_bias``'s bias).
        backend: attention kernel, ``auto`` | ``reference`` | ``triton``.
    """

    mixer_slot = "sequence"  # the block slot it fills; a pattern placing it in the other is refused

    def __init__(self, d_model: int, *, n_heads: int = 8, n_kv_heads: int | None = None, head_dim: int | None = None,
                 rope: bool = True, qk_norm: bool = False, qk_norm_over: str = "head", norm_eps: float = 1e-6,
                 rope_fraction: float = 1.0, sliding_window: int | None = None, qkv_bias: bool = False, output_gate: bool = False,
                 backend: str = "auto"):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        check_positive("QCAttention", d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads)
        if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(sliding_window, int)
                                           or sliding_window < 1):
            raise ValueError(f"QCAttention: sliding_window={sliding_window!r} must be an integer >= 1 (or None: "
                             "every key)")
        if head_dim is None:
            check_divisible("QCAttention", "d_model", d_model, "n_heads", n_heads)
            head_dim = d_model // n_heads
        else:
            check_positive("QCAttention", head_dim=head_dim)
            if rope and rope_fraction == 1 and head_dim % 2:
                raise ValueError(f"QCAttention: head_dim={head_dim} must be even for RoPE")
        check_divisible("QCAttention", "n_heads", n_heads, "n_kv_heads", n_kv_heads)
        check_backend(backend, "QCAttention")
        if qk_norm_over not in QK_NORM_SPANS:
            raise ValueError(f"QCAttention: qk_norm_over={qk_norm_over!r} is not one of {', '.join(QK_NORM_SPANS)}")
        if qk_norm_over != "head" and qk_norm is not True:
            raise ValueError(f"QCAttention: qk_norm_over={qk_norm_over!r} says what a QK-norm spans, and qk_norm is "
                             f"{qk_norm!r}: set qk_norm=True")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.positions = QueryKeyPositions("QCAttention", head_dim, rope=rope, qk_norm=qk_norm, norm_eps=norm_eps,
                                           rope_fraction=rope_fraction,
                                           heads=(n_heads, n_kv_heads) if qk_norm_over == "all_heads" else None)
        self.d_model, self.sliding_window, self.backend = d_model, sliding_window, backend
        check_flags("QCAttention", qkv_bias=qkv_bias, output_gate=output_gate)
        self.qkv_bias = qkv_bias
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=qkv_bias)
        self.kv_proj = nn.Linear(d_model, 2 * n_kv_heads * head_dim, bias=qkv_bias)  # rows [keys | values]
        self.gate_proj = nn.Linear(d_model, n_heads * head_dim, bias=qkv_bias) if output_gate else None
        self.out_proj = nn.Linear(n_heads * head_dim, d_model, bias=False)

    def forward(self, x: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        check_mixer_input(type(self).__name__, x, self.d_model, self.q_proj.weight, sequence=True)
        context = Context.for_input(type(self).__name__, x, context)
        x = context.zero_padding(x)
        B, T, _ = x.shape
        q, k, v = self._queries_keys_values(x, context)
        y = context.attend(self, q, k, v, keep_window=self.sliding_window, backend=self.backend)  # [B, T, H, Dh]
        y = y.reshape(B, T, self.n_heads * self.head_dim)  # [B, T, H·Dh]
        if self.gate_proj is not None:
            y = y * torch.sigmoid(self.gate_proj(x))
        return self.out_proj(y)  # [B, T, d_model]

    @property
    def qk_norm_over(self) -> str:
        """What the QK-norm spans (``"head"`` or ``"all_heads"``), as its module holds it."""
        return self.positions.norm_span

    def _queries_keys_values(self, x: torch.Tensor, context: Context) -> tuple[torch.Tensor, ...]:
        """``x [B, T, d_model]`` (padding zeroed) → ``q [B, T, H, Dh]``, ``k, v [B, T, Hkv, Dh]``, q and k positioned."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)  # [B, T, H, Dh]
        k, v = self.kv_proj(x).view(B, T, 2, self.n_kv_heads, self.head_dim).unbind(2)  # 2 × [B, T, Hkv, Dh]
        q, k = self.positions(q, k, context)
        return q, k, v

    def attention_weights(self, x: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        """The weights each head's queries give the keys, ``[B, H, T, T]``, for the input ``x [B, T, d_model]`` that
        :meth:`forward` would take with ``context`` (its padding, documents and window): what the attention averages
        the values with, before the output gate. For analysis (the first token's share, where a head looks), in plain
        torch whatever the backend; not for decoding with a cache."""
        check_mixer_input(type(self).__name__, x, self.d_model, self.q_proj.weight, sequence=True)
        context = Context.for_input(type(self).__name__, x, context)
        if context.cache is not None:
            raise ValueError("QCAttention.attention_weights: a context with a cache (decoding) is not supported; give "
                             "the whole sequence")
        q, k, _ = self._queries_keys_values(context.zero_padding(x), context)
        return attention_weights(q, k, key_padding_mask=context.padding_mask, keep_window=self.sliding_window,
                                 document_ids=context.document_ids)

    def fused_row_blocks(self) -> dict[str, tuple[int, ...]]:
        """``kv_proj`` fuses the key and the value projections along its rows, keys first."""
        width = self.n_kv_heads * self.head_dim
        return {"kv_proj.weight": (width, width)}

    def extra_flops_per_token(self, seq_len: int) -> int:
        """Scores and weighted sum beyond the projections (:mod:`components.flops`); a window's worth of keys at most."""
        return attention_flops_per_token(min(seq_len, self.sliding_window or seq_len), self.n_heads, self.head_dim)

    def extra_repr(self) -> str:
        window = f", sliding_window={self.sliding_window}" if self.sliding_window is not None else ""
        bias = ", qkv_bias=True" if self.qkv_bias else ""
        gate = ", output_gate=True" if self.gate_proj is not None else ""
        return f"n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}{window}{bias}{gate}"
