"""``ssd_scan``: the Mamba-2 SSD scan (chunked), and ``ssd_step`` for decoding. See README.md."""

import torch

from zoo_kernels._backend import KERNEL_DTYPES, check_backend, resolve_backend, without_autocast
from zoo_kernels._finite import poison, seen_so_far, split_finite
from zoo_kernels.ssd.reference import segment_sum, ssd_chunked, ssd_recurrent, ssd_step

__all__ = ["REFERENCE_CHUNK", "segment_sum", "ssd_chunked", "ssd_recurrent", "ssd_scan", "ssd_step"]

REFERENCE_CHUNK = 64
"""The longest chunk the plain-torch path takes, whatever ``chunk_size`` says. The chunked form's result does not
depend on the chunk length (up to rounding), but its cost does: its ``[L, L]`` decay matrices per head make a
chunk of 256 (Mamba-2's default, sized for GPU kernels) 3-6× slower on a CPU than chunks of 64, and shorter ones
pay for the recurrence over more chunks (measured: README.md)."""


def ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    chunk_size: int = 64,
    D: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
    document_starts: torch.Tensor | None = None,
    backend: str = "auto",
    check_finite: bool = True,
):
    """The SSD scan, with the arguments of mamba_ssm's ``mamba_chunk_scan_combined`` (``dt`` already
    positive: apply the bias and softplus before).

    Args:
        x: ``[B, T, H, P]`` inputs.
        dt: ``[B, T, H]`` step sizes, > 0.
        A: ``[H]`` decay rates, < 0 (``-exp(A_log)``).
        B, C: ``[B, T, G, N]`` input and output projections; ``H`` must be a multiple of ``G``.
        chunk_size: positions per chunk (default 64); any ``T`` is accepted. The Triton kernel takes it as given;
            the plain-torch path takes at most ``REFERENCE_CHUNK`` (64): the same result, cheaper.
        D: ``[H]`` skip connection ``y += D · x``, or None.
        initial_state: ``[B, H, P, N]`` state before the first position, or None (zeros).
        return_final_state: also return the state after the last position.
        document_starts: ``[B, T]`` bool, True where a packed document begins: the state is reset
            there (mamba_ssm's ``seq_idx``). Both backends take it.
        backend: ``auto`` (Triton on CUDA tensors in fp32/bf16/fp16, the reference otherwise) |
            ``reference`` | ``triton``.
        check_finite: take non-finite entries of x, dt, B, C out and put their reach back as NaN (default
            True), so a NaN or inf reaches only the outputs after it, as in the recurrence (the chunked form's
            masked products would send 0 · NaN to the past). It costs a pass over the inputs, which also copies
            views; False skips it for inputs known to be finite: the Triton kernels then read views of one
            projection in place.

    Returns:
        ``y [B, T, H, P]``, or ``(y, final_state [B, H, P, N])`` with ``return_final_state``.
    """
    check_backend(backend, "ssd_scan")
    _check_arguments(x, dt, A, B, C, chunk_size, D, initial_state)
    if document_starts is not None:
        if tuple(document_starts.shape) != tuple(x.shape[:2]) or document_starts.dtype != torch.bool:
            raise ValueError(f"ssd_scan: document_starts must be a bool [B, T] = {tuple(x.shape[:2])}; got "
                             f"{document_starts.dtype} {tuple(document_starts.shape)}")
        if document_starts.device != x.device:
            raise ValueError(f"ssd_scan: document_starts is on {document_starts.device} and x on {x.device}: "
                             "put them on one device")
    kernel_dtype = x.dtype in KERNEL_DTYPES and B.dtype in KERNEL_DTYPES and C.dtype in KERNEL_DTYPES
    if backend == "triton" and not kernel_dtype:
        raise ValueError(
            f"ssd_scan: backend='triton' takes x, B, C in {KERNEL_DTYPES}; got x {x.dtype}, B {B.dtype}, C {C.dtype}"
        )
    if x.shape[1] == 0:  # an empty sequence: no output, and the state passes through unchanged
        batch, _, H, P = x.shape
        final_state = initial_state if initial_state is not None else x.new_zeros(batch, H, P, B.shape[-1])
        y = x.new_zeros(x.shape)
        return (y, final_state) if return_final_state else y
    # Non-finite inputs are taken out and their reach put back as NaN (zoo_kernels/_finite.py): the chunked form
    # masks the future with decays of exp(-inf) = 0 inside matrix products, and 0 · NaN would reach the past.
    if check_finite:
        x, dt, B, C, reach, last = _take_out_nonfinite(x, dt, B, C, document_starts)  # reach [B, T, H], last [B, H]
    # auto: the Triton kernel on CUDA for the dtypes it has; float64 (gradcheck) stays on the reference
    if resolve_backend(backend, x, op="ssd_scan", has_triton=kernel_dtype) == "triton":
        from zoo_kernels.ssd.triton import ssd_scan_triton  # imports triton only when asked for

        y, final_state = ssd_scan_triton(x, dt, A, B, C, chunk_size=chunk_size, D=D, initial_state=initial_state,
                                         document_starts=document_starts)
    else:
        # The reference computes in at least fp32 whatever the inputs and any autocast region say: the
        # decays are exponentials of long sums, which bf16 cannot hold. The output comes back in x's dtype.
        with without_autocast(x.device.type):
            up = lambda t: None if t is None else t.to(torch.promote_types(t.dtype, torch.float32))  # noqa: E731
            chunk = min(chunk_size, REFERENCE_CHUNK)  # the same result as chunk_size's, cheaper
            y, final_state = ssd_chunked(
                up(x), up(dt), up(A), up(B), up(C), chunk_size=chunk, D=up(D), initial_state=up(initial_state),
                document_starts=document_starts,
            )
        y = y.to(x.dtype)
    if check_finite:
        y, final_state = poison(y, reach), poison(final_state, last)
    return (y, final_state) if return_final_state else y


