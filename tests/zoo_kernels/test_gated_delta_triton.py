"""The gated delta rule's Triton recurrence over chunks against the token-by-token recurrence in float64: outputs, final
state and the gradient of every input (q, k, v, g, beta, initial state), in fp32 under the interpreter on CPU; packed
documents, value columns split over programs, a fullgraph compile, torch's opcheck of the custom ops, the mixer.

Errors are norm-wise against the float64 oracle, as in test_ssd_triton.py."""

import pytest
import torch
import torch.nn.functional as F

from zoo_kernels.gated_delta import gated_delta_recurrent, gated_delta_rule

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("q", "k", "v", "g", "beta", "initial_state")

CASES = {  # name: (batch, T, H, K, V, chunk, initial state)
    "T=1 one token, zero state": (1, 1, 2, 8, 6, 64, False),
    "T=17 one chunk plus one": (2, 17, 2, 8, 6, 16, True),
    "T=45 chunk 7 (tiles padded to 16), K 12, V 20": (1, 45, 3, 12, 20, 7, True),
    "T=40 V 40: three blocks of value columns": (1, 40, 2, 16, 40, 16, True),
    "T=48 three whole chunks: no padded row": (2, 48, 2, 16, 16, 16, False),
    "T=70 chunk 32: each chunk's rows in two blocks": (1, 70, 2, 8, 6, 32, True),
}


def make(batch, T, H, K, V, initial, seed=0):
    gen = torch.Generator().manual_seed(seed * 1000 + T)
    r = lambda *s: torch.randn(*s, generator=gen).to(DEVICE)  # noqa: E731
    return {
        "q": r(batch, T, H, K),
        "k": F.normalize(r(batch, T, H, K), dim=-1),
        "v": r(batch, T, H, V),
        "g": -F.softplus(r(batch, T, H) - 2.0),
        "beta": torch.sigmoid(r(batch, T, H)),
        "initial_state": r(batch, H, K, V) if initial else None,
    }


def outputs_and_gradients(fn, inputs):
    leaves = {n: t.clone().requires_grad_() for n, t in inputs.items() if t is not None}
    y, final = fn(*(leaves.get(n) for n in NAMES))
    gen = torch.Generator().manual_seed(1)
    dy, d_final = (torch.randn(t.shape, generator=gen).to(DEVICE, y.dtype) for t in (y, final))
    grads = torch.autograd.grad((y * dy).sum() + (final * d_final).sum(), list(leaves.values()))
    return y, final, dict(zip(leaves, grads))


def kernel(chunk, document_starts=None):
    return lambda q, k, v, g, beta, h0: gated_delta_rule(q, k, v, g, beta, initial_state=h0, chunk_size=chunk,
                                                         return_final_state=True, document_starts=document_starts,
                                                         backend="triton")


def recurrence(document_starts=None):
    return lambda q, k, v, g, beta, h0: gated_delta_recurrent(q, k, v, g, beta, scale=q.shape[-1] ** -0.5,
                                                              initial_state=h0, document_starts=document_starts)


def close(got, want, rtol=1e-5, atol=1e-5):
    """Norm-wise: ||got − want|| ≤ rtol·||want|| + atol."""
    return float((got.detach().double() - want.detach()).norm()) <= rtol * float(want.detach().norm()) + atol


def assert_matches_the_recurrence(inputs, chunk, document_starts=None):
    y, final, grads = outputs_and_gradients(kernel(chunk, document_starts), inputs)
    as64 = {n: t.double() if t is not None else None for n, t in inputs.items()}
    y_ref, final_ref, grads_ref = outputs_and_gradients(recurrence(document_starts), as64)
    assert y.dtype == inputs["v"].dtype and final.dtype == torch.float32
    assert close(y, y_ref) and close(final, final_ref)
    assert set(grads) == {n for n, t in inputs.items() if t is not None}
    for name in grads:
        assert close(grads[name], grads_ref[name]), f"gradient of {name}"


