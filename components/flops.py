"""Forward FLOPs per token, counted from the model's structure: what MFU is computed from (docs/performance.md).

Only matrix products count (2 FLOPs per multiply-add), as in PaLM's MFU and torch's ``FlopCounterMode``;
elementwise work (norms, activations, softmax, decays) is left out. Every ``nn.Linear`` and ``nn.Conv1d`` is
counted from its shape; a module that multiplies matrices of its own — attention's scores and weighted sum,
the SSD's chunked products, a MoE's routed experts — adds them in ``extra_flops_per_token(seq_len)``. The
count is of one token of a sequence of ``seq_len`` tokens: attention's term grows with it (every query
against every key, the causal half not discounted, as SDPA's count and PaLM's formula have it), the SSD's
chunks pad to whole chunks. A training step costs about three forwards (the backward twice the forward).
"""

from torch import nn


def forward_flops_per_token(module: nn.Module, seq_len: int) -> float:
    """Forward FLOPs per token of ``module`` (a whole model or one mixer) on sequences of ``seq_len`` tokens."""
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"forward_flops_per_token: seq_len={seq_len!r} must be a positive integer")
    total = 0
    for m in module.modules():
        if isinstance(m, nn.Linear):
            total += 2 * m.in_features * m.out_features
        elif isinstance(m, nn.Conv1d):
            total += 2 * (m.in_channels // m.groups) * m.kernel_size[0] * m.out_channels
        extra = getattr(m, "extra_flops_per_token", None)
        if extra is not None:
            total += extra(seq_len)
    return total


def attention_flops_per_token(seq_len: int, n_heads: int, head_dim: int) -> int:
    """Scores ``q·k`` and the weighted sum of values: ``2 · 2 · seq_len · head_dim`` per head."""
    return 4 * seq_len * n_heads * head_dim


def ssd_flops_per_token(seq_len: int, chunk: int, heads: int, groups: int, head_dim: int, d_state: int) -> float:
    """The chunked SSD's products (zoo_kernels/ssd/README.md): inside each chunk ``C·Bᵀ`` (per group) and its
    product with ``x``, each chunk's state, the recurrence over chunk states, and each position's read-out."""
    chunks = -(-seq_len // chunk)
    padded = chunks * chunk
    H, G, P, N = heads, groups, head_dim, d_state
    total = (2 * padded * chunk * N * G  # C·Bᵀ inside each chunk, once per group
             + 2 * padded * chunk * P * H  # (decayed C·Bᵀ) · x
             + 2 * padded * P * N * H  # each chunk's own final state
             + 2 * (chunks + 1) ** 2 * P * N * H  # the recurrence over chunk states (one matrix of decays)
             + 2 * padded * N * P * H)  # read-out of the entering state
    return total / seq_len


def gated_delta_flops_per_token(seq_len: int, chunk: int, heads: int, key_dim: int, value_dim: int) -> float:
    """The chunked gated delta rule's products (zoo_kernels/gated_delta/README.md): inside each chunk ``K·Kᵀ`` and
    ``Q·Kᵀ``, the unit-triangular solve for the corrected values (``L (L - 1)`` FLOPs per right-hand column, which
    torch's counter does not see), and per chunk the products with the state entering it: the correction, the
    read-out, the weighted sum of corrected values and the state's update."""
    chunks = -(-seq_len // chunk)
    padded, L, H, K, V = chunks * chunk, chunk, heads, key_dim, value_dim
    total = (2 * 2 * padded * L * K * H  # K·Kᵀ and Q·Kᵀ inside each chunk
             + padded * (L - 1) * (V + K) * H  # the solve, for U (values) and W (keys) at once
             + 2 * padded * K * V * H  # W · S: what the state already predicts
             + 2 * padded * K * V * H  # (decayed Q) · S: the read-out of the entering state
             + 2 * padded * L * V * H  # scores · Δ
             + 2 * padded * K * V * H)  # Kᵀ · Δ: the state's update
    return total / seq_len
