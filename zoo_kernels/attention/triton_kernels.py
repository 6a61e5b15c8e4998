"""Triton flash attention with an additive per-key bias: forward and backward in O(T) memory.

    scores[t, s] = scale · ⟨q_t, k_s⟩ + bias[s]      masked: causal (bottom-right), key padding
    out_t        = softmax_s(scores[t]) · V

Forward: one program per (query block, batch·head) streams the key blocks with the online softmax
and keeps the row log-sum-exp ``lse`` for the backward; never a ``[T, S]`` tensor. Backward
(FlashAttention-2): ``Δ_t = ⟨dO_t, O_t⟩``, then one kernel per key block that loops over query blocks
and accumulates ``dK``, ``dV`` and the bias gradient ``dbias[s] = Σ_t dS[t, s]`` in registers, and
one kernel per query block for ``dQ``. Every output element is written by exactly one program: no
atomics, so the bias gradient is deterministic (FlexAttention's learned-bias gradient is not).
With grouped-query attention, ``dK``/``dV`` are computed per query head and summed over each group
afterwards, also without atomics.

``keep_window`` becomes one threshold per query, computed beforehand in O(T) memory (window.py),
which the score mask tests beside causality and padding; the backward uses the same mask.
A query with no allowed key returns zeros, as in the reference. Accumulation is in fp32.
"""

import triton
import triton.language as tl


