"""The chunked gated delta rule against the token-by-token recurrence (the oracle) and against transformers' own
plain-torch rule (Qwen3-Next's), outputs, final state and every gradient; documents, non-finite inputs, bad input."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from zoo_kernels.gated_delta import gated_delta_recurrent, gated_delta_rule, gated_delta_step

NAMES = ("q", "k", "v", "g", "beta", "initial_state")


def make(T, H=3, K=8, V=6, batch=2, initial=True, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed * 1000 + T)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    return {
        "q": r(batch, T, H, K),
        "k": F.normalize(r(batch, T, H, K), dim=-1),  # the rule assumes unit keys
        "v": r(batch, T, H, V),
        "g": -F.softplus(r(batch, T, H) - 2.0),  # log-decays in (-∞, 0), most near -0.1
        "beta": torch.sigmoid(r(batch, T, H)),
        "initial_state": r(batch, H, K, V) if initial else None,
    }


def run(fn, inputs, **kwargs):
    leaves = {n: t.clone().requires_grad_() for n, t in inputs.items() if t is not None}
    args = {n: leaves.get(n) for n in NAMES}
    y, final = fn(args["q"], args["k"], args["v"], args["g"], args["beta"], initial_state=args["initial_state"],
                  **kwargs)
    gen = torch.Generator().manual_seed(1)
    loss = ((y * torch.randn(y.shape, generator=gen, dtype=y.dtype)).sum()
            + (final * torch.randn(final.shape, generator=gen, dtype=final.dtype)).sum())
    return y, final, dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))


def chunked(q, k, v, g, beta, **kwargs):
    return gated_delta_rule(q, k, v, g, beta, return_final_state=True, **kwargs)


def recurrent(q, k, v, g, beta, **kwargs):
    return gated_delta_recurrent(q, k, v, g, beta, scale=q.shape[-1] ** -0.5, **kwargs)


@pytest.mark.parametrize("T, chunk, initial", list(itertools.product([1, 7, 16, 17, 45], [4, 16, 64], [True, False])))
def test_chunked_matches_the_recurrence_outputs_state_and_every_gradient(T, chunk, initial):
    inputs = make(T, initial=initial)
    y, final, grads = run(chunked, inputs, chunk_size=chunk)
    y_ref, final_ref, grads_ref = run(recurrent, inputs)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(final, final_ref)
    assert set(grads) == {n for n in NAMES if inputs[n] is not None}
    for name in grads:
        torch.testing.assert_close(grads[name], grads_ref[name], msg=name)


def test_fp32_inputs_give_the_float64_rule_within_fp32_rounding():
    inputs = make(45)
    y64, final64 = chunked(*(inputs[n] for n in NAMES[:5]), initial_state=inputs["initial_state"], chunk_size=16)
    y32, final32 = chunked(*(inputs[n].float() for n in NAMES[:5]), initial_state=inputs["initial_state"].float(),
                           chunk_size=16)
    assert y32.dtype == final32.dtype == torch.float32
    torch.testing.assert_close(y32, y64.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(final32, final64.float(), rtol=1e-4, atol=1e-5)


def test_a_state_that_forgets_nothing_and_writes_fully_is_the_delta_rule_by_hand():
    """``g = 0``, ``beta = 1``: writing ``v`` at a unit ``k`` replaces what the state held at ``k``, so reading at ``k``
    gives back the last value written there, whatever was written at that key before (orthogonal keys kept apart)."""
    K = V = 4
    keys = torch.eye(K, dtype=torch.float64)
    order = [0, 1, 0, 2]  # key 0 written twice: the second value replaces the first
    k = keys[order][None, :, None]  # [1, 4, 1, K]
    v = torch.randn(1, 4, 1, V, dtype=torch.float64)
    zeros = torch.zeros(1, 4, 1, dtype=torch.float64)
    _, state = gated_delta_rule(k, k, v, zeros, zeros + 1, return_final_state=True, chunk_size=3)
    torch.testing.assert_close(state[0, 0, 0], v[0, 2, 0])  # the second write at key 0
    torch.testing.assert_close(state[0, 0, 1], v[0, 1, 0])
    torch.testing.assert_close(state[0, 0, 2], v[0, 3, 0])
    assert state[0, 0, 3].abs().max() == 0  # never written


def test_the_rule_matches_transformers_plain_torch_rule():
    """Qwen3-Next's ``torch_chunk_gated_delta_rule`` (its queries and keys L2-normalised inside), on the same inputs."""
    qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    inputs = make(45, initial=True, dtype=torch.float32)
    raw_q, raw_k = torch.randn_like(inputs["q"]), torch.randn_like(inputs["k"])
    unit = lambda t: t * torch.rsqrt(t.pow(2).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    ours = chunked(unit(raw_q), unit(raw_k), inputs["v"], inputs["g"], inputs["beta"],
                   initial_state=inputs["initial_state"], chunk_size=16)
    theirs = qwen3_next.torch_chunk_gated_delta_rule(raw_q, raw_k, inputs["v"], inputs["g"], inputs["beta"],
                                                     chunk_size=16, initial_state=inputs["initial_state"],
                                                     output_final_state=True, use_qk_l2norm_in_kernel=True)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [4, 64])
