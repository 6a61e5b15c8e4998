"""Plain-torch gated delta rule (Gated DeltaNet): the chunked algorithm and the step recurrence.

Notation: b batch, t time, c chunk, l/m position inside a chunk, h head, k key dim, v value dim. Per head, with a
log-decay ``g_t <= 0``, a write strength ``beta_t`` in ``(0, 1)`` (or ``(0, 2)``) and a unit key ``k_t``, the state ``S [k, v]``::

    S_t = exp(g_t) (I - beta_t k_t k_tᵀ) S_{t-1} + beta_t k_t v_tᵀ
    y_t = S_tᵀ (scale · q_t)

The chunked form rewrites each chunk as linear attention over corrected values ``delta`` (the part of each value the
state did not already predict), found by one unit-lower-triangular solve per chunk; only the state passes from chunk
to chunk. README.md beside this file derives it.
"""

import torch
import torch.nn.functional as F
from einops import rearrange

from zoo_kernels.ssd.reference import segment_sum


def gated_delta_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    document_starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule. ``q, k [b,t,h,k]``, ``v [b,t,h,v]``, ``g, beta [b,t,h]``, ``initial_state [b,h,k,v]``;
    returns ``(y [b,t,h,v], final_state [b,h,k,v])``.

    Any ``T``: the sequence is padded to whole chunks with ``g = 0`` and ``beta = 0`` (the state passes unchanged).
    ``document_starts [b, t]`` (bool) resets the state there: the log-decay into a start is ``-inf``, and every decay
    below is a sum of log-decays (never a difference), so ``-inf`` never meets ``-inf`` in a subtraction.
    """
    batch, T, H, K = k.shape
    U, W, reads, scores, writes, kept = chunk_terms(q, k, v, g, beta, scale=scale, chunk_size=chunk_size,
                                                    document_starts=document_starts)
    # The loop takes the chunks apart with unbind (one gradient of the whole at the end), not by indexing (a
    # full-size zero gradient per index: quadratic in the chunks, 28% of a T = 1024 pass before)
    state = k.new_zeros(batch, H, K, v.shape[-1]) if initial_state is None else initial_state.to(k.dtype)  # [b,h,k,v]
    ys = []
    per_chunk = (t.movedim(2, 0).contiguous().unbind(0) for t in (U, W, reads, scores, writes.transpose(-1, -2), kept))
    for u, w, read, score, write, kept_c in zip(*per_chunk):  # (each a contiguous [b, h, ·, ·]: no copy per product)
        delta = u - w @ state  # [b, h, l, v]: the state entering the chunk corrects the values
        ys.append(read @ state + score @ delta)  # [b, h, l, v]
        state = state * kept_c[..., None, None] + write @ delta  # [b, h, k, v]: the state leaving the chunk
    y = rearrange(torch.stack(ys, dim=2), "b h c l v -> b (c l) h v")[:, :T]  # [b, T, h, v]
    return y, state


def chunk_terms(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float,
    chunk_size: int,
    document_starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """Everything of the chunked form that does not wait for the state, for all chunks at once (the plain-torch loop
    and the Triton kernel of the recurrence over chunks both start here). ``q, k [b,t,h,k]``, ``v [b,t,h,v]``,
    ``g, beta [b,t,h]``; the sequence is padded to ``nc`` whole chunks of ``L = chunk_size``. Returns

    - ``U [b,h,nc,L,v]``, ``W [b,h,nc,L,k]``: the corrected values are ``Δ = U − W S_0`` (``S_0`` entering the chunk);
    - ``reads [b,h,nc,L,k]``: the queries (scaled) decayed from the chunk's start, which read ``S_0``;
    - ``scores [b,h,nc,L,L]``: ``(q·k) e^{γ_l − γ_m}`` on and below the diagonal, which read ``Δ``;
    - ``writes [b,h,nc,L,k]``: the keys decayed to the chunk's end, which write ``Δ`` into the leaving state;
    - ``kept [b,h,nc]``: ``e^{γ_L}``, what the chunk keeps of ``S_0`` (0 across a document start).
    """
    T, L = k.shape[1], chunk_size
    pad = (-T) % L
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v))  # [b, T+pad, h, ·]
        g, beta = (F.pad(t, (0, 0, 0, pad)) for t in (g, beta))  # [b, T+pad, h]
    if document_starts is not None:
        g = g.masked_fill(F.pad(document_starts, (0, pad))[..., None], float("-inf"))
    q_c, k_c, v_c = (rearrange(t, "b (c l) h d -> b h c l d", l=L) for t in (q * scale, k, v))
    g_c, beta_c = (rearrange(t, "b (c l) h -> b h c l", l=L) for t in (g, beta))

    decay = torch.exp(segment_sum(g_c))  # [b, h, c, l, m]: exp(g_{m+1} + … + g_l), 0 for m > l
    from_start = torch.exp(torch.cumsum(g_c, dim=-1))  # [b, h, c, l]: exp(g_1 + … + g_l), from the chunk's start
    after = torch.flip(torch.cumsum(torch.flip(g_c, [-1]), -1), [-1])  # [b, h, c, l]: Σ_{r >= l} g_r
    to_end = torch.exp(F.pad(after[..., 1:], (0, 1)))  # [b, h, c, l]: exp Σ_{r > l} g_r, to the chunk's end

    # (I + M) Δ = β ⊙ V − (β e^γ ⊙ K) S_0 with M[l, m] = β_l e^{γ_l − γ_m} k_l·k_m for m < l, so Δ = U − W S_0:
    # one solve for both right-hand sides, before the state entering the chunk is known.
    M = (beta_c[..., None] * (k_c @ k_c.transpose(-1, -2)) * decay).tril(-1)  # [b, h, c, l, m], strictly below
    rhs = torch.cat([beta_c[..., None] * v_c, (beta_c * from_start)[..., None] * k_c], dim=-1)  # [b, h, c, l, v+k]
    U, W = torch.linalg.solve_triangular(M, rhs, upper=False, unitriangular=True).split([v.shape[-1], k.shape[-1]],
                                                                                        dim=-1)
    scores = (q_c @ k_c.transpose(-1, -2)) * decay  # [b, h, c, l, m], the diagonal included
    reads = q_c * from_start[..., None]  # [b, h, c, l, k]
    writes = k_c * to_end[..., None]  # [b, h, c, l, k]
    return U, W, reads, scores, writes, from_start[..., -1]


def gated_delta_step(
    state: torch.Tensor,
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    g_t: torch.Tensor,
    beta_t: torch.Tensor,
    *,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the recurrence, for decoding: ``state [b,h,k,v]``, ``q_t, k_t [b,h,k]``, ``v_t [b,h,v]``,
    ``g_t, beta_t [b,h]``. Returns ``(y_t [b,h,v]`` in ``v_t``'s dtype, ``new state`` in ``state``'s dtype); computes in
    the state's dtype (fp32 for a half-precision model, as the chunked form)."""
    dtype, out_dtype = state.dtype, v_t.dtype
    q_t, k_t, v_t, g_t, beta_t = (t.to(dtype) for t in (q_t, k_t, v_t, g_t, beta_t))
    state = state * torch.exp(g_t)[..., None, None]  # [b, h, k, v]
    predicted = torch.einsum("bhkv,bhk->bhv", state, k_t)  # what the decayed state already holds at k_t
    state = state + torch.einsum("bhk,bhv->bhkv", k_t, beta_t[..., None] * (v_t - predicted))
    y_t = torch.einsum("bhkv,bhk->bhv", state, q_t * scale)
    return y_t.to(out_dtype), state


def gated_delta_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float,
    initial_state: torch.Tensor | None = None,
    document_starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence token by token with :func:`gated_delta_step`: the test oracle. Returns ``(y, final_state)``;
    ``document_starts [b, t]`` zeroes the state before each start."""
    batch, T, H, K = k.shape
    state = k.new_zeros(batch, H, K, v.shape[-1]) if initial_state is None else initial_state
    ys = []
    for t in range(T):
        if document_starts is not None:
            state = state * ~document_starts[:, t, None, None, None]  # [b, h, k, v]
        y_t, state = gated_delta_step(state, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], scale=scale)
        ys.append(y_t)
    y = torch.stack(ys, dim=1) if ys else v.new_zeros(v.shape)  # [b, T, h, v]
    return y, state
