"""kernels.doctor: every kernel checked against its reference here (the interpreter at tiny shapes without a GPU);
a kernel that fails is refused by ``auto`` for the rest of the process, with a warning that names the check."""

from types import SimpleNamespace

import pytest
import torch

import kernels._backend
import kernels.attention.triton
from kernels import doctor
from kernels._backend import refuse_kernel, refused_kernels, resolve_backend


@pytest.fixture(autouse=True)
def nothing_refused(monkeypatch):
    monkeypatch.setattr(kernels._backend, "_REFUSED", {})


def test_every_kernel_passes_its_check_here(capsys):
    assert doctor.main(["--no-timing"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "kernel error" not in line]
    assert {row.split("|")[1].strip() for row in rows} == {"attention", "ssd_scan", "expert_mix"}
    assert len(rows) >= 8 and all(row.rstrip().endswith("| ok |") for row in rows)
    assert sum("| decode " in row for row in rows) == 2  # the decoding step's kernel, in both dtypes
    assert f"{len(rows)} of {len(rows)} checks passed" in out and not refused_kernels()
    assert doctor.ssd_tiles_here(torch.cuda.is_available()) in out
    if not torch.cuda.is_available():  # the interpreter's
        assert "SSD tiles here (P 64, N 128, float32): 16 rows, 4 warps, 1 stages; per-group C·Bᵀ, dB, dC " \
               "(shared_scores): off; states in the inputs' dtype (narrow_states): off; forward's states kept " \
               "(keep_states): off; grid order: chunks (per-group kernels: chunks)" in out


def test_the_doctor_names_the_ssd_switches_a_hopper_takes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    line = doctor.ssd_tiles_here(cuda=True)
    assert "64 rows, 4 warps, 2 stages" in line and "(shared_scores): on" in line and "(narrow_states): on" in line
    assert "grid order: heads (per-group kernels: chunks)" in line
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert "(shared_scores): off" in doctor.ssd_tiles_here(cuda=True)


def test_a_kernel_that_is_off_by_a_percent_fails_and_auto_refuses_it(monkeypatch, capsys):
    real = kernels.attention.triton.attention_triton
    monkeypatch.setattr(kernels.attention.triton, "attention_triton", lambda *a, **k: real(*a, **k) * 1.01)
    assert doctor.main(["--no-timing"]) == 1
    out = capsys.readouterr().out
    assert "| attention |" in out and "FAIL" in out and "the failed kernels are refused by 'auto' in this process" in out
    assert set(refused_kernels()) == {"attention"}  # the others passed
    gpu_tensor = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)  # what auto reads of a tensor
    if kernels._backend.triton_installed():
        with pytest.warns(UserWarning, match="attention: the Triton kernel failed its check"):
            assert resolve_backend("auto", gpu_tensor, op="attention", has_triton=True) == "reference"
        assert resolve_backend("auto", gpu_tensor, op="ssd_scan", has_triton=True) == "triton"


def test_refusal_is_per_op_and_triton_can_still_be_forced(monkeypatch):
    monkeypatch.setattr(kernels._backend, "triton_installed", lambda: True)
    refuse_kernel("ssd_scan", "a test")
    gpu_tensor = SimpleNamespace(is_cuda=True, dtype=torch.float32)
    with pytest.warns(UserWarning, match=r"ssd_scan: .*\(a test\)"):
        assert resolve_backend("auto", gpu_tensor, op="ssd_scan", has_triton=True) == "reference"
    assert resolve_backend("triton", gpu_tensor, op="ssd_scan", has_triton=True) == "triton"
    assert resolve_backend("auto", gpu_tensor, op="attention", has_triton=True) == "triton"


class _OneGradientElementOff(torch.autograd.Function):
    """``x * y`` whose gradient for ``y`` is 3% off in one element: a kernel wrong in one place of one result."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        dy = grad * x
        dy[3] = dy[3] * 1.03
        return grad * y, dy


def test_the_check_fails_a_kernel_wrong_in_one_element_of_one_gradient_and_names_that_gradient():
    def fn(backend, x, y):
        return x * y if backend == "reference" else _OneGradientElementOff.apply(x, y)

    inputs = {"x": torch.randn(16, generator=torch.Generator().manual_seed(0)) + 3, "y": torch.randn(16)}
    bad = doctor.check("mul", "16", fn, inputs, torch.float32)
    assert not bad.ok and bad.worst == "y" and bad.kernel_error > 1e-3 > 1e-6 > bad.reference_error
    good = doctor.check("mul", "16", lambda backend, x, y: x * y, inputs, torch.float32)
    assert good.ok and good.kernel_error == good.reference_error


def test_tf32_is_the_precision_the_doctor_checks_under_and_says(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "run", lambda timing: print(f"fp32 dots: {kernels._backend.dot_precision()}") or [])
    before = torch.get_float32_matmul_precision()
    try:
        assert doctor.main(["--tf32", "--no-timing"]) == 0
        assert "fp32 dots: tf32" in capsys.readouterr().out
    finally:
        torch.set_float32_matmul_precision(before)
