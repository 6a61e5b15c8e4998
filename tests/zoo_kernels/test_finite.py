"""``zoo_kernels._finite``: ``split_finite`` against ``torch.isfinite`` (every kind of non-finite entry, and the finite ones
that look like them: -0.0, the largest float, at each reduction depth), ``seen_so_far`` against its definition, and
the gradient through the SSD scan and attention with non-finite inputs, which the split passes through unmasked."""

import pytest
import torch

from torch.func import grad, vmap

from zoo_kernels import _finite as finite
from zoo_kernels._finite import split_finite
from zoo_kernels.attention import attention
from zoo_kernels.ssd import ssd_scan


def tricky(dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(3, 5, 4, 6, dtype=dtype)
    big = torch.finfo(dtype).max
    x[0, 1, 2, 3], x[1, 4, 0, 0], x[2, 0, 3, 5] = float("nan"), float("inf"), float("-inf")
    x[0, 0, 0, 0], x[1, 1, 1, 1], x[2, 2, 2, 2] = -0.0, big, -big
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("dims", [0, 1, 2])
def test_split_finite_cleans_and_marks_exactly_the_non_finite_entries(dtype, dims):
    x = tricky(dtype)
    clean, bad = split_finite(x, dims)
    ok = torch.isfinite(x)
    want = ~ok if dims == 0 else ~ok.flatten(-dims).all(-1)
    assert bad.dtype == torch.bool and torch.equal(bad, want)
    assert torch.equal(clean, torch.where(ok, x, torch.zeros_like(x)))
    assert torch.equal(clean.signbit(), x.signbit() & ok)  # -0.0 stays -0.0: a finite entry is kept bit for bit
    assert bad.sum() == 3  # the three non-finite entries lie in different rows at every depth


@pytest.mark.parametrize("contiguous", [True, False])
def test_split_finite_reads_eight_flags_to_a_word_exactly(contiguous):
    """Rows of 64 and 16 entries take the word-wise reduction; a non-finite entry at each byte of a word is found, and
    a transposed (non-contiguous) input takes the plain one with the same answer."""
    x = torch.randn(9, 64) if contiguous else torch.randn(64, 9).t()
    for row, col in enumerate(range(0, 64, 8)):  # row r: a NaN at byte r of its r-th word
        x[row, col + row % 8] = float("nan") if row % 2 else float("-inf")
    clean, bad = split_finite(x, 1)
    assert torch.equal(bad, ~torch.isfinite(x).all(-1)) and bad[:8].all() and not bad[8]
    _, bad2 = split_finite(x.reshape(9, 4, 16), 1)
    assert torch.equal(bad2, ~torch.isfinite(x.reshape(9, 4, 16)).all(-1))


def test_split_finite_passes_the_gradient_through_unchanged():
    """Its callers poison every output a non-finite entry reaches, so the gradient arriving there is zero already
    (the op-level tests below check that); the split itself masks nothing again."""
    x = tricky(torch.float64).requires_grad_()
    clean, _ = split_finite(x, 1)
    (clean * 2).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_poison_is_masked_fill_bit_for_bit_and_its_gradient_is_exactly_zero_where_it_poisons(dtype):
    """Every kind of value in ``y`` (-0.0, the largest float, ±inf, NaN) survives the product by 1 exactly, and a NaN
    or inf cotangent at a poisoned output leaves a zero, not a NaN."""
    y = tricky(dtype)  # [3, 5, 4, 6]
    where = torch.rand(3, 5, generator=torch.Generator().manual_seed(3)) < 0.4
    where[0, 0] = where[2, 2] = False  # the rows holding -0.0 and the lowest float stay as they are
    out = finite.poison(y.clone().requires_grad_(), where)
    expected = y.masked_fill(where[..., None, None], float("nan"))
    assert out.dtype == dtype and torch.equal(out.isnan(), expected.isnan())
    kept = ~expected.isnan()
    assert torch.equal(out[kept], expected[kept]) and torch.equal(out[kept].signbit(), expected[kept].signbit())
    leaf = y.clone().requires_grad_()
    cotangent = torch.randn(y.shape, dtype=dtype)
    cotangent[where] = float("nan")
    cotangent[tuple(where.nonzero()[0].tolist())] = float("inf")
    finite.poison(leaf, where).backward(cotangent)
    assert torch.equal(leaf.grad, cotangent.masked_fill(where[..., None, None], 0.0))


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # torch's own fallback for SDPA under vmap
@pytest.mark.parametrize("op", ["ssd_scan", "attention"])
def test_per_example_gradients_with_torch_func_go_through_the_finite_passes(op):
    """``vmap(grad(...))`` over three examples, one holding a NaN, equals a loop over them (the passes' autograd
    functions carry a vmap rule, as ``nan_to_num`` and ``masked_fill`` did)."""
    g = torch.Generator().manual_seed(5)
    if op == "ssd_scan":
        A = -torch.linspace(0.5, 1.5, 2)
        inputs = (torch.randn(3, 1, 11, 2, 4, generator=g), torch.rand(3, 1, 11, 2, generator=g) + 0.1,
                  torch.randn(3, 1, 11, 1, 8, generator=g), torch.randn(3, 1, 11, 1, 8, generator=g))
        call = lambda x, dt, B, C: ssd_scan(x, dt, A, B, C, chunk_size=4, backend="reference")  # noqa: E731
    else:
        inputs = (torch.randn(3, 1, 11, 2, 8, generator=g), torch.randn(3, 1, 11, 2, 8, generator=g),
                  torch.randn(3, 1, 11, 2, 8, generator=g), torch.randn(3, 1, 2, 11, generator=g))
        call = lambda q, k, v, bias: attention(q, k, v, bias=bias, backend="reference")  # noqa: E731
    inputs[0 if op == "ssd_scan" else 1][1, 0, 4, 1, 2] = float("nan")  # example 1: x (SSD) or a key (attention)
    loss = lambda *a: call(*a).nan_to_num(0.0).square().sum()  # noqa: E731
    per_example = vmap(grad(loss, argnums=(0, 1, 2, 3)))(*inputs)
    looped = [grad(loss, argnums=(0, 1, 2, 3))(*(t[e] for t in inputs)) for e in range(3)]
    for i, batched in enumerate(per_example):
        torch.testing.assert_close(batched, torch.stack([grads[i] for grads in looped]), rtol=1e-5, atol=1e-6)
        assert batched.isfinite().all()


def test_under_vmap_split_finite_takes_no_dtype_view(monkeypatch):
    """torch 2.11 has no vmap rule for ``view(dtype)`` (per-example gradients through the finite passes failed there on
    a GPU machine, 2026-11-27); this torch has one, so the test gives the view 2.11's refusal under torch.func."""
    real_view = torch.Tensor.view

    def view_as_torch_2_11(self, *args, **kwargs):
        if args and isinstance(args[0], torch.dtype) and torch._C._functorch.is_functorch_wrapped_tensor(self):
            raise RuntimeError("Batching rule not implemented for aten::view.dtype")
        return real_view(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "view", view_as_torch_2_11)
    x = torch.randn(3, 5, 2, 8)
    x[1, 2, 0, 3] = float("nan")
    clean, bad = vmap(lambda e: split_finite(e, 2))(x)
    assert torch.equal(bad, ~x.isfinite().flatten(-2).all(-1)) and torch.equal(clean, x.nan_to_num(0.0, 0.0, 0.0))
    assert torch.equal(split_finite(x, 2)[1], bad)  # outside vmap the word view is taken, as before


def test_a_compiled_split_finite_takes_no_dtype_view():
    """Inductor cannot lower a bool tensor's ``view(torch.int64)`` for CUDA (torch 2.11: a compiled generation failed on
    an H200, 2026-12-04), and compiled the word view buys nothing: the graph torch.compile traces reduces the flags
    themselves, with eager's answer."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.randn(3, 5, 16)
    x[1, 2, 3] = float("nan")
    clean, bad = torch.compile(lambda e: split_finite(e, 1), backend=backend, fullgraph=True)(x)
    views = [node for gm in graphs for node in gm.graph.nodes
             if node.target == "view" and any(isinstance(a, torch.dtype) for a in node.args)]
    assert graphs and not views, views
    assert torch.equal(bad, split_finite(x, 1)[1]) and torch.equal(clean, x.nan_to_num(0.0, 0.0, 0.0))


def _old_split(x, dims):
    """The split as it was: ``nan_to_num``'s autograd, which multiplies the gradient by ``isfinite(x)``."""
    clean, bad = split_finite(x.detach(), dims)
    return x.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0), bad


