"""GPU only: every Triton kernel in bf16 at larger shapes, by flash-attention's tolerance rule.

The kernel's error against an fp32 reference must be at most about twice that of the plain-torch
version run in the same low precision, on the output and on every gradient. Skipped without CUDA
(the interpreter has no bf16); run them with ``python -m pytest tests/zoo_kernels/test_gpu_precision.py``
on a GPU machine.
"""

import pytest
import torch

from zoo_kernels.attention import attention
from zoo_kernels.attention.reference import attention_reference
from zoo_kernels.gated_delta import gated_delta_rule
from zoo_kernels.retrieval import expert_mix
from zoo_kernels.ssd import ssd_scan
from zoo_kernels.ssd.reference import ssd_chunked

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

LOW = torch.bfloat16


def outputs_and_grads(fn, inputs: dict, weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """``[outputs…, gradients of the floating inputs…]`` of ``Σ_i ⟨out_i, weights_i⟩``, all as fp32."""
    leaves = {k: (v.detach().clone().requires_grad_() if v is not None and v.is_floating_point() else v)
              for k, v in inputs.items()}
    outs = fn(**leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    loss = sum((o.float() * w).sum() for o, w in zip(outs, weights))
    grad_leaves = [v for v in leaves.values() if v is not None and v.is_floating_point()]
    grads = torch.autograd.grad(loss, grad_leaves)
    return [t.detach().float() for t in (*outs, *grads)]


def check_rule(kernel, torch_low, ref, inputs: dict, names: list[str], seed: int = 0, low_dtype: torch.dtype = LOW):
    """``kernel`` and ``torch_low`` get the inputs in ``low_dtype`` (bf16), ``ref`` in fp32; compare all results."""
    torch.manual_seed(seed)
    low = {k: (v.to(low_dtype) if v is not None and v.is_floating_point() else v) for k, v in inputs.items()}
    want = outputs_and_grads(ref, {k: (v.float() if v is not None and v.is_floating_point() else v)
                                   for k, v in low.items()}, WEIGHTS)
    got = outputs_and_grads(kernel, low, WEIGHTS)
    baseline = outputs_and_grads(torch_low, low, WEIGHTS)
    assert len(got) == len(want) == len(baseline) == len(names)
    for name, g, b, w in zip(names, got, baseline, want):
        err_kernel = (g - w).abs().max().item()
        err_torch = (b - w).abs().max().item()
        assert err_kernel <= 2 * err_torch + 1e-5, (f"{name}: kernel error {err_kernel:.3g} > 2 × torch {low_dtype} "
                                                    f"error {err_torch:.3g}")


WEIGHTS: list[torch.Tensor] = []
DEVICE = "cuda"  # tests/zoo_kernels/test_half_interpreter.py-style dry runs set "cpu" (fp16, tiny sizes)


def set_weights(*shapes):
    g = torch.Generator(device=DEVICE).manual_seed(1)
    WEIGHTS[:] = [torch.randn(s, generator=g, device=DEVICE) for s in shapes]


@pytest.mark.parametrize("keep_window", [None, 100])
def test_attention_bf16(keep_window):
    B, T, H, Hkv, D = 2, 1001, 8, 2, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
    pad = torch.zeros(B, T, dtype=torch.bool, device="cuda")
    pad[0, :37] = True
    inputs = dict(q=r(B, T, H, D), k=r(B, T, Hkv, D), v=r(B, T, Hkv, D), bias=2 * r(B, H, T))
    set_weights((B, T, H, D))
    call = lambda backend: lambda q, k, v, bias: attention(  # noqa: E731
        q, k, v, bias=bias, key_padding_mask=pad, keep_window=keep_window, backend=backend)
    torch_low = lambda q, k, v, bias: attention_reference(  # noqa: E731
        q, k, v, bias=bias, key_padding_mask=pad, keep_window=keep_window)
    check_rule(call("triton"), torch_low, call("reference"), inputs, ["out", "dq", "dk", "dv", "dbias"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("keep_window", [None, 1000])
def test_the_decoding_step_kernel(dtype, keep_window):
    """One query per sequence against a long cache (the split-K kernel, forward only), GQA 4:1 at head dim 128, a
    bias and a left-padded sequence: its error against fp32 at most twice the plain-torch computation's in ``dtype``."""
    B, S, H, Hkv, D = 4, 5001, 16, 4, 128
    g = torch.Generator(device=DEVICE).manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, device=DEVICE)  # noqa: E731
    pad = torch.zeros(B, S, dtype=torch.bool, device=DEVICE)
    pad[1, :2000] = True
    q, k, v, bias = r(B, 1, H, D), r(B, S, Hkv, D), r(B, S, Hkv, D), 2 * r(B, H, S)
    low = [t.to(dtype) for t in (q, k, v, bias)]
    with torch.no_grad():
        want = attention(*(t.float() for t in low[:3]), bias=low[3].float(), key_padding_mask=pad,
                         keep_window=keep_window, backend="reference")
        torch_low = attention(*low[:3], bias=low[3], key_padding_mask=pad, keep_window=keep_window, backend="reference")
        got = attention(*low[:3], bias=low[3], key_padding_mask=pad, keep_window=keep_window, backend="triton")
    error, reference_error = ((t.float() - want).abs().max().item() for t in (got, torch_low))
    assert error <= 2 * reference_error + 1e-5, (error, reference_error)


def packed_documents(B: int, T: int, lengths: list[int]) -> torch.Tensor:
    """``[B, T]`` document numbers: each row cut into documents of the given lengths, cycled."""
    ids = torch.empty(B, T, dtype=torch.long)
    for b in range(B):
        t, n = 0, 0
        while t < T:
            size = lengths[(b + n) % len(lengths)]
            ids[b, t:t + size] = n
            t, n = t + size, n + 1
    return ids.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [128, 256])
def test_attention_at_large_head_dims_with_packed_documents(dtype, head_dim, T=777):
    """The tile table's head dims (32×32 tiles above 128) in both half dtypes, GQA 2:1, a bias, and
    documents that end inside the key blocks the kernels skip."""
    B, H, Hkv = 2, 4, 2
    g = torch.Generator(device=DEVICE).manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, device=DEVICE)  # noqa: E731
    docs = packed_documents(B, T, [1, 95, 300, 33, T])
    inputs = dict(q=r(B, T, H, head_dim), k=r(B, T, Hkv, head_dim), v=r(B, T, Hkv, head_dim), bias=2 * r(B, H, T))
    set_weights((B, T, H, head_dim))
    call = lambda backend: lambda q, k, v, bias: attention(  # noqa: E731
        q, k, v, bias=bias, document_ids=docs, backend=backend)
    torch_low = lambda q, k, v, bias: attention_reference(q, k, v, bias=bias, document_ids=docs)  # noqa: E731
    check_rule(call("triton"), torch_low, call("reference"), inputs, ["out", "dq", "dk", "dv", "dbias"], low_dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(64, 256), (128, 128)], ids=["P64-N256", "P128-N128"])
