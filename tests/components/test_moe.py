"""Routed MoEs against a dense oracle written here from the parameters: every expert on every token,
combined with gates computed by brute force."""

import pytest
import torch
import torch.nn.functional as F

from components import (MLP, SSD, CohesiveMoE, ComposedMoE, ExpansiveMoE, HybridLM, MoE, QCAttention, RoutedMoE,
                        SharedExpertMoE, SigmoidRouter, TopKRouter)
from components.catalogue import STATE_MIXERS
from components.state import sequence_balancing_loss, switch_balancing_loss
from components.state.experts import MLPExperts
from components.state.router import Routing

GATE = {"swiglu": lambda v: v, "swisig": torch.sigmoid, "switanh": torch.tanh}


def dense_gates(x, centroids, top_k, normalize):
    """``[M, E]``: the affinity at each token's top-k experts (brute force), zero elsewhere."""
    probs = torch.softmax(x @ centroids.T, dim=-1)  # [M, E]
    keep = torch.zeros_like(probs, dtype=torch.bool)
    for m in range(probs.shape[0]):
        order = sorted(range(probs.shape[1]), key=lambda i: (-probs[m, i].item(), i))
        keep[m, order[:top_k]] = True
    gates = probs * keep
    return gates / gates.sum(-1, keepdim=True) if normalize else gates


