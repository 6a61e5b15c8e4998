"""What reaches a kernel: float64 goes to the reference under ``auto`` and is refused by name under
``triton``; q, k, v of mixed dtypes are refused before any kernel; a sequence too long for the
attention kernel's 32-bit in-sequence offsets is refused rather than read at the wrong rows."""

import types

import pytest
import torch

from zoo_kernels import _backend
from zoo_kernels.attention import attention
from zoo_kernels.attention.triton import _check_index_range
from zoo_kernels.retrieval import expert_mix
from zoo_kernels.ssd import ssd_scan


@pytest.mark.parametrize("dtype, expected", [(torch.float64, "reference"), (torch.float32, "triton"),
                                             (torch.bfloat16, "triton"), (torch.float16, "triton")])
def test_auto_sends_only_kernel_dtypes_on_cuda_to_triton(monkeypatch, dtype, expected):
    monkeypatch.setattr(_backend, "triton_installed", lambda: True)
    cuda = types.SimpleNamespace(is_cuda=True, dtype=dtype)
    assert _backend.resolve_backend("auto", cuda, op="attention", has_triton=True) == expected


def test_triton_refuses_float64_by_name_for_every_op():
    q = torch.randn(1, 5, 2, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"attention: the Triton kernel takes fp16, bf16 or fp32 .* got torch.float64"):
        attention(q, q, q, backend="triton")
    x = torch.randn(1, 5, 2, 4, dtype=torch.float64)
    dt, A, B = torch.rand(1, 5, 2, dtype=torch.float64), -torch.rand(2, dtype=torch.float64), torch.randn(1, 5, 1, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"ssd_scan: backend='triton' takes x, B, C in"):
        ssd_scan(x, dt, A, B, B, chunk_size=4, backend="triton")


