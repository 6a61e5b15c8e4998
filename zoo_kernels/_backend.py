"""Backend selection shared by every op: ``auto`` | ``reference`` | ``triton``."""

import contextlib
import importlib.util
import os
import warnings

import torch

BACKENDS = ("auto", "reference", "triton")
# The Triton kernels load these and accumulate in fp32; float64 (gradcheck) and integer inputs take the reference.
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# Looked up once, here, without importing triton: inside a compiled region (a compiled decoding step on CUDA) torch 2.11's
# dynamo refuses to trace importlib's find_spec and broke the graph at every attention call, so the step was no CUDA graph.
_TRITON_FOUND = importlib.util.find_spec("triton") is not None

_REFUSED: dict[str, str] = {}  # op → why its kernel failed a check in this process (zoo_kernels.doctor)


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype an enabled autocast region gives matmuls on ``device_type``, or None: outside one, and on a
    device without autocast (``meta``, where shapes are inferred, has none and torch's query raises)."""
    if not torch.amp.autocast_mode.is_autocast_available(device_type) or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def without_autocast(device_type: str) -> contextlib.AbstractContextManager:
    """A region where autocast is off on ``device_type`` (nothing to turn off on a device without it)."""
    if torch.amp.autocast_mode.is_autocast_available(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()


def refuse_kernel(op: str, reason: str) -> None:
    """Keep ``auto`` off ``op``'s Triton kernel for the rest of this process: it failed a check here."""
    _REFUSED[op] = reason


def refused_kernels() -> dict[str, str]:
    """The ops whose kernels :func:`refuse_kernel` took out of ``auto``, with the reasons."""
    return dict(_REFUSED)


def check_backend(backend: str, owner: str) -> None:
    """Refuse a ``backend`` that is not one of :data:`BACKENDS`, naming ``owner`` (the module or op given it)."""
    if backend not in BACKENDS:
        raise ValueError(f"{owner}: backend={backend!r} is not one of {BACKENDS}")


def triton_installed() -> bool:
    """Whether the ``triton`` package can be imported (CUDA builds of torch bring it; ``pip install
    "hybrid-zoo[gpu]"`` otherwise), looked up once when this module is imported, without importing it."""
    return _TRITON_FOUND


def resolve_backend(backend: str, tensor: torch.Tensor, *, op: str, has_triton: bool) -> str:
    """Pick the concrete backend for ``op``. ``auto`` takes Triton on CUDA tensors of a kernel dtype
    (fp16, bf16, fp32) when the op has a Triton kernel and Triton is installed, the plain-torch
    reference otherwise (float64 included: the kernels compute in fp32)."""
    check_backend(backend, op)
    if backend == "triton" and tensor.dtype not in KERNEL_DTYPES:
        raise ValueError(f"{op}: the Triton kernel takes fp16, bf16 or fp32 and accumulates in fp32; got {tensor.dtype}: "
                         "use backend='reference' (or 'auto', which sends it there)")
    has_triton = has_triton and tensor.dtype in KERNEL_DTYPES
    if backend == "auto":
        if has_triton and tensor.is_cuda and not triton_installed():
            warnings.warn(f"{op}: triton is not installed, so the plain-torch reference runs on CUDA (slower, more "
                          "memory); pip install \"hybrid-zoo[gpu]\" (or triton) for the kernels", stacklevel=3)
            return "reference"
        if has_triton and tensor.is_cuda and op in _REFUSED:
            warnings.warn(f"{op}: the Triton kernel failed its check on this machine ({_REFUSED[op]}), so 'auto' takes "
                          "the plain-torch reference; backend='triton' still forces the kernel", stacklevel=3)
            return "reference"
        return "triton" if (has_triton and tensor.is_cuda) else "reference"
    if backend == "triton" and not triton_installed():
        raise ImportError(f"{op}: backend='triton' needs the triton package: pip install \"hybrid-zoo[gpu]\" (or triton)")
    if backend == "triton" and not has_triton:
        raise NotImplementedError(
            f"{op}: backend='triton' has no kernel yet; use backend='reference' or 'auto'"
        )
    if backend == "triton" and not tensor.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            f"{op}: backend='triton' needs CUDA tensors (got {tensor.device}); on a CPU, set TRITON_INTERPRET=1 "
            "before importing triton to run the kernel in Triton's interpreter (slow: for tests)"
        )
    return backend


def dot_precision() -> str:
    """How the kernels' ``tl.dot`` multiplies fp32 tiles, following torch's own fp32 matmuls: ``"ieee"``
    (full fp32) under ``torch.get_float32_matmul_precision() == "highest"``, torch's default, and
    ``"tf32"`` after ``torch.set_float32_matmul_precision("high")`` (or ``"medium"``), as for
    ``torch.matmul``. bf16/fp16 tiles are multiplied as they are either way; the fp32 dots that remain
    for them (the SSD's state read-outs) follow the same setting."""
    return "ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def gpu_arch(t: torch.Tensor) -> int:
    """The compute capability × 10 of ``t``'s GPU (90 for an H100), which the kernels' launch tables key on; 90 off
    CUDA, where the tables are read only to check or compile the CUDA launch."""
    if not t.is_cuda:
        return 90
    major, minor = torch.cuda.get_device_capability(t.device)
    return 10 * major + minor


def unit_stride_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when its last dimension is contiguous (the kernels take any other strides: a view of a wider
    projection is read in place), else a contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()
