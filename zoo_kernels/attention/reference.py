"""Plain-torch attention with an additive per-key bias: the default on CPU, and the tests' oracle.

Four paths, by what the call needs:
- nothing to mask beyond causality: torch's SDPA as it is;
- a per-key bias and/or key padding: the bias rides in an extra head dimension through the fused SDPA
  (:mod:`zoo_kernels.attention.sdpa`), ``O(T)`` memory;
- a sliding window (a ``keep_window`` without a bias or padding, causal, ``T == S``, documents or not): a block of
  ``w`` queries at a time against its own block of keys and the one before, ``O(T·w)`` (:func:`sliding_window_blocks`);
- another ``keep_window`` that can cut keys (``S > w``), a causal ``T < S`` with several queries, or fp16:
  the ``[B, H, T, S]`` additive mask written out (:func:`attention_masked`), quadratic memory, the most
  readable form of the math. The math is in README.md beside this file.
"""

import contextlib
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from zoo_kernels.attention.sdpa import attention_bias_sdpa, supports


def allowed_keys(
    T: int,
    S: int,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor:
    """Boolean ``[B or 1, 1, T, S]``: may query i look at key j (before any window)?

    Causal alignment is bottom-right: query i sits at key position ``S - T + i``, so a decoding step
    (``T=1``) sees every cached key.
    """
    allowed = torch.ones(1, 1, T, S, dtype=torch.bool, device=device)
    if causal:
        q_pos = torch.arange(T, device=device)[:, None] + (S - T)  # [T, 1]
        k_pos = torch.arange(S, device=device)[None, :]  # [1, S]
        allowed = allowed & (k_pos <= q_pos)
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, None, :]  # [B, 1, 1, S]
    return allowed


