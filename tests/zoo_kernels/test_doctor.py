"""zoo_kernels.doctor: every kernel checked against its reference here (the interpreter at tiny shapes without a GPU);
a kernel that fails is refused by ``auto`` for the rest of the process, with a warning that names the check."""

from types import SimpleNamespace

import pytest
import torch

import zoo_kernels._backend
import zoo_kernels.attention.triton
from zoo_kernels import doctor
from zoo_kernels._backend import refuse_kernel, refused_kernels, resolve_backend


@pytest.fixture(autouse=True)
def nothing_refused(monkeypatch):
    monkeypatch.setattr(zoo_kernels._backend, "_REFUSED", {})


def test_every_kernel_passes_its_check_here(capsys):
    assert doctor.main(["--no-timing"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "kernel error" not in line]
    assert {row.split("|")[1].strip() for row in rows} == {"attention", "ssd_scan", "gated_delta_rule", "expert_mix"}
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
    assert "(keep_states): on" in line
    assert "grid order: heads (y: blocks, dx: blocks, per-group kernels: blocks)" in line
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert "(shared_scores): off" in doctor.ssd_tiles_here(cuda=True)


def test_a_kernel_that_is_off_by_a_percent_fails_and_auto_refuses_it(monkeypatch, capsys):
    real = zoo_kernels.attention.triton.attention_triton
    monkeypatch.setattr(zoo_kernels.attention.triton, "attention_triton", lambda *a, **k: real(*a, **k) * 1.01)
    assert doctor.main(["--no-timing"]) == 1
    out = capsys.readouterr().out
    assert "| attention |" in out and "FAIL" in out and "the failed kernels are refused by 'auto' in this process" in out
    assert set(refused_kernels()) == {"attention"}  # the others passed
    gpu_tensor = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)  # what auto reads of a tensor
    if zoo_kernels._backend.triton_installed():
        with pytest.warns(UserWarning, match="attention: the Triton kernel failed its check"):
            assert resolve_backend("auto", gpu_tensor, op="attention", has_triton=True) == "reference"
        assert resolve_backend("auto", gpu_tensor, op="ssd_scan", has_triton=True) == "triton"


def test_refusal_is_per_op_and_triton_can_still_be_forced(monkeypatch):
    monkeypatch.setattr(zoo_kernels._backend, "triton_installed", lambda: True)
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
    monkeypatch.setattr(doctor, "run", lambda timing: print(f"fp32 dots: {zoo_kernels._backend.dot_precision()}") or [])
    before = torch.get_float32_matmul_precision()
    try:
        assert doctor.main(["--tf32", "--no-timing"]) == 0
        assert "fp32 dots: tf32" in capsys.readouterr().out
    finally:
        torch.set_float32_matmul_precision(before)