def sigmoid_gates(x, router, bias=None):
    """``[M, E]``: DeepSeek-V3's gates by brute force: each token's groups ranked by the sum of their two best biased
    affinities, its top-k experts among the kept groups' by biased affinity, the unbiased affinities there,
    normalised and scaled."""
    scores = torch.sigmoid(x @ router.centroids.weight.T)  # [M, E]
    choice = scores + (router.balance_bias if bias is None else bias)
    E, G = router.n_experts, router.n_groups
    size = E // G
    gates = torch.zeros_like(scores)
    for m in range(scores.shape[0]):
        c = choice[m].tolist()
        group_score = [sum(sorted(c[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(G)]
        groups = sorted(range(G), key=lambda g: (-group_score[g], g))[:router.top_groups]
        allowed = [i for i in range(E) if i // size in groups]
        chosen = sorted(allowed, key=lambda i: (-c[i], i))[:router.top_k]
        gates[m, chosen] = scores[m, chosen]
    if router.normalize:
        gates = gates / gates.sum(-1, keepdim=True)
    return gates * router.scale


def relu_squared(v):
    return F.relu(v) ** 2


def gated_mlp(x, w_in, w_out, gate):
    if gate == "plain":  # (the relu² form, the only plain one the catalogue has)
        return relu_squared(x @ w_in) @ w_out
    h, v = (x @ w_in).chunk(2, dim=-1)
    return (F.silu(h) * gate(v)) @ w_out


def oracle(moe, x):
    """Every expert on every token, ``Σ_i G[:, i] · expert_i(x)``, plus the shared parts."""
    r, bank = moe.router, moe.experts
    if isinstance(r, SigmoidRouter):
        G = sigmoid_gates(x, r)  # [M, E]
    else:
        G = dense_gates(x, r.centroids.weight, r.top_k, r.normalize)  # [M, E]
    if isinstance(moe, CohesiveMoE):
        shared = torch.tanh(x @ moe.cross_domain.proj.weight.T)  # [M, d_ff]
        outs = [(F.silu(x @ bank.w_in[i]) * shared) @ bank.w_out[i] for i in range(bank.n_experts)]
    elif isinstance(moe, ExpansiveMoE):
        mlp = moe.cross_domain
        W, V = mlp.in_proj.weight.T.chunk(2, dim=1)
        h = (F.silu(x @ W) * torch.tanh(x @ V)) @ mlp.out_proj.weight.T  # shared FFN [M, d]
        outs = []
        for i in range(bank.n_experts):
            if bank.gate == "scalar":  # one number per token: σ(⟨h, w₃ᵢ⟩)
                u = h * torch.sigmoid((h * bank.w_gate[i][:, 0]).sum(-1, keepdim=True))
            else:
                u = h * torch.sigmoid(h @ bank.w_gate[i])
            outs.append(gated_mlp(u, bank.private.w_in[i], bank.private.w_out[i], torch.tanh))
    else:
        outs = [gated_mlp(x, bank.w_in[i], bank.w_out[i], GATE.get(bank.activation, bank.activation))
                for i in range(bank.n_experts)]
    y = sum(G[:, i : i + 1] * outs[i] for i in range(bank.n_experts))
    if moe.shared_expert is not None:
        mlp = moe.shared_expert
        if mlp.activation == "plain":
            return y + relu_squared(x @ mlp.in_proj.weight.T) @ mlp.out_proj.weight.T
        W, V = mlp.in_proj.weight.T.chunk(2, dim=1)
        y = y + (F.silu(x @ W) * GATE[mlp.activation](x @ V)) @ mlp.out_proj.weight.T
    return y


# The routed MoEs of the catalogue (every variant the contract tests run), checked here against the oracle.
MIXERS = {name: factory for name, factory in STATE_MIXERS.items()
          if getattr(factory, "func", factory) in (RoutedMoE, SharedExpertMoE, CohesiveMoE, ExpansiveMoE, ComposedMoE)}
D_MODEL = 12


@pytest.mark.parametrize("name", MIXERS)
def test_matches_dense_oracle_outputs_and_gradients(name):
    torch.set_default_dtype(torch.float64)
    try:
        moe = MIXERS[name](D_MODEL)
        x = torch.randn(3, 7, D_MODEL, requires_grad=True)
        y = moe(x)
        ref = oracle(moe, x.reshape(-1, D_MODEL)).view_as(y)
        torch.testing.assert_close(y, ref)
        grad_out = torch.randn_like(y)
        params = [x, *moe.parameters()]
        got = torch.autograd.grad(y, params, grad_out, allow_unused=True)
        want = torch.autograd.grad(ref, params, grad_out, allow_unused=True)
        for (pname, _), g, w in zip([("x", x), *moe.named_parameters()], got, want):
            torch.testing.assert_close(g, w, msg=lambda m: f"gradient of {pname}: {m}")
        assert got[1].abs().sum() > 0  # the router's centroids (first parameter) learn through the gates
    finally:
        torch.set_default_dtype(torch.float32)


def test_top_k_picks_the_best_experts_and_breaks_ties_toward_lower_ids():
    router = TopKRouter(2, 4, 2)
    with torch.no_grad():  # affinity logits = x · e_i with x = (1, 0): the first column of the centroids
        router.centroids.weight.copy_(torch.tensor([[1.0, 0], [3.0, 0], [3.0, 0], [0.0, 0]]))
    r = router(torch.tensor([[1.0, 0.0]]))
    assert r.experts.tolist() == [[1, 2]]
    with torch.no_grad():
        router.centroids.weight.copy_(torch.tensor([[2.0, 0], [1.0, 0], [2.0, 0], [2.0, 0]]))
    r = router(torch.tensor([[1.0, 0.0]]))
    assert r.experts.tolist() == [[0, 2]]  # three-way tie at 2: the two lowest ids
    probs = torch.softmax(torch.tensor([2.0, 1.0, 2.0, 2.0]), dim=0)
    torch.testing.assert_close(r.gates, probs[[0, 2]][None])  # gate = affinity when not normalised


def test_normalized_gates_sum_to_one():
    r = TopKRouter(8, 6, 3, normalize=True)(torch.randn(10, 8))
    torch.testing.assert_close(r.gates.sum(-1), torch.ones(10))


def test_balancing_loss_equals_its_formula_on_a_hand_built_routing():
    # 4 tokens, 2 experts, top-1: three tokens go to expert 0, one to expert 1.
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]])
    routing = Routing(experts=torch.tensor([[0], [0], [0], [1]]), gates=probs.max(-1, keepdim=True).values, probs=probs)
    load = routing.load(2)
    torch.testing.assert_close(load, torch.tensor([0.75, 0.25]))
    # N Σ f_i P_i = 2 · (0.75 · 0.65 + 0.25 · 0.35)
    torch.testing.assert_close(switch_balancing_loss(probs, load), torch.tensor(2 * (0.75 * 0.65 + 0.25 * 0.35)))
    uniform = torch.full((4, 2), 0.5)
    torch.testing.assert_close(switch_balancing_loss(uniform, torch.tensor([0.5, 0.5])), torch.tensor(1.0))


def test_a_sigmoid_gated_part_scales_each_tokens_output_by_its_own_gate_and_names_a_bad_spec():
    """``SigmoidGated`` (Qwen2-MoE's gated shared expert): ``σ(x · w) · inner(x)``, one gate per token, its inner module
    built from a spec; anything else is refused by name."""
    from components.state import SigmoidGated

    torch.manual_seed(0)
    gated = SigmoidGated(D_MODEL, inner={"class_path": "components.MLP", "init_args": {"d_ff": 8}})
    x = torch.randn(2, 5, D_MODEL)
    torch.testing.assert_close(gated(x), torch.sigmoid(x @ gated.gate.weight.T) * gated.inner(x))
    assert gated.gate.weight.shape == (1, D_MODEL) and gated.inner.d_ff == 8
    with pytest.raises(ValueError, match="SigmoidGated: inner='MLP' must be a spec"):
        SigmoidGated(D_MODEL, inner="MLP")
    with pytest.raises(ValueError, match="SigmoidGated: inner: "):
        SigmoidGated(D_MODEL, inner={"class_path": "components.MLP", "init_args": {"width": 8}})


def test_the_sequence_wise_loss_is_switchs_loss_within_each_sequence_averaged():
    """DeepSeek-V3's sequence-wise balance loss, against a loop over the sequences of Switch's loss on each one's real
    tokens (a sequence of padding alone counts in no average), on values and on the gradient into the affinities;
    one sequence gives Switch's loss itself."""
    torch.manual_seed(0)
    B, T, E, k = 3, 5, 4, 2
    probs = torch.softmax(torch.randn(B * T, E, dtype=torch.float64), -1).requires_grad_()
    experts = torch.stack([torch.randperm(E)[:k] for _ in range(B * T)])  # [M, k]
    valid = torch.ones(B, T, dtype=torch.float64)
    valid[1, :2] = 0
    valid[2] = 0  # a sequence of padding
    got = sequence_balancing_loss(probs, experts, B, valid.view(-1))
    losses = []
    for b in range(2):
        rows = torch.arange(b * T, (b + 1) * T)[valid[b] > 0]
        routing = Routing(experts=experts[rows], gates=probs[rows, :k], probs=probs[rows])
        losses.append(switch_balancing_loss(probs[rows], routing.load(E), None))
    want = torch.stack(losses).mean()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, probs)[0], torch.autograd.grad(want, probs)[0])
    one = Routing(experts=experts[:T], gates=probs[:T, :k], probs=probs[:T])
    torch.testing.assert_close(sequence_balancing_loss(probs[:T], experts[:T], 1),
                               switch_balancing_loss(probs[:T], one.load(E)))


