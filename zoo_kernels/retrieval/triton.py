"""Triton gather-and-mix for CDMoE: ``y_m = Σ_j w_mj · act(⟨x_m, down[e_mj]⟩) · up[e_mj]``.

One program per token: it walks the token's ``H·k`` retrieved experts, loading each expert's two
rows once, so the ``[M, H, k, d]`` rows are never materialised (the reference gathers them).
The backward recomputes the inner products; the experts' row gradients are scattered with atomic
adds (tokens share experts), so their summation order, not their value, may vary between runs.

Accumulation is in fp32 whatever the input dtype.
"""

import torch
import triton
import triton.language as tl

ACT_IDS = {"silu": 0, "gelu": 1, "relu": 2}


@triton.jit
def _act_and_grad(z, ACT: tl.constexpr):
    """``(act(z), act'(z))`` for silu (0), exact gelu (1), relu (2)."""
    if ACT == 0:
        s = tl.sigmoid(z)
        return z * s, s * (1 + z * (1 - s))
    elif ACT == 1:
        cdf = 0.5 * (1 + tl.math.erf(z * 0.7071067811865476))
        pdf = 0.3989422804014327 * tl.exp(-0.5 * z * z)
        return z * cdf, cdf + z * pdf
    else:
        positive = z > 0
        return tl.where(positive, z, 0.0), tl.where(positive, 1.0, 0.0)


@triton.jit
def _mix_forward(x_ptr, e_ptr, w_ptr, down_ptr, up_ptr, y_ptr, D, HK,
                 ACT: tl.constexpr, BLOCK_D: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)  # 64-bit offsets
    cols = tl.arange(0, BLOCK_D)
    in_row = cols < D
    x = tl.load(x_ptr + m * D + cols, mask=in_row, other=0.0).to(tl.float32)  # [BLOCK_D]
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for j in range(HK):
        e = tl.load(e_ptr + m * HK + j).to(tl.int64)
        w = tl.load(w_ptr + m * HK + j).to(tl.float32)
        down = tl.load(down_ptr + e * D + cols, mask=in_row, other=0.0).to(tl.float32)
        up = tl.load(up_ptr + e * D + cols, mask=in_row, other=0.0).to(tl.float32)
        a, _ = _act_and_grad(tl.sum(x * down, axis=0), ACT)
        acc += (w * a) * up
    tl.store(y_ptr + m * D + cols, acc.to(y_ptr.dtype.element_ty), mask=in_row)


@triton.jit
def _mix_backward(x_ptr, e_ptr, w_ptr, down_ptr, up_ptr, dy_ptr, dx_ptr, dw_ptr, ddown_ptr, dup_ptr, D, HK,
                  ACT: tl.constexpr, BLOCK_D: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)  # 64-bit offsets
    cols = tl.arange(0, BLOCK_D)
    in_row = cols < D
    x = tl.load(x_ptr + m * D + cols, mask=in_row, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + m * D + cols, mask=in_row, other=0.0).to(tl.float32)
    dx = tl.zeros([BLOCK_D], dtype=tl.float32)
    for j in range(HK):
        e = tl.load(e_ptr + m * HK + j).to(tl.int64)
        w = tl.load(w_ptr + m * HK + j).to(tl.float32)
        down = tl.load(down_ptr + e * D + cols, mask=in_row, other=0.0).to(tl.float32)
        up = tl.load(up_ptr + e * D + cols, mask=in_row, other=0.0).to(tl.float32)
        a, da = _act_and_grad(tl.sum(x * down, axis=0), ACT)
        g = tl.sum(dy * up, axis=0)  # ⟨dy, up_e⟩
        tl.store(dw_ptr + m * HK + j, a * g)
        d_inner = w * g * da
        dx += d_inner * down
        tl.atomic_add(ddown_ptr + e * D + cols, d_inner * x, mask=in_row)
        tl.atomic_add(dup_ptr + e * D + cols, (w * a) * dy, mask=in_row)
    tl.store(dx_ptr + m * D + cols, dx.to(dx_ptr.dtype.element_ty), mask=in_row)


def launch_config(d_model: int) -> dict:
    """One program per token holds a whole row: ``BLOCK_D`` is ``d_model`` rounded up to a power of two."""
    return dict(BLOCK_D=triton.next_power_of_2(d_model), num_warps=4, num_stages=3)


# A torch.library op pair, like the attention and SSD kernels: opaque to torch.compile, so a fullgraph compile
# does not trace into the launch (an autograd.Function is traced, and its host-side settings break the graph).
@torch.library.custom_op("hybrid_zoo::expert_mix", mutates_args=())
def expert_mix_op(x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, down: torch.Tensor, up: torch.Tensor,
                  act: str) -> torch.Tensor:
    """``y [M, d]`` in ``x``'s dtype; ``experts``, ``weights`` ``[M, H·k]`` contiguous."""
    M, D = x.shape
    y = torch.empty_like(x)
    _mix_forward[(M,)](x, experts, weights, down, up, y, D, experts.shape[1], ACT=ACT_IDS[act], **launch_config(D))
    return y


@expert_mix_op.register_fake
def _(x, experts, weights, down, up, act):
    return torch.empty_like(x)


@torch.library.custom_op("hybrid_zoo::expert_mix_backward", mutates_args=())
def expert_mix_backward_op(dy: torch.Tensor, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
                           down: torch.Tensor, up: torch.Tensor, act: str
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dx, dweights [M, H·k], ddown, dup)`` in the inputs' dtypes."""
    M, D = x.shape
    dx = torch.empty_like(x)
    dw = torch.empty(M, experts.shape[1], dtype=torch.float32, device=x.device)
    # fp32 accumulators for the scattered row gradients
    ddown = torch.zeros(down.shape, dtype=torch.float32, device=x.device)
    dup = torch.zeros(up.shape, dtype=torch.float32, device=x.device)
    _mix_backward[(M,)](x, experts, weights, down, up, dy.contiguous(), dx, dw, ddown, dup, D, experts.shape[1],
                        ACT=ACT_IDS[act], **launch_config(D))
    return dx, dw.to(weights.dtype), ddown.to(down.dtype), dup.to(up.dtype)


@expert_mix_backward_op.register_fake
def _(dy, x, experts, weights, down, up, act):
    return torch.empty_like(x), torch.empty_like(weights), torch.empty_like(down), torch.empty_like(up)


def _setup_context(ctx, inputs, output):
    x, experts, weights, down, up, act = inputs
    ctx.save_for_backward(x, experts, weights, down, up)
    ctx.act = act


def _backward(ctx, dy):
    x, experts, weights, down, up = ctx.saved_tensors
    dx, dw, ddown, dup = expert_mix_backward_op(dy, x, experts, weights, down, up, ctx.act)
    return dx, None, dw, ddown, dup, None


expert_mix_op.register_autograd(_backward, setup_context=_setup_context)


def expert_mix_triton(x, experts, weights, down, up, act: str) -> torch.Tensor:
    """Same contract as :func:`zoo_kernels.retrieval.reference.expert_mix_reference` (``weights`` keeps
    its ``[M, H, k]`` shape in the gradient)."""
    M = x.shape[0]
    # contiguous here, once: the op saves what it is given, so its backward does not copy again
    x, down, up = x.contiguous(), down.contiguous(), up.contiguous()
    experts, weights = experts.reshape(M, -1).contiguous(), weights.reshape(M, -1).contiguous()  # [M, H·k]
    return expert_mix_op(x, experts, weights, down, up, act)
