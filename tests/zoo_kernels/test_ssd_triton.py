"""The Triton SSD scan against the token-by-token recurrence: outputs, final state and every gradient
(x, dt, A, B, C, D, initial state), in fp32 under the interpreter on CPU.

The oracle runs in float64 and errors are norm-wise, as in test_ssd.py: gradients such as dA are sums
of many cancelling terms, where an element-wise fp32-against-fp32 comparison measures the oracle's
rounding as much as the kernel's."""

import pytest
import torch

from zoo_kernels.ssd import ssd_recurrent, ssd_scan

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

CASES = {  # name: (batch, T, H, P, G, N, chunk, D, initial state)
    "T=1 one token, no D, zero state": (1, 1, 2, 8, 1, 16, 64, False, False),
    "T=17 one chunk plus one": (1, 17, 2, 8, 1, 16, 16, True, True),
    "T=65 groups 2, P=12": (2, 65, 4, 12, 2, 16, 16, True, True),
    "T=40 chunk 7, N=5, G=H": (2, 40, 4, 8, 4, 5, 7, True, False),
    "T=65 chunk 32, GQA-like 4:1": (1, 65, 4, 16, 1, 24, 32, False, True),
    "T=48 three whole chunks: no padded row": (2, 48, 2, 8, 1, 16, 16, True, True),
}


def make(batch, T, H, P, G, N, D, initial):
    g = torch.Generator().manual_seed(T + 13 * G)
    r = lambda *s: torch.randn(*s, generator=g).to(DEVICE)  # noqa: E731
    return {
        "x": r(batch, T, H, P),
        "dt": torch.nn.functional.softplus(r(batch, T, H) - 1.0),
        "A": -torch.exp(0.5 * r(H)),
        "B": r(batch, T, G, N),
        "C": r(batch, T, G, N),
        "D": r(H) if D else None,
        "initial_state": r(batch, H, P, N) if initial else None,
    }


def outputs_and_gradients(fn, inputs):
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items() if v is not None}
    args = {k: leaves.get(k) for k in inputs}
    y, final = fn(args)
    g = torch.Generator().manual_seed(1)
    dy, d_final = (torch.randn(t.shape, generator=g).to(DEVICE, y.dtype) for t in (y, final))
    grads = torch.autograd.grad((y * dy).sum() + (final * d_final).sum(), list(leaves.values()))
    return y, final, dict(zip(leaves, grads))


def triton_scan(chunk):
    return lambda a: ssd_scan(a["x"], a["dt"], a["A"], a["B"], a["C"], chunk_size=chunk, D=a["D"],
                              initial_state=a["initial_state"], return_final_state=True, backend="triton")


def recurrence(a):
    return ssd_recurrent(a["x"], a["dt"], a["A"], a["B"], a["C"], D=a["D"], initial_state=a["initial_state"])


@pytest.mark.parametrize("name", CASES)
def test_triton_matches_recurrence_outputs_state_and_gradients(name):
    batch, T, H, P, G, N, chunk, D, initial = CASES[name]
    inputs = make(batch, T, H, P, G, N, D, initial)
    y, final, grads = outputs_and_gradients(triton_scan(chunk), inputs)
    as64 = {k: v.double() if v is not None else None for k, v in inputs.items()}
    y_ref, final_ref, grads_ref = outputs_and_gradients(recurrence, as64)
    assert close(y, y_ref) and close(final, final_ref)
    assert set(grads) == {k for k, v in inputs.items() if v is not None}
    for key in grads:
        assert close(grads[key], grads_ref[key]), f"gradient of {key}"


def close(got, want, rtol=1e-5, atol=1e-5):
    """Norm-wise: ||got - want|| <= rtol·||want|| + atol (atol for gradients that are exactly zero)."""
    got, want = got.detach().double(), want.detach()
    return float((got - want).norm()) <= rtol * float(want.norm()) + atol


DOCUMENT_CASES = {  # name: (shape case, document start positions per batch row)
    "T=17 chunk 16: a start at 0, inside the chunk, and on the last row": ("T=17 one chunk plus one", [[0, 5, 16]]),
    "T=65 chunk 16: starts on chunk boundaries and twice in a row": ("T=65 groups 2, P=12", [[16, 17, 48], [3, 64]]),
    "T=40 chunk 7: a document per chunk and one spanning three": ("T=40 chunk 7, N=5, G=H", [[7, 14, 21], [1, 38]]),
    "T=65 chunk 32: no start in one row, a start in the padded chunk": ("T=65 chunk 32, GQA-like 4:1", [[64]]),
}


