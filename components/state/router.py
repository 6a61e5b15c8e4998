"""Top-k routing for the routed mixtures of experts, the Switch-style balancing loss and ST-MoE's router z-loss."""

from dataclasses import dataclass

import torch
from torch import nn

from components._checks import check_flags, check_positive
from components.norm import at_least_fp32
from zoo_kernels._backend import without_autocast


class ForwardRecords:
    """Mixin for the mixtures that keep what their last forward measured as attributes (``aux_loss``,
    ``expert_load``): the loss holds that forward's autograd graph, which neither ``copy.deepcopy`` nor pickle can
    carry, so a copy (an EMA twin, ``torch.save`` of a whole model, Lightning's ``ddp_spawn``) starts without them."""

    forward_records = ("aux_loss", "expert_load", "router_z_loss")

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), **dict.fromkeys(self.forward_records)}


@dataclass
class Routing:
    """Where each of ``M`` tokens goes.

    Attributes:
        experts: ``[M, k]`` expert ids, best first; ties go to the lower id.
        gates: ``[M, k]`` the weights the experts' outputs are combined with.
        probs: ``[M, E]`` the full affinity softmax (for the balancing loss).
        logits: ``[M, E]`` the affinities before the softmax, at least fp32 (for the router z-loss); None for a router
            that has none.
    """

    experts: torch.Tensor
    gates: torch.Tensor
    probs: torch.Tensor
    logits: torch.Tensor | None = None

    def load(self, n_experts: int, valid: torch.Tensor | None = None) -> torch.Tensor:
        """``[E]`` fraction of the assignments each expert received (sums to 1), counting only the
        tokens where ``valid [M]`` (float 0/1) is 1; no gradient."""
        return assignment_load(self.experts, n_experts, valid)


def assignment_load(ids: torch.Tensor, n: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """``ids [M, j]`` (each of M tokens assigned to j of ``n`` slots) → ``[n]`` fraction of the
    assignments of the valid tokens (``valid [M]``, float 0/1; None: all) that each slot received."""
    flat = ids.reshape(-1)  # [M·j]
    if valid is None:
        weights = torch.ones(flat.shape, device=ids.device, dtype=torch.float32)
    else:
        weights = valid[:, None].expand(ids.shape).reshape(-1).float()  # [M·j]
    # index_add, not bincount: bincount sizes its output from the ids' maximum, a host sync on CUDA.
    counts = torch.zeros(n, device=ids.device, dtype=torch.float32).index_add_(0, flat, weights)  # [n]
    return counts / counts.sum().clamp_min(1.0)


def token_mean(values: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of ``values [M, ...]`` over the valid tokens (``valid [M]``, float 0/1; None: all)."""
    if valid is None:
        return values.sum(dim=0) / max(values.shape[0], 1)  # (0, not NaN, for no tokens at all)
    weights = valid.to(values.dtype).view(-1, *(1,) * (values.dim() - 1))
    return (values * weights).sum(dim=0) / weights.sum().clamp_min(1.0)


def valid_tokens(padding_mask: torch.Tensor | None, shape: torch.Size, owner: str) -> torch.Tensor | None:
    """``[M]`` float 1 at real tokens, 0 at padding, for an input of ``shape`` ``[..., d]``; None without a mask."""
    if padding_mask is None:
        return None
    if padding_mask.dtype != torch.bool or padding_mask.shape != shape[:-1]:
        raise ValueError(f"{owner}: padding_mask must be bool with the input's leading shape {tuple(shape[:-1])}; "
                         f"got {padding_mask.dtype} {tuple(padding_mask.shape)}")
    return (~padding_mask).reshape(-1).float()


def top_k_lowest_index(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` over the last dim, best first, ties broken toward the lower index.

    ``torch.topk`` leaves the order of equal values unspecified; a stable descending sort does not.
    """
    values, indices = torch.sort(scores, dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]


def switch_balancing_loss(probs: torch.Tensor, load: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Switch Transformer's ``N · Σ_i f_i · P_i``: ``f`` the load fractions ``[E]`` (no gradient),
    ``P`` the mean affinity ``[E]`` over the valid tokens of ``probs [M, E]``. It equals 1 when the
    routing is uniform and grows to ``N`` as every token crowds onto one expert."""
    n_experts = probs.shape[-1]
    return n_experts * torch.dot(load.to(probs.dtype), token_mean(probs, valid))


def router_z_loss(logits: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """ST-MoE's router z-loss (Zoph et al. 2022, eq. 5): the mean over the valid tokens of ``logsumexp(logits)²``,
    ``logits [M, E]``. It pulls the router's logits towards zero, where the softmax's exponentials round least."""
    return token_mean(torch.logsumexp(logits, dim=-1).square(), valid)


class TopKRouter(nn.Module):
    """Affinity ``softmax_i(x · e_i)`` over ``n_experts`` learned centroids, each token to its top-k.

    Args:
        d_model: token width.
        n_experts: number of experts ``E``.
        top_k: experts per token (``1 ≤ top_k ≤ n_experts``).
        normalize: renormalise the top-k gates to sum to 1 (default False: the gate is the affinity).
    """

    def __init__(self, d_model: int, n_experts: int, top_k: int, *, normalize: bool = False):
        super().__init__()
        check_positive("TopKRouter", d_model=d_model, n_experts=n_experts, top_k=top_k)
        check_flags("TopKRouter", normalize=normalize)
        if top_k > n_experts:
            raise ValueError(f"TopKRouter: top_k={top_k} exceeds n_experts={n_experts}")
        self.n_experts, self.top_k, self.normalize = n_experts, top_k, normalize
        self.centroids = nn.Linear(d_model, n_experts, bias=False)  # rows are the centroids e_i

    def forward(self, x: torch.Tensor) -> Routing:
        """``x [M, d_model]`` → :class:`Routing` of the M tokens."""
        # Switch Transformer's selective precision: the logits in at least fp32 even under autocast, whose bf16
        # rounds close affinities together and sends some tokens (0.5% at E=16, top-2) elsewhere than fp32 would.
        with without_autocast(x.device.type):
            logits = nn.functional.linear(at_least_fp32(x), at_least_fp32(self.centroids.weight))  # [M, E]
        probs = torch.softmax(logits, dim=-1)  # [M, E]
        gates, experts = top_k_lowest_index(probs, self.top_k)  # [M, k] each
        if self.normalize:
            gates = gates / gates.sum(dim=-1, keepdim=True)
        return Routing(experts=experts, gates=gates.to(x.dtype), probs=probs, logits=logits)

    def extra_repr(self) -> str:
        return f"n_experts={self.n_experts}, top_k={self.top_k}, normalize={self.normalize}"
