"""``attention``: softmax attention with an additive per-key bias (the dynamic mask), causal and
key-padding masks, grouped-query heads and an optional top-``w`` key window. See README.md."""

import torch

from zoo_kernels._backend import check_backend, resolve_backend
from zoo_kernels._finite import any_in_document, poison, seen_so_far, split_finite
from zoo_kernels.attention.reference import attention_reference, attention_weights, document_runs
from zoo_kernels.attention.sdpa import supports as sdpa_supports

__all__ = ["attention", "attention_reference", "attention_weights", "document_runs", "round_bias"]


def attention(
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
    backend: str = "auto",
    check_finite: bool = True,
) -> torch.Tensor:
    """Scaled-dot-product attention.

    Args:
        q: ``[B, T, H, D]`` queries.
        k, v: ``[B, S, H_kv, D]`` keys and values; ``H`` must be a multiple of ``H_kv`` (GQA).
        bias: ``[B, H, S]`` added to every query's score for key ``j`` (one value per head and key), rounded to
            ``q``'s dtype first, finite entries beyond its range clamped into it (:func:`round_bias`; the gradient
            comes back in the bias's own dtype).
        causal: query ``i`` sees keys ``j <= S - T + i`` (bottom-right aligned, so decoding works); needs ``S >= T``.
        key_padding_mask: ``[B, S]`` bool, True where the key is padding (never attended to).
        keep_window: keep, per query, only the ``keep_window`` allowed keys with the largest bias
            (ties to the most recent); the selection carries no gradient, the bias does.
        scale: score scale, default ``1/sqrt(D)``.
        document_ids: ``[B, T]`` integers (``S == T``): packed documents; query ``i`` sees key ``j`` only
            when both lie in the same document. A document is a run of equal ids: a later run that
            reuses an id is a new document, as for the SSD (whose state restarts wherever the id
            changes) and the positions. The reference writes the mask out; the Triton kernel compares
            run numbers per tile, and a ``keep_window`` is taken within each document.
        backend: ``auto`` | ``reference`` | ``triton``.
        check_finite: take non-finite keys, values and biases out and put their reach back as NaN (default
            True). False: the caller has done it — a decoding cache cleans each entry once, as it enters
            (:meth:`components.context.Context.attend`) — and a non-finite input here is undefined.

    Returns:
        ``[B, T, H, D]``. A query with no allowed key returns zeros.
    """
    check_backend(backend, "attention")
    _check_arguments(q, k, v, bias, key_padding_mask, keep_window, causal)
    if document_ids is not None:
        _check_documents(document_ids, q, k)
    if keep_window is not None and keep_window >= k.shape[1]:
        # no query has more than S allowed keys, so the window cuts none: plain attention, which on a GPU may be torch's
        # flash kernel (a Mistral's window of 4,096 over shorter sequences)
        keep_window = None
    # The bias in the activations' dtype, for every backend: the window's selection and the scores see the same values
    # whichever runs. Under mixed precision a model's bias is fp32 (made from fp32 parameters); read in fp32 by the
    # Triton kernels, the forward took 255 registers and spilled 688-824 bytes a thread at head dim 128 on sm_90 (225
    # and none in bf16), the decoding step 16 (compile_check, 2026-12-03).
    bias = round_bias(bias, q.dtype)
    # Non-finite keys, values or biases are taken out and their reach put back as NaN (zoo_kernels/_finite.py):
    # inside the kernels a masked key is multiplied by a zero probability, and 0 · NaN would reach every query.
    reach = None
    if check_finite:
        k, v, bias, reach = _take_out_nonfinite(q, k, v, bias, causal, key_padding_mask, document_ids)  # reach [B, T, H]
    chosen = resolve_backend(backend, q, op="attention", has_triton=True)
    if chosen == "triton" and backend == "auto" and _torch_sdpa_is_faster(q, k, bias, key_padding_mask, keep_window,
                                                                           document_ids, causal):
        chosen = "reference"
    if chosen == "triton":
        from zoo_kernels.attention.triton import attention_triton  # imports triton only when asked for

        y = attention_triton(q, k, v, bias=bias, causal=causal, key_padding_mask=key_padding_mask,
                             keep_window=keep_window, scale=scale, document_ids=document_ids)
    else:
        y = attention_reference(q, k, v, bias=bias, causal=causal, key_padding_mask=key_padding_mask,
                                keep_window=keep_window, scale=scale, document_ids=document_ids)
    return y if reach is None else poison(y, reach)


