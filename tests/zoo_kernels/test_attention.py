"""``zoo_kernels.attention`` against a direct softmax written independently here."""

import math

import pytest
import torch

from zoo_kernels.attention import attention, attention_weights


def direct_attention(q, k, v, bias=None, causal=True, key_padding_mask=None, keep_window=None):
    """Loop-level oracle: per (b, h, i), list the allowed keys, softmax over them."""
    B, T, H, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            g = h // (H // Hkv)
            for i in range(T):
                keys = [j for j in range(S) if (not causal or j <= S - T + i)
                        and (key_padding_mask is None or not key_padding_mask[b, j])]
                if keep_window is not None:
                    by_rank = sorted(keys, key=lambda j: (-(0.0 if bias is None else float(bias[b, h, j].detach())), -j))
                    keys = sorted(by_rank[:keep_window])
                if not keys:
                    continue
                idx = torch.tensor(keys)
                scores = k[b, idx, g] @ q[b, i, h] / math.sqrt(D)  # [n]
                if bias is not None:
                    scores = scores + bias[b, h, idx]
                out[b, i, h] = torch.softmax(scores, 0) @ v[b, idx, g]
    return out


def make(B=2, T=9, S=None, H=4, Hkv=2, D=8, bias=True, dtype=torch.float64):
    S = T if S is None else S
    q = torch.randn(B, T, H, D, dtype=dtype, requires_grad=True)
    k = torch.randn(B, S, Hkv, D, dtype=dtype, requires_grad=True)
    v = torch.randn(B, S, Hkv, D, dtype=dtype, requires_grad=True)
    b = (torch.randn(B, H, S, dtype=dtype) * 2).requires_grad_() if bias else None
    return q, k, v, b


def grads(out, tensors):
    torch.manual_seed(1)
    weight = torch.randn(out.shape, dtype=out.dtype)  # not randn_like: it copies strides
    return torch.autograd.grad((out * weight).sum(), [t for t in tensors if t is not None])


CASES = {
    "plain causal": dict(),
    "bias": dict(bias=True),
    "non-causal with bias": dict(causal=False, bias=True),
    "gqa 4:1": dict(Hkv=1, bias=True),
    "padding": dict(pad=True, bias=True),
    "window 3": dict(keep_window=3, bias=True),
    "window without bias": dict(keep_window=4),
    "decode-style T<S": dict(T=3, S=10, bias=True),
    # each of the reference's paths (SDPA as it is, the one-query mask, the fused bias, the written-out mask) once
    "non-causal": dict(causal=False),
    "decode-style T<S without bias": dict(T=3, S=10),
    "one query": dict(T=1, S=10),
    "one query with bias": dict(T=1, S=10, bias=True),
    "one query, window 4": dict(T=1, S=10, keep_window=4, bias=True),
    "window as wide as the keys": dict(keep_window=9, bias=True),
    # a sliding window (no bias or padding, causal, T == S) goes by blocks of w queries: several, and a partial last one
    "sliding window 1": dict(keep_window=1),
    "sliding window 5 over 23, gqa 4:1": dict(T=23, Hkv=1, keep_window=5),
}


def case_inputs(name: str, left_padding: int = 2) -> tuple:
    """``(q, k, v, pad, kwargs)`` of the case ``name``: with ``pad``, the first sequence left-padded by
    ``left_padding`` keys and the second right-padded by 3."""
    case = dict(CASES[name])
    pad, keep_window, causal = case.pop("pad", False), case.pop("keep_window", None), case.pop("causal", True)
    case.setdefault("bias", False)
    q, k, v, bias = make(**case)
    mask = None
    if pad:
        mask = torch.zeros(q.shape[0], k.shape[1], dtype=torch.bool)
        mask[0, :left_padding] = True
        mask[1, -3:] = True
    return q, k, v, pad, dict(bias=bias, causal=causal, key_padding_mask=mask, keep_window=keep_window)


