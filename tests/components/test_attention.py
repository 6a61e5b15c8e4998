import pytest
import torch

from components import Context, QCAttention, RotaryEmbedding


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_qcattention_is_causal(assert_causal, n_kv_heads):
    mixer = QCAttention(32, n_heads=4, n_kv_heads=n_kv_heads)
    assert_causal(mixer, torch.randn(2, 11, 32))


def test_qcattention_works_alone_and_with_a_default_context():
    mixer = QCAttention(32, n_heads=4)
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(mixer(x), mixer(x, Context.default(x)))


def test_padded_keys_receive_no_attention():
    mixer = QCAttention(16, n_heads=2)
    x = torch.randn(1, 8, 16)
    padding = torch.zeros(1, 8, dtype=torch.bool)
    padding[0, :3] = True  # left padding
    ctx = Context(position_ids=torch.arange(8)[None], padding_mask=padding)
    y = mixer(x, ctx)
    # Whatever the padded positions hold, the real positions' outputs do not change...
    x2 = x.clone()
    x2[0, :3] = torch.randn(3, 16) * 10
    torch.testing.assert_close(mixer(x2, ctx)[0, 3:], y[0, 3:])
    # ...whereas without the mask they would.
    assert not torch.allclose(mixer(x2)[0, 3:], mixer(x)[0, 3:])


def test_relative_positions_only():
    mixer = QCAttention(16, n_heads=2)
    x = torch.randn(2, 6, 16)
    shifted = Context(position_ids=torch.arange(6).expand(2, 6) + 17, rotary=RotaryEmbedding(64))
    torch.testing.assert_close(mixer(x, shifted), mixer(x, Context.default(x, RotaryEmbedding(64))), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(d_model=100, n_heads=3), "d_model=100 is not divisible by n_heads=3"),
        (dict(d_model=32, n_heads=4, n_kv_heads=3), "n_heads=4 is not divisible by n_kv_heads=3"),
        (dict(d_model=12, n_heads=4), "head_dim = d_model / n_heads = 3 must be even"),
        (dict(d_model=32, n_heads=4, rope_fraction=0.3), "head_dim·rope_fraction = 8·0.3 = 2.4 must be an even whole"),
        (dict(d_model=32, n_heads=4, rope_fraction=0.125), "head_dim·rope_fraction = 8·0.125 = 1 must be an even whole"),
        (dict(d_model=32, rope_fraction=1.5), "QCAttention: rope_fraction=1.5 must be at most 1"),
        (dict(d_model=32, rope_fraction=0), "QCAttention: rope_fraction=0 must be a finite number > 0"),
        (dict(d_model=32, n_heads=4, head_dim=7), "QCAttention: head_dim=7 must be even for RoPE"),
        (dict(d_model=32, n_heads=4, head_dim=0), "QCAttention: head_dim=0 must be a positive integer"),
        (dict(d_model=32, n_heads=0), "n_heads=0 must be a positive integer"),
        (dict(d_model=32, backend="flash"), "QCAttention: backend='flash' is not one of"),
        (dict(d_model=32, output_gate="yes"), "QCAttention: output_gate='yes' must be True or False"),
    ],
)
def test_bad_configuration_names_the_problem(kwargs, words):
    d_model = kwargs.pop("d_model")
    with pytest.raises(ValueError) as info:
        QCAttention(d_model, **kwargs)
    assert words in str(info.value)
