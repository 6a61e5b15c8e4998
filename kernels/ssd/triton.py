"""Triton SSD scan (Mamba-2), forward and backward, accumulating in fp32.

Notation of reference.py. Per (batch, head) and chunk ``c`` of ``L`` positions, ``Λ_l = a_1 + … + a_l``
is the chunk-local cumulative log-decay (``a_t = dt_t A``) and ``α_c = Λ_L`` the chunk's total.

Forward, three kernels:

1. ``_chunk_state``  ``S_c = Σ_m exp(α_c − Λ_m) dt_m x_m ⊗ B_m``                  ``[P, N]`` per chunk
2. ``_decayed_scan`` ``E_0 = initial state``, ``E_{c+1} = exp(α_c) E_c + S_c``        (``E_nc``: final state)
3. ``_chunk_scan``   ``y_l = Σ_{m≤l} (C_l·B_m) exp(Λ_l − Λ_m) dt_m x_m + exp(Λ_l) E_c C_l + D x_l``

Backward, the same kernels with other operands, and four more (with ``shared_scores``, ``dC`` and ``dB`` come instead
from ``_group_pair_grads`` and ``_group_bc_grads``, per group; see ``launch_config``):

1. ``_chunk_state`` on ``(dy, C)`` with weights ``exp(Λ_l)``: what the read-outs send to ``E_c``.
2. ``_decayed_scan`` run backwards: ``G_nc = d final``, ``G_c = exp(α_c) G_{c+1} + (1.)``, so
   ``dE_c = G_c``, ``dS_c = G_{c+1}`` and ``d initial = G_0``.
3. ``_chunk_scan`` on ``(dy, x, B)``: ``dC_l = Σ_{m≤l} (dy_l·x_m) exp(Λ_l − Λ_m) dt_m B_m + exp(Λ_l) dy_l E_c``.
4. ``_chunk_scan_reverse``, its transpose, per source position ``m`` streaming the ``l ≥ m``: on
   ``(B, C, dy)`` the gradient of ``dt_m x_m`` (hence ``dx`` and ``⟨x_m, d(dt x)_m⟩`` for ``d dt``), on
   ``(x, dy, C)`` ``dB_m`` per head.
5. The log-decays: each ``a_k`` enters the decays of the pairs ``m < k ≤ l`` of its chunk, the read-outs of the
   entering state at ``l ≥ k``, the shares of the final state from ``m < k``, and the carry;
   ``_log_decay_pairs``, the row dots of the ``dC`` and ``dB`` kernels (3, 4) and ``_state_dots`` sum those terms
   directly (the reverse cumulative sum of ``∂/∂Λ_l`` adds and subtracts every pair term, which mamba_ssm dropped as
   unstable), with no ``[L, L]`` tensor. Then ``d dt = A da + ⟨x, d(dt x)⟩`` and ``dA = Σ dt da``.

Packed documents (``document_starts``): ``SEG [b, T]`` int32 numbers each position's document (the
cumulative count of starts, so the initial state belongs to document 0, before any start). A decayed
term ``exp(Λ_l − Λ_m)`` counts only when ``SEG_l = SEG_m``; a read-out of the state entering chunk
``c`` only when ``SEG_l`` is the document of position ``cL − 1``; a row's share of its chunk's final
state only when it is in the chunk's last document; and ``exp(α_c)`` carries a state across chunk
``c`` only when no document starts inside it. These are masks on the same terms, never ``−∞`` in a
difference of cumulative sums, and every masked term keeps its factor ``exp(±Λ)``, so the log-decay
gradients below hold unchanged (a term that is masked out contributes to neither side).

Any ``T``: rows past ``T`` load as zero with ``dt = 0``, which contributes nothing, and the log-decays
are padded with ``a = 0``. Groups: ``B``/``C`` rows are read at group ``h // (H / G)``; their
gradients are written per head and summed over each group afterwards (no atomics, deterministic).
Dot products take the inputs' dtype; fp32 tiles (fp32 inputs, and the state read-outs for every dtype)
are multiplied as torch multiplies fp32 matrices: full fp32 by default, TF32 after
``torch.set_float32_matmul_precision("high")`` (``kernels._backend.dot_precision``).
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._backend import dot_precision, unit_stride_last


@triton.jit
def _rows(ptr, b, c, L, s_b, s_t, s_h, head, offs, offs_d):
    """Pointers to rows ``cL + offs`` of a ``[batch, T, n_heads, dim]`` tensor at (b, head), with strides ``s_b, s_t,
    s_h`` and 1 along ``dim`` (a view of a wider projection is read in place).

    The chunk's base offset is computed in 64 bits: it passes 2^31 once B·T·H·dim does (about 210K
    tokens at Mamba-2 2.7B's sizes). The offsets inside the chunk stay 32-bit, which keeps the tiles'
    index registers narrow (64-bit tile offsets spill on sm_90: recipes.benchmarks.compile_check)."""
    base = b.to(tl.int64) * s_b + (c * L).to(tl.int64) * s_t + head * s_h
    return ptr + base + (offs[:, None] * s_t + offs_d[None, :])


@triton.jit
def _per_position(ptr, b, c, L, s_b, s_t, head, offs):
    """Pointers to positions ``cL + offs`` of a ``[batch, T, n_heads]`` tensor at (b, head), with strides ``s_b, s_t``
    and 1 along the heads (``s_b = T, s_t = 1, head = 0`` for a contiguous ``[batch, T]``); 64-bit base as in
    :func:`_rows`."""
    return ptr + (b.to(tl.int64) * s_b + (c * L).to(tl.int64) * s_t + head) + offs * s_t


@triton.jit
def _chunk_rows(start, c, L, T, BLOCK: tl.constexpr):
    """Rows ``start … start+BLOCK`` of chunk ``c``: (offsets in the chunk, positions in the sequence,
    valid = inside the chunk and before ``T``)."""
    offs = start + tl.arange(0, BLOCK)
    t = c * L + offs
    return offs, t, (offs < L) & (t < T)


@triton.jit
def _seg_before(SEG, b, c, L, T):
    """The document of the state entering chunk ``c``: that of position ``cL − 1``; 0 for ``c = 0``."""
    seg = tl.load(SEG + b.to(tl.int64) * T + tl.maximum(c * L - 1, 0))
    return tl.where(c > 0, seg, 0)


@triton.jit
def _seg_end(SEG, b, c, L, T):
    """The document of chunk ``c``'s last position (before ``T``): the one its final state belongs to."""
    return tl.load(SEG + b.to(tl.int64) * T + tl.minimum(c * L + L - 1, T - 1))


@triton.jit
def _chunk_and_head(H, HEADS_INNER: tl.constexpr):
    """``(b·nc, h)`` of this program: from grid axes 0 and 2, or both from axis 0 with the heads innermost
    (HEADS_INNER), so that the programs launched together are one chunk's heads, reading its group's ``B``, ``C`` and
    scores while they are still in L2."""
    if HEADS_INNER:
        bc, h = tl.program_id(0) // H, tl.program_id(0) % H
    else:
        bc, h = tl.program_id(0), tl.program_id(2)
    return bc, h


@triton.jit
def _state_tile(ptr, offs_qk, offs_v, DQK, DV, TRANS_STATE: tl.constexpr):
    """A ``[P, N]`` fp32 state read as ``[DQK, DV]``: itself, or its transpose when TRANS_STATE."""
    if TRANS_STATE:
        offs = offs_v[None, :] * DQK + offs_qk[:, None]
    else:
        offs = offs_qk[:, None] * DV + offs_v[None, :]
    return tl.load(ptr + offs, mask=(offs_qk[:, None] < DQK) & (offs_v[None, :] < DV), other=0.0)


@triton.jit
def _chunk_state(X, DT, BM, LAM, SEG, OUT, T, L, Tp, n_chunks, H, BM_HEADS, P, N,
                 sx_b, sx_t, sx_h, sbm_b, sbm_t, sbm_h, sdt_b, sdt_t,
                 DECAY_TO_END: tl.constexpr, SCALE_BY_DT: tl.constexpr, HAS_DOCS: tl.constexpr,
                 BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr):
    """``OUT[b, c, h] = Σ_l w_l X_l ⊗ BM_l`` over chunk ``c``: ``[P, N]`` fp32.

    ``w_l = exp(α_c − Λ_l)·dt_l`` (forward: the chunk's state) or ``exp(Λ_l)`` (backward: what the
    read-outs send to the entering state); with documents, only the rows of the chunk's last document
    (forward) or of the entering state's document (backward)."""
    bc, h = tl.program_id(0), tl.program_id(1)
    b, c = bc // n_chunks, bc % n_chunks
    bm_head = h // (H // BM_HEADS)
    offs_p, offs_n = tl.arange(0, BLOCK_P), tl.arange(0, BLOCK_N)
    lam_ptr = LAM + ((b.to(tl.int64) * H + h) * Tp + c * L)
    lam_end = tl.load(lam_ptr + L - 1)
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    if HAS_DOCS:
        if DECAY_TO_END:
            seg_target = _seg_end(SEG, b, c, L, T)
        else:
            seg_target = _seg_before(SEG, b, c, L, T)
    for l0 in range(0, L, BLOCK_L):
        offs_l, t, valid = _chunk_rows(l0, c, L, T, BLOCK_L)
        x = tl.load(_rows(X, b, c, L, sx_b, sx_t, sx_h, h, offs_l, offs_p), mask=valid[:, None] & (offs_p[None, :] < P),
                    other=0.0)
        bm = tl.load(_rows(BM, b, c, L, sbm_b, sbm_t, sbm_h, bm_head, offs_l, offs_n),
                     mask=valid[:, None] & (offs_n[None, :] < N), other=0.0)
        lam = tl.load(lam_ptr + offs_l, mask=offs_l < L, other=0.0)
        if DECAY_TO_END:
            w = tl.exp(lam_end - lam)
        else:
            w = tl.exp(lam)
        if SCALE_BY_DT:
            w *= tl.load(_per_position(DT, b, c, L, sdt_b, sdt_t, h, offs_l), mask=valid, other=0.0).to(tl.float32)
        w = tl.where(valid, w, 0.0)
        if HAS_DOCS:
            w = tl.where(tl.load(_per_position(SEG, b, c, L, T, 1, 0, offs_l), mask=valid, other=-1) == seg_target, w, 0.0)
        acc += tl.dot(tl.trans((x * w[:, None]).to(bm.dtype)), bm, input_precision=DOT)
    out = OUT + ((b.to(tl.int64) * n_chunks + c) * H + h) * P * N + (offs_p[:, None] * N + offs_n[None, :])
    tl.store(out, acc, mask=(offs_p[:, None] < P) & (offs_n[None, :] < N))


