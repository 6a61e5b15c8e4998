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
``torch.set_float32_matmul_precision("high")`` (``zoo_kernels._backend.dot_precision``).
"""


import triton
import triton.language as tl


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
def _chunk_head_block(H, BLOCKS, ORDER: tl.constexpr):
    """``(b·nc, h, block)`` of this program on a per-head kernel's grid (``triton.py``'s ``_grid``), by ``ORDER``:
    ``"chunks"``, grid (b·nc, blocks, h); ``"heads"``, (b·nc·h, blocks, 1), so that the programs launched together
    are one chunk's heads, reading its group's ``B``, ``C`` and scores while they are still in L2; ``"blocks"``,
    (b·nc·h·blocks, 1, 1), one chunk's heads each with its ``BLOCKS`` blocks innermost, which also read the head's
    state and rows of the chunk while they are in L2. Every count on axis 0: up to 2^31 − 1. The per-group kernels
    take it with the groups for the heads: with the chunks innermost, each of their blocks of rows reads every
    chunk's states again (at T 16K, B 4, 32 heads, bf16 states: 134 MB, more than an H200's L2, once per block)."""
    if ORDER == "blocks":
        pid = tl.program_id(0)
        bc, h, blk = pid // (H * BLOCKS), (pid // BLOCKS) % H, pid % BLOCKS
    elif ORDER == "heads":
        bc, h, blk = tl.program_id(0) // H, tl.program_id(0) % H, tl.program_id(1)
    else:
        bc, h, blk = tl.program_id(0), tl.program_id(2), tl.program_id(1)
    return bc, h, blk


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
def _pair_block(n_chunks, G, L, BLOCK: tl.constexpr, GROUP_ORDER: tl.constexpr):
    """This program's ``(b, c, g, i, j)`` on a grid of row blocks × column blocks per chunk and group
    (:func:`_chunk_head_block`): block ``(i, j)`` of chunk ``c``'s ``[L, L]`` pairs in group ``g`` (the callers work
    only where ``j ≤ i``)."""
    blocks = tl.cdiv(L, BLOCK)
    bc, g, blk = _chunk_head_block(G, blocks * blocks, GROUP_ORDER)
    return bc // n_chunks, bc % n_chunks, g, blk // blocks, blk % blocks


@triton.jit
def _group_scores(C, B, QK, T, L, n_chunks, G, N, sc_b, sc_t, sc_h, sb_b, sb_t, sb_h,
                  BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr, GROUP_ORDER: tl.constexpr):
    """``QK[b, c, g, l, m] = C_l·B_m`` fp32 in chunk ``c`` for the blocks on and below the diagonal (the pairs
    ``m ≤ l`` the scans read; the blocks above are never written): the in-chunk products, made once for the heads
    that share group ``g``. Rows past ``T`` load as zeros. Grid: row blocks × column blocks per chunk and group, in
    GROUP_ORDER (:func:`_chunk_head_block`)."""
    b, c, g, i, j = _pair_block(n_chunks, G, L, BLOCK, GROUP_ORDER)
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
                      HAS_DOCS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, DOT: tl.constexpr,
                      GROUP_ORDER: tl.constexpr):
    """``OUT[b, c, g, l, m] = Σ_{h in g} (dy_l·x_m) exp(Λ_l − Λ_m) dt_m`` (summed in fp32, stored in OUT's dtype) for the
    pairs ``m ≤ l`` of one document in chunk ``c`` (0 elsewhere in the blocks on and below the diagonal; the blocks
    above are never written): what the group's in-chunk products ``C_l·B_m`` receive, summed over the heads that share
    them, so that ``dC_l`` takes ``Σ_m OUT_lm B_m`` and ``dB_m`` takes ``Σ_l OUT_lm C_l`` once per group rather than
    once per head (mamba_ssm's ``dCB``). The program loops over the group's heads. Grid: row blocks × column blocks per
    chunk and group, in GROUP_ORDER (:func:`_chunk_head_block`)."""
    b, c, g, i, j = _pair_block(n_chunks, G, L, BLOCK, GROUP_ORDER)
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
        tl.store(_group_score_tile(OUT, b, c, n_chunks, g, G, L, offs_l, offs_m), acc.to(OUT.dtype.element_ty),
                 mask=(offs_l < L)[:, None] & (offs_m < L)[None, :])


@triton.jit
def _group_bc_grads(Q, STATES, W, R, DT, LAM, SEG, PAIRS, OUT, ROW_DOTS, T, L, Tp, n_chunks, H, G, P, N, DOTS_SPLIT,
                    sq_b, sq_t, sq_h, sw_b, sw_t, sw_h, sr_b, sr_t, sr_h, sdt_b, sdt_t, so_b, so_t, so_h,
                    SOURCE_ROWS: tl.constexpr, HAS_DOCS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, N_BLOCKS: tl.constexpr, DOT: tl.constexpr,
                    GROUP_ORDER: tl.constexpr):
    """``dC`` or ``dB`` of group ``g`` for one block of rows of chunk ``c``, in OUT's dtype: the group's heads' state
    terms summed in the program, and the in-chunk term once, from :func:`_group_pair_grads`' ``PAIRS``.

    Rows ``l`` (``Q, STATES, W, R = dy, E, C, B``): ``dC_l = Σ_{h in g} exp(Λ_l) dy_l E_c + Σ_{m≤l} PAIRS_lm B_m``, and
    per head the log-decay gradient's read-out term ``R_l = ⟨exp(Λ_l) dy_l E_c, C_l⟩``.
    SOURCE_ROWS, rows ``m`` (``Q, STATES, W, R = x, G, B, C``): ``dB_m = Σ_{h in g} dt_m exp(α_c − Λ_m) x_m G_{c+1} +
    Σ_{l≥m} PAIRS_lm C_l``, and per head the share term ``U_m = ⟨dt_m exp(α_c − Λ_m) x_m G_{c+1}, B_m⟩``.
    The row dots go to ``ROW_DOTS [b, h, nc·L]`` fp32; a head's state term counts only in the document its state
    belongs to. ``STATES [b, nc+1, h, P, N]`` fp32. With the state's ``N`` split over ``N_BLOCKS`` programs of
    ``BLOCK_N`` columns, each writes its share of the row dots ``DOTS_SPLIT`` entries apart, for the caller to sum
    (a constexpr: with one block the code is the unsplit kernel's, which the split's index arithmetic made spill 8
    bytes at P 64, N 256 on sm_90). Grid: the chunk's row blocks × N_BLOCKS per chunk and group, in GROUP_ORDER
    (:func:`_chunk_head_block`)."""
    bc, g, pid_ln = _chunk_head_block(G, tl.cdiv(L, BLOCK_L) * N_BLOCKS, GROUP_ORDER)
    b, c = bc // n_chunks, bc % n_chunks
    pid, pid_n = pid_ln // N_BLOCKS, pid_ln % N_BLOCKS
    offs_p, offs_n = tl.arange(0, BLOCK_P), pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
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
        tl.store(ROW_DOTS + pid_n.to(tl.int64) * DOTS_SPLIT + ((b.to(tl.int64) * H + h) * Tp + c * L) + offs,
                 tl.sum(term * w.to(tl.float32), axis=1), mask=offs < L)
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
                HAS_QK: tl.constexpr, ORDER: tl.constexpr,
                BLOCK_L: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_QK: tl.constexpr, BLOCK_V: tl.constexpr, DOT: tl.constexpr):
    """``OUT_l = Σ_{m≤l} (Q_l·K_m) exp(Λ_l − Λ_m) dt_m V_m + exp(Λ_l) Q_l M_c (+ D V_l)`` per head, with
    ``M_c [DQK, DV]`` the entering state ``STATES[b, c, h]`` (``[P, N]``, transposed when TRANS_STATE). With
    HAS_ROW_DOTS, also the state read-out's row dots ``ROW_DOTS[b, h, cL + l] = ⟨W_l, exp(Λ_l) Q_l M_c⟩`` fp32 (``W``
    read as ``V`` is, ``[b, T, V_HEADS, DV]``).

    Forward: ``Q, K, V = C, B, x`` gives ``y`` (with HAS_QK its products ``Q_l·K_m`` read from ``QK [b, nc, K_HEADS,
    L, L]`` fp32, :func:`_group_scores`, instead of made per head). Backward: ``Q, K, V = dy, x, B`` gives ``dC`` per
    head, and with ``W = C`` the read-out term ``R_l = exp(Λ_l)⟨dy_l, E_c C_l⟩`` of the log-decay gradient.
    A program makes ``BLOCK_V`` of the ``DV`` columns, one of ``V_BLOCKS`` (more than one only without HAS_ROW_DOTS,
    whose sums run over every column). Grid: row blocks × V_BLOCKS per chunk and head, in ORDER
    (:func:`_chunk_head_block`)."""
    bc, h, blk = _chunk_head_block(H, tl.cdiv(L, BLOCK_L) * V_BLOCKS, ORDER)
    pid_l, pid_v = blk // V_BLOCKS, blk % V_BLOCKS
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
            # rows past the chunk (a tile longer than its end) would read the next chunk's scores, or past QK's end
            qk = tl.load(_group_score_tile(QK, b, c, n_chunks, k_head, K_HEADS, L, offs_l, offs_m),
                         mask=causal & (offs_l < L)[:, None], other=0.0)
        else:
            qk = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT)
        s = qk * decay * dt_m[None, :]  # [BLOCK_L, BLOCK_M]
        acc += tl.dot(s.to(v.dtype), v, input_precision=DOT)

    if HAS_D:  # forward only, where V is x
        v_l = tl.load(_rows(V, b, c, L, sv_b, sv_t, sv_h, v_head, offs_l, offs_v), mask=valid_l[:, None] & in_v, other=0.0)
        acc += tl.load(DSKIP + h).to(tl.float32) * v_l.to(tl.float32)
    tl.store(_rows(OUT, b, c, L, so_b, so_t, so_h, h, offs_l, offs_v), acc.to(OUT.dtype.element_ty), mask=valid_l[:, None] & in_v)


@triton.jit
def _chunk_scan_reverse(Q, K, V, W, DT, LAM, SEG, DSTATES, DSKIP, QK, OUT, ROW_DOTS, X_DOTS, D_DOTS, T, L, Tp, n_chunks,
                        H, Q_HEADS, K_HEADS, V_HEADS, DQK, DV, sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sw_b,
                        sw_t, sw_h, sdt_b, sdt_t, so_b, so_t, so_h,
                        TRANS_STATE: tl.constexpr, SCALE_BY_DT: tl.constexpr, HAS_DOCS: tl.constexpr,
                        HAS_ROW_DOTS: tl.constexpr, DX_EPILOGUE: tl.constexpr, HAS_D: tl.constexpr, HAS_QK: tl.constexpr,
                        ORDER: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_QK: tl.constexpr, BLOCK_V: tl.constexpr, DOT: tl.constexpr):
    """The transpose of :func:`_chunk_scan`, for source rows ``m`` of chunk ``c``, streaming the rows
    ``l ≥ m``: ``OUT_m = [Σ_{l≥m} (Q_m·K_l) exp(Λ_l − Λ_m) V_l + exp(α_c − Λ_m) Q_m M_c] (· dt_m)``, fp32,
    with ``M_c`` from ``dS_c = DSTATES[b, c+1, h]`` (``[P, N]``, transposed when TRANS_STATE).

    ``W`` is read as ``V`` is. ``Q, K, V = x, dy, C`` (SCALE_BY_DT) gives ``dB`` per head, and with HAS_ROW_DOTS and
    ``W = B`` the log-decay gradient's share term ``ROW_DOTS[b, h, cL + m] = U_m = dt_m exp(α_c − Λ_m)⟨x_m, G_{c+1}
    B_m⟩``, from the state's term before the in-chunk ones join it. ``Q, K, V = B, C, dy`` (TRANS_STATE) gives
    ``d(dt·x)``; with DX_EPILOGUE (``W = x``, ``D`` when HAS_D) what the host wants of it instead, none of it through
    an fp32 ``d(dt·x)`` written and read back: ``OUT_m = dt_m d(dt·x)_m (+ D dy_m)``, which is ``dx``, in OUT's dtype,
    and ``X_DOTS[b, h, cL + m] = ⟨x_m, d(dt·x)_m⟩``, the part of ``d dt`` through ``x``, and with HAS_D
    ``D_DOTS[b, h, cL + m] = ⟨dy_m, x_m⟩``, whose sum is ``dD`` (no fp32 copies of ``x`` and ``dy`` in torch). (``U``
    is made in the ``dB`` kernel, not beside ``dx`` whose state term has it too: there it spilled 40 bytes at P = N =
    128 on sm_90.) With HAS_QK (the ``d(dt·x)`` call) the products ``Q_m·K_l = C_l·B_m`` are read, transposed, from
    ``QK [b, nc, K_HEADS, L, L]`` fp32 (:func:`_group_scores`). Grid: the chunk's row blocks per chunk and head, in
    ORDER (:func:`_chunk_head_block`)."""
    bc, h, pid_m = _chunk_head_block(H, tl.cdiv(L, BLOCK_M), ORDER)
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
    if HAS_D:  # with DX_EPILOGUE, where V is dy and W is x
        v_m = tl.load(_rows(V, b, c, L, sv_b, sv_t, sv_h, v_head, offs_m, offs_v), mask=valid_m[:, None] & in_v, other=0.0)
        acc += tl.load(DSKIP + h).to(tl.float32) * v_m.to(tl.float32)
        tl.store(D_DOTS + row_out, tl.sum(v_m.to(tl.float32) * w.to(tl.float32), axis=1), mask=offs_m < L)
    tl.store(_rows(OUT, b, c, L, so_b, so_t, so_h, h, offs_m, offs_v), acc.to(OUT.dtype.element_ty),
             mask=valid_m[:, None] & in_v)


@triton.jit
def _log_decay_pairs(X, DY, BM, CM, DT, LAM, SEG, QK, OUT, T, L, Tp, n_chunks, H, BC_HEADS, P, N,
                     sx_b, sx_t, sx_h, sdy_b, sdy_t, sdy_h, sb_b, sb_t, sb_h, sc_b, sc_t, sc_h, sdt_b, sdt_t,
                     HAS_DOCS: tl.constexpr, HAS_QK: tl.constexpr, ORDER: tl.constexpr, BLOCK_L: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, DOT: tl.constexpr):
    """The pair terms of the log-decay gradient, for the rows ``l`` of one block: ``OUT[b, c, block, h, k] =
    Σ_{l in block, l≥k} Σ_{m<k} T_lm`` with ``T_lm = (dy_l·x_m)(C_l·B_m) exp(Λ_l − Λ_m) dt_m`` (pairs in one
    document). A program keeps its rows' ``Σ_{m<k} T_lm`` as a running sum over the column blocks, so no ``[L, L]``
    tensor is written; the blocks' parts are summed afterwards (no atomics). With HAS_QK the products ``C_l·B_m`` are
    read from the group's ``QK [b, nc, BC_HEADS, L, L]`` (:func:`_group_scores`). Grid: the chunk's row blocks per
    chunk and head, in ORDER (:func:`_chunk_head_block`)."""
    blocks = tl.cdiv(L, BLOCK_L)
    bc, h, pid_l = _chunk_head_block(H, blocks, ORDER)
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
    out = OUT + (((b.to(tl.int64) * n_chunks + c) * blocks + pid_l) * H + h) * L

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
