"""``kernels._finite.split_finite`` against ``torch.isfinite``: every kind of non-finite entry, and the finite
ones that look like them (-0.0, the largest float), at each reduction depth."""

import pytest
import torch

from kernels import _finite as finite
from kernels._finite import split_finite


def tricky(dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(3, 5, 4, 6, dtype=dtype)
    big = torch.finfo(dtype).max
    x[0, 1, 2, 3], x[1, 4, 0, 0], x[2, 0, 3, 5] = float("nan"), float("inf"), float("-inf")
    x[0, 0, 0, 0], x[1, 1, 1, 1], x[2, 2, 2, 2] = -0.0, big, -big
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("dims", [0, 1, 2])
def test_split_finite_cleans_and_marks_exactly_the_non_finite_entries(dtype, dims):
    x = tricky(dtype)
    clean, bad = split_finite(x, dims)
    ok = torch.isfinite(x)
    want = ~ok if dims == 0 else ~ok.flatten(-dims).all(-1)
    assert bad.dtype == torch.bool and torch.equal(bad, want)
    assert torch.equal(clean, torch.where(ok, x, torch.zeros_like(x)))
    assert torch.equal(clean.signbit(), x.signbit() & ok)  # -0.0 stays -0.0: a finite entry is kept bit for bit
    assert bad.sum() == 3  # the three non-finite entries lie in different rows at every depth


@pytest.mark.parametrize("contiguous", [True, False])
def test_split_finite_reads_eight_flags_to_a_word_exactly(contiguous):
    """Rows of 64 and 16 entries take the word-wise reduction; a non-finite entry at each byte of a word is found, and
    a transposed (non-contiguous) input takes the plain one with the same answer."""
    x = torch.randn(9, 64) if contiguous else torch.randn(64, 9).t()
    for row, col in enumerate(range(0, 64, 8)):  # row r: a NaN at byte r of its r-th word
        x[row, col + row % 8] = float("nan") if row % 2 else float("-inf")
    clean, bad = split_finite(x, 1)
    assert torch.equal(bad, ~torch.isfinite(x).all(-1)) and bad[:8].all() and not bad[8]
    _, bad2 = split_finite(x.reshape(9, 4, 16), 1)
    assert torch.equal(bad2, ~torch.isfinite(x.reshape(9, 4, 16)).all(-1))


def test_split_finite_passes_the_gradient_of_the_finite_entries_only():
    x = tricky(torch.float64).requires_grad_()
    clean, _ = split_finite(x, 1)
    (clean * 2).sum().backward()
    assert torch.equal(x.grad, torch.where(torch.isfinite(x.detach()), 2.0, 0.0).to(x.dtype))


def _seen_by_loop(bad, starts):
    """The definition, position by position: some bad entry at or after the document's start and at or before t."""
    seen = torch.zeros_like(bad)
    for b in range(bad.shape[0]):
        begin = 0
        for t in range(bad.shape[1]):
            if starts is not None and starts[b, t]:
                begin = t
            seen[b, t] = bad[b, begin:t + 1].any(0)
    return seen


@pytest.mark.parametrize("with_documents", [False, True])
@pytest.mark.parametrize("shape", [(3, 0), (2, 0, 5), (3, 1), (3, 29), (2, 29, 5), (2, 17, 3, 4)])
def test_seen_so_far_is_any_bad_entry_earlier_in_the_document(shape, with_documents):
    generator = torch.Generator().manual_seed(sum(shape))
    bad = torch.rand(shape, generator=generator) < 0.08
    bad[0] = False  # a row with none
    starts = (torch.rand(shape[:2], generator=generator) < 0.2) if with_documents else None
    if starts is not None and shape[1]:
        starts[-1, 0] = True
    got = finite.seen_so_far(bad, starts)
    assert got.dtype == torch.bool and got.shape == bad.shape
    assert torch.equal(got, _seen_by_loop(bad, starts))