@triton.jit
def _decayed_scan(U, LAM, SEG, H0, OUT, FINAL, T, L, Tp, n_chunks, H, PN,
                  HAS_H0: tl.constexpr, REVERSE: tl.constexpr, HAS_DOCS: tl.constexpr, BLOCK: tl.constexpr):
    """The linear recurrence over chunks, on flattened ``[P·N]`` states, fp32.

    Forward: ``OUT[0] = H0``, ``OUT[c+1] = exp(α_c) OUT[c] + U[c]``.
    Reverse: ``OUT[nc] = H0``, ``OUT[c] = exp(α_c) OUT[c+1] + U[c]``.
    With documents, ``exp(α_c)`` is 0 for a chunk in which a document starts.
    ``U [b, nc, h, PN]``, ``OUT [b, nc+1, h, PN]`` (fp32, or the inputs' dtype: the kernels that read the states
    multiply them in it), ``H0 [b, h, PN]``; the last state, ``OUT[nc]`` (``OUT[0]`` reversed), also goes to
    ``FINAL [b, h, PN]`` in fp32."""
    bh, blk = tl.program_id(0), tl.program_id(1)  # b·h on axis 0: up to 2^31 − 1
    b, h = bh // H, bh % H
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < PN
    if HAS_H0:
        state = tl.load(H0 + bh.to(tl.int64) * PN + offs, mask=mask, other=0.0).to(tl.float32)
    else:
        state = tl.zeros([BLOCK], dtype=tl.float32)
    out_ptr = OUT + (b.to(tl.int64) * (n_chunks + 1) * H + h) * PN + offs  # OUT[b, 0, h]; chunk c at + c·H·PN
    if REVERSE:
        tl.store(OUT + ((b.to(tl.int64) * (n_chunks + 1) + n_chunks) * H + h) * PN + offs,
                 state.to(OUT.dtype.element_ty), mask=mask)
    else:
        tl.store(out_ptr, state.to(OUT.dtype.element_ty), mask=mask)
    for i in range(0, n_chunks):
        if REVERSE:
            c = n_chunks - 1 - i
            dest = c
        else:
            c = i
            dest = c + 1
        carry = tl.exp(tl.load(LAM + bh.to(tl.int64) * Tp + c * L + L - 1))
        if HAS_DOCS:
            carry = tl.where(_seg_before(SEG, b, c, L, T) == _seg_end(SEG, b, c, L, T), carry, 0.0)
        u = tl.load(U + ((b.to(tl.int64) * n_chunks + c) * H + h) * PN + offs, mask=mask, other=0.0)
        state = carry * state + u
        tl.store(out_ptr + dest.to(tl.int64) * H * PN, state.to(OUT.dtype.element_ty), mask=mask)
    tl.store(FINAL + bh.to(tl.int64) * PN + offs, state, mask=mask)


@triton.jit
def _group_score_tile(QK, b, c, n_chunks, g, G, L, offs_l, offs_m):
    """Pointers to ``QK[b, c, g, offs_l, offs_m]`` in a contiguous ``[b, nc, G, L, L]``, 64-bit from the base."""
    base = QK + ((b.to(tl.int64) * n_chunks + c) * G + g) * L * L
    return base + offs_l[:, None] * L + offs_m[None, :]


@triton.jit
def _pair_block(n_chunks, L, BLOCK: tl.constexpr):
    """This program's ``(b, c, g, i, j)`` on a grid of (b·nc, G, row blocks × column blocks): block ``(i, j)`` of
    chunk ``c``'s ``[L, L]`` pairs in group ``g`` (the callers work only where ``j ≤ i``)."""
    bc, g, blk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    blocks = tl.cdiv(L, BLOCK)
    return bc // n_chunks, bc % n_chunks, g, blk // blocks, blk % blocks


@triton.jit
def _group_scores(C, B, QK, T, L, n_chunks, G, N, sc_b, sc_t, sc_h, sb_b, sb_t, sb_h,
                  BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr):
    """``QK[b, c, g, l, m] = C_l·B_m`` fp32 in chunk ``c`` for the blocks on and below the diagonal (the pairs
    ``m ≤ l`` the scans read; the blocks above are never written): the in-chunk products, made once for the heads
    that share group ``g``. Rows past ``T`` load as zeros. Grid: (b·nc, G, row blocks × column blocks)."""
    b, c, g, i, j = _pair_block(n_chunks, L, BLOCK)
    if j <= i:
        offs_n = tl.arange(0, BLOCK_N)
        offs_l, t_l, valid_l = _chunk_rows(i * BLOCK, c, L, T, BLOCK)
        offs_m, t_m, valid_m = _chunk_rows(j * BLOCK, c, L, T, BLOCK)
        cm = tl.load(_rows(C, b, c, L, sc_b, sc_t, sc_h, g, offs_l, offs_n), mask=valid_l[:, None] & (offs_n[None, :] < N),
                     other=0.0)
        bm = tl.load(_rows(B, b, c, L, sb_b, sb_t, sb_h, g, offs_m, offs_n), mask=valid_m[:, None] & (offs_n[None, :] < N),
                     other=0.0)
        scores = tl.dot(cm, tl.trans(bm.to(cm.dtype)), input_precision=DOT)  # [BLOCK, BLOCK]
        tl.store(_group_score_tile(QK, b, c, n_chunks, g, G, L, offs_l, offs_m), scores,
                 mask=(offs_l < L)[:, None] & (offs_m < L)[None, :])


@triton.jit
def _group_pair_grads(X, DY, DT, LAM, SEG, OUT, T, L, Tp, n_chunks, H, G, P, sx_b, sx_t, sx_h, sdy_b, sdy_t, sdy_h,
                      sdt_b, sdt_t,
                      HAS_DOCS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, DOT: tl.constexpr):
    """``OUT[b, c, g, l, m] = Σ_{h in g} (dy_l·x_m) exp(Λ_l − Λ_m) dt_m`` fp32 for the pairs ``m ≤ l`` of one document
    in chunk ``c`` (0 elsewhere in the blocks on and below the diagonal; the blocks above are never written): what the
    group's in-chunk products ``C_l·B_m`` receive, summed over the heads that share them, so that ``dC_l`` takes
    ``Σ_m OUT_lm B_m`` and ``dB_m`` takes ``Σ_l OUT_lm C_l`` once per group rather than once per head (mamba_ssm's
    ``dCB``). The program loops over the group's heads. Grid: (b·nc, G, row blocks × column blocks)."""
    b, c, g, i, j = _pair_block(n_chunks, L, BLOCK)
    if j <= i:
        offs_p = tl.arange(0, BLOCK_P)
        in_p = offs_p[None, :] < P
        offs_l, t_l, valid_l = _chunk_rows(i * BLOCK, c, L, T, BLOCK)
        offs_m, t_m, valid_m = _chunk_rows(j * BLOCK, c, L, T, BLOCK)
        causal = valid_m[None, :] & (offs_m[None, :] <= offs_l[:, None])
        if HAS_DOCS:
            seg_l = tl.load(_per_position(SEG, b, c, L, T, 1, 0, offs_l), mask=valid_l, other=-1)
            causal &= tl.load(_per_position(SEG, b, c, L, T, 1, 0, offs_m), mask=valid_m, other=-2)[None, :] == seg_l[:, None]
        acc = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
        per_group = H // G
        for k in range(0, per_group):
            h = g * per_group + k
            dy = tl.load(_rows(DY, b, c, L, sdy_b, sdy_t, sdy_h, h, offs_l, offs_p), mask=valid_l[:, None] & in_p,
                         other=0.0)
            x = tl.load(_rows(X, b, c, L, sx_b, sx_t, sx_h, h, offs_m, offs_p), mask=valid_m[:, None] & in_p, other=0.0)
            dt_m = tl.load(_per_position(DT, b, c, L, sdt_b, sdt_t, h, offs_m), mask=valid_m, other=0.0).to(tl.float32)
            lam_ptr = LAM + ((b.to(tl.int64) * H + h) * Tp + c * L)
            lam_l = tl.load(lam_ptr + offs_l, mask=offs_l < L, other=0.0)
            lam_m = tl.load(lam_ptr + offs_m, mask=offs_m < L, other=0.0)
            decay = tl.exp(tl.where(causal, lam_l[:, None] - lam_m[None, :], float("-inf")))
            acc += tl.dot(dy, tl.trans(x.to(dy.dtype)), input_precision=DOT) * decay * dt_m[None, :]
        tl.store(_group_score_tile(OUT, b, c, n_chunks, g, G, L, offs_l, offs_m), acc,
                 mask=(offs_l < L)[:, None] & (offs_m < L)[None, :])