@triton.jit
def _scores(q, k, bias_ptr, pad_ptr, doc_ptr, win_b, win_j, offs_m, offs_n, T, S, scale,
            HAS_BIAS: tl.constexpr, HAS_PAD: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
            HAS_DOCS: tl.constexpr, DOT: tl.constexpr):
    """``[BLOCK_M, BLOCK_N]`` biased scores and the mask of allowed (query, key) pairs.

    With documents (``S == T``), a query keeps to the keys of its own document.

    With a window, ``win_b, win_j [BLOCK_M]`` are each query's threshold (window.py): key ``j`` stays
    when ``(bias_j, j)`` is at least the query's ``w``-th best allowed ``(bias, position)``."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT) * scale
    valid = (offs_m[:, None] < T) & (offs_n[None, :] < S)
    key_bias = offs_n.to(tl.float32) * 0.0  # without a bias every key ties at 0
    if HAS_BIAS:
        key_bias = tl.load(bias_ptr + offs_n, mask=offs_n < S, other=0.0).to(tl.float32)
        s += key_bias[None, :]
    if HAS_PAD:
        padded = tl.load(pad_ptr + offs_n, mask=offs_n < S, other=1)
        valid = valid & (padded == 0)[None, :]
    if CAUSAL:
        valid = valid & (offs_n[None, :] <= offs_m[:, None] + (S - T))
    if HAS_DOCS:
        doc_q = tl.load(doc_ptr + offs_m, mask=offs_m < T, other=-1)
        doc_k = tl.load(doc_ptr + offs_n, mask=offs_n < S, other=-2)
        valid = valid & (doc_q[:, None] == doc_k[None, :])
    if HAS_WINDOW:
        above = key_bias[None, :] > win_b[:, None]
        tie_newer = (key_bias[None, :] == win_b[:, None]) & (offs_n[None, :] >= win_j[:, None])
        valid = valid & (above | tie_newer)
    return s, valid


@triton.jit
def online_softmax_step(s, valid, v_ptrs, kv_mask, m_i, l_i, acc, DOT: tl.constexpr):
    """One block of keys into the running softmax of each row: scores ``s [M, N]`` (allowed where ``valid``), the
    values' pointers ``v_ptrs [N, D]`` (loaded where ``kv_mask``); ``m_i`` the rows' running maximum, ``l_i`` their
    sum of ``exp(s − m_i)``, ``acc [M, D]`` their sum of ``exp(s − m_i) · v``. Returns the three updated. A row with
    nothing allowed yet keeps ``m = −inf``, ``l = 0`` and ``acc = 0``. The values are loaded after the
    probabilities: loaded before, the flash forward spilled 8-24 bytes with documents (sm_80 at head dims 80-128,
    sm_90 at 256)."""
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing allowed yet
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT)
    return m_new, l_i, acc


@triton.jit
def _head(b, h, s_b, s_h):
    """Offset of (batch ``b``, head ``h``) in a ``[B, T, H, D]`` tensor, 64-bit: ``(B−1)·T·H·D``
    passes 2^31 at B ≥ 5, T = 128K, H 32, D 128. Each kernel moves its pointers there once; the
    offsets inside one sequence stay 32-bit (64-bit row offsets cost registers and spill on sm_90:
    recipes.benchmarks.compile_check), so the host refuses rows reaching 2^31 (``_check_index_range``)."""
    return b.to(tl.int64) * s_b + h.to(tl.int64) * s_h


@triton.jit
def _tile(ptr, offs, s_t, offs_d):
    """Pointers to rows ``offs`` of a ``[T, D]`` slice with row stride ``s_t``."""
    return ptr + (offs[:, None] * s_t + offs_d[None, :])


@triton.jit
def _window_rows(WIN_B, WIN_J, bh, T, offs_m, HAS_WINDOW: tl.constexpr):
    """The window thresholds of these query rows (unused placeholders without a window)."""
    if HAS_WINDOW:
        win_b = tl.load(WIN_B + bh.to(tl.int64) * T + offs_m, mask=offs_m < T, other=float("-inf"))
        win_j = tl.load(WIN_J + bh.to(tl.int64) * T + offs_m, mask=offs_m < T, other=-1)
    else:
        win_b = offs_m.to(tl.float32) * 0.0
        win_j = offs_m * 0
    return win_b, win_j


@triton.jit
def _backward_rows(Q, DO, LSE, DELTA, WIN_B, WIN_J, bh, offs_m, offs_d, in_d, sq_b, sq_t, sq_h, T,
                   HAS_WINDOW: tl.constexpr):
    """What both backward kernels read for a block of query rows: q, dO, lse, Δ and the window.

    The load order matters to the compiler: with Δ before the window, ``_backward_kv`` spills 24 bytes
    per thread on sm_90 in bf16 (``python -m recipes.benchmarks.compile_check``); in this order, none."""
    q_mask = (offs_m[:, None] < T) & in_d
    q = tl.load(_tile(Q, offs_m, sq_t, offs_d), mask=q_mask, other=0.0)
    do = tl.load(_tile(DO, offs_m, sq_t, offs_d), mask=q_mask, other=0.0)
    lse = tl.load(LSE + bh.to(tl.int64) * T + offs_m, mask=offs_m < T, other=float("inf"))
    win_b, win_j = _window_rows(WIN_B, WIN_J, bh, T, offs_m, HAS_WINDOW)
    delta = tl.load(DELTA + bh.to(tl.int64) * T + offs_m, mask=offs_m < T, other=0.0)
    return q, do, lse, delta, win_b, win_j


@triton.jit
def _first_key_block(doc_ptr, m0, T, win_b, win_j, offs_m, BLOCK_N: tl.constexpr, HAS_DOCS: tl.constexpr,
                     HAS_WINDOW: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The first key block a query block starting at ``m0`` may see: with documents, the block holding the start
    of the first query's document (document runs never decrease, so no later query sees a key before it).

    With a window and no bias (a sliding window: every key's bias is 0, so each row keeps the keys at or after
    its threshold position, -1 for a row that keeps them all), the block holding the rows' oldest threshold.
    With a bias the kept keys may lie anywhere before the query, and every allowed block is visited
    (docs/kernels.md says why the blocks are not tested one by one)."""
    lo = 0
    if HAS_DOCS:
        lo = tl.load(doc_ptr + T + m0) // BLOCK_N * BLOCK_N
    if HAS_WINDOW and not HAS_BIAS:
        oldest = tl.min(tl.where(offs_m < T, win_j, 2147483647), 0)  # rows past T: no say
        lo = tl.maximum(lo, oldest // BLOCK_N * BLOCK_N)
    return lo


@triton.jit
def _last_row_keeping(WIN_J, bh, lo, T, last_key):
    """With a sliding window (no bias, no documents): the end of the rows that keep a key at or before
    ``last_key``, searched from ``lo`` — the first row whose threshold position passes it (T if none). The thresholds
    never decrease along the rows (a later causal row's ``w``-th most recent allowed key is no older; without
    causality every row has the same one), so the rows that keep any key of a block end there."""
    a, b = lo, T
    for _ in range(31):  # rows < 2^31 (the host checks)
        open_ = a < b
        mid = (a + b) // 2
        passed = tl.load(WIN_J + bh.to(tl.int64) * T + mid, mask=open_, other=0) > last_key
        b = tl.where(open_ & passed, mid, b)
        a = tl.where(open_ & ~passed, mid + 1, a)
    return a


@triton.jit
def _delta(O, DO, DELTA, so_b, so_t, so_h, sdo_b, sdo_t, sdo_h, T, H, D,
           BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """``delta[b, h, t] = Σ_d o·do`` in fp32, the backward's row term, one tile of rows at a time: torch's
    ``(do.float() * o.float()).sum(-1)`` made three fp32 ``[B, T, H, D]`` temporaries (6 GB at T = 128K,
    H 32, D 128)."""
    bh, pid_m = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    O, DO = O + _head(b, h, so_b, so_h), DO + _head(b, h, sdo_b, sdo_h)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < T) & (offs_d[None, :] < D)
    o = tl.load(_tile(O, offs_m, so_t, offs_d), mask=mask, other=0.0).to(tl.float32)
    do = tl.load(_tile(DO, offs_m, sdo_t, offs_d), mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + bh.to(tl.int64) * T + offs_m, tl.sum(o * do, 1), mask=offs_m < T)


@triton.jit
def _forward(Q, K, V, BIAS, PAD, DOC, WIN_B, WIN_J, O, LSE,
             sq_b, sq_t, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, so_b, so_t, so_h, sbias_b, sbias_h, spad_b, sdoc_b,
             T, S, H, GROUP, D, scale,
             HAS_BIAS: tl.constexpr, HAS_PAD: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
             HAS_DOCS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
             DOT: tl.constexpr):
    bh, pid_m = tl.program_id(0), tl.program_id(1)  # b·h on axis 0: up to 2^31 − 1
    b, h = bh // H, bh % H
    hk = h // GROUP
    Q, O = Q + _head(b, h, sq_b, sq_h), O + _head(b, h, so_b, so_h)
    K, V = K + _head(b, hk, sk_b, sk_h), V + _head(b, hk, sv_b, sv_h)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    in_d = offs_d[None, :] < D
    q = tl.load(_tile(Q, offs_m, sq_t, offs_d), mask=(offs_m[:, None] < T) & in_d,
                other=0.0)
    bias_ptr = BIAS + _head(b, h, sbias_b, sbias_h)
    pad_ptr, doc_ptr = PAD + b.to(tl.int64) * spad_b, DOC + b.to(tl.int64) * sdoc_b
    win_b, win_j = _window_rows(WIN_B, WIN_J, bh, T, offs_m, HAS_WINDOW)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    hi = S
    if CAUSAL:
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M + S - T)
    lo = _first_key_block(doc_ptr, pid_m * BLOCK_M, T, win_b, win_j, offs_m, BLOCK_N, HAS_DOCS, HAS_WINDOW,
                          HAS_BIAS)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < S) & in_d
        k = tl.load(_tile(K, offs_n, sk_s, offs_d), mask=kv_mask, other=0.0)
        s, valid = _scores(q, k, bias_ptr, pad_ptr, doc_ptr, win_b, win_j, offs_m, offs_n, T, S, scale,
                           HAS_BIAS, HAS_PAD, CAUSAL, HAS_WINDOW, HAS_DOCS, DOT)
        m_i, l_i, acc = online_softmax_step(s, valid, _tile(V, offs_n, sv_s, offs_d), kv_mask, m_i, l_i, acc, DOT)
    has_keys = l_i > 0
    out = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    tl.store(_tile(O, offs_m, so_t, offs_d), out.to(O.dtype.element_ty),
             mask=(offs_m[:, None] < T) & in_d)
    lse = tl.where(has_keys, m_i + tl.log(tl.where(has_keys, l_i, 1.0)), float("inf"))  # inf: p = 0 in backward
    tl.store(LSE + bh.to(tl.int64) * T + offs_m, lse, mask=offs_m < T)


