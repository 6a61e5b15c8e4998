"""``ShortConv`` (LFM2's gated short convolution) against its formula written out with torch's own ``conv1d``:
``y = W_out (c ⊙ conv_K(b ⊙ h))``, ``[b | c | h] = x W_in``, outputs and every gradient; causality; a left-padded
sequence equal to the sequence alone, biases or not; a document start reading nothing before it. (The catalogue's
contract tests compare the mixer with itself — prefill against steps, a packed row against its documents — so a
kernel flipped in time or the gates swapped would pass them.)"""

import pytest
import torch
import torch.nn.functional as F

from components import ShortConv
from components.context import Context


def written_out(x: torch.Tensor, m: ShortConv) -> torch.Tensor:
    """The formula with torch's conv1d: left-padded by ``K - 1`` zeros, so position ``t`` reads ``t - K + 1 … t``."""
    b, c, h = F.linear(x, m.in_proj.weight, m.in_proj.bias).chunk(3, dim=-1)
    K = m.conv.kernel_size[0]
    u = (b * h).transpose(1, 2)  # [B, d, T]
    v = F.conv1d(F.pad(u, (K - 1, 0)), m.conv.weight, m.conv.bias, groups=m.d_model).transpose(1, 2)  # [B, T, d]
    return F.linear(c * v, m.out_proj.weight, m.out_proj.bias)


def mixer(**options) -> ShortConv:
    torch.manual_seed(0)
    return ShortConv(8, **options).double()


@pytest.mark.parametrize("options", [{}, {"kernel_size": 4, "bias": True}, {"kernel_size": 1}],
                         ids=["LFM2's", "4 taps, biases", "1 tap"])
def test_short_conv_matches_its_formula_written_out_outputs_and_gradients(options):
    m = mixer(**options)
    x = torch.randn(2, 11, 8, dtype=torch.float64, requires_grad=True)
    got, want = m(x), written_out(x, m)
    torch.testing.assert_close(got, want)
    target = torch.randn_like(got)
    grads = torch.autograd.grad((got * target).sum(), [x, *m.parameters()])
    wants = torch.autograd.grad((want * target).sum(), [x, *m.parameters()])
    for name, a, b in zip(["x", *(n for n, _ in m.named_parameters())], grads, wants):
        torch.testing.assert_close(a, b, msg=name)


def test_short_conv_is_causal_and_reads_only_its_last_k_positions(assert_causal):
    m = mixer(kernel_size=3)
    x = torch.randn(1, 9, 8, dtype=torch.float64)
    assert_causal(m, x)
    y = m(x)
    moved = x.clone()
    moved[0, 2] += 1.0  # position 2 reaches 2, 3 and 4, no further
    changed = (m(moved) - y).abs().sum(-1)[0] > 0
    assert changed.tolist() == [False, False, True, True, True, False, False, False, False]


@pytest.mark.parametrize("bias", [False, True])
def test_a_left_padded_sequence_equals_the_sequence_alone_whatever_the_padding_held(bias):
    """Padding passes nothing on: not its input (NaN here), in the outputs or the gradients, and with biases not
    ``bias ⊙ bias`` either, which the first real tokens' taps would read."""
    m = mixer(bias=bias)
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    padded = torch.cat([torch.full((1, 3, 8), float("nan"), dtype=torch.float64), x], dim=1)
    pad = torch.tensor([[True] * 3 + [False] * 6])
    positions = (torch.cumsum(~pad, dim=1) - 1).clamp_min(0)
    got = m(padded, Context(position_ids=positions, padding_mask=pad))[:, 3:]
    torch.testing.assert_close(got, m(x))
    got.sum().backward()  # (a NaN left in the input would reach the weights' gradients through the gates: 0 · NaN)
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_a_document_reads_nothing_of_the_one_before():
    m = mixer()
    x = torch.randn(1, 7, 8, dtype=torch.float64)
    ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1]])
    packed = m(x, Context(position_ids=torch.arange(7)[None], document_ids=ids))
    torch.testing.assert_close(packed, torch.cat([m(x[:, :4]), m(x[:, 4:])], dim=1))


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="ShortConv: kernel_size=0 must be a positive integer"):
        ShortConv(8, kernel_size=0)
    with pytest.raises(ValueError, match="ShortConv: bias='yes' must be True or False"):
        ShortConv(8, bias="yes")
    assert repr(ShortConv(8)).startswith("ShortConv(\n  kernel_size=3, bias=False")
