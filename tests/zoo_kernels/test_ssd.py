"""The chunked SSD against the token-by-token recurrence (the oracle), outputs and every gradient."""

import itertools
import re

import pytest
import torch

from zoo_kernels.ssd import segment_sum, ssd_recurrent, ssd_scan, ssd_step


def make(T, G=2, H=4, P=8, N=16, batch=2, initial=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(T * 7 + G)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)  # noqa: E731
    return {
        "x": r(batch, T, H, P),
        "dt": torch.nn.functional.softplus(r(batch, T, H) - 3.0),  # ~0.05, as at Mamba-2 init
        "A": -torch.exp(torch.rand(H, generator=g, dtype=dtype) * 2.7),  # in [-15, -1]
        "B": r(batch, T, G, N),
        "C": r(batch, T, G, N),
        "D": r(H),
        "initial_state": r(batch, H, P, N) if initial else None,
    }


def rel_err(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def run(fn, inputs, **kwargs):
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items() if v is not None}
    args = {k: leaves.get(k) for k in inputs}
    y, final = fn(args["x"], args["dt"], args["A"], args["B"], args["C"], D=args["D"],
                  initial_state=args["initial_state"], **kwargs)
    g = torch.Generator().manual_seed(1)
    loss = (y * torch.randn(y.shape, generator=g)).sum() + (final * torch.randn(final.shape, generator=g)).sum()
    grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
    return y, final, grads


def chunked(x, dt, A, B, C, **kw):
    return ssd_scan(x, dt, A, B, C, return_final_state=True, backend="reference", **kw)


@pytest.mark.parametrize(
    "T, chunk, G, initial",
    list(itertools.product([1, 7, 63, 64, 65, 200], [16, 64], [1, 2], [True, False])),
)
def test_chunked_matches_recurrence_outputs_state_and_gradients(T, chunk, G, initial):
    inputs = make(T, G=G, initial=initial)
    y, final, grads = run(chunked, inputs, chunk_size=chunk)
    y_ref, final_ref, grads_ref = run(ssd_recurrent, inputs)
    assert rel_err(y, y_ref) <= 1e-5
    assert rel_err(final, final_ref) <= 1e-5
    assert set(grads) == set(grads_ref) == {k for k, v in inputs.items() if v is not None}
    for name in grads:
        assert rel_err(grads[name], grads_ref[name]) <= 1e-5, name


def test_the_plain_torch_scan_runs_a_long_chunk_as_chunks_of_64(monkeypatch):
    """``chunk_size=256`` (Mamba-2's, sized for GPU kernels) runs as chunks of ``REFERENCE_CHUNK`` = 64 in plain
    torch: the same outputs, state and gradients as the recurrence, at a fraction of the cost."""
    import zoo_kernels.ssd

    seen = []
    original = zoo_kernels.ssd.ssd_chunked
    monkeypatch.setattr(zoo_kernels.ssd, "ssd_chunked", lambda *a, chunk_size, **k: seen.append(chunk_size) or original(
        *a, chunk_size=chunk_size, **k))
    inputs = make(150)
    y, final, grads = run(chunked, inputs, chunk_size=256)
    y_ref, final_ref, grads_ref = run(ssd_recurrent, inputs)
    assert seen == [zoo_kernels.ssd.REFERENCE_CHUNK] == [64]
    assert rel_err(y, y_ref) <= 1e-5 and rel_err(final, final_ref) <= 1e-5
    for name in grads:
        assert rel_err(grads[name], grads_ref[name]) <= 1e-5, name
    run(chunked, make(20), chunk_size=16)
    assert seen[-1] == 16  # a shorter chunk is taken as given


def test_carrying_the_state_across_a_split_equals_the_whole():
    inputs = make(101, initial=True)
    whole, final = ssd_scan(**{k: v for k, v in inputs.items()}, chunk_size=16, return_final_state=True)
    first = {k: (v[:, :40] if k in ("x", "dt", "B", "C") else v) for k, v in inputs.items()}
    second = {k: (v[:, 40:] if k in ("x", "dt", "B", "C") else v) for k, v in inputs.items()}
    y1, s1 = ssd_scan(**first, chunk_size=16, return_final_state=True)
    second["initial_state"] = s1
    y2, s2 = ssd_scan(**second, chunk_size=16, return_final_state=True)
    assert rel_err(torch.cat([y1, y2], dim=1), whole) <= 1e-5
    assert rel_err(s2, final) <= 1e-5


def test_gradcheck_float64():
    inputs = make(5, G=1, H=2, P=3, N=4, batch=1, dtype=torch.float64)
    names = list(inputs)
    tensors = [inputs[k].requires_grad_() for k in names]

    def f(*args):
        kw = dict(zip(names, args))
        y, s = ssd_scan(**kw, chunk_size=2, return_final_state=True)
        return y, s

    assert torch.autograd.gradcheck(f, tensors)