@pytest.mark.parametrize("name", CASES)
def test_triton_matches_the_recurrence_outputs_state_and_every_gradient(name):
    batch, T, H, K, V, chunk, initial = CASES[name]
    assert_matches_the_recurrence(make(batch, T, H, K, V, initial), chunk)


@pytest.mark.parametrize("chunk, starts", [(16, [[0, 5, 16], [16, 17, 33]]), (7, [[7, 14, 21], [1, 38]])],
                         ids=["chunk 16: at 0, inside, on a boundary, twice in a row", "chunk 7: one per chunk"])
def test_triton_with_document_starts_matches_the_recurrence_that_resets(chunk, starts):
    inputs = make(2, 40, 2, 8, 20, True)
    document_starts = torch.zeros(2, 40, dtype=torch.bool, device=DEVICE)
    for row, positions in enumerate(starts):
        document_starts[row, positions] = True
    assert_matches_the_recurrence(inputs, chunk, document_starts)


def test_a_nan_reaches_only_its_position_and_after_in_its_document_through_the_kernel():
    inputs = make(1, 13, 3, 8, 6, False)
    starts = torch.zeros(1, 13, dtype=torch.bool, device=DEVICE)
    starts[0, 9] = True
    inputs["k"][0, 4, 1] = float("nan")
    y = gated_delta_rule(*(inputs[n] for n in NAMES[:5]), document_starts=starts, chunk_size=4, backend="triton")
    assert y[0, :, 1].isnan().any(-1).nonzero().flatten().tolist() == list(range(4, 9))
    assert not y[0, :, [0, 2]].isnan().any()


def test_half_inputs_compute_in_fp32_and_return_their_dtype():
    inputs = {n: t.half() if t is not None else None for n, t in make(1, 21, 2, 8, 6, True).items()}
    y = gated_delta_rule(*(inputs[n] for n in NAMES[:5]), initial_state=inputs["initial_state"], chunk_size=8,
                         backend="triton")
    want, _ = recurrence()(*(inputs[n].double() for n in NAMES))
    assert y.dtype == torch.float16 and close(y.float(), want, rtol=2e-3)


def test_triton_refuses_float64_by_name():
    inputs = make(1, 5, 2, 8, 6, False)
    with pytest.raises(ValueError, match="float64"):
        gated_delta_rule(*(inputs[n].double() for n in NAMES[:5]), backend="triton")


def test_an_unknown_backend_is_named():
    inputs = make(1, 5, 2, 8, 6, False)
    with pytest.raises(ValueError, match="backend='fast' is not one of"):
        gated_delta_rule(*(inputs[n] for n in NAMES[:5]), backend="fast")


def test_a_fullgraph_compile_through_the_kernel_equals_eager(compiled_equals_eager):
    """hybrid_zoo::gated_delta_chunks and its backward are torch.library ops, opaque to torch.compile."""
    inputs = make(2, 21, 2, 8, 6, True)
    starts = torch.zeros(2, 21, dtype=torch.bool, device=DEVICE)
    starts[:, 9] = True
    leaves = [inputs[n].clone().requires_grad_() for n in NAMES]
    call = kernel(8, starts)
    compiled_equals_eager(call, leaves)


@pytest.mark.parametrize("initial", [False, True], ids=["no initial state", "an initial state"])
def test_the_custom_ops_shape_functions_and_autograd_pass_torchs_opcheck(initial):
    from zoo_kernels.gated_delta import triton as gd_triton  # registers the ops
    from zoo_kernels.gated_delta.reference import chunk_terms

    inputs = make(1, 21, 2, 8, 20, initial)
    U, W, _, _, writes, kept = chunk_terms(*(inputs[n] for n in NAMES[:5]), scale=8 ** -0.5, chunk_size=8)
    forward = (U, W, writes, kept, inputs["initial_state"])
    assert set(torch.library.opcheck(torch.ops.hybrid_zoo.gated_delta_chunks.default, forward).values()) == {"SUCCESS"}
    delta, states, final = gd_triton.delta_chunks(*forward)
    assert delta.shape == (1, 2, 3, 8, 20) and states.shape == (1, 2, 3, 8, 20) and final.shape == (1, 2, 8, 20)
    backward = (torch.randn_like(delta), torch.randn_like(states), torch.randn_like(final), W, writes, kept, states,
                delta)
    assert set(torch.library.opcheck(torch.ops.hybrid_zoo.gated_delta_chunks_backward.default,
                                     backward).values()) == {"SUCCESS"}


