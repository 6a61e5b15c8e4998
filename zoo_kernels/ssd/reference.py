"""Plain-torch SSD (Mamba-2 state space duality): the chunked algorithm and the step recurrence.

Notation: b batch, t/s time, c chunk, l/m position inside a chunk, h head, g group, p head dim,
n state dim. Per head, with ``a_t = dt_t · A < 0``::

    state_t = exp(a_t) · state_{t-1} + dt_t · x_t ⊗ B_t          [P, N]
    y_t     = state_t · C_t  (+ D · x_t)

The chunked form computes the same thing as (1) a masked quadratic product inside each chunk, (2)
each chunk's final state, (3) a recurrence over chunk states, and (4) each position's read-out of
the state entering its chunk. README.md beside this file derives it.
"""

import torch
import torch.nn.functional as F
from einops import rearrange, repeat


def segment_sum(a: torch.Tensor) -> torch.Tensor:
    """``a [..., L]`` → ``[..., L, L]`` with ``out[..., i, j] = a_{j+1} + ... + a_i`` for ``j <= i`` and
    ``-inf`` above the diagonal, so ``exp(out)`` is the causal decay matrix.

    Summed directly (masked cumsum) rather than as a difference of cumsums, which would cancel
    catastrophically in fp32 on long chunks.
    """
    L = a.shape[-1]
    a = repeat(a, "... i -> ... i j", j=L)  # [..., L, L], a[..., i, j] = a_i
    below = torch.tril(torch.ones(L, L, dtype=torch.bool, device=a.device), diagonal=-1)
    sums = torch.cumsum(a.masked_fill(~below, 0.0), dim=-2)  # sum over j < r <= i
    causal = torch.tril(torch.ones(L, L, dtype=torch.bool, device=a.device))
    return sums.masked_fill(~causal, float("-inf"))


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    chunk_size: int = 64,
    D: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    document_starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked SSD. Shapes as :func:`zoo_kernels.ssd.ssd_scan`; returns ``(y [b,t,h,p], final_state [b,h,p,n])``.

    Any ``T``: the sequence is padded to a whole number of chunks with ``dt = 0`` (decay 1, no
    input), which leaves the outputs and the final state unchanged. ``document_starts [b, t]`` (bool,
    True where a packed document begins) resets the state there: the log-decay into a start is
    ``-inf``, so nothing before it reaches it or anything after — every decay below is a sum of
    log-decays, never a difference, so ``-inf`` never meets ``-inf`` in a subtraction.
    """
    batch, T, H, P = x.shape
    G = B.shape[2]
    pad = (-T) % chunk_size
    if pad:
        x, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, B, C))  # [b, T+pad, ·, ·]
        dt = F.pad(dt, (0, 0, 0, pad))  # [b, T+pad, h]
    # Heads come in G groups of r = H/G that share B and C (head h reads group h // r); the products
    # that involve only B and C are taken once per group, never copied to every head.
    xdt = x * dt[..., None]  # [b, t, h, p] the input term dt_t · x_t
    x_c = rearrange(xdt, "b (c l) (g r) p -> b c l g r p", l=chunk_size, g=G)
    B_c, C_c = (rearrange(t, "b (c l) g n -> b c l g n", l=chunk_size) for t in (B, C))
    log_decay = dt * A  # [b, t, h]
    if document_starts is not None:
        starts = F.pad(document_starts, (0, pad))  # [b, T+pad]
        log_decay = log_decay.masked_fill(starts[..., None], float("-inf"))
    a = rearrange(log_decay, "b (c l) (g r) -> b g r c l", l=chunk_size, g=G)  # log-decays
    a_cum = torch.cumsum(a, dim=-1)  # [b, g, r, c, l]

    # (1) Inside each chunk: y_l = Σ_{m<=l} (C_l·B_m) exp(a_{m+1..l}) dt_m x_m.
    CB = torch.einsum("bclgn,bcmgn->bgclm", C_c, B_c)  # [b, g, c, l, m] once per group
    scores = CB[:, :, None] * torch.exp(segment_sum(a))  # [b, g, r, c, l, m] with each head's decay
    y = torch.einsum("bgrclm,bcmgrp->bclgrp", scores, x_c)  # [b, c, l, g, r, p]

    # (2) Each chunk's own contribution to its final state (from a zero state).
    after = torch.flip(torch.cumsum(torch.flip(a, [-1]), -1), [-1])  # [b, g, r, c, l]: Σ_{r >= l} a_r
    decay_to_end = torch.exp(F.pad(after[..., 1:], (0, 1)))  # [b, g, r, c, l]: exp Σ_{r > l} a_r
    chunk_states = torch.einsum("bclgn,bgrcl,bclgrp->bcgrpn", B_c, decay_to_end, x_c)  # [b, c, g, r, p, n]

    # (3) Recurrence over chunks: the state entering chunk c, and the final state.
    if initial_state is None:
        initial_state = torch.zeros_like(chunk_states[:, 0])  # [b, g, r, p, n]
    else:
        initial_state = initial_state.view(batch, G, H // G, P, -1)  # [b, h, p, n] → [b, g, r, p, n]
    states = torch.cat([initial_state[:, None].to(chunk_states.dtype), chunk_states], dim=1)  # [b, c+1, g, r, p, n]
    chunk_decay = torch.exp(segment_sum(F.pad(a_cum[..., -1], (1, 0))))  # [b, g, r, c+1, c+1]
    states = torch.einsum("bgrzc,bcgrpn->bzgrpn", chunk_decay, states)  # [b, c+1, g, r, p, n]
    entering, final_state = states[:, :-1], states[:, -1]  # [b, c, g, r, p, n], [b, g, r, p, n]

    # (4) Each position reads the state entering its chunk, decayed to its own position.
    y = y + torch.einsum("bclgn,bcgrpn,bgrcl->bclgrp", C_c, entering, torch.exp(a_cum))  # [b, c, l, g, r, p]

    y = rearrange(y, "b c l g r p -> b (c l) (g r) p")[:, :T]  # [b, T, h, p]
    if D is not None:
        y = y + x[:, :T] * D[:, None]
    return y, final_state.flatten(1, 2)  # [b, h, p, n]


def ssd_step(
    state: torch.Tensor,
    x_t: torch.Tensor,
    dt_t: torch.Tensor,
    A: torch.Tensor,
    B_t: torch.Tensor,
    C_t: torch.Tensor,
    D: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the recurrence, for decoding.

    Args: ``state [b,h,p,n]``, ``x_t [b,h,p]``, ``dt_t [b,h]``, ``A [h]``, ``B_t, C_t [b,g,n]``,
    ``D [h]`` or None (a shape that disagrees with the state's is named: ``ValueError``). Returns ``(y_t [b,h,p]`` in
    ``x_t``'s dtype, ``new state [b,h,p,n]`` in ``state``'s dtype).
    The step computes in the state's dtype: a half-precision model's cache holds the fp32 state the chunked scan
    hands over after the prefill, and keeps it in fp32 as the scan does.
    """
    _check_step(state, x_t, dt_t, A, B_t, C_t, D)
    H, G, dtype = x_t.shape[1], B_t.shape[1], state.dtype
    B_t = repeat(B_t.to(dtype), "b g n -> b (g r) n", r=H // G)  # [b, h, n]
    C_t = repeat(C_t.to(dtype), "b g n -> b (g r) n", r=H // G)  # [b, h, n]
    dt_t = dt_t.to(dtype)
    decay = torch.exp(dt_t * A.to(dtype))[..., None, None]  # [b, h, 1, 1]
    state = state * decay + torch.einsum("bhp,bhn->bhpn", x_t.to(dtype) * dt_t[..., None], B_t)
    y_t = torch.einsum("bhpn,bhn->bhp", state, C_t)
    if D is not None:
        y_t = y_t + x_t.to(dtype) * D.to(dtype)[:, None]
    return y_t.to(x_t.dtype), state


def _check_step(state, x_t, dt_t, A, B_t, C_t, D) -> None:
    """Name a step's argument whose shape disagrees with the state's (a shape error from inside an einsum, else)."""
    if state.dim() == 4 and B_t.dim() == 3:  # the common case in one comparison: a decoding step pays it per layer
        (b, h, p, n), g = state.shape, B_t.shape[1]
        if ((x_t.shape, dt_t.shape, A.shape, B_t.shape, C_t.shape) == ((b, h, p), (b, h), (h,), (b, g, n), (b, g, n))
                and g and not h % g and (D is None or D.shape == (h,))):
            return
    if state.dim() != 4:
        wrong = [f"state{tuple(state.shape)}"]
    else:
        (b, h, p, n), g = state.shape, B_t.shape[1] if B_t.dim() == 3 else None
        wrong = [f"{name}{tuple(t.shape)}" for name, t, shape in (
            ("x_t", x_t, (b, h, p)), ("dt_t", dt_t, (b, h)), ("A", A, (h,)), ("B_t", B_t, (b, g, n)),
            ("C_t", C_t, (b, g, n)), ("D", D, (h,))) if t is not None and t.shape != shape]
    if wrong or not g or h % g:
        raise ValueError(f"ssd_step: state [b, h, p, n] = {tuple(state.shape)} wants x_t [b, h, p], dt_t [b, h], "
                         f"A [h], B_t and C_t [b, g, n] with g dividing h, D [h] or None; got "
                         f"{', '.join(wrong) or f'B_t{tuple(B_t.shape)}'}")


def ssd_recurrent(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    D: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    document_starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence token by token with :func:`ssd_step`: the test oracle. Returns ``(y, final_state)``;
    ``document_starts [b, t]`` zeroes the state before each start."""
    batch, T, H, P = x.shape
    N = B.shape[-1]
    state = x.new_zeros(batch, H, P, N) if initial_state is None else initial_state
    ys = []
    for t in range(T):
        if document_starts is not None:
            state = state * ~document_starts[:, t, None, None, None]  # [b, h, p, n]
        y_t, state = ssd_step(state, x[:, t], dt[:, t], A, B[:, t], C[:, t], D)
        ys.append(y_t)
    y = torch.stack(ys, dim=1) if ys else x.new_zeros(batch, 0, H, P)  # [b, T, h, p]
    return y, state
