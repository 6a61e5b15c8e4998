"""``zoo_kernels.linear_cross_entropy`` against the written-out logits: the loss and both gradients over chunks
that do not divide the rows, ignored rows, every dtype the head runs in, with and without PaLM's z-loss, and bad
input named."""

import pytest
import torch

from zoo_kernels.linear_cross_entropy import (IGNORE_INDEX, linear_cross_entropy, linear_cross_entropy_parts,
                                              linear_cross_entropy_reference)

TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}


def problem(n: int, dtype: torch.dtype, seed: int = 0, vocab: int = 50, d: int = 16):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g).to(dtype).requires_grad_()
    weight = (0.3 * torch.randn(vocab, d, generator=g)).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (n,), generator=g)
    labels[::5] = IGNORE_INDEX
    return hidden, weight, labels


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> bool:
    return torch.allclose(a.double(), b.double(), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


@pytest.mark.parametrize("z_loss", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, chunk_rows", [(37, 8), (37, 37), (37, 100), (1, 4), (64, 16)])
def test_loss_and_gradients_equal_the_written_out_logits(dtype, n, chunk_rows, z_loss):
    hidden, weight, labels = problem(n, dtype)
    want = linear_cross_entropy_reference(hidden, weight, labels, z_loss=z_loss)
    want_grads = torch.autograd.grad(want, (hidden, weight))
    got = linear_cross_entropy(hidden, weight, labels, chunk_rows=chunk_rows, z_loss=z_loss)
    got_grads = torch.autograd.grad(got, (hidden, weight))
    assert got.dtype == want.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert close(got, want, dtype)
    for g, w in zip(got_grads, want_grads):
        assert g.dtype == dtype and close(g, w, dtype)
    assert not got_grads[0][labels == IGNORE_INDEX].any()  # an ignored row's hidden gets no gradient


def test_the_incoming_gradient_scales_both_gradients_and_a_shared_weight_adds_up():
    hidden, weight, labels = problem(23, torch.float64)
    tied = torch.randn(23, 50, dtype=torch.float64)  # the weight also used elsewhere (tied embeddings)

    def grads(loss_fn):
        return torch.autograd.grad(-2.5 * loss_fn(hidden, weight, labels) + (tied @ weight).sum(), (hidden, weight))

    got = grads(lambda *args: linear_cross_entropy(*args, chunk_rows=6))
    want = grads(linear_cross_entropy_reference)
    assert all(torch.allclose(g, w, rtol=1e-12, atol=1e-12) for g, w in zip(got, want))


@pytest.mark.parametrize("needs", [(True, False), (False, True)])
def test_only_the_gradients_asked_for_are_formed(needs):
    hidden, weight, labels = problem(19, torch.float64)
    hidden.requires_grad_(needs[0])
    weight.requires_grad_(needs[1])
    asked = [t for t, need in zip((hidden, weight), needs) if need]
    got = torch.autograd.grad(linear_cross_entropy(hidden, weight, labels, chunk_rows=4), asked)
    want = torch.autograd.grad(linear_cross_entropy_reference(hidden, weight, labels), asked)
    assert torch.allclose(got[0], want[0], rtol=1e-12, atol=1e-12)


def test_a_second_derivative_is_refused_not_silently_zero():
    hidden, weight, labels = problem(9, torch.float64)
    (dh,) = torch.autograd.grad(linear_cross_entropy(hidden, weight, labels, chunk_rows=4), hidden, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|does not require grad"):
        torch.autograd.grad(dh.sum(), hidden)


def test_without_gradients_the_loss_is_the_same_and_no_graph_is_made():
    hidden, weight, labels = problem(29, torch.float64)
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, labels, chunk_rows=7)
    assert loss.grad_fn is None
    assert torch.allclose(loss, linear_cross_entropy_reference(hidden, weight, labels), rtol=1e-12)


def test_rows_all_ignored_give_zero_and_an_ignored_non_finite_row_does_not_leak():
    hidden, weight, labels = problem(12, torch.float32)
    none = torch.full_like(labels, IGNORE_INDEX)
    loss = linear_cross_entropy(hidden, weight, none, chunk_rows=5)
    dh, dw = torch.autograd.grad(loss, (hidden, weight))
    assert loss.item() == 0 and not dh.any() and not dw.any()
    poisoned = hidden.detach().clone()
    poisoned[3] = float("nan")  # a row without a label (as padding is): its logits are never used
    labels[3] = IGNORE_INDEX
    poisoned.requires_grad_()
    loss = linear_cross_entropy(poisoned, weight, labels, chunk_rows=5)
    dh, dw = torch.autograd.grad(loss, (poisoned, weight))
    assert torch.isfinite(loss) and torch.isfinite(dh).all() and torch.isfinite(dw).all()


def test_the_z_loss_is_palms_and_its_part_comes_apart_for_the_log():
    """``z_loss · Σ logsumexp²`` over the kept rows, written out here from ``torch.logsumexp`` (the reference's own
    term is what the gradients are checked against); the parts give that sum detached, with and without a graph."""
    hidden, weight, labels = problem(23, torch.float64)
    kept = labels != IGNORE_INDEX
    squares = torch.logsumexp(hidden[kept] @ weight.t(), dim=-1).square().sum()
    ce = torch.nn.functional.cross_entropy(hidden @ weight.t(), labels, reduction="sum")
    total, parts = linear_cross_entropy_parts(hidden, weight, labels, chunk_rows=6, z_loss=0.25)
    assert torch.allclose(total, ce + 0.25 * squares, rtol=1e-12) and torch.allclose(parts, squares, rtol=1e-12)
    assert total.requires_grad and not parts.requires_grad
    with torch.no_grad():
        total, parts = linear_cross_entropy_parts(hidden, weight, labels, chunk_rows=6, z_loss=0.25)
    assert torch.allclose(total, ce + 0.25 * squares, rtol=1e-12) and torch.allclose(parts, squares, rtol=1e-12)
    assert squares > 100  # (logits of 50 tokens: logsumexp about 4, a z-loss that shows)
    for bad in (-0.1, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match=rf"linear_cross_entropy: z_loss={bad!r} must be a finite number >= 0"):
            linear_cross_entropy(hidden, weight, labels, z_loss=bad)


def test_bad_input_is_named():
    hidden, weight, labels = problem(8, torch.float32)
    with pytest.raises(ValueError, match="same d"):
        linear_cross_entropy(hidden, weight[:, :5], labels)
    with pytest.raises(ValueError, match="labels must be"):
        linear_cross_entropy(hidden, weight, labels[:5])
    with pytest.raises(ValueError, match="labels must be"):
        linear_cross_entropy(hidden, weight, labels.float())
    with pytest.raises(ValueError, match="chunk_rows"):
        linear_cross_entropy(hidden, weight, labels, chunk_rows=0)
    with pytest.raises(ValueError, match=r"hidden must be \[N, d\] and weight \[V, d\] with the same d; got \(2, 16, 16\)"):
        linear_cross_entropy(torch.randn(2, 16, 16), weight, labels)  # [B, T, d] not flattened, T = d


def test_one_row_a_chunk_is_a_chunk_and_the_default_holds_about_a_million_logits(monkeypatch):
    import zoo_kernels.linear_cross_entropy as lce

    hidden, weight, labels = problem(7, torch.float64)
    got = linear_cross_entropy(hidden, weight, labels, chunk_rows=1)
    assert torch.allclose(got, linear_cross_entropy_reference(hidden, weight, labels), rtol=1e-12)
    seen, chunked = [], lce._chunked
    monkeypatch.setattr(lce, "_chunked", lambda *a, **k: seen.append(a[4]) or chunked(*a, **k))
    linear_cross_entropy(hidden, weight, labels)  # V = 50: 2^20 // 50 rows
    linear_cross_entropy(hidden[:, :8], torch.randn(2**21, 8, dtype=torch.float64), labels)  # V > 2^20: still 1 row
    assert seen == [2**20 // 50, 1]


def test_logits_far_apart_stay_finite():
    """The softmax subtracts each row's largest logit: logits 200 apart would overflow ``exp`` in fp32 otherwise."""
    hidden, weight, labels = problem(9, torch.float32)
    hidden = (hidden.detach() * 40).requires_grad_()
    got = linear_cross_entropy(hidden, weight, labels, chunk_rows=4)
    want = linear_cross_entropy_reference(hidden, weight, labels)
    assert torch.isfinite(got) and torch.allclose(got, want, rtol=1e-5)
    (dh,) = torch.autograd.grad(got, hidden)
    assert torch.allclose(dh, torch.autograd.grad(want, hidden)[0], rtol=1e-4, atol=1e-5)


def test_under_autocast_it_follows_the_written_out_form_to_bf16_precision():
    hidden, weight, labels = problem(70, torch.float32, vocab=300, d=32)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as bf16-mixed training runs the head
        want = linear_cross_entropy_reference(hidden, weight, labels)
        want_grads = torch.autograd.grad(want, (hidden, weight))
        got = linear_cross_entropy(hidden, weight, labels, chunk_rows=16)
        got_grads = torch.autograd.grad(got, (hidden, weight))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=0)
    for g, w in zip(got_grads, want_grads):
        assert g.dtype == torch.float32  # the parameters' dtype, as autograd gives the written-out form
        torch.testing.assert_close(g, w, rtol=0, atol=2e-2 * w.abs().max().item())
