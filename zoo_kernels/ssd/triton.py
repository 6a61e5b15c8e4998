"""Triton SSD scan (Mamba-2), the host side: tiles per GPU and dtype (``launch_config``), the launches, and the
forward and backward as torch custom ops (``ssd_scan_triton``). The kernels and their math: triton_kernels.py."""

import torch
import torch.nn.functional as F
import triton

from zoo_kernels._backend import dot_precision, gpu_arch, unit_stride_last
from zoo_kernels.ssd.triton_kernels import (_chunk_scan, _chunk_scan_reverse, _chunk_state, _decayed_scan, _group_bc_grads,
                                        _group_pair_grads, _group_scores, _log_decay_pairs, _state_dots)


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

    Three switches, the first two on where they were timed — Hopper, bf16/fp16, states up to 64 × 128 — and off
    elsewhere:

    - ``shared_scores``: the in-chunk ``C·Bᵀ`` made once per group (:func:`_group_scores_call`) and read by the ``y``,
      ``d(dt·x)`` and log-decay kernels, and ``dC``, ``dB`` made per group (:func:`_group_bc_grads_call`) instead of
      per head and summed. The per-group kernels loop over the group's heads holding a ``[rows, N]`` fp32 sum beside
      each head's term, on 8 warps (4 on Hopper at 64 × 128, below): ``group_rows`` 32 at states up to 64 × 128 and
      16 above (the largest without a spill on sm_90 with fp32 states: 64 rows spilled 80-730 bytes at 64 × 128, 32
      rows 56-184 at the larger states), and ``group_block`` × ``group_block`` blocks of the pairs' gradients, 64 and 32
      (64 spilled 64 bytes at P 128); fp32 takes the smaller ones. ``group_n`` splits the state's ``N`` over the dC/dB
      programs (each makes that many columns and its share of the row dots, summed after; all of ``N`` by default: the
      split lost on Hopper at 64 rows, below) and ``group_pair_warps`` gives ``_group_pair_grads`` warps of its own
      (None: ``group_warps``).
    - ``narrow_states``: the chunks' entering states and their gradients kept in the inputs' dtype, as mamba_ssm keeps
      its states (the kernels that read them multiply them in that dtype already, so ``y`` and every gradient but the
      carry's share of ``dA`` and ``d dt`` are the same; the recurrence over chunks and the final state stay fp32),
      halving the bytes of the largest reads. With bf16 states the per-group kernels spill 8 bytes at 64 × 128 and
      160-184 at the larger states (so those keep fp32 states).
    - ``keep_states`` (on where the other two are): the backward takes the forward's entering states instead of
      running the forward's ``_chunk_state`` and ``_decayed_scan`` again, where they take no more bytes than ``x``
      (:func:`_keeps_states`; with narrow states at chunk 256 and N 128, half): those two kernels' GPU time in a
      forward and backward went from 980 to 647 µs at T 16K on an H200 (2026-12-04), 1.05× the whole op.

    ``order="blocks"`` and ``group_order="blocks"`` (:data:`ORDERS`) launch each chunk's blocks of rows together, as
    mamba_ssm's grids do, so that they read the chunk's state and rows from L2 (the per-group ``dC``/``dB`` kernels
    read every head's state per block of rows: at 16K, B 4, 32 heads, bf16 states, 134 MB, 2.7 H200 L2s). On Hopper
    the ``y`` and ``dx`` kernels take ``"blocks"`` in their entries, the pairs ``"heads"``, the per-group kernels
    ``"blocks"`` (1,746 → 1,522 µs at 16K).

    Timed on an H200 (2026-11-27, B 4, H 32, P 64, N 128, chunk 256, bf16, ``check_finite=False``, each switch against
    the configuration without it in one process, ``ssd_tiles --sections``): ``shared_scores`` 1.03× at T 16K and
    0.97× at 4K; ``narrow_states`` then, on top of it, 1.10× at both; together ``ops`` measured 9.13 ms forward and
    backward at 16K (10.32 before; mamba_ssm 6.38) and 3.26 at 4K (3.69 before; 5.32).

    Each kernel's own tiles (``_tiles``: an entry's keys override the shared ones) and ``order="heads"`` (the per-head
    scan kernels' programs ordered with the heads innermost, :func:`_grid`; an entry may give a kernel its own), set
    where the switches are: the tile search's winners at T 16K on an H200 (2026-11-27, two rounds of ``ssd_tiles``
    with each candidate's kernels' GPU time, docs/kernels.md): ``y`` (the forward's output kernel) 64 rows stepping
    32 columns on 2 stages, ``dx`` (the backward's ``d(dt·x)``) 32 × 32, ``pairs`` (the log-decay pair kernel)
    32 × 16 on one warp, the per-group ``dC``/``dB`` kernels on 4 warps (1.49× faster in GPU time; as the benchmark launches them,
    16-byte aligned, 208-248 registers and no spill, ``compile_check --aligned``; the variant unaligned strides get
    spills 344-504 bytes a thread there, against 0-8 on 8 warps); with the heads innermost, the bare forward and
    backward went from 9.02 to 8.30 ms at 16K in the first round and 8.39 to 7.41 in the second, each in one process,
    and ``ops`` measured 7.36 against mamba_ssm's 6.80 (0.92×) and 3.25 against 4.56 at 4K. Then (2026-12-04, H200,
    with ``D`` and Δ in fp32 as a Mamba-2 layer launches them) ``keep_states``, the blocks-innermost orders and the
    per-group kernels on 64 rows (1,684 → 1,629 µs with ``N`` split over two programs; the day's second search, with
    all of ``N``'s 128 columns a program, 1,419 → 1,042: aligned, no spill with the pairs' gradients in bf16 (112
    bytes in ``dB`` with them fp32); the unaligned variant 888-1,024 bytes, 168-200 split; ``compile_check``), each
    its section's fastest:
    together 7.23 → 6.61 → 6.10 ms (mamba_ssm 6.53 in that process: 1.07×), and ``ops`` 6.09 against 6.18 at 16K
    (GPU time 5.72 against 5.87 ms), 2.33 against 3.11 at 4K. Elsewhere the entries are empty and the kernels take the
    shared tiles."""
    pow2 = lambda n: max(16, triton.next_power_of_2(n))  # noqa: E731
    tiles = dict(P=pow2(P), N=pow2(N), pair_rows=64, pair_cols=16, shared_scores=False, narrow_states=False,
                 keep_states=False, order="chunks", group_order="chunks", y={}, dx={}, pairs={})
    small, fp32 = tiles["P"] * tiles["N"] <= 64 * 128, dtype == torch.float32
    roomy = small and not fp32  # room in the registers for the per-group kernels' larger tiles
    # group_n: the state's columns one dC/dB program makes (all of them); group_pair_warps: _group_pair_grads' own
    # warps (None: group_warps)
    tiles.update(group_rows=32 if roomy else 16, group_block=64 if roomy else 32, group_warps=8, group_n=tiles["N"],
                 group_pair_warps=None)
    # _group_scores' blocks: in fp32, 64 × 64 on 4 warps spilled 7 KB (and needed 128 KiB at N 256, as launched)
    tiles.update(scores_block=32 if fp32 else 64, scores_warps=8 if fp32 else 4)
    if not cuda:  # the interpreter: small tiles, fewer wasted lanes
        return dict(tiles, rows=16, pair_rows=16, pair_cols=16, group_rows=16, group_block=16, group_warps=4, warps=4,
                    stages=1)
    if not fp32 and arch >= 90 and small:
        # the kernels' own tiles and the heads innermost (the pairs) or each head's blocks innermost (y, dx): each
        # section's fastest at T 16K on an H200 (2026-11-27, 2026-12-04)
        return dict(tiles, rows=64, warps=4, stages=2, shared_scores=True, narrow_states=True, keep_states=True,
                    order="heads", group_order="blocks", group_rows=64, group_warps=4,
                    y=dict(rows=64, cols=32, warps=4, stages=2, order="blocks"),
                    dx=dict(rows=32, cols=32, warps=4, stages=2, order="blocks"),
                    pairs=dict(rows=32, cols=16, warps=1, stages=3))
    if fp32:  # 64-row pair blocks needed 100 KiB at N 256 as launched: over a consumer GPU's 99
        return dict(tiles, rows=32, warps=8, stages=2, pair_rows=32)
    return dict(tiles, rows=32, warps=8, stages=2)


def _chunk_log_decays(dt: torch.Tensor, A: torch.Tensor, L: int) -> torch.Tensor:
    """``Λ [b, h, nc·L]`` fp32: the cumulative log-decay inside each chunk, padded with ``a = 0``."""
    batch, T, H = dt.shape
    a = dt.float() * A.float()  # [b, T, h]
    a = F.pad(a, (0, 0, 0, (-T) % L)).transpose(1, 2).reshape(batch, H, -1, L)  # [b, h, nc, L]
    # along the innermost dimension: over an outer one (h innermost) a GPU's cumsum took 53 µs at T 16K, H 32 (H200).
    # Contiguous, as the kernels index it: a sum that kept its input's permuted strides would still view to
    # [b, h, nc·L], and be read wrong without a word (a no-op where torch's cumsum returns a contiguous tensor, as now)
    return torch.cumsum(a, dim=-1).contiguous().view(batch, H, -1)  # [b, h, nc·L]


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


def with_entries(config: dict, entries: dict) -> dict:
    """``config`` (a ``launch_config``) with ``entries`` laid over it, a kernel's entry (``y``, ``dx``, ``pairs``: a
    dict) key by key: ``{"y": {"order": "blocks"}}`` changes ``y``'s order and keeps its tiles. How the tile search
    combines its sections' winners and how ``recipes.benchmarks.ops --ssd-config`` applies them."""
    return {**config, **{key: {**config[key], **value} if isinstance(config.get(key), dict) else value
                         for key, value in entries.items()}}


def _tiles(blk: dict, kernel: str) -> dict:
    """``rows``, ``cols`` (the column block each step of the in-chunk loop takes), ``warps``, ``stages`` and
    ``p_block`` (the head dim's columns one program makes; None: all) of one scan kernel — ``"y"``, ``"dx"`` (both
    ``d(dt·x)`` and ``dx``), ``"dC"``, ``"dB"`` (per head), ``"pairs"`` (the log-decay gradient's) — from
    ``launch_config``'s entry for it, over the shared ``rows`` (as ``cols`` too; ``pair_rows`` and ``pair_cols`` for
    the pairs), ``warps`` and ``stages``."""
    shared = dict(rows=blk["rows"], cols=blk["rows"], warps=blk["warps"], stages=blk["stages"], p_block=None,
                  order=blk["order"])
    if kernel == "pairs":  # the log-decay gradient's pair kernel: its blocks are its own already
        shared.update(rows=blk["pair_rows"], cols=blk["pair_cols"])
    return {**shared, **blk.get(kernel, {})}


ORDERS = ("chunks", "heads", "blocks")
"""The grid orders of the per-head kernels (``order``) and the per-group ones (``group_order``): what varies fastest
across the programs launched together — the chunks, a chunk's heads (groups), or the blocks of one chunk's head
(group) (:func:`triton_kernels._chunk_head_block`)."""


def _grid(chunks: int, blocks: int, heads: int, order: str) -> tuple[int, int, int]:
    """The grid of a kernel with ``blocks`` programs per chunk (``b·nc`` of them) and head (or group) in ``order``:
    ``(b·nc, blocks, heads)``, ``(b·nc·heads, blocks, 1)`` with the heads innermost, or ``(b·nc·heads·blocks, 1, 1)``
    with the blocks innermost (:func:`triton_kernels._chunk_head_block`)."""
    if order == "heads":
        return chunks * heads, blocks, 1
    if order == "blocks":
        return chunks * heads * blocks, 1, 1
    if order != "chunks":
        raise ValueError(f"ssd launch_config: order {order!r} is none of {ORDERS}")
    return chunks, blocks, heads


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
    _chunk_scan[_grid(batch * n_chunks, triton.cdiv(L, tiles["rows"]) * v_blocks, H, tiles["order"])](
        Q, K, V, W, dt, lam, lam if seg is None else seg, states, D if D is not None else lam, lam if qk is None else qk,
        out, into,
        T, L, lam.shape[-1], n_chunks, H, Q.shape[2], K.shape[2], V.shape[2], DQK, DV,
        *_scan_strides(Q, K, V, W, dt, out), v_blocks,
        TRANS_STATE=trans_state, HAS_D=D is not None, HAS_DOCS=seg is not None, HAS_ROW_DOTS=row_dots is not None,
        HAS_QK=qk is not None, ORDER=tiles["order"],
        BLOCK_L=tiles["rows"], BLOCK_M=tiles["cols"], BLOCK_QK=block_qk, BLOCK_V=block_v,
        DOT=blk["dot"], num_warps=tiles["warps"], num_stages=tiles["stages"],
    )


def _chunk_scan_reverse_call(Q, K, V, dt, lam, seg, d_states, out, T, L, trans_state: bool, blk: dict,
                             row_dots: tuple[torch.Tensor, torch.Tensor] | None = None,
                             dx_of: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None] |
                             None = None, qk: torch.Tensor | None = None) -> None:
    """``row_dots = (B, into)``: also the share terms ``U`` into ``into [b, h, nc·L]`` fp32; ``dx_of = (x, D, into,
    d_into)`` (with ``trans_state``): ``out`` gets ``dx`` rather than ``d(dt·x)``, ``into [b, h, nc·L]`` fp32 the rows'
    ``⟨x, d(dt·x)⟩``, and with ``D`` ``d_into`` (same shape) the rows' ``⟨dy, x⟩``; ``qk``: the group scores read in
    place of ``Q·Kᵀ`` (:func:`_chunk_scan_reverse`)."""
    batch, _, H, _ = out.shape
    n_chunks = lam.shape[-1] // L
    block_qk, block_v = (blk["N"], blk["P"]) if trans_state else (blk["P"], blk["N"])
    W, D, row_into, x_into, d_into = V, None, lam, lam, None  # placeholders the kernel does not read
    if row_dots is not None:
        W, row_into = row_dots
    if dx_of is not None:
        W, D, x_into, d_into = dx_of
    tiles = _tiles(blk, "dx" if trans_state else "dB")
    _chunk_scan_reverse[_grid(batch * n_chunks, triton.cdiv(L, tiles["rows"]), H, tiles["order"])](
        Q, K, V, W, dt, lam, lam if seg is None else seg, d_states, D if D is not None else lam,
        lam if qk is None else qk, out, row_into, x_into, lam if d_into is None else d_into,
        T, L, lam.shape[-1], n_chunks, H, Q.shape[2], K.shape[2], V.shape[2], Q.shape[-1], V.shape[-1],
        *_scan_strides(Q, K, V, W, dt, out),
        TRANS_STATE=trans_state, SCALE_BY_DT=not trans_state, HAS_DOCS=seg is not None,
        HAS_ROW_DOTS=row_dots is not None, DX_EPILOGUE=dx_of is not None, HAS_D=D is not None, HAS_QK=qk is not None,
        ORDER=tiles["order"], BLOCK_M=tiles["rows"], BLOCK_L=tiles["cols"], BLOCK_QK=block_qk,
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
    _group_scores[_grid(batch * n_chunks, triton.cdiv(L, block) ** 2, G, blk["group_order"])](
        C, B, qk, T, L, n_chunks, G, N, *C.stride()[:3], *B.stride()[:3],
        BLOCK=block, BLOCK_N=blk["N"], DOT=blk["dot"], GROUP_ORDER=blk["group_order"], num_warps=blk["scores_warps"],
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
    # stored in the dtype _group_bc_grads multiplies them in (B's and C's), which rounds them there anyway: the same
    # numbers in half the bytes at bf16 (fp32 where B and C differ)
    pair_dtype = B.dtype if B.dtype == C.dtype else torch.float32
    pairs = torch.empty(batch, n_chunks, G, L, L, dtype=pair_dtype, device=x.device)  # blocks above: never read
    _group_pair_grads[_grid(batch * n_chunks, triton.cdiv(L, block) ** 2, G, blk["group_order"])](
        x, dy, dt, lam, seg_arg, pairs, T, L, Tp, n_chunks, H, G, P, *x.stride()[:3], *dy.stride()[:3], *dt.stride()[:2],
        HAS_DOCS=seg is not None, BLOCK=block, BLOCK_P=blk["P"], DOT=blk["dot"], GROUP_ORDER=blk["group_order"],
        num_warps=blk["group_pair_warps"] or blk["group_warps"],
    )
    dC, dB = torch.empty(C.shape, dtype=C.dtype, device=x.device), torch.empty(B.shape, dtype=B.dtype, device=x.device)
    # the state's N over programs of group_n columns (fewer registers a program); their row dots summed after
    block_n = min(blk["group_n"], blk["N"])
    n_blocks = triton.cdiv(N, block_n)
    for q, st, w, r, out, dots, source_rows in ((dy, states, C, B, dC, read, False), (x, d_states, B, C, dB, share, True)):
        parts = dots if n_blocks == 1 else dots.new_empty(n_blocks, *dots.shape)  # [n_blocks, b, h, nc·L]
        _group_bc_grads[_grid(batch * n_chunks, triton.cdiv(L, blk["group_rows"]) * n_blocks, G, blk["group_order"])](
            q, st, w, r, dt, lam, seg_arg, pairs, out, parts, T, L, Tp, n_chunks, H, G, P, N, dots.numel(),
            *q.stride()[:3], *w.stride()[:3], *r.stride()[:3], *dt.stride()[:2], *out.stride()[:3],
            SOURCE_ROWS=source_rows, HAS_DOCS=seg is not None, BLOCK_L=blk["group_rows"], BLOCK_M=blk["group_rows"],
            BLOCK_P=blk["P"], BLOCK_N=block_n, N_BLOCKS=n_blocks, DOT=blk["dot"], GROUP_ORDER=blk["group_order"],
            num_warps=blk["group_warps"], num_stages=blk["stages"],
        )
        if n_blocks > 1:
            torch.sum(parts, 0, out=dots)
    return dC, dB


def _blk(x, B, C) -> dict:
    """Tiles sized for the widest operand: fp32 B, C beside a bf16 x (RoPE tables under autocast) need the fp32
    tiles, or the shared memory outgrows smaller GPUs; fp32 dots as torch's matmuls."""
    widest = torch.float32 if torch.float32 in (x.dtype, B.dtype, C.dtype) else x.dtype
    blk = launch_config(x.shape[3], B.shape[3], x.is_cuda, widest, gpu_arch(x))
    return {**blk, "dot": dot_precision(), "states": x.dtype if blk["narrow_states"] else torch.float32}


def _segments(document_starts: torch.Tensor | None) -> torch.Tensor | None:
    """``[b, T]`` int32: each position's document, 0 before the first start (the initial state's)."""
    return None if document_starts is None else document_starts.to(torch.int32).cumsum(1, dtype=torch.int32)


# Registered as torch.library ops, opaque to torch.compile (traced as an autograd.Function, the wrapper's
# host-side settings broke a fullgraph compile), as the attention kernel is.
@torch.library.custom_op("hybrid_zoo::ssd_scan", mutates_args=())
def ssd_scan_op(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                D: torch.Tensor | None, initial_state: torch.Tensor | None, document_starts: torch.Tensor | None,
                chunk_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, final_state, Λ [b,h,nc·L], the entering states [b, nc+1, h, P, N])``; Λ is kept for the backward, and
    the states too where :func:`_keeps_states` says so (else the caller drops them and the backward makes them
    again)."""
    T, L = x.shape[1], chunk_size
    x, dt, B, C = (unit_stride_last(t) for t in (x, dt, B, C))
    blk = _blk(x, B, C)
    lam = _chunk_log_decays(dt, A, L)  # [b, h, nc·L]
    seg = _segments(document_starts)
    states, final = _entering_states(x, dt, B, lam, seg, initial_state, T, L, blk)  # [b, nc+1, h, P, N]
    y = torch.empty_like(x)
    qk = _group_scores_call(x, B, C, T, L, blk)  # [b, nc, G, L, L] or None
    _chunk_scan_call(C, B, x, dt, lam, seg, states, D, y, T, L, trans_state=True, blk=blk, qk=qk)
    return y, final, lam, states


def _entering_states(x, dt, B, lam, seg, initial_state, T: int, L: int, blk: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The state entering each chunk, and the final one: ``[b, nc+1, h, P, N]`` (fp32, or x's dtype with
    ``narrow_states``), and the final one again in fp32 (``[b, h, P, N]``). The backward computes them
    again (as mamba_ssm does) unless ``launch_config``'s ``keep_states`` keeps them from the forward
    (:func:`_keeps_states`)."""
    chunk_states = _chunk_state_call(x, dt, B, lam, seg, T, L, forward=True, blk=blk)  # [b, nc, h, P, N]
    return _decayed_scan_call(chunk_states, lam, seg, initial_state, T, L, reverse=False, dtype=blk["states"])


@ssd_scan_op.register_fake
def _(x, dt, A, B, C, D, initial_state, document_starts, chunk_size):
    batch, T, H, P = x.shape
    N, chunks = B.shape[3], -(-T // chunk_size)
    return (x.new_empty(x.shape), x.new_empty(batch, H, P, N, dtype=torch.float32),
            x.new_empty(batch, H, chunks * chunk_size, dtype=torch.float32),
            x.new_empty(batch, chunks + 1, H, P, N, dtype=_blk(x, B, C)["states"]))


def _keeps_states(x: torch.Tensor, states: torch.Tensor, blk: dict) -> bool:
    """Whether the backward takes the forward's entering states rather than making them again (the forward's state
    and scan kernels run twice otherwise): where ``launch_config`` says ``keep_states`` and they take no more bytes
    than ``x`` — ``N/L`` of them per head dim in the inputs' dtype (a half at N 128, chunk 256), ``2N/L`` in fp32."""
    return blk["keep_states"] and states.numel() * states.element_size() <= x.numel() * x.element_size()


@torch.library.custom_op("hybrid_zoo::ssd_scan_backward", mutates_args=())
def ssd_scan_backward_op(dy: torch.Tensor, d_final: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                         B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None, initial_state: torch.Tensor | None,
                         document_starts: torch.Tensor | None, lam: torch.Tensor, states: torch.Tensor | None,
                         chunk_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                   torch.Tensor, torch.Tensor]:
    """``(dx, d_dt, dA, dB, dC, dD, d_initial)``; ``dD`` is empty without ``D``; ``d_initial`` is fp32. ``states``:
    the forward's entering states, or None to make them again."""
    batch, T, H, P = x.shape
    L = chunk_size
    x, dt, B, C, dy = (unit_stride_last(t) for t in (x, dt, B, C, dy))
    blk, seg = _blk(x, B, C), _segments(document_starts)
    if states is None:
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
    dy_x = torch.empty_like(ddt_x) if D is not None else None  # ⟨dy, x⟩ per row: dD's terms
    _chunk_scan_reverse_call(B, C, dy, dt, lam, seg, d_states, dx, T, L, trans_state=True, blk=blk,
                             dx_of=(x, D, ddt_x, dy_x), qk=qk)
    ddt_x = ddt_x.transpose(1, 2)[:, :T]  # [b, T, h]

    da = _log_decay_gradient_call(x, dy, B, C, dt, lam, seg, states, d_states, read, share, T, L, blk,
                                  qk)  # [b, T, h]
    # contiguous, as the shape function says: the sum took ddt_x's transposed layout, and a compiled graph reads
    # a custom op's outputs with the strides its fake function gave
    d_dt = (ddt_x + da * A.float()).to(dt.dtype).contiguous()
    dA = (da * dt.float()).sum((0, 1)).to(A.dtype)
    dD = dy_x.sum((0, 2)).to(D.dtype) if D is not None else x.new_empty(0)  # the rows past T hold zeros
    return dx, d_dt, dA, dB, dC, dD, d_initial


@ssd_scan_backward_op.register_fake
def _(dy, d_final, x, dt, A, B, C, D, initial_state, document_starts, lam, states, chunk_size):
    batch, _, H, P = x.shape
    return (x.new_empty(x.shape), dt.new_empty(dt.shape), A.new_empty(A.shape), B.new_empty(B.shape),
            C.new_empty(C.shape), D.new_empty(D.shape) if D is not None else x.new_empty(0),
            x.new_empty(batch, H, P, B.shape[3], dtype=torch.float32))


def _ssd_setup_context(ctx, inputs, output):
    x, dt, A, B, C, D, initial_state, document_starts, chunk_size = inputs
    _, final_state, lam, states = output
    kept = states if _keeps_states(x, states, _blk(x, B, C)) else None  # else made again in the backward
    ctx.save_for_backward(x, dt, A, B, C, D, initial_state, document_starts, lam, kept)
    ctx.chunk_size, ctx.final_shape = chunk_size, final_state.shape
    ctx.initial_dtype = initial_state.dtype if initial_state is not None else None


def _ssd_backward(ctx, dy, d_final, _dlam, _dstates):
    x, dt, A, B, C, D, initial_state, document_starts, lam, states = ctx.saved_tensors
    dy = torch.zeros_like(x) if dy is None else dy
    d_final = x.new_zeros(ctx.final_shape, dtype=torch.float32) if d_final is None else d_final
    dx, d_dt, dA, dB, dC, dD, d_initial = ssd_scan_backward_op(dy, d_final, x, dt, A, B, C, D, initial_state,
                                                               document_starts, lam, states, ctx.chunk_size)
    return (dx, d_dt, dA, dB, dC, dD if D is not None else None,
            d_initial.to(ctx.initial_dtype) if ctx.initial_dtype is not None else None, None, None)


ssd_scan_op.register_autograd(_ssd_backward, setup_context=_ssd_setup_context)


def ssd_scan_triton(x, dt, A, B, C, *, chunk_size: int = 64, D=None, initial_state=None, document_starts=None):
    """Same contract as :func:`zoo_kernels.ssd.reference.ssd_chunked`: returns ``(y [b,T,h,P] in x's dtype,
    final_state [b,h,P,N] fp32)``; ``document_starts [b, T]`` bool resets the state where True."""
    # Views are read through their strides (x, B, C and dt split from one projection are not copied); only a last
    # dimension that is not contiguous is copied, here, once: the op saves what it is given.
    x, dt, B, C = (unit_stride_last(t) for t in (x, dt, B, C))
    y, final, _, _ = ssd_scan_op(x, dt, A, B, C, D, initial_state, document_starts, int(chunk_size))
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
    _log_decay_pairs[_grid(batch * n_chunks, triton.cdiv(L, rows), H, tiles["order"])](
        x, dy, B, C, dt, lam, seg_arg, lam if qk is None else qk, pairs, T, L, Tp, n_chunks, H, B.shape[2], P, N,
        *strides, HAS_DOCS=seg is not None, HAS_QK=qk is not None, ORDER=tiles["order"], BLOCK_L=rows,
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
