"""``keep_window`` for the flash kernel: one threshold per query instead of a ``[T, S]`` selection.

Order the keys by ``(bias, position)``, larger first: a larger bias wins, and among equal biases the
more recent key wins (the reference's tie-break). Query ``i`` keeps its ``w`` best allowed keys, so
it keeps key ``j`` exactly when ``j`` is allowed and ``(bias_j, j) ⪰ τ_i``, the ``w``-th best allowed
pair of that query. The kernel then needs two numbers per query, ``τ_i = (bias, position)``, and tests
``bias_j > τ_bias or (bias_j == τ_bias and j >= τ_pos)`` beside its causal and padding masks. A query
with fewer than ``w`` allowed keys keeps them all: ``τ = (-inf, -1)``.

Causal queries see a growing prefix of the keys, so the ``w`` best of query ``i`` are among the ``w``
best keys before its block and the keys inside its block. Walking the queries in blocks of
``block`` and carrying those ``w`` best keys keeps the memory at ``O(B·H·block·(w + block))`` instead
of ``O(B·H·T·S)``. Biases are compared in fp32, exactly as the kernel loads them.

Packed documents (run numbers, non-decreasing): a query's allowed keys are also those of its own
document, and a document that reaches past a block continues in the next one, so the carried keys are
the ``w`` best of the document the block ends in; a document that starts later starts from nothing.
Without causality every query of a document has the same allowed set, its document's real keys, and
the thresholds are taken over all ``S`` candidates per block of queries (``O(B·H·block·S)``).
"""

import torch


def _best_first(score: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort ``[..., n]`` candidates by ``(score, pos)`` descending; returns (score, pos) sorted."""
    by_pos = torch.argsort(pos, dim=-1, descending=True)  # newest first, so the stable sort below breaks ties to it
    score, pos = score.gather(-1, by_pos), pos.gather(-1, by_pos)
    by_score = torch.sort(score, dim=-1, descending=True, stable=True).indices
    return score.gather(-1, by_score), pos.gather(-1, by_score)


def _wth_best(score: torch.Tensor, pos: torch.Tensor, allowed: torch.Tensor, w: int):
    """Per row of ``[..., n]`` candidates, the ``w``-th best allowed ``(score, pos)``, or ``(-inf, -1)``
    (keep all) when fewer than ``w`` are allowed. Exactly ``w`` must still give the ``w``-th: the
    carried candidates are a truncation, so the query may have more allowed keys than it sees here."""
    score = score.masked_fill(~allowed, float("-inf"))
    pos = pos.masked_fill(~allowed, -1)  # disallowed candidates sort last among the -inf scores
    s, p = _best_first(score, pos)
    enough = allowed.sum(-1) >= w
    w_idx = min(w, s.shape[-1]) - 1
    tau_bias = torch.where(enough, s[..., w_idx], float("-inf"))
    tau_pos = torch.where(enough, p[..., w_idx], -1)
    return tau_bias, tau_pos


def window_thresholds(
    bias: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    *,
    batch: int,
    heads: int,
    T: int,
    S: int,
    causal: bool,
    keep_window: int,
    device: torch.device,
    document_ids: torch.Tensor | None = None,
    block: int = 128,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Thresholds ``(τ_bias [B, H, T] fp32, τ_pos [B, H, T] int32)`` of the module docstring.

    ``bias [B, H, S]`` or None (every key ties: the window is the ``w`` most recent allowed keys);
    ``key_padding_mask [B, S]`` True at padding; causal alignment is bottom-right, as in the kernel;
    ``document_ids [B, T]`` run numbers (``S == T``, :func:`zoo_kernels.attention.document_runs`) or None.
    """
    w = keep_window
    score = (bias.detach().float() if bias is not None
             else torch.zeros(batch, heads, S, device=device))  # [B, H, S]
    real = torch.ones(batch, 1, S, dtype=torch.bool, device=device) if key_padding_mask is None else (
        ~key_padding_mask[:, None, :])  # [B, 1, S]
    pos = torch.arange(S, device=device).expand(batch, heads, S)  # [B, H, S]
    doc = (torch.zeros(batch, 1, S, dtype=torch.long, device=device) if document_ids is None
           else document_ids[:, None, :].long())  # [B, 1, S]; without documents, one for every key
    if not causal and document_ids is None:  # one allowed set for every query
        tau_bias, tau_pos = _wth_best(score, pos, real.expand(batch, heads, S), w)  # [B, H]
        return (tau_bias[..., None].expand(batch, heads, T).contiguous(),
                tau_pos[..., None].expand(batch, heads, T).to(torch.int32).contiguous())

    tau_bias = torch.empty(batch, heads, T, device=device)
    tau_pos = torch.empty(batch, heads, T, dtype=torch.int32, device=device)
    if not causal:  # documents: each query's allowed set is its document's real keys, all S candidates
        for t0 in range(0, T, block):
            t1 = min(t0 + block, T)
            allowed = real[:, :, None, :] & (doc[:, :, None, :] == doc[:, :, t0:t1, None])  # [B, 1, t, S]
            tb, tp = _wth_best(score[:, :, None, :].expand(-1, -1, t1 - t0, S),
                               pos[:, :, None, :].expand(-1, -1, t1 - t0, S),
                               allowed.expand(batch, heads, t1 - t0, S), w)  # [B, H, t]
            tau_bias[..., t0:t1], tau_pos[..., t0:t1] = tb, tp.to(torch.int32)
        return tau_bias, tau_pos
    # Keys before the first query's own position are visible to every query: start from their w best.
    start = S - T
    keep_score, keep_pos = _best_first(score[..., :start].masked_fill(~real[..., :start], float("-inf")),
                                       pos[..., :start].masked_fill(~real[..., :start], -1))
    keep_score, keep_pos = keep_score[..., :w], keep_pos[..., :w]  # [B, H, ≤w] the carried best keys
    for t0 in range(0, T, block):
        t1 = min(t0 + block, T)
        new = slice(start + t0, start + t1)  # the keys of this block's own positions
        cand_score = torch.cat([keep_score, score[..., new]], dim=-1)  # [B, H, n]
        cand_pos = torch.cat([keep_pos, pos[..., new]], dim=-1)  # [B, H, n]
        cand_real = cand_pos >= 0
        cand_real[..., keep_pos.shape[-1]:] &= real[..., new]
        cand_doc = doc.expand(batch, heads, S).gather(-1, cand_pos.clamp(min=0))  # [B, H, n]
        q_pos = torch.arange(start + t0, start + t1, device=device)  # [t]
        allowed = (cand_real[:, :, None, :] & (cand_pos[:, :, None, :] <= q_pos[:, None])
                   & (cand_doc[:, :, None, :] == doc[..., new, None]))  # [B, H, t, n]
        n = cand_score.shape[-1]
        tb, tp = _wth_best(cand_score[:, :, None, :].expand(-1, -1, t1 - t0, n),
                           cand_pos[:, :, None, :].expand(-1, -1, t1 - t0, n), allowed, w)  # [B, H, t]
        tau_bias[..., t0:t1], tau_pos[..., t0:t1] = tb, tp.to(torch.int32)
        # Carry the w best real keys up to this block's last position, of the document it ends in.
        carry = cand_real & (cand_doc == doc[..., start + t1 - 1:start + t1])  # [B, H, n]
        s, p = _best_first(cand_score.masked_fill(~carry, float("-inf")), cand_pos.masked_fill(~carry, -1))
        keep_score, keep_pos = s[..., :w], p[..., :w]
    return tau_bias, tau_pos