def test_the_attention_cases_check_what_the_recipes_use_causal_bias_padding_and_a_decode_window(monkeypatch):
    """The checks are only as good as their inputs: causal attention with a bias and a left-padded first row (the
    others unpadded), and a decoding step that also keeps a window."""
    import zoo_kernels.attention

    calls = []
    monkeypatch.setattr(zoo_kernels.attention, "attention", lambda **kw: calls.append(kw))
    for make in (doctor.attention_case, doctor.attention_decode_case):
        _, fn, inputs = make(False, 16, "cpu")
        fn(backend="reference", **inputs)
        kw = calls[-1]
        mask, length = kw["key_padding_mask"], kw["k"].shape[1]
        assert kw["causal"] is True and kw["bias"] is inputs["bias"] and kw["backend"] == "reference"
        assert mask[0].tolist() == [True] * (length // 5) + [False] * (length - length // 5) and not mask[1:].any()
    assert calls[0].get("keep_window") is None and calls[1]["keep_window"] == calls[1]["k"].shape[1] // 4


def test_a_case_may_pass_arguments_that_are_not_tensors():
    inputs = {"x": torch.randn(8, generator=torch.Generator().manual_seed(0)), "times": 3, "mask": torch.ones(8) > 0}
    result = doctor.check("scale", "8", lambda backend, x, times, mask: x * times * mask, inputs, torch.float32)
    assert result.ok and result.worst in ("out", "x") and result.kernel_error == result.reference_error


def _stand_in_cases():
    """One attention case, its decoding step and one SSD case, as the doctor lists them, each a cheap product."""
    seen = []

    def fn(backend, **a):
        seen.append(backend)
        return sum(v.float().sum() for v in a.values() if v.is_floating_point()) * a["q" if "q" in a else "x"]

    qkv = {n: torch.randn(1, 5, 2, 4) for n in ("q", "k", "v")}
    ssd = {"x": torch.randn(1, 5, 2, 4), "dt": torch.rand(1, 5, 2), "A": -torch.rand(2), "B": torch.randn(1, 5, 1, 4),
           "C": torch.randn(1, 5, 1, 4), "D": torch.randn(2)}
    delta = {**qkv, "g": -torch.rand(1, 5, 2), "beta": torch.rand(1, 5, 2)}
    return seen, [("attention", "B1 T5", fn, qkv), ("attention", "decode B1 S5", fn, qkv),
                  ("ssd_scan", "B1 T5 chunk 8", fn, ssd), ("gated_delta_rule", "B1 T5 chunk 8", fn, delta)]


def test_the_timing_table_times_each_kernel_its_reference_sdpa_and_mamba_ssm_on_the_same_inputs(monkeypatch):
    """What a GPU's timing table holds (run here with CUDA's synchronize a no-op): forward + backward of the Triton
    kernel and the reference per case, torch's causal SDPA beside attention, ``mamba_chunk_scan_combined`` beside
    the SSD (a stand-in module) at chunk 64 with fp32 ``A``; the decoding step is left to the ops benchmark."""
    import sys
    import types

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    seen, stand_in = _stand_in_cases()
    sdpa_calls, mamba_calls = [], []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, **kw: sdpa_calls.append(kw) or real_sdpa(q, k, v, **kw))

    def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size):
        mamba_calls.append((A.dtype, chunk_size, x.dtype))
        return x * dt[..., None]

    path = "mamba_ssm.ops.triton.ssd_combined"
    for i, name in enumerate(path.split(".")):
        monkeypatch.setitem(sys.modules, ".".join(path.split(".")[:i + 1]), types.ModuleType(name))
    sys.modules[path].mamba_chunk_scan_combined = mamba_chunk_scan_combined

    def chunk_gated_delta_rule(q, k, v, g, beta):
        fla_calls.append((q.dtype, g.dtype))
        return q * beta[..., None], None

    fla_calls, path = [], "fla.ops.gated_delta_rule"
    for i, name in enumerate(path.split(".")):
        monkeypatch.setitem(sys.modules, ".".join(path.split(".")[:i + 1]), types.ModuleType(name))
    sys.modules[path].chunk_gated_delta_rule = chunk_gated_delta_rule
    rows = doctor.timings(stand_in, torch.float64)
    assert [row[:3] for row in rows] == [
        ("attention", "B1 T5", "triton"), ("attention", "B1 T5", "reference"),
        ("attention", "B1 T5", "torch SDPA (no bias)"), ("ssd_scan", "B1 T5 chunk 8", "triton"),
        ("ssd_scan", "B1 T5 chunk 8", "reference"), ("ssd_scan", "B1 T5 chunk 8", "mamba_ssm"),
        ("gated_delta_rule", "B1 T5 chunk 8", "triton"), ("gated_delta_rule", "B1 T5 chunk 8", "reference"),
        ("gated_delta_rule", "B1 T5 chunk 8", "flash-linear-attention")]
    assert all(isinstance(row[3], float) and row[3] > 0 for row in rows)
    assert seen == (["triton"] * 11 + ["reference"] * 11) * 3  # a warm-up, 10 timed
    assert sdpa_calls and all(kw == {"is_causal": True, "enable_gqa": True} for kw in sdpa_calls)
    assert mamba_calls and set(mamba_calls) == {(torch.float32, 64, torch.float64)}
    assert fla_calls and set(fla_calls) == {(torch.float64, torch.float32)}  # the log-decays fp32, as a model gives


def test_the_backward_is_in_what_is_timed():
    x = torch.randn(3, requires_grad=True)
    step = doctor.forward_backward(lambda backend=None, x=None: (x * 2).sum(), {"x": x})
    step()
    assert x.grad is None  # the timed copy's leaves are its own
    leaves = []
    doctor.forward_backward(lambda x: leaves.append(x) or x * 2, {"x": x})()
    assert leaves[0].grad.tolist() == [2.0, 2.0, 2.0]


