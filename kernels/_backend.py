"""Backend selection shared by every op: ``auto`` | ``reference`` | ``triton``."""

import os

import torch

BACKENDS = ("auto", "reference", "triton")


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")


def resolve_backend(backend: str, tensor: torch.Tensor, *, op: str, has_triton: bool) -> str:
    """Pick the concrete backend for ``op``. ``auto`` takes Triton on CUDA tensors when the op has a
    Triton kernel, the plain-torch reference otherwise."""
    check_backend(backend)
    if backend == "auto":
        return "triton" if (has_triton and tensor.is_cuda) else "reference"
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