def test_ssd_at_the_large_state_sizes_with_packed_documents(dtype, shape, T=777, L=64):
    B, H, G = 2, 4, 2
    P, N = shape
    g = torch.Generator(device=DEVICE).manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, device=DEVICE)  # noqa: E731
    ids = packed_documents(B, T, [1, 95, 300, 33, T])
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    inputs = dict(x=r(B, T, H, P), dt=torch.nn.functional.softplus(r(B, T, H) - 3), A=-torch.exp(r(H) * 0.5),
                  B=r(B, T, G, N) / N**0.5, C=r(B, T, G, N) / N**0.5, D=r(H))
    set_weights((B, T, H, P), (B, H, P, N))
    kernel = lambda **a: ssd_scan(**a, chunk_size=L, return_final_state=True, document_starts=starts,  # noqa: E731
                                  backend="triton")
    ref = lambda **a: ssd_scan(**a, chunk_size=L, return_final_state=True, document_starts=starts,  # noqa: E731
                               backend="reference")

    def torch_low(x, dt, A, B, C, D):  # the chunked einsums computed in the half dtype throughout
        return ssd_chunked(x, dt, A, B, C, chunk_size=L, D=D, document_starts=starts)

    check_rule(kernel, torch_low, ref, inputs, ["y", "final", "dx", "ddt", "dA", "dB", "dC", "dD"], low_dtype=dtype)


def test_ssd_bf16():
    B, T, H, P, G, N, L = 2, 1001, 8, 64, 2, 128, 256
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
    inputs = dict(x=r(B, T, H, P), dt=torch.nn.functional.softplus(r(B, T, H) - 3), A=-torch.exp(r(H) * 0.5),
                  B=r(B, T, G, N), C=r(B, T, G, N), D=r(H), initial_state=r(B, H, P, N))
    set_weights((B, T, H, P), (B, H, P, N))
    kernel = lambda **a: ssd_scan(**a, chunk_size=L, return_final_state=True, backend="triton")  # noqa: E731
    ref = lambda **a: ssd_scan(**a, chunk_size=L, return_final_state=True, backend="reference")  # noqa: E731

    def torch_low(x, dt, A, B, C, D, initial_state):  # the chunked einsums computed in bf16 throughout
        return ssd_chunked(x, dt, A, B, C, chunk_size=L, D=D, initial_state=initial_state)

    check_rule(kernel, torch_low, ref, inputs, ["y", "final", "dx", "ddt", "dA", "dB", "dC", "dD", "dinitial"])