def round_bias(bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``bias`` (any shape) in ``dtype``, its finite entries clamped into ``dtype``'s range first, with the gradient
    of the unclamped values (straight through). Cast alone, an fp32 bias beyond fp16's 65504 — a large negative bias
    written as a soft mask, say — would round to ±inf, which :func:`attention` takes for a non-finite input (NaN for
    every query that sees it); clamped, it keeps its meaning: beyond ±65504 no other score competes with it. ``inf``
    and NaN are kept as they are. ``None`` stays ``None``."""
    if bias is None or bias.dtype == dtype:
        return bias
    limit = torch.finfo(dtype).max
    if bias.dtype.is_floating_point and torch.finfo(bias.dtype).max > limit:
        clamped = bias + (bias.clamp(-limit, limit) - bias).detach()  # NaN where bias is ±inf: not taken below
        bias = torch.where(bias.isfinite(), clamped, bias)
    return bias.to(dtype)


def _torch_sdpa_is_faster(q, k, bias, key_padding_mask, keep_window, document_ids, causal) -> bool:
    """Where ``auto`` on a GPU takes the reference because its route through torch's fused SDPA was timed faster than
    the Triton kernel (H100 and H200, bf16; docs/kernels.md): a decoding step (one query: the split-K kernel ran at
    0.55-1.01× SDPA's speed); no bias, padding, window or documents (plain flash attention, 2.9× the kernel's speed
    at D 64); a bias at head dims above 64 (the bias as an extra key column: 1.0× at T 4K, 1.18× at 8K, at 1.8× the
    kernel's memory). The kernel keeps a bias at D ≤ 64 (1.3× the route's speed at 4K), windows and documents."""
    T, S, D = q.shape[1], k.shape[1], q.shape[3]
    if T == 1:
        return True
    if keep_window is not None or document_ids is not None or not sdpa_supports(q, T, S, causal):
        return False
    return (bias is None and key_padding_mask is None) or D > 64


def _take_out_nonfinite(q, k, v, bias, causal, key_padding_mask, document_ids):
    """``k``, ``v``, ``bias`` with non-finite entries set to 0, and ``[B, T, H]``: True for a query that sees a
    key whose key, value or bias was non-finite (with a ``keep_window``, any allowed key, kept or not: a NaN
    bias leaves no well-defined window)."""
    B, T, H, _ = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    (k, bad_k), (v, bad_v) = split_finite(k, 1), split_finite(v, 1)
    bad = (bad_k | bad_v).repeat_interleave(H // Hkv, dim=2)  # [B, S, H]
    if bias is not None:
        bias, bad_bias = split_finite(bias, 0)
        bad = bad | bad_bias.transpose(1, 2)
    if key_padding_mask is not None:
        bad = bad & ~key_padding_mask[:, :, None]
    starts = None
    if document_ids is not None:
        runs = document_runs(document_ids)  # [B, T]
        starts = torch.cat([torch.ones_like(runs[:, :1], dtype=torch.bool), runs[:, 1:] != runs[:, :-1]], dim=1)
    if not causal:
        reach = any_in_document(bad, starts)[:, :T] if starts is not None else bad.any(1, keepdim=True).expand(B, T, H)
    else:
        reach = seen_so_far(bad, starts)[:, S - T:]  # query i sees the keys up to S - T + i
    return k, v, bias, reach


def _check_documents(document_ids, q, k) -> None:
    B, T = q.shape[:2]
    if tuple(document_ids.shape) != (B, T) or k.shape[1] != T:
        raise ValueError(f"attention: document_ids must be [B, T] = {(B, T)} with as many keys as queries; got "
                         f"{tuple(document_ids.shape)} and {k.shape[1]} keys")
    if document_ids.dtype.is_floating_point or document_ids.dtype == torch.bool:
        raise ValueError(f"attention: document_ids must be integers; got {document_ids.dtype}")


def _check_arguments(q, k, v, bias, key_padding_mask, keep_window, causal) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"attention: q, k, v must be [B, T, H, D]; got q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)}"
        )
    B, T, H, D = q.shape
    if k.shape != v.shape:
        raise ValueError(f"attention: k{tuple(k.shape)} and v{tuple(v.shape)} must have the same shape")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"attention: q, k and v must share one dtype; got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"attention: k{tuple(k.shape)} does not match q{tuple(q.shape)} in batch or head dim")
    S, Hkv = k.shape[1], k.shape[2]
    if H % Hkv != 0:
        raise ValueError(f"attention: query heads H={H} are not a multiple of key/value heads H_kv={Hkv}")
    if causal and S < T:  # bottom-right aligned, the first T - S queries would have no key
        raise ValueError(f"attention: causal attention needs at least as many keys as queries (the queries are the last "
                         f"T of the S keys' positions); got T={T} queries and S={S} keys")
    if bias is not None and tuple(bias.shape) != (B, H, S):
        raise ValueError(f"attention: bias must be [B, H, S] = {(B, H, S)}; got {tuple(bias.shape)}")
    if key_padding_mask is not None:
        if tuple(key_padding_mask.shape) != (B, S):
            raise ValueError(
                f"attention: key_padding_mask must be [B, S] = {(B, S)}; got {tuple(key_padding_mask.shape)}"
            )
        if key_padding_mask.dtype != torch.bool:
            raise ValueError(f"attention: key_padding_mask must be bool (True = padding); got {key_padding_mask.dtype}")
    if keep_window is not None and (not isinstance(keep_window, int) or keep_window < 1):
        raise ValueError(f"attention: keep_window={keep_window!r} must be an integer >= 1 (or None)")
