"""Packed documents at the kernel level (docs/data.md): the SSD scan with ``document_starts`` against the
recurrence that zeroes its state at each start and against each document scanned alone; attention with
``document_ids`` against each document attended alone — outputs and every gradient, odd lengths,
starts inside a chunk and on its edge."""

import pytest
import torch

from zoo_kernels.attention import attention
from zoo_kernels.ssd import ssd_scan
from zoo_kernels.ssd.reference import ssd_chunked, ssd_recurrent

LENGTHS = [5, 11, 1, 13, 7]  # 37 tokens; documents start at 5, 16 (a chunk edge for chunk 8), 17, 30


def ssd_inputs(T=sum(LENGTHS), H=4, P=3, G=2, N=4):
    g = torch.Generator().manual_seed(0)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()  # noqa: E731
    dt = torch.nn.functional.softplus(torch.randn(2, T, H, generator=g, dtype=torch.float64)).requires_grad_()
    A = (-torch.rand(H, generator=g, dtype=torch.float64) - 0.1).requires_grad_()
    return make(2, T, H, P), dt, A, make(2, T, G, N), make(2, T, G, N), make(H)


def starts():
    s = torch.zeros(2, sum(LENGTHS), dtype=torch.bool)
    s[:, torch.tensor(LENGTHS).cumsum(0)[:-1]] = True
    return s


def grads(out, inputs):
    return torch.autograd.grad(out, inputs, torch.ones_like(out))


def test_the_chunked_scan_with_document_starts_equals_the_recurrence_that_resets():
    x, dt, A, B, C, D = inputs = ssd_inputs()
    got, got_state = ssd_chunked(x, dt, A, B, C, chunk_size=8, D=D, document_starts=starts())
    want, want_state = ssd_recurrent(x, dt, A, B, C, D=D, document_starts=starts())
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got_state, want_state, rtol=1e-10, atol=1e-10)
    for g, w in zip(grads(got, inputs), grads(want, inputs)):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


def test_a_packed_scan_equals_each_document_scanned_alone():
    x, dt, A, B, C, D = inputs = ssd_inputs()
    packed = ssd_scan(x, dt, A, B, C, chunk_size=8, D=D, document_starts=starts())
    pieces = zip(*(t.split(LENGTHS, dim=1) for t in (x, dt, B, C)))
    alone = torch.cat([ssd_scan(xs, dts, A, Bs, Cs, chunk_size=8, D=D) for xs, dts, Bs, Cs in pieces], dim=1)
    torch.testing.assert_close(packed, alone, rtol=1e-10, atol=1e-10)
    for g, w in zip(grads(packed, inputs), grads(alone, inputs)):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


ATTENTION_CASES = {  # name: (bias, keep_window, document ids: one per document, or ids that come back)
    "no bias": (False, None, range(len(LENGTHS))),
    "bias": (True, None, range(len(LENGTHS))),
    "bias, keep_window 3": (True, 3, range(len(LENGTHS))),
    # ids 0, 1, 0, 1, 0: a run is a document, as for the SSD's restarts; not two documents of 3 runs
    "ids that come back": (True, None, [0, 1, 0, 1, 0]),
    "ids that come back, keep_window 4": (True, 4, [0, 1, 0, 1, 0]),
}


@pytest.mark.parametrize("name", ATTENTION_CASES)
def test_packed_attention_equals_each_document_attended_alone(name):
    with_bias, keep_window, doc_ids = ATTENTION_CASES[name]
    g = torch.Generator().manual_seed(1)
    T = sum(LENGTHS)
    q = torch.randn(2, T, 4, 8, generator=g, dtype=torch.float64).requires_grad_()
    k, v = (torch.randn(2, T, 2, 8, generator=g, dtype=torch.float64).requires_grad_() for _ in range(2))
    bias = torch.randn(2, 4, T, generator=g, dtype=torch.float64).requires_grad_() if with_bias else None
    ids = torch.repeat_interleave(torch.tensor(list(doc_ids)), torch.tensor(LENGTHS)).expand(2, -1)
    packed = attention(q, k, v, bias=bias, keep_window=keep_window, document_ids=ids)
    pieces = zip(q.split(LENGTHS, 1), k.split(LENGTHS, 1), v.split(LENGTHS, 1),
                 bias.split(LENGTHS, 2) if with_bias else [None] * len(LENGTHS))
    alone = torch.cat([attention(qs, ks, vs, bias=bs, keep_window=keep_window) for qs, ks, vs, bs in pieces], dim=1)
    torch.testing.assert_close(packed, alone, rtol=1e-10, atol=1e-10)
    inputs = [t for t in (q, k, v, bias) if t is not None]
    for gp, ga in zip(grads(packed, inputs), grads(alone, inputs)):
        torch.testing.assert_close(gp, ga, rtol=1e-9, atol=1e-9)


def test_bad_document_arguments_are_named():
    x, dt, A, B, C, D = ssd_inputs()
    with pytest.raises(ValueError, match="document_starts must be a bool"):
        ssd_scan(x, dt, A, B, C, document_starts=starts().long())
    with pytest.raises(ValueError, match="document_starts is on meta and x on cpu"):
        ssd_scan(x, dt, A, B, C, document_starts=starts().to("meta"))
    q = torch.randn(1, 6, 2, 4)
    with pytest.raises(ValueError, match="document_ids must be integers"):
        attention(q, q, q, document_ids=torch.zeros(1, 6))
    with pytest.raises(ValueError, match=r"document_ids must be \[B, T\]"):
        attention(q[:, :2], q, q, document_ids=torch.zeros(1, 2, dtype=torch.long))