@pytest.mark.parametrize("precision", ["highest", "high"], ids=["fp32 dots", "TF32 dots"])
def test_gated_delta_bf16_at_qwen3_next_head_dims(precision):
    """The gated delta rule computes in fp32 on both backends (the kernel runs only the recurrence over chunks), so on
    the same bf16 inputs the kernel and the reference agree to fp32's rounding (TF32's under ``"high"``, where both
    take it) on the output, the final state and every gradient: K = V = 128, chunk 64, T 1001 with two packed
    documents and an initial state (norm-wise, relative)."""
    B, T, H, K, L = 2, 1001, 4, 128, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda")  # noqa: E731
    inputs = dict(q=r(B, T, H, K).to(LOW), k=torch.nn.functional.normalize(r(B, T, H, K), dim=-1).to(LOW),
                  v=r(B, T, H, K).to(LOW), g=-torch.nn.functional.softplus(r(B, T, H) - 2),
                  beta=torch.sigmoid(r(B, T, H)).to(LOW), initial_state=r(B, H, K, K))
    starts = torch.zeros(B, T, dtype=torch.bool, device="cuda")
    starts[:, [0, 400]] = True
    set_weights((B, T, H, K), (B, H, K, K))
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        got, want = (outputs_and_grads(lambda **a: gated_delta_rule(**a, chunk_size=L, return_final_state=True,
                                                                    document_starts=starts, backend=backend),
                                       inputs, WEIGHTS) for backend in ("triton", "reference"))
    finally:
        torch.set_float32_matmul_precision(previous)
    rtol = 1e-4 if precision == "highest" else 1e-2  # (a wrong product is off by O(1))
    for name, a, b in zip(["y", "final", "dq", "dk", "dv", "dg", "dbeta", "dinitial"], got, want):
        assert (a - b).norm() <= rtol * b.norm() + 1e-6, f"{name}: {(a - b).norm() / b.norm():.2e}"


def test_expert_mix_bf16():
    M, heads, k, N, d = 2048, 4, 16, 65536, 256
    g = torch.Generator(device="cuda").manual_seed(0)
    experts = torch.randint(0, N, (M, heads, k), generator=g, device="cuda")
    inputs = dict(x=torch.randn(M, d, generator=g, device="cuda"), experts=experts,
                  weights=torch.rand(M, heads, k, generator=g, device="cuda"),
                  down=torch.randn(N, d, generator=g, device="cuda") / d**0.5,
                  up=torch.randn(N, d, generator=g, device="cuda"))
    set_weights((M, d))
    call = lambda backend: lambda **a: expert_mix(**a, backend=backend)  # noqa: E731
    check_rule(call("triton"), call("reference"), call("reference"), inputs, ["y", "dx", "dweights", "ddown", "dup"])


def test_bias_attention_peak_memory_is_linear_in_T():
    B, H, D = 1, 4, 64
    peaks = []
    for T in (2048, 4096, 8192):
        q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=LOW, requires_grad=True) for _ in range(3))
        bias = torch.randn(B, H, T, device="cuda", dtype=LOW, requires_grad=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        attention(q, k, v, bias=bias, backend="triton").sum().backward()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - base)
    # doubling T doubles the O(T) buffers; a [T, T] term would quadruple
    assert peaks[2] / peaks[1] < 2.5 and peaks[1] / peaks[0] < 2.5, peaks


@pytest.mark.parametrize("op", ["ssd", "attention"])
def test_offsets_past_2_to_the_31(op):
    """Calls whose flat offsets pass 2^31 (they wrapped in 32 bits): the last rows against the reference.

    SSD: B·(T/L)·H·P·N = 2^31 chunk-state elements at T = 2^21, H 8, P 64, N 128, L 64 (the reference
    runs in four pieces that carry the state). Attention: (B−1)·T·H·D > 2^31 at B = 5, T = 2^17, H 32,
    D 128; the reference runs the last 16 queries of the last sequence. fp32 in, TF32 dots: 2e-2."""
    torch.manual_seed(0)
    with torch.no_grad():
        if op == "ssd":
            T, H, P, N = 2**21, 8, 64, 128
            x = torch.randn(1, T, H, P, device="cuda")
            dt = torch.rand(1, T, H, device="cuda") * 0.1
            A = -torch.rand(H, device="cuda")
            B = torch.randn(1, T, 1, N, device="cuda") / N**0.5
            C = torch.randn(1, T, 1, N, device="cuda") / N**0.5
            y = ssd_scan(x, dt, A, B, C, chunk_size=64, backend="triton")[:, -100:]
            state, piece = None, T // 4
            for start in range(0, T, piece):
                s = slice(start, start + piece)
                want, state = ssd_chunked(x[:, s], dt[:, s], A, B[:, s], C[:, s], chunk_size=64, initial_state=state)
            want = want[:, -100:]
        else:
            Bt, T, H, D = 5, 2**17, 32, 128
            q, k, v = (torch.randn(Bt, T, H, D, device="cuda", dtype=LOW) for _ in range(3))
            v[-1] += 3.0  # rows read from another sequence would average near 0, not near 3
            y = attention(q, k, v, causal=True, backend="triton")[-1:, -16:].float()
            want = attention_reference(q[-1:, -16:].float(), k[-1:].float(), v[-1:].float(), causal=True)
    torch.testing.assert_close(y.float(), want.float(), rtol=2e-2, atol=2e-2)
