"""The split-K decoding kernel (zoo_kernels/attention/decode.py) against the reference: one query per sequence and
head, odd cache lengths, GQA, a bias, padding, the key window, several splits merged, in fp32 and fp16 under the
interpreter on CPU (on CUDA when there is one) — and which calls reach it."""

import pytest
import torch

from zoo_kernels.attention import attention
from zoo_kernels.attention import decode as attention_decode
from zoo_kernels.attention.decode import attention_decode_triton, merge_splits

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def step_inputs(B, S, H, H_kv, D, *, bias=True, padding=True, dtype=torch.float32):
    torch.manual_seed(0)
    q = torch.randn(B, 1, H, D, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(B, S, H_kv, D, device=DEVICE, dtype=dtype) for _ in range(2))
    b = (2 * torch.randn(B, H, S, device=DEVICE)).to(dtype) if bias else None
    pad = None
    if padding:
        pad = torch.zeros(B, S, dtype=torch.bool, device=DEVICE)
        pad[-1, : S // 3] = True  # a left-padded prompt: whole splits of it see nothing
        pad[0, S // 2] = True
    return q, k, v, b, pad


def reference(q, k, v, bias, pad, window):
    return attention(q, k, v, bias=bias, causal=True, key_padding_mask=pad, keep_window=window, backend="reference")


@pytest.mark.parametrize("S", [1, 37, 161])
@pytest.mark.parametrize("H, H_kv", [(4, 4), (6, 2)])
@pytest.mark.parametrize("window", [None, 5, 500])
@pytest.mark.parametrize("with_bias", [True, False])
def test_a_decoding_step_matches_the_reference(S, H, H_kv, window, with_bias):
    q, k, v, b, pad = step_inputs(3, S, H, H_kv, 24, bias=with_bias)
    want = reference(q, k, v, b, pad, window)
    for splits in (1, 3, 64):  # one program a key head; a few; more than the key blocks (one a block)
        got = attention_decode_triton(q, k, v, bias=b, key_padding_mask=pad, keep_window=window, scale=24 ** -0.5,
                                      splits=splits)
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


def test_a_sequence_with_no_key_returns_zeros_and_an_empty_split_weighs_nothing():
    q, k, v, b, pad = step_inputs(2, 70, 2, 1, 16)
    pad[0] = True  # every key padding
    pad[1, :48] = True  # the first three of five 16-key splits see nothing
    got = attention_decode_triton(q, k, v, bias=b, key_padding_mask=pad, scale=0.25, splits=5)
    assert torch.equal(got[0], torch.zeros_like(got[0]))
    torch.testing.assert_close(got, reference(q, k, v, b, pad, None), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("offset", [0.0, 200.0])
def test_merging_splits_is_the_softmax_over_all_their_keys(offset):
    """``merge_splits`` alone, on partials computed here: the split-wise maxima, sums and weighted values of a
    row of scores give its softmax average, an all-masked split included; scores far above exp's fp32 range
    (``offset``, a large bias) included."""
    torch.manual_seed(1)
    scores, values = torch.randn(12) + offset, torch.randn(12, 5)
    scores[4:8] = float("-inf")  # the second split allows nothing
    m, l, acc = [], [], []
    for part in range(3):
        s, val = scores[4 * part:4 * part + 4], values[4 * part:4 * part + 4]
        top = s.max()
        e = torch.exp(s - (top if top > float("-inf") else 0.0))
        m.append(top), l.append(e.sum()), acc.append(e @ val)
    got = merge_splits(torch.stack(m)[None, None], torch.stack(l)[None, None], torch.stack(acc)[None, None])
    torch.testing.assert_close(got[0, 0], scores.softmax(0) @ values)


def test_fp16_with_the_gpu_tiles(monkeypatch):
    """CUDA's tiles (32 keys a step, the group's 4 query heads padded to 16 rows) at head dim 128, in fp16 under the
    interpreter (bf16 does not run there): within fp16 rounding of the fp32 reference, no worse than the plain-torch
    computation in fp16 by more than twice."""
    gpu_config = attention_decode.decode_config
    monkeypatch.setattr(attention_decode, "decode_config",
                        lambda head_dim, group, cuda, dtype: gpu_config(head_dim, group, True, torch.bfloat16))
    q, k, v, b, pad = step_inputs(2, 300, 8, 2, 128, dtype=torch.float16)
    want = reference(*(t.float() if t is not None and t.is_floating_point() else t for t in (q, k, v, b, pad)), 40)
    low = reference(q, k, v, b, pad, 40).float()
    got = attention_decode_triton(q, k, v, bias=b, key_padding_mask=pad, keep_window=40, scale=128 ** -0.5,
                                  splits=3).float()
    assert attention_decode.decode_config(128, 4, False, torch.float16)["BLOCK_N"] == 32
    assert (got - want).abs().max() <= 2 * (low - want).abs().max() + 1e-5


def test_strided_queries_keys_and_values_are_read_in_place():
    """q, k and v split from one projection (views with a wide row) give the contiguous tensors' result."""
    torch.manual_seed(0)
    B, S, H, D = 2, 45, 2, 16
    fused = torch.randn(B, S, 3 * H * D, device=DEVICE)
    q, k, v = (t.view(B, S, H, D) for t in fused.split(H * D, dim=-1))
    q = q[:, -1:]  # [B, 1, H, D], row stride 3·H·D
    got = attention_decode_triton(q, k, v, scale=0.25, splits=2)
    want = attention_decode_triton(q.contiguous(), k.contiguous(), v.contiguous(), scale=0.25, splits=2)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_triton_backend_sends_a_step_without_gradients_here_and_one_with_them_to_the_flash_kernel(monkeypatch):
    calls = []
    kernel = attention_decode.attention_decode_triton
    monkeypatch.setattr(attention_decode, "attention_decode_triton", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    q, k, v, b, pad = step_inputs(2, 33, 4, 2, 16)
    with torch.no_grad():
        got = attention(q, k, v, bias=b, key_padding_mask=pad, keep_window=9, backend="triton")
    assert calls == [1]
    torch.testing.assert_close(got, reference(q, k, v, b, pad, 9), rtol=2e-5, atol=2e-5)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, b)]
    out = attention(*leaves[:3], bias=leaves[3], key_padding_mask=pad, backend="triton")
    assert calls == [1]  # the flash kernel: it has a backward
    grads = torch.autograd.grad(out.sum(), leaves)
    twins = [t.clone().requires_grad_() for t in (q, k, v, b)]
    want = torch.autograd.grad(reference(*twins[:3], twins[3], pad, None).sum(), twins)
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_a_fullgraph_compile_through_the_kernel_equals_eager():
    q, k, v, b, pad = step_inputs(2, 40, 4, 2, 16)
    for splits in (2, None):  # None: chosen inside the op, out of the compiler's sight
        call = lambda q, k, v, b: attention_decode_triton(q, k, v, bias=b, key_padding_mask=pad, scale=0.25,  # noqa: E731
                                                          splits=splits)
        compiled = torch.compile(call, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(compiled(q, k, v, b), call(q, k, v, b), rtol=0, atol=0)


def test_a_model_built_with_the_triton_backend_decodes_through_the_kernel_as_with_the_reference(monkeypatch):
    """End to end: the prompt through the flash kernel, each step through the split-K kernel (GQA, left padding),
    the same tokens as the same weights on the reference backend."""
    from functools import partial

    from components import HybridLM, QCAttention

    calls = []
    kernel = attention_decode.attention_decode_triton
    monkeypatch.setattr(attention_decode, "attention_decode_triton", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    models = {}
    for backend in ("triton", "reference"):
        torch.manual_seed(0)
        models[backend] = HybridLM(61, 32, "AM AM", {"A": partial(QCAttention, n_heads=4, n_kv_heads=2,
                                                                    backend=backend)}).to(DEVICE)
    models["triton"].load_state_dict(models["reference"].state_dict())
    mask = torch.zeros(2, 7, dtype=torch.bool, device=DEVICE)
    mask[1, :3] = True
    prompt = torch.randint(1, 61, (2, 7)).to(DEVICE).masked_fill(mask, 0)
    got = models["triton"].generate(prompt, 5, padding_mask=mask)
    assert len(calls) == 2 * 4  # two layers, four steps (the last token is not fed back)
    assert torch.equal(got, models["reference"].generate(prompt, 5, padding_mask=mask))


def test_the_tiles_and_splits_are_those_the_docstrings_give(monkeypatch):
    """The interpreter's tiles, CUDA's for fp32 and for 16-bit (the group's query heads padded to 16 rows); splits
    that fill the GPU twice over without a split of less than one key block (up to 4 on a CPU)."""
    from types import SimpleNamespace

    decode_config, decode_splits = attention_decode.decode_config, attention_decode.decode_splits
    tiles = lambda c: (c["BLOCK_G"], c["BLOCK_N"], c["BLOCK_D"], c["num_warps"], c["num_stages"])  # noqa: E731
    assert tiles(decode_config(64, 4, False, torch.float32)) == (16, 16, 64, 4, 1)
    assert tiles(decode_config(24, 32, False, torch.float16)) == (32, 16, 32, 4, 1)
    assert tiles(decode_config(128, 4, True, torch.float32)) == (16, 16, 128, 4, 3)
    assert tiles(decode_config(128, 4, True, torch.bfloat16)) == (16, 32, 128, 8, 3)
    cpu = torch.device("cpu")
    assert [decode_splits(b, 1, 100, 16, cpu) for b in (1, 2, 3, 4, 8)] == [4, 2, 2, 1, 1]
    assert decode_splits(1, 1, 20, 16, cpu) == 2  # two key blocks: two splits at most
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(multi_processor_count=132))
    gpu = torch.device("cuda", 0)
    assert [decode_splits(b, 8, 4096, 32, gpu) for b in (1, 8, 33, 64)] == [33, 5, 1, 1]
    assert decode_splits(1, 1, 64, 32, gpu) == 2


@pytest.mark.parametrize("window", [None, 5])
def test_the_custom_op_shape_function_passes_torchs_opcheck(window):
    """The decoding op's fake (shape) function gives what the kernel gives (``[B, 1, H, D]`` in q's layout), so a
    compiled decoding step traces it right; a bias, padding and GQA, with and without a window."""
    q, k, v, b, pad = step_inputs(2, 37, 6, 2, 16)
    args = (q, k, v, b, pad, 16 ** -0.5, window, None)
    assert set(torch.library.opcheck(torch.ops.hybrid_zoo.bias_attention_decode.default, args).values()) == {"SUCCESS"}