@triton.jit
def _backward_kv(Q, K, V, BIAS, PAD, DOC, WIN_B, WIN_J, DO, LSE, DELTA, DK, DV, DBIAS,
                 sq_b, sq_t, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, sdk_b, sdk_s, sdk_h, sbias_b, sbias_h, spad_b, sdoc_b,
                 T, S, H, GROUP, D, scale,
                 HAS_BIAS: tl.constexpr, HAS_PAD: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                 HAS_DOCS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 DOT: tl.constexpr):
    bh, pid_n = tl.program_id(0), tl.program_id(1)  # b·h on axis 0: up to 2^31 − 1
    b, h = bh // H, bh % H
    hk = h // GROUP
    Q, DO = Q + _head(b, h, sq_b, sq_h), DO + _head(b, h, sq_b, sq_h)
    K, V = K + _head(b, hk, sk_b, sk_h), V + _head(b, hk, sv_b, sv_h)
    DK, DV = DK + _head(b, h, sdk_b, sdk_h), DV + _head(b, h, sdk_b, sdk_h)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    in_d = offs_d[None, :] < D
    kv_mask = (offs_n[:, None] < S) & in_d
    k = tl.load(_tile(K, offs_n, sk_s, offs_d), mask=kv_mask, other=0.0)
    v = tl.load(_tile(V, offs_n, sv_s, offs_d), mask=kv_mask, other=0.0)
    bias_ptr = BIAS + _head(b, h, sbias_b, sbias_h)
    pad_ptr, doc_ptr = PAD + b.to(tl.int64) * spad_b, DOC + b.to(tl.int64) * sdoc_b
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dbias = tl.zeros([BLOCK_N], dtype=tl.float32)
    lo = 0
    if CAUSAL:  # queries before this key block's first key (offset by S - T) never see it
        lo = tl.maximum(pid_n * BLOCK_N - (S - T), 0) // BLOCK_M * BLOCK_M
    hi = T
    last_key = tl.minimum(pid_n * BLOCK_N + BLOCK_N, S) - 1
    if HAS_DOCS:  # queries after the end of the block's last key's document never see the block (S == T)
        hi = tl.load(doc_ptr + 2 * T + last_key)
    if HAS_WINDOW and not HAS_BIAS and not HAS_DOCS:
        hi = _last_row_keeping(WIN_J, bh, lo, T, last_key)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q, do, lse, delta, win_b, win_j = _backward_rows(Q, DO, LSE, DELTA, WIN_B, WIN_J, bh, offs_m, offs_d,
                                                         in_d, sq_b, sq_t, sq_h, T, HAS_WINDOW)
        s, valid = _scores(q, k, bias_ptr, pad_ptr, doc_ptr, win_b, win_j, offs_m, offs_n, T, S, scale,
                           HAS_BIAS, HAS_PAD, CAUSAL, HAS_WINDOW, HAS_DOCS, DOT)
        p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)  # [BLOCK_M, BLOCK_N]
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=DOT)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT)
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=DOT) * scale
        dbias += tl.sum(ds, 0)
    out = _tile(DK, offs_n, sdk_s, offs_d)
    tl.store(out, dk.to(DK.dtype.element_ty), mask=kv_mask)
    out = _tile(DV, offs_n, sdk_s, offs_d)
    tl.store(out, dv.to(DV.dtype.element_ty), mask=kv_mask)
    if HAS_BIAS:
        tl.store(DBIAS + bh.to(tl.int64) * S + offs_n, dbias, mask=offs_n < S)