def document_runs(document_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` ids → ``[B, T]`` run numbers 0, 1, … (non-decreasing): a new number wherever the id
    changes, so ``[7, 7, 3, 7]`` is three documents, not two."""
    changes = document_ids[:, 1:] != document_ids[:, :-1]  # [B, T-1]
    return torch.cat([torch.zeros_like(document_ids[:, :1]), changes.cumsum(1).to(document_ids.dtype)], dim=1)


def select_window(allowed: torch.Tensor, bias: torch.Tensor | None, keep_window: int) -> torch.Tensor:
    """Keep, per query, at most ``keep_window`` allowed keys: those with the largest bias, ties going to
    the most recent key. No gradient flows through the selection.

    allowed: ``[B|1, 1|H, T, S]`` bool; bias: ``[B, H, S]`` or None → ``[B|1, H|1, T, S]`` bool.
    """
    S = allowed.shape[-1]
    if bias is None:  # every tie: the most recent keys, those with at most keep_window allowed keys from them on
        return allowed & (allowed.flip(-1).cumsum(-1).flip(-1) <= keep_window)
    score = torch.zeros(allowed.shape, device=allowed.device) + bias.detach()[:, :, None, :]  # [B, H, T, S]
    # A stable sort on the bias of keys laid out newest-first gives exactly "largest bias, then most
    # recent" — recency is the tie-break.
    score = score.masked_fill(~allowed, float("-inf")).flip(-1)  # newest key first
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices  # [.., T, S]
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(S, device=order.device).expand_as(order))
    keep = (rank < keep_window).flip(-1)  # back to oldest-first key order
    return allowed & keep


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    causal: bool = True,
    key_padding_mask: torch.Tensor | None = None,
    keep_window: int | None = None,
    scale: float | None = None,
    document_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """q ``[B,T,H,D]``, k/v ``[B,S,Hkv,D]``, bias ``[B,H,S]``, document_ids ``[B,T]`` (``S == T``) →
    ``[B,T,H,D]`` (arguments pre-checked).

    A query with no allowed key (all its keys padded) returns zeros rather than NaN.
    """
    B, T, H, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    # Grouped-query attention: query head h reads kv head h // (H / Hkv).
    if Hkv != H:
        k = k.repeat_interleave(H // Hkv, dim=2)  # [B, S, H, D]
        v = v.repeat_interleave(H // Hkv, dim=2)  # [B, S, H, D]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T|S, D]

    if keep_window is not None and keep_window >= S:
        keep_window = None  # every query already has at most S ≥ w allowed keys: the window cuts nothing
    if keep_window is not None and bias is None and key_padding_mask is None and causal and T == S:
        runs = document_runs(document_ids) if document_ids is not None else None  # [B, T]
        return sliding_window_blocks(q, k, v, window=keep_window, scale=scale, document_ids=runs).transpose(1, 2)
    if document_ids is not None:  # packed documents: a block-diagonal mask, written out
        runs = document_runs(document_ids)  # [B, T] a new number wherever the id changes
        return attention_masked(q, k, v, bias=bias, causal=causal, key_padding_mask=key_padding_mask,
                                keep_window=keep_window, scale=scale, document_ids=runs).transpose(1, 2)
    if bias is None and key_padding_mask is None and keep_window is None:
        # Nothing to materialise. torch's causal flag aligns top-left, so only for T == S; a single
        # query (a decoding step) sits after every key, so it needs no causal mask at all.
        if not causal or T == S or T == 1:
            # `True if … else False`: compiled with dynamic shapes, `T > 1` is a SymBool, which SDPA rejects
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True if causal and T > 1 else False,
                                                 scale=scale)
            return out.transpose(1, 2)  # [B, T, H, D]
    if T == 1 and keep_window is None:
        # One query (a decoding step): its [B, H, 1, S] mask costs O(S), less than the bias column's copy of every key.
        return attention_masked(q, k, v, bias=bias, causal=causal, key_padding_mask=key_padding_mask,
                                keep_window=None, scale=scale).transpose(1, 2)  # [B, 1, H, D]
    if keep_window is None and supports(q, T, S, causal):
        out = attention_bias_sdpa(q, k, v, bias=bias, causal=causal, key_padding_mask=key_padding_mask, scale=scale)
        return out.transpose(1, 2)  # [B, T, H, D]
    return attention_masked(q, k, v, bias=bias, causal=causal, key_padding_mask=key_padding_mask,
                            keep_window=keep_window, scale=scale).transpose(1, 2)  # [B, T, H, D]


def sliding_window_blocks(q, k, v, *, window: int, scale: float, document_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention over each query's last ``window`` keys, itself included: ``q, k, v [B, H, T, D]`` (as many keys
    as queries, the keys' heads repeated to the queries') → ``[B, H, T, D]``; ``document_ids [B, T]`` run numbers keep
    each query within its document. The queries go in blocks of ``window``: every key a query of block ``b`` may see
    lies in block ``b`` or ``b - 1``, so each block attends to those ``2·window`` keys under a ``[window, 2·window]``
    band mask — ``O(T·window)`` time and memory where the written-out mask is ``O(T²)``."""
    B, H, T, D = q.shape
    w = window
    n = -(-T // w)  # blocks of queries
    tail = n * w - T  # zero rows after the last query, which no real query sees (causal)
    q, k, v = (F.pad(t, (0, 0, 0, tail)) for t in (q, k, v))  # [B, H, n·w, D]

    def blocks(t: torch.Tensor) -> torch.Tensor:  # [B, H, n·w, D] → [B·n, H, w, D]: each block a batch entry
        return t.reshape(B, H, n, w, D).transpose(1, 2).reshape(B * n, H, w, D)

    def with_previous(t: torch.Tensor) -> torch.Tensor:  # [B, H, n·w, D] → [B·n, H, 2w, D]: block b-1, then block b
        before = F.pad(t, (0, 0, w, 0))[:, :, :n * w]  # [B, H, n·w, D] shifted by a block (zeros before the first)
        return torch.cat([blocks(before), blocks(t)], dim=2)

    i = torch.arange(w, device=q.device)[:, None]  # query i of a block sits at key w + i of its 2w keys
    j = torch.arange(2 * w, device=q.device)[None, :]
    allowed = (j <= i + w) & (j > i)  # [w, 2w]: causal, and fewer than w keys back
    allowed = allowed.expand(n, w, 2 * w).clone()
    allowed[0, :, :w] = False  # the first block has no block before it
    if document_ids is not None:
        runs = F.pad(document_ids, (0, tail), value=-1)  # [B, n·w]
        runs_k = torch.cat([F.pad(runs, (w, 0), value=-2)[:, :n * w].view(B, n, w), runs.view(B, n, w)], dim=2)
        allowed = allowed & (runs.view(B, n, w)[..., None] == runs_k[:, :, None, :])  # [B, n, w, 2w]
    allowed = allowed.expand(B, n, w, 2 * w).reshape(B * n, 1, w, 2 * w)  # (one mask for every head)
    # four dimensions, the blocks as batch entries: a CPU runs torch's flash kernel with the mask, whose float copy is
    # then [B·n, 1, w, 2w], not one per head (five dimensions ran the math kernel)
    out = F.scaled_dot_product_attention(blocks(q), with_previous(k), with_previous(v), attn_mask=allowed,
                                         scale=scale)  # [B·n, H, w, D]
    return out.view(B, n, H, w, D).transpose(1, 2).reshape(B, H, n * w, D)[:, :, :T]


def fused_backward_fails(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether torch's fused SDPA would fail this masked call's backward: on CUDA, with only the float mask (the bias)
    wanting a gradient, the memory-efficient kernel CUDA takes for a float mask keeps no log-sum-exp fit for its
    backward — "LSE is not correctly aligned (strideH)" for one query, an illegal memory access at T 9 in fp16
    (torch 2.11, H200, 2026-12-04)."""
    return (q.device.type == "cuda" and torch.is_grad_enabled() and mask.requires_grad
            and not any(t.requires_grad for t in (q, k, v)))


def masked_keys(q, k, *, bias, causal, key_padding_mask, keep_window, document_ids=None) -> torch.Tensor:
    """Boolean ``[B|1, H|1, T, S]``: may query i attend to key j — causal, not padding, in its document (run numbers
    ``document_ids [B, T]``), within the kept window (the keys of largest bias where there is one)."""
    T, S = q.shape[2], k.shape[2]
    allowed = allowed_keys(T, S, causal=causal, key_padding_mask=key_padding_mask, device=q.device)
    if document_ids is not None:
        allowed = allowed & (document_ids[:, None, :, None] == document_ids[:, None, None, :])  # [B, 1, T, S]
    if keep_window is not None:
        allowed = select_window(allowed, bias, keep_window)
    return allowed


def attention_weights(q, k, *, bias=None, causal=True, key_padding_mask=None, keep_window=None, scale=None,
                      document_ids=None) -> torch.Tensor:
    """The softmax weights each query gives each key, ``[B, H, T, S]`` from ``q [B, T, H, D]``, ``k [B, S, Hkv, D]``
    (query head h reads key head h // (H / Hkv)), with :func:`attention_reference`'s masks: the weights its output
    averages the values with. A query with no allowed key has all-zero weights. For looking at attention (which keys a
    head reads, the first token's share), not for training: it holds all ``T × S`` of them."""
    H, Hkv = q.shape[2], k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    q, k = q.transpose(1, 2), k.repeat_interleave(H // Hkv, dim=2).transpose(1, 2)  # [B, H, T|S, D]
    runs = document_runs(document_ids) if document_ids is not None else None
    allowed = masked_keys(q, k, bias=bias, causal=causal, key_padding_mask=key_padding_mask, keep_window=keep_window,
                          document_ids=runs)
    exact = torch.promote_types(q.dtype, torch.float32)  # (half inputs: their softmax in fp32)
    scores = (q @ k.transpose(-1, -2)).to(exact) * scale  # [B, H, T, S]
    if bias is not None:
        scores = scores + bias[:, :, None, :].to(exact)
    empty = ~allowed.any(-1, keepdim=True)  # [B|1, H|1, T, 1] queries with nothing to attend to
    weights = torch.softmax(scores.masked_fill(~(allowed | empty), float("-inf")), dim=-1)
    return weights.masked_fill(empty, 0.0).to(q.dtype)  # (a NaN in q or k stays NaN: nothing is cleaned up)


def attention_masked(q, k, v, *, bias, causal, key_padding_mask, keep_window, scale, document_ids=None) -> torch.Tensor:
    """The math with the ``[B, H, T, S]`` mask written out: ``q [B,H,T,D]``, ``k, v [B,H,S,D]`` →
    ``[B,H,T,D]``; ``document_ids [B, T]`` (``S == T``) keeps each query within its document."""
    allowed = masked_keys(q, k, bias=bias, causal=causal, key_padding_mask=key_padding_mask, keep_window=keep_window,
                          document_ids=document_ids)
    empty = ~allowed.any(-1, keepdim=True)  # [B|1, H|1, T, 1] queries with nothing to attend to
    allowed = allowed | empty  # avoid NaN from an all -inf row; zeroed below
    mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill(~allowed, float("-inf"))
    if bias is not None:
        mask = mask + bias[:, :, None, :].to(q.dtype)  # [B, H, T, S]
    # the mask is [T, S] already: the math backend's scores cost no more
    with sdpa_kernel(SDPBackend.MATH) if fused_backward_fails(q, k, v, mask) else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # [B, H, T, D]
    return out.masked_fill(empty, 0.0)
