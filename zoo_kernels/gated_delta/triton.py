"""Triton gated delta rule, the host side: the recurrence over chunks as torch custom ops (``delta_chunks``, forward and
backward) around the kernels of triton_kernels.py, and :func:`gated_delta_triton`, the chunked rule with that loop
in one launch. Everything else — the solve, the decays, the in-chunk scores, the outputs — is reference.py's
``chunk_terms`` and two batched products, differentiated by torch's autograd."""

import torch
import triton
from einops import rearrange

from zoo_kernels._backend import dot_precision, gpu_arch
from zoo_kernels.gated_delta.reference import chunk_terms
from zoo_kernels.gated_delta.triton_kernels import _delta_chunks, _delta_chunks_backward


def launch_config(K: int, V: int, cuda: bool, arch: int = 90) -> dict:
    """Tiles of the recurrence's kernels (``arch``: the GPU's compute capability × 10): one program per (batch, head)
    and ``BLOCK_V`` value columns, holding ``[K, BLOCK_V]`` fp32 tiles of the state (two in the forward, three in the
    backward) and stepping through each chunk's rows ``BLOCK_R`` at a time; at least 16 a side (``tl.dot``).

    On CUDA 16 rows, 8 warps, 1 stage, and 32 value columns on Hopper up to ``K`` 128, 16 elsewhere: spill-free on
    sm_90 at K 64, 128 (32 columns) and 256 (16), with fp32 and TF32 dots, 118-255 registers a thread
    (``python -m recipes.benchmarks.compile_check --only gated_delta``, 2026-12-06); on sm_80 the TF32 backward spills
    24 bytes at K 128 and 232 at K 256. Whole ``[64, K]`` tiles of a chunk's rows, 4 warps or 2 stages spilled
    (0.1-16 KB a thread at K 128). Not yet timed on a GPU."""
    block_k = max(16, triton.next_power_of_2(K))
    if not cuda:  # the interpreter: the least tiles
        return {"BLOCK_R": 16, "BLOCK_K": block_k, "BLOCK_V": 16, "num_warps": 1, "num_stages": 1}
    block_v = 32 if arch >= 90 and block_k <= 128 and V > 16 else 16
    return {"BLOCK_R": 16, "BLOCK_K": block_k, "BLOCK_V": block_v, "num_warps": 8, "num_stages": 1}


def _fp32(t: torch.Tensor) -> torch.Tensor:
    """``t`` as contiguous fp32: the kernels read ``[b, h, …]`` as ``[b·h, …]``."""
    return t.float().contiguous()


