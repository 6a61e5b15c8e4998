"""fp16 through the Triton kernels under the interpreter (it runs fp16, not bf16): the kernels' error
against an fp32 reference is at most about twice that of the plain-torch reference run in fp16 (flash-
attention's rule; 2.5× for the SSD), on the output and every gradient — odd lengths, documents, T ≠ S, GQA 3:1 and
head dims 80 and 96 padded to 128-wide tiles. On CUDA, tests/zoo_kernels/test_gpu_precision.py runs bf16."""

import pytest
import torch

from zoo_kernels.attention import attention
from zoo_kernels.ssd import ssd_scan

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HALF = torch.float16


def results(fn, inputs: dict, seed: int = 1) -> list[torch.Tensor]:
    """Outputs and the gradients of every floating input of ``Σ ⟨out, w⟩``, as fp32."""
    leaves = {k: (v.detach().clone().requires_grad_() if v is not None and v.is_floating_point() else v)
              for k, v in inputs.items()}
    out = fn(**leaves)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out.shape, generator=g).to(out.device)
    grads = torch.autograd.grad((out.float() * w).sum(), [v for v in leaves.values() if v is not None and v.requires_grad])
    return [t.detach().float() for t in (out, *grads)]


def assert_rule(kernel, reference, inputs: dict, factor: float):
    """Every result's max error is at most ``factor`` × the fp16 reference's, + 1e-4 (seeded, so exact)."""
    half = {k: (v.to(HALF) if v is not None and v.is_floating_point() else v) for k, v in inputs.items()}
    full = {k: (v.float() if v is not None and v.is_floating_point() else v) for k, v in half.items()}
    want = results(reference, full)
    for name, got, base, w in zip(["out", *[k for k, v in half.items() if v is not None and v.is_floating_point()]],
                                  results(kernel, half), results(reference, half), want):
        err, err_torch = (got - w).abs().max().item(), (base - w).abs().max().item()
        assert err <= factor * err_torch + 1e-4, f"{name}: kernel fp16 error {err:.3g} > {factor} × torch fp16 error {err_torch:.3g}"


@pytest.mark.parametrize("B, T, S, H, Hkv, D, docs", [
    (1, 37, 37, 3, 1, 80, False),   # GQA 3:1, D 80 in a 128-wide tile
    (2, 21, 45, 2, 2, 96, False),   # T ≠ S (a cache), D 96
    (1, 50, 50, 2, 1, 64, True),    # packed documents
])
def test_attention_fp16(B, T, S, H, Hkv, D, docs):
    torch.manual_seed(0)
    inputs = dict(q=torch.randn(B, T, H, D, device=DEVICE), k=torch.randn(B, S, Hkv, D, device=DEVICE),
                  v=torch.randn(B, S, Hkv, D, device=DEVICE), bias=torch.randn(B, H, S, device=DEVICE))
    document_ids = torch.arange(T, device=DEVICE).div(17, rounding_mode="floor").expand(B, T) if docs else None
    run = lambda backend: lambda **a: attention(**a, causal=True, document_ids=document_ids, backend=backend)  # noqa: E731
    assert_rule(run("triton"), run("reference"), inputs, factor=2.0)  # at most 1.9× here; fp16 accumulation gives 2.6×


@pytest.mark.parametrize("T, chunk, docs", [(45, 16, False), (70, 32, True)])
def test_ssd_fp16(T, chunk, docs):
    torch.manual_seed(0)
    H, P, G, N = 4, 16, 2, 16
    # drawn on the CPU, so a GPU checks the same numbers as the interpreter
    inputs = dict(x=torch.randn(1, T, H, P), dt=torch.nn.functional.softplus(torch.randn(1, T, H) - 1.0),
                  B=torch.randn(1, T, G, N), C=torch.randn(1, T, G, N))
    inputs = {name: t.to(DEVICE) for name, t in inputs.items()}
    A = -torch.exp(0.5 * torch.randn(H)).to(DEVICE)
    starts = None
    if docs:
        starts = torch.zeros(1, T, dtype=torch.bool, device=DEVICE)
        starts[0, [0, 23, 51]] = True
    run = lambda backend: lambda **a: ssd_scan(a["x"], a["dt"], A.to(a["x"].dtype), a["B"], a["C"], chunk_size=chunk,  # noqa: E731
                                               document_starts=starts, backend=backend)
    assert_rule(run("triton"), run("reference"), inputs, factor=2.5)  # at most 2.1× here (the chunk's scores in fp16)


