"""CDMoE (seed 002 §3.3): a cross-domain MLP plus product-key retrieval over one-neuron experts."""

import math

import torch
from torch import nn

from components._checks import check_choice, check_mixer_input, check_positive
from components.state.mlp import ACTIVATIONS
from components.state.router import assignment_load, token_mean, valid_tokens
from kernels._backend import check_backend
from kernels.retrieval import expert_mix, product_key_topk

CROSS_DOMAIN = ("sequential", "parallel")


class CDMoE(nn.Module):
    """Cross-domain mixture of experts with efficient retrieval, ``[B, T, d_model] → [B, T, d_model]``::

        φ(x) = act(x Wˢ) Vˢ                                  cross-domain MLP, width d_ff
        q    = φ(x) W_q                                     per head: two halves of key_dim/2
        s_a, s_b = ⟨q_a, K_a⟩, ⟨q_b, K_b⟩                   [n_keys] each, per head
        (score, e) = top_k over the n_keys² sums s_a[i] + s_b[j],   e = i·n_keys + j
        w    = softmax(score) over the top_k, per head
        y    = φ(x) + Σ_heads Σ_k w · act(⟨z, down_e⟩) · up_e       z = φ(x) (sequential) or x (parallel)

    The product keys find the best of ``N = n_keys²`` experts at a cost in ``√N``
    (:func:`kernels.retrieval.product_key_topk`).

    After each forward, ``expert_load [N]`` holds the fraction of retrievals each expert took, and
    with ``balance_loss=True`` ``aux_loss`` a Switch balancing loss on each key half: the load and
    mean softmax over the ``n_keys`` rows of half ``a`` (and of ``b``), ``n_keys · Σ f_i P_i``,
    averaged over the two halves. (Balancing each half balances the experts' marginals, the part
    the product structure controls.)

    Args:
        d_model: model width.
        n_experts: ``N``, a perfect square (default 1024).
        n_heads: retrieval heads (default 4).
        top_k: experts per head (default 8; at most ``√N``).
        d_ff: cross-domain MLP width (default ``4·d_model``).
        key_dim: query/key width per head, even (default 64).
        act: ``silu`` | ``gelu`` | ``relu`` for the cross-domain MLP and the experts (default ``silu``).
        cross_domain: ``sequential`` (default: experts read ``φ(x)``, the paper's form two) |
            ``parallel`` (experts read ``x``, form one, used by Doge).
        balance_loss: expose the balancing loss as ``aux_loss`` (default False).
        backend: the gather-and-mix kernel, ``auto`` | ``reference`` | ``triton``.
    """

    def __init__(self, d_model: int, *, n_experts: int = 1024, n_heads: int = 4, top_k: int = 8,
                 d_ff: int | None = None, key_dim: int = 64, act: str = "silu", cross_domain: str = "sequential",
                 balance_loss: bool = False, backend: str = "auto"):
        super().__init__()
        d_ff = 4 * d_model if d_ff is None else d_ff
        check_positive("CDMoE", d_model=d_model, n_experts=n_experts, n_heads=n_heads, top_k=top_k, d_ff=d_ff,
                       key_dim=key_dim)
        check_choice("CDMoE", "act", act, ACTIVATIONS)
        check_choice("CDMoE", "cross_domain", cross_domain, CROSS_DOMAIN)
        check_backend(backend)
        n_keys = math.isqrt(n_experts)
        if n_keys * n_keys != n_experts:
            raise ValueError(
                f"CDMoE: n_experts={n_experts} is not a perfect square (product keys need n_keys²; "
                f"nearest: {n_keys ** 2} or {(n_keys + 1) ** 2})"
            )
        if top_k > n_keys:
            raise ValueError(f"CDMoE: top_k={top_k} exceeds √n_experts={n_keys}, the candidates per key half")
        if key_dim % 2:
            raise ValueError(f"CDMoE: key_dim={key_dim} must be even (it splits into two halves)")
        self.n_experts, self.n_keys, self.n_heads, self.top_k = n_experts, n_keys, n_heads, top_k
        self.d_ff, self.key_dim, self.act_name = d_ff, key_dim, act
        self.cross_domain, self.balance_loss, self.backend = cross_domain, balance_loss, backend
        self.act = ACTIVATIONS[act]

        self.shared_in = nn.Linear(d_model, d_ff, bias=False)  # Wˢ
        self.shared_out = nn.Linear(d_ff, d_model, bias=False)  # Vˢ
        self.query = nn.Linear(d_model, n_heads * key_dim, bias=False)  # W_q
        half = key_dim // 2
        self.keys = nn.Parameter(torch.randn(n_heads, 2, n_keys, half) / math.sqrt(half))  # [H, 2, n_keys, key_dim/2]
        # One-neuron experts: an input row and an output row each, initialised like nn.Linear.
        bound_down, bound_up = 1 / math.sqrt(d_model), 1 / math.sqrt(n_heads * top_k)
        self.down = nn.Parameter(torch.empty(n_experts, d_model).uniform_(-bound_down, bound_down))  # [N, d]
        self.up = nn.Parameter(torch.empty(n_experts, d_model).uniform_(-bound_up, bound_up))  # [N, d]
        self.aux_loss: torch.Tensor | None = None
        self.expert_load: torch.Tensor | None = None

    def retrieve(self, phi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``phi [M, d]`` → (scores ``[M, H, k]``, experts ``[M, H, k]``, the half scores ``2 × [M, H, n_keys]``)."""
        M = phi.shape[0]
        q = self.query(phi).view(M, self.n_heads, 2, self.key_dim // 2)  # [M, H, 2, key_dim/2]
        halves = torch.einsum("mhcd,hcnd->mhcn", q, self.keys)  # [M, H, 2, n_keys]
        scores_a, scores_b = halves.unbind(2)  # 2 × [M, H, n_keys]
        scores, experts = product_key_topk(scores_a, scores_b, self.top_k)  # [M, H, k] each
        return scores, experts, (scores_a, scores_b)

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``x [..., d]``; ``padding_mask`` (True at padding) zeroes those tokens and leaves them out
        of ``expert_load`` and the balancing loss."""
        owner = type(self).__name__
        check_mixer_input(owner, x, self.down.shape[1], self.down, sequence=False)
        valid = valid_tokens(padding_mask, x.shape, owner)  # [M] or None
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # [M, d], M = B·T
        if valid is not None:
            flat = flat.masked_fill(valid[:, None] == 0, 0.0)
        phi = self.shared_out(self.act(self.shared_in(flat)))  # [M, d]
        scores, experts, halves = self.retrieve(phi)
        weights = torch.softmax(scores.float(), dim=-1).to(phi.dtype)  # [M, H, k]
        reads = phi if self.cross_domain == "sequential" else flat
        y = phi + expert_mix(reads, experts, weights, self.down, self.up, act=self.act_name, backend=self.backend)
        self._record_usage(experts, halves, valid)
        return y.view(shape)

    def _record_usage(self, experts: torch.Tensor, halves: tuple[torch.Tensor, torch.Tensor],
                      valid: torch.Tensor | None) -> None:
        per_token = experts.reshape(experts.shape[0], self.n_heads * self.top_k)  # [M, H·k]
        self.expert_load = assignment_load(per_token, self.n_experts, valid)  # [N]
        if not self.balance_loss:
            return
        losses = []
        for rows, scores in ((per_token // self.n_keys, halves[0]), (per_token % self.n_keys, halves[1])):
            load = assignment_load(rows, self.n_keys, valid)  # [n_keys]
            probs = torch.softmax(scores.float(), dim=-1)  # [M, H, n_keys]
            losses.append(self.n_keys * torch.dot(load, token_mean(probs, valid).mean(dim=0)))
        self.aux_loss = (losses[0] + losses[1]) / 2

    def active_parameters(self) -> int:
        """The cross-domain MLP, the query projection and every key (all are scored), and the
        ``n_heads·top_k`` experts (two rows each) one token retrieves."""
        dense = sum(p.numel() for m in (self.shared_in, self.shared_out, self.query) for p in m.parameters())
        return dense + self.keys.numel() + self.n_heads * self.top_k * 2 * self.down.shape[1]

    def extra_repr(self) -> str:
        return (f"n_experts={self.n_experts}, n_heads={self.n_heads}, top_k={self.top_k}, d_ff={self.d_ff}, "
                f"key_dim={self.key_dim}, act={self.act_name}, cross_domain={self.cross_domain}")
