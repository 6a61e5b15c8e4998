import os

import pytest
import torch

# Without a GPU, Triton kernels run in Triton's numpy interpreter (fp32 only, slow: tiny shapes).
# It must be chosen before triton compiles anything; the kernel modules import triton lazily.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def compiled_equals_eager():
    """``check(call, leaves, grad_tol=0)``: ``torch.compile(call, fullgraph=True)`` (aot_eager: dynamo's graph and
    the autograd split, no code generated) gives what ``call`` gives eagerly — every output, and the gradient of a
    random weighting of them with respect to every leaf. A custom op whose fake function or autograd registration
    is wrong breaks the graph or the numbers here. ``grad_tol``: for kernels that sum gradients by atomics."""

    def check(call, leaves, grad_tol=0.0):
        got, want = torch.compile(call, fullgraph=True, backend="aot_eager")(*leaves), call(*leaves)
        got, want = (got,) if torch.is_tensor(got) else got, (want,) if torch.is_tensor(want) else want
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
        weights = [torch.randn_like(w) for w in want]
        loss = lambda outs: sum((o * w).sum() for o, w in zip(outs, weights))  # noqa: E731
        for i, (g, w) in enumerate(zip(torch.autograd.grad(loss(got), leaves), torch.autograd.grad(loss(want), leaves))):
            torch.testing.assert_close(g, w, rtol=grad_tol, atol=grad_tol, msg=lambda m: f"gradient of leaf {i}: {m}")
        torch._dynamo.reset()

    return check
