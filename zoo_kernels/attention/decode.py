"""Triton split-K attention for a decoding step: one query per sequence and head against ``S`` cached keys.

    scores[h, s] = scale · ⟨q_h, k_s⟩ + bias[h, s]      masked: key padding, the key window
    out_h        = softmax_s(scores[h]) · V

The flash kernel (triton.py) tiles the queries 64 rows at a time and loops over every key in one program, so
a step would leave 63 of 64 rows idle and run only ``B·H`` programs, each reading the whole cache alone.
Here (flash-decoding) the keys are split across programs instead: program ``(b·h_kv, split)`` reads one key
head's keys ``[split·n, (split+1)·n)`` once for all ``G = H / H_kv`` query heads that share it (GQA: the group's
queries are the rows of one tile) and keeps, per query head, the running maximum ``m``, the sum ``l`` of
``exp(score − m)`` and ``acc = Σ exp(score − m) · v`` of its keys. The splits are then merged in torch:

    M = max_split m,   out = Σ_split exp(m − M) · acc  /  Σ_split exp(m − M) · l

— the same online softmax as the flash kernel's, across programs instead of across loop steps. A split with
no allowed key has ``m = −inf`` and weighs nothing; a query with none at all returns zeros (the reference's
rule). The window is the flash kernel's: two thresholds per query head (window.py). Forward only: decoding
needs no gradient (:func:`zoo_kernels.attention.triton.attention_triton` sends a call that does to the flash kernel).
"""

import torch
import triton
import triton.language as tl

from zoo_kernels._backend import dot_precision, unit_stride_last
from zoo_kernels.attention.triton_kernels import online_softmax_step
from zoo_kernels.attention.window import window_thresholds


