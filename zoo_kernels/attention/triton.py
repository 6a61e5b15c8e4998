"""Triton flash attention with an additive per-key bias, the host side: tiles per head size, GPU and dtype
(``launch_config``), the masks prepared in O(T) memory, the launches, and the forward and backward as torch custom
ops (``attention_triton``). The kernels and their math: triton_kernels.py."""

import math

import torch
import triton

from zoo_kernels._backend import dot_precision, gpu_arch, unit_stride_last
from zoo_kernels.attention.reference import document_runs
from zoo_kernels.attention.triton_kernels import _backward_kv, _backward_q, _delta, _forward
from zoo_kernels.attention.window import window_thresholds


def launch_config(head_dim: int, cuda: bool, dtype: torch.dtype = torch.bfloat16, dot: str = "ieee",
                  arch: int = 90) -> dict[str, dict]:
    """Each kernel's tiles, warps and pipeline stages: ``{"forward", "backward_q", "backward_kv"}`` → the kernel's
    ``BLOCK_M`` (query rows), ``BLOCK_N`` (key rows), ``BLOCK_D``, ``num_warps``, ``num_stages``; the Δ kernel takes
    ``backward_q``'s rows.

    On sm_90 in bf16/fp16 up to head dim 128, the pick of ``python -m recipes.benchmarks.attention_tiles`` on an H200
    (B 4, T 4096, H 16, a bias; docs/kernels.md): 64×64 forward tiles with 4 warps and 3 stages (1.23× the former 8
    warps at D 64, 1.38× at 128; 128-row tiles were slower); at D ≤ 64 dQ 64×32 and dK/dV 32 queries × 64 keys,
    4 warps (6.41 → 4.62 ms fwd+bwd in all). Above 64 the backward kernels were faster with 4 warps too, but spill
    40-344 bytes with a bias, padding and a window or documents (``python -m recipes.benchmarks.compile_check``), so
    they take 8: dQ 64×32, dK/dV 32×64 with 2 stages, spill-free. In fp32: 32×32 tiles, 4 warps and 2 stages — the
    64×64 tiles spill there and need up to 112 KiB of shared memory, more than consumer GPUs have; with full-fp32
    dots (``dot="ieee"``, torch's default precision) 8 warps, where 4 spill 5.7 KB per thread in the dK/dV kernel
    (8 still spill 0.6 KB: TF32 is the fast fp32 path). Head dims above 128 (256-wide tiles) take 32×32 tiles in
    bf16/fp16: 64 query rows spilled 88 bytes (forward) and 720 (dQ) on sm_90 and needed 96 KiB; at 32×32 no kernel
    spills on sm_80 or sm_90, with at most 67 KiB of shared memory, within a consumer GPU's 99. Before Hopper
    (``arch`` below 90: compute capability ×10, A100 80, consumer Ampere/Ada 86/89) head dims up to 128 take 32×64
    tiles, 8 warps, in bf16/fp16: at 64×64, sm_80's code for the kernels with packed documents spilled 8-16 bytes
    (forward) and 144 (dQ, head dim 64); at 32×64 none spills, using at most 53 KiB. In fp32 above head dim 128:
    16×32 tiles, 8 warps, 1 stage — compiled as a launch at aligned shapes compiles them (``compile_check
    --aligned``), 32×32 tiles needed 100-132 KiB, more than a consumer GPU's 99 (the kernel would not launch there),
    and 16-row tiles with 2 stages spilled 3-10 KB per thread; these spill nothing and take at most 98 KiB. Not
    searched: fp32, sm_80-89, head dims above 128."""
    block_d = max(16, triton.next_power_of_2(head_dim))

    def kernels(block_m: int, block_n: int, warps: int, stages: int, dkv_rows: int) -> dict[str, dict]:
        shared = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, num_warps=warps, num_stages=stages)
        return {"forward": shared, "backward_q": shared, "backward_kv": {**shared, "BLOCK_M": dkv_rows}}

    if not cuda:  # the interpreter: small tiles, and a dK/dV step unlike BLOCK_M, as on a GPU
        return kernels(16, 16, 4, 1, 32)
    if dtype == torch.float32 and block_d > 128:  # the launch's variant needs 100-132 KiB at 32×32 (see above)
        return kernels(16, 32, 8, 1, 16)
    if dtype == torch.float32:
        return kernels(32, 32, 8 if dot == "ieee" else 4, 2, 32)
    if block_d > 128:
        return kernels(32, 32, 8, 3, 32)
    if arch < 90:
        return kernels(32, 64, 8, 3, 32)
    forward = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_D=block_d, num_warps=4, num_stages=3)
    if block_d <= 64:
        return {"forward": forward, "backward_q": {**forward, "BLOCK_N": 32}, "backward_kv": {**forward, "BLOCK_M": 32}}
    # head dims 65-128: with 4 warps the backward kernels spill 40-344 bytes (all options on), so 8 there
    return {"forward": forward, "backward_q": dict(BLOCK_M=64, BLOCK_N=32, BLOCK_D=block_d, num_warps=8, num_stages=3),
            "backward_kv": dict(BLOCK_M=32, BLOCK_N=64, BLOCK_D=block_d, num_warps=8, num_stages=2)}


