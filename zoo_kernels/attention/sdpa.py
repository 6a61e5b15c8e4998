"""Attention with a per-key bias through torch's fused SDPA, without a ``[T, S]`` mask.

A bias that depends only on the key is a dot product with a constant query component::

    scale · ⟨q_i, k_j⟩ + bias_j  =  ⟨[scale · q_i, 1], [k_j, bias_j]⟩

so appending a column of ones to the (pre-scaled) queries and the bias to the keys, and calling
``scaled_dot_product_attention`` with ``scale=1``, computes the biased scores inside the fused kernel,
in ``O(T)`` memory, with the bias's gradient coming back through the keys' extra column. Key padding
rides the same way, as a bias far below any score. Values get a zero column so q, k and v share
one head dim (the CPU flash kernel requires it); the output drops it.
"""

import torch
import torch.nn.functional as F

# Added to the bias of padded keys: exp(score - max) underflows to exactly 0 against any real score,
# yet stays finite, so no NaN reaches the backward (fp32 and bf16 share this range).
PADDED_KEY_BIAS = -1e30


def supports(q: torch.Tensor, T: int, S: int, causal: bool) -> bool:
    """Whether :func:`attention_bias_sdpa` computes this case: fp32/bf16/fp64 (fp16's range cannot hold
    the padding bias), and a causal mask SDPA can express (``T == S``, or one query after every key)."""
    return q.dtype in (torch.float32, torch.bfloat16, torch.float64) and (not causal or T == S or T == 1)


def attention_bias_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    bias: torch.Tensor | None,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """``q [B,H,T,D]``, ``k, v [B,H,S,D]`` (kv heads already repeated), ``bias [B,H,S]``,
    ``key_padding_mask [B,S]`` → ``[B,H,T,D]``; a query with no allowed key returns zeros.
    Call only where :func:`supports` holds."""
    B, H, T, D = q.shape
    S = k.shape[2]
    key_bias = k.new_zeros(B, H, S) if bias is None else bias.to(k.dtype)  # [B, H, S]
    if key_padding_mask is not None:
        key_bias = key_bias.masked_fill(key_padding_mask[:, None, :], PADDED_KEY_BIAS)
    q_aug = torch.cat([q * scale, q.new_ones(B, H, T, 1)], dim=-1)  # [B, H, T, D+1]
    k_aug = torch.cat([k, key_bias[..., None]], dim=-1)  # [B, H, S, D+1]
    v_aug = F.pad(v, (0, 1))  # [B, H, S, D+1], the extra column 0
    # `True if … else False`: compiled with dynamic shapes, `T > 1` is a SymBool, which SDPA rejects
    out = F.scaled_dot_product_attention(q_aug, k_aug, v_aug, is_causal=True if causal and T > 1 else False,
                                         scale=1.0)[..., :D]
    if key_padding_mask is None:
        return out  # every query sees at least itself (causal) or every key
    real = ~key_padding_mask  # [B, S]
    if causal and T > 1:  # query i (= key i) sees keys 0..i: empty while no real key has come
        empty = real.cumsum(dim=-1) == 0  # [B, T]
    else:
        empty = ~real.any(dim=-1, keepdim=True).expand(B, T)  # [B, T]
    return out.masked_fill(empty[:, None, :, None], 0.0)
