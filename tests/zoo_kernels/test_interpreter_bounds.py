"""The bounds checker every kernel test runs under (``interpreter_bounds`` in tests/conftest.py), on planted
overruns: a store one row past the end, a read from a slice's gap, an atomic add past the end. Each is reported by
kernel, operation and argument, and withheld (the memory it would have touched keeps its value)."""

import pytest
import torch


def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def copy_rows(X, OUT, n, stride_x, width, EXTRA: tl.constexpr, BLOCK: tl.constexpr):
        """``OUT[i, :width] = X[i, :width]``; ``EXTRA`` widens both masks by that many columns (the planted bug)."""
        i = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        keep = cols < width + EXTRA
        row = tl.load(X + i * stride_x + cols, mask=keep, other=0.0)
        tl.store(OUT + i * width + cols, row, mask=keep & (i < n))

    @triton.jit
    def add_into(OUT, n, EXTRA: tl.constexpr, BLOCK: tl.constexpr):
        cols = tl.arange(0, BLOCK)
        tl.atomic_add(OUT + cols, tl.full((BLOCK,), 1.0, tl.float32), mask=cols < n + EXTRA)

    @triton.jit
    def count_kept(KEEP, OUT, n, BLOCK: tl.constexpr):
        cols = tl.arange(0, BLOCK)
        tl.store(OUT, tl.sum(tl.load(KEEP + cols, mask=cols < n, other=0).to(tl.int32)))

    return copy_rows, add_into, count_kept


def test_in_bounds_kernels_pass_and_compute_what_they_should(interpreter_bounds):
    copy_rows, add_into, count_kept = _kernels()
    big = torch.arange(12.0).reshape(3, 4)
    x = big[:, :3]  # a view with a gap of one element after each row
    out = torch.zeros(3, 3)
    copy_rows[(3,)](x, out, 3, x.stride(0), 3, EXTRA=0, BLOCK=4)
    add_into[(1,)](out, 5, EXTRA=0, BLOCK=8)
    want = x.clone()
    want.view(-1)[:5] += 1
    assert torch.equal(out, want)
    keep, count = torch.tensor([True, False, True, True, False]), torch.zeros((), dtype=torch.int32)
    count_kept[(1,)](keep, count, 5, BLOCK=8)  # a bool tensor (Triton reads it through a byte pointer)
    assert count.item() == 3
    assert interpreter_bounds.faults == []


def test_a_store_one_row_past_the_end_is_reported_and_withheld(interpreter_bounds):
    copy_rows, *_ = _kernels()
    buffer = torch.full((2, 3), -5.0)
    x, out = torch.ones(2, 3), buffer[0]  # out: one row of 3; the launch writes two (n = 2): row 1 is not out's
    copy_rows[(2,)](x, out, 2, 3, 3, EXTRA=0, BLOCK=4)
    faults = interpreter_bounds.take_faults()
    assert len(faults) == 1 and faults[0].startswith("copy_rows: store of 3 4-byte element(s) outside its tensors")
    assert "at byte 12 of `OUT` (3,)" in faults[0] and "its last element at byte 8" in faults[0]
    assert buffer[0].tolist() == [1.0] * 3 and buffer[1].tolist() == [-5.0] * 3  # the stray store never happened


def test_a_read_from_a_slices_gap_is_reported(interpreter_bounds):
    copy_rows, *_ = _kernels()
    x = torch.arange(12.0).reshape(3, 4)[:, :3]
    out = torch.zeros(3, 4)
    copy_rows[(3,)](x, out, 3, x.stride(0), 3, EXTRA=1, BLOCK=4)  # reads column 3: inside the storage, not x
    faults = interpreter_bounds.take_faults()
    loads = [f for f in faults if ": load of " in f]
    assert len(loads) == 3 and all(f.startswith("copy_rows: load of 1 4-byte") for f in loads), faults


def test_an_atomic_add_past_the_end_is_reported_and_withheld(interpreter_bounds):
    _, add_into, _ = _kernels()
    buffer = torch.zeros(8)
    add_into[(1,)](buffer[:5], 5, EXTRA=2, BLOCK=8)
    faults = interpreter_bounds.take_faults()
    assert faults == ["add_into: atomic of 2 4-byte element(s) outside its tensors, the first at byte 20 of `OUT` "
                      "(5,) (strides (1,), its last element at byte 16)"]
    assert buffer.tolist() == [1.0] * 5 + [0.0] * 3


def test_a_recorded_fault_fails_the_test_naming_it(interpreter_bounds):
    """What the fixture's teardown does with the faults: fail, quoting them."""
    interpreter_bounds.faults.append("k: store of 1 4-byte element(s) outside its tensors")
    with pytest.raises(pytest.fail.Exception, match="k: store of 1 4-byte"):
        interpreter_bounds.assert_clean()
    interpreter_bounds.take_faults()