@triton.jit
def _group_bc_grads(Q, STATES, W, R, DT, LAM, SEG, PAIRS, OUT, ROW_DOTS, T, L, Tp, n_chunks, H, G, P, N,
                    sq_b, sq_t, sq_h, sw_b, sw_t, sw_h, sr_b, sr_t, sr_h, sdt_b, sdt_t, so_b, so_t, so_h,
                    SOURCE_ROWS: tl.constexpr, HAS_DOCS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr):
    """``dC`` or ``dB`` of group ``g`` for one block of rows of chunk ``c``, in OUT's dtype: the group's heads' state
    terms summed in the program, and the in-chunk term once, from :func:`_group_pair_grads`' ``PAIRS``.

    Rows ``l`` (``Q, STATES, W, R = dy, E, C, B``): ``dC_l = Σ_{h in g} exp(Λ_l) dy_l E_c + Σ_{m≤l} PAIRS_lm B_m``, and
    per head the log-decay gradient's read-out term ``R_l = ⟨exp(Λ_l) dy_l E_c, C_l⟩``.
    SOURCE_ROWS, rows ``m`` (``Q, STATES, W, R = x, G, B, C``): ``dB_m = Σ_{h in g} dt_m exp(α_c − Λ_m) x_m G_{c+1} +
    Σ_{l≥m} PAIRS_lm C_l``, and per head the share term ``U_m = ⟨dt_m exp(α_c − Λ_m) x_m G_{c+1}, B_m⟩``.
    The row dots go to ``ROW_DOTS [b, h, nc·L]`` fp32; a head's state term counts only in the document its state
    belongs to. ``STATES [b, nc+1, h, P, N]`` fp32. Grid: (b·nc, row blocks of the chunk, G)."""
    bc, pid, g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, c = bc // n_chunks, bc % n_chunks
    offs_p, offs_n = tl.arange(0, BLOCK_P), tl.arange(0, BLOCK_N)
    in_p, in_n = offs_p[None, :] < P, offs_n[None, :] < N
    offs, t, valid = _chunk_rows(pid * BLOCK_L, c, L, T, BLOCK_L)
    w = tl.load(_rows(W, b, c, L, sw_b, sw_t, sw_h, g, offs, offs_n), mask=valid[:, None] & in_n, other=0.0)
    own = valid
    if HAS_DOCS:  # the rows in the document of the state this term reads
        seg = tl.load(_per_position(SEG, b, c, L, T, 1, 0, offs), mask=valid, other=-1)
        if SOURCE_ROWS:
            own &= seg == _seg_end(SEG, b, c, L, T)
        else:
            own &= seg == _seg_before(SEG, b, c, L, T)
    state_ptr = STATES + ((b.to(tl.int64) * (n_chunks + 1) + c + SOURCE_ROWS) * H) * P * N
    acc = tl.zeros([BLOCK_L, BLOCK_N], dtype=tl.float32)
    per_group = H // G
    for k in range(0, per_group):
        h = g * per_group + k
        q = tl.load(_rows(Q, b, c, L, sq_b, sq_t, sq_h, h, offs, offs_p), mask=valid[:, None] & in_p, other=0.0)
        state = _state_tile(state_ptr + h * P * N, offs_p, offs_n, P, N, False)  # [P, N]
        lam_ptr = LAM + ((b.to(tl.int64) * H + h) * Tp + c * L)
        lam = tl.load(lam_ptr + offs, mask=offs < L, other=0.0)
        if SOURCE_ROWS:
            dt = tl.load(_per_position(DT, b, c, L, sdt_b, sdt_t, h, offs), mask=valid, other=0.0).to(tl.float32)
            weight = dt * tl.exp(tl.load(lam_ptr + L - 1) - lam)
        else:
            weight = tl.exp(lam)
        weight = tl.where(own, weight, 0.0)
        term = tl.dot(q, state.to(q.dtype), input_precision=DOT) * weight[:, None]  # [BLOCK_L, N]
        tl.store(ROW_DOTS + ((b.to(tl.int64) * H + h) * Tp + c * L) + offs, tl.sum(term * w.to(tl.float32), axis=1),
                 mask=offs < L)
        acc += term

    # The in-chunk term, once for the group: PAIRS[l, m] on and below the diagonal.
    if SOURCE_ROWS:
        lo, hi = pid * BLOCK_L, L
    else:
        lo, hi = 0, tl.minimum((pid + 1) * BLOCK_L, L)
    for s0 in range(lo, hi, BLOCK_M):
        offs_s, t_s, valid_s = _chunk_rows(s0, c, L, T, BLOCK_M)
        r = tl.load(_rows(R, b, c, L, sr_b, sr_t, sr_h, g, offs_s, offs_n), mask=valid_s[:, None] & in_n, other=0.0)
        if SOURCE_ROWS:  # [m, l] from PAIRS[l, m], l ≥ m
            below = (offs_s[None, :] >= offs[:, None]) & (offs_s[None, :] < L)
            pairs = tl.trans(tl.load(_group_score_tile(PAIRS, b, c, n_chunks, g, G, L, offs_s, offs),
                                     mask=tl.trans(below), other=0.0))
        else:  # [l, m], m ≤ l
            below = (offs_s[None, :] <= offs[:, None]) & (offs[:, None] < L)
            pairs = tl.load(_group_score_tile(PAIRS, b, c, n_chunks, g, G, L, offs, offs_s), mask=below, other=0.0)
        acc += tl.dot(pairs.to(r.dtype), r, input_precision=DOT)
    tl.store(_rows(OUT, b, c, L, so_b, so_t, so_h, g, offs, offs_n), acc.to(OUT.dtype.element_ty),
             mask=valid[:, None] & in_n)


@triton.jit
def _chunk_scan(Q, K, V, W, DT, LAM, SEG, STATES, DSKIP, QK, OUT, ROW_DOTS, T, L, Tp, n_chunks, H, Q_HEADS, K_HEADS,
                V_HEADS, DQK, DV, sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sw_b, sw_t, sw_h, sdt_b, sdt_t,
                so_b, so_t, so_h, V_BLOCKS,
                TRANS_STATE: tl.constexpr, HAS_D: tl.constexpr, HAS_DOCS: tl.constexpr, HAS_ROW_DOTS: tl.constexpr,
                HAS_QK: tl.constexpr, HEADS_INNER: tl.constexpr,
                BLOCK_L: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_QK: tl.constexpr, BLOCK_V: tl.constexpr, DOT: tl.constexpr):
    """``OUT_l = Σ_{m≤l} (Q_l·K_m) exp(Λ_l − Λ_m) dt_m V_m + exp(Λ_l) Q_l M_c (+ D V_l)`` per head, with
    ``M_c [DQK, DV]`` the entering state ``STATES[b, c, h]`` (``[P, N]``, transposed when TRANS_STATE). With
    HAS_ROW_DOTS, also the state read-out's row dots ``ROW_DOTS[b, h, cL + l] = ⟨W_l, exp(Λ_l) Q_l M_c⟩`` fp32 (``W``
    read as ``V`` is, ``[b, T, V_HEADS, DV]``).

    Forward: ``Q, K, V = C, B, x`` gives ``y`` (with HAS_QK its products ``Q_l·K_m`` read from ``QK [b, nc, K_HEADS,
    L, L]`` fp32, :func:`_group_scores`, instead of made per head). Backward: ``Q, K, V = dy, x, B`` gives ``dC`` per
    head, and with ``W = C`` the read-out term ``R_l = exp(Λ_l)⟨dy_l, E_c C_l⟩`` of the log-decay gradient.
    A program makes ``BLOCK_V`` of the ``DV`` columns, one of ``V_BLOCKS`` (more than one only without HAS_ROW_DOTS,
    whose sums run over every column). Grid: (b·nc, row blocks × V_BLOCKS, h), or (b·nc·h, …, 1) with
    HEADS_INNER."""
    bc, h = _chunk_and_head(H, HEADS_INNER)  # b·nc on axis 0: up to 2^31 − 1
    pid_l, pid_v = tl.program_id(1) // V_BLOCKS, tl.program_id(1) % V_BLOCKS
    b, c = bc // n_chunks, bc % n_chunks
    q_head, k_head, v_head = h // (H // Q_HEADS), h // (H // K_HEADS), h // (H // V_HEADS)
    offs_qk, offs_v = tl.arange(0, BLOCK_QK), pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    in_qk, in_v = offs_qk[None, :] < DQK, offs_v[None, :] < DV
    offs_l, t_l, valid_l = _chunk_rows(pid_l * BLOCK_L, c, L, T, BLOCK_L)
    lam_ptr = LAM + ((b.to(tl.int64) * H + h) * Tp + c * L)
    q = tl.load(_rows(Q, b, c, L, sq_b, sq_t, sq_h, q_head, offs_l, offs_qk), mask=valid_l[:, None] & in_qk, other=0.0)
    lam_l = tl.load(lam_ptr + offs_l, mask=offs_l < L, other=0.0)

    # The state entering the chunk, read out at each row and decayed to it.
    state = _state_tile(STATES + ((b.to(tl.int64) * (n_chunks + 1) + c) * H + h) * DQK * DV, offs_qk, offs_v, DQK, DV, TRANS_STATE)
    # In the inputs' dtype, as mamba_ssm reads its states out: an fp32 dot beside bf16 tiles spills 1.4 KB
    # per thread on sm_90 in full fp32 (recipes.benchmarks.compile_check).
    acc = tl.dot(q, state.to(q.dtype), input_precision=DOT) * tl.exp(lam_l)[:, None]  # [BLOCK_L, BLOCK_V]
    if HAS_DOCS:  # only rows still in the document the entering state belongs to
        seg_l = tl.load(_per_position(SEG, b, c, L, T, 1, 0, offs_l), mask=valid_l, other=-1)
        acc = tl.where((seg_l == _seg_before(SEG, b, c, L, T))[:, None], acc, 0.0)
    if HAS_ROW_DOTS:  # before the in-chunk terms join acc: only the read-out's share
        w = tl.load(_rows(W, b, c, L, sw_b, sw_t, sw_h, v_head, offs_l, offs_v), mask=valid_l[:, None] & in_v, other=0.0)
        tl.store(ROW_DOTS + ((b.to(tl.int64) * H + h) * Tp + c * L) + offs_l, tl.sum(acc * w.to(tl.float32), axis=1),
                 mask=offs_l < L)

    # Inside the chunk: causal, decayed, like attention without the softmax.
    hi = tl.minimum((pid_l + 1) * BLOCK_L, L)
    for m0 in range(0, hi, BLOCK_M):
        offs_m, t_m, valid_m = _chunk_rows(m0, c, L, T, BLOCK_M)
        if not HAS_QK:  # loaded first, as before the option: the order the compiled code's registers were measured at
            k = tl.load(_rows(K, b, c, L, sk_b, sk_t, sk_h, k_head, offs_m, offs_qk), mask=valid_m[:, None] & in_qk,
                        other=0.0)
        v = tl.load(_rows(V, b, c, L, sv_b, sv_t, sv_h, v_head, offs_m, offs_v), mask=valid_m[:, None] & in_v, other=0.0)
        dt_m = tl.load(_per_position(DT, b, c, L, sdt_b, sdt_t, h, offs_m), mask=valid_m, other=0.0).to(tl.float32)
        lam_m = tl.load(lam_ptr + offs_m, mask=offs_m < L, other=0.0)
        causal = (offs_m[None, :] <= offs_l[:, None]) & valid_m[None, :]
        if HAS_DOCS:
            causal &= tl.load(_per_position(SEG, b, c, L, T, 1, 0, offs_m), mask=valid_m, other=-2)[None, :] == seg_l[:, None]
        decay = tl.exp(tl.where(causal, lam_l[:, None] - lam_m[None, :], float("-inf")))
        if HAS_QK:
            qk = tl.load(_group_score_tile(QK, b, c, n_chunks, k_head, K_HEADS, L, offs_l, offs_m), mask=causal, other=0.0)
        else:
            qk = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT)
        s = qk * decay * dt_m[None, :]  # [BLOCK_L, BLOCK_M]
        acc += tl.dot(s.to(v.dtype), v, input_precision=DOT)

    if HAS_D:  # forward only, where V is x
        v_l = tl.load(_rows(V, b, c, L, sv_b, sv_t, sv_h, v_head, offs_l, offs_v), mask=valid_l[:, None] & in_v, other=0.0)
        acc += tl.load(DSKIP + h).to(tl.float32) * v_l.to(tl.float32)
    tl.store(_rows(OUT, b, c, L, so_b, so_t, so_h, h, offs_l, offs_v), acc.to(OUT.dtype.element_ty), mask=valid_l[:, None] & in_v)


