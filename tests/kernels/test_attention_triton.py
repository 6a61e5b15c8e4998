"""The Triton flash attention with key bias against the reference: outputs and every gradient
(q, k, v, bias), in fp32 under the interpreter on CPU."""

import pytest
import torch

from kernels.attention import attention

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


@pytest.mark.parametrize("name", CASES)
def test_triton_matches_reference_outputs_and_gradients(name):
    B, T, S, H, Hkv, D, causal, bias, padding = CASES[name]
    q, k, v, b, pad = inputs(B, T, S, H, Hkv, D, bias, padding)
    kwargs = dict(bias=b, causal=causal, key_padding_mask=pad)
    out = attention(q, k, v, **kwargs, backend="triton")
    ref = attention(q, k, v, **kwargs, backend="reference")
    torch.testing.assert_close(out, ref, rtol=2e-5, atol=2e-5)
    g = torch.randn_like(out)
    tensors = [t for t in (q, k, v, b) if t is not None]
    names = ["q", "k", "v", "bias"]
    for n, got, want in zip(names, torch.autograd.grad(out, tensors, g), torch.autograd.grad(ref, tensors, g)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m: f"gradient of {n}: {m}")


def test_bias_gradient_is_deterministic():
    q, k, v, b, _ = inputs(1, 33, 33, 2, 2, 16, True, False)
    b = torch.randn(1, 2, 33, device=DEVICE, requires_grad=True)
    g = torch.randn(1, 33, 2, 16, device=DEVICE)
    first, second = (torch.autograd.grad(attention(q, k, v, bias=b, backend="triton"), [b], g)[0] for _ in range(2))
    assert torch.equal(first, second)