def test_a_document_start_resets_the_state_so_a_packed_row_is_its_documents_alone(chunk):
    inputs = make(23, batch=1, initial=False)
    starts = torch.zeros(1, 23, dtype=torch.bool)
    starts[0, [6, 7, 15]] = True  # a one-token document at 6, and a start that falls inside a chunk
    y, final = chunked(*(inputs[n] for n in NAMES[:5]), document_starts=starts, chunk_size=chunk)
    y_ref, final_ref = recurrent(*(inputs[n] for n in NAMES[:5]), document_starts=starts)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(final, final_ref)
    for a, b in [(0, 6), (6, 7), (7, 15), (15, 23)]:  # each document alone, from a zero state
        alone, last = chunked(*(inputs[n][:, a:b] for n in NAMES[:5]), chunk_size=chunk)
        torch.testing.assert_close(y[:, a:b], alone)
    torch.testing.assert_close(final, last)


@pytest.mark.parametrize("name", NAMES[:5])
def test_a_non_finite_input_reaches_only_its_position_and_after_in_its_document(name):
    inputs = make(13, batch=1, initial=False)
    starts = torch.zeros(1, 13, dtype=torch.bool)
    starts[0, 9] = True
    inputs[name][0, 4, 1] = float("nan")  # head 1 at position 4
    y, final = chunked(*(inputs[n] for n in NAMES[:5]), document_starts=starts, chunk_size=4)
    bad = y[0].isnan().any(-1)  # [T, H]
    reached = list(range(4, 9)) if name != "q" else [4]  # a query only reads: its own position
    assert bad[:, 1].nonzero().flatten().tolist() == reached
    assert not bad[:, [0, 2]].any()
    assert not final.isnan().any()  # the document that ends the row began after it
    clean = make(13, batch=1, initial=False)
    y_clean, _ = chunked(*(clean[n] for n in NAMES[:5]), document_starts=starts, chunk_size=4)
    keep = ~bad[..., None].expand_as(y[0])
    torch.testing.assert_close(y[0][keep], y_clean[0][keep])  # and the rest is what it was
    _, final = chunked(*(inputs[n] for n in NAMES[:5]), chunk_size=4)  # one document: the state carries what entered it
    assert final[0].isnan().flatten(1).all(-1).tolist() == [False, name != "q", False]


def test_a_step_from_the_chunked_state_continues_the_sequence():
    inputs = make(21, initial=True)
    args = [inputs[n] for n in NAMES[:5]]
    y, final = chunked(*args, initial_state=inputs["initial_state"], chunk_size=4)
    y_head, state = chunked(*(t[:, :20] for t in args), initial_state=inputs["initial_state"], chunk_size=4)
    y_last, state = gated_delta_step(state, *(t[:, 20] for t in args), scale=8 ** -0.5)
    torch.testing.assert_close(y_last, y[:, 20])
    torch.testing.assert_close(state, final)


def test_an_empty_sequence_returns_no_output_and_the_state_it_was_given():
    inputs = make(0, initial=True)
    y, final = chunked(*(inputs[n] for n in NAMES[:5]), initial_state=inputs["initial_state"])
    assert y.shape == (2, 0, 3, 6) and final is inputs["initial_state"]


@pytest.mark.parametrize("change, message", [
    ({"q": torch.zeros(2, 5, 3, 7)}, r"q\(2, 5, 3, 7\) \(want \[B, T, H, K\] as k\)"),
    ({"v": torch.zeros(2, 5, 2, 6)}, r"v\(2, 5, 2, 6\)"),
    ({"g": torch.zeros(2, 5, 3, 1)}, r"g\(2, 5, 3, 1\)"),
    ({"beta": torch.zeros(2, 4, 3)}, r"beta\(2, 4, 3\)"),
    ({"k": torch.zeros(2, 5, 24)}, r"k must be \[B, T, H, K\]; got shape \(2, 5, 24\)"),
    ({"initial_state": torch.zeros(2, 3, 6, 8)}, r"initial_state must be \[B, H, K, V\] = \(2, 3, 8, 6\)"),
    ({"document_starts": torch.zeros(2, 5)}, r"document_starts must be a bool \[B, T\]"),
    ({"chunk_size": 0}, r"chunk_size=0 must be a positive integer"),
])
def test_bad_input_is_named(change, message):
    inputs = {**make(5, dtype=torch.float32), "document_starts": None, "chunk_size": 4, **change}
    with pytest.raises(ValueError, match=message):
        gated_delta_rule(*(inputs[n] for n in NAMES[:5]), initial_state=inputs["initial_state"],
                         document_starts=inputs["document_starts"], chunk_size=inputs["chunk_size"])
