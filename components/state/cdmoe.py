"""CDMoE (Wonderful Matrices v2 §3.3): a cross-domain MLP plus product-key retrieval over one-neuron experts."""

import math

import torch
from torch import nn

from components._checks import check_choice, check_flags, check_mixer_input, check_positive
from components.state.mlp import ACTIVATIONS, MLP
from components.norm import at_least_fp32
from components.state.router import ForwardRecords, assignment_load, token_mean, valid_tokens
from zoo_kernels._backend import check_backend, without_autocast
from zoo_kernels.retrieval import ACTIVATIONS as RETRIEVAL_ACTIVATIONS, expert_mix, product_key_topk

CROSS_DOMAIN = ("sequential", "parallel")


class CDMoE(ForwardRecords, nn.Module):
    """Cross-domain mixture of experts with efficient retrieval, ``[B, T, d_model] → [B, T, d_model]``::

        φ(x) = cross-domain MLP of x                        Wonderful Matrices v2: act(x Wˢ) Vˢ (``shared_mlp="plain"``)
        r    = φ(x) (sequential) or x (parallel)            what the router and the experts read
        s_a, s_b = scores of r against the n_a and n_b keys of each head's two halves
        (score, e) = top_k over the n_a·n_b sums s_a[i] + s_b[j],   e = i·n_b + j
        w    = softmax(score) over the top_k, per head
        y    = φ(x) + Σ_heads Σ_k w · act(⟨r, down_e⟩) · up_e

    The product keys find the best of ``N = n_a·n_b`` experts at a cost in ``n_a + n_b``
    (:func:`zoo_kernels.retrieval.product_key_topk`); ``N`` need not be a square (Cheems: 3072 = 48 × 64).
    The half scores come either from a query and two key tables per head (``key_dim`` set: ``q = r W_q``
    split in two halves of ``key_dim/2``, scored against ``[n_a]`` and ``[n_b]`` keys), or from one
    linear map of ``r`` to ``n_heads·(n_a + n_b)`` scores (``key_dim=None``, the released Doge models'
    ``router_gate``: for each token the first ``n_a`` scores are half a, the next ``n_b`` half b).

    The released Doge CDMoE (Hugging Face ``DogeCDMoE``) is ``cross_domain="parallel", shared_mlp="swiglu",
    n_heads=1, key_dim=None``. (Hugging Face's full forward reshapes the router logits across tokens,
    ``view(2, B·T, -1)``; this module computes the per-token math, which is what that code computes
    for one token at a time.)

    After each forward, ``expert_load [N]`` holds the fraction of retrievals each expert took, and
    with ``balance_loss=True`` ``aux_loss`` a Switch balancing loss on each key half: the load and
    mean softmax over the rows of half ``a`` (and of ``b``), ``n · Σ f_i P_i``, averaged over the two
    halves. (Balancing each half balances the experts' marginals, the part the product structure
    controls.) ``forward(x, padding_mask=None)`` leaves padded tokens out of both.

    Args:
        d_model: model width.
        n_experts: ``N`` (default 1024).
        n_keys: ``[n_a, n_b]`` with ``n_a·n_b = N`` (default None: ``N`` must be a square, ``n_a = n_b = √N``).
        n_heads: retrieval heads (default 4).
        top_k: experts per head (default 8; at most ``N``).
        d_ff: cross-domain MLP width (default: :func:`components.state.mlp.default_d_ff`, ``4·d_model``
            for the plain form).
        key_dim: query/key width per head, even (default 64); None scores with one linear map.
        shared_mlp: the cross-domain MLP's form, any :class:`MLP` form (default ``plain``, Wonderful Matrices v2;
            ``swiglu`` for Doge).
        act: ``silu`` | ``gelu`` | ``relu`` for the cross-domain MLP and the experts (default ``silu``).
        cross_domain: ``sequential`` (default: router and experts read ``φ(x)``, the paper's form two) |
            ``parallel`` (they read ``x``, form one, used by Doge).
        balance_loss: expose the balancing loss as ``aux_loss`` (default False).
        backend: the gather-and-mix kernel, ``auto`` | ``reference`` | ``triton``.
    """

    mixer_slot = "state"  # the block slot it fills; a pattern placing it in the other is refused

    def __init__(self, d_model: int, *, n_experts: int = 1024, n_keys: list[int] | None = None, n_heads: int = 4,
                 top_k: int = 8, d_ff: int | None = None, key_dim: int | None = 64, shared_mlp: str = "plain",
                 act: str = "silu", cross_domain: str = "sequential", balance_loss: bool = False,
                 backend: str = "auto"):
        super().__init__()
        check_positive("CDMoE", d_model=d_model, n_experts=n_experts, n_heads=n_heads, top_k=top_k)
        check_choice("CDMoE", "act", act, RETRIEVAL_ACTIVATIONS)  # (the retrieval kernel's: no relu2)
        check_choice("CDMoE", "cross_domain", cross_domain, CROSS_DOMAIN)
        check_flags("CDMoE", balance_loss=balance_loss)
        check_backend(backend, "CDMoE")
        if n_keys is None:
            root = math.isqrt(n_experts)
            if root * root != n_experts:
                raise ValueError(
                    f"CDMoE: n_experts={n_experts} is not a perfect square (nearest: {root ** 2} or {(root + 1) ** 2}); "
                    "pass n_keys=[n_a, n_b] with n_a·n_b = n_experts for a rectangular product (e.g. 3072 = 48 × 64)"
                )
            n_keys = [root, root]
        if len(n_keys) != 2 or n_keys[0] * n_keys[1] != n_experts:
            raise ValueError(f"CDMoE: n_keys={list(n_keys)} must be two numbers whose product is n_experts={n_experts}")
        check_positive("CDMoE", n_a=n_keys[0], n_b=n_keys[1])
        if top_k > n_experts:
            raise ValueError(f"CDMoE: top_k={top_k} exceeds n_experts={n_experts}")
        if key_dim is not None and (not isinstance(key_dim, int) or key_dim < 2 or key_dim % 2):
            raise ValueError(f"CDMoE: key_dim={key_dim} must be an even integer of at least 2 (it splits in two halves), "
                             "or None")
        self.d_model, self.n_experts, self.n_keys, self.n_heads, self.top_k = d_model, n_experts, list(n_keys), n_heads, top_k
        self.key_dim, self.act_name = key_dim, act
        self.cross_domain, self.balance_loss, self.backend = cross_domain, balance_loss, backend
        self.act = ACTIVATIONS[act]

        self.shared = MLP(d_model, d_ff=d_ff, activation=shared_mlp, act=act)  # φ
        self.d_ff = self.shared.d_ff
        n_a, n_b = n_keys
        if key_dim is None:
            self.router = nn.Linear(d_model, n_heads * (n_a + n_b), bias=False)  # scores directly
        else:
            self.query = nn.Linear(d_model, n_heads * key_dim, bias=False)  # W_q
            half = key_dim // 2
            self.keys_a = nn.Parameter(torch.randn(n_heads, n_a, half) / math.sqrt(half))  # [H, n_a, key_dim/2]
            self.keys_b = nn.Parameter(torch.randn(n_heads, n_b, half) / math.sqrt(half))  # [H, n_b, key_dim/2]
        # One-neuron experts: an input row and an output row each, initialised like nn.Linear.
        bound_down, bound_up = 1 / math.sqrt(d_model), 1 / math.sqrt(n_heads * top_k)
        self.down = nn.Parameter(torch.empty(n_experts, d_model).uniform_(-bound_down, bound_down))  # [N, d]
        self.up = nn.Parameter(torch.empty(n_experts, d_model).uniform_(-bound_up, bound_up))  # [N, d]
        self.aux_loss: torch.Tensor | None = None
        self.expert_load: torch.Tensor | None = None

    def half_scores(self, reads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``reads [M, d]`` → the scores of the two key halves, ``[M, H, n_a]`` and ``[M, H, n_b]``, in at least
        fp32 even under autocast (Switch Transformer's selective precision): bf16 scores tie and swap the close
        candidates of the top-k, and picked another set of experts for 7.7% of tokens (256 experts, 2 heads, top-4)."""
        M, (n_a, n_b) = reads.shape[0], self.n_keys
        reads = at_least_fp32(reads)
        with without_autocast(reads.device.type):
            if self.key_dim is None:
                scores = nn.functional.linear(reads, at_least_fp32(self.router.weight))  # [M, H·(n_a + n_b)]
                scores = scores.view(M, self.n_heads, n_a + n_b)  # per token: [a-half | b-half]
                return scores[..., :n_a], scores[..., n_a:]
            q = nn.functional.linear(reads, at_least_fp32(self.query.weight))  # [M, H·key_dim]
            q = q.view(M, self.n_heads, 2, self.key_dim // 2)  # [M, H, 2, key_dim/2]
            return (torch.einsum("mhd,hnd->mhn", q[:, :, 0], at_least_fp32(self.keys_a)),  # [M, H, n_a]
                    torch.einsum("mhd,hnd->mhn", q[:, :, 1], at_least_fp32(self.keys_b)))  # [M, H, n_b]

    reads_padding_mask = True  # the block passes the model's, so padding counts in no expert's load

    def forward(self, x: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        owner = type(self).__name__
        check_mixer_input(owner, x, self.d_model, self.down, sequence=False)
        valid = valid_tokens(padding_mask, x.shape, owner)  # [M] or None
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # [M, d], M = B·T
        if valid is not None:
            flat = flat.masked_fill(valid[:, None] == 0, 0.0)
        phi = self.shared(flat)  # [M, d]
        reads = phi if self.cross_domain == "sequential" else flat
        halves = self.half_scores(reads)
        scores, experts = product_key_topk(*halves, self.top_k)  # [M, H, k] each
        weights = torch.softmax(at_least_fp32(scores), dim=-1).to(phi.dtype)  # [M, H, k]
        y = phi + expert_mix(reads, experts, weights, self.down, self.up, act=self.act_name, backend=self.backend)
        self._record_usage(experts, halves, valid)
        return y.view(shape)

    def _record_usage(self, experts: torch.Tensor, halves: tuple[torch.Tensor, torch.Tensor],
                      valid: torch.Tensor | None) -> None:
        per_token = experts.reshape(experts.shape[0], self.n_heads * self.top_k)  # [M, H·k]
        self.expert_load = assignment_load(per_token, self.n_experts, valid)  # [N]
        if not self.balance_loss:
            return
        n_b = self.n_keys[1]
        losses = []
        for rows, scores in ((per_token // n_b, halves[0]), (per_token % n_b, halves[1])):
            n = scores.shape[-1]
            load = assignment_load(rows, n, valid)  # [n]
            probs = torch.softmax(at_least_fp32(scores), dim=-1)  # [M, H, n]
            losses.append(n * torch.dot(load.to(probs.dtype), token_mean(probs, valid).mean(dim=0)))
        self.aux_loss = (losses[0] + losses[1]) / 2

    def extra_flops_per_token(self, seq_len: int) -> int:
        """Scoring both key halves (with ``key_dim``), and the ``n_heads·top_k`` retrieved one-neuron experts:
        a dot product with ``down`` and a scaled row of ``up`` each (:mod:`components.flops`)."""
        keys = 0 if self.key_dim is None else 2 * self.n_heads * sum(self.n_keys) * (self.key_dim // 2)
        return keys + self.n_heads * self.top_k * 4 * self.d_model

    def active_parameters(self) -> int:
        """The cross-domain MLP, the router (query and every key, or the linear map: all are scored),
        and the ``n_heads·top_k`` experts (two rows each) one token retrieves."""
        experts = {id(self.down), id(self.up)}
        dense = sum(p.numel() for p in self.parameters() if id(p) not in experts)
        return dense + self.n_heads * self.top_k * 2 * self.d_model

    def extra_repr(self) -> str:
        return (f"n_experts={self.n_experts}, n_keys={self.n_keys}, n_heads={self.n_heads}, top_k={self.top_k}, "
                f"key_dim={self.key_dim}, act={self.act_name}, cross_domain={self.cross_domain}, "
                f"balance_loss={self.balance_loss}")