def test_sequences_that_each_crowd_one_expert_pass_the_batch_loss_but_not_the_sequence_wise_one():
    """Two sequences, each sending every token to its own expert with all the affinity: the batch's load is even,
    so Switch's loss over the batch is 1, its least; within each sequence it is ``N = 2``, its most."""
    probs = torch.tensor([[1.0, 0.0]] * 3 + [[0.0, 1.0]] * 3)  # [6, 2]
    experts = torch.tensor([[0]] * 3 + [[1]] * 3)  # [6, 1]
    batch_load = Routing(experts=experts, gates=probs[:, :1], probs=probs).load(2)
    torch.testing.assert_close(switch_balancing_loss(probs, batch_load), torch.tensor(1.0))
    torch.testing.assert_close(sequence_balancing_loss(probs, experts, 2), torch.tensor(2.0))


def test_a_moe_records_each_sequences_load_as_its_tokens_assignments_within_it():
    """``sequence_load [B, E]``: row ``b`` the fraction of sequence ``b``'s assignments (its real tokens') each expert
    took — a loop of :func:`assignment_load` over the sequences; a sequence of padding alone a row of zeros; a flat
    input one sequence, its row the batch's load; whatever the balance scope."""
    from components.state.router import assignment_load, sequence_loads

    torch.manual_seed(0)
    moe = RoutedMoE(D_MODEL, n_experts=5, top_k=2, d_ff=6)
    x = torch.randn(3, 7, D_MODEL)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, :4], pad[2] = True, True
    moe(x, padding_mask=pad)
    experts = moe.router(x.masked_fill(pad[..., None], 0.0).reshape(-1, D_MODEL)).experts.view(3, 7, 2)
    for b in range(2):
        torch.testing.assert_close(moe.sequence_load[b], assignment_load(experts[b][~pad[b]], 5))
    assert moe.sequence_load.shape == (3, 5) and moe.sequence_load[2].abs().sum() == 0
    assert not moe.sequence_load.requires_grad
    moe(x[0])
    torch.testing.assert_close(moe.sequence_load, moe.expert_load[None])
    moe.eval()(x)  # (kept in training only: a decoding step does not pay for it)
    assert moe.sequence_load is None and moe.expert_load is not None
    crowded = sequence_loads(torch.tensor([[0]] * 3 + [[1]] * 3), 2, 2)  # each sequence to its own expert
    torch.testing.assert_close(crowded, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))


@pytest.mark.parametrize("shape", [(0, 5), (2, 0)], ids=["no sequences", "empty sequences"])
def test_an_empty_batch_balanced_within_each_sequence_gives_empty_loads_and_a_zero_loss(shape):
    """``B = 0`` or ``T = 0``: the per-sequence loads are ``[B, E]`` of zeros and the sequence-wise loss 0 (no sequence
    has tokens), not a reshape that cannot infer its ``-1``."""
    spec = {"router": {"class_path": "components.TopKRouter", "init_args": {"n_experts": 4, "top_k": 2}},
            "experts": {"class_path": "components.state.MLPExperts", "init_args": {"n_experts": 4, "d_ff": 6}}}
    moe = ComposedMoE(D_MODEL, **spec, balance="sequence")
    y = moe(torch.randn(*shape, D_MODEL))
    assert y.shape == (*shape, D_MODEL)
    assert moe.sequence_load.shape == (shape[0], 4) and moe.sequence_load.abs().sum() == 0
    assert float(moe.aux_loss) == 0.0