def _prepared(q, k, v, bias, key_padding_mask, document_ids, causal: bool, keep_window: int | None,
              backward: bool = False):
    """The kernels' operands and launch settings, the same in the forward and the backward."""
    B, T, H, D = q.shape
    S = k.shape[1]
    # Q, K and V are read through their strides, so views (QCAttention's q, k and v, split from one projection)
    # are not copied — but in the backward Q is copied when it is not contiguous: there dO and dQ are addressed
    # with Q's strides, and a row stride of their own cost the dK/dV kernel two more registers, 8 bytes spilled on
    # sm_80 with documents (recipes.benchmarks.compile_check).
    q = q.contiguous() if backward else unit_stride_last(q)
    k, v = unit_stride_last(k), unit_stride_last(v)
    bias_c = bias.contiguous() if bias is not None else q.new_zeros(1)
    pad = key_padding_mask.to(torch.int8).contiguous() if key_padding_mask is not None else q.new_zeros(1, dtype=torch.int8)
    docs = document_spans(document_ids) if document_ids is not None else q.new_zeros(1, 1, dtype=torch.int32)
    dot = dot_precision()
    config = launch_config(D, q.is_cuda, q.dtype, dot, gpu_arch(q))
    for name, rows, length in (("forward", "BLOCK_M", T), ("backward_q", "BLOCK_M", T), ("backward_kv", "BLOCK_N", S)):
        if triton.cdiv(length, config[name][rows]) > 65535:  # grid axis 1
            raise ValueError(f"attention: backend='triton' takes at most 65,535 blocks of {config[name][rows]} "
                             f"{'queries' if rows == 'BLOCK_M' else 'keys'}; got T={T:,}, S={S:,}")
    flags = dict(HAS_BIAS=bias is not None, HAS_PAD=key_padding_mask is not None, CAUSAL=causal,
                 HAS_WINDOW=keep_window is not None, HAS_DOCS=document_ids is not None, DOT=dot)
    return q, k, v, bias_c, pad, docs, config, flags