@triton.jit
def _chunk_scan_reverse(Q, K, V, W, DT, LAM, SEG, DSTATES, DSKIP, QK, OUT, ROW_DOTS, X_DOTS, T, L, Tp, n_chunks, H,
                        Q_HEADS, K_HEADS, V_HEADS, DQK, DV, sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sw_b,
                        sw_t, sw_h, sdt_b, sdt_t, so_b, so_t, so_h,
                        TRANS_STATE: tl.constexpr, SCALE_BY_DT: tl.constexpr, HAS_DOCS: tl.constexpr,
                        HAS_ROW_DOTS: tl.constexpr, DX_EPILOGUE: tl.constexpr, HAS_D: tl.constexpr, HAS_QK: tl.constexpr,
                        HEADS_INNER: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_QK: tl.constexpr, BLOCK_V: tl.constexpr, DOT: tl.constexpr):
    """The transpose of :func:`_chunk_scan`, for source rows ``m`` of chunk ``c``, streaming the rows
    ``l ≥ m``: ``OUT_m = [Σ_{l≥m} (Q_m·K_l) exp(Λ_l − Λ_m) V_l + exp(α_c − Λ_m) Q_m M_c] (· dt_m)``, fp32,
    with ``M_c`` from ``dS_c = DSTATES[b, c+1, h]`` (``[P, N]``, transposed when TRANS_STATE).

    ``W`` is read as ``V`` is. ``Q, K, V = x, dy, C`` (SCALE_BY_DT) gives ``dB`` per head, and with HAS_ROW_DOTS and
    ``W = B`` the log-decay gradient's share term ``ROW_DOTS[b, h, cL + m] = U_m = dt_m exp(α_c − Λ_m)⟨x_m, G_{c+1}
    B_m⟩``, from the state's term before the in-chunk ones join it. ``Q, K, V = B, C, dy`` (TRANS_STATE) gives
    ``d(dt·x)``; with DX_EPILOGUE (``W = x``, ``D`` when HAS_D) what the host wants of it instead, none of it through
    an fp32 ``d(dt·x)`` written and read back: ``OUT_m = dt_m d(dt·x)_m (+ D dy_m)``, which is ``dx``, in OUT's dtype,
    and ``X_DOTS[b, h, cL + m] = ⟨x_m, d(dt·x)_m⟩``, the part of ``d dt`` through ``x``. (``U`` is made in the ``dB``
    kernel, not beside ``dx`` whose state term has it too: there it spilled 40 bytes at P = N = 128 on sm_90.) With
    HAS_QK (the ``d(dt·x)`` call) the products ``Q_m·K_l = C_l·B_m`` are read, transposed, from ``QK [b, nc, K_HEADS,
    L, L]`` fp32 (:func:`_group_scores`). Grid: (b·nc, row blocks of the chunk, h), or (b·nc·h, …, 1) with
    HEADS_INNER."""
    bc, h = _chunk_and_head(H, HEADS_INNER)  # b·nc on axis 0: up to 2^31 − 1
    pid_m = tl.program_id(1)
    b, c = bc // n_chunks, bc % n_chunks
    q_head, k_head, v_head = h // (H // Q_HEADS), h // (H // K_HEADS), h // (H // V_HEADS)
    offs_qk, offs_v = tl.arange(0, BLOCK_QK), tl.arange(0, BLOCK_V)
    in_qk, in_v = offs_qk[None, :] < DQK, offs_v[None, :] < DV
    offs_m, t_m, valid_m = _chunk_rows(pid_m * BLOCK_M, c, L, T, BLOCK_M)
    lam_ptr = LAM + ((b.to(tl.int64) * H + h) * Tp + c * L)
    q = tl.load(_rows(Q, b, c, L, sq_b, sq_t, sq_h, q_head, offs_m, offs_qk), mask=valid_m[:, None] & in_qk, other=0.0)
    lam_m = tl.load(lam_ptr + offs_m, mask=offs_m < L, other=0.0)

    # What the chunk's final state sends back to each source row.
    ds = _state_tile(DSTATES + ((b.to(tl.int64) * (n_chunks + 1) + c + 1) * H + h) * DQK * DV, offs_qk, offs_v, DQK, DV,
                     TRANS_STATE)
    lam_end = tl.load(lam_ptr + L - 1)
    acc = tl.dot(q, ds.to(q.dtype), input_precision=DOT) * tl.exp(lam_end - lam_m)[:, None]  # [BLOCK_M, BLOCK_V]
    if HAS_DOCS:  # only rows of the document the chunk's final state belongs to
        seg_m = tl.load(_per_position(SEG, b, c, L, T, 1, 0, offs_m), mask=valid_m, other=-1)
        acc = tl.where((seg_m == _seg_end(SEG, b, c, L, T))[:, None], acc, 0.0)
    row_out = ((b.to(tl.int64) * H + h) * Tp + c * L) + offs_m  # rows m in [b, h, nc·L]
    if HAS_ROW_DOTS:  # acc is exp(α_c − Λ_m) x_m G_{c+1} [BLOCK_M, N] here, before the in-chunk terms join it
        w = tl.load(_rows(W, b, c, L, sw_b, sw_t, sw_h, v_head, offs_m, offs_v), mask=valid_m[:, None] & in_v, other=0.0)
        dt_m = tl.load(_per_position(DT, b, c, L, sdt_b, sdt_t, h, offs_m), mask=valid_m, other=0.0).to(tl.float32)
        tl.store(ROW_DOTS + row_out, tl.sum(acc * w.to(tl.float32), axis=1) * dt_m, mask=offs_m < L)

    for l0 in range(pid_m * BLOCK_M, L, BLOCK_L):
        offs_l, t_l, valid_l = _chunk_rows(l0, c, L, T, BLOCK_L)
        if not HAS_QK:  # loaded first, as before the option (see _chunk_scan)
            k = tl.load(_rows(K, b, c, L, sk_b, sk_t, sk_h, k_head, offs_l, offs_qk), mask=valid_l[:, None] & in_qk,
                        other=0.0)
        v = tl.load(_rows(V, b, c, L, sv_b, sv_t, sv_h, v_head, offs_l, offs_v), mask=valid_l[:, None] & in_v, other=0.0)
        lam_l = tl.load(lam_ptr + offs_l, mask=offs_l < L, other=0.0)
        causal = (offs_l[None, :] >= offs_m[:, None]) & valid_l[None, :]
        if HAS_DOCS:
            causal &= tl.load(_per_position(SEG, b, c, L, T, 1, 0, offs_l), mask=valid_l, other=-2)[None, :] == seg_m[:, None]
        decay = tl.exp(tl.where(causal, lam_l[None, :] - lam_m[:, None], float("-inf")))  # [BLOCK_M, BLOCK_L]
        if HAS_QK:  # [BLOCK_M, BLOCK_L] from the [l, m] products
            qk = tl.trans(tl.load(_group_score_tile(QK, b, c, n_chunks, k_head, K_HEADS, L, offs_l, offs_m),
                                  mask=tl.trans(causal), other=0.0))
        else:
            qk = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT)
        s = qk * decay
        acc += tl.dot(s.to(v.dtype), v, input_precision=DOT)

    if SCALE_BY_DT or DX_EPILOGUE:
        dt_m = tl.load(_per_position(DT, b, c, L, sdt_b, sdt_t, h, offs_m), mask=valid_m, other=0.0).to(tl.float32)
    if DX_EPILOGUE:  # acc is d(dt·x) [BLOCK_M, P]
        w = tl.load(_rows(W, b, c, L, sw_b, sw_t, sw_h, v_head, offs_m, offs_v), mask=valid_m[:, None] & in_v, other=0.0)
        tl.store(X_DOTS + row_out, tl.sum(acc * w.to(tl.float32), axis=1), mask=offs_m < L)
    if SCALE_BY_DT or DX_EPILOGUE:
        acc *= dt_m[:, None]
    if HAS_D:  # with DX_EPILOGUE, where V is dy
        v_m = tl.load(_rows(V, b, c, L, sv_b, sv_t, sv_h, v_head, offs_m, offs_v), mask=valid_m[:, None] & in_v, other=0.0)
        acc += tl.load(DSKIP + h).to(tl.float32) * v_m.to(tl.float32)
    tl.store(_rows(OUT, b, c, L, so_b, so_t, so_h, h, offs_m, offs_v), acc.to(OUT.dtype.element_ty),
             mask=valid_m[:, None] & in_v)


