"""The Triton gather-and-mix against the reference: outputs and every gradient (interpreter on CPU)."""

import importlib

import pytest
import torch

from zoo_kernels.retrieval import expert_mix

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("M, H, k, N, d, act", [(1, 1, 2, 16, 8, "silu"), (17, 2, 3, 25, 24, "gelu"),
                                                 (65, 4, 2, 9, 33, "relu")])
def test_triton_matches_reference_outputs_and_gradients(M, H, k, N, d, act):
    torch.manual_seed(0)
    x = torch.randn(M, d, device=DEVICE, requires_grad=True)
    down = torch.randn(N, d, device=DEVICE, requires_grad=True)
    up = torch.randn(N, d, device=DEVICE, requires_grad=True)
    weights = torch.rand(M, H, k, device=DEVICE, requires_grad=True)
    experts = torch.randint(0, N, (M, H, k), device=DEVICE)  # N small: many tokens share experts
    y = expert_mix(x, experts, weights, down, up, act=act, backend="triton")
    ref = expert_mix(x, experts, weights, down, up, act=act, backend="reference")
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(y)
    inputs = [x, weights, down, up]
    for name, got, want in zip(["x", "weights", "down", "up"], torch.autograd.grad(y, inputs, g),
                               torch.autograd.grad(ref, inputs, g)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m: f"gradient of {name}: {m}")


def test_relus_derivative_at_zero_is_zero_as_torchs_is():
    """A token whose score is exactly 0 (a zero row of ``x``, a zero ``down`` row) passes no gradient through relu."""
    torch.manual_seed(0)
    M, H, k, N, d = 6, 2, 2, 5, 8
    x = torch.randn(M, d, device=DEVICE)
    x[1] = x[4] = 0
    down, up = torch.randn(N, d, device=DEVICE), torch.randn(N, d, device=DEVICE)
    down[2] = 0
    leaves = [t.requires_grad_() for t in (x, torch.rand(M, H, k, device=DEVICE), down, up)]
    experts = torch.randint(0, N, (M, H, k), device=DEVICE)
    experts[0, 0, 0] = 2
    outs = [expert_mix(leaves[0], experts, *leaves[1:], act="relu", backend=b) for b in ("triton", "reference")]
    g = torch.randn_like(outs[1])
    for got, want in zip(torch.autograd.grad(outs[0], leaves, g), torch.autograd.grad(outs[1], leaves, g)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_cdmoe_runs_on_the_triton_backend():
    from components import CDMoE

    torch.manual_seed(0)
    moe = CDMoE(16, n_experts=64, n_heads=2, top_k=4, key_dim=8, backend="reference").to(DEVICE)
    x = torch.randn(1, 7, 16, device=DEVICE)
    want = moe(x)
    moe.backend = "triton"
    torch.testing.assert_close(moe(x), want, rtol=1e-5, atol=1e-5)


def test_a_fullgraph_compile_through_the_kernel_equals_eager(compiled_equals_eager):
    """hybrid_zoo::expert_mix and its backward are torch.library ops, opaque to torch.compile."""
    torch.manual_seed(0)
    M, H, k, N, d = 13, 2, 3, 20, 24
    leaves = [torch.randn(M, d, device=DEVICE, requires_grad=True), torch.rand(M, H, k, device=DEVICE, requires_grad=True),
              torch.randn(N, d, device=DEVICE, requires_grad=True), torch.randn(N, d, device=DEVICE, requires_grad=True)]
    experts = torch.randint(0, N, (M, H, k), device=DEVICE)
    call = lambda x, w, down, up: expert_mix(x, experts, w, down, up, act="gelu", backend="triton")  # noqa: E731
    # on a GPU the rows' gradients are summed by atomics, in any order
    compiled_equals_eager(call, leaves, grad_tol=0 if DEVICE == "cpu" else 1e-5)


def test_the_custom_ops_shape_functions_and_autograd_pass_torchs_opcheck():
    """The gather-and-mix ops' fake (shape) functions give what the kernels give, so torch.compile traces them right
    (on contiguous operands: ``expert_mix`` makes them so before calling the op, whose kernels index them so)."""
    importlib.import_module("zoo_kernels.retrieval.triton")  # registers the ops

    torch.manual_seed(0)
    M, HK, N, d = 5, 4, 9, 24
    x, dy = torch.randn(M, d, device=DEVICE), torch.randn(M, d, device=DEVICE)
    experts = torch.randint(0, N, (M, HK), device=DEVICE)
    weights = torch.rand(M, HK, device=DEVICE)
    down, up = torch.randn(N, d, device=DEVICE), torch.randn(N, d, device=DEVICE)
    forward = (x, experts, weights, down, up, "gelu")
    assert set(torch.library.opcheck(torch.ops.hybrid_zoo.expert_mix.default, forward).values()) == {"SUCCESS"}
    assert set(torch.library.opcheck(torch.ops.hybrid_zoo.expert_mix_backward.default, (dy, *forward)).values()) == {
        "SUCCESS"}