def test_the_mixer_runs_on_the_kernel_in_a_forward_and_a_prefill(monkeypatch):
    """``GatedDeltaNet(backend="triton")``: the kernel computes the full forward (output and input gradient as the
    reference's) and a prefill of 5 tokens whose steps then continue to the full forward's last output."""
    from components import Context, GatedDeltaNet
    from components.cache import InferenceCache
    from zoo_kernels.gated_delta import triton as gd_triton

    launched = []
    kernel_rule = gd_triton.gated_delta_triton
    monkeypatch.setattr(gd_triton, "gated_delta_triton",
                        lambda *a, **kw: launched.append(a[0].shape) or kernel_rule(*a, **kw))
    torch.manual_seed(0)
    reference = GatedDeltaNet(32, n_heads=2, head_dim=16, chunk_size=8, backend="reference").to(DEVICE)
    layer = GatedDeltaNet(32, n_heads=2, head_dim=16, chunk_size=8, backend="triton").to(DEVICE)
    layer.load_state_dict(reference.state_dict())
    x = torch.randn(2, 21, 32, device=DEVICE, requires_grad=True)
    want = reference(x)
    (grad_want,) = torch.autograd.grad(want.square().sum(), x)
    assert launched == []
    got = layer(x)
    (grad,) = torch.autograd.grad(got.square().sum(), x)
    assert launched == [(2, 21, 2, 16)]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, grad_want, rtol=1e-4, atol=1e-5)

    cache, outs = InferenceCache(2, 8), []
    with torch.no_grad():
        for start, stop in [(0, 5), (5, 6), (6, 7), (7, 8)]:
            cache.begin(stop - start, None)
            outs.append(layer(x[:, start:stop], Context(position_ids=torch.arange(start, stop).expand(2, -1),
                                                        cache=cache)))
            cache.end(stop - start)
    assert launched[1:] == [(2, 5, 2, 16)]  # the prefill on the kernel, the steps on the recurrence
    torch.testing.assert_close(torch.cat(outs, 1), layer(x[:, :8]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("K, V, arch, want_v", [(128, 128, 90, 32), (64, 64, 90, 32), (256, 256, 90, 16),
                                                (128, 128, 80, 16), (128, 16, 90, 16)])
def test_the_gpu_launch_settings_are_the_documented_ones(K, V, arch, want_v):
    from zoo_kernels.gated_delta.triton import launch_config

    assert launch_config(K, V, cuda=True, arch=arch) == {"BLOCK_R": 16, "BLOCK_K": max(16, K), "BLOCK_V": want_v,
                                                         "num_warps": 8, "num_stages": 1}


def test_the_gpu_tiles_under_the_interpreter(monkeypatch):
    """Hopper's 32 value columns a program, against the interpreter's 16: V 40 in two blocks, the second part-masked."""
    from zoo_kernels.gated_delta import triton as gd_triton

    real = gd_triton.launch_config
    monkeypatch.setattr(gd_triton, "launch_config", lambda K, V, cuda, arch=90: real(K, V, True, 90))
    assert gd_triton.launch_config(16, 40, False)["BLOCK_V"] == 32
    starts = torch.zeros(1, 45, dtype=torch.bool, device=DEVICE)
    starts[0, [0, 20]] = True
    assert_matches_the_recurrence(make(1, 45, 2, 16, 40, True), 16, starts)