def _take_out_nonfinite(x, dt, B, C, document_starts):
    """The inputs with non-finite entries set to 0, and where those entries reach: ``[B, T, H]`` outputs (x, dt
    and B enter the state, so from their position to the end of the document; C only reads it, at its own
    position) and ``[B, H]`` final states."""
    heads_per_group = x.shape[2] // B.shape[2]
    (x, bad_x), (dt, bad_dt), (B, bad_B), (C, bad_C) = split_finite(x, 1), split_finite(dt, 0), split_finite(B, 1), split_finite(C, 1)
    state = seen_so_far(bad_x | bad_dt | bad_B.repeat_interleave(heads_per_group, dim=2), document_starts)  # [B, T, H]
    return x, dt, B, C, state | bad_C.repeat_interleave(heads_per_group, dim=2), state[:, -1]


def _check_arguments(x, dt, A, B, C, chunk_size, D, initial_state) -> None:
    if x.dim() != 4:
        raise ValueError(f"ssd_scan: x must be [B, T, H, P]; got shape {tuple(x.shape)}")
    batch, T, H, P = x.shape
    if tuple(dt.shape) != (batch, T, H):
        raise ValueError(f"ssd_scan: dt must be [B, T, H] = {(batch, T, H)}; got {tuple(dt.shape)}")
    if tuple(A.shape) != (H,):
        raise ValueError(f"ssd_scan: A must be [H] = {(H,)}; got {tuple(A.shape)}")
    if B.dim() != 4 or B.shape != C.shape or B.shape[:2] != (batch, T):
        raise ValueError(
            f"ssd_scan: B and C must both be [B, T, G, N] with B={batch}, T={T}; got B{tuple(B.shape)} C{tuple(C.shape)}"
        )
    G, N = B.shape[2], B.shape[3]
    if H % G != 0:
        raise ValueError(f"ssd_scan: heads H={H} are not a multiple of groups G={G}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"ssd_scan: chunk_size={chunk_size!r} must be a positive integer")
    if D is not None and tuple(D.shape) != (H,):
        raise ValueError(f"ssd_scan: D must be [H] = {(H,)}; got {tuple(D.shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (batch, H, P, N):
        raise ValueError(
            f"ssd_scan: initial_state must be [B, H, P, N] = {(batch, H, P, N)}; got {tuple(initial_state.shape)}"
        )