# The kernels are registered as torch.library ops, opaque to torch.compile: traced through an autograd.Function,
# the wrapper's host-side settings (dot precision, launch configuration) broke a fullgraph compile.
@torch.library.custom_op("hybrid_zoo::bias_attention", mutates_args=())
def bias_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                      key_padding_mask: torch.Tensor | None, document_ids: torch.Tensor | None, causal: bool,
                      scale: float, keep_window: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(o [B,T,H,D], lse [B,H,T] fp32, τ_bias, τ_pos)``; the window thresholds are empty without a window."""
    B, T, H, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    q, k, v, bias_c, pad, docs, config, flags = _prepared(q, k, v, bias, key_padding_mask, document_ids, causal, keep_window)
    config = config["forward"]
    o = q.new_empty(B, T, H, D)
    lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    if keep_window is not None:  # two numbers per query; the selection carries no gradient
        win_b, win_j = window_thresholds(bias, key_padding_mask, batch=B, heads=H, T=T, S=S, causal=causal,
                                         keep_window=keep_window, device=q.device, document_ids=document_ids)
    else:
        win_b, win_j = q.new_empty(0, dtype=torch.float32), q.new_empty(0, dtype=torch.int32)
    _forward[(B * H, triton.cdiv(T, config["BLOCK_M"]))](
        q, k, v, bias_c, pad, docs, win_b if keep_window is not None else lse, win_j if keep_window is not None else lse,
        o, lse,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        bias_c.stride(0) if bias is not None else 0, bias_c.stride(1) if bias is not None else 0,
        pad.stride(0) if key_padding_mask is not None else 0, docs.stride(0),
        T, S, H, H // Hkv, D, scale, **flags, **config,
    )
    return o, lse, win_b, win_j


@bias_attention_op.register_fake
def _(q, k, v, bias, key_padding_mask, document_ids, causal, scale, keep_window):
    B, T, H, _ = q.shape
    window = (B, H, T) if keep_window is not None else (0,)
    return (q.new_empty(q.shape), q.new_empty(B, H, T, dtype=torch.float32), q.new_empty(window, dtype=torch.float32),
            q.new_empty(window, dtype=torch.int32))


@torch.library.custom_op("hybrid_zoo::bias_attention_backward", mutates_args=())
def bias_attention_backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               bias: torch.Tensor | None, key_padding_mask: torch.Tensor | None,
                               document_ids: torch.Tensor | None, o: torch.Tensor, lse: torch.Tensor, win_b: torch.Tensor,
                               win_j: torch.Tensor, causal: bool, scale: float, keep_window: int | None
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv, dbias)``; ``dbias`` is empty without a bias."""
    B, T, H, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    q, k, v, bias_c, pad, docs, config, flags = _prepared(q, k, v, bias, key_padding_mask, document_ids, causal, keep_window,
                                                          backward=True)
    if keep_window is None:
        win_b = win_j = lse  # unused placeholders
    do = do.contiguous()
    delta = torch.empty(B, H, T, dtype=torch.float32, device=q.device)  # Σ_d o·do per row
    rows_q = config["backward_q"]["BLOCK_M"]
    _delta[(B * H, triton.cdiv(T, rows_q))](
        o, do, delta, o.stride(0), o.stride(1), o.stride(2), do.stride(0), do.stride(1), do.stride(2), T, H, D,
        BLOCK_M=rows_q, BLOCK_D=config["backward_q"]["BLOCK_D"])
    dq = torch.empty_like(q)
    dk_heads = torch.empty(B, S, H, D, dtype=q.dtype, device=q.device)  # per query head, summed below
    dv_heads = torch.empty_like(dk_heads)
    dbias = torch.empty(B, H, S, dtype=torch.float32, device=q.device) if bias is not None else None
    bias_strides = (bias_c.stride(0), bias_c.stride(1)) if bias is not None else (0, 0)
    pad_stride = pad.stride(0) if key_padding_mask is not None else 0
    common = (T, S, H, H // Hkv, D, scale)
    _backward_kv[(B * H, triton.cdiv(S, config["backward_kv"]["BLOCK_N"]))](
        q, k, v, bias_c, pad, docs, win_b, win_j, do, lse, delta, dk_heads, dv_heads, dbias if dbias is not None else lse,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), dk_heads.stride(0), dk_heads.stride(1), dk_heads.stride(2),
        *bias_strides, pad_stride, docs.stride(0), *common, **flags, **config["backward_kv"],
    )
    _backward_q[(B * H, triton.cdiv(T, rows_q))](
        q, k, v, bias_c, pad, docs, win_b, win_j, do, lse, delta, dq,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), *bias_strides, pad_stride, docs.stride(0), *common, **flags,
        **config["backward_q"],
    )
    group = H // Hkv
    if group == 1:  # one query head per key head: the per-head gradients are dK and dV
        dk, dv = dk_heads, dv_heads
    else:
        dk = dk_heads.view(B, S, Hkv, group, D).sum(3)  # [B, S, Hkv, D]
        dv = dv_heads.view(B, S, Hkv, group, D).sum(3)
    dbias = dbias.to(bias.dtype) if bias is not None else q.new_empty(0)
    return dq, dk, dv, dbias


@bias_attention_backward_op.register_fake
def _(do, q, k, v, bias, key_padding_mask, document_ids, o, lse, win_b, win_j, causal, scale, keep_window):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            bias.new_empty(bias.shape) if bias is not None else q.new_empty(0))