def test_ssd_dA_in_fp16_with_long_chunks_and_small_steps():
    """dA summed term by term: at L = 256 and dt ~ 0.01 in fp16 its error against float64 (on the same
    rounded inputs) is 9e-5; the reverse cumulative sum of dΛ, which adds and subtracts every pair term,
    gave 6e-4 here."""
    from zoo_kernels.ssd.reference import ssd_chunked

    torch.manual_seed(0)
    T, L, H, P, G, N = 300, 256, 2, 16, 1, 16
    x, B, C = torch.randn(1, T, H, P), torch.randn(1, T, G, N), torch.randn(1, T, G, N)
    dt, A = torch.rand(1, T, H) * 0.01, -torch.rand(H) - 0.5
    half = [t.half().to(DEVICE) for t in (x, dt, A, B, C)]

    def dA(fn, inputs):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        y, _ = fn(*leaves)
        w = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y.device, torch.float64)
        return torch.autograd.grad((y.double() * w).sum(), leaves[2])[0].double()

    want = dA(lambda *a: ssd_chunked(*a, chunk_size=L), [t.double() for t in half])
    got = dA(lambda *a: ssd_scan(*a, chunk_size=L, return_final_state=True, backend="triton"), half)
    assert ((got - want).norm() / want.norm()).item() < 2e-4


