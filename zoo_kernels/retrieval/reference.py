"""Plain-torch reference of CDMoE's retrieval: product-key top-k and the expert gather-and-mix."""

from collections.abc import Callable

import torch


def product_key_topk(scores_a: torch.Tensor, scores_b: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the ``n_a·n_b`` sums ``scores_a[i] + scores_b[j]``, computed from ``k_a·k_b`` candidates.

    The best ``k`` sums only ever combine one of the best ``k_a = min(k, n_a)`` of ``a`` with one of the best
    ``k_b = min(k, n_b)`` of ``b`` (a pair whose ``i`` has ``k`` better ones is beaten by those ``k`` with the same
    ``j``), so the search costs ``O(n_a + n_b + k_a·k_b)`` per row instead of ``O(n_a·n_b)``.

    Args:
        scores_a: ``[..., n_a]``, scores_b: ``[..., n_b]``, the scores of the two halves of each query.
        k: how many experts to return (``≤ n_a·n_b``).

    Returns:
        ``scores [..., k]`` best first and ``experts [..., k]``, expert ``e = i·n_b + j``.
    """
    n_a, n_b = scores_a.shape[-1], scores_b.shape[-1]
    if scores_a.shape[:-1] != scores_b.shape[:-1]:
        raise ValueError(f"product_key_topk: scores_a [..., n_a] and scores_b [..., n_b] must agree on [...]; got "
                         f"{tuple(scores_a.shape)} and {tuple(scores_b.shape)}")
    if not (isinstance(k, int) and 1 <= k <= n_a * n_b):
        raise ValueError(f"product_key_topk: k={k!r} must be an integer in [1, n_a·n_b = {n_a * n_b}]")
    k_a, k_b = min(k, n_a), min(k, n_b)
    top_a, idx_a = scores_a.topk(k_a, dim=-1)  # [..., k_a]
    top_b, idx_b = scores_b.topk(k_b, dim=-1)  # [..., k_b]
    sums = top_a.unsqueeze(-1) + top_b.unsqueeze(-2)  # [..., k_a, k_b]
    scores, flat = sums.flatten(-2).topk(k, dim=-1)  # [..., k], flat = a_slot·k_b + b_slot
    experts = idx_a.gather(-1, flat // k_b) * n_b + idx_b.gather(-1, flat % k_b)  # [..., k]
    return scores, experts


def expert_mix_reference(
    x: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    down: torch.Tensor,
    up: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``y_m = Σ_{h,k} weights[m,h,k] · act(⟨x_m, down[e]⟩) · up[e]`` with ``e = experts[m,h,k]``.

    Args:
        x: ``[M, d]`` what the experts read.
        experts: ``[M, H, k]`` expert ids in ``[0, N)``.
        weights: ``[M, H, k]`` mixing weights.
        down, up: ``[N, d]`` each expert's input and output row.
        act: the experts' nonlinearity.

    Returns:
        ``[M, d]``. This reference gathers the ``[M, H, k, d]`` rows of ``down`` (the Triton kernel
        does not); ``up``'s rows are mixed by ``embedding_bag``, which never gathers them (except for bf16 on
        CUDA, whose ``embedding_bag`` has no backward for the mixing weights there).
    """
    rows = torch.nn.functional.embedding(experts, down)  # [M, H, k, d]; its backward is a sorted scatter, not index_put
    # mixed precision gives fp32 rows (parameters) and half activations: the product in the wider of the two
    wide = torch.promote_types(rows.dtype, x.dtype)
    inner = torch.einsum("mhkd,md->mhk", rows.to(wide), x.to(wide))  # [M, H, k]
    coef = weights * act(inner)  # [M, H, k]
    # CUDA has no bf16 backward for embedding_bag's per_sample_weights (torch 2.11): there the rows are gathered
    return mix_rows(experts, up, coef, gather=up.is_cuda and up.dtype == torch.bfloat16 and torch.is_grad_enabled())


def mix_rows(experts: torch.Tensor, up: torch.Tensor, coef: torch.Tensor, *, gather: bool) -> torch.Tensor:
    """``experts, coef [M, H, k]``, ``up [N, d]`` → ``Σ_{h,k} coef[m,h,k] · up[experts[m,h,k]]`` ``[M, d]``: by
    ``embedding_bag`` (no ``[M, H, k, d]`` rows), or with ``gather`` by gathering the rows (a backward everywhere)."""
    M, H, k = experts.shape
    coef = coef.to(up.dtype)
    if gather:
        return torch.einsum("mhk,mhkd->md", coef, torch.nn.functional.embedding(experts, up))  # [M, d]
    return torch.nn.functional.embedding_bag(experts.reshape(M, H * k), up, per_sample_weights=coef.reshape(M, H * k),
                                             mode="sum")  # [M, d]