@pytest.mark.parametrize("name", CASES)
def test_matches_direct_softmax_outputs_and_gradients(name):
    q, k, v, pad, kwargs = case_inputs(name)
    bias = kwargs["bias"]
    got = attention(q, k, v, backend="reference", **kwargs)
    want = direct_attention(q, k, v, **kwargs)
    if pad:
        # Query rows with no allowed key are defined as zero; the oracle leaves them zero too.
        assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want)
    for g_got, g_want in zip(grads(got, (q, k, v, bias)), grads(want, (q, k, v, bias))):
        torch.testing.assert_close(g_got, g_want)


@pytest.mark.parametrize("name", CASES)
def test_the_attention_weights_average_the_values_into_the_oracles_output(name):
    """``attention_weights`` — the softmax weights, for looking at attention — are the weights the oracle's output
    averages the values with (``Σ_j w_ij v_j``, kv heads repeated), in every case; rows sum to 1 where a query has a
    key, 0 where it has none; nothing sits on a key the query may not see."""
    q, k, v, pad, kwargs = case_inputs(name, left_padding=5)  # (the first query rows there have no key at all)
    causal = kwargs["causal"]
    weights = attention_weights(q, k, **kwargs)  # [B, H, T, S]
    values = v.repeat_interleave(q.shape[2] // k.shape[2], dim=2).transpose(1, 2)  # [B, H, S, D]
    torch.testing.assert_close((weights @ values).transpose(1, 2), direct_attention(q, k, v, **kwargs))
    rows = weights.sum(-1)
    assert torch.allclose(rows, torch.ones_like(rows)) or pad
    if causal and weights.shape[-2] == weights.shape[-1]:
        assert (weights.triu(1) == 0).all()
    if pad:
        assert (weights[1, ..., -3:] == 0).all() and (rows[0, :, 0] == 0).all()


def test_attention_weights_keep_documents_apart_and_a_nan_visible():
    q, k, _, _ = make(B=1, T=7, bias=False)
    weights = attention_weights(q, k, document_ids=torch.tensor([[4, 4, 4, 9, 9, 9, 9]]))
    assert (weights[..., 3:, :3] == 0).all() and (weights[..., :3, 3:] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 4, 7, dtype=weights.dtype))
    with torch.no_grad():
        k[0, 2, 0, 0] = float("nan")
    poisoned = attention_weights(q, k)
    assert poisoned[0, 0, 2:].isnan().all() and not poisoned[0, 0, :2].isnan().any()  # (no NaN cleaned to 0)


def test_bias_gradient_is_nonzero_and_padded_keys_get_no_attention():
    q, k, v, bias = make(B=1, T=6, H=2, Hkv=2)
    mask = torch.tensor([[False, True, False, False, True, False]])
    out = attention(q, k, v, bias=bias, key_padding_mask=mask)
    (g_bias,) = torch.autograd.grad(out.sum() + (out**2).sum(), bias)
    assert g_bias[0, :, [0, 2, 3, 5]].abs().min() > 0
    # A padded key's value never reaches any output: its v gradient is exactly zero.
    (g_v,) = torch.autograd.grad(attention(q, k, v, bias=bias, key_padding_mask=mask).sum(), v)
    assert g_v[0, [1, 4]].abs().max() == 0
    assert g_v[0, [0, 2]].abs().min() > 0


def test_keep_window_bias_picks_the_largest_bias_keys():
    # With one huge bias on key 0, a window of 1 makes every query read exactly v[0].
    q, k, v, _ = make(B=1, T=5, H=1, Hkv=1, bias=False)
    bias = torch.zeros(1, 1, 5, dtype=torch.float64)
    bias[0, 0, 0] = 5.0
    out = attention(q, k, v, bias=bias, keep_window=1)
    torch.testing.assert_close(out[0, :, 0], v[0, 0, 0].expand(5, -1))