def test_step_is_one_token_of_the_scan():
    inputs = make(1, initial=True)
    y, s = ssd_scan(**inputs, return_final_state=True)
    y_t, s_t = ssd_step(inputs["initial_state"], inputs["x"][:, 0], inputs["dt"][:, 0], inputs["A"],
                        inputs["B"][:, 0], inputs["C"][:, 0], inputs["D"])
    torch.testing.assert_close(y[:, 0], y_t)
    torch.testing.assert_close(s, s_t)


def test_segment_sum_is_the_sum_between_positions():
    a = torch.tensor([1.0, 2.0, 4.0])
    out = segment_sum(a)
    want = torch.tensor([[0.0, -float("inf"), -float("inf")], [2.0, 0.0, -float("inf")], [6.0, 4.0, 0.0]])
    torch.testing.assert_close(out, want)


def test_decay_forgets_and_zero_dt_keeps():
    # dt = 0 everywhere: no input and no decay, so the state passes through unchanged.
    inputs = make(9, initial=True)
    inputs["dt"] = torch.zeros_like(inputs["dt"])
    _, final = ssd_scan(**inputs, return_final_state=True)
    torch.testing.assert_close(final, inputs["initial_state"])


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(x=torch.zeros(2, 9, 32)), "x must be [B, T, H, P]; got shape (2, 9, 32)"),
        (dict(dt=torch.zeros(2, 9, 3)), "dt must be [B, T, H]"),
        (dict(A=torch.zeros(3)), "A must be [H]"),
        (dict(B=torch.zeros(2, 9, 3, 16), C=torch.zeros(2, 9, 3, 16)), "heads H=4 are not a multiple of groups G=3"),
        (dict(C=torch.zeros(2, 9, 2, 8)), "B and C must both be [B, T, G, N]"),
        (dict(D=torch.zeros(4, 8)), "D must be [H]"),
        (dict(initial_state=torch.zeros(2, 4, 8, 8)), "initial_state must be [B, H, P, N]"),
        (dict(chunk_size=0), "chunk_size=0 must be a positive integer"),
        (dict(backend="cuda"), "ssd_scan: backend='cuda' is not one of"),
    ],
)
def test_bad_arguments_name_the_problem(change, words):
    inputs = {**make(9), **change}
    with pytest.raises(ValueError) as info:
        ssd_scan(**inputs)
    assert words in str(info.value)


@pytest.mark.parametrize("change, got", [
    (dict(x_t=torch.zeros(3, 4, 8)), "x_t(3, 4, 8)"),
    (dict(dt_t=torch.zeros(2, 3)), "dt_t(2, 3)"),
    (dict(A=torch.zeros(3)), "A(3,)"),
    (dict(B_t=torch.zeros(2, 2, 8)), "B_t(2, 2, 8)"),
    (dict(B_t=torch.zeros(2, 3, 16), C_t=torch.zeros(2, 3, 16)), "B_t(2, 3, 16)"),  # 3 groups for 4 heads
    (dict(C_t=torch.zeros(2, 16)), "C_t(2, 16)"),
    (dict(D=torch.zeros(4, 1)), "D(4, 1)"),
    (dict(state=torch.zeros(2, 4, 8)), "state(2, 4, 8)"),
])
def test_a_step_names_its_argument_of_the_wrong_shape(change, got):
    # (each was a shape error from inside an einsum, or none: a dt_t of [2, 1] broadcast over the heads)
    step = dict(state=torch.zeros(2, 4, 8, 16), x_t=torch.randn(2, 4, 8), dt_t=torch.rand(2, 4), A=-torch.rand(4),
                B_t=torch.randn(2, 2, 16), C_t=torch.randn(2, 2, 16), D=torch.ones(4))
    y, state = ssd_step(**step)
    assert y.shape == (2, 4, 8) and state.shape == (2, 4, 8, 16)
    with pytest.raises(ValueError, match=r"ssd_step: state \[b, h, p, n\] = .* wants x_t \[b, h, p\], dt_t \[b, h\], "
                                         rf"A \[h\], B_t and C_t \[b, g, n\] .*; got {re.escape(got)}$"):
        ssd_step(**{**step, **change})


def test_a_chunk_of_one_token_is_the_recurrence():
    inputs = make(9)
    torch.testing.assert_close(ssd_scan(**{**inputs, "chunk_size": 1}), ssd_scan(**inputs))


def test_reference_computes_in_fp32_under_bf16_inputs_and_autocast():
    inputs = make(65)
    want = ssd_scan(**inputs)
    low = {k: v.bfloat16() for k, v in inputs.items()}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = ssd_scan(**low)
    assert got.dtype == torch.bfloat16
    # Only the bf16 rounding of the inputs and of the output remains (a few parts in a thousand).
    exact_from_rounded = ssd_scan(**{k: v.float() for k, v in low.items()})
    assert rel_err(got.float(), exact_from_rounded) < 1e-2
    assert rel_err(got.float(), want) < 5e-2