@triton.jit
def _backward_q(Q, K, V, BIAS, PAD, DOC, WIN_B, WIN_J, DO, LSE, DELTA, DQ,
                sq_b, sq_t, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, sbias_b, sbias_h, spad_b, sdoc_b,
                T, S, H, GROUP, D, scale,
                HAS_BIAS: tl.constexpr, HAS_PAD: tl.constexpr, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr,
                HAS_DOCS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                DOT: tl.constexpr):
    bh, pid_m = tl.program_id(0), tl.program_id(1)  # b·h on axis 0: up to 2^31 − 1
    b, h = bh // H, bh % H
    hk = h // GROUP
    Q, DO, DQ = Q + _head(b, h, sq_b, sq_h), DO + _head(b, h, sq_b, sq_h), DQ + _head(b, h, sq_b, sq_h)
    K, V = K + _head(b, hk, sk_b, sk_h), V + _head(b, hk, sv_b, sv_h)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    in_d = offs_d[None, :] < D
    q_mask = (offs_m[:, None] < T) & in_d
    q, do, lse, delta, win_b, win_j = _backward_rows(Q, DO, LSE, DELTA, WIN_B, WIN_J, bh, offs_m, offs_d, in_d,
                                                     sq_b, sq_t, sq_h, T, HAS_WINDOW)
    bias_ptr = BIAS + _head(b, h, sbias_b, sbias_h)
    pad_ptr, doc_ptr = PAD + b.to(tl.int64) * spad_b, DOC + b.to(tl.int64) * sdoc_b
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    hi = S
    if CAUSAL:
        hi = tl.minimum(S, (pid_m + 1) * BLOCK_M + S - T)
    lo = _first_key_block(doc_ptr, pid_m * BLOCK_M, T, win_b, win_j, offs_m, BLOCK_N, HAS_DOCS, HAS_WINDOW,
                          HAS_BIAS)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < S) & in_d
        k = tl.load(_tile(K, offs_n, sk_s, offs_d), mask=kv_mask, other=0.0)
        v = tl.load(_tile(V, offs_n, sv_s, offs_d), mask=kv_mask, other=0.0)
        s, valid = _scores(q, k, bias_ptr, pad_ptr, doc_ptr, win_b, win_j, offs_m, offs_n, T, S, scale,
                           HAS_BIAS, HAS_PAD, CAUSAL, HAS_WINDOW, HAS_DOCS, DOT)
        p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
        ds = p * (tl.dot(do, tl.trans(v), input_precision=DOT) - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=DOT) * scale
    tl.store(_tile(DQ, offs_m, sq_t, offs_d), dq.to(DQ.dtype.element_ty),
             mask=q_mask)