def _gradients(op, inputs, cotangent):
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items()}
    out = op(**leaves)
    outs = out if isinstance(out, tuple) else (out,)
    # the cotangent is finite everywhere, at the NaN outputs too: poison's backward must zero it there
    return dict(zip(leaves, torch.autograd.grad(outs, list(leaves.values()), cotangent)))


def _ssd_op(backend, documents):
    return lambda x, dt, B, C, initial_state: ssd_scan(
        x, dt, -torch.linspace(0.5, 1.5, x.shape[2], device=x.device), B, C, chunk_size=8,
        D=torch.linspace(-1, 1, x.shape[2], device=x.device),
        initial_state=initial_state, return_final_state=True, document_starts=documents, backend=backend)


def _attention_op(backend, documents, padding):
    return lambda q, k, v, bias: attention(q, k, v, bias=bias, key_padding_mask=padding, document_ids=documents,
                                           backend=backend)


def _poisoned(shape, generator, where):
    t = torch.randn(shape, generator=generator)
    for index, value in zip(where, (float("nan"), float("inf"), float("-inf"))):
        t[index] = value
    return t


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("documents", [False, True], ids=["one document", "documents"])
@pytest.mark.parametrize("op", ["ssd_scan", "attention"])
def test_the_gradient_reaching_a_non_finite_entry_is_zero_without_masking_it(op, documents, backend, monkeypatch):
    """A NaN, an inf and a -inf in every input (x, dt, B, C of the SSD at T 19 in chunks of 8, with a final state;
    k, v and the bias of attention with GQA and padding): the gradients are bit-for-bit those of ``nan_to_num``'s
    masking backward — so zero at every non-finite entry — and finite everywhere."""
    g = torch.Generator().manual_seed(7)
    T = 19
    device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"  # else the interpreter
    starts = torch.zeros(2, T, dtype=torch.bool)
    starts[:, 0], starts[0, 11] = True, True
    if op == "ssd_scan":
        inputs = {"x": _poisoned((2, T, 4, 8), g, [(0, 3, 1, 2), (1, 15, 3, 0), (0, 13, 0, 7)]),
                  "dt": torch.rand(2, T, 4, generator=g).add(0.05),
                  "B": _poisoned((2, T, 2, 8), g, [(1, 9, 1, 3), (0, 17, 0, 0)]),
                  "C": _poisoned((2, T, 2, 8), g, [(0, 5, 1, 1), (1, 2, 0, 4), (1, 18, 1, 7)]),
                  "initial_state": torch.randn(2, 4, 8, 8, generator=g)}
        inputs["dt"][1, 6, 2] = float("nan")
        inputs, starts = {k: v.to(device) for k, v in inputs.items()}, starts.to(device)
        call = _ssd_op(backend, starts if documents else None)
        patched = "zoo_kernels.ssd.split_finite"
    else:
        padding = torch.zeros(2, T, dtype=torch.bool)
        padding[1, :3] = True
        inputs = {"q": torch.randn(2, T, 4, 16, generator=g),
                  "k": _poisoned((2, T, 2, 16), g, [(0, 4, 1, 3), (1, 1, 0, 0), (1, 12, 1, 9)]),  # (1, 1): padding
                  "v": _poisoned((2, T, 2, 16), g, [(0, 9, 0, 2), (1, 16, 1, 15)]),
                  "bias": _poisoned((2, 4, T), g, [(0, 2, 7), (1, 3, 14)])}
        inputs, starts, padding = {k: v.to(device) for k, v in inputs.items()}, starts.to(device), padding.to(device)
        ids = torch.cumsum(starts, 1) if documents else None
        call = _attention_op(backend, ids, padding)
        patched = "zoo_kernels.attention.split_finite"
    with torch.no_grad():
        outs = call(**{k: v.clone() for k, v in inputs.items()})
    outs = outs if isinstance(outs, tuple) else (outs,)
    cotangent = [torch.randn(o.shape, generator=g).to(o.device) for o in outs]
    assert all(o.isnan().any() for o in outs[:1]) and all(o.isfinite().any() for o in outs)
    if op == "attention":  # row 1's heads 0 and 1 see only the padded key's NaN: it reaches nothing
        assert outs[0][1, 3:, :2].isfinite().all()
    new = _gradients(call, inputs, cotangent)
    monkeypatch.setattr(patched, _old_split)
    old = _gradients(call, inputs, cotangent)
    for name, gradient in new.items():
        assert gradient.isfinite().all(), name
        assert torch.equal(gradient, old[name]), name
        assert (gradient[~inputs[name].isfinite()] == 0).all(), name