def test_float64_under_auto_computes_in_float64():
    """auto on a CPU float64 input: the reference, in float64 (a kernel would have rounded to fp32)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 7, 2, 8, dtype=torch.float64) for _ in range(3))
    out = attention(q, k, v)
    assert out.dtype == torch.float64
    want = attention(q, k, v, backend="reference")
    assert torch.equal(out, want)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_mixed_qkv_dtypes_are_named(backend):
    q = torch.randn(1, 5, 2, 8)
    with pytest.raises(ValueError, match=r"attention: q, k and v must share one dtype; got q torch.float32, "
                                         r"k torch.float16, v torch.float32"):
        attention(q, q.half(), q, backend=backend)


def test_a_sequence_past_32_bit_offsets_is_refused_by_name():
    """T·H·D = 2^31 (meta tensors: nothing allocated); and a view's rows are as long as its stride says: k split
    from a projection three times wider passes 2^31 at a third of the length."""
    q = torch.empty(1, 2**21, 8, 128, device="meta")
    with pytest.raises(ValueError, match=r"indexes inside one sequence in 32 bits, and q reaches 2,097,152 rows × 1,024 "
                                         r"= 2,147,483,648 >= 2\^31"):
        _check_index_range(q, q, q)
    _check_index_range(q[:, : 2**21 - 1], q[:, : 2**21 - 1])  # one row less fits
    T = 2**21 // 3 + 1
    qkv = torch.empty(1, T, 24, 128, device="meta")  # q, k, v of 8 heads each, split from one projection
    q, k, v = qkv.split(8, dim=2)
    with pytest.raises(ValueError, match=r"and q reaches 699,051 rows × 3,072"):
        _check_index_range(q, k, v)
    _check_index_range(q.contiguous(), k.contiguous(), v.contiguous())  # as copies, each row 1,024: they fit
    with pytest.raises(ValueError, match=r"and v reaches 699,051 rows × 3,072"):  # v alone the wide view
        _check_index_range(q.contiguous(), k.contiguous(), v)
    with pytest.raises(ValueError, match=r"the per-head dK/dV \(S·H·D\) reaches 2,097,152 rows × 1,024"):
        _check_index_range(torch.empty(1, 1, 8, 128, device="meta"), torch.empty(1, 2**21, 1, 128, device="meta"))


def test_expert_mix_refuses_float64_under_triton():
    x = torch.randn(3, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"expert_mix: the Triton kernel takes fp16, bf16 or fp32"):
        expert_mix(x, torch.zeros(3, 1, 2, dtype=torch.long), torch.ones(3, 1, 2, dtype=torch.float64),
                   torch.randn(4, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64), backend="triton")


def test_fp32_dots_follow_torchs_matmul_precision():
    """Full fp32 under torch's default ("highest"), TF32 where torch's own fp32 matmuls would use it."""
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert _backend.dot_precision() == "ieee"
        for setting in ("high", "medium"):
            torch.set_float32_matmul_precision(setting)
            assert _backend.dot_precision() == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)


def test_auto_sends_a_single_query_to_the_reference_and_longer_ones_to_the_kernel(monkeypatch):
    """A decoding step (one query) would fill one row of the kernel's 64-row query tiles: auto takes the reference
    there, as if on a GPU (resolve_backend answering 'triton'); two queries or more with a bias at head dim 8 still
    take the kernel."""
    import zoo_kernels.attention as attention_module
    import zoo_kernels.attention.triton as attention_triton_module

    calls = []
    monkeypatch.setattr(attention_module, "resolve_backend", lambda *a, **k: "triton")
    monkeypatch.setattr(attention_triton_module, "attention_triton", lambda q, k, v, **kw: calls.append(q.shape[1]) or q)
    k = v = torch.randn(1, 9, 2, 8)
    attention_module.attention(torch.randn(1, 1, 2, 8), k, v, backend="auto")
    assert calls == []
    attention_module.attention(torch.randn(1, 2, 2, 8), k, v, bias=torch.randn(1, 2, 9), backend="auto")
    assert calls == [2]


def test_auto_takes_torch_sdpa_where_a_gpu_timed_it_faster(monkeypatch):
    """As if on a GPU (resolve_backend answering 'triton'): plain causal attention and a bias at head dim 128 go to the
    reference (torch's fused SDPA); a bias at head dim 64, a window, documents, a cache (T < S) and fp16 at head dim
    128 (fp16 cannot hold the route's padding bias) keep the kernel."""
    import zoo_kernels.attention as attention_module
    import zoo_kernels.attention.triton as attention_triton_module

    calls = []
    monkeypatch.setattr(attention_module, "resolve_backend", lambda *a, **k: "triton")
    monkeypatch.setattr(attention_triton_module, "attention_triton", lambda q, k, v, **kw: calls.append(q.shape) or q)

    def run(D, T=9, S=9, dtype=torch.float32, **options):
        calls.clear()
        q, k = torch.randn(1, T, 2, D, dtype=dtype), torch.randn(1, S, 2, D, dtype=dtype)
        attention_module.attention(q, k, k, backend="auto", **options)
        return "triton" if calls else "reference"

    bias = lambda: torch.randn(1, 2, 9)  # noqa: E731
    assert run(64) == "reference" and run(128) == "reference"
    assert run(128, bias=bias()) == "reference"
    assert run(64, bias=bias()) == "triton"
    assert run(64, key_padding_mask=torch.zeros(1, 9, dtype=torch.bool)) == "triton"
    assert run(128, bias=bias(), keep_window=3) == "triton"
    assert run(128, document_ids=torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2]])) == "triton"
    assert run(64, T=4, S=9) == "triton"
    assert run(128, dtype=torch.float16, bias=bias().half()) == "triton"


def test_the_backend_choice_compiles_into_one_graph(monkeypatch):
    """``auto`` on CUDA asks whether triton is installed inside every compiled step that calls an op. torch 2.11's
    dynamo refuses to trace ``importlib.util.find_spec`` (2.13's lets it through), which broke a compiled decoding
    step at every attention layer on the first GPU run, so no CUDA graph: the answer is looked up once, on import.
    A ``find_spec`` that dynamo cannot trace here stands in for 2.11's."""
    import importlib.util

    real = importlib.util.find_spec

    def untraceable(name, *args):
        if torch.compiler.is_compiling():  # (imports while torch.compile starts up call it too)
            torch._dynamo.graph_break()
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", untraceable)
    cuda = types.SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)
    step = torch.compile(lambda x: x + 1 if _backend.resolve_backend("auto", cuda, op="attention", has_triton=True)
                         == "triton" else x - 1, fullgraph=True, backend="eager")
    assert torch.equal(step(torch.zeros(2)), torch.full((2,), 1.0 if _backend.triton_installed() else -1.0))
    torch._dynamo.reset()