@triton.jit
def _decode_partials(Q, K, V, BIAS, PAD, WIN_B, WIN_J, M_OUT, L_OUT, ACC_OUT,
                     sq_b, sq_h, sk_b, sk_s, sk_h, sv_b, sv_s, sv_h, sbias_b, sbias_h, spad_b,
                     S, H, H_KV, GROUP, D, keys_per_split, n_splits, scale,
                     HAS_BIAS: tl.constexpr, HAS_PAD: tl.constexpr, HAS_WINDOW: tl.constexpr,
                     BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT: tl.constexpr):
    bk, split = tl.program_id(0), tl.program_id(1)
    b, hk = bk // H_KV, bk % H_KV
    offs_g = tl.arange(0, BLOCK_G)  # rows: the query heads h = hk·G + g of this key head
    in_g = offs_g < GROUP
    h0 = hk * GROUP  # the group's first query head
    bh = b.to(tl.int64) * H + h0 + offs_g  # [BLOCK_G] the rows' (batch, head), 64-bit
    offs_d = tl.arange(0, BLOCK_D)
    in_d = offs_d < D
    # 64-bit bases, moved once; the offsets inside one (batch, group) stay 32-bit (64-bit pointer tiles spill)
    Q = Q + b.to(tl.int64) * sq_b + h0.to(tl.int64) * sq_h
    q = tl.load(Q + offs_g[:, None] * sq_h + offs_d[None, :], mask=in_g[:, None] & in_d[None, :], other=0.0)
    K = K + b.to(tl.int64) * sk_b + hk.to(tl.int64) * sk_h
    V = V + b.to(tl.int64) * sv_b + hk.to(tl.int64) * sv_h
    BIAS = BIAS + b.to(tl.int64) * sbias_b + h0.to(tl.int64) * sbias_h
    PAD = PAD + b.to(tl.int64) * spad_b
    if HAS_WINDOW:
        win_b = tl.load(WIN_B + bh, mask=in_g, other=float("-inf"))
        win_j = tl.load(WIN_J + bh, mask=in_g, other=-1)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    lo = split * keys_per_split
    hi = tl.minimum(lo + keys_per_split, S)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        in_n = offs_n < hi
        kv_mask = in_n[:, None] & in_d[None, :]
        k = tl.load(K + offs_n[:, None] * sk_s + offs_d[None, :], mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        s = tl.dot(q, tl.trans(k), input_precision=DOT) * scale  # [BLOCK_G, BLOCK_N]
        valid = in_g[:, None] & in_n[None, :]
        key_bias = s * 0.0  # without a bias every key ties at 0 (a sliding window keeps the most recent)
        if HAS_BIAS:
            key_bias = tl.load(BIAS + offs_g[:, None] * sbias_h + offs_n[None, :], mask=valid, other=0.0).to(tl.float32)
            s += key_bias
        if HAS_PAD:
            padded = tl.load(PAD + offs_n, mask=in_n, other=1)
            valid = valid & (padded == 0)[None, :]
        if HAS_WINDOW:
            above = key_bias > win_b[:, None]
            tie_newer = (key_bias == win_b[:, None]) & (offs_n[None, :] >= win_j[:, None])
            valid = valid & (above | tie_newer)
        v_ptrs = V + offs_n[:, None] * sv_s + offs_d[None, :]
        m_i, l_i, acc = online_softmax_step(s, valid, v_ptrs, kv_mask, m_i, l_i, acc, DOT)  # the flash kernel's
    row = bh * n_splits + split  # [BLOCK_G] into [B, H, n_splits]
    tl.store(M_OUT + row, m_i, mask=in_g)
    tl.store(L_OUT + row, l_i, mask=in_g)
    tl.store(ACC_OUT + row[:, None] * D + offs_d[None, :], acc, mask=in_g[:, None] & in_d[None, :])


def decode_config(head_dim: int, group: int, cuda: bool, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Tiles and warps. The query rows are the group's heads, padded to 16 (``tl.dot``'s smallest tile). On CUDA
    32 keys a step with 8 warps in bf16/fp16, 16 with 4 in fp32, 3 pipeline stages: at head dims 64, 128 and 256
    no spill on sm_80 or sm_90, at most 196 registers and 83 KiB of shared memory (``python -m
    recipes.benchmarks.compile_check``). 64 keys with 4 warps sat at 255 registers and spilled 16-560 bytes from
    head dim 128 on; 32 with 4 warps spilled 8-16 at 256. Under the interpreter 16 keys, as the flash kernel's
    tests take. Timed on an H100 in bf16 (2026-11-26): 0.55-1.01× the speed of torch's SDPA, which ``auto`` takes
    for a decoding step (docs/kernels.md)."""
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_g = max(16, triton.next_power_of_2(group))
    if not cuda:
        return dict(BLOCK_G=block_g, BLOCK_N=16, BLOCK_D=block_d, num_warps=4, num_stages=1)
    if dtype == torch.float32:
        return dict(BLOCK_G=block_g, BLOCK_N=16, BLOCK_D=block_d, num_warps=4, num_stages=3)
    return dict(BLOCK_G=block_g, BLOCK_N=32, BLOCK_D=block_d, num_warps=8, num_stages=3)


def decode_splits(batch: int, kv_heads: int, S: int, block_n: int, device: torch.device) -> int:
    """How many programs share one key head's keys: enough that ``B·H_kv·splits`` programs fill the GPU twice
    over (one per key head already does at large batches), never a split of less than one key block. On a CPU
    (the interpreter) up to 4, so the tests merge several splits."""
    blocks = triton.cdiv(S, block_n)
    target = 2 * torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, min(blocks, triton.cdiv(target, batch * kv_heads)))


@torch.library.custom_op("hybrid_zoo::bias_attention_decode", mutates_args=())
def bias_attention_decode_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                             key_padding_mask: torch.Tensor | None, scale: float, keep_window: int | None,
                             splits: int | None) -> torch.Tensor:
    """``q [B, 1, H, D]`` against ``k, v [B, S, H_kv, D]`` in ``splits`` programs per key head (None:
    :func:`decode_splits`, chosen here, inside the op, where torch.compile does not trace) → ``[B, 1, H, D]``."""
    B, _, H, D = q.shape
    S, H_kv = k.shape[1], k.shape[2]
    q, k, v = (unit_stride_last(t) for t in (q, k, v))
    config = decode_config(D, H // H_kv, q.is_cuda, q.dtype)
    if splits is None:
        splits = decode_splits(B, H_kv, S, config["BLOCK_N"], q.device)
    keys_per_split = triton.cdiv(triton.cdiv(S, splits), config["BLOCK_N"]) * config["BLOCK_N"]
    splits = triton.cdiv(S, keys_per_split)  # no split left without keys
    bias_c = bias.contiguous() if bias is not None else q.new_zeros(1)
    pad = key_padding_mask.to(torch.int8).contiguous() if key_padding_mask is not None else q.new_zeros(1, dtype=torch.int8)
    if keep_window is not None:  # one query sees every key: the thresholds over all of them
        win_b, win_j = window_thresholds(bias, key_padding_mask, batch=B, heads=H, T=1, S=S, causal=False,
                                         keep_window=keep_window, device=q.device)  # [B, H, 1] each
    m = torch.empty(B, H, splits, dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    acc = torch.empty(B, H, splits, D, dtype=torch.float32, device=q.device)
    if keep_window is None:
        win_b = win_j = m  # unused placeholders
    _decode_partials[(B * H_kv, splits)](
        q, k, v, bias_c, pad, win_b, win_j, m, l, acc,
        q.stride(0), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        bias_c.stride(0) if bias is not None else 0, bias_c.stride(1) if bias is not None else 0,
        pad.stride(0) if key_padding_mask is not None else 0,
        S, H, H_kv, H // H_kv, D, keys_per_split, splits, scale,
        HAS_BIAS=bias is not None, HAS_PAD=key_padding_mask is not None, HAS_WINDOW=keep_window is not None,
        DOT=dot_precision(), **config,
    )
    return merge_splits(m, l, acc).to(q.dtype)[:, None]  # [B, 1, H, D]


@bias_attention_decode_op.register_fake
def _(q, k, v, bias, key_padding_mask, scale, keep_window, splits):
    return q.new_empty(q.shape)


def merge_splits(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """The splits' partial softmaxes ``m, l [B, H, n]``, ``acc [B, H, n, D]`` → ``[B, H, D]`` fp32 (zeros where no
    split allowed a key)."""
    top = m.amax(-1, keepdim=True)  # [B, H, 1]
    weight = torch.exp(m - torch.where(top == float("-inf"), 0.0, top))  # [B, H, n]; an empty split weighs 0
    total = (weight * l).sum(-1, keepdim=True)  # [B, H, 1]
    out = (weight[..., None] * acc).sum(-2)  # [B, H, D]
    return torch.where(total > 0, out / torch.where(total > 0, total, 1.0), 0.0)


def attention_decode_triton(q, k, v, *, bias=None, key_padding_mask=None, keep_window=None, scale: float,
                            splits: int | None = None) -> torch.Tensor:
    """One decoding step, ``q [B, 1, H, D]`` → ``[B, 1, H, D]``; ``splits`` programs per key head (default:
    :func:`decode_splits`). The arguments are those of :func:`zoo_kernels.attention.attention`, checked there."""
    return bias_attention_decode_op(q, k, v, bias, key_padding_mask, float(scale), keep_window,
                                    None if splits is None else int(splits))
