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