def test_a_window_without_bias_keeps_the_most_recent_allowed_keys():
    """``select_window`` with no bias counts the allowed keys from the newest back; it must keep what ranking them
    by a bias of zeros keeps (ties to the most recent), over causal masks with padding and documents; and with
    neither, exactly transformers' sliding window ``i - j < w``."""
    from zoo_kernels.attention.reference import allowed_keys, select_window

    torch.manual_seed(0)
    T, S = 9, 13
    pad = torch.rand(3, S) < 0.3
    ids = torch.randint(0, 2, (3, 1, 1, S)).cumsum(-1)  # runs of documents along the keys
    for allowed in (allowed_keys(T, S, causal=True, key_padding_mask=pad, device="cpu"),
                    allowed_keys(T, S, causal=True, key_padding_mask=pad, device="cpu") & (ids == ids[..., -T:].transpose(-1, -2)),
                    allowed_keys(T, S, causal=False, key_padding_mask=pad, device="cpu")):
        for w in (1, 2, 5, S):
            ranked = select_window(allowed, torch.zeros(3, 1, S), w)
            assert torch.equal(select_window(allowed, None, w), ranked)
    i, j = torch.arange(T)[:, None] + S - T, torch.arange(S)
    for w in (1, 4, 20):
        band = (j <= i) & (i - j < w)
        assert torch.equal(select_window(allowed_keys(T, S, causal=True, key_padding_mask=None, device="cpu"), None, w),
                           band.expand(1, 1, T, S))


@pytest.mark.parametrize("w, lengths", [(5, [9, 3, 11]), (1, [10, 7]), (4, [6, 10]), (8, [9])], ids=["w5", "w1", "w4", "w8"])
def test_a_sliding_window_goes_by_blocks_and_equals_the_written_out_mask_with_documents(monkeypatch, w, lengths):
    """A window without a bias or padding, causal, over packed documents: the blocks of ``w`` queries (each against
    its block of keys and the one before) give the written-out ``[T, T]`` mask's outputs and gradients, with documents
    longer than the window that cross the blocks (the first row) and one document (the second), and the written-out
    mask is not what runs."""
    import zoo_kernels.attention.reference as reference

    torch.manual_seed(0)
    T = sum(lengths)
    q, k, v, _ = make(T=T, bias=False)
    documents = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))  # [T]
    ids = torch.stack([documents, torch.zeros(T, dtype=torch.long)])
    written_out = reference.attention_masked
    want = written_out(*(t.transpose(1, 2).repeat_interleave(2 if t is not q else 1, dim=1) for t in (q, k, v)),
                       bias=None, causal=True, key_padding_mask=None, keep_window=w, scale=8 ** -0.5,
                       document_ids=ids).transpose(1, 2)
    plain = written_out(*(t.transpose(1, 2).repeat_interleave(2 if t is not q else 1, dim=1) for t in (q, k, v)),
                        bias=None, causal=True, key_padding_mask=None, keep_window=w, scale=8 ** -0.5).transpose(1, 2)
    monkeypatch.setattr(reference, "attention_masked", None)  # (called, it would fail)
    for documents, expected in ((ids, want), (None, plain)):  # (without documents, only the band keeps the first block)
        got = attention(q, k, v, keep_window=w, document_ids=documents, backend="reference")
        torch.testing.assert_close(got, expected)
        for g_got, g_want in zip(grads(got, (q, k, v)), grads(expected, (q, k, v))):
            torch.testing.assert_close(g_got, g_want)


def test_a_window_of_every_key_is_dropped_before_a_backend_is_chosen(monkeypatch):
    """A ``keep_window`` of at least the keys' number cuts nothing; it reaches no backend, so that on a GPU plain
    attention may still take torch's flash kernel."""
    import zoo_kernels.attention as module

    seen = []
    monkeypatch.setattr(module, "attention_reference", lambda *args, keep_window, **kwargs: seen.append(keep_window))
    q, k, v, _ = make(B=1, T=5, H=1, Hkv=1, bias=False)
    for w in (4, 5, 6):
        module.attention(q, k, v, keep_window=w, check_finite=False)
    assert seen == [4, None, None]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(keep_window=0), "keep_window=0 must be an integer >= 1"),
        (dict(bias=torch.zeros(2, 3, 9)), "bias must be [B, H, S]"),
        (dict(key_padding_mask=torch.zeros(2, 9)), "key_padding_mask must be bool"),
        (dict(backend="cuda"), "attention: backend='cuda' is not one of"),
    ],
)
def test_bad_arguments_name_the_problem(kwargs, words):
    q, k, v, _ = make(bias=False)
    with pytest.raises(ValueError) as info:
        attention(q, k, v, **kwargs)
    assert words in str(info.value)


