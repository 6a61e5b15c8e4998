import pytest
import torch
import torch.nn.functional as F

from zoo_kernels.retrieval import expert_mix, product_key_topk


@pytest.mark.parametrize("n_heads, n_a, n_b, k", [(1, 8, 8, 1), (2, 16, 16, 4), (4, 32, 32, 8), (3, 11, 11, 11),
                                                  (2, 6, 16, 5), (1, 48, 64, 8),
                                                  # k past a half (Hugging Face's Doge-MoE allows it), and every pair
                                                  (2, 4, 4, 6), (2, 3, 5, 4), (1, 3, 5, 11), (2, 4, 4, 16)])
def test_product_key_topk_equals_brute_force_over_all_pairs(n_heads, n_a, n_b, k):
    a, b = torch.randn(5, n_heads, n_a), torch.randn(5, n_heads, n_b)
    scores, experts = product_key_topk(a, b, k)
    every = (a.unsqueeze(-1) + b.unsqueeze(-2)).flatten(-2)  # [5, H, n_a·n_b]: expert i·n_b + j
    want_scores, want_experts = every.topk(k, dim=-1)
    torch.testing.assert_close(scores, want_scores)
    assert torch.equal(experts, want_experts)  # random scores: no ties, so the ids are determined
    torch.testing.assert_close(every.gather(-1, experts), scores)


def test_expert_mix_matches_a_loop_over_retrieved_experts_with_gradients():
    M, H, k, N, d = 5, 2, 3, 20, 6
    x = torch.randn(M, d, dtype=torch.float64, requires_grad=True)
    down = torch.randn(N, d, dtype=torch.float64, requires_grad=True)
    up = torch.randn(N, d, dtype=torch.float64, requires_grad=True)
    weights = torch.rand(M, H, k, dtype=torch.float64, requires_grad=True)
    experts = torch.randint(0, N, (M, H, k))
    y = expert_mix(x, experts, weights, down, up, act="gelu")
    rows = []
    for m in range(M):
        acc = torch.zeros(d, dtype=torch.float64)
        for h in range(H):
            for j in range(k):
                e = experts[m, h, j]
                acc = acc + weights[m, h, j] * F.gelu(x[m] @ down[e]) * up[e]
        rows.append(acc)
    ref = torch.stack(rows)
    torch.testing.assert_close(y, ref)
    g = torch.randn_like(y)
    for got, want in zip(torch.autograd.grad(y, [x, down, up, weights], g), torch.autograd.grad(ref, [x, down, up, weights], g)):
        torch.testing.assert_close(got, want)


def test_expert_mix_rejects_mismatched_shapes():
    x, rows = torch.randn(4, 6), torch.randn(10, 6)
    with pytest.raises(ValueError, match="experts and weights must both be"):
        expert_mix(x, torch.zeros(4, 2, 3, dtype=torch.long), torch.ones(4, 2, 2), rows, rows)
    with pytest.raises(ValueError, match="same d"):
        expert_mix(x, torch.zeros(4, 2, 3, dtype=torch.long), torch.ones(4, 2, 3), torch.randn(10, 5), torch.randn(10, 5))
    with pytest.raises(ValueError, match="act='tanh'"):
        expert_mix(x, torch.zeros(4, 2, 3, dtype=torch.long), torch.ones(4, 2, 3), rows, rows, act="tanh")
    ids, weights = torch.zeros(4, 2, 3, dtype=torch.long), torch.ones(4, 2, 3)
    with pytest.raises(ValueError, match=r"need x \[M, d\] .*got x \(4, 6, 1\)"):  # x alone of the wrong rank
        expert_mix(x[..., None], ids, weights, rows, rows)
    with pytest.raises(ValueError, match=r"must both be \[M=4, H, k\]; got experts \(4, 3\)"):  # experts alone 2-D
        expert_mix(x, ids[:, 0], weights[:, 0], rows, rows)
    with pytest.raises(ValueError, match="experts must hold integer ids; got torch.float32"):
        expert_mix(x, ids.float(), weights, rows, rows)


def test_product_key_topk_names_halves_that_disagree_and_a_k_out_of_range():
    # (a k past n_a was torch's "selected index k out of range"; halves of two batches a shape error in the sums)
    a, b = torch.randn(2, 3, 8), torch.randn(2, 3, 6)
    assert [t.shape for t in product_key_topk(a, b, 48)] == [(2, 3, 48)] * 2  # k up to every pair
    for k in (0, 49, 2.0):
        with pytest.raises(ValueError, match=rf"product_key_topk: k={k!r} must be an integer in \[1, n_a·n_b = 48\]"):
            product_key_topk(a, b, k)
    with pytest.raises(ValueError, match=r"must agree on \[...\]; got \(2, 3, 8\) and \(2, 4, 6\)"):
        product_key_topk(a, torch.randn(2, 4, 6), 2)


def test_gathering_the_up_rows_mixes_as_embedding_bag_does(monkeypatch):
    """bf16 on CUDA mixes ``up``'s rows by a gather (embedding_bag has no bf16 backward for its weights there):
    the same values and gradients as embedding_bag, repeated ids included — and no embedding_bag."""
    from zoo_kernels.retrieval.reference import mix_rows

    torch.manual_seed(0)
    experts = torch.randint(0, 7, (5, 2, 3))
    experts[0, 0] = 4  # one id three times in a row's bag
    results, bag = [], F.embedding_bag
    for gather in (False, True):
        torch.manual_seed(1)
        up, coef = torch.randn(7, 6, requires_grad=True), torch.randn(5, 2, 3, requires_grad=True)
        monkeypatch.setattr(F, "embedding_bag", bag if not gather else lambda *a, **k: pytest.fail("embedding_bag"))
        out = mix_rows(experts, up, coef, gather=gather)
        results.append((out, *torch.autograd.grad((out * torch.linspace(-1, 1, 30).view(5, 6)).sum(), [up, coef])))
    for name, a, b in zip(["out", "d up", "d coef"], *results):
        torch.testing.assert_close(a, b, msg=lambda m: f"{name}: {m}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_embedding_bag_still_has_no_bf16_backward_for_its_weights():
    """Why the reference gathers ``up``'s rows for bf16 on CUDA (measured on torch 2.11). When a torch release
    gives embedding_bag that backward, this fails: then the gather (and its memory) can go."""
    up = torch.randn(7, 16, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    coef = torch.randn(5, 6, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    experts = torch.randint(0, 7, (5, 6), device="cuda")
    with pytest.raises(RuntimeError):
        F.embedding_bag(experts, up, per_sample_weights=coef, mode="sum").sum().backward()
