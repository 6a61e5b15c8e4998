"""Top-k routing for the routed mixtures of experts (a softmax router, and DeepSeek-V3's sigmoid router with its
auxiliary-loss-free balancing), the Switch-style balancing loss and ST-MoE's router z-loss."""

import math
from dataclasses import dataclass

import torch
from torch import nn

from components._checks import check_flags, check_number, check_positive
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


def sequence_balancing_loss(probs: torch.Tensor, experts: torch.Tensor, sequences: int,
                            valid: torch.Tensor | None = None, load: torch.Tensor | None = None) -> torch.Tensor:
    """DeepSeek-V3's sequence-wise balance loss (eq. 17-20, without its ``α``): :func:`switch_balancing_loss` within
    each sequence, ``N · Σ_i f_i · P_i`` over that sequence's valid tokens, averaged over the sequences that have
    any. ``probs [M, E]`` (normalised affinities), ``experts [M, k]`` the chosen ids, ``M = sequences · T`` tokens
    in sequence order, ``valid [M]`` (float 0/1; None: all). It is 1 when every sequence spreads its tokens evenly,
    where the batch-wide loss would accept sequences that each crowd one expert as long as the batch evens out.
    ``load``: the sequences' loads where the caller has them already (:func:`sequence_loads` of the same arguments)."""
    n_experts, T = probs.shape[-1], sequence_length(probs.shape[0], sequences)
    weights = torch.ones(probs.shape[0], device=probs.device) if valid is None else valid.float()  # [M]
    weights = weights.view(sequences, T)  # [B, T]
    load = sequence_loads(experts, n_experts, sequences, valid) if load is None else load  # [B, E], no gradient
    tokens = weights.sum(dim=1)  # [B]
    mean = (probs.reshape(sequences, T, n_experts) * weights[..., None].to(probs.dtype)).sum(dim=1) / tokens.clamp_min(
        1.0)[:, None].to(probs.dtype)  # [B, E]
    per_sequence = n_experts * (load.to(probs.dtype) * mean).sum(dim=-1)  # [B]
    present = (tokens > 0).to(probs.dtype)  # [B]
    return (per_sequence * present).sum() / present.sum().clamp_min(1.0)


def sequence_loads(experts: torch.Tensor, n_experts: int, sequences: int,
                   valid: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, E]``: the fraction of each sequence's assignments that each expert took (a row sums to 1; 0 for a sequence
    of padding alone). ``experts [M, k]`` the chosen ids of ``M = sequences · T`` tokens in sequence order, ``valid
    [M]`` (float 0/1; None: all). :func:`assignment_load` within each sequence: what the sequence-wise balance loss
    evens out, and what a batch's load (the mean of these rows, weighted by their tokens) can hide."""
    k, T = experts.shape[-1], sequence_length(experts.shape[0], sequences)
    weights = torch.ones(experts.shape[0], device=experts.device) if valid is None else valid.float()  # [M]
    counts = torch.zeros(sequences, n_experts, device=experts.device).scatter_add_(
        1, experts.reshape(sequences, T * k), weights.view(sequences, T).repeat_interleave(k, dim=1))  # [B, E]
    return counts / counts.sum(dim=1, keepdim=True).clamp_min(1.0)


def sequence_length(tokens: int, sequences: int) -> int:
    """``T`` of ``tokens = sequences · T`` tokens in sequence order (0 for no sequences: an empty batch, whose shapes a
    ``-1`` cannot infer)."""
    return tokens // sequences if sequences else 0