def test_a_moe_balances_each_sequence_when_told_and_names_a_bad_scope():
    """``balance="sequence"``: the MoE's ``aux_loss`` is the sequence-wise loss of its own routing over its input's
    sequences, padding left out (``[B, T, d]``: ``B`` sequences; ``[M, d]``: one); the load it records stays the
    batch's. ComposedMoE passes the choice on; a scope it does not know is refused by name."""
    torch.manual_seed(0)
    spec = {"router": {"class_path": "components.SigmoidRouter", "init_args": {"n_experts": 4, "top_k": 2}},
            "experts": {"class_path": "components.state.MLPExperts", "init_args": {"n_experts": 4, "d_ff": 6}}}
    moe = ComposedMoE(D_MODEL, **spec, balance="sequence")
    x = torch.randn(3, 7, D_MODEL)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[2, :4] = True
    moe(x, padding_mask=pad)
    sequence_wise = moe.aux_loss
    routing = moe.router(x.masked_fill(pad[..., None], 0.0).reshape(-1, D_MODEL))
    valid = (~pad).reshape(-1).float()
    torch.testing.assert_close(sequence_wise, sequence_balancing_loss(routing.probs, routing.experts, 3, valid))
    torch.testing.assert_close(moe.expert_load, routing.load(4, valid))
    moe(x[0])  # [T, d]: one sequence
    alone = moe.router(x[0])
    torch.testing.assert_close(moe.aux_loss, sequence_balancing_loss(alone.probs, alone.experts, 1))
    batch = ComposedMoE(D_MODEL, **spec)
    batch.load_state_dict(moe.state_dict())
    batch(x, padding_mask=pad)
    torch.testing.assert_close(batch.aux_loss, switch_balancing_loss(routing.probs, routing.load(4, valid), valid))
    assert batch.balance == "batch" and batch.aux_loss.item() != sequence_wise.item()
    with pytest.raises(ValueError, match=r"ComposedMoE: balance='token' is not one of \('batch', 'sequence'\)"):
        ComposedMoE(D_MODEL, **spec, balance="token")
    with pytest.raises(ValueError, match=r"MoE: balance='Sequence'"):
        MoE(TopKRouter(D_MODEL, 4, 2), MLPExperts(D_MODEL, n_experts=4, d_ff=6), balance="Sequence")


@pytest.mark.parametrize("name", [name for name, f in MIXERS.items() if "sigmoid router" not in name])
def test_the_router_z_loss_is_st_moes_mean_logsumexp_squared_over_the_real_tokens(name):
    """``router_z_loss`` after a forward: the mean over the unpadded tokens of ``logsumexp(x·Cᵀ)²``, written out from
    the router's centroids (a padded token counts nowhere), with a gradient that reaches the centroids; on a batch
    without padding, transformers' Switch Transformers ``router_z_loss_func`` on the same logits when it is there."""
    torch.manual_seed(0)
    moe = MIXERS[name](D_MODEL).double()
    with torch.no_grad():
        moe.router.centroids.weight.mul_(4)  # logits of a few units, so the square is not near a constant
    x = torch.randn(2, 7, D_MODEL, dtype=torch.float64)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, :3] = True
    moe(x, padding_mask=pad)
    logits = x[~pad] @ moe.router.centroids.weight.T  # [M_real, E]
    want = torch.logsumexp(logits, -1).square().mean()
    torch.testing.assert_close(moe.router_z_loss, want)
    (grad,) = torch.autograd.grad(moe.router_z_loss, [moe.router.centroids.weight])
    assert grad.abs().sum() > 0
    moe(x)
    every = x.reshape(-1, D_MODEL) @ moe.router.centroids.weight.T
    torch.testing.assert_close(moe.router_z_loss, torch.logsumexp(every, -1).square().mean())
    switch = pytest.importorskip("transformers.models.switch_transformers.modeling_switch_transformers")
    torch.testing.assert_close(moe.router_z_loss, switch.router_z_loss_func(every.view(2, 7, -1)))


def test_a_router_without_logits_leaves_no_router_z_loss():
    """A router of your own may give a :class:`Routing` without logits: the MoE then records no router z-loss, and a
    model of such MoEs has none to sum."""

    class NoLogits(TopKRouter):
        def forward(self, x):
            routing = super().forward(x)
            return Routing(experts=routing.experts, gates=routing.gates, probs=routing.probs)

    moe = MoE(NoLogits(D_MODEL, 4, 2), MLPExperts(D_MODEL, n_experts=4, d_ff=6))
    moe(torch.randn(2, 5, D_MODEL))
    assert moe.router_z_loss is None and moe.aux_loss is not None
    model = HybridLM(32, D_MODEL, "-R", {"R": lambda d: MoE(NoLogits(d, 4, 2), MLPExperts(d, n_experts=4, d_ff=6))})
    model(torch.randint(0, 32, (2, 5)))
    assert model.router_z_losses() == {} and list(model.auxiliary_losses()) == ["blocks.0.state_mixer"]


