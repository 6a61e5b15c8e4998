"""Triton kernels of the gated delta rule's recurrence over chunks, forward and backward, in fp32.

Notation of reference.py. What does not wait for the state — the solve that gives ``U`` and ``W``, the decayed
queries and keys, the in-chunk scores — is made for all chunks at once in torch (``chunk_terms``); what does is a
loop over chunks, ``T / L`` steps of small products, which the plain-torch form runs as a Python loop (several
launches a chunk). Here one program runs the whole loop for one (batch, head) and a block of ``BLOCK_V`` of the
state's value columns, holding its ``[K, BLOCK_V]`` slice of the state in registers: every product of the recurrence
acts on the value columns independently (``Δ = U − W S`` and ``S ← e^{γ_L} S + Kᵀ Δ`` column by column).

Forward, per chunk ``c`` (``S`` entering it)::

    STATES[c] = S;   Δ_c = U_c − W_c S;   S ← kept_c · S + WRITES_cᵀ Δ_c          FINAL = S after the last chunk

Backward, chunks in reverse, ``G`` the gradient of the state leaving chunk ``c`` (``d FINAL`` first)::

    dΔ_c = dDELTA_c + WRITES_c G        (what the outputs and the leaving state ask of Δ_c)
    dU_c = dΔ_c;   dW_c = −dΔ_c S_cᵀ;   dWRITES_c = Δ_c Gᵀ;   dkept_c = ⟨S_c, G⟩
    G ← kept_c · G + dSTATES_c − W_cᵀ dΔ_c                       d initial = G after the first chunk

``dW``, ``dWRITES`` and ``dkept`` are sums over the value columns, so each program writes its block's share
(``[NV, …]``, summed by the host) rather than adding atomically into one tensor.

Each chunk's ``L`` rows are taken ``BLOCK_R`` at a time, so that besides the state only ``[BLOCK_R, K]`` tiles of ``W``
and ``WRITES`` are live: the rows' corrections all read the state entering the chunk, and their writes are summed into
a second ``[K, BLOCK_V]`` tile, the leaving state (the backward likewise holds ``G``, ``S_c`` and the next ``G``).
Whole ``[L, K]`` tiles (``L`` 64, ``K`` 128) beside the state spilled 1-16 KB a thread on sm_90
(``python -m recipes.benchmarks.compile_check --only gated_delta``).

All tensors are contiguous, fp32: ``U, DELTA [b·h, nc, L, V]``, ``W, WRITES [b·h, nc, L, K]``,
``STATES [b·h, nc, K, V]``, ``KEPT [b·h, nc]``, ``H0, FINAL [b·h, K, V]``. Tiles are padded to at least 16 a side
(``tl.dot``'s least) with masked loads; a document start needs nothing here (``kept`` is 0 across it, and ``W``'s rows
from it on are 0, so they read nothing of the entering state: ``chunk_terms`` puts the ``−inf`` log-decay into both).
"""

import triton
import triton.language as tl