def test_without_causality_fewer_keys_than_queries_is_cross_attention():
    # (causal attention refuses S < T by name: its first queries would see no key)
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 5, 2, 4), torch.randn(1, 3, 2, 4), torch.randn(1, 3, 2, 4)
    expected = torch.softmax(torch.einsum("bthd,bshd->bhts", q, k) / 2, dim=-1)  # [b, h, t, s]; scale 1/sqrt(4)
    torch.testing.assert_close(attention(q, k, v, causal=False), torch.einsum("bhts,bshd->bthd", expected, v))


def test_each_tensor_of_the_wrong_shape_is_named_alone():
    """One argument wrong at a time (the others right), so every check is needed: q, k, v [B, T, H, D] with k and v
    alike and of q's batch and head dim; the key padding [B, S]; document ids [B, T], integers, self-attention."""
    q, k, v, _ = make(bias=False)  # q [2, 9, 4, 8], k and v [2, 9, 2, 8]
    ids = torch.zeros(2, 9, dtype=torch.long)
    cases = [
        (dict(q=q[0]), r"q, k, v must be \[B, T, H, D\]; got q\(9, 4, 8\) k\(2, 9, 2, 8\)"),
        (dict(k=k[0], v=v[0]), r"q, k, v must be \[B, T, H, D\]; got q\(2, 9, 4, 8\) k\(9, 2, 8\)"),
        (dict(v=v[0]), r"q, k, v must be \[B, T, H, D\]; .* v\(9, 2, 8\)"),
        (dict(v=v[:, :5]), r"k\(2, 9, 2, 8\) and v\(2, 5, 2, 8\) must have the same shape"),
        (dict(k=k[:1], v=v[:1]), r"k\(1, 9, 2, 8\) does not match q\(2, 9, 4, 8\) in batch or head dim"),
        (dict(k=k[..., :4], v=v[..., :4]), r"k\(2, 9, 2, 4\) does not match q\(2, 9, 4, 8\) in batch or head dim"),
        (dict(key_padding_mask=torch.zeros(2, 8, dtype=torch.bool)), r"key_padding_mask must be \[B, S\] = \(2, 9\)"),
        (dict(document_ids=ids[:, :8]), r"document_ids must be \[B, T\] = \(2, 9\) with as many keys as queries"),
        (dict(document_ids=ids[:, :8], q=q[:, :8]), r"document_ids .* as many keys as queries; got \(2, 8\) and 9 keys"),
        (dict(k=k[:, :8], v=v[:, :8]), r"causal attention needs at least as many keys as queries .*; got T=9 queries and "
                                       r"S=8 keys"),  # (was a shape error from inside torch)
        (dict(document_ids=ids.bool()), r"document_ids must be integers; got torch.bool"),
        (dict(document_ids=ids.float()), r"document_ids must be integers; got torch.float32"),
    ]
    for change, message in cases:
        args = {"q": q, "k": k, "v": v, **change}
        with pytest.raises(ValueError, match=rf"attention: {message}"):
            attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_heads_not_a_multiple_of_kv_heads():
    q, k, v, _ = make(H=3, Hkv=2, bias=False)
    with pytest.raises(ValueError, match="H=3 are not a multiple of key/value heads H_kv=2"):
        attention(q, k, v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_and_padding_never_materialise_a_query_by_key_tensor(dtype, largest_tensor):
    B, T, H, Hkv, D = 2, 384, 2, 1, 16
    q, k, v, bias = (t.detach().to(dtype).requires_grad_() for t in make(B=B, T=T, H=H, Hkv=Hkv, D=D))
    padding = torch.zeros(B, T, dtype=torch.bool)
    padding[1, :50] = True
    with largest_tensor() as record:
        out = attention(q, k, v, bias=bias, key_padding_mask=padding, backend="reference")
        out.float().pow(2).sum().backward()
    assert record.largest < T * T, f"a tensor of {record.largest:,} elements (T·S = {T * T:,}) was built"
    assert bias.grad is not None and torch.isfinite(bias.grad).all()
    with largest_tensor() as record:  # a window as wide as the keys cuts none: no mask either
        attention(q, k, v, bias=bias, key_padding_mask=padding, keep_window=T, backend="reference")
    assert record.largest < T * T, f"a tensor of {record.largest:,} elements (T·S = {T * T:,}) was built"
    # The check can fail: a key window that cuts keys takes the written-out mask.
    with largest_tensor() as record:
        attention(q, k, v, bias=bias, key_padding_mask=padding, keep_window=8, backend="reference")
    assert record.largest >= B * H * T * T


@pytest.mark.parametrize("documents", [False, True])
def test_a_sliding_window_builds_nothing_larger_than_its_blocks(documents, largest_tensor):
    """A sliding window of ``w`` (no bias or padding) over ``T`` tokens: no tensor of ``T·T`` elements, forward or
    backward: the blocks' scores are ``T·2w`` a head, their keys and values ``2T·D`` (here each a quarter of ``T·T``
    at most, where the written-out mask is ``H·T·T``)."""
    B, T, H, w, D = 1, 384, 2, 16, 16
    q, k, v, _ = make(B=B, T=T, H=H, Hkv=1, D=D, bias=False)
    ids = torch.arange(T).div(100, rounding_mode="floor")[None] if documents else None  # documents of 100
    with largest_tensor() as record:
        attention(q, k, v, keep_window=w, document_ids=ids, backend="reference").pow(2).sum().backward()
    assert record.largest <= max(B * H * T * 2 * w, B * H * 2 * T * D) < T * T // 4, f"{record.largest:,} elements"


@pytest.mark.parametrize("case", ["bias", "padding only", "bias and padding, gqa", "non-causal", "one query (decoding)"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_bias_path_equals_the_written_out_mask(case, dtype):
    from zoo_kernels.attention.reference import attention_masked
    from zoo_kernels.attention.sdpa import attention_bias_sdpa

    T, S = (1, 37) if case == "one query (decoding)" else (37, 37)
    q, k, v, bias = make(B=3, T=T, S=S, H=4, Hkv=1 if "gqa" in case else 4, D=16, bias=case != "padding only",
                         dtype=torch.float32)
    padding = None
    if "padding" in case or case == "one query (decoding)":
        padding = torch.zeros(3, S, dtype=torch.bool)
        padding[0, :5], padding[1, -4:] = True, True  # left, right
        padding[2, :] = True  # a sequence with nothing to attend to: zeros, no NaN
    causal = case != "non-causal"
    heads = [t.detach().repeat_interleave(q.shape[2] // t.shape[2], dim=2).transpose(1, 2).to(dtype).requires_grad_()
             for t in (q, k, v)]  # [B, H, T|S, D]
    b = None if bias is None else bias.detach().to(dtype).requires_grad_()
    kw = dict(bias=b, causal=causal, key_padding_mask=padding, scale=0.25)
    got = attention_bias_sdpa(*heads, **kw)
    got_grads = grads(got, (*heads, b))
    want = attention_masked(*heads, keep_window=None, **kw)
    want_grads = grads(want, (*heads, b))
    assert all(torch.isfinite(g).all() for g in got_grads)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for g_got, g_want in zip(got_grads, want_grads):
            torch.testing.assert_close(g_got, g_want, rtol=1e-4, atol=1e-5)
        return
    # bf16: the two paths round differently, and how depends on the CPU's kernels (with AMX, SDPA's bf16 is not
    # the plain matmuls'), so each is held to the float64 truth of the same bf16 inputs, by flash-attention's rule:
    # the fused path's error at most twice the written-out path's, plus one bf16 step (2^-7) of the largest true
    # value. (On an AMX machine the fused bias gradient of "bias" is 0.061 off where the written-out one is 0.022:
    # 2 bf16 steps at its largest value, 7.8; a wrong term would be off by O(1).)
    leaves = [None if t is None else t.detach().double().requires_grad_() for t in (*heads, b)]
    exact = attention_masked(*leaves[:3], keep_window=None, **{**kw, "bias": leaves[3]})
    torch.manual_seed(1)
    weight = torch.randn(exact.shape, dtype=torch.bfloat16).double()  # grads()'s weight, in float64
    exact_grads = torch.autograd.grad((exact * weight).sum(), [t for t in leaves if t is not None])
    for name, g, w, e in zip(["out", "q", "k", "v", "bias"], (got, *got_grads), (want, *want_grads), (exact, *exact_grads)):
        err, err_masked = (g.double() - e).abs().max().item(), (w.double() - e).abs().max().item()
        assert err <= 2 * err_masked + 2 ** -7 * e.abs().max().item(), f"{name}: fused {err:.3g}, written-out {err_masked:.3g}"


def test_without_triton_auto_runs_the_reference_and_triton_is_named(monkeypatch):
    """Triton is an extra (CUDA builds of torch bring it): without it, auto falls back with a warning on CUDA."""
    import types

    from zoo_kernels import _backend

    monkeypatch.setattr(_backend, "triton_installed", lambda: False)
    cuda = types.SimpleNamespace(is_cuda=True, dtype=torch.float32)
    with pytest.warns(UserWarning, match=r"triton is not installed, so the plain-torch reference runs on CUDA"):
        assert _backend.resolve_backend("auto", cuda, op="attention", has_triton=True) == "reference"
    with pytest.raises(ImportError, match=r"backend='triton' needs the triton package: pip install \"hybrid-zoo\[gpu\]\""):
        _backend.resolve_backend("triton", cuda, op="attention", has_triton=True)


def test_a_bias_alone_wanting_a_gradient_takes_the_math_backend_where_the_fused_one_fails(monkeypatch):
    """On CUDA, torch's memory-efficient kernel fails the backward of a float mask that alone wants a gradient ("LSE is
    not correctly aligned" for one query, an illegal memory access at T 9 in fp16: an H200, 2026-12-04). The check
    holds there only; where it holds, the masked reference runs SDPA's math backend, with the same output and
    gradients (here on the CPU, the check patched on)."""
    from types import SimpleNamespace

    import zoo_kernels.attention.reference as reference

    cuda, cpu = torch.device("cuda"), torch.device("cpu")  # (stand-ins: the check reads a device and requires_grad)
    t = lambda device, grad: SimpleNamespace(device=device, requires_grad=grad)  # noqa: E731
    assert reference.fused_backward_fails(t(cuda, False), t(cuda, False), t(cuda, False), t(cuda, True))
    assert not reference.fused_backward_fails(t(cpu, False), t(cpu, False), t(cpu, False), t(cpu, True))
    for wanted in range(3):  # q, k or v wants one too: the kernel keeps its log-sum-exp
        assert not reference.fused_backward_fails(*(t(cuda, i == wanted) for i in range(3)), t(cuda, True))
    assert not reference.fused_backward_fails(t(cuda, False), t(cuda, False), t(cuda, False), t(cuda, False))
    with torch.no_grad():
        assert not reference.fused_backward_fails(t(cuda, False), t(cuda, False), t(cuda, False), t(cuda, True))

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 1, 2, 16), torch.randn(1, 9, 2, 16), torch.randn(1, 9, 2, 16)  # one query, 9 keys
    bias = torch.randn(1, 2, 9, requires_grad=True)
    want = attention(q, k, v, bias=bias, backend="reference")
    (want_grad,) = torch.autograd.grad(want.square().sum(), bias)
    entered, real = [], reference.sdpa_kernel
    monkeypatch.setattr(reference, "fused_backward_fails", lambda *a: True)
    monkeypatch.setattr(reference, "sdpa_kernel", lambda backends: entered.append(backends) or real(backends))
    got = attention(q, k, v, bias=bias, backend="reference")
    (grad,) = torch.autograd.grad(got.square().sum(), bias)
    assert entered == [reference.SDPBackend.MATH]
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-6)
