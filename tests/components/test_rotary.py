import math

import pytest
import torch

from components import Context, RotaryEmbedding, apply_rotary


@pytest.mark.parametrize("dim", [2, 8, 64])
def test_inner_product_depends_only_on_relative_position(dim):
    rope = RotaryEmbedding(max_position=512)
    q, k = torch.randn(dim, dtype=torch.float64), torch.randn(dim, dtype=torch.float64)

    def rotated_dot(t: int, s: int) -> float:
        pos = torch.tensor([[t, s]])
        cos, sin = rope(pos, dim)  # [1, 2, dim]
        x = torch.stack([q, k])[None, :, None, :].float()  # [1, 2, 1, dim]
        r = apply_rotary(x, cos, sin)[0, :, 0]  # [2, dim]
        return float(r[0] @ r[1])

    for offset in (0, 1, 5, 37):
        reference = rotated_dot(offset, 0)
        for shift in (1, 10, 200):
            assert rotated_dot(offset + shift, shift) == pytest.approx(reference, rel=1e-4, abs=1e-4)
    # ...and it does depend on the relative position (the test could fail).
    assert rotated_dot(5, 0) != pytest.approx(rotated_dot(6, 0), rel=1e-3)


def test_rotation_preserves_norm_and_is_identity_at_zero():
    rope = RotaryEmbedding()
    x = torch.randn(2, 5, 3, 16)
    cos, sin = rope(torch.arange(5).expand(2, 5), 16)
    y = apply_rotary(x, cos, sin)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[:, 0], x[:, 0])


def test_frequencies_follow_the_base():
    rope = RotaryEmbedding(max_position=100, base=10000.0)
    torch.testing.assert_close(rope.inv_freq(8, 10, torch.device("cpu")), 10000.0 ** (-torch.arange(0, 8, 2) / 8))


def test_ntk_scaling_past_max_position_lowers_frequencies():
    rope = RotaryEmbedding(max_position=16)
    inside = rope.inv_freq(8, 16, torch.device("cpu"))
    outside = rope.inv_freq(8, 64, torch.device("cpu"))
    assert inside[0] == outside[0] == 1.0  # the fastest frequency is kept
    assert (outside[1:] < inside[1:]).all()


@pytest.mark.parametrize("dim", [7, 0, -2])
def test_odd_rotary_dimension_is_refused(dim):
    with pytest.raises(ValueError, match=f"rotary dimension must be even and positive; got {dim}"):
        RotaryEmbedding()(torch.zeros(1, 3, dtype=torch.long), dim)


def test_context_shares_one_table_per_dimension():
    ctx = Context.default(torch.zeros(2, 6, 4))
    assert ctx.rotary_tables(8) is ctx.rotary_tables(8)
    assert ctx.rotary_tables(8)[0].shape == (2, 6, 8)


def test_rotation_equals_hand_computed_values_direction_pinned(rope_reference):
    # dim 2, position 1: the pair (x₀, x₁) turns by +1 radian, counter-clockwise: (1, 0) → (cos 1, sin 1).
    rope = RotaryEmbedding()
    cos, sin = rope(torch.tensor([[1]]), 2)
    turned = apply_rotary(torch.tensor([1.0, 0.0]).view(1, 1, 1, 2), cos, sin).flatten()
    torch.testing.assert_close(turned, torch.tensor([math.cos(1.0), math.sin(1.0)]))
    # Any even dim and position: pair (i, i + d/2) turns by position · base^(-2i/d), written out by hand.
    v = torch.randn(12, dtype=torch.float64)
    for position in (0, 3, 17, 250):
        cos, sin = rope(torch.tensor([[position]]), 12)
        got = apply_rotary(v.float().view(1, 1, 1, 12), cos, sin).flatten().double()
        torch.testing.assert_close(got, rope_reference(v, position), rtol=1e-5, atol=1e-5)


def test_ntk_stretch_is_per_sequence_not_per_batch():
    rope = RotaryEmbedding(max_position=8)
    short, long = torch.arange(6), torch.arange(20)
    batch = torch.stack([torch.cat([short, short.new_zeros(14)]), long])  # [2, 20]; row 0 ends at position 5
    cos, sin = rope(batch, 8)
    alone_cos, alone_sin = rope(short[None], 8)
    torch.testing.assert_close(cos[0, :6], alone_cos[0])  # the long neighbour does not stretch it
    torch.testing.assert_close(sin[0, :6], alone_sin[0])
    long_cos, _ = rope(long[None], 8)
    torch.testing.assert_close(cos[1], long_cos[0])
    assert not torch.allclose(long_cos[0, :6], alone_cos[0])  # ...and the long one is stretched


def test_the_stretch_past_max_position_is_the_formula_with_each_sequences_own_length():
    """``base · (f·L/max − (f − 1))^(d/(d−2))`` with ``f`` the scaling factor (2 here: a factor of 1 hides its
    ``− (f − 1)``) and ``L`` a sequence's last position + 1."""
    rope = RotaryEmbedding(16, base=100.0, scaling_factor=2.0)
    positions = torch.stack([torch.arange(40), torch.arange(40).clamp(max=9)])  # lengths 40 (stretched) and 10 (not)
    cos, sin = rope(positions, 8)
    base = 100.0 * (2.0 * 40 / 16 - 1.0) ** (8 / 6)
    for row, b in ((0, base), (1, 100.0)):
        inv = b ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)  # [4]
        angles = positions[row, :, None].double() * inv  # [T, 4]
        torch.testing.assert_close(cos[row], torch.cat([angles, angles], -1).cos().float(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sin[row], torch.cat([angles, angles], -1).sin().float(), rtol=1e-5, atol=1e-5)


def test_rotary_edges_refusals_and_dtype():
    rope = RotaryEmbedding(1)  # one position trained: the least there is
    cos, sin = rope(torch.zeros(2, 0, dtype=torch.long), 8)  # no positions: empty tables
    assert cos.shape == sin.shape == (2, 0, 8) and cos.dtype == torch.float32
    for kwargs, message in [(dict(max_position=0), "max_position=0 must be >= 1"), (dict(base=0.0), "base=0.0"),
                            (dict(scaling_factor=0.0), "scaling_factor=0.0")]:
        with pytest.raises(ValueError, match=f"RotaryEmbedding: {message}"):
            RotaryEmbedding(**kwargs)
    x = torch.randn(1, 3, 2, 8, dtype=torch.bfloat16)
    cos, sin = RotaryEmbedding()(torch.arange(3)[None], 8)  # fp32 tables
    assert apply_rotary(x, cos, sin).dtype == torch.bfloat16  # the input's dtype back
    for bad in (x[..., :6], x[:, :2]):  # tables of another dimension or length: a shape error inside the rotation
        with pytest.raises(ValueError, match=rf"apply_rotary: x \[B, T, H, d\] = \({', '.join(map(str, bad.shape))}\) "
                                             r"needs cos and sin \[B, T, d\]; got \(1, 3, 8\) and \(1, 3, 8\)"):
            apply_rotary(bad, cos, sin)
    with pytest.raises(ValueError, match=r"got \(1, 3, 8\) and \(1, 3, 4\)"):
        apply_rotary(x, cos, sin[..., :4])
    assert repr(RotaryEmbedding(64, base=500.0)) == "RotaryEmbedding(max_position=64, base=500.0, scaling_factor=1.0)"