@pytest.mark.parametrize("name", DOCUMENT_CASES)
def test_triton_with_document_starts_matches_the_recurrence_that_resets(name):
    """Packed documents: the state resets where a document starts (the initial state reaches only the
    first document), outputs, final state and every gradient against the float64 recurrence."""
    shape, positions = DOCUMENT_CASES[name]
    batch, T, H, P, G, N, chunk, D, initial = CASES[shape]
    inputs = make(batch, T, H, P, G, N, D, initial)
    document_starts = torch.zeros(batch, T, dtype=torch.bool, device=DEVICE)
    for row, starts in enumerate(positions[:batch]):
        document_starts[row, starts] = True

    def packed(a):
        return ssd_scan(a["x"], a["dt"], a["A"], a["B"], a["C"], chunk_size=chunk, D=a["D"], initial_state=a["initial_state"],
                        return_final_state=True, document_starts=document_starts, backend="triton")

    def resetting(a):
        return ssd_recurrent(a["x"], a["dt"], a["A"], a["B"], a["C"], D=a["D"], initial_state=a["initial_state"],
                             document_starts=document_starts)

    y, final, grads = outputs_and_gradients(packed, inputs)
    as64 = {k: v.double() if v is not None else None for k, v in inputs.items()}
    y_ref, final_ref, grads_ref = outputs_and_gradients(resetting, as64)
    assert close(y, y_ref) and close(final, final_ref)
    for key in grads:
        assert close(grads[key], grads_ref[key]), f"gradient of {key}"
    # The resets matter here: without them the answer is different.
    y_unpacked, _ = triton_scan(chunk)(inputs)
    assert not close(y_unpacked, y_ref, rtol=1e-2)


