"""The Triton flash attention with key bias against the reference: outputs and every gradient
(q, k, v, bias), in fp32 under the interpreter on CPU."""

import importlib

import pytest
import torch

from zoo_kernels.attention import attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CASES = {  # name: (B, T, S, H, Hkv, D, causal, bias, padding)
    "T=1 decode step": (1, 1, 17, 2, 1, 16, True, True, False),
    "T=17 causal bias": (1, 17, 17, 2, 2, 16, True, True, False),
    "T=17 non-causal, D=12": (2, 17, 17, 2, 2, 12, False, True, False),
    "T=33 gqa 4:1 padding": (2, 33, 33, 4, 1, 8, True, True, True),
    "T=20 S=37 no bias": (1, 20, 37, 2, 2, 16, True, False, False),
    "T=65 causal bias": (1, 65, 65, 1, 1, 16, True, True, False),
}


def inputs(B, T, S, H, Hkv, D, bias, padding):
    torch.manual_seed(0)
    q = torch.randn(B, T, H, D, device=DEVICE, requires_grad=True)
    k = torch.randn(B, S, Hkv, D, device=DEVICE, requires_grad=True)
    v = torch.randn(B, S, Hkv, D, device=DEVICE, requires_grad=True)
    b = (2 * torch.randn(B, H, S, device=DEVICE)).requires_grad_() if bias else None
    pad = None
    if padding:
        pad = torch.zeros(B, S, dtype=torch.bool, device=DEVICE)
        pad[0, :5] = True  # left padding: early queries of sequence 0 see no key at all
        pad[-1, S // 2] = True
    return q, k, v, b, pad


def assert_triton_matches_reference(q, k, v, bias, **kwargs):
    """Outputs (2e-5) and the gradients of q, k, v and the bias (1e-4) of the Triton kernel against the
    reference, for one set of ``attention`` arguments."""
    out = attention(q, k, v, bias=bias, **kwargs, backend="triton")
    ref = attention(q, k, v, bias=bias, **kwargs, backend="reference")
    torch.testing.assert_close(out, ref, rtol=2e-5, atol=2e-5)
    g = torch.randn_like(out)
    tensors = [t for t in (q, k, v, bias) if t is not None]
    for n, got, want in zip(["q", "k", "v", "bias"], torch.autograd.grad(out, tensors, g), torch.autograd.grad(ref, tensors, g)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m: f"gradient of {n}: {m}")


@pytest.mark.parametrize("name", CASES)
def test_triton_matches_reference_outputs_and_gradients(name):
    B, T, S, H, Hkv, D, causal, bias, padding = CASES[name]
    q, k, v, b, pad = inputs(B, T, S, H, Hkv, D, bias, padding)
    assert_triton_matches_reference(q, k, v, b, causal=causal, key_padding_mask=pad)


def test_bias_gradient_is_deterministic():
    q, k, v, b, _ = inputs(1, 33, 33, 2, 2, 16, True, False)
    b = torch.randn(1, 2, 33, device=DEVICE, requires_grad=True)
    g = torch.randn(1, 33, 2, 16, device=DEVICE)
    first, second = (torch.autograd.grad(attention(q, k, v, bias=b, backend="triton"), [b], g)[0] for _ in range(2))
    assert torch.equal(first, second)


WINDOW_CASES = {  # name: (B, T, S, H, causal, bias kind, padding, keep_window, document lengths)
    "causal, distinct biases, w=3": (2, 19, 19, 2, True, "randn", False, 3, None),
    "causal, tied biases, padding, w=4": (2, 23, 23, 2, True, "ties", True, 4, None),
    "no bias: sliding window of 5": (1, 21, 21, 2, True, None, False, 5, None),
    # several 16-row tiles and 32-row dK/dV steps: the sliding window's loop bounds cut blocks on both sides
    "no bias, T<S, padding, w=9": (1, 40, 70, 2, True, None, True, 9, None),
    "no bias, non-causal, padding, w=6": (2, 37, 45, 2, False, None, True, 6, None),
    "T<S decode, w=2": (2, 6, 17, 2, True, "ties", True, 2, None),
    "non-causal, tied, w=7": (2, 13, 15, 2, False, "ties", True, 7, None),
    "w larger than S": (1, 9, 9, 2, True, "randn", False, 50, None),
    # documents of 7, 1, 13 and 8 cross the threshold blocks of 4 and the kernel's 16-row tiles
    "documents, distinct biases, w=3": (2, 29, 29, 2, True, "randn", False, 3, [7, 1, 13, 8]),
    "documents, tied biases, padding, w=4": (2, 23, 23, 2, True, "ties", True, 4, [5, 11, 7]),
    "documents, no bias, w=2": (1, 21, 21, 2, True, None, False, 2, [2, 6, 13]),
    "documents, non-causal, padding, w=2": (1, 19, 19, 2, False, "randn", True, 2, [9, 10]),
}


def document_ids(lengths, B):
    """``[B, T]`` ids 0, 1, … per document of ``lengths``, or None."""
    if lengths is None:
        return None
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(DEVICE).expand(B, -1)


def window_inputs(B, T, S, H, bias_kind, padding):
    g = torch.Generator().manual_seed(T * S + H)
    if bias_kind == "randn":
        bias = torch.randn(B, H, S, generator=g)
    elif bias_kind == "ties":  # few distinct values: the tie-break to the most recent key decides
        bias = torch.randint(0, 3, (B, H, S), generator=g).float()
    else:
        bias = None
    pad = None
    if padding:
        pad = torch.rand(B, S, generator=g) < 0.25
        pad[0, :3] = True
    return (bias.to(DEVICE) if bias is not None else None), (pad.to(DEVICE) if pad is not None else None)


@pytest.mark.parametrize("name", WINDOW_CASES)
def test_window_thresholds_keep_exactly_the_reference_selection(name):
    from zoo_kernels.attention.reference import allowed_keys, select_window
    from zoo_kernels.attention.window import window_thresholds

    B, T, S, H, causal, bias_kind, padding, w, lengths = WINDOW_CASES[name]
    bias, pad = window_inputs(B, T, S, H, bias_kind, padding)
    ids = document_ids(lengths, B)
    allowed = allowed_keys(T, S, causal=causal, key_padding_mask=pad, device=DEVICE)  # [B|1, 1, T, S]
    if ids is not None:
        allowed = allowed & (ids[:, None, :, None] == ids[:, None, None, :])  # [B, 1, T, S]
    want = select_window(allowed, bias, w).expand(B, H, T, S)
    # block=4 walks the queries in many blocks: the carried best keys are what is under test
    tau_bias, tau_pos = window_thresholds(bias, pad, batch=B, heads=H, T=T, S=S, causal=causal, keep_window=w,
                                          device=torch.device(DEVICE), document_ids=ids, block=4)
    key_bias = bias[:, :, None, :] if bias is not None else torch.zeros(1, 1, 1, S, device=DEVICE)
    j = torch.arange(S, device=DEVICE)
    kept = allowed & ((key_bias > tau_bias[..., None]) | ((key_bias == tau_bias[..., None]) & (j >= tau_pos[..., None])))
    assert torch.equal(kept, want)


@pytest.mark.parametrize("name", WINDOW_CASES)
def test_triton_keep_window_matches_reference_outputs_and_gradients(name):
    B, T, S, H, causal, bias_kind, padding, w, lengths = WINDOW_CASES[name]
    bias, pad = window_inputs(B, T, S, H, bias_kind, padding)
    torch.manual_seed(0)
    q = torch.randn(B, T, H, 16, device=DEVICE, requires_grad=True)
    k, v = (torch.randn(B, S, 1, 16, device=DEVICE, requires_grad=True) for _ in range(2))
    bias = bias.requires_grad_() if bias is not None else None
    assert_triton_matches_reference(q, k, v, bias, causal=causal, key_padding_mask=pad, keep_window=w,
                                    document_ids=document_ids(lengths, B))


@pytest.mark.skipif(DEVICE == "cuda", reason="the poisoned block is the interpreter's 16-row tile; CUDA's are 64-128 rows")
@pytest.mark.parametrize("padding", [False, True])
def test_a_sliding_window_never_reads_the_key_blocks_before_its_oldest_kept_key(padding):
    """Without a bias a window keeps each query's ``w`` most recent keys, so the forward and the dQ loop start at
    the block of the query block's oldest kept key. Checked by poisoning the first key block with NaN: a block that
    is read, even fully masked, turns its rows NaN (0 · NaN in ``p @ v``), so the query blocks that start past it
    must come out equal to the reference on clean keys, and their dQ too."""
    B, T, H, D, w, tile = 1, 67, 2, 16, 5, 16  # the interpreter's 16-row tiles (launch_config on CPU)
    torch.manual_seed(0)
    q = torch.randn(B, T, H, D, device=DEVICE, requires_grad=True)
    k, v = (torch.randn(B, T, 1, D, device=DEVICE) for _ in range(2))
    pad = None
    if padding:  # a padded key inside the window moves the thresholds back, never past the poisoned block
        pad = torch.zeros(B, T, dtype=torch.bool, device=DEVICE)
        pad[0, [20, 41, 42]] = True
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k[:, :tile], poisoned_v[:, :tile] = float("nan"), float("nan")
    # check_finite=False: the kernel itself must not read them (the default would put their causal reach back as NaN)
    out = attention(q, poisoned_k, poisoned_v, key_padding_mask=pad, keep_window=w, backend="triton",
                    check_finite=False)
    ref = attention(q, k, v, key_padding_mask=pad, keep_window=w, backend="reference")
    start = 2 * tile  # rows 32 on: their oldest kept key (≥ 27) lies past the first block
    assert out[:, :tile + w - 1].isnan().any()  # the rows that keep poisoned keys do read them
    torch.testing.assert_close(out[:, start:], ref[:, start:], rtol=2e-5, atol=2e-5)
    g = torch.zeros_like(out)
    g[:, start:] = torch.randn_like(g[:, start:])
    (got,), (want,) = (torch.autograd.grad(o, [q], g) for o in (out, ref))
    torch.testing.assert_close(got[:, start:], want[:, start:], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(DEVICE == "cuda", reason="the poisoned block is the interpreter's 16-row tile; CUDA's are 64-128 rows")
@pytest.mark.parametrize("causal", [True, False])
def test_a_sliding_window_s_key_gradients_never_read_the_rows_past_the_last_that_keeps_them(causal):
    """The dK/dV loop of a key block ends at the last row that keeps one of its keys (without a bias the thresholds
    never decrease along the rows). Checked by poisoning the output gradient of the late rows with NaN: a row that
    is read turns the block's dK and dV NaN (0 · NaN in ``pᵀ dO``), so the first block's must equal the reference's
    with those rows' gradient zero — which is what it is, since they keep none of its keys."""
    # w = 17: row 31 keeps key 15 and row 32 does not, so the rows keeping the first block end exactly at the
    # dK/dV kernel's 32-row step; a search one row off would read the poisoned step.
    B, T, H, D, w, tile = 1, 67, 2, 16, 17, 16
    torch.manual_seed(1)
    q, k, v = (torch.randn(B, T, H, D, device=DEVICE, requires_grad=True) for _ in range(3))
    pad = torch.zeros(B, T, dtype=torch.bool, device=DEVICE)
    pad[0, [45, 50]] = True
    out = attention(q, k, v, causal=causal, key_padding_mask=pad, keep_window=w, backend="triton", check_finite=False)
    ref = attention(q, k, v, causal=causal, key_padding_mask=pad, keep_window=w, backend="reference")
    g = torch.randn_like(out)
    g_clean = g.clone()
    start = 2 * tile if causal else 0  # without causality every row keeps the last w keys, none of the first block
    g[:, start:], g_clean[:, start:] = float("nan"), 0.0
    got, want = (torch.autograd.grad(o, [k, v], grad) for o, grad in ((out, g), (ref, g_clean)))
    for n, a, b in zip("kv", got, want):
        torch.testing.assert_close(a[:, :tile], b[:, :tile], rtol=1e-4, atol=1e-4, msg=lambda m: f"d{n}: {m}")


def test_triton_on_cpu_without_the_interpreter_says_so(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.randn(1, 4, 2, 16)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        attention(q, q, q, backend="triton")


@pytest.mark.parametrize("kernel, rows, T, S, what", [("forward", "BLOCK_M", 65_536, 8, "queries"),
                                                      ("backward_kv", "BLOCK_N", 8, 65_536, "keys")])
def test_more_blocks_than_a_grid_axis_holds_is_refused_by_name(monkeypatch, kernel, rows, T, S, what):
    """CUDA launches at most 65,535 blocks along the axis the kernels put the query (or key) blocks on: past it the
    launch fails deep inside the driver. Tiles of one row here, so that a few MB reach the limit on a CPU."""
    import zoo_kernels.attention.triton as fused

    tiles = fused.launch_config(16, False, torch.float32)
    monkeypatch.setattr(fused, "launch_config", lambda *args: {**tiles, kernel: {**tiles[kernel], rows: 1}})
    q, k = torch.zeros(1, T, 1, 16), torch.zeros(1, S, 1, 16)
    with pytest.raises(ValueError, match=f"attention: backend='triton' takes at most 65,535 blocks of 1 {what}; got "
                                         f"T={T:,}, S={S:,}"):
        fused._prepared(q, k, k, None, None, None, False, None)
    fused._prepared(q[:, :65_535], k[:, :65_535], k[:, :65_535], None, None, None, False, None)  # the most it holds


@pytest.mark.parametrize("bias, padding", [(True, False), (False, True)], ids=["bias", "padding"])
def test_triton_with_packed_documents_matches_reference_outputs_and_gradients(bias, padding):
    """``document_ids`` compared per tile; documents of 7, 1, 13 and 8 cross the 16-row tiles."""
    q, k, v, b, pad = inputs(2, 29, 29, 4, 2, 16, bias, padding)
    assert_triton_matches_reference(q, k, v, b, key_padding_mask=pad, document_ids=document_ids([7, 1, 13, 8], 2))
    # an id that comes back after another is a new document (the run numbers of document_runs)
    again = torch.tensor([0] * 7 + [1] * 9 + [0] * 13, device=DEVICE).expand(2, -1)
    assert_triton_matches_reference(q, k, v, b, key_padding_mask=pad, document_ids=again)


@pytest.mark.parametrize("lengths", [[33, 14, 17], [16, 1, 30, 16, 1], [64]])
def test_documents_on_the_edges_of_the_skipped_blocks(lengths):
    """With documents the kernels start each query block's key loop at its first document's start and stop each
    key block's query loop at its last key's document end: documents ending one row into a 32-row dK/dV step
    (33), starting on a 16-row tile edge (16, 47), of one token, and one document spanning everything."""
    T = sum(lengths)
    q, k, v, b, _ = inputs(2, T, T, 2, 1, 16, True, False)
    ids = document_ids(lengths, 2)
    assert_triton_matches_reference(q, k, v, b, causal=True, document_ids=ids)


@pytest.mark.parametrize("layout", ["one projection", "transposed q"])
def test_strided_queries_keys_and_values_are_read_in_place_and_match_the_reference(monkeypatch, layout):
    """q, k and v split from one projection (``[B, T, H + 2·Hkv, D]``, rows of (H + 2·Hkv)·D), or a transposed q:
    the forward reads all three through their strides, the backward k and v (q is copied there: dO and dQ are
    addressed with its strides), and the outputs and gradients are the reference's."""
    torch.manual_seed(0)
    B, T, H, Hkv, D = 2, 19, 4, 2, 16
    qkv = torch.randn(B, T, H + 2 * Hkv, D, device=DEVICE, requires_grad=True)
    q, k, v = qkv.split([H, Hkv, Hkv], dim=2)  # views: [B, T, H|Hkv, D], stride over t (H + 2·Hkv)·D
    leaves = [qkv]
    if layout == "transposed q":
        q = torch.randn(B, H, T, D, device=DEVICE).transpose(1, 2).requires_grad_()  # [B, T, H, D], heads outermost
        leaves = [q, qkv]
    assert not q.is_contiguous() and not k.is_contiguous() and not v.is_contiguous()
    bias = torch.randn(B, H, T, device=DEVICE, requires_grad=True)
    copied = []
    contiguous = torch.Tensor.contiguous
    def recorded(t, *args, **kwargs):
        if not t.is_contiguous():
            copied.append(tuple(t.shape))
        return contiguous(t, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "contiguous", recorded)
    out = attention(q, k, v, bias=bias, backend="triton")
    assert copied == [], f"copied: {copied}"  # the forward copies no operand
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, [*leaves, bias], g)
    assert copied == [(B, T, H, D)]  # the backward copies q alone (dO and dQ take its strides)
    monkeypatch.undo()
    ref = attention(q, k, v, bias=bias, backend="reference")
    torch.testing.assert_close(out, ref, rtol=2e-5, atol=2e-5)
    for i, (got, want) in enumerate(zip(grads, torch.autograd.grad(ref, [*leaves, bias], g))):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m: f"gradient {i}: {m}")


@pytest.mark.parametrize("window", [None, 5])
def test_a_fullgraph_compile_through_the_kernel_equals_eager(window, compiled_equals_eager):
    """The kernel is a torch.library op (hybrid_zoo::bias_attention, and its backward), opaque to torch.compile:
    traced as an autograd.Function, the wrapper's host-side settings broke the graph."""
    q, k, v, b, pad = inputs(2, 19, 19, 4, 2, 16, True, True)
    call = lambda q, k, v, b: attention(q, k, v, bias=b, key_padding_mask=pad, keep_window=window,  # noqa: E731
                                        backend="triton")
    compiled_equals_eager(call, [q, k, v, b])


@pytest.mark.parametrize("arch, options", [(90, "documents"), (90, "window"), (80, "documents"), (80, "window")])
def test_the_gpu_tiles_under_the_interpreter(arch, options, monkeypatch):
    """The tiles CUDA takes in bf16 (64×64 on sm_90, 32×64 before it; 32 query rows per dK/dV step) differ from the
    interpreter's 16×16: run them here too, in fp32, over several tiles with a bias, padding, GQA and packed documents
    or a key window, against the reference on outputs and every gradient."""
    from zoo_kernels.attention import triton as attention_triton

    gpu_config = attention_triton.launch_config
    monkeypatch.setattr(attention_triton, "launch_config",
                        lambda head_dim, cuda, dtype=None, dot="ieee", arch_=90: gpu_config(head_dim, True, torch.bfloat16,
                                                                                            dot, arch))
    assert attention_triton.launch_config(16, False)["forward"]["BLOCK_N"] == 64
    q, k, v, b, pad = inputs(2, 150, 150, 4, 2, 16, True, True)
    if options == "documents":
        assert_triton_matches_reference(q, k, v, b, causal=True, key_padding_mask=pad,
                                        document_ids=document_ids([40, 1, 70, 39], 2))
    else:
        assert_triton_matches_reference(q, k, v, b, causal=True, key_padding_mask=pad, keep_window=37)


def test_the_fp32_tiles_of_the_widest_heads_under_the_interpreter(monkeypatch):
    """Above head dim 128 in fp32 a GPU takes 16×32 tiles, 16 query rows per dK/dV step, one stage (what fits a
    consumer GPU's shared memory as launched: recipes.benchmarks.compile_check --aligned). Their row and key steps,
    at this test's head dim, over several tiles with a bias, padding, GQA and packed documents, against the reference
    on outputs and every gradient."""
    from zoo_kernels.attention import triton as attention_triton

    gpu_config = attention_triton.launch_config
    wide = {part: {**tiles, "BLOCK_D": 16} for part, tiles in gpu_config(256, True, torch.float32, "ieee", 86).items()}
    assert (wide["forward"]["BLOCK_M"], wide["forward"]["BLOCK_N"], wide["backward_kv"]["BLOCK_M"]) == (16, 32, 16)
    monkeypatch.setattr(attention_triton, "launch_config", lambda *args, **kwargs: wide)
    q, k, v, b, pad = inputs(2, 150, 150, 4, 2, 16, True, True)
    assert_triton_matches_reference(q, k, v, b, causal=True, key_padding_mask=pad,
                                    document_ids=document_ids([40, 1, 70, 39], 2))


def _tiles(config: dict) -> tuple:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` of each kernel, forward, dQ, dK/dV."""
    return tuple((c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"])
                 for c in (config["forward"], config["backward_q"], config["backward_kv"]))


@pytest.mark.parametrize("head_dim, dtype, dot, arch, want", [
    # Hopper, bf16/fp16 up to D 128 (the H200 search): 64×64 forward, 4 warps, 3 stages
    (64, torch.bfloat16, "ieee", 90, ((64, 64, 4, 3), (64, 32, 4, 3), (32, 64, 4, 3))),
    (16, torch.float16, "ieee", 90, ((64, 64, 4, 3), (64, 32, 4, 3), (32, 64, 4, 3))),
    (80, torch.bfloat16, "ieee", 90, ((64, 64, 4, 3), (64, 32, 8, 3), (32, 64, 8, 2))),  # the backward spills at 4
    (128, torch.bfloat16, "ieee", 90, ((64, 64, 4, 3), (64, 32, 8, 3), (32, 64, 8, 2))),
    # before Hopper, up to D 128: 32×64, 8 warps
    (128, torch.bfloat16, "ieee", 89, ((32, 64, 8, 3), (32, 64, 8, 3), (32, 64, 8, 3))),
    (64, torch.bfloat16, "ieee", 80, ((32, 64, 8, 3), (32, 64, 8, 3), (32, 64, 8, 3))),
    # head dims above 128 (256-wide tiles), bf16/fp16, any arch: 32×32
    (129, torch.bfloat16, "ieee", 90, ((32, 32, 8, 3), (32, 32, 8, 3), (32, 32, 8, 3))),
    (256, torch.float16, "ieee", 80, ((32, 32, 8, 3), (32, 32, 8, 3), (32, 32, 8, 3))),
    # fp32: 32×32, 8 warps with full-fp32 dots, 4 with TF32; above D 128 16×32, 1 stage
    (128, torch.float32, "ieee", 90, ((32, 32, 8, 2), (32, 32, 8, 2), (32, 32, 8, 2))),
    (64, torch.float32, "tf32", 90, ((32, 32, 4, 2), (32, 32, 4, 2), (32, 32, 4, 2))),
    (256, torch.float32, "ieee", 90, ((16, 32, 8, 1), (16, 32, 8, 1), (16, 32, 8, 1))),
])
def test_the_gpu_launch_settings_are_the_documented_ones(head_dim, dtype, dot, arch, want):
    """``launch_config``'s GPU table, searched and checked for spills on GPUs (docs/kernels.md): no CPU test launches
    it (the interpreter takes its own small tiles), so a changed entry would pass every other test here."""
    from zoo_kernels.attention.triton import launch_config

    config = launch_config(head_dim, True, dtype, dot, arch)
    assert _tiles(config) == want
    block_d = {c["BLOCK_D"] for c in config.values()}
    assert block_d == {max(16, 1 << (head_dim - 1).bit_length())}  # the head dim's power of two, 16 at least
    assert _tiles(launch_config(head_dim, False, dtype, dot, arch)) == ((16, 16, 4, 1), (16, 16, 4, 1), (32, 16, 4, 1))


@pytest.mark.parametrize("keep_window", [None, 3], ids=["no window", "window 3"])
@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
def test_the_custom_ops_shape_functions_and_autograd_pass_torchs_opcheck(keep_window, bias):
    """Their fake (shape) functions give what the kernels give — the window's selection outputs only with a window,
    the bias gradient only with a bias — so torch.compile traces the attention right."""
    importlib.import_module("zoo_kernels.attention.triton")  # registers the ops

    torch.manual_seed(0)
    B, T, H, D = 1, 5, 2, 16
    q, k, v = (torch.randn(B, T, H, D, device=DEVICE, requires_grad=True) for _ in range(3))
    b = torch.randn(B, H, T, device=DEVICE, requires_grad=True) if bias else None
    forward = (q, k, v, b, None, None, True, D ** -0.5, keep_window)
    assert set(torch.library.opcheck(torch.ops.hybrid_zoo.bias_attention.default, forward).values()) == {"SUCCESS"}
    o, lse, win_b, win_j = torch.ops.hybrid_zoo.bias_attention(*(t.detach() if torch.is_tensor(t) else t for t in forward))
    assert win_b.shape == ((B, H, T) if keep_window else (0,))
    backward = (torch.randn(B, T, H, D, device=DEVICE), q.detach(), k.detach(), v.detach(),
                None if b is None else b.detach(), None, None, o, lse, win_b, win_j, True, D ** -0.5, keep_window)
    assert set(torch.library.opcheck(torch.ops.hybrid_zoo.bias_attention_backward.default, backward).values()) == {
        "SUCCESS"}


def test_a_one_token_query_that_needs_a_gradient_takes_the_kernel_with_a_backward():
    """A one-query call goes to the decoding kernel (which has no backward) only when no gradient is wanted: here only
    the query wants one, or only the bias."""
    q, k, v, bias, _ = inputs(1, 1, 9, 2, 1, 16, True, False)
    for wanted in (q, bias):
        for t in (q, k, v, bias):
            t.requires_grad_(t is wanted)
        out, ref = (attention(q, k, v, bias=bias, backend=backend) for backend in ("triton", "reference"))
        torch.testing.assert_close(out, ref, rtol=2e-5, atol=2e-5)
        g = torch.randn_like(out)
        torch.testing.assert_close(torch.autograd.grad(out, wanted, g)[0], torch.autograd.grad(ref, wanted, g)[0],
                                   rtol=1e-4, atol=1e-4)


def test_document_spans_give_each_positions_document_start_and_end():
    """What the kernels' loops over keys (forward, dQ) and queries (dK/dV) start and stop at: a span too wide only
    costs work, so no comparison of outputs would notice it."""
    from zoo_kernels.attention.triton import document_spans

    runs = torch.tensor([[0, 0, 1, 1, 1, 2], [0, 1, 2, 3, 4, 5]])
    spans = document_spans(runs)
    assert spans.dtype == torch.int32 and spans.shape == (2, 18)
    assert spans[0].tolist() == [0, 0, 1, 1, 1, 2] + [0, 0, 2, 2, 2, 5] + [2, 2, 5, 5, 5, 6]
    assert spans[1].tolist() == list(range(6)) + list(range(6)) + list(range(1, 7))


def _last_row_keeping_probe():
    """A one-line kernel around ``_last_row_keeping``: program ``i`` searches for ``last_key = i - 1``."""
    import triton
    import triton.language as tl

    from zoo_kernels.attention.triton_kernels import _last_row_keeping

    globals()["_last_row_keeping"] = _last_row_keeping  # a jitted function finds what it calls in its module's globals

    @triton.jit
    def probe(WIN_J, OUT, lo, T):
        i = tl.program_id(0)
        tl.store(OUT + i, _last_row_keeping(WIN_J, tl.program_id(1), lo, T, i - 1))

    return probe


def test_the_sliding_windows_row_search_ends_at_the_first_row_past_the_key():
    """Where the dK/dV kernel stops over the query rows for a block of keys (a sliding window, no bias): the first row
    at or after ``lo`` whose threshold position is past the block's last key. A row whose threshold is that key keeps
    it; an end too early would drop its gradient, one too late only costs work."""
    thresholds = [-1, -1, 0, 2, 2, 3, 5, 5, 8]  # never decreasing along the rows, as a window's are
    T = len(thresholds)
    win_j = torch.tensor(thresholds + [-7] * 4, dtype=torch.int32, device=DEVICE)  # the next head's rows: never read
    probe = _last_row_keeping_probe()
    for lo in (0, 3, T):
        out = torch.full((T + 2,), -99, dtype=torch.int32, device=DEVICE)
        probe[(T + 2, 1)](win_j, out, lo, T)
        want = [next((r for r in range(lo, T) if thresholds[r] > key), T) for key in range(-1, T + 1)]
        assert out.tolist() == want, lo