def _setup_context(ctx, inputs, output):
    q, k, v, bias, key_padding_mask, document_ids, causal, scale, keep_window = inputs
    o, lse, win_b, win_j = output
    ctx.save_for_backward(q, k, v, bias, key_padding_mask, document_ids, o, lse, win_b, win_j)
    ctx.causal, ctx.scale, ctx.keep_window = causal, scale, keep_window


def _backward(ctx, do, _dlse, _dwin_b, _dwin_j):
    q, k, v, bias, key_padding_mask, document_ids, o, lse, win_b, win_j = ctx.saved_tensors
    dq, dk, dv, dbias = bias_attention_backward_op(do, q, k, v, bias, key_padding_mask, document_ids, o, lse, win_b,
                                                   win_j, ctx.causal, ctx.scale, ctx.keep_window)
    return dq, dk, dv, (dbias if bias is not None else None), None, None, None, None, None


bias_attention_op.register_autograd(_backward, setup_context=_setup_context)


def document_spans(runs: torch.Tensor) -> torch.Tensor:
    """``runs [B, T]`` (non-decreasing document numbers) → ``[B, 3·T]`` int32: the runs, then where each position's
    document starts, then where it ends (exclusive) — what the kernels compare, and where their loops over keys
    (forward, dQ) and over queries (dK/dV) start and stop, so a packed row costs its documents' work, not T²."""
    B, T = runs.shape
    index = torch.arange(T, device=runs.device).expand(B, T)  # [B, T]
    starts = torch.ones_like(runs, dtype=torch.bool)
    starts[:, 1:] = runs[:, 1:] != runs[:, :-1]
    first = torch.where(starts, index, 0).cummax(dim=1).values  # [B, T]
    ends = torch.ones_like(runs, dtype=torch.bool)
    ends[:, :-1] = starts[:, 1:]  # the last position of each document
    last = torch.where(ends, index, T).flip(1).cummin(dim=1).values.flip(1)  # [B, T] its document's last position
    return torch.cat([runs, first, last + 1], dim=1).to(torch.int32).contiguous()


def attention_triton(q, k, v, *, bias=None, causal=True, key_padding_mask=None, keep_window=None,
                     scale=None, document_ids=None) -> torch.Tensor:
    """Same contract as :func:`zoo_kernels.attention.reference.attention_reference`."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    _check_index_range(q, k, v)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, bias))
    if q.shape[1] == 1 and document_ids is None and not needs_grad:  # a decoding step: the keys split across programs
        from zoo_kernels.attention.decode import attention_decode_triton

        return attention_decode_triton(q, k, v, bias=bias, key_padding_mask=key_padding_mask, keep_window=keep_window,
                                       scale=scale)
    if document_ids is not None:
        document_ids = document_runs(document_ids)  # [B, T] non-decreasing: the window's thresholds need runs
    # the bias contiguous here, once: the op saves what it is given, so its backward does not copy it again
    bias = bias.contiguous() if bias is not None else None
    return bias_attention_op(q, k, v, bias, key_padding_mask, document_ids, causal, float(scale), keep_window)[0]


def _check_index_range(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None) -> None:
    """The kernels index inside one sequence in 32 bits (the (batch, head) base is 64-bit): refuse a
    sequence whose rows reach 2^31 elements — length × row stride, for q, k and v as given (a view of a wider
    projection has a wider row) and for the contiguous ``[B, ·, H, D]`` outputs and per-head gradients (``T·H·D``,
    ``S·H·D``) — rather than read the wrong rows."""
    _, T, H, D = q.shape
    S = k.shape[1]
    rows = {"q": (T, q.stride(1)), "k": (S, k.stride(1)), "the output (T·H·D)": (T, H * D),
            "the per-head dK/dV (S·H·D)": (S, H * D)}
    if v is not None:
        rows["v"] = (S, v.stride(1))
    for name, (length, stride) in rows.items():
        if length * stride >= 2**31:
            raise ValueError(f"attention: backend='triton' indexes inside one sequence in 32 bits, and {name} reaches "
                             f"{length:,} rows × {stride:,} = {length * stride:,} >= 2^31; split the sequence (decode "
                             "against a cache) or use backend='reference'")