def test_gradient_flows_from_the_final_state_alone():
    # Only the final state is used: dy is None in the backward, and the state path must carry it all.
    inputs = make(1, 17, 2, 8, 1, 16, True, True)
    leaves = [inputs[k].clone().requires_grad_() for k in ("x", "B", "initial_state")]
    _, final = ssd_scan(leaves[0], inputs["dt"], inputs["A"], leaves[1], inputs["C"], chunk_size=8,
                        initial_state=leaves[2], return_final_state=True, backend="triton")
    _, final_ref = ssd_recurrent(leaves[0], inputs["dt"], inputs["A"], leaves[1], inputs["C"], initial_state=leaves[2])
    for got, want in zip(torch.autograd.grad(final.sum(), leaves), torch.autograd.grad(final_ref.sum(), leaves)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_triton_refuses_float64_by_name():
    inputs = make(1, 5, 2, 8, 1, 16, False, False)
    x = inputs["x"].double()
    with pytest.raises(ValueError, match="float64"):
        ssd_scan(x, inputs["dt"], inputs["A"], inputs["B"], inputs["C"], backend="triton")


def test_ssd_layer_runs_on_the_triton_scan():
    from components import SSD

    torch.manual_seed(0)
    layer = SSD(32, d_state=16, head_dim=8, n_groups=2, chunk_size=16, conv=True, rope=False).to(DEVICE)
    x = torch.randn(1, 21, 32, device=DEVICE)
    want = layer(x)
    layer.backend = "triton"
    torch.testing.assert_close(layer(x), want, rtol=1e-4, atol=1e-4)


def test_a_fullgraph_compile_through_the_kernel_equals_eager(compiled_equals_eager):
    """hybrid_zoo::ssd_scan and its backward are torch.library ops, opaque to torch.compile (through the
    autograd.Function a fullgraph compile broke on the wrapper's host-side settings)."""
    torch.manual_seed(0)
    B, T, H, P, G, N = 2, 21, 4, 8, 2, 8
    x = torch.randn(B, T, H, P, device=DEVICE, requires_grad=True)
    dt = (torch.rand(B, T, H, device=DEVICE) * 0.2).requires_grad_()
    A = (-torch.rand(H, device=DEVICE)).requires_grad_()
    Bm, C = (torch.randn(B, T, G, N, device=DEVICE, requires_grad=True) for _ in range(2))
    D, h0 = torch.randn(H, device=DEVICE, requires_grad=True), torch.randn(B, H, P, N, device=DEVICE, requires_grad=True)
    starts = torch.zeros(B, T, dtype=torch.bool, device=DEVICE)
    starts[:, 9] = True
    call = lambda *a: ssd_scan(*a[:5], D=a[5], initial_state=a[6], chunk_size=8, return_final_state=True,  # noqa: E731
                               document_starts=starts, backend="triton")
    leaves = [x, dt, A, Bm, C, D, h0]
    compiled_equals_eager(call, leaves)


def test_the_backward_keeps_no_chunk_states_from_the_forward():
    """In fp32 (``keep_states`` off: it is on only on Hopper in bf16/fp16) the entering states ``[b, nc+1, h, P, N]``
    fp32 (4× a bf16 x's bytes at P 64, N 128) are computed again in the backward, not kept: what the forward saves
    is its inputs and Λ ``[b, h, nc·L]``."""
    torch.manual_seed(0)
    B, T, H, P, G, N, L = 2, 45, 4, 8, 2, 16, 16
    x = torch.randn(B, T, H, P, device=DEVICE, requires_grad=True)
    dt = (torch.rand(B, T, H, device=DEVICE) * 0.2).requires_grad_()
    A = (-torch.rand(H, device=DEVICE)).requires_grad_()
    Bm, C = (torch.randn(B, T, G, N, device=DEVICE, requires_grad=True) for _ in range(2))
    h0 = torch.randn(B, H, P, N, device=DEVICE, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        y, final = ssd_scan(x, dt, A, Bm, C, initial_state=h0, chunk_size=L, return_final_state=True, backend="triton")
    chunks = -(-T // L)
    assert (B, chunks + 1, H, P, N) not in saved and (B, chunks, H, P, N) not in saved, saved
    assert (B, H, chunks * L) in saved  # Λ
    want = ssd_scan(x, dt, A, Bm, C, initial_state=h0, chunk_size=L, return_final_state=True, backend="reference")
    gy, gf = torch.randn_like(y), torch.randn_like(final)
    leaves = [x, dt, A, Bm, C, h0]
    got = torch.autograd.grad((y * gy).sum() + (final * gf).sum(), leaves)
    expected = torch.autograd.grad((want[0] * gy).sum() + (want[1] * gf).sum(), leaves)
    for name, g, w in zip(["x", "dt", "A", "B", "C", "initial_state"], got, expected):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=lambda m: f"gradient of {name}: {m}")


def test_the_log_decays_reach_the_kernels_contiguous_whatever_layout_a_cumsum_returns(monkeypatch):
    """The kernels index Λ ``[b, h, nc·L]`` as contiguous. torch's cumsum returns a contiguous tensor here; one that
    kept its input's permuted strides (``empty_like``'s rule for dense inputs) would still view to ``[b, h, nc·L]`` and
    be read wrong without a word. With such a cumsum the scan still matches the float64 recurrence."""
    real = torch.cumsum

    def strided_cumsum(t, dim, **kwargs):
        out = real(t, dim, **kwargs)
        if t.dim() != 4 or t.is_contiguous():
            return out
        kept = torch.empty_strided(t.shape, t.stride(), dtype=out.dtype, device=out.device)  # the input's layout
        return kept.copy_(out)

    monkeypatch.setattr(torch, "cumsum", strided_cumsum)
    assert_matches_recurrence(make(2, 37, 4, 8, 2, 16, True, True), 16, None)


@pytest.mark.parametrize("docs", [False, True])
def test_views_of_one_projection_are_read_in_place(docs):
    """x, B, C and dt split from one projection (as the SSD layer makes them) go to the kernels through their
    strides, not copied (with ``check_finite=False``: the finite pass makes new tensors): outputs and every
    gradient equal the reference's, and what the op saves for the backward is the views themselves."""
    torch.manual_seed(0)
    b, T, H, P, G, N, L = 2, 37, 4, 8, 2, 16, 16
    proj = torch.randn(b, T, H * P + 2 * G * N + H, device=DEVICE)  # [b, T, x | B | C | dt]
    # dt ≥ 0, as the layer's softplus gives it: raw normal draws (negative steps, growing states) took y to 2.5e5,
    # where an H200's exp and the reference's parted by 2.7e-3 on one small element
    proj[..., -H:] = torch.nn.functional.softplus(proj[..., -H:] - 1.0)
    proj.requires_grad_()
    A = (-torch.rand(H, device=DEVICE)).requires_grad_()
    D = torch.randn(H, device=DEVICE, requires_grad=True)
    starts = torch.zeros(b, T, dtype=torch.bool, device=DEVICE)
    starts[:, 20] = docs

    def split(t):
        x, Bm, C, dt = t.split([H * P, G * N, G * N, H], dim=-1)
        return x.view(b, T, H, P), Bm.view(b, T, G, N), C.view(b, T, G, N), dt

    outs, grads = [], []
    for backend in ("triton", "reference"):
        x, Bm, C, dt = split(proj)
        assert not x.is_contiguous() and not Bm.is_contiguous()
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            y = ssd_scan(x, dt, A, Bm, C, D=D, chunk_size=L, document_starts=starts if docs else None, backend=backend,
                         check_finite=False)
        if backend == "triton":  # the only tensors of these shapes saved are the views themselves, not copies
            views = {(t.data_ptr(), t.stride()) for t in (x, Bm, C, dt)}
            shapes = {t.shape for t in (x, Bm, C, dt)}
            assert {(t.data_ptr(), t.stride()) for t in saved if t.shape in shapes} == views
        outs.append(y)
        grads.append(torch.autograd.grad((y * torch.linspace(-1, 1, y.numel(), device=DEVICE).view_as(y)).sum(), [proj, A, D]))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
    for name, got, want in zip(["projection", "A", "D"], *grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m: f"gradient of {name}: {m}")


@pytest.mark.parametrize("docs", [False, True])
def test_the_backward_writes_no_pair_tensor(docs):
    """The log-decay gradient sums its pair terms ``m < k ≤ l`` inside the kernel, a running sum per row: no
    ``[b, nc, h, L, L]`` tensor is made (the plain-torch form it replaced made several), and the gradients still
    match the reference. Here a pair tensor would be 4× the largest tensor the backward needs (``[b, T, h, P]``).
    The profiler sees the ops inside the backward op (a dispatch mode sees the op as one)."""
    torch.manual_seed(0)
    b, T, H, P, G, N, L = 1, 70, 2, 16, 1, 16, 64
    x = torch.randn(b, T, H, P, device=DEVICE, requires_grad=True)
    dt = (torch.rand(b, T, H, device=DEVICE) * 0.3).requires_grad_()
    A = (-torch.rand(H, device=DEVICE) - 0.5).requires_grad_()
    Bm, C = (torch.randn(b, T, G, N, device=DEVICE, requires_grad=True) for _ in range(2))
    starts = torch.zeros(b, T, dtype=torch.bool, device=DEVICE)
    starts[:, [0, 30]] = docs
    leaves, w = [x, dt, A, Bm, C], torch.randn(b, T, H, P, device=DEVICE)
    y = ssd_scan(x, dt, A, Bm, C, chunk_size=L, document_starts=starts if docs else None, backend="triton")
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    with torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        got = torch.autograd.grad((y * w).sum(), leaves)
    # bytes one op allocated and kept, on the CPU or the GPU
    largest = max(max(e.self_cpu_memory_usage, getattr(e, "self_device_memory_usage", 0)) for e in prof.events())
    pair_bytes = b * -(-T // L) * H * L * L * 4
    assert largest * 4 <= pair_bytes, f"an op kept {largest:,} bytes in the backward (a pair tensor: {pair_bytes:,})"
    want = torch.autograd.grad((ssd_scan(x, dt, A, Bm, C, chunk_size=L, document_starts=starts if docs else None,
                                         backend="reference") * w).sum(), leaves)
    for name, g, r in zip(["x", "dt", "A", "B", "C"], got, want):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4, msg=lambda m: f"gradient of {name}: {m}")


@pytest.mark.parametrize("variant", ["sm_80", "hopper bf16", "shared scores", "sm_80 fp32"])
@pytest.mark.parametrize("docs", [False, True])
def test_the_gpu_tiles_under_the_interpreter(docs, variant, monkeypatch):
    """The tiles CUDA takes (32-row scans, or 64-row ones on Hopper in bf16; the log-decay pairs in 64-row blocks
    stepping 16 columns, 32-row ones in fp32, so a block's diagonal spans several column steps; the group scores in
    64- or 32-row blocks) differ from the interpreter's 16×16: run them here too, against the float64 recurrence, at
    a length of two chunks and a bit — and with the in-chunk products made once per group (``shared_scores``, off by
    default), read by the forward and the backward."""
    from zoo_kernels.ssd import triton as ssd_triton

    hopper, shared, fp32 = variant == "hopper bf16", variant == "shared scores", variant == "sm_80 fp32"
    gpu_config = ssd_triton.launch_config
    monkeypatch.setattr(ssd_triton, "launch_config", lambda P, N, cuda, dtype=torch.float32, arch=90: {
        **gpu_config(P, N, True, torch.float32 if fp32 else torch.bfloat16, 90 if hopper else 80),
        "shared_scores": shared})
    assert ssd_triton.launch_config(16, 16, False)["pair_rows"] == (32 if fp32 else 64)
    assert ssd_triton.launch_config(16, 16, False)["rows"] == (64 if hopper else 32)
    made, scores = [], ssd_triton._group_scores_call
    monkeypatch.setattr(ssd_triton, "_group_scores_call", lambda *a: made.append(scores(*a)) or made[-1])
    # 4 heads to a group: G·L = 64 fp32 scores a position take H·P = 64 fp32s, so shared scores pay and are made
    inputs = make(1, 150, 4, 16, 1, 16, True, True)
    starts = torch.zeros(1, 150, dtype=torch.bool, device=DEVICE)
    starts[0, [30, 64, 70, 71, 140]] = docs  # one on a chunk edge, two in a row, one in the last chunk
    (y, final, grads), (y_ref, final_ref, grads_ref) = triton_and_reference(inputs, 64, starts if docs else None)
    rel = lambda got, want: ((got.double() - want).norm() / want.norm()).item()  # noqa: E731
    assert rel(y, y_ref) < 1e-5 and rel(final, final_ref) < 1e-5
    for name in grads:
        assert rel(grads[name], grads_ref[name]) < 1e-5, name
    assert [m is not None for m in made] == [shared, shared]  # the forward's and the backward's


def test_a_kernel_without_tiles_of_its_own_takes_the_shared_ones():
    """Where the tile search has not timed them (fp32, Ampere, larger states), the kernels' own entries are empty,
    so each launches with the shared rows (as its column block too), warps and stages — the pair kernel its own
    blocks; on Hopper in bf16 at 64 × 128 each takes the tiles its search chose, and nothing else changes."""
    from zoo_kernels.ssd import triton as ssd_triton

    for elsewhere in (ssd_triton.launch_config(64, 128, True, torch.float32, 90),
                      ssd_triton.launch_config(64, 128, True, torch.bfloat16, 80),
                      ssd_triton.launch_config(128, 128, True, torch.bfloat16, 90)):
        assert (elsewhere["y"], elsewhere["dx"], elsewhere["pairs"]) == ({}, {}, {})
        assert (elsewhere["order"], elsewhere["group_order"]) == ("chunks", "chunks")
        for kernel in ("y", "dx", "dC", "dB"):
            rows = elsewhere["rows"]
            assert ssd_triton._tiles(elsewhere, kernel) == dict(rows=rows, cols=rows, warps=elsewhere["warps"],
                                                                stages=elsewhere["stages"], p_block=None,
                                                                order="chunks"), kernel
        assert ssd_triton._tiles(elsewhere, "pairs") == dict(rows=elsewhere["pair_rows"], cols=elsewhere["pair_cols"],
                                                             warps=elsewhere["warps"], stages=elsewhere["stages"],
                                                             p_block=None, order="chunks")
    hopper = ssd_triton.launch_config(64, 128, True, torch.bfloat16, 90)
    assert (hopper["order"], hopper["group_order"]) == ("heads", "blocks")
    assert ssd_triton._tiles(hopper, "y") == dict(rows=64, cols=32, warps=4, stages=2, p_block=None, order="blocks")
    assert ssd_triton._tiles(hopper, "dx") == dict(rows=32, cols=32, warps=4, stages=2, p_block=None, order="blocks")
    assert ssd_triton._tiles(hopper, "pairs") == dict(rows=32, cols=16, warps=1, stages=3, p_block=None, order="heads")
    for kernel in ("dC", "dB"):
        assert ssd_triton._tiles(hopper, kernel) == dict(rows=64, cols=64, warps=4, stages=2, p_block=None,
                                                         order="heads"), kernel
    own = {**hopper, "y": dict(cols=32, stages=4, order="chunks")}  # an entry overrides what it names, nothing else
    assert ssd_triton._tiles(own, "y") == dict(rows=64, cols=32, warps=4, stages=4, p_block=None, order="chunks")
    assert ssd_triton._tiles(own, "dx") == ssd_triton._tiles(hopper, "dx")


@pytest.mark.parametrize("shared", [False, True], ids=["per-head scores", "shared scores"])
@pytest.mark.parametrize("docs", [False, True])
def test_each_scan_kernel_on_tiles_of_its_own_and_the_heads_innermost(docs, shared, monkeypatch):
    """``launch_config``'s ``y`` and ``dx`` entries give those kernels tiles of their own — here 32 rows stepping
    16 columns with the head dim split over two programs for ``y``, 16 rows stepping 32 columns for ``dx``, where the
    other kernels keep 16 × 16 — and ``order="heads"`` orders every per-head scan kernel's programs with the heads
    innermost; against the float64 recurrence at two chunks of 64 and a bit, with and without documents."""
    from zoo_kernels.ssd import triton as ssd_triton

    config = ssd_triton.launch_config
    own = dict(y=dict(rows=32, cols=16, p_block=16), dx=dict(rows=16, cols=32), order="heads",
               shared_scores=shared)
    monkeypatch.setattr(ssd_triton, "launch_config", lambda *a, **k: {**config(*a, **k), **own})
    launched, grid = [], ssd_triton._grid
    monkeypatch.setattr(ssd_triton, "_grid", lambda *a: launched.append(a) or grid(*a))
    inputs = make(1, 150, 4, 32, 1, 16, True, True)  # P 32: two 16-column programs for y
    starts = torch.zeros(1, 150, dtype=torch.bool, device=DEVICE)
    starts[0, [30, 64, 70, 71, 140]] = docs
    assert_matches_recurrence(inputs, 64, starts if docs else None)
    # y: 2 row blocks of 32 × 2 column halves; dx: 4 row blocks of 16; each over 3 chunks × 4 heads on axis 0
    assert (3, 2 * 2, 4, "heads") in launched and (3, 4, 4, "heads") in launched


@pytest.mark.parametrize("docs", [False, True])
def test_every_grid_order_computes_the_same_scan(docs, monkeypatch):
    """``order="blocks"`` launches each chunk's head's blocks of rows together (all on grid axis 0), and an entry
    gives one kernel an order of its own (``y`` the heads innermost here); ``group_order="blocks"`` does the same for
    the per-group kernels, at two groups of two heads, so each index of the flattened grid is taken apart right or the
    result is wrong — against the float64 recurrence, with and without documents."""
    from zoo_kernels.ssd import triton as ssd_triton

    config = ssd_triton.launch_config
    own = dict(order="blocks", group_order="blocks", shared_scores=True, group_n=16,  # dC/dB: N over 2 programs
               y=dict(rows=32, p_block=16, order="heads"))
    monkeypatch.setattr(ssd_triton, "launch_config", lambda *a, **k: {**config(*a, **k), **own})
    launched, grid = [], ssd_triton._grid
    monkeypatch.setattr(ssd_triton, "_grid", lambda *a: launched.append(a) or grid(*a))
    inputs = make(1, 150, 4, 32, 2, 32, True, True)  # N 32: tl.dot takes no side under 16 on a GPU
    starts = torch.zeros(1, 150, dtype=torch.bool, device=DEVICE)
    starts[0, [30, 64, 70, 71, 140]] = docs
    assert_matches_recurrence(inputs, 64, starts if docs else None)
    # y on its own order (2 row blocks × 2 column halves over 3 chunks × 4 heads); the other per-head kernels and the
    # per-group ones (2 groups) with the blocks innermost
    assert (3, 2 * 2, 4, "heads") in launched
    assert {order for *_, heads, order in launched if heads == 4} == {"heads", "blocks"}
    assert {order for *_, heads, order in launched if heads == 2} == {"blocks"}
    assert grid(3, 4, 2, "blocks") == (24, 1, 1)
    with pytest.raises(ValueError, match="order 'rows' is none of"):
        grid(3, 4, 2, "rows")


def assert_matches_recurrence(inputs, chunk, starts):
    """The Triton scan's output, final state and every gradient against the float64 recurrence."""
    (y, final, grads), (y_ref, final_ref, grads_ref) = triton_and_reference(inputs, chunk, starts)
    assert close(y, y_ref) and close(final, final_ref)
    for name in grads:
        assert close(grads[name], grads_ref[name]), f"gradient of {name}"


def triton_and_reference(inputs, chunk, starts):
    """(y, final, gradients) of the Triton scan on ``inputs`` and of the reference on them in float64."""
    run = lambda backend: lambda a: ssd_scan(a["x"], a["dt"], a["A"], a["B"], a["C"], chunk_size=chunk, D=a["D"],  # noqa: E731
                                             initial_state=a["initial_state"], document_starts=starts,
                                             return_final_state=True, backend=backend)
    as64 = {k: v.double() if v is not None else v for k, v in inputs.items()}
    return outputs_and_gradients(run("triton"), inputs), outputs_and_gradients(run("reference"), as64)


@pytest.mark.parametrize("chunk, kept", [(64, True), (16, False)], ids=["states under x's bytes: kept",
                                                                       "over them: made again"])
@pytest.mark.parametrize("docs", [False, True])
def test_keep_states_hands_the_forwards_states_to_the_backward(docs, chunk, kept, monkeypatch):
    """``keep_states``: the backward takes the forward's entering states instead of running the forward's state and
    scan kernels again — where they take no more bytes than x (N 16 per head dim of 16 at T 150: at chunk 64 the 4
    states are 0.43 of x's bytes, at chunk 16 the 11 states 1.17 of them) — with the same
    output and gradients, against the float64 recurrence, eager and under a fullgraph compile."""
    from zoo_kernels.ssd import triton as ssd_triton

    config = ssd_triton.launch_config
    monkeypatch.setattr(ssd_triton, "launch_config", lambda *a, **k: {**config(*a, **k), "keep_states": True})
    made, entering = [], ssd_triton._entering_states
    monkeypatch.setattr(ssd_triton, "_entering_states", lambda *a: made.append(1) or entering(*a))
    inputs = make(1, 150, 2, 16, 1, 16, True, True)
    starts = torch.zeros(1, 150, dtype=torch.bool, device=DEVICE)
    starts[0, [30, 64, 70, 140]] = docs
    assert_matches_recurrence(inputs, chunk, starts if docs else None)
    assert len(made) == (1 if kept else 2)  # the forward's, and the backward's unless kept
    if docs:
        return  # (the compiled call below takes no documents: the case without them runs it)
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items() if v is not None}
    call = lambda a: ssd_scan(a["x"], a["dt"], a["A"], a["B"], a["C"], chunk_size=chunk, D=a["D"],  # noqa: E731
                              initial_state=a["initial_state"], return_final_state=True, backend="triton")
    loss = lambda out: (out[0] * out[0]).sum() + out[1].sum()  # noqa: E731
    compiled = torch.autograd.grad(loss(torch.compile(call, fullgraph=True, backend="aot_eager")(leaves)),
                                   list(leaves.values()))
    for got, want in zip(compiled, torch.autograd.grad(loss(call(leaves)), list(leaves.values()))):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("N", [32, 40], ids=["N 32: two column blocks", "N 40: three, the last partly outside"])
@pytest.mark.parametrize("docs", [False, True])
def test_per_group_bc_grads_with_the_state_split_over_programs(docs, N, monkeypatch):
    """``group_n`` splits the state's N over the per-group dC/dB programs (each writes its share of the log-decay
    gradient's row dots, summed after): 16 columns a program at N 32 and N 40 (padded to 64), two groups of two heads,
    ``_group_pair_grads`` on warps of its own, against the float64 recurrence. A column block read at the wrong
    offset, a share of the row dots lost or counted twice, changes dB, dC, dA and d dt. Chunks of 24 over 16-row
    tiles: a chunk's second tile runs past its end (a mask there admitting row 24 reads or writes the next chunk's)."""
    from zoo_kernels.ssd import triton as ssd_triton

    config, given = ssd_triton.launch_config, []
    own = dict(shared_scores=True, group_n=16, group_pair_warps=2)
    monkeypatch.setattr(ssd_triton, "launch_config",
                        lambda *a, **k: given.append({**config(*a, **k), **own}) or given[-1])
    launches = []  # (kernel, grid, warps)

    def watched(name):
        kernel = getattr(ssd_triton, name)
        return type("Launch", (), {"__getitem__": lambda self, grid: lambda *a, **k: (
            launches.append((name, grid, k["num_warps"])), kernel[grid](*a, **k))[1]})()

    for name in ("_group_bc_grads", "_group_pair_grads"):
        monkeypatch.setattr(ssd_triton, name, watched(name))
    inputs = make(2, 75, 4, 32, 2, N, True, True)
    starts = torch.zeros(2, 75, dtype=torch.bool, device=DEVICE)
    starts[0, [20, 25, 26]], starts[1, [48, 50, 73]] = docs, docs  # 25: one past chunk 1's first row, none on it
    assert_matches_recurrence(inputs, 24, starts if docs else None)
    # dC and dB: 2 batch rows × 4 chunks, 2 row blocks of 16 × (N / 16 rounded up) column blocks, 2 groups; on
    # group_warps (4 in the interpreter, 8 on a GPU in fp32)
    assert [(grid, warps) for name, grid, warps in launches if name == "_group_bc_grads"] == [
        ((8, 2 * -(-N // 16), 2), given[-1]["group_warps"])] * 2
    assert [warps for name, _, warps in launches if name == "_group_pair_grads"] == [2]  # its own


@pytest.mark.parametrize("docs", [False, True])
def test_shared_scores_per_group_with_two_groups(docs, monkeypatch):
    """With ``shared_scores`` the backward makes ``dC`` and ``dB`` per group: the in-chunk gradients of ``C·Bᵀ`` summed
    over a group's heads, then the heads' state terms summed inside the kernel. Two groups of two heads (a head read
    at the wrong group, or a group's heads counted in the other, changes every gradient), a chunk of 24 over 16-row
    tiles at T 75 (a chunk's second tile runs past its end) and a head dim of 24 in 32-column tiles, against the
    float64 recurrence."""
    from zoo_kernels.ssd import triton as ssd_triton

    config = ssd_triton.launch_config
    monkeypatch.setattr(ssd_triton, "launch_config", lambda *a, **k: {**config(*a, **k), "shared_scores": True})
    made, scores = [], ssd_triton._group_scores_call
    monkeypatch.setattr(ssd_triton, "_group_scores_call", lambda *a: made.append(scores(*a)) or made[-1])
    inputs = make(2, 75, 4, 24, 2, 16, True, True)  # G·L = 48 scores a position, H·P = 96: they pay
    starts = torch.zeros(2, 75, dtype=torch.bool, device=DEVICE)
    starts[0, [20, 25, 26]], starts[1, [48, 50, 73]] = docs, docs  # 25: one past chunk 1's first row, none on it
    assert_matches_recurrence(inputs, 24, starts if docs else None)
    assert [m is not None for m in made] == [True, True]


@pytest.mark.parametrize("P, N, dtype, arch, want", [
    # Hopper, bf16/fp16, states up to 64 × 128: the H200 tile search's winners and both switches on
    (64, 128, torch.bfloat16, 90, dict(rows=64, warps=4, stages=2, shared_scores=True, narrow_states=True,
                                       order="heads", group_order="blocks", group_warps=4, group_rows=64,
                                       group_block=64, group_n=128, group_pair_warps=None, scores_block=64,
                                       scores_warps=4, pair_rows=64, pair_cols=16, keep_states=True,
                                       y=dict(rows=64, cols=32, warps=4, stages=2, order="blocks"),
                                       dx=dict(rows=32, cols=32, warps=4, stages=2, order="blocks"),
                                       pairs=dict(rows=32, cols=16, warps=1, stages=3))),
    (16, 16, torch.float16, 100, dict(rows=64, warps=4, shared_scores=True, order="heads", P=16, N=16, group_n=16)),
    # a larger state on Hopper, or before Hopper: 32 rows, 8 warps, no switches, the shared tiles
    (64, 256, torch.bfloat16, 90, dict(rows=32, warps=8, stages=2, shared_scores=False, narrow_states=False,
                                       order="chunks", group_rows=16, group_block=32, group_warps=8, y={}, dx={}, pairs={})),
    (64, 128, torch.bfloat16, 89, dict(rows=32, warps=8, stages=2, shared_scores=False, group_rows=32, group_block=64,
                                       pair_rows=64, group_n=128, group_pair_warps=None)),
    # fp32: 32 rows, 32-row pair blocks, the smaller per-group and score blocks
    (64, 128, torch.float32, 90, dict(rows=32, warps=8, stages=2, pair_rows=32, pair_cols=16, shared_scores=False,
                                      group_rows=16, group_block=32, scores_block=32, scores_warps=8)),
    (48, 100, torch.float32, 80, dict(P=64, N=128, rows=32, pair_rows=32)),  # each side to its power of two
])
def test_the_gpu_launch_settings_are_the_documented_ones(P, N, dtype, arch, want):
    """``launch_config``'s GPU table, searched and checked for spills on GPUs (docs/kernels.md): no CPU test launches
    it (the interpreter takes its own small tiles), so a changed entry would pass every other test here."""
    from zoo_kernels.ssd.triton import launch_config

    config = launch_config(P, N, True, dtype, arch)
    assert {key: config[key] for key in want} == want
    cpu = launch_config(P, N, False, dtype, arch)
    assert {key: cpu[key] for key in ("rows", "pair_rows", "group_rows", "group_block", "warps", "stages")} == dict(
        rows=16, pair_rows=16, group_rows=16, group_block=16, warps=4, stages=1)


def test_shared_scores_are_made_only_where_they_pay_and_are_each_chunks_c_b_products(monkeypatch):
    """``_group_scores_call``: with ``shared_scores`` on, the ``[b, nc, G, L, L]`` products ``C_l·B_m`` of each chunk
    and group (against an einsum, odd T, a last chunk cut short) — but None where they cost more than they save: one
    head per group (``G = H``: nothing shared) or scores wider than ``x`` (``G·L`` fp32 against ``H·P`` a position);
    its tiles the table's ``scores_block`` (a larger one gives the same numbers, so the launch is what shows it)."""
    from zoo_kernels.ssd import triton as ssd_triton

    T, L, H, P, G, N = 40, 16, 4, 16, 2, 16
    x = torch.randn(1, T, H, P, device=DEVICE)
    B, C = (torch.randn(1, T, G, N, device=DEVICE) for _ in range(2))
    blk = {**ssd_triton._blk(x, B, C), "shared_scores": True}
    qk = ssd_triton._group_scores_call(x, B, C, T, L, blk)
    pad = lambda t: torch.nn.functional.pad(t, (0, 0, 0, 0, 0, 3 * L - T)).view(1, 3, L, G, N)  # noqa: E731
    want = torch.einsum("bclgn,bcmgn->bcglm", pad(C), pad(B))  # [b, nc, G, L, L]
    torch.testing.assert_close(qk[..., : T - 2 * L, : T - 2 * L][:, 2], want[..., : T - 2 * L, : T - 2 * L][:, 2])
    torch.testing.assert_close(qk[:, :2], want[:, :2])
    assert ssd_triton._group_scores_call(x, B, C, T, L, {**blk, "shared_scores": False}) is None
    assert ssd_triton._group_scores_call(x[:, :, :G], B, C, T, L, blk) is None  # G = H
    assert ssd_triton._group_scores_call(x[..., :7], B, C, T, L, blk) is None  # G·L·4 = 128 > H·P·4 = 112 bytes
    assert ssd_triton._group_scores_call(x[..., :8], B, C, T, L, blk) is not None  # exactly x's bytes: they pay
    launched, grid = [], ssd_triton._grid
    monkeypatch.setattr(ssd_triton, "_grid", lambda *a: launched.append(a) or grid(*a))
    wide = torch.randn(1, T, H, 32, device=DEVICE)  # scores of a chunk of 40 take no more than x at P 32
    ssd_triton._group_scores_call(wide, B, C, T, T, blk)  # one chunk of 40 in blocks of 32: 2 × 2 tiles, each group
    assert blk["scores_block"] == 32 and launched == [(1, 4, G, blk["group_order"])]


@pytest.mark.parametrize("with_d", [False, True], ids=["no D, no initial state", "D and an initial state"])
def test_the_custom_ops_shape_functions_and_autograd_pass_torchs_opcheck(with_d):
    """The SSD ops' fake (shape) functions give what the kernels give — the entering states ``[b, nc+1, h, P, N]``,
    ``dD`` empty without ``D`` — so torch.compile traces the scan right; T 21 over chunks of 8, with documents."""
    from zoo_kernels.ssd import triton as ssd_triton  # registers the ops

    inputs = make(1, 21, 2, 16, 1, 16, with_d, with_d)
    starts = torch.zeros(1, 21, dtype=torch.bool, device=DEVICE)
    starts[0, 9] = True
    forward = (inputs["x"], inputs["dt"], inputs["A"], inputs["B"], inputs["C"], inputs["D"], inputs["initial_state"],
               starts, 8)
    assert set(torch.library.opcheck(torch.ops.hybrid_zoo.ssd_scan.default, forward).values()) == {"SUCCESS"}
    y, final, lam, states = ssd_triton.ssd_scan_op(*forward)
    assert states.shape == (1, 3 + 1, 2, 16, 16) and lam.shape == (1, 2, 3 * 8)
    for kept in (states, None):
        backward = (torch.randn_like(y), torch.randn_like(final), *forward[:-1], lam, kept, 8)
        assert set(torch.library.opcheck(torch.ops.hybrid_zoo.ssd_scan_backward.default, backward).values()) == {
            "SUCCESS"}
