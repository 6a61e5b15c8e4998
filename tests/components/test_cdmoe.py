import pytest
import torch
import torch.nn.functional as F

from components import CDMoE, HybridLM


def brute_force_cdmoe(moe, x):
    """Every one of the N experts scored per head; the top-k taken directly from the n_a·n_b sums."""
    mlp = moe.shared
    if mlp.activation == "plain":
        phi = F.silu(x @ mlp.in_proj.weight.T) @ mlp.out_proj.weight.T  # [M, d]
    else:  # swiglu
        gate, up = (x @ mlp.in_proj.weight.T).chunk(2, dim=-1)
        phi = (F.silu(gate) * up) @ mlp.out_proj.weight.T
    reads = phi if moe.cross_domain == "sequential" else x
    n_a, n_b = moe.n_keys
    if moe.key_dim is None:
        s = (reads @ moe.router.weight.T).view(len(x), moe.n_heads, n_a + n_b)
        s_a, s_b = s[..., :n_a], s[..., n_a:]
    else:
        q = (reads @ moe.query.weight.T).view(len(x), moe.n_heads, 2, moe.key_dim // 2)
        s_a = torch.einsum("mhd,hnd->mhn", q[:, :, 0], moe.keys_a)  # [M, H, n_a]
        s_b = torch.einsum("mhd,hnd->mhn", q[:, :, 1], moe.keys_b)  # [M, H, n_b]
    every = (s_a[..., :, None] + s_b[..., None, :]).flatten(-2)  # [M, H, N], expert i·n_b + j
    scores, experts = every.topk(moe.top_k, dim=-1)
    w = torch.softmax(scores, dim=-1)  # [M, H, k]
    inner = torch.einsum("md,mhkd->mhk", reads, moe.down[experts])
    return phi + torch.einsum("mhk,mhkd->md", w * F.silu(inner), moe.up[experts])


@pytest.mark.parametrize("n_heads, top_k, cross_domain, n_keys, key_dim, shared_mlp", [
    (1, 2, "sequential", None, 6, "plain"),
    (2, 4, "parallel", None, 6, "plain"),
    (4, 8, "sequential", None, 6, "plain"),
    (2, 3, "sequential", [4, 12], 6, "plain"),  # rectangular: 48 = 4 × 12
    (1, 4, "parallel", [6, 8], None, "swiglu"),  # Doge's form, rectangular
    (2, 15, "parallel", [3, 5], None, "swiglu"),  # top_k past both halves, every expert (Hugging Face's Doge-MoE allows it)
])
def test_matches_brute_force_retrieval_outputs_and_gradients(n_heads, top_k, cross_domain, n_keys, key_dim, shared_mlp):
    torch.set_default_dtype(torch.float64)
    try:
        n_experts = 64 if n_keys is None else n_keys[0] * n_keys[1]
        moe = CDMoE(10, n_experts=n_experts, n_keys=n_keys, n_heads=n_heads, top_k=top_k, d_ff=12, key_dim=key_dim,
                    cross_domain=cross_domain, shared_mlp=shared_mlp)
        x = torch.randn(2, 9, 10, requires_grad=True)
        y = moe(x)
        ref = brute_force_cdmoe(moe, x.reshape(-1, 10)).view_as(y)
        torch.testing.assert_close(y, ref)
        params = [x, *moe.parameters()]
        g = torch.randn_like(y)
        for name, got, want in zip(["x", *dict(moe.named_parameters())], torch.autograd.grad(y, params, g),
                                   torch.autograd.grad(ref, params, g)):
            torch.testing.assert_close(got, want, msg=lambda m: f"gradient of {name}: {m}")
    finally:
        torch.set_default_dtype(torch.float32)


def test_queries_and_keys_receive_gradients():
    moe = CDMoE(16, n_experts=256, n_heads=2, top_k=4, key_dim=8)
    moe(torch.randn(2, 5, 16)).square().sum().backward()
    for name in ("query.weight", "keys_a", "keys_b", "down", "up", "shared.in_proj.weight"):
        assert dict(moe.named_parameters())[name].grad.abs().sum() > 0, name


def test_65536_experts_never_materialise_a_tokens_by_experts_tensor(largest_tensor):
    moe = CDMoE(32, n_experts=65536, n_heads=4, top_k=16, d_ff=64, key_dim=16)
    x = torch.randn(2, 128, 32, requires_grad=True)
    tokens = 2 * 128
    with largest_tensor() as probe:
        moe(x).sum().backward()
    # The largest tensors are the expert tables themselves and their gradients, [N, d] = 65536·32;
    # scoring all experts would take [tokens, N] = 256·65536, eight times more.
    assert probe.largest <= 65536 * 32 < tokens * 65536
    assert x.grad is not None and moe.keys_a.grad.abs().sum() > 0


def test_balance_loss_on_a_hand_built_case_and_load_sums_to_one():
    moe = CDMoE(8, n_experts=4, n_heads=1, top_k=1, key_dim=2, balance_loss=True)
    with torch.no_grad():  # q = φ(x)·W_q; make every half score favour row 1 of table a and row 0 of b
        moe.keys_a.copy_(torch.tensor([[[0.0], [1.0]]]))  # [H=1, n_a=2, 1]
        moe.keys_b.copy_(torch.tensor([[[1.0], [0.0]]]))
    x = torch.randn(1, 6, 8)
    with torch.no_grad():
        phi = F.silu(x @ moe.shared.in_proj.weight.T) @ moe.shared.out_proj.weight.T
        q = (phi @ moe.query.weight.T).view(6, 1, 2, 1)
    moe(x)
    s_a, s_b = q[:, 0, 0] * moe.keys_a[0, :, 0], q[:, 0, 1] * moe.keys_b[0, :, 0]  # [6, 2] each
    e = (s_a.argmax(-1) * 2 + s_b.argmax(-1))
    torch.testing.assert_close(moe.expert_load, torch.bincount(e, minlength=4).float() / 6)
    expected = []
    for rows, s in ((e // 2, s_a), (e % 2, s_b)):
        f = torch.bincount(rows, minlength=2).float() / 6
        expected.append(2 * (f * torch.softmax(s, -1).mean(0)).sum())
    torch.testing.assert_close(moe.aux_loss, (expected[0] + expected[1]) / 2)
    assert moe.expert_load.sum().item() == pytest.approx(1.0)


def test_no_aux_loss_unless_asked():
    moe = CDMoE(8, n_experts=16, top_k=2, key_dim=4)
    moe(torch.randn(1, 3, 8))
    assert moe.aux_loss is None
    model = HybridLM(16, 8, "-E", {"E": lambda d: CDMoE(d, n_experts=16, top_k=2, key_dim=4)})
    model(torch.randint(0, 16, (1, 3)))
    assert model.auxiliary_losses() == {} and list(model.expert_loads()) == ["blocks.0.state_mixer"]


def test_cheems_expert_counts_build_as_rectangular_products():
    for n, keys in ((3072, [48, 64]), (8192, [64, 128])):
        moe = CDMoE(16, n_experts=n, n_keys=keys, n_heads=2, top_k=8, key_dim=8)
        moe(torch.randn(1, 5, 16))
        assert moe.expert_load.shape == (n,) and moe.keys_a.shape[1] == keys[0] and moe.keys_b.shape[1] == keys[1]


def test_active_parameters_on_a_hand_computed_case():
    # d=4, d_ff=6, H=2, key_dim=4, N=16 (n_keys 4), k=3:
    # φ: 4·6 + 6·4 = 48; W_q: 4·8 = 32; keys: 2·(4 + 4)·2 = 32; experts: 2 heads · 3 · (4 + 4) = 48.
    moe = CDMoE(4, n_experts=16, n_heads=2, top_k=3, d_ff=6, key_dim=4)
    assert moe.active_parameters() == 48 + 32 + 32 + 48
    assert sum(p.numel() for p in moe.parameters()) == 48 + 32 + 32 + 2 * 16 * 4


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_experts": 1000}, r"n_experts=1000 is not a perfect square .*961 or 1024.*n_keys=\[n_a, n_b\]"),
        ({"n_experts": 64, "top_k": 65}, r"top_k=65 exceeds n_experts=64"),
        ({"n_experts": 3072, "n_keys": [48, 60]}, r"n_keys=\[48, 60\] must be two numbers whose product is n_experts=3072"),
        ({"key_dim": 5}, "key_dim=5 must be an even integer of at least 2"),
        ({"key_dim": 0}, "key_dim=0 must be an even integer of at least 2"),
        ({"cross_domain": "serial"}, "cross_domain='serial'"),
    ],
)
def test_bad_arguments_name_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CDMoE(8, **kwargs)