def test_a_model_under_fp16_autocast_trains_through_the_kernels_as_through_the_references(monkeypatch):
    """Autocast needs nothing from the ops (no custom_fwd/custom_bwd): under it the projections hand the kernels
    half q/k/v, x, B and C beside fp32 dt, A, key biases and expert rows, which they take; the ops' backward runs
    Triton alone, which autocast does not touch. A hybrid with SSD, QCAttention, CDMoE and Cheems' InnerFuncAttention, its
    loss and every parameter's gradient under fp16 autocast, over five seeds: the kernels' error against the fp32
    model, relative to the true value's largest entry and the worst of the seeds, is at most twice that of the same
    model on the plain-torch references under the same autocast (+ the floor below).

    Why five seeds: a parameter of a few entries (``A_log``, ``dt_bias``, Doge's ``A``: one per head) gives the
    references' error as the largest of four draws, which can land low by luck. Seed by seed, the ratio reached 4.4 on
    a CPU (``A_log`` at seed 1: 2.0e-7 against 4.3e-8) and 2.2 on an H200 (seed 0); over any five consecutive seeds of
    sixteen on a CPU at most 1.9 (Doge's ``A``), over these five 1.36 (docs/testing.md).

    Why the half runs take the fp32 run's experts: a near-tie in CDMoE's top-k flips under any rounding, and a
    flipped expert changes the function, so every gradient after it (on an H200 the two half runs flipped different
    heads: up to 40× the references' error on the router's keys). Each run's own top-k is still counted: at most 6 of
    the 144 heads may pick unlike the fp32 model's."""
    import contextlib
    from functools import partial

    from components import MLP, SSD, CDMoE, HybridLM, InnerFuncAttention, QCAttention

    def model(backend, seed):
        torch.manual_seed(seed)
        return HybridLM(97, 64, "SM AC IM", {
            "C": partial(CDMoE, n_experts=64, n_heads=2, top_k=4, key_dim=8, backend=backend),
            "S": partial(SSD, head_dim=16, d_state=16, chunk_size=16, rope=True, backend=backend), "M": MLP,
            "A": partial(QCAttention, n_heads=4, backend=backend),
            "I": partial(InnerFuncAttention, n_heads=4, mask="cheems", backend=backend)}, max_seq_len=64).to(DEVICE)

    import components.state.cdmoe as cdmoe

    picked, forced = [], []  # the experts each run's own top-k picked; the fp32 run's, for the half runs
    topk = cdmoe.product_key_topk

    def routed(scores_a, scores_b, k):
        scores, experts = topk(scores_a, scores_b, k)  # [M, H, k] each
        picked.append(experts)
        if forced:  # the fp32 run's experts, scored by this run: expert e = i·n_b + j
            own, (experts, n_b) = scores, (forced[0], scores_b.shape[-1])
            scores = scores_a.gather(-1, experts // n_b) + scores_b.gather(-1, experts % n_b)
            # where this run picked the same experts, the scores it hands on are its own top-k's, bit for bit (a
            # wrong scoring would change both half runs alike, and the rule compares them with each other)
            same = (experts.sort(-1).values == picked[-1].sort(-1).values).all(-1)  # [M, H]
            assert same.float().mean() > 0.9 and torch.equal(scores.sort(-1).values[same], own.sort(-1).values[same])
        return scores, experts

    monkeypatch.setattr(cdmoe, "product_key_topk", routed)

    def loss_and_grads(net, tokens, autocast: bool):
        with torch.autocast(DEVICE, dtype=HALF, enabled=autocast):
            logits = net(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        grads = torch.autograd.grad(loss, list(net.parameters()))
        return [loss.detach().float(), *(g.float() for g in grads)]

    names = ["loss", *(name for name, _ in model("reference", 0).named_parameters())]
    worst = {name: [0.0, 0.0] for name in names}  # the kernels' and the references' relative errors, worst seed
    for seed in range(5):
        tokens = torch.randint(0, 97, (2, 37), generator=torch.Generator().manual_seed(3 + seed)).to(DEVICE)
        picked.clear()
        forced.clear()
        exact = loss_and_grads(model("reference", seed), tokens, autocast=False)
        forced.append(picked[0])
        with torch.profiler.profile() if seed == 0 else contextlib.nullcontext() as profile:
            kernel = loss_and_grads(model("triton", seed), tokens, True)
        if seed == 0:
            ran = {event.name for event in profile.events() if event.name.startswith("hybrid_zoo::")}
            assert ran == {f"hybrid_zoo::{op}{part}" for op in ("ssd_scan", "bias_attention", "expert_mix")
                           for part in ("", "_backward")}
        torch_half = loss_and_grads(model("reference", seed), tokens, True)
        assert len(picked) == 3, f"CDMoE routed {len(picked)} times in three forwards"
        exact_route, *half_routes = (r.sort(-1).values for r in picked)  # [M, H, k] each
        flipped = [int((r != exact_route).any(-1).sum()) for r in half_routes]
        assert max(flipped) <= 6, f"seed {seed}: {flipped} of {exact_route[..., 0].numel()} CDMoE heads routed unlike the fp32 model"
        for name, got, base, want in zip(names, kernel, torch_half, exact):
            scale = want.abs().max().item()
            for k, err in enumerate(((got - want).abs().max().item(), (base - want).abs().max().item())):
                worst[name][k] = max(worst[name][k], err / scale)
    # The floor: a hundredth of an fp16 step (2^-10) at the largest true value. The loss is one number, so the
    # references' error on it is a single draw that can cancel: on an AMX CPU 1.7e-5 against the kernels' 3.9e-5
    # on a loss of 4.7, whose fp16 step is 4e-3.
    floor = 2 ** -10 / 100
    over = [f"{name}: kernels under autocast {err:.3g} > 2 × references' {err_torch:.3g}"
            for name, (err, err_torch) in worst.items() if err > 2 * err_torch + floor]
    assert not over, "; ".join(over) + " (relative to each value's largest entry, the worst of five seeds)"


@pytest.mark.parametrize("docs", [False, True])
def test_ssd_fp16_with_hoppers_switches(docs, monkeypatch):
    """The switches ``launch_config`` turns on for bf16/fp16 on Hopper — ``shared_scores`` (dC, dB per group) and
    ``narrow_states`` (the chunks' states in fp16 here) — under the same rule: the interpreter takes neither by
    itself, so they are forced on, and both are checked to be taken."""
    from zoo_kernels.ssd import triton as ssd_triton

    config = ssd_triton.launch_config
    monkeypatch.setattr(ssd_triton, "launch_config",
                        lambda *a, **k: {**config(*a, **k), "shared_scores": True, "narrow_states": True})
    scores, states = [], []
    group_scores, scan = ssd_triton._group_scores_call, ssd_triton._decayed_scan_call
    monkeypatch.setattr(ssd_triton, "_group_scores_call", lambda *a: scores.append(group_scores(*a)) or scores[-1])
    monkeypatch.setattr(ssd_triton, "_decayed_scan_call", lambda *a, **k: states.append(scan(*a, **k)) or states[-1])
    torch.manual_seed(0)
    T, chunk, H, P, G, N = 70, 32, 4, 32, 2, 16  # G·L = 64 fp32 scores a position take no more than H·P = 128 fp16s
    inputs = dict(x=torch.randn(1, T, H, P), dt=torch.nn.functional.softplus(torch.randn(1, T, H) - 1.0),
                  B=torch.randn(1, T, G, N), C=torch.randn(1, T, G, N))
    inputs = {name: t.to(DEVICE) for name, t in inputs.items()}
    A = -torch.exp(0.5 * torch.randn(H)).to(DEVICE)
    starts = torch.zeros(1, T, dtype=torch.bool, device=DEVICE)
    starts[0, [0, 23, 51]] = docs
    run = lambda backend: lambda **a: ssd_scan(a["x"], a["dt"], A.to(a["x"].dtype), a["B"], a["C"], chunk_size=chunk,  # noqa: E731
                                               document_starts=starts if docs else None, backend=backend)
    assert_rule(run("triton"), run("reference"), inputs, factor=2.5)
    assert any(s is not None for s in scores)  # the fp16 calls' (their fp32 references take no kernel)
    assert {out.dtype for out, _ in states} == {HALF} and {final.dtype for _, final in states} == {torch.float32}


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_an_fp32_bias_beside_fp16_activations_is_rounded_first_the_window_included(backend):
    """Mixed precision gives attention an fp32 bias (made from fp32 parameters) beside half activations. Every
    backend rounds it to the activations' dtype first, so the key window ranks the values the scores add: here odd
    keys lead by 2^-12 in fp32, a lead fp16 rounds away, and with it the window keeps the most recent keys, not the
    most recent odd ones — on either backend, exactly as if the bias had come in fp16."""
    torch.manual_seed(0)
    T, D = 12, 16
    q, k, v = (torch.randn(1, T, 1, D, device=DEVICE).half() for _ in range(3))
    bias = 1.0 + (torch.arange(T, device=DEVICE) % 2).float().view(1, 1, T) * 2.0**-12  # [1, 1, T]
    assert bias.half().unique().numel() == 1 and bias.unique().numel() == 2
    run = lambda b, be=backend: attention(q, k, v, bias=b, keep_window=2, backend=be)  # noqa: E731
    torch.testing.assert_close(run(bias), run(bias.half()), rtol=0, atol=0)
    torch.testing.assert_close(run(bias).float(), run(bias.half(), "reference").float(), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_an_fp32_bias_beyond_fp16s_range_is_clamped_into_it_not_rounded_to_infinity(backend):
    """A soft mask of -1e6 and a lead of 1e5 in an fp32 bias beside fp16 activations: cast alone they round to ∓inf,
    which attention takes for non-finite inputs (NaN for every query that sees them). Clamped to ±65504 they mean what
    they mean in fp32 — the masked key gets no weight, the leading one all of it from where it is seen — in the full
    forward and in decoding's cache; the gradient is the clamped bias's, and an infinite entry stays infinite."""
    from components.cache import InferenceCache
    from components.context import Context

    torch.manual_seed(0)
    T, D = 9, 16
    q, k, v = (torch.randn(1, T, 1, D, device=DEVICE) for _ in range(3))
    bias = torch.randn(1, 1, T, device=DEVICE)  # [B, H, S]
    bias[..., 3], bias[..., 6] = -1e6, 1e5
    assert not bias.half().isfinite().all()
    want = attention(q, k, v, bias=bias, backend="reference")  # fp32
    half = lambda t: t.half()  # noqa: E731
    got = attention(*map(half, (q, k, v)), bias=bias, backend=backend)
    assert got.isfinite().all()
    torch.testing.assert_close(got.float(), want, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(got[:, 6:].float(), v[:, 6:7].half().float().expand(-1, T - 6, -1, -1), rtol=0,
                               atol=1e-3)
    # The gradient: the clamped bias's, straight through. 2e5 at key 7 ties with 1e5 once both are clamped, so both
    # keys take weight and gradient from query 7 on (a clamp without the straight-through would give them none).
    tied = bias.clone()
    tied[..., 7] = 2e5
    leaf, clamped = tied.clone().requires_grad_(), tied.clamp(-65504, 65504).requires_grad_()
    (grad,), (grad_clamped,) = (torch.autograd.grad(attention(*map(half, (q, k, v)), bias=b, backend=backend)
                                                    .float().square().sum(), b) for b in (leaf, clamped))
    assert grad.isfinite().all() and (grad[..., 6:8] != 0).all()
    torch.testing.assert_close(grad, grad_clamped, rtol=0, atol=0)

    cache, owner, steps = InferenceCache(1, T, device=DEVICE), torch.nn.Identity(), []
    for t in range(T):
        cache.begin(1, None)
        context = Context(position_ids=torch.full((1, 1), t, device=DEVICE), cache=cache)
        steps.append(context.attend(owner, *(half(x[:, t:t + 1]) for x in (q, k, v)), bias=bias[..., t:t + 1],
                                    backend=backend))
        cache.end(1)
    torch.testing.assert_close(torch.cat(steps, dim=1).float(), want, rtol=2e-3, atol=2e-3)

    bias[..., 5] = float("inf")  # a non-finite input, as in fp32: NaN from where it is seen
    nan = attention(*map(half, (q, k, v)), bias=bias, backend=backend).isnan()
    assert torch.equal(nan, attention(q, k, v, bias=bias, backend="reference").isnan()) and nan[:, 5:].all()