def test_aux_loss_and_load_are_exposed_and_the_aux_loss_trains_the_router():
    moe = RoutedMoE(8, n_experts=4, top_k=2, d_ff=8)
    moe(torch.randn(2, 9, 8))
    assert moe.expert_load.shape == (4,) and moe.expert_load.sum().item() == pytest.approx(1.0)
    (grad,) = torch.autograd.grad(moe.aux_loss, [moe.router.centroids.weight])
    assert grad.abs().sum() > 0
    model = HybridLM(32, 8, "-R -R", {"R": lambda d: RoutedMoE(d, n_experts=4, top_k=1, d_ff=8)})
    model(torch.randint(0, 32, (2, 5)))
    assert sorted(model.auxiliary_losses()) == ["blocks.0.state_mixer", "blocks.1.state_mixer"]
    assert sorted(model.expert_loads()) == ["blocks.0.state_mixer", "blocks.1.state_mixer"]
    assert sorted(model.router_z_losses()) == ["blocks.0.state_mixer", "blocks.1.state_mixer"]


def test_active_parameters_on_a_hand_computed_case():
    # d=4, E=4, k=2, d_ff=8: router 4·4 = 16; one expert 4·16 (W|V) + 8·4 (W₂) = 96.
    moe = RoutedMoE(4, n_experts=4, top_k=2, d_ff=8)
    assert sum(p.numel() for p in moe.parameters()) == 16 + 4 * 96
    assert moe.active_parameters() == 16 + 2 * 96
    sei = SharedExpertMoE(4, n_experts=4, top_k=2, n_shared=1, d_ff=8)  # + one always-on expert
    assert sei.active_parameters() == 16 + 2 * 96 + 96
    # cohesive: shared V 4·8 = 32; one expert W 4·8 + W₂ 8·4 = 64
    assert CohesiveMoE(4, n_experts=4, top_k=2, d_ff=8).active_parameters() == 16 + 32 + 2 * 64
    # expansive: shared FFN 4·2·6 + 6·4 = 72; one expert W₃ 16 + 96
    assert ExpansiveMoE(4, n_experts=4, top_k=2, d_ff=8, d_shared=6).active_parameters() == 16 + 72 + 2 * (16 + 96)
    assert ExpansiveMoE(4, n_experts=4, top_k=2, d_ff=8, d_shared=6, gate="scalar").active_parameters() == 16 + 72 + 2 * (4 + 96)
    model = HybridLM(10, 4, "-R -M", {"R": lambda d: RoutedMoE(d, n_experts=4, top_k=2, d_ff=8)})
    dense = sum(p.numel() for p in model.parameters()) - (4 - 2) * 96
    from components import count_active_parameters
    assert count_active_parameters(model) == dense