def test_each_way_triton_cannot_run_is_named(monkeypatch):
    cuda, cpu = (types.SimpleNamespace(is_cuda=flag, dtype=torch.float32, device=device)
                 for flag, device in ((True, "cuda:0"), (False, "cpu")))
    resolve = _backend.resolve_backend
    monkeypatch.setattr(_backend, "triton_installed", lambda: False)
    with pytest.warns(UserWarning, match="ssd_scan: triton is not installed, so the plain-torch reference runs on CUDA"):
        assert resolve("auto", cuda, op="ssd_scan", has_triton=True) == "reference"
    assert resolve("auto", cuda, op="ssd_scan", has_triton=False) == "reference"  # no kernel: nothing to miss
    with pytest.raises(ImportError, match="ssd_scan: backend='triton' needs the triton package"):
        resolve("triton", cuda, op="ssd_scan", has_triton=True)
    monkeypatch.setattr(_backend, "triton_installed", lambda: True)
    with pytest.raises(NotImplementedError, match="decode: backend='triton' has no kernel yet"):
        resolve("triton", cuda, op="decode", has_triton=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="ssd_scan: backend='triton' needs CUDA tensors \\(got cpu\\); on a CPU, set "
                                         "TRITON_INTERPRET=1"):
        resolve("triton", cpu, op="ssd_scan", has_triton=True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve("triton", cpu, op="ssd_scan", has_triton=True) == "triton"
    assert resolve("auto", cpu, op="ssd_scan", has_triton=True) == "reference"  # auto never takes the interpreter


def test_the_autocast_helpers_read_and_switch_off_the_region_on_each_device():
    """``autocast_dtype`` is what lets a bf16 activation meet an fp32 weight in a mixer (and sizes the grouped
    matmul's operands); ``without_autocast`` keeps the references in fp32 inside a bf16 region; ``meta`` (shape
    inference) has no autocast, and both must still answer there."""
    x = torch.randn(4, 4)
    assert _backend.autocast_dtype("cpu") is None and _backend.autocast_dtype("meta") is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _backend.autocast_dtype("cpu") == torch.bfloat16 and (x @ x).dtype == torch.bfloat16
        with _backend.without_autocast("cpu"):
            assert _backend.autocast_dtype("cpu") is None and (x @ x).dtype == torch.float32
        assert (x @ x).dtype == torch.bfloat16  # and back on after it
    with _backend.without_autocast("meta"):
        assert torch.empty(2, 3, device="meta").shape == (2, 3)


def test_a_unit_last_stride_is_read_in_place_and_any_other_is_copied():
    wide = torch.randn(3, 10)
    view = wide[:, 2:6]  # a view of a wider projection: strides (10, 1)
    assert _backend.unit_stride_last(view) is view
    strided = wide[:, ::2]  # last stride 2
    out = _backend.unit_stride_last(strided)
    assert out.stride(-1) == 1 and torch.equal(out, strided)


def test_the_launch_tables_key_on_the_tensors_gpu_and_on_hopper_off_cuda(monkeypatch):
    """``gpu_arch``: what the SSD's, attention's and the gated delta rule's launch tables are given."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: {"cuda:1": (8, 6)}.get(device, (9, 0)))
    assert _backend.gpu_arch(torch.zeros(1)) == 90
    assert _backend.gpu_arch(types.SimpleNamespace(is_cuda=True, device="cuda:1")) == 86
    assert _backend.gpu_arch(types.SimpleNamespace(is_cuda=True, device="cuda:0")) == 90
