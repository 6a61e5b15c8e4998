"""Grouped matmul for mixtures of experts: consecutive runs of rows, each times its own matrix.

    y[r] = x[r] @ weight[e]      for the rows r of group e:  ends[e-1] <= r < ends[e]

``x [R, K]`` holds the rows sorted by group, ``weight [E, K, N]`` one matrix per group, ``ends [E]``
(int32) where each group's rows end (a cumulative count; empty groups repeat the previous end).

``grouped_matmul`` calls torch's fused ``F.grouped_mm`` (torch >= 2.9: CPU in fp32, bf16 or fp16, CUDA
in bf16 on SM >= 80), which reads the group sizes on the device: no host sync, one op however many
groups, so it traces under ``torch.compile(fullgraph=True)`` and CUDA graphs. Elsewhere (older
torch, fp64, fp32 on CUDA) it falls back to :func:`grouped_matmul_reference`, a loop of one matmul per
group that must read the sizes on the host (one sync).
"""

import torch
import torch.nn.functional as F

from zoo_kernels._backend import autocast_dtype, without_autocast


def grouped_matmul_reference(x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """The plain loop: ``[R, K] × [E, K, N] → [R, N]`` (one host sync to split ``x`` by group)."""
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])  # [E]
    sizes = (ends - starts).tolist()  # the host sync
    parts = x[: sum(sizes)].split(sizes)  # E × [m_e, K]
    return torch.cat([part @ w for part, w in zip(parts, weight.unbind(0))])  # [R, N]


# The fused op is wrapped as custom ops with their own shape functions: torch.compile then treats it
# as one opaque call (torch's own meta function for grouped_mm accepts only CUDA's bf16).
@torch.library.custom_op("hybrid_zoo::grouped_mm", mutates_args=())
def _grouped_mm(x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    return F.grouped_mm(x, weight, offs=ends)  # [R, K] × [E, K, N] → [R, N]


@_grouped_mm.register_fake
def _(x, weight, ends):
    return x.new_empty(x.shape[0], weight.shape[2])


@torch.library.custom_op("hybrid_zoo::grouped_mm_weight_grad", mutates_args=())
def _grouped_mm_weight_grad(x: torch.Tensor, grad: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    # 2-D × 2-D: the shared R dimension is split by ends, one [K, N] product per group.
    return F.grouped_mm(x.t(), grad, offs=ends)  # [K, R] × [R, N] → [E, K, N]


@_grouped_mm_weight_grad.register_fake
def _(x, grad, ends):
    return x.new_empty(ends.shape[0], x.shape[1], grad.shape[1])


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    # Written out because torch's own grouped_mm backward rejects a broadcast (stride-0) incoming
    # gradient, e.g. that of y.sum().
    x, weight, ends = ctx.saved_tensors
    grad = grad.contiguous()  # [R, N]
    grad_x = _grouped_mm(grad, weight.transpose(-2, -1), ends) if ctx.needs_input_grad[0] else None  # [R, K]
    grad_w = _grouped_mm_weight_grad(x, grad, ends) if ctx.needs_input_grad[1] else None  # [E, K, N]
    return grad_x, grad_w, None


_grouped_mm.register_autograd(_backward, setup_context=_setup_context)


def fused_available(x: torch.Tensor) -> bool:
    """Whether :func:`grouped_matmul` takes torch's fused op for ``x`` (see the module docstring)."""
    if not hasattr(F, "grouped_mm"):
        return False
    if x.device.type == "cpu":
        return x.dtype in (torch.float32, torch.bfloat16, torch.float16)
    return x.is_cuda and x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device)[0] >= 8


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """``x [R, K]`` (rows sorted by group) × ``weight [E, K, N]`` → ``[R, N]``; ``ends [E]`` int32,
    the cumulative row counts, ``ends[-1] == R``. Under autocast both operands take autocast's dtype,
    as a matmul's would."""
    if x.dim() != 2 or weight.dim() != 3 or x.shape[1] != weight.shape[1] or ends.shape != weight.shape[:1]:
        raise ValueError(f"grouped_matmul: need x [R, K], weight [E, K, N], ends [E]; got x {tuple(x.shape)}, "
                         f"weight {tuple(weight.shape)}, ends {tuple(ends.shape)}")
    device = x.device.type
    dtype = autocast_dtype(device) or x.dtype
    x, weight = x.to(dtype), weight.to(dtype)
    if not fused_available(x):
        return grouped_matmul_reference(x, weight, ends)
    # The fused op needs every row stride a multiple of 16 bytes: pad K and N with zeros to one.
    align = 16 // x.element_size()
    K, N = weight.shape[1:]
    pad_k, pad_n = -K % align, -N % align
    if pad_k or pad_n:
        x, weight = F.pad(x, (0, pad_k)), F.pad(weight, (0, pad_n, 0, pad_k))  # [R, K'], [E, K', N']
    with without_autocast(device):
        y = _grouped_mm(x.contiguous(), weight.contiguous(), ends.to(torch.int32))  # [R, N']
    return y[:, :N] if pad_n else y