def test_every_token_is_computed_dropless():
    """All tokens routed to one expert still all get it (no capacity limit)."""
    moe = RoutedMoE(6, n_experts=3, top_k=1, d_ff=4)
    with torch.no_grad():
        moe.router.centroids.weight.zero_()
        moe.router.centroids.weight[1, 0] = 100.0
    x = torch.randn(50, 6).abs()  # x · e_1 = 100·x₀ > 0: every token picks expert 1
    y = moe(x[None])[0]
    assert moe.expert_load.tolist() == [0.0, 1.0, 0.0]
    expert_1 = gated_mlp(x, moe.experts.w_in[1], moe.experts.w_out[1], GATE["swiglu"])
    torch.testing.assert_close(y, expert_1 * moe.router(x).gates)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: RoutedMoE(8, n_experts=4, top_k=5), "top_k=5 exceeds n_experts=4"),
        (lambda: SharedExpertMoE(8, n_shared=-1), "n_shared=-1"),
        (lambda: RoutedMoE(8, n_experts=0), "n_experts=0"),
        (lambda: RoutedMoE(8, activation="gelu"), "activation='gelu'"),
        (lambda: MoE(TopKRouter(8, 4, 2), torch.nn.Linear(8, 8)),
         r"experts=Linear is not an expert bank \(it lacks n_experts, params_per_expert\)"),
        (lambda: MoE(TopKRouter(8, 4, 2), MLPExperts(8, n_experts=3, d_ff=8)), "the router has 4 experts, the bank 3"),
        # (each of these failed only at the first forward: an AttributeError, or QCAttention's shape check)
        (lambda: MoE(MLP(8), MLPExperts(8, n_experts=4, d_ff=8)),
         r"router=MLP is not a router \(it lacks n_experts, top_k, centroids\)"),
        (lambda: MoE(TopKRouter(8, 4, 2), MLPExperts(8, n_experts=4, d_ff=8), shared_expert=QCAttention(8, n_heads=2)),
         r"shared_expert=QCAttention is a sequence mixer; the parts of a MoE work token by token"),
        (lambda: MoE(TopKRouter(8, 4, 2), MLPExperts(8, n_experts=4, d_ff=8), cross_domain=SSD(8, head_dim=4)),
         r"cross_domain=SSD is a sequence mixer"),
    ],
)
def test_bad_arguments_name_the_problem(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_every_expert_may_be_chosen():
    """top_k = n_experts is a dense mixture (every token to every expert, gated): the edge of the allowed range."""
    moe = RoutedMoE(8, n_experts=4, top_k=4, d_ff=6)
    moe(torch.randn(2, 3, 8))
    assert moe.expert_load.tolist() == [0.25] * 4


def test_the_load_counts_only_valid_tokens():
    probs = torch.full((4, 2), 0.5)
    routing = Routing(experts=torch.tensor([[0], [0], [1], [1]]), gates=probs[:, :1], probs=probs)
    torch.testing.assert_close(routing.load(2, torch.tensor([1.0, 1.0, 1.0, 0.0])), torch.tensor([2 / 3, 1 / 3]))
    moe = RoutedMoE(8, n_experts=4, top_k=2, d_ff=8)
    x = torch.randn(1, 9, 8)
    mask = torch.zeros(1, 9, dtype=torch.bool)
    mask[0, :4] = True  # left padding
    moe(x, padding_mask=mask)
    padded = moe.expert_load.clone()
    moe(x[:, 4:])  # the valid tokens alone
    torch.testing.assert_close(padded, moe.expert_load)
    for bad in (mask.long(), mask[:, :8]):  # a mask that is not bool, or not of the input's length
        with pytest.raises(ValueError, match=r"RoutedMoE: padding_mask must be bool with the input's leading shape "
                                             r"\(1, 9\); got torch\.\w+ \(1, \d\)"):
            moe(x, padding_mask=bad)


def test_a_composed_moe_is_the_named_variant_it_spells_and_its_spec_rebuilds_it():
    """Composed from the parts SharedExpertMoE builds, the same function on the same weights; recorded by the model
    as plain values, rebuilt equal from that spec (what a checkpoint does)."""
    from components.bindings import binding_factory, binding_spec

    torch.manual_seed(0)
    named = SharedExpertMoE(D_MODEL, n_experts=4, top_k=2, n_shared=2, d_ff=6, activation="switanh")
    spec = {"class_path": "components.ComposedMoE", "init_args": {
        "router": {"class_path": "components.TopKRouter", "init_args": {"n_experts": 4, "top_k": 2}},
        "experts": {"class_path": "components.state.MLPExperts", "init_args": {"n_experts": 4, "d_ff": 6,
                                                                               "activation": "switanh"}},
        "shared_expert": {"class_path": "components.MLP", "init_args": {"d_ff": 12, "activation": "switanh"}}}}
    composed = binding_factory("Q", spec)(D_MODEL)
    composed.load_state_dict(named.state_dict())
    x = torch.randn(2, 9, D_MODEL)
    torch.testing.assert_close(composed(x), named(x))
    torch.testing.assert_close(composed.aux_loss, named.aux_loss)
    assert composed.active_parameters() == named.active_parameters()
    model = HybridLM(20, D_MODEL, "-Q", {"Q": binding_factory("Q", spec)})
    assert model.binding_specs()["Q"] == binding_spec("Q", spec) == spec
    rebuilt = HybridLM(20, D_MODEL, "-Q", model.binding_specs())
    rebuilt.load_state_dict(model.state_dict())
    ids = torch.randint(0, 20, (2, 9))
    torch.testing.assert_close(rebuilt(ids), model(ids))


@pytest.mark.parametrize("parts, message", [
    ({"router": TopKRouter}, "ComposedMoE: router=<class .*TopKRouter'> must be a spec {class_path: ..., init_args"),
    ({"router": {"class_path": "components.TopKRouter", "init_args": {"d_model": 8, "n_experts": 4, "top_k": 1}}},
     "ComposedMoE: router: .*init_args must not set d_model"),
    ({"experts": {"class_path": "components.nothing.Here"}}, "ComposedMoE: experts: class_path 'components.nothing.Here'"),
    ({"experts": {"class_path": "components.state.MLPExperts", "init_args": {"n_experts": 3, "d_ff": 4}}},
     "MoE: the router has 4 experts, the bank 3"),
])
def test_a_composed_moe_names_the_part_at_fault(parts, message):
    spec = {"router": {"class_path": "components.TopKRouter", "init_args": {"n_experts": 4, "top_k": 1}},
            "experts": {"class_path": "components.state.MLPExperts", "init_args": {"n_experts": 4, "d_ff": 4}}}
    with pytest.raises(ValueError, match=message):
        ComposedMoE(8, **(spec | parts))


# ---- DeepSeek-V3's sigmoid router and its auxiliary-loss-free balancing ---------------------------------------------

def sigmoid_moe(d_model=D_MODEL, **router):
    """A Nemotron-H-like MoE: a SigmoidRouter, plain relu² experts."""
    router = {"n_experts": 6, "top_k": 2, **router}
    return MoE(SigmoidRouter(d_model, **router), MLPExperts(d_model, router["n_experts"], 6, activation="plain",
                                                            act="relu2"))


@pytest.mark.parametrize("router", [
    dict(n_experts=8, top_k=2, normalize=True, scale=1.0, n_groups=1, top_groups=1),
    dict(n_experts=8, top_k=3, normalize=False, scale=2.5, n_groups=4, top_groups=2),
    dict(n_experts=12, top_k=4, normalize=True, scale=1.5, n_groups=3, top_groups=2),
])
def test_the_sigmoid_router_chooses_and_gates_as_transformers_nemotron_h_router(router):
    """transformers' ``NemotronHTopkRouter`` (DeepSeek-V3's: sigmoid scores, a correction bias in the choice only,
    group-limited routing) on the same centroids and bias: the same experts for every token, the same gates."""
    nemotron = pytest.importorskip("transformers.models.nemotron_h.modeling_nemotron_h")
    from transformers import NemotronHConfig

    torch.manual_seed(0)
    config = NemotronHConfig(hidden_size=D_MODEL, n_routed_experts=router["n_experts"],
                             num_experts_per_tok=router["top_k"], norm_topk_prob=router["normalize"],
                             routed_scaling_factor=router["scale"], n_group=router["n_groups"],
                             topk_group=router["top_groups"], layers_block_type=["moe"])
    theirs = nemotron.NemotronHTopkRouter(config)
    ours = SigmoidRouter(D_MODEL, **router)
    with torch.no_grad():
        theirs.weight.normal_(0, 0.5)
        theirs.e_score_correction_bias.normal_(0, 0.3)
        ours.centroids.weight.copy_(theirs.weight)
        ours.balance_bias.copy_(theirs.e_score_correction_bias)
    x = torch.randn(40, D_MODEL)
    _, their_gates, their_experts = theirs(x)
    routing = ours(x)
    order = their_experts.argsort(dim=-1)  # (transformers' top-k is unsorted; ours best first)
    mine = routing.experts.argsort(dim=-1)
    assert torch.equal(routing.experts.gather(1, mine), their_experts.gather(1, order))
    torch.testing.assert_close(routing.gates.gather(1, mine), their_gates.gather(1, order))
    assert routing.logits is None  # (no z-loss: that is a softmax's)
    torch.testing.assert_close(routing.probs.sum(-1), torch.ones(40))


def test_the_balancing_bias_steers_the_choice_but_never_the_gates():
    torch.manual_seed(1)
    router = SigmoidRouter(D_MODEL, 6, 2, normalize=False)
    x = torch.randn(30, D_MODEL)
    scores = torch.sigmoid(x @ router.centroids.weight.T)
    with torch.no_grad():
        router.balance_bias[4] = 5.0  # above any affinity's reach: every token takes expert 4 first
    routing = router(x)
    assert (routing.experts[:, 0] == 4).all()
    torch.testing.assert_close(routing.gates, scores.gather(1, routing.experts))  # the affinity, not affinity + 5
    torch.testing.assert_close(router(x).gates, sigmoid_gates(x, router).gather(1, routing.experts))


def test_a_balance_step_moves_each_bias_by_the_rate_towards_the_mean_load_and_starts_a_new_tally():
    router = SigmoidRouter(D_MODEL, 4, 1, balance_rate=0.01)
    router.observe(torch.tensor([0.5, 0.2, 0.3, 0.0]))
    router.observe(torch.tensor([0.3, 0.2, 0.2, 0.3]))  # tally [0.8, 0.4, 0.5, 0.3], mean 0.5
    router.update_balance()
    torch.testing.assert_close(router.balance_bias, torch.tensor([-0.01, 0.01, 0.0, 0.01]))  # (a tie moves nothing)
    assert router.load_tally.tolist() == [0.0] * 4
    router.update_balance()  # nothing observed since: nothing moves
    torch.testing.assert_close(router.balance_bias, torch.tensor([-0.01, 0.01, 0.0, 0.01]))
    fixed = SigmoidRouter(D_MODEL, 4, 1, balance_rate=0.0)
    fixed.observe(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    fixed.update_balance()
    assert fixed.balance_bias.tolist() == [0.0] * 4 and fixed.load_tally.tolist() == [0.0] * 4


def test_the_moe_hands_the_router_the_load_of_its_real_tokens_in_training_only():
    torch.manual_seed(2)
    moe = sigmoid_moe()
    x = torch.randn(2, 9, D_MODEL)
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[0, :3] = True  # left padding
    moe.eval()
    moe(x, padding_mask=mask)
    assert moe.router.load_tally.tolist() == [0.0] * 6  # evaluation and decoding leave the balance alone
    moe.train()
    moe(x, padding_mask=mask)
    torch.testing.assert_close(moe.router.load_tally, moe.expert_load)  # padding counts in neither
    moe(x, padding_mask=mask)
    torch.testing.assert_close(moe.router.load_tally, 2 * moe.expert_load)


def test_balancing_alone_spreads_a_collapsed_routing_over_the_experts():
    """No gradient at all: a router whose centroids send most tokens to two of eight experts, stepped only by its
    bias, spreads them (DeepSeek-V3's claim for the method, at a small scale)."""
    torch.manual_seed(3)
    moe = sigmoid_moe(n_experts=8, top_k=2, balance_rate=0.01)
    with torch.no_grad():
        moe.router.centroids.weight.normal_(0, 0.1)
        moe.router.centroids.weight[:2] += 2.0 * torch.randn(D_MODEL).sign()  # two experts close to every token
    x = torch.randn(1, 256, D_MODEL).abs()

    def busiest():
        with torch.no_grad():
            moe(x)
        return moe.expert_load.max().item() * 8  # the busiest expert's load over the mean

    before = busiest()
    for _ in range(100):
        busiest()
        moe.router.update_balance()
    assert before > 3.0 and busiest() < 1.5, (before, busiest())
    bias = moe.router.balance_bias
    assert (bias[:2] < 0).all() and (bias[2:] > 0).all()  # the crowded two pushed down, the idle six up


def test_the_balancing_bias_is_saved_and_the_tally_is_not():
    moe = sigmoid_moe()
    keys = set(moe.state_dict())
    assert "router.balance_bias" in keys and "router.load_tally" not in keys


def test_the_balancing_bias_stays_fp32_in_a_bf16_model_so_its_small_steps_are_not_rounded_away():
    moe = sigmoid_moe(balance_rate=1e-3).to(torch.bfloat16)
    router = moe.router
    assert router.balance_bias.dtype == router.load_tally.dtype == torch.float32
    assert router.centroids.weight.dtype == torch.bfloat16
    with torch.no_grad():
        router.balance_bias.fill_(0.25)
    router.observe(torch.tensor([1.0, 0, 0, 0, 0, 0]))
    router.update_balance()
    assert router.balance_bias[0].item() == pytest.approx(0.249) and router.balance_bias[1].item() == pytest.approx(0.251)
    moe.train()
    moe(torch.randn(1, 5, D_MODEL, dtype=torch.bfloat16))  # (a bf16 forward: the bias joins fp32 scores)
    assert router.load_tally.sum().item() == pytest.approx(1.0)


def test_a_model_steps_every_self_balancing_router_and_leaves_the_others():
    model = HybridLM(20, D_MODEL, "-E -R", {"E": lambda d: sigmoid_moe(d, balance_rate=0.5),
                                            "R": lambda d: RoutedMoE(d, n_experts=4, top_k=1, d_ff=6)})
    model.train()
    model(torch.randint(0, 20, (2, 7)))
    model.update_routing_balance()
    bias = model.blocks[0].state_mixer.router.balance_bias
    assert set(bias.abs().tolist()) <= {0.0, 0.5} and bias.abs().sum() > 0


@pytest.mark.parametrize("build, message", [
    (lambda: SigmoidRouter(8, 6, 2, n_groups=4), "SigmoidRouter: n_groups=4 does not divide n_experts=6"),
    (lambda: SigmoidRouter(8, 6, 2, n_groups=3, top_groups=4), "SigmoidRouter: top_groups=4 exceeds n_groups=3"),
    (lambda: SigmoidRouter(8, 6, 3, n_groups=3, top_groups=1),
     r"SigmoidRouter: top_k=3 exceeds the 2 experts a token can reach \(top_groups=1 of n_groups=3 groups of 2\)"),
    (lambda: SigmoidRouter(8, 6, 2, scale=0.0), "SigmoidRouter: scale=0.0 must be a finite number > 0"),
    (lambda: SigmoidRouter(8, 6, 2, balance_rate=-1e-3), "SigmoidRouter: balance_rate=-0.001 must be a finite number >= 0"),
    (lambda: SigmoidRouter(8, 6, 0), "SigmoidRouter: top_k=0"),
    (lambda: MLPExperts(8, 4, 8, activation="gelu"), "MLPExperts: activation='gelu'"),
])
def test_bad_sigmoid_router_and_expert_arguments_name_the_problem(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_plain_experts_are_two_matrices_and_relu_squared_is_relu_squared():
    torch.manual_seed(4)
    bank = MLPExperts(D_MODEL, 3, 5, activation="plain", act="relu2")
    assert bank.w_in.shape == (3, D_MODEL, 5) and bank.params_per_expert() == 2 * D_MODEL * 5
    x = torch.randn(7, D_MODEL)
    ends = torch.tensor([2, 2, 7], dtype=torch.int32)  # rows 0-1 expert 0, none expert 1, 2-6 expert 2
    want = torch.cat([relu_squared(x[:2] @ bank.w_in[0]) @ bank.w_out[0], relu_squared(x[2:] @ bank.w_in[2]) @ bank.w_out[2]])
    torch.testing.assert_close(bank(x, None, ends), want)
    mlp = MLP(D_MODEL, d_ff=5, activation="plain", act="relu2")
    torch.testing.assert_close(mlp(x), relu_squared(x @ mlp.in_proj.weight.T) @ mlp.out_proj.weight.T)
    assert relu_squared(torch.tensor([-2.0, 3.0])).tolist() == [0.0, 9.0]
