"""Non-finite inputs and causality: a NaN or inf at position t must reach the outputs at t and after (in its
document), and never those before it.

The fast forms of attention and of the SSD scan mask the future by multiplying it by zero (a probability of 0,
a decay of exp(-inf)) inside matrix products, and 0 · NaN is NaN: a NaN at t would spread to every earlier
position of its chunk or row. So the ops take the non-finite entries out of their inputs (set to 0), compute,
and put NaN back where the exact computation has it: at every output that depends on a non-finite input. No
host sync: with finite inputs the result is bit-for-bit the plain one.
"""

import torch


class _TakeOut(torch.autograd.Function):
    """``x`` with its non-finite entries set to 0, whose backward passes the gradient through unchanged.

    Every caller puts NaN back at each output a non-finite entry reaches (``poison``), and ``poison``'s backward
    zeroes the gradient there, so the gradient that arrives at a non-finite entry is zero already (a sum of
    products of zeros with finite values). ``nan_to_num``'s own backward multiplies by ``isfinite(x)`` again: on a
    GPU that is five passes over the input (``==``, ``abs``, ``!=``, two multiplies) for nothing, as large as the
    SSD's ``x`` is; tests/zoo_kernels/test_finite.py checks the zeros on both ops and both backends."""

    generate_vmap_rule = True  # torch.func (vmap, per-example gradients) goes through it as through nan_to_num

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)  # = where(isfinite(x), x, 0), in one op

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def split_finite(x: torch.Tensor, dims: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x with its non-finite entries set to 0, True where any of its last dims dimensions held one)``.

    The gradient passes through to ``x`` unchanged (``_TakeOut``): the caller must ``poison`` every output that a
    non-finite entry reaches."""
    clean = _TakeOut.apply(x)
    # exactly the entries nan_to_num changed (NaN != 0 and inf != 0; a finite entry, -0.0 included, is kept as is);
    # on a CPU, torch.isfinite runs as several ops and this pair costs a third to a half of it
    bad = clean != x
    if not dims:
        return clean, bad
    bad = bad.flatten(-dims)  # [..., n]
    if bad.shape[-1] % 8 == 0 and bad.is_contiguous() and not _traced(bad):
        # eight flags to a 64-bit word: the same bytes, an eighth of the elements to reduce (an SSD input [1, 4096, 32,
        # 64]: 15.2 → 2.4 ms on one CPU thread; on a GPU the boolean any was half the finite passes' time at T 16384)
        return clean, bad.view(torch.int64).any(-1)
    return clean, bad.any(-1)


def _traced(t: torch.Tensor) -> bool:
    """Whether ``t`` is traced by torch.compile or wrapped by torch.func's transforms (vmap, grad), where
    ``split_finite`` takes no dtype view. Compiled, Inductor fuses the comparison into the ``any`` (no flags are
    written to be read back), and on CUDA it cannot lower a bool tensor's dtype view at all (torch 2.11: ``torch.iinfo``
    of ``torch.bool`` in its lowering; a compiled generation failed on an H200, 2026-12-04). Under torch.func, torch
    2.11 has no vmap rule for one (2.13 has). The compile check comes first: torch.compile cannot trace the other."""
    return torch.compiler.is_compiling() or torch._C._functorch.is_functorch_wrapped_tensor(t)


def run_starts(starts: torch.Tensor) -> torch.Tensor:
    """``starts [B, T]`` bool (True where a document begins) → ``[B, T]`` the index where each position's document begins."""
    T = starts.shape[1]
    index = torch.arange(T, device=starts.device).expand_as(starts)  # [B, T]
    opened = starts.clone()
    opened[:, 0] = True
    return torch.where(opened, index, torch.zeros_like(index)).cummax(dim=1).values


def seen_so_far(bad: torch.Tensor, starts: torch.Tensor | None = None) -> torch.Tensor:
    """``bad [B, T, ...]`` → True at ``t`` where ``bad`` holds at some ``s <= t`` of the same document
    (``starts [B, T]``: True where a document begins; None: one document per row).

    No running sum along ``T``: ``T`` is an outer dimension here, and torch's CUDA scan over an outer dimension is
    slow (a cumulative sum over ``[4, 4096, 32]``, in int64 as torch promotes an int32 sum, took 0.78 ms on an H100:
    38% of the SSD's forward). Without documents the first bad position is a reduction; with them, the latest bad
    position at or before each ``t`` is a running maximum over the innermost dimension."""
    T = bad.shape[1]
    if T == 0 or (starts is None and T == 1):
        return bad  # no position, or one with nothing before it (a decoding step); amin refuses an empty dimension
    index = torch.arange(T, device=bad.device, dtype=torch.int32).view(1, T, *(1,) * (bad.dim() - 2))  # [1, T, 1…]
    if starts is None:
        first_bad = torch.where(bad, index, T).amin(dim=1, keepdim=True)  # [B, 1, ...]; T where none
        return index >= first_bad
    last_bad = torch.where(bad, index, -1).movedim(1, -1).cummax(dim=-1).values.movedim(-1, 1)  # [B, T, ...]; -1: none
    first = run_starts(starts).to(torch.int32).view(*starts.shape, *(1,) * (bad.dim() - 2))  # its document's start
    return last_bad >= first


class _Poison(torch.autograd.Function):
    """``y`` with NaN at ``where`` (broadcast over ``y``'s trailing dimensions); the gradient is zero there.

    The forward multiplies by a ``[..., 1, ...]`` factor of 1 or NaN (times 1 is exact, for every value): one
    broadcast product, where an out-of-place ``masked_fill`` is a copy and a broadcast fill. The backward selects
    zeros with ``torch.where``, not a product by 0, so a NaN or inf arriving at a poisoned output (from a loss
    computed on it) still leaves exactly zero. On this CPU, a [2, 2048, 8, 64] fp32 output in interleaved rounds:
    forward 0.76-0.86 against ``masked_fill``'s 1.48-1.66 ms, forward+backward 1.77-1.99 against 3.19-4.05 ms."""

    generate_vmap_rule = True

    @staticmethod
    def forward(y: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        return y * torch.where(where, float("nan"), 1.0).to(y.dtype)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[1])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (where,) = ctx.saved_tensors
        return torch.where(where, 0.0, grad), None


def poison(y: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """``y [B, T, H, ...]`` with NaN at the positions ``where [B, T, H]`` is True (its gradient zero there)."""
    return _Poison.apply(y, where.view(*where.shape, *(1,) * (y.dim() - where.dim())))


def any_in_document(bad: torch.Tensor, starts: torch.Tensor | None = None) -> torch.Tensor:
    """``bad [B, T, ...]`` → True at ``t`` where ``bad`` holds anywhere in ``t``'s document (non-causal reach)."""
    if starts is None:
        return bad.any(dim=1, keepdim=True).expand_as(bad)
    run = starts.to(torch.int64).cumsum(dim=1)  # [B, T]: the document's number in its row
    run = run.view(*run.shape, *(1,) * (bad.dim() - 2)).expand_as(bad)
    totals = torch.zeros_like(bad, dtype=torch.int32).scatter_add(1, run, bad.to(torch.int32))
    return totals.gather(1, run) > 0