@triton.jit
def _log_decay_pairs(X, DY, BM, CM, DT, LAM, SEG, QK, OUT, T, L, Tp, n_chunks, H, BC_HEADS, P, N,
                     sx_b, sx_t, sx_h, sdy_b, sdy_t, sdy_h, sb_b, sb_t, sb_h, sc_b, sc_t, sc_h, sdt_b, sdt_t,
                     HAS_DOCS: tl.constexpr, HAS_QK: tl.constexpr, HEADS_INNER: tl.constexpr, BLOCK_L: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr):
    """The pair terms of the log-decay gradient, for the rows ``l`` of one block: ``OUT[b, c, block, h, k] =
    Σ_{l in block, l≥k} Σ_{m<k} T_lm`` with ``T_lm = (dy_l·x_m)(C_l·B_m) exp(Λ_l − Λ_m) dt_m`` (pairs in one
    document). A program keeps its rows' ``Σ_{m<k} T_lm`` as a running sum over the column blocks, so no ``[L, L]``
    tensor is written; the blocks' parts are summed afterwards (no atomics). With HAS_QK the products ``C_l·B_m`` are
    read from the group's ``QK [b, nc, BC_HEADS, L, L]`` (:func:`_group_scores`). Grid: (b·nc, row blocks, h), or
    (b·nc·h, row blocks, 1) with HEADS_INNER."""
    bc, h = _chunk_and_head(H, HEADS_INNER)  # b·nc on axis 0: up to 2^31 − 1
    pid_l = tl.program_id(1)
    b, c = bc // n_chunks, bc % n_chunks
    g = h // (H // BC_HEADS)
    offs_p, offs_n = tl.arange(0, BLOCK_P), tl.arange(0, BLOCK_N)
    in_p, in_n = offs_p[None, :] < P, offs_n[None, :] < N
    offs_l, t_l, valid_l = _chunk_rows(pid_l * BLOCK_L, c, L, T, BLOCK_L)
    lam_ptr = LAM + ((b.to(tl.int64) * H + h) * Tp + c * L)
    lam_l = tl.load(lam_ptr + offs_l, mask=offs_l < L, other=0.0)
    dy = tl.load(_rows(DY, b, c, L, sdy_b, sdy_t, sdy_h, h, offs_l, offs_p), mask=valid_l[:, None] & in_p, other=0.0)
    if not HAS_QK:
        cm = tl.load(_rows(CM, b, c, L, sc_b, sc_t, sc_h, g, offs_l, offs_n), mask=valid_l[:, None] & in_n, other=0.0)
    if HAS_DOCS:
        seg_l = tl.load(_per_position(SEG, b, c, L, T, 1, 0, offs_l), mask=valid_l, other=-1)
    out = OUT + (((b.to(tl.int64) * n_chunks + c) * tl.num_programs(1) + pid_l) * H + h) * L

    run = tl.zeros([BLOCK_L], dtype=tl.float32)  # Σ_{m<m0} T_lm, per row
    hi = tl.minimum((pid_l + 1) * BLOCK_L, L)  # columns past the block's rows get nothing: k ≤ l
    for m0 in range(0, hi, BLOCK_M):
        offs_m, t_m, valid_m = _chunk_rows(m0, c, L, T, BLOCK_M)
        x = tl.load(_rows(X, b, c, L, sx_b, sx_t, sx_h, h, offs_m, offs_p), mask=valid_m[:, None] & in_p, other=0.0)
        if not HAS_QK:
            bm = tl.load(_rows(BM, b, c, L, sb_b, sb_t, sb_h, g, offs_m, offs_n), mask=valid_m[:, None] & in_n,
                         other=0.0)
        dt_m = tl.load(_per_position(DT, b, c, L, sdt_b, sdt_t, h, offs_m), mask=valid_m, other=0.0).to(tl.float32)
        lam_m = tl.load(lam_ptr + offs_m, mask=offs_m < L, other=0.0)
        before = (offs_m[None, :] < offs_l[:, None]) & valid_m[None, :]  # [l, m]: m < l (m = l enters no k ≤ l)
        if HAS_DOCS:
            before &= tl.load(_per_position(SEG, b, c, L, T, 1, 0, offs_m), mask=valid_m, other=-2)[None, :] == seg_l[:, None]
        decay = tl.exp(tl.where(before, lam_l[:, None] - lam_m[None, :], float("-inf")))
        if HAS_QK:
            qk = tl.load(_group_score_tile(QK, b, c, n_chunks, g, BC_HEADS, L, offs_l, offs_m),
                         mask=before & (offs_l < L)[:, None], other=0.0)
        else:
            qk = tl.dot(cm, tl.trans(bm.to(cm.dtype)), input_precision=DOT)
        pair = tl.dot(dy, tl.trans(x.to(dy.dtype)), input_precision=DOT) * qk * decay * dt_m[None, :]  # T_lm
        before_k = run[:, None] + tl.cumsum(pair, axis=1) - pair  # [l, k]: Σ_{m<k} T_lm
        da = tl.sum(tl.where(offs_l[:, None] >= offs_m[None, :], before_k, 0.0), axis=0)  # over l ≥ k
        tl.store(out + offs_m, da, mask=offs_m < L)
        run += tl.sum(pair, axis=1)


@triton.jit
def _state_dots(E, G, OUT, n_chunks, H, PN, BLOCK: tl.constexpr):
    """``OUT[b, c, h, block] = Σ E[b, c, h] · G[b, c+1, h]`` over one block of the flattened ``[P·N]`` states (the
    blocks' parts are summed afterwards): the carry's ``⟨G_{c+1}, E_c⟩``. ``E, G [b, nc+1, h, P·N]`` fp32.
    Grid: (b·h, state blocks)."""
    bh, blk = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    mask = offs < PN
    for c in range(0, n_chunks):
        e = tl.load(E + ((b.to(tl.int64) * (n_chunks + 1) + c) * H + h) * PN + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + ((b.to(tl.int64) * (n_chunks + 1) + c + 1) * H + h) * PN + offs, mask=mask,
                    other=0.0).to(tl.float32)
        tl.store(OUT + ((b.to(tl.int64) * n_chunks + c) * H + h) * tl.num_programs(1) + blk, tl.sum(e * g, axis=0))


def launch_config(P: int, N: int, cuda: bool, dtype: torch.dtype = torch.bfloat16, arch: int = 90) -> dict:
    """Tiles, warps and pipeline stages (``arch``: the GPU's compute capability × 10). ``P`` and ``N`` are one tile each
    (``tl.dot`` needs every side >= 16).

    On Hopper (``arch`` >= 90) in bf16/fp16, at states of up to 64 × 128 (Mamba-2's head dim and state): 64 rows,
    4 warps, 2 stages — the fastest in ``python -m recipes.benchmarks.ssd_tiles`` on an H100 and an H200 (2026-11-27,
    B 4, T 4096, H 32, chunk 256): forward and backward 6.72 → 5.07 ms (H100) and 4.28 → 3.40 ms (H200, after the row
    dots below) against 32 rows and 8 warps (Hopper's warp-group products take 64 rows to a group of 4 warps), though ``compile_check`` finds a few spilled bytes there (8-64 per
    thread) in four of the backward kernels. Elsewhere in bf16/fp16 32 rows, 8 warps and 2 stages, at which no kernel
    spills on sm_80 or sm_90 at (P, N) = (64, 128), (128, 128) or (64, 256) (64 rows and 4 warps spill 100-1,100
    bytes at the larger states on sm_90, and up to 280 at 64 × 128 on sm_80; 3 stages spilled 24 bytes in the ``dB``
    kernel with its row dots at (64, 256)). In fp32, 32 rows and 2 stages (64-row tiles need up to 209 KiB of shared
    memory, more than an A100 has). The log-decay gradient's pair kernel takes blocks of ``pair_rows`` rows stepping
    ``pair_cols`` columns (64 × 16 on CUDA: the fastest of six on the H100; 32 × 32 spilled 16-24 bytes at (64, 256) on
    sm_90), 32 × 16 in fp32 (64 rows need 100 KiB of shared memory at N 256 in the variant a launch at aligned shapes
    compiles, ``compile_check --aligned``: more than a consumer GPU's 99, where it would not launch).

    Two switches, on where they were timed — Hopper, bf16/fp16, states up to 64 × 128 — and off elsewhere:

    - ``shared_scores``: the in-chunk ``C·Bᵀ`` made once per group (:func:`_group_scores_call`) and read by the ``y``,
      ``d(dt·x)`` and log-decay kernels, and ``dC``, ``dB`` made per group (:func:`_group_bc_grads_call`) instead of
      per head and summed. The per-group kernels loop over the group's heads holding a ``[rows, N]`` fp32 sum beside
      each head's term, on 8 warps: ``group_rows`` 32 at states up to 64 × 128 and 16 above (the largest without a
      spill on sm_90 with fp32 states: 64 rows spilled 80-730 bytes at 64 × 128, 32 rows 56-184 at the larger
      states), and ``group_block`` × ``group_block`` blocks of the pairs' gradients, 64 and 32 (64 spilled 64 bytes at
      P 128); fp32 takes the smaller ones.
    - ``narrow_states``: the chunks' entering states and their gradients kept in the inputs' dtype, as mamba_ssm keeps
      its states (the kernels that read them multiply them in that dtype already, so ``y`` and every gradient but the
      carry's share of ``dA`` and ``d dt`` are the same; the recurrence over chunks and the final state stay fp32),
      halving the bytes of the largest reads. With bf16 states the per-group kernels spill 8 bytes at 64 × 128 and
      160-184 at the larger states (so those keep fp32 states).

    Timed on an H200 (2026-11-27, B 4, H 32, P 64, N 128, chunk 256, bf16, ``check_finite=False``, each switch against
    the configuration without it in one process, ``ssd_tiles --sections``): ``shared_scores`` 1.03× at T 16K and
    0.97× at 4K; ``narrow_states`` then, on top of it, 1.10× at both; together ``ops`` measured 9.13 ms forward and
    backward at 16K (10.32 before; mamba_ssm 6.38) and 3.26 at 4K (3.69 before; 5.32).

    Untimed, for the tile search (``ssd_tiles --sections y dx pair_tiles order``), and so left at what the kernels
    did before:
    ``y`` and ``dx``, the forward's output kernel and the backward's ``d(dt·x)`` kernel (mamba_ssm's ``y`` and ``dx``
    kernels took 0.80 and 1.0 ms of GPU time to our 1.3 and 1.4 at T 16K on the H200) each with tiles of their own
    over the shared ones (:func:`_tiles`: rows, a column block of its own as mamba_ssm's ``BLOCK_SIZE_K``, warps,
    stages, and for ``y`` the head dim split over programs as mamba_ssm splits it), and ``pairs``, the log-decay
    pair kernel's warps and stages (its 0.85 ms to our 1.33); ``heads_inner``, the per-head scan kernels' programs
    ordered with the heads innermost (:func:`_chunk_and_head`)."""
    pow2 = lambda n: max(16, triton.next_power_of_2(n))  # noqa: E731
    tiles = dict(P=pow2(P), N=pow2(N), pair_rows=64, pair_cols=16, shared_scores=False, narrow_states=False,
                 heads_inner=False, y={}, dx={}, pairs={})
    small, fp32 = tiles["P"] * tiles["N"] <= 64 * 128, dtype == torch.float32
    roomy = small and not fp32  # room in the registers for the per-group kernels' larger tiles
    tiles.update(group_rows=32 if roomy else 16, group_block=64 if roomy else 32, group_warps=8)
    # _group_scores' blocks: in fp32, 64 × 64 on 4 warps spilled 7 KB (and needed 128 KiB at N 256, as launched)
    tiles.update(scores_block=32 if fp32 else 64, scores_warps=8 if fp32 else 4)
    if not cuda:  # the interpreter: small tiles, fewer wasted lanes
        return dict(tiles, rows=16, pair_rows=16, pair_cols=16, group_rows=16, group_block=16, group_warps=4, warps=4,
                    stages=1)
    if not fp32 and arch >= 90 and small:
        return dict(tiles, rows=64, warps=4, stages=2, shared_scores=True, narrow_states=True)
    if fp32:  # 64-row pair blocks needed 100 KiB at N 256 as launched: over a consumer GPU's 99
        return dict(tiles, rows=32, warps=8, stages=2, pair_rows=32)
    return dict(tiles, rows=32, warps=8, stages=2)