# Registered as torch.library ops, opaque to torch.compile, as the SSD's and attention's kernels are.
@torch.library.custom_op("hybrid_zoo::gated_delta_chunks", mutates_args=())
def delta_chunks(U: torch.Tensor, W: torch.Tensor, writes: torch.Tensor, kept: torch.Tensor,
                 initial_state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The recurrence over chunks. ``U [b,h,nc,L,V]``, ``W``, ``writes [b,h,nc,L,K]``, ``kept [b,h,nc]``,
    ``initial_state [b,h,K,V]`` or None. Returns fp32 ``(Δ [b,h,nc,L,V], the state entering each chunk
    [b,h,nc,K,V], the final state [b,h,K,V])``."""
    batch, H, n_chunks, L, V = U.shape
    K = W.shape[-1]
    f32 = dict(dtype=torch.float32, device=U.device)
    delta, states = torch.empty(batch, H, n_chunks, L, V, **f32), torch.empty(batch, H, n_chunks, K, V, **f32)
    final = torch.empty(batch, H, K, V, **f32)
    cfg = launch_config(K, V, U.is_cuda, gpu_arch(U))
    h0 = _fp32(initial_state) if initial_state is not None else final  # (not read without HAS_H0)
    _delta_chunks[(batch * H, triton.cdiv(V, cfg["BLOCK_V"]))](
        _fp32(U), _fp32(W), _fp32(writes), _fp32(kept), h0, delta, states, final, n_chunks, L, K, V,
        HAS_H0=initial_state is not None, BLOCK_R=cfg["BLOCK_R"], BLOCK_K=cfg["BLOCK_K"],
        BLOCK_V=cfg["BLOCK_V"], DOT=dot_precision(), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return delta, states, final


@delta_chunks.register_fake
def _(U, W, writes, kept, initial_state):
    batch, H, n_chunks, L, V = U.shape
    K = W.shape[-1]
    f32 = lambda *shape: U.new_empty(*shape, dtype=torch.float32)  # noqa: E731
    return f32(batch, H, n_chunks, L, V), f32(batch, H, n_chunks, K, V), f32(batch, H, K, V)


@torch.library.custom_op("hybrid_zoo::gated_delta_chunks_backward", mutates_args=())
def delta_chunks_backward(d_delta: torch.Tensor, d_states: torch.Tensor, d_final: torch.Tensor, W: torch.Tensor,
                          writes: torch.Tensor, kept: torch.Tensor, states: torch.Tensor, delta: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dU, dW, d writes, d kept, d initial_state)``, fp32, in the forward's shapes."""
    batch, H, n_chunks, L, V = delta.shape
    K = W.shape[-1]
    cfg = launch_config(K, V, delta.is_cuda, gpu_arch(delta))
    n_v = triton.cdiv(V, cfg["BLOCK_V"])
    f32 = dict(dtype=torch.float32, device=delta.device)
    d_u, d_h0 = torch.empty(batch, H, n_chunks, L, V, **f32), torch.empty(batch, H, K, V, **f32)
    d_w, d_writes = (torch.empty(n_v, batch, H, n_chunks, L, K, **f32) for _ in range(2))  # shares over V blocks
    d_kept = torch.empty(n_v, batch, H, n_chunks, **f32)
    _delta_chunks_backward[(batch * H, n_v)](
        _fp32(W), _fp32(writes), _fp32(kept), _fp32(states), _fp32(delta), _fp32(d_delta), _fp32(d_states),
        _fp32(d_final), d_u, d_w, d_writes, d_kept, d_h0, batch * H, n_chunks, L, K, V,
        BLOCK_R=cfg["BLOCK_R"], BLOCK_K=cfg["BLOCK_K"], BLOCK_V=cfg["BLOCK_V"],
        DOT=dot_precision(), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return d_u, d_w.sum(0), d_writes.sum(0), d_kept.sum(0), d_h0


@delta_chunks_backward.register_fake
def _(d_delta, d_states, d_final, W, writes, kept, states, delta):
    f32 = lambda t: t.new_empty(t.shape, dtype=torch.float32)  # noqa: E731
    return f32(delta), f32(W), f32(writes), f32(kept), f32(d_final)


def _setup_context(ctx, inputs, output):
    U, W, writes, kept, initial_state = inputs
    delta, states, final = output
    ctx.save_for_backward(W, writes, kept, states, delta)
    ctx.dtypes = (U.dtype, W.dtype, writes.dtype, kept.dtype, None if initial_state is None else initial_state.dtype)
    ctx.final_shape = final.shape


def _backward(ctx, d_delta, d_states, d_final):
    W, writes, kept, states, delta = ctx.saved_tensors
    zeros = lambda t, shape: t if t is not None else delta.new_zeros(shape)  # noqa: E731  (an output not used)
    grads = delta_chunks_backward(zeros(d_delta, delta.shape), zeros(d_states, states.shape),
                                  zeros(d_final, ctx.final_shape), W, writes, kept, states, delta)
    return tuple(None if dtype is None else grad.to(dtype) for grad, dtype in zip(grads, ctx.dtypes))


delta_chunks.register_autograd(_backward, setup_context=_setup_context)


def gated_delta_triton(q, k, v, g, beta, *, scale: float, chunk_size: int = 64, initial_state=None,
                       document_starts=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`zoo_kernels.gated_delta.reference.gated_delta_chunked` (inputs in fp32 or wider):
    ``(y [b,T,h,v], final_state [b,h,k,v])``, with the recurrence over chunks in one kernel launch."""
    T = k.shape[1]
    U, W, reads, scores, writes, kept = chunk_terms(q, k, v, g, beta, scale=scale, chunk_size=chunk_size,
                                                    document_starts=document_starts)
    delta, states, final = delta_chunks(U, W, writes, kept, initial_state)  # [b,h,nc,L,v], [b,h,nc,k,v], [b,h,k,v]
    y = reads @ states + scores @ delta  # [b, h, nc, L, v]: what the chunk reads of S_0, and of its own Δ
    return rearrange(y, "b h c l v -> b (c l) h v")[:, :T], final  # [b, T, h, v]
