"""Oracles for how HybridLM composes its parts, written out by hand from the model's weights:
embedding, each block's pre-norms and residuals (with and without Doge's residual scales), the final
norm and the head (tied or not), and RMSNorm / grouped RMSNorm against their formulas."""

import functools

import pytest
import torch
import torch.nn.functional as F

from components import SSD, Context, HybridLM, QCAttention
from components.norm import GroupedRMSNorm, RMSNorm


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / sqrt(mean(x²) + eps) · weight`` over the last dimension."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def scrambled(model: HybridLM) -> HybridLM:
    """Non-unit norm gains and residual scales, so dropping or misplacing one changes the output."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "residual" in name:
                p.uniform_(0.3, 1.7)
    return model


@pytest.mark.parametrize("residual_scale", [False, True], ids=["plain", "residual-scales"])
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("post_norm", [[], ["AM", "-M"]], ids=["pre-norm", "post-norm"])
def test_hybridlm_forward_equals_its_composition_by_hand(residual_scale, tie, post_norm):
    eps = 1e-2  # large enough that where the epsilon goes shows in float64
    mixers = {"A": functools.partial(QCAttention, n_heads=4), "S": functools.partial(SSD, d_state=8, chunk_size=4)}
    model = HybridLM(40, 32, "AM -M A- SM", mixers, norm_eps=eps, residual_scale=residual_scale,
                     tie_embeddings=tie, post_norm=post_norm).double()
    scrambled(model)
    ids = torch.randint(0, 40, (2, 11))

    x = model.embedding.weight[ids]  # [B, T, d]
    context = Context(position_ids=torch.arange(11).expand(2, 11), rotary=model.rotary)
    for block in model.blocks:
        after = block.token in post_norm  # (OLMo 2's order: the norm on what the mixer adds)
        if block.sequence_mixer is not None:
            scale = block.sequence_residual if residual_scale else 1.0
            norm = lambda v: rms_norm(v, block.sequence_norm.weight, eps)  # noqa: E731
            x = scale * x + (norm(block.sequence_mixer(x, context)) if after else block.sequence_mixer(norm(x), context))
        if block.state_mixer is not None:
            scale = block.state_residual if residual_scale else 1.0
            norm = lambda v: rms_norm(v, block.state_norm.weight, eps)  # noqa: E731
            x = scale * x + (norm(block.state_mixer(x)) if after else block.state_mixer(norm(x)))
    head = model.embedding.weight if tie else model.lm_head.weight
    expected = rms_norm(x, model.norm.weight, eps) @ head.T  # [B, T, V]

    torch.testing.assert_close(model(ids), expected, rtol=1e-12, atol=1e-12)
    if residual_scale:  # the scales are really per channel (the check above could not see a scalar)
        assert block.state_residual.unique().numel() == 32


@pytest.mark.parametrize("magnitude", [1e-4, 1.0, 1e4])
def test_rms_norm_equals_its_formula_at_small_and_large_magnitudes(magnitude):
    norm = RMSNorm(24, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 24, dtype=torch.float64) * magnitude
    expected = rms_norm(x, norm.weight.double(), 1e-6)
    torch.testing.assert_close(norm(x.float()).double(), expected, rtol=2e-6, atol=0)
    # At 1e-4 the mean square (1e-8) is below eps: the epsilon visibly shrinks the output there.
    if magnitude == 1e-4:
        assert (norm(x.float()).abs() < 0.2 * x.float().abs() / x.float().pow(2).mean(-1, keepdim=True).sqrt()).all()


def test_rms_norm_in_bf16_is_computed_in_fp32():
    norm = RMSNorm(64)
    x = torch.randn(4, 64, dtype=torch.float64) * 300
    out = norm(x.bfloat16())
    assert out.dtype == torch.bfloat16
    expected = rms_norm(x.bfloat16().double(), norm.weight.double(), 1e-6)
    torch.testing.assert_close(out.double(), expected, rtol=8e-3, atol=0)  # bf16 rounding of the result only


def test_grouped_gated_rms_norm_equals_its_formula():
    norm = GroupedRMSNorm(12, groups=3, eps=1e-3).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x, z = torch.randn(2, 7, 12, dtype=torch.float64), torch.randn(2, 7, 12, dtype=torch.float64)
    gated = (x * F.silu(z)).view(2, 7, 3, 4)  # Mamba-2: gate first, then normalise each group
    expected = (gated / torch.sqrt(gated.pow(2).mean(-1, keepdim=True) + 1e-3)).view(2, 7, 12) * norm.weight
    torch.testing.assert_close(norm(x, gate=z), expected, rtol=1e-12, atol=1e-12)