def test_without_a_gpu_the_doctor_says_it_times_nothing(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # on a GPU machine too
    monkeypatch.setattr(doctor, "cases", lambda cuda, device: [("mul", "8", lambda backend, x: x * 2,
                                                                {"x": torch.randn(8)})])
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert "timing: none without a GPU" in out and "forward + backward ms" not in out
    assert "2 of 2 checks passed" in out and "torch's fused SDPA instead for one query" not in out
    monkeypatch.setattr(doctor, "auto_backends", lambda device: {"attention": "triton", "ssd_scan": "reference"})
    assert doctor.main(["--no-timing"]) == 0
    out = capsys.readouterr().out
    assert "backend 'auto' here: attention → triton, ssd_scan → reference" in out
    assert "(attention: torch's fused SDPA instead for one query, for no bias" in out


def test_the_doctor_gives_each_op_the_dtypes_a_model_gives_it_under_mixed_precision(monkeypatch):
    """The doctor checks each kernel at the dtypes a model calls it with under mixed precision: activations in the
    half dtype, what a model makes from fp32 parameters in fp32 (``KEPT_FP32``). A hybrid with each op (the SSD with
    D; Doge's attention with its bias; CDMoE) runs forward and back under fp16 autocast, every call of the three ops
    recorded with its floating arguments' dtypes: those in fp32 are each op's ``KEPT_FP32``, the others fp16."""
    import inspect
    from functools import partial

    import components.context
    import components.sequence.gated_deltanet
    import components.sequence.ssd
    import components.state.cdmoe
    from components import CDMoE, SSD, GatedDeltaNet, HybridLM, InnerFuncAttention

    calls: dict[str, list[dict]] = {}
    for module, name in ((components.sequence.ssd, "ssd_scan"), (components.context, "attention"),
                         (components.state.cdmoe, "expert_mix"), (components.sequence.gated_deltanet, "gated_delta_rule")):
        def recording(*args, _fn=getattr(module, name), _name=name, **kwargs):
            bound = inspect.signature(_fn).bind(*args, **kwargs).arguments
            calls.setdefault(_name, []).append({k: v.dtype for k, v in bound.items()
                                                if isinstance(v, torch.Tensor) and v.is_floating_point()})
            return _fn(*args, **kwargs)

        monkeypatch.setattr(module, name, recording)
    torch.manual_seed(0)
    mixers = {"S": partial(SSD, head_dim=8, d_state=8, chunk_size=8, d_skip=True, backend="reference"),
              "I": partial(InnerFuncAttention, n_heads=2, mask="content_exp", backend="reference"),
              "E": partial(CDMoE, n_experts=16, n_heads=2, top_k=2, key_dim=8, backend="reference"),
              "G": partial(GatedDeltaNet, n_heads=2, head_dim=8, chunk_size=8, backend="reference")}
    model = HybridLM(32, 16, "SE IE GE", mixers)
    with torch.autocast("cpu", dtype=torch.float16):
        model(torch.randint(0, 32, (2, 11))).float().logsumexp(-1).sum().backward()
    assert calls.keys() == doctor.KEPT_FP32.keys()
    for op, seen in calls.items():
        for dtypes in seen:
            assert {k for k, d in dtypes.items() if d == torch.float32} == doctor.KEPT_FP32[op], (op, dtypes)
            assert {d for k, d in dtypes.items() if k not in doctor.KEPT_FP32[op]} == {torch.float16}, (op, dtypes)

    # and the doctor's check hands the kernel (and the references) those dtypes
    cuda = torch.cuda.is_available()  # the interpreter's tiny cases without a GPU (CPU tensors), else the GPU's
    for op, shape, fn, inputs in doctor.cases(cuda, "cuda" if cuda else "cpu"):
        given = []

        def spy(backend, _fn=fn, **a):
            if not any(v.dtype == torch.float64 for v in a.values()):  # (the float64 reference aside)
                given.append({k: v.dtype for k, v in a.items() if v.is_floating_point()})
            return _fn(backend=backend, **a)

        doctor.check(op, shape, spy, inputs, torch.float16)
        kept = doctor.KEPT_FP32[op] & inputs.keys()
        assert len(given) == 2 and all({k for k, d in dtypes.items() if d == torch.float32} == kept for dtypes in given), op