def _seen_by_loop(bad, starts):
    """The definition, position by position: some bad entry at or after the document's start and at or before t."""
    seen = torch.zeros_like(bad)
    for b in range(bad.shape[0]):
        begin = 0
        for t in range(bad.shape[1]):
            if starts is not None and starts[b, t]:
                begin = t
            seen[b, t] = bad[b, begin:t + 1].any(0)
    return seen


@pytest.mark.parametrize("with_documents", [False, True])
@pytest.mark.parametrize("shape", [(3, 0), (2, 0, 5), (3, 1), (3, 29), (2, 29, 5), (2, 17, 3, 4)])
def test_seen_so_far_is_any_bad_entry_earlier_in_the_document(shape, with_documents):
    generator = torch.Generator().manual_seed(sum(shape))
    bad = torch.rand(shape, generator=generator) < 0.08
    bad[0] = False  # a row with none
    starts = (torch.rand(shape[:2], generator=generator) < 0.2) if with_documents else None
    if starts is not None and shape[1]:
        starts[-1, 0] = True
    got = finite.seen_so_far(bad, starts)
    assert got.dtype == torch.bool and got.shape == bad.shape
    assert torch.equal(got, _seen_by_loop(bad, starts))


@pytest.mark.parametrize("with_documents", [False, True])
@pytest.mark.parametrize("shape", [(3, 1), (3, 29), (2, 29, 5), (2, 17, 3, 4)])
def test_any_in_document_is_any_bad_entry_anywhere_in_the_document(shape, with_documents):
    """The non-causal reach of a non-finite input (attention without a causal mask): every position of its document."""
    generator = torch.Generator().manual_seed(sum(shape) + 1)
    bad = torch.rand(shape, generator=generator) < 0.05
    bad[0] = False  # a row with none
    starts = (torch.rand(shape[:2], generator=generator) < 0.2) if with_documents else None
    if starts is not None:
        starts[:, 0] = False  # (Context's starts: never at t = 0)
    want = torch.zeros_like(bad)
    for b in range(shape[0]):
        first = [0, *(t for t in range(1, shape[1]) if starts is not None and starts[b, t]), shape[1]]
        for begin, end in zip(first[:-1], first[1:]):
            want[b, begin:end] = bad[b, begin:end].any(0)
    assert torch.equal(finite.any_in_document(bad, starts), want)
