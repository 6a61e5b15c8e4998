"""The norms' small print: the widening they compute in, the grouped norm's groups, what a summary prints."""

import pytest
import torch

from components.norm import GroupedRMSNorm, RMSNorm, at_least_fp32


def test_norms_compute_in_at_least_fp32_and_hand_back_the_inputs_dtype():
    x = torch.randn(3, 8)
    assert at_least_fp32(x) is x  # (no copy, no dispatch)
    assert at_least_fp32(x.double()).dtype == torch.float64  # wider stays wider (gradcheck)
    assert at_least_fp32(x.bfloat16()).dtype == torch.float32 and at_least_fp32(x.half()).dtype == torch.float32
    for norm in (RMSNorm(8), GroupedRMSNorm(8, groups=2)):
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
        y = norm(x.bfloat16())
        assert y.dtype == torch.bfloat16 and torch.equal(y, norm(x.bfloat16().float()).bfloat16())


def test_a_grouped_norm_normalises_each_group_and_refuses_groups_that_do_not_divide():
    x = torch.randn(2, 12)
    y = GroupedRMSNorm(12, groups=3)(x)
    expected = torch.cat([g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + 1e-6) for g in x.split(4, dim=-1)], -1)
    torch.testing.assert_close(y, expected)
    with pytest.raises(ValueError, match="GroupedRMSNorm: dim=10 is not divisible by groups=3"):
        GroupedRMSNorm(10, groups=3)
    assert repr(GroupedRMSNorm(12, groups=3, eps=1e-5)) == "GroupedRMSNorm(12, groups=3, eps=1e-05)"


def test_the_gated_norm_normalises_x_times_silu_of_the_gate_then_scales_each_channel():
    """Mamba-2's order: gate first, then the norm (a sigmoid gate, or the gate after the norm, is another layer)."""
    torch.manual_seed(0)
    x, gate = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    norm = GroupedRMSNorm(8, groups=2, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    gated = x * gate * torch.sigmoid(gate)  # silu written out
    expected = torch.cat([g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + 1e-5) for g in gated.split(4, dim=-1)], -1)
    torch.testing.assert_close(norm(x, gate), expected * norm.weight)
    assert repr(RMSNorm(8, eps=1e-5)) == "RMSNorm(8, eps=1e-05)"