@triton.jit
def _tile(ptr, rows, cols, n_cols, mask):
    """The ``[len(rows), len(cols)]`` tile of a row-major matrix with ``n_cols`` columns at ``ptr``."""
    return tl.load(ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _delta_chunks(U, W, WRITES, KEPT, H0, DELTA, STATES, FINAL, n_chunks, L, K, V,
                  HAS_H0: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                  DOT: tl.constexpr):
    bh, vb = tl.program_id(0), tl.program_id(1)
    offs_k, offs_v = tl.arange(0, BLOCK_K), vb * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_kv = (offs_k[:, None] < K) & (offs_v[None, :] < V)
    if HAS_H0:
        state = _tile(H0 + bh.to(tl.int64) * K * V, offs_k, offs_v, V, mask_kv)  # [BLOCK_K, BLOCK_V]
    else:
        state = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
    for c in range(0, n_chunks):
        chunk = bh.to(tl.int64) * n_chunks + c
        tl.store(STATES + chunk * K * V + offs_k[:, None] * V + offs_v[None, :], state, mask=mask_kv)
        leaving = state * tl.load(KEPT + chunk)  # [BLOCK_K, BLOCK_V]
        for r in range(0, L, BLOCK_R):
            offs_r = r + tl.arange(0, BLOCK_R)
            mask_rk = (offs_r[:, None] < L) & (offs_k[None, :] < K)
            mask_rv = (offs_r[:, None] < L) & (offs_v[None, :] < V)
            w = _tile(W + chunk * L * K, offs_r, offs_k, K, mask_rk)  # [BLOCK_R, BLOCK_K]
            u = _tile(U + chunk * L * V, offs_r, offs_v, V, mask_rv)  # [BLOCK_R, BLOCK_V]
            delta = u - tl.dot(w, state, input_precision=DOT)  # [BLOCK_R, BLOCK_V]
            tl.store(DELTA + chunk * L * V + offs_r[:, None] * V + offs_v[None, :], delta, mask=mask_rv)
            writes = _tile(WRITES + chunk * L * K, offs_r, offs_k, K, mask_rk)  # [BLOCK_R, BLOCK_K]
            leaving += tl.dot(tl.trans(writes), delta, input_precision=DOT)
        state = leaving
    tl.store(FINAL + bh.to(tl.int64) * K * V + offs_k[:, None] * V + offs_v[None, :], state, mask=mask_kv)


@triton.jit
def _delta_chunks_backward(W, WRITES, KEPT, STATES, DELTA, D_DELTA, D_STATES, D_FINAL, D_U, D_W, D_WRITES, D_KEPT,
                           D_H0, n_bh, n_chunks, L, K, V, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                           BLOCK_V: tl.constexpr, DOT: tl.constexpr):
    bh, vb = tl.program_id(0), tl.program_id(1)
    offs_k, offs_v = tl.arange(0, BLOCK_K), vb * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_kv = (offs_k[:, None] < K) & (offs_v[None, :] < V)
    grad = _tile(D_FINAL + bh.to(tl.int64) * K * V, offs_k, offs_v, V, mask_kv)  # [BLOCK_K, BLOCK_V]: G
    share = vb.to(tl.int64) * n_bh + bh  # this value block's share of the sums over V: [NV, b·h, …]
    for i in range(0, n_chunks):
        c = n_chunks - 1 - i
        chunk = bh.to(tl.int64) * n_chunks + c
        state = _tile(STATES + chunk * K * V, offs_k, offs_v, V, mask_kv)  # [BLOCK_K, BLOCK_V]: S_c
        tl.store(D_KEPT + share * n_chunks + c, tl.sum(tl.sum(state * grad, axis=1), axis=0))
        entering = grad * tl.load(KEPT + chunk) + _tile(D_STATES + chunk * K * V, offs_k, offs_v, V, mask_kv)
        for r in range(0, L, BLOCK_R):
            offs_r = r + tl.arange(0, BLOCK_R)
            mask_rk = (offs_r[:, None] < L) & (offs_k[None, :] < K)
            mask_rv = (offs_r[:, None] < L) & (offs_v[None, :] < V)
            writes = _tile(WRITES + chunk * L * K, offs_r, offs_k, K, mask_rk)  # [BLOCK_R, BLOCK_K]
            d_delta = (_tile(D_DELTA + chunk * L * V, offs_r, offs_v, V, mask_rv)
                       + tl.dot(writes, grad, input_precision=DOT))  # [BLOCK_R, BLOCK_V]
            tl.store(D_U + chunk * L * V + offs_r[:, None] * V + offs_v[None, :], d_delta, mask=mask_rv)
            delta = _tile(DELTA + chunk * L * V, offs_r, offs_v, V, mask_rv)
            out = (share * n_chunks + c) * L * K + offs_r[:, None] * K + offs_k[None, :]
            tl.store(D_W + out, -tl.dot(d_delta, tl.trans(state), input_precision=DOT), mask=mask_rk)
            tl.store(D_WRITES + out, tl.dot(delta, tl.trans(grad), input_precision=DOT), mask=mask_rk)
            w = _tile(W + chunk * L * K, offs_r, offs_k, K, mask_rk)
            entering -= tl.dot(tl.trans(w), d_delta, input_precision=DOT)
        grad = entering
    tl.store(D_H0 + bh.to(tl.int64) * K * V + offs_k[:, None] * V + offs_v[None, :], grad, mask=mask_kv)