def _chunk_log_decays(dt: torch.Tensor, A: torch.Tensor, L: int) -> torch.Tensor:
    """``Λ [b, h, nc·L]`` fp32: the cumulative log-decay inside each chunk, padded with ``a = 0``."""
    batch, T, H = dt.shape
    a = dt.float() * A.float()  # [b, T, h]
    a = F.pad(a, (0, 0, 0, (-T) % L))  # [b, nc·L, h]
    lam = torch.cumsum(a.view(batch, -1, L, H), dim=2)  # [b, nc, L, h]
    return lam.permute(0, 3, 1, 2).reshape(batch, H, -1).contiguous()  # [b, h, nc·L]


def _chunk_state_call(X, dt, BM, lam, seg, T, L, forward: bool, blk: dict) -> torch.Tensor:
    batch, _, H, P = X.shape
    n_chunks, N = lam.shape[-1] // L, BM.shape[-1]
    out = torch.empty(batch, n_chunks, H, P, N, dtype=torch.float32, device=X.device)
    _chunk_state[(batch * n_chunks, H)](
        X, dt, BM, lam, lam if seg is None else seg, out, T, L, lam.shape[-1], n_chunks, H, BM.shape[2], P, N,
        *X.stride()[:3], *BM.stride()[:3], *dt.stride()[:2],
        DECAY_TO_END=forward, SCALE_BY_DT=forward, HAS_DOCS=seg is not None, BLOCK_L=blk["rows"], BLOCK_P=blk["P"], BLOCK_N=blk["N"],
        DOT=blk["dot"], num_warps=blk["warps"], num_stages=blk["stages"],
    )
    return out  # [b, nc, h, P, N]


def _decayed_scan_call(U, lam, seg, h0, T, L, reverse: bool, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(states [b, nc+1, h, P, N] in dtype, the last one [b, h, P, N] fp32)`` (:func:`_decayed_scan`)."""
    batch, n_chunks, H, P, N = U.shape
    out = torch.empty(batch, n_chunks + 1, H, P, N, dtype=dtype, device=U.device)
    final = torch.empty(batch, H, P, N, dtype=torch.float32, device=U.device)
    block = min(1024, triton.next_power_of_2(P * N))
    h0_arg = h0.contiguous() if h0 is not None else U
    _decayed_scan[(batch * H, triton.cdiv(P * N, block))](
        U, lam, lam if seg is None else seg, h0_arg, out, final, T, L, lam.shape[-1], n_chunks, H, P * N,
        HAS_H0=h0 is not None, REVERSE=reverse, HAS_DOCS=seg is not None, BLOCK=block,
    )
    return out, final


def _tiles(blk: dict, kernel: str) -> dict:
    """``rows``, ``cols`` (the column block each step of the in-chunk loop takes), ``warps``, ``stages`` and
    ``p_block`` (the head dim's columns one program makes; None: all) of one scan kernel — ``"y"``, ``"dx"`` (both
    ``d(dt·x)`` and ``dx``), ``"dC"``, ``"dB"`` (per head), ``"pairs"`` (the log-decay gradient's) — from
    ``launch_config``'s entry for it, over the shared ``rows`` (as ``cols`` too; ``pair_rows`` and ``pair_cols`` for
    the pairs), ``warps`` and ``stages``."""
    shared = dict(rows=blk["rows"], cols=blk["rows"], warps=blk["warps"], stages=blk["stages"], p_block=None)
    if kernel == "pairs":  # the log-decay gradient's pair kernel: its blocks are its own already
        shared.update(rows=blk["pair_rows"], cols=blk["pair_cols"])
    return {**shared, **blk.get(kernel, {})}


def _grid(chunks: int, blocks: int, H: int, heads_inner: bool) -> tuple[int, int, int]:
    """The per-head kernels' grid: ``(b·nc, blocks, h)``, or ``(b·nc·h, blocks, 1)`` with the heads innermost
    (:func:`_chunk_and_head`)."""
    return (chunks * H, blocks, 1) if heads_inner else (chunks, blocks, H)


def _scan_strides(Q, K, V, W, dt, out) -> tuple[int, ...]:
    """The batch, time and head strides of ``Q, K, V, W, out`` (``[b, T, heads, dim]``) and the batch and time strides
    of ``dt [b, T, h]``, in the kernels' order Q, K, V, W, dt, out (every last dimension is contiguous)."""
    return (*Q.stride()[:3], *K.stride()[:3], *V.stride()[:3], *W.stride()[:3], *dt.stride()[:2], *out.stride()[:3])


def _chunk_scan_call(Q, K, V, dt, lam, seg, states, D, out, T, L, trans_state: bool, blk: dict,
                     row_dots: tuple[torch.Tensor, torch.Tensor] | None = None, qk: torch.Tensor | None = None) -> None:
    """``row_dots = (W, into)``: also the read-out's row dots into ``into [b, h, nc·L]`` fp32; ``qk``: the group scores
    (:func:`_group_scores_call`) read in place of ``Q·Kᵀ`` (:func:`_chunk_scan`)."""
    batch, _, H, _ = out.shape
    n_chunks = lam.shape[-1] // L
    DQK, DV = Q.shape[-1], V.shape[-1]
    block_qk, block_v = (blk["N"], blk["P"]) if trans_state else (blk["P"], blk["N"])
    W, into = row_dots if row_dots is not None else (V, lam)
    tiles = _tiles(blk, "y" if trans_state else "dC")
    if tiles["p_block"] is not None and row_dots is None:  # y's columns split over programs (row dots need them all)
        block_v = min(block_v, tiles["p_block"])
    v_blocks = triton.cdiv(DV, block_v)
    _chunk_scan[_grid(batch * n_chunks, triton.cdiv(L, tiles["rows"]) * v_blocks, H, blk["heads_inner"])](
        Q, K, V, W, dt, lam, lam if seg is None else seg, states, D if D is not None else lam, lam if qk is None else qk,
        out, into,
        T, L, lam.shape[-1], n_chunks, H, Q.shape[2], K.shape[2], V.shape[2], DQK, DV,
        *_scan_strides(Q, K, V, W, dt, out), v_blocks,
        TRANS_STATE=trans_state, HAS_D=D is not None, HAS_DOCS=seg is not None, HAS_ROW_DOTS=row_dots is not None,
        HAS_QK=qk is not None, HEADS_INNER=blk["heads_inner"],
        BLOCK_L=tiles["rows"], BLOCK_M=tiles["cols"], BLOCK_QK=block_qk, BLOCK_V=block_v,
        DOT=blk["dot"], num_warps=tiles["warps"], num_stages=tiles["stages"],
    )


def _chunk_scan_reverse_call(Q, K, V, dt, lam, seg, d_states, out, T, L, trans_state: bool, blk: dict,
                             row_dots: tuple[torch.Tensor, torch.Tensor] | None = None,
                             dx_of: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor] | None = None,
                             qk: torch.Tensor | None = None) -> None:
    """``row_dots = (B, into)``: also the share terms ``U`` into ``into [b, h, nc·L]`` fp32; ``dx_of = (x, D, into)``
    (with ``trans_state``): ``out`` gets ``dx`` rather than ``d(dt·x)``, and ``into [b, h, nc·L]`` fp32 the rows'
    ``⟨x, d(dt·x)⟩``; ``qk``: the group scores read in place of ``Q·Kᵀ`` (:func:`_chunk_scan_reverse`)."""
    batch, _, H, _ = out.shape
    n_chunks = lam.shape[-1] // L
    block_qk, block_v = (blk["N"], blk["P"]) if trans_state else (blk["P"], blk["N"])
    W, D, row_into, x_into = V, None, lam, lam  # placeholders the kernel does not read
    if row_dots is not None:
        W, row_into = row_dots
    if dx_of is not None:
        W, D, x_into = dx_of
    tiles = _tiles(blk, "dx" if trans_state else "dB")
    _chunk_scan_reverse[_grid(batch * n_chunks, triton.cdiv(L, tiles["rows"]), H, blk["heads_inner"])](
        Q, K, V, W, dt, lam, lam if seg is None else seg, d_states, D if D is not None else lam,
        lam if qk is None else qk, out, row_into, x_into,
        T, L, lam.shape[-1], n_chunks, H, Q.shape[2], K.shape[2], V.shape[2], Q.shape[-1], V.shape[-1],
        *_scan_strides(Q, K, V, W, dt, out),
        TRANS_STATE=trans_state, SCALE_BY_DT=not trans_state, HAS_DOCS=seg is not None,
        HAS_ROW_DOTS=row_dots is not None, DX_EPILOGUE=dx_of is not None, HAS_D=D is not None, HAS_QK=qk is not None,
        HEADS_INNER=blk["heads_inner"], BLOCK_M=tiles["rows"], BLOCK_L=tiles["cols"], BLOCK_QK=block_qk,
        BLOCK_V=block_v, DOT=blk["dot"], num_warps=tiles["warps"], num_stages=tiles["stages"],
    )