def router_z_loss(logits: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """ST-MoE's router z-loss (Zoph et al. 2022, eq. 5): the mean over the valid tokens of ``logsumexp(logits)²``,
    ``logits [M, E]``. It pulls the router's logits towards zero, where the softmax's exponentials round least."""
    return token_mean(torch.logsumexp(logits, dim=-1).square(), valid)


def router_logits(x: torch.Tensor, centroids: nn.Linear) -> torch.Tensor:
    """``x [M, d] · centroidsᵀ`` → ``[M, E]`` in at least fp32, even under autocast: Switch Transformer's selective
    precision (autocast's bf16 rounds close affinities together and sent 0.5% of tokens, at E=16, top-2, elsewhere
    than fp32 would)."""
    bias = None if centroids.bias is None else at_least_fp32(centroids.bias)  # (a router of one's own may have one)
    with without_autocast(x.device.type):
        return nn.functional.linear(at_least_fp32(x), at_least_fp32(centroids.weight), bias)  # [M, E]


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
        logits = router_logits(x, self.centroids)  # [M, E]
        probs = torch.softmax(logits, dim=-1)  # [M, E]
        gates, experts = top_k_lowest_index(probs, self.top_k)  # [M, k] each
        if self.normalize:
            gates = gates / gates.sum(dim=-1, keepdim=True)
        return Routing(experts=experts, gates=gates.to(x.dtype), probs=probs, logits=logits)

    def extra_repr(self) -> str:
        return f"n_experts={self.n_experts}, top_k={self.top_k}, normalize={self.normalize}"


class SigmoidRouter(nn.Module):
    """DeepSeek-V3's router: sigmoid affinities and auxiliary-loss-free balancing (Nemotron-H's MoE routes so)::

        s      = σ(x · e_i)                         [M, E] affinities, each in (0, 1): experts do not compete
        chosen = top-k of (s + b)                   b the balancing bias: it steers the choice, never the gates
        g      = s[chosen] / Σ s[chosen] · scale    (without normalize: s[chosen] · scale)

    The bias ``balance_bias [E]`` is a buffer, which no gradient reaches. In training the MoE hands the router each
    forward's expert load (:meth:`observe`), and :meth:`update_balance`, which the recipe calls after each optimizer
    step, moves each expert's bias by ``balance_rate`` towards the mean load: up where the expert took less than the
    mean over the step's forwards, down where it took more (DeepSeek-V3's γ; a tie moves nothing). ``balance_rate=0``
    keeps the bias as it is (an imported one, say).

    Group-limited routing (``n_groups > 1``, DeepSeek-V3's node limit): the experts fall into ``n_groups`` equal runs;
    a group scores the sum of its two best biased affinities, and each token chooses among the experts of its
    ``top_groups`` best groups. Ties go to the lower index, in groups and experts alike.

    :class:`Routing`'s ``probs`` are the affinities over their sum, so a balancing loss reads a distribution;
    its ``logits`` are None: ST-MoE's z-loss is a softmax's.

    Args:
        d_model: token width.
        n_experts: number of experts ``E``.
        top_k: experts per token (at most the experts of ``top_groups`` groups).
        normalize: divide the chosen affinities by their sum (default True, DeepSeek-V3's).
        scale: the gates' factor after that (default 1.0; DeepSeek-V3's ``routed_scaling_factor`` 2.5).
        n_groups: how many groups the experts fall into (default 1: no limit); it divides ``n_experts``.
        top_groups: the groups a token may choose from (default 1; at most ``n_groups``).
        balance_rate: the bias's step per optimizer step (default 1e-3, DeepSeek-V3's γ; 0: fixed).
    """

    def __init__(self, d_model: int, n_experts: int, top_k: int, *, normalize: bool = True, scale: float = 1.0,
                 n_groups: int = 1, top_groups: int = 1, balance_rate: float = 1e-3):
        super().__init__()
        check_positive("SigmoidRouter", d_model=d_model, n_experts=n_experts, top_k=top_k, n_groups=n_groups,
                       top_groups=top_groups)
        check_flags("SigmoidRouter", normalize=normalize)
        check_number("SigmoidRouter", "scale", scale, low=0, above=True)
        check_number("SigmoidRouter", "balance_rate", balance_rate, low=0)
        if n_experts % n_groups:
            raise ValueError(f"SigmoidRouter: n_groups={n_groups} does not divide n_experts={n_experts}")
        if top_groups > n_groups:
            raise ValueError(f"SigmoidRouter: top_groups={top_groups} exceeds n_groups={n_groups}")
        reachable = top_groups * (n_experts // n_groups)
        if top_k > reachable:
            raise ValueError(f"SigmoidRouter: top_k={top_k} exceeds the {reachable} experts a token can reach "
                             f"(top_groups={top_groups} of n_groups={n_groups} groups of {n_experts // n_groups})")
        self.n_experts, self.top_k, self.normalize, self.scale = n_experts, top_k, normalize, float(scale)
        self.n_groups, self.top_groups, self.balance_rate = n_groups, top_groups, float(balance_rate)
        self.centroids = nn.Linear(d_model, n_experts, bias=False)  # rows: the centroids e_i
        self.register_buffer("balance_bias", torch.zeros(n_experts))  # b [E], fp32 (saved in checkpoints)
        self.register_buffer("load_tally", torch.zeros(n_experts), persistent=False)  # Σ loads since the last update

    def forward(self, x: torch.Tensor) -> Routing:
        """``x [M, d_model]`` → :class:`Routing` of the M tokens."""
        scores = torch.sigmoid(router_logits(x, self.centroids))  # [M, E]
        choice = scores + self.balance_bias.float()  # [M, E]
        if self.n_groups > 1:
            grouped = choice.view(-1, self.n_groups, self.n_experts // self.n_groups)  # [M, G, E/G]
            best = top_k_lowest_index(grouped, min(2, grouped.shape[-1]))[0].sum(-1)  # [M, G] a group's two best
            kept = torch.zeros_like(best, dtype=torch.bool).scatter_(1, top_k_lowest_index(best, self.top_groups)[1], True)
            choice = choice.masked_fill(~kept.repeat_interleave(self.n_experts // self.n_groups, dim=1), -math.inf)
        experts = top_k_lowest_index(choice, self.top_k)[1]  # [M, k]
        gates = scores.gather(1, experts)  # [M, k] the affinities, without the bias
        if self.normalize:
            gates = gates / (gates.sum(dim=-1, keepdim=True) + 1e-20)  # (the epsilon: every affinity may round to 0)
        gates = gates * self.scale
        probs = scores / scores.sum(dim=-1, keepdim=True)  # [M, E]
        return Routing(experts=experts, gates=gates.to(x.dtype), probs=probs, logits=None)

    def _apply(self, fn, recurse=True):
        # The bias and its tally stay fp32 whatever the model is cast to: in bf16 a step of γ = 1e-3 on a bias of 0.25
        # would round away (bf16's spacing there is 2e-3), and balancing would stop without a word.
        super()._apply(fn, recurse)
        self.balance_bias, self.load_tally = self.balance_bias.float(), self.load_tally.float()
        return self

    @torch.no_grad()
    def observe(self, load: torch.Tensor) -> None:
        """Add one training forward's ``load [E]`` (each expert's share of the assignments) to the tally."""
        self.load_tally += load.float()

    @torch.no_grad()
    def update_balance(self) -> None:
        """One step of the balancing bias from the tally since the last (summed over the processes), then a new tally.
        No host sync: a tally of zeros (no training forward) moves nothing."""
        tally = self.load_tally
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(tally)  # every process takes the same step: the biases stay equal
        if self.balance_rate:
            self.balance_bias += self.balance_rate * torch.sign(tally.mean() - tally)
        tally.zero_()

    def extra_repr(self) -> str:
        groups = f", n_groups={self.n_groups}, top_groups={self.top_groups}" if self.n_groups > 1 else ""
        return (f"n_experts={self.n_experts}, top_k={self.top_k}, normalize={self.normalize}, scale={self.scale:g}"
                f"{groups}, balance_rate={self.balance_rate:g}")