def _group_scores_call(x, B, C, T: int, L: int, blk: dict) -> torch.Tensor | None:
    """``C_l·B_m`` per chunk and group, ``[b, nc, G, L, L]`` fp32 (:func:`_group_scores`), for the ``y`` and ``d(dt·x)``
    kernels to read — or None, and each head makes its own, unless ``launch_config`` asks for them
    (``shared_scores``) and they pay in bytes: heads share groups (``G < H``) and the scores, ``G·L`` fp32 per position,
    take no more than ``x`` (``H·P`` per position; a quarter of it at ``G = 1, H = 32, P = 64, L = 256`` in bf16). Off
    by default: untimed; ``python -m recipes.benchmarks.ssd_tiles`` times it (mamba_ssm's ``_bmm_chunk_fwd`` does the
    same; a torch einsum for it cost more than it saved, docs/kernels.md)."""
    (batch, _, H, P), (G, N) = x.shape, B.shape[2:]
    if not blk["shared_scores"] or G >= H or G * L * 4 > H * P * x.element_size():
        return None
    n_chunks, block = -(-T // L), min(blk["scores_block"], max(16, triton.next_power_of_2(L)))
    qk = torch.empty(batch, n_chunks, G, L, L, dtype=torch.float32, device=x.device)
    _group_scores[(batch * n_chunks, G, triton.cdiv(L, block) ** 2)](
        C, B, qk, T, L, n_chunks, G, N, *C.stride()[:3], *B.stride()[:3],
        BLOCK=block, BLOCK_N=blk["N"], DOT=blk["dot"], num_warps=blk["scores_warps"],
    )
    return qk  # [b, nc, G, L, L]


def _per_head_bc_grads(x, dy, B, C, dt, lam, seg, states, d_states, read, share, T: int, L: int,
                       blk: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dC, dB)`` made per head by the scans (fp32 ``[b, T, h, N]``), summed over each group; with the rows' read-out
    and share terms into ``read`` and ``share``."""
    (batch, _, H, _), (G, N) = x.shape, B.shape[2:]
    dC_heads, dB_heads = (torch.empty(batch, T, H, N, dtype=torch.float32, device=x.device) for _ in range(2))
    _chunk_scan_call(dy, x, B, dt, lam, seg, states, None, dC_heads, T, L, trans_state=False, blk=blk,
                     row_dots=(C, read))
    _chunk_scan_reverse_call(x, dy, C, dt, lam, seg, d_states, dB_heads, T, L, trans_state=False, blk=blk,
                             row_dots=(B, share))
    per_group = lambda t: t.view(batch, T, G, H // G, N)  # noqa: E731  [b, T, g, h/g, N]
    return per_group(dC_heads).sum(3).to(C.dtype), per_group(dB_heads).sum(3).to(B.dtype)


def _group_bc_grads_call(x, dy, B, C, dt, lam, seg, states, d_states, read, share, T: int, L: int,
                         blk: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dC, dB)`` made per group (:func:`_group_pair_grads`, then :func:`_group_bc_grads` twice), in ``C``'s and
    ``B``'s dtypes; with the rows' read-out and share terms into ``read`` and ``share``. For ``shared_scores``."""
    (batch, _, H, P), (G, N) = x.shape, B.shape[2:]
    n_chunks, Tp, seg_arg = lam.shape[-1] // L, lam.shape[-1], lam if seg is None else seg
    block = min(blk["group_block"], max(16, triton.next_power_of_2(L)))
    pairs = torch.empty(batch, n_chunks, G, L, L, dtype=torch.float32, device=x.device)  # blocks above: never read
    _group_pair_grads[(batch * n_chunks, G, triton.cdiv(L, block) ** 2)](
        x, dy, dt, lam, seg_arg, pairs, T, L, Tp, n_chunks, H, G, P, *x.stride()[:3], *dy.stride()[:3], *dt.stride()[:2],
        HAS_DOCS=seg is not None, BLOCK=block, BLOCK_P=blk["P"], DOT=blk["dot"], num_warps=blk["group_warps"],
    )
    dC, dB = torch.empty(C.shape, dtype=C.dtype, device=x.device), torch.empty(B.shape, dtype=B.dtype, device=x.device)
    for q, st, w, r, out, dots, source_rows in ((dy, states, C, B, dC, read, False), (x, d_states, B, C, dB, share, True)):
        _group_bc_grads[(batch * n_chunks, triton.cdiv(L, blk["group_rows"]), G)](
            q, st, w, r, dt, lam, seg_arg, pairs, out, dots, T, L, Tp, n_chunks, H, G, P, N,
            *q.stride()[:3], *w.stride()[:3], *r.stride()[:3], *dt.stride()[:2], *out.stride()[:3],
            SOURCE_ROWS=source_rows, HAS_DOCS=seg is not None, BLOCK_L=blk["group_rows"], BLOCK_M=blk["group_rows"],
            BLOCK_P=blk["P"], BLOCK_N=blk["N"], DOT=blk["dot"], num_warps=blk["group_warps"], num_stages=blk["stages"],
        )
    return dC, dB


def _blk(x, B, C) -> dict:
    """Tiles sized for the widest operand: fp32 B, C beside a bf16 x (RoPE tables under autocast) need the fp32
    tiles, or the shared memory outgrows smaller GPUs; fp32 dots as torch's matmuls."""
    widest = torch.float32 if torch.float32 in (x.dtype, B.dtype, C.dtype) else x.dtype
    major, minor = torch.cuda.get_device_capability(x.device) if x.is_cuda else (9, 0)
    blk = launch_config(x.shape[3], B.shape[3], x.is_cuda, widest, 10 * major + minor)
    return {**blk, "dot": dot_precision(), "states": x.dtype if blk["narrow_states"] else torch.float32}


def _segments(document_starts: torch.Tensor | None) -> torch.Tensor | None:
    """``[b, T]`` int32: each position's document, 0 before the first start (the initial state's)."""
    return None if document_starts is None else document_starts.to(torch.int32).cumsum(1, dtype=torch.int32)


# Registered as torch.library ops, opaque to torch.compile (traced as an autograd.Function, the wrapper's
# host-side settings broke a fullgraph compile), as the attention kernel is.
@torch.library.custom_op("hybrid_zoo::ssd_scan", mutates_args=())
def ssd_scan_op(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                D: torch.Tensor | None, initial_state: torch.Tensor | None, document_starts: torch.Tensor | None,
                chunk_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, final_state, Λ [b,h,nc·L])``; Λ is kept for the backward."""
    T, L = x.shape[1], chunk_size
    x, dt, B, C = (unit_stride_last(t) for t in (x, dt, B, C))
    blk = _blk(x, B, C)
    lam = _chunk_log_decays(dt, A, L)  # [b, h, nc·L]
    seg = _segments(document_starts)
    states, final = _entering_states(x, dt, B, lam, seg, initial_state, T, L, blk)  # [b, nc+1, h, P, N]
    y = torch.empty_like(x)
    qk = _group_scores_call(x, B, C, T, L, blk)  # [b, nc, G, L, L] or None
    _chunk_scan_call(C, B, x, dt, lam, seg, states, D, y, T, L, trans_state=True, blk=blk, qk=qk)
    return y, final, lam


def _entering_states(x, dt, B, lam, seg, initial_state, T: int, L: int, blk: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The state entering each chunk, and the final one: ``[b, nc+1, h, P, N]`` (fp32, or x's dtype with
    ``narrow_states``), and the final one again in fp32 (``[b, h, P, N]``). The backward computes them
    again rather than keep them from the forward (as mamba_ssm does): in fp32 they are 4× the bytes of a bf16
    ``x`` at P 64, N 128 (2× in fp32), for two of the forward's three kernels run again."""
    chunk_states = _chunk_state_call(x, dt, B, lam, seg, T, L, forward=True, blk=blk)  # [b, nc, h, P, N]
    return _decayed_scan_call(chunk_states, lam, seg, initial_state, T, L, reverse=False, dtype=blk["states"])


@ssd_scan_op.register_fake
def _(x, dt, A, B, C, D, initial_state, document_starts, chunk_size):
    batch, T, H, P = x.shape
    N, chunks = B.shape[3], -(-T // chunk_size)
    return (x.new_empty(x.shape), x.new_empty(batch, H, P, N, dtype=torch.float32),
            x.new_empty(batch, H, chunks * chunk_size, dtype=torch.float32))


@torch.library.custom_op("hybrid_zoo::ssd_scan_backward", mutates_args=())
def ssd_scan_backward_op(dy: torch.Tensor, d_final: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                         B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None, initial_state: torch.Tensor | None,
                         document_starts: torch.Tensor | None, lam: torch.Tensor, chunk_size: int
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                    torch.Tensor]:
    """``(dx, d_dt, dA, dB, dC, dD, d_initial)``; ``dD`` is empty without ``D``; ``d_initial`` is fp32."""
    batch, T, H, P = x.shape
    L = chunk_size
    x, dt, B, C, dy = (unit_stride_last(t) for t in (x, dt, B, C, dy))
    blk, seg = _blk(x, B, C), _segments(document_starts)
    states, _ = _entering_states(x, dt, B, lam, seg, initial_state, T, L, blk)  # [b, nc+1, h, P, N]

    # dE: what the read-outs send to each entering state, then the reverse recurrence over chunks.
    read_out = _chunk_state_call(dy, dt, C, lam, seg, T, L, forward=False, blk=blk)  # [b, nc, h, P, N]
    d_states, d_initial = _decayed_scan_call(read_out, lam, seg, d_final, T, L, reverse=True,
                                             dtype=blk["states"])  # [b, nc+1, h, P, N], [b, h, P, N] fp32

    # the log-decay gradient's read-out and share terms per row, made beside dC and dB (from their state products)
    read, share = (torch.empty(batch, H, lam.shape[-1], dtype=torch.float32, device=x.device) for _ in range(2))
    qk = _group_scores_call(x, B, C, T, L, blk)  # made again rather than kept from the forward
    if qk is None:  # per head: dC and dB summed over each group afterwards
        dC, dB = _per_head_bc_grads(x, dy, B, C, dt, lam, seg, states, d_states, read, share, T, L, blk)
    else:  # per group: the heads' in-chunk terms summed first, their state terms inside the kernel
        dC, dB = _group_bc_grads_call(x, dy, B, C, dt, lam, seg, states, d_states, read, share, T, L, blk)

    dx = torch.empty_like(x)
    ddt_x = torch.empty(batch, H, lam.shape[-1], dtype=torch.float32, device=x.device)  # ⟨x, d(dt·x)⟩ per row
    _chunk_scan_reverse_call(B, C, dy, dt, lam, seg, d_states, dx, T, L, trans_state=True, blk=blk, dx_of=(x, D, ddt_x),
                             qk=qk)
    ddt_x = ddt_x.transpose(1, 2)[:, :T]  # [b, T, h]

    da = _log_decay_gradient_call(x, dy, B, C, dt, lam, seg, states, d_states, read, share, T, L, blk,
                                  qk)  # [b, T, h]
    d_dt = (ddt_x + da * A.float()).to(dt.dtype)
    dA = (da * dt.float()).sum((0, 1)).to(A.dtype)
    dD = (dy.float() * x.float()).sum((0, 1, 3)).to(D.dtype) if D is not None else x.new_empty(0)
    return dx, d_dt, dA, dB, dC, dD, d_initial


@ssd_scan_backward_op.register_fake
def _(dy, d_final, x, dt, A, B, C, D, initial_state, document_starts, lam, chunk_size):
    batch, _, H, P = x.shape
    return (x.new_empty(x.shape), dt.new_empty(dt.shape), A.new_empty(A.shape), B.new_empty(B.shape),
            C.new_empty(C.shape), D.new_empty(D.shape) if D is not None else x.new_empty(0),
            x.new_empty(batch, H, P, B.shape[3], dtype=torch.float32))


def _ssd_setup_context(ctx, inputs, output):
    x, dt, A, B, C, D, initial_state, document_starts, chunk_size = inputs
    _, final_state, lam = output
    ctx.save_for_backward(x, dt, A, B, C, D, initial_state, document_starts, lam)  # not the states: recomputed
    ctx.chunk_size, ctx.final_shape = chunk_size, final_state.shape
    ctx.initial_dtype = initial_state.dtype if initial_state is not None else None


def _ssd_backward(ctx, dy, d_final, _dlam):
    x, dt, A, B, C, D, initial_state, document_starts, lam = ctx.saved_tensors
    dy = torch.zeros_like(x) if dy is None else dy
    d_final = x.new_zeros(ctx.final_shape, dtype=torch.float32) if d_final is None else d_final
    dx, d_dt, dA, dB, dC, dD, d_initial = ssd_scan_backward_op(dy, d_final, x, dt, A, B, C, D, initial_state,
                                                               document_starts, lam, ctx.chunk_size)
    return (dx, d_dt, dA, dB, dC, dD if D is not None else None,
            d_initial.to(ctx.initial_dtype) if ctx.initial_dtype is not None else None, None, None)


ssd_scan_op.register_autograd(_ssd_backward, setup_context=_ssd_setup_context)


def ssd_scan_triton(x, dt, A, B, C, *, chunk_size: int = 64, D=None, initial_state=None, document_starts=None):
    """Same contract as :func:`kernels.ssd.reference.ssd_chunked`: returns ``(y [b,T,h,P] in x's dtype,
    final_state [b,h,P,N] fp32)``; ``document_starts [b, T]`` bool resets the state where True."""
    # Views are read through their strides (x, B, C and dt split from one projection are not copied); only a last
    # dimension that is not contiguous is copied, here, once: the op saves what it is given.
    x, dt, B, C = (unit_stride_last(t) for t in (x, dt, B, C))
    y, final, _ = ssd_scan_op(x, dt, A, B, C, D, initial_state, document_starts, int(chunk_size))
    return y, final


def _log_decay_gradient_call(x, dy, B, C, dt, lam, seg, states, d_states, read, share, T: int, L: int,
                             blk: dict, qk: torch.Tensor | None = None) -> torch.Tensor:
    """``da [b, T, h]`` fp32, the gradient of each step's log-decay ``a_k = dt_k A``, summed term by term.

    ``a_k`` enters every decay ``exp(Λ_l − Λ_m)`` with ``m < k ≤ l`` (inside a chunk), every read-out
    ``exp(Λ_l)`` of the entering state with ``l ≥ k``, every share ``exp(α_c − Λ_m)`` of the chunk's final
    state with ``m < k``, and the carry ``exp(α_c)`` of the entering state. So

        da_k = Σ_{l≥k} Σ_{m<k} T_lm + Σ_{l≥k} R_l + Σ_{m<k} U_m + exp(α_c) ⟨G_{c+1}, E_c⟩

    with ``T_lm = (dy_l·x_m)(C_l·B_m) exp(Λ_l − Λ_m) dt_m``, ``R_l = exp(Λ_l) ⟨dy_l, E_c C_l⟩`` and
    ``U_m = dt_m exp(α_c − Λ_m) ⟨x_m, G_{c+1} B_m⟩`` (``E_c`` the entering state, ``G_{c+1}`` the gradient of the
    chunk's final one), each under the documents' masks. Every term is added once: the shorter route, a reverse
    cumulative sum of ``∂/∂Λ_l``, adds each pair term once and subtracts it once (mamba_ssm keeps it as
    ``_chunk_scan_bwd_ddAcs_unstable``); in fp16 at L = 256 with small dt its dA error was twice what the inputs'
    rounding gives. The pairs are summed inside :func:`_log_decay_pairs` (no ``[L, L]`` tensor: the plain-torch form
    this replaced made several ``[b, nc, h, L, L]`` ones), the carry by :func:`_state_dots`; the rows' ``R`` and ``U``
    come in as ``read`` and ``share`` (``[b, h, nc·L]`` fp32), made by the ``dC`` and ``dB`` kernels from the state
    products they compute anyway (a kernel of their own, which read both fp32 states once per row block, took 0.62 ms
    of the 3.8 ms backward on an H100 at B 4, T 4096, H 32). What is left here is ``[b, T, h]``-sized."""
    batch, _, H, P = x.shape
    n_chunks, N, Tp = lam.shape[-1] // L, B.shape[-1], lam.shape[-1]
    seg_arg = lam if seg is None else seg
    strides = (*x.stride()[:3], *dy.stride()[:3], *B.stride()[:3], *C.stride()[:3], *dt.stride()[:2])
    tiles = _tiles(blk, "pairs")
    rows, cols = tiles["rows"], tiles["cols"]
    # [b, nc, row blocks, h, L]; zeros: the columns past a block's rows are not written
    pairs = torch.zeros(batch, n_chunks, triton.cdiv(L, rows), H, L, dtype=torch.float32, device=x.device)
    _log_decay_pairs[_grid(batch * n_chunks, triton.cdiv(L, rows), H, blk["heads_inner"])](
        x, dy, B, C, dt, lam, seg_arg, lam if qk is None else qk, pairs, T, L, Tp, n_chunks, H, B.shape[2], P, N,
        *strides, HAS_DOCS=seg is not None, HAS_QK=qk is not None, HEADS_INNER=blk["heads_inner"], BLOCK_L=rows,
        BLOCK_M=cols, BLOCK_P=blk["P"], BLOCK_N=blk["N"], DOT=blk["dot"], num_warps=tiles["warps"],
        num_stages=tiles["stages"],
    )
    block = min(1024, triton.next_power_of_2(P * N))
    dots = torch.empty(batch, n_chunks, H, triton.cdiv(P * N, block), dtype=torch.float32, device=x.device)
    _state_dots[(batch * H, triton.cdiv(P * N, block))](states, d_states, dots, n_chunks, H, P * N, BLOCK=block)

    chunked = lambda t: t.view(batch, H, n_chunks, L)  # noqa: E731  [b, h, nc·L] -> [b, h, nc, L]
    lam_c, read, share = chunked(lam), chunked(read), chunked(share)
    carry = torch.exp(lam_c[..., -1]) * dots.sum(-1).permute(0, 2, 1)  # [b, h, nc]
    if seg is not None:  # the entering state is carried across the chunk only when no document starts in it
        ends = torch.clamp(torch.arange(n_chunks, device=x.device) * L + L - 1, max=T - 1)
        seg_end = seg[:, ends]  # [b, nc]
        seg_before = F.pad(seg_end[:, :-1], (1, 0), value=0)  # the state entering chunk c: position cL − 1's
        carry = torch.where((seg_before == seg_end)[:, None], carry, 0.0)
    da = (pairs.sum(2).permute(0, 2, 1, 3)  # [b, h, nc, L]
          + read.flip(-1).cumsum(-1).flip(-1)  # Σ_{l≥k} R_l
          + F.pad(share.cumsum(-1)[..., :-1], (1, 0))  # Σ_{m<k} U_m
          + carry[..., None])
    return da.reshape(batch, H, n_chunks * L).transpose(1, 2)[:, :T]  # [b, T, h]
