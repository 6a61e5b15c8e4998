import itertools

import pytest
import torch

from components import Context, HybridLM, InnerFuncAttention
from components.sequence.inner_func_attention import RetrievedValue

SSD_SMALL = {"head_dim": 8, "d_state": 8, "chunk_size": 8}


def make(inner="linear", mask="content", **kw):
    return InnerFuncAttention(32, n_heads=4, inner=inner, mask=mask, ssd=SSD_SMALL, max_position=64, **kw)


def with_nonzero_A(mixer):
    if mixer.mask == "content":
        with torch.no_grad():
            mixer.A.copy_(torch.linspace(-2, 2, mixer.n_heads))
    if mixer.mask == "position":
        with torch.no_grad():
            mixer.position_bias.normal_()
    return mixer


@pytest.mark.parametrize("inner, mask", list(itertools.product(["linear", "retrieval", "ssd"], ["content", "cheems", "position", "none"])))
def test_causal_in_every_inner_and_mask(assert_causal, inner, mask):
    assert_causal(with_nonzero_A(make(inner, mask)), torch.randn(2, 13, 32), cut_points=(0, 5, None))


@pytest.mark.parametrize("inner", ["linear", "ssd"])
def test_causal_with_a_key_window_and_gqa(assert_causal, inner):
    mixer = with_nonzero_A(make(inner, "content", keep_window=3, n_kv_heads=2))
    assert_causal(mixer, torch.randn(2, 11, 32))


def test_content_mask_starts_as_plain_attention():
    # A = 0 at initialisation, so the bias is zero and the mask changes nothing yet.
    masked, plain = make("linear", "content"), make("linear", "none")
    plain.load_state_dict({k: v for k, v in masked.state_dict().items() if k in plain.state_dict()})
    x = torch.randn(2, 9, 32)
    torch.testing.assert_close(masked(x), plain(x))


def test_content_mask_parameters_learn():
    mixer = make("linear", "content")
    x = torch.randn(2, 9, 32)
    mixer(x).pow(2).sum().backward()
    assert mixer.A.grad.abs().min() > 0
    # W_δ's gradient is proportional to A, which starts at 0: exactly zero on the first backward...
    assert mixer.delta_proj.weight.grad.abs().max() == 0
    torch.optim.SGD(mixer.parameters(), lr=0.1).step()
    mixer.zero_grad()
    mixer(x).pow(2).sum().backward()
    # ...and non-zero once one step has moved A.
    assert mixer.delta_proj.weight.grad.abs().max() > 0


def test_position_mask_table_learns_and_is_used():
    mixer = make("linear", "position")
    x = torch.randn(2, 9, 32)
    mixer(x).pow(2).sum().backward()
    grad = mixer.position_bias.grad
    assert grad[:, 1:9].abs().min() > 0  # every used key position (position 0's weight is 1 for query 0 only)
    assert grad[:, 9:].abs().max() == 0  # positions past the sequence are untouched


def test_retrieval_query_and_keys_learn():
    mixer = make("retrieval", "none")
    mixer(torch.randn(2, 9, 32)).pow(2).sum().backward()
    assert mixer.value.query.weight.grad.abs().max() > 0
    assert mixer.value.keys.grad.abs().max() > 0
    assert mixer.value.values.weight.grad.abs().max() > 0


def test_retrieved_value_matches_its_formula():
    value = RetrievedValue(8, n_values=5, d_retrieval=4, top_k=2)
    x = torch.randn(3, 8)
    g = value.query(x) @ value.keys.T  # [3, 5]
    top, idx = g.topk(2, dim=-1)
    w = torch.softmax(top, -1)
    want = x * (w[:, :1] * value.values.weight[idx[:, 0]] + w[:, 1:] * value.values.weight[idx[:, 1]])
    torch.testing.assert_close(value(x), want)


def test_position_mask_refuses_positions_past_its_table():
    mixer = make("linear", "position")
    ctx = Context(position_ids=torch.arange(70)[None])
    with pytest.raises(ValueError, match="position 69 is past the position mask's max_position=64"):
        mixer.eval()(torch.randn(1, 70, 32), ctx)
    with pytest.raises(RuntimeError, match="positions must lie below the position mask's max_position=64"):
        mixer.train()(torch.randn(1, 70, 32), ctx)


def test_i_is_bound_by_default():
    model = HybridLM(vocab_size=16, d_model=32, pattern="IM")
    assert type(model.blocks[0].sequence_mixer).__name__ == "InnerFuncAttention"


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(keep_window=0), "keep_window=0 must be an integer >= 1"),
        (dict(inner="mlp"), "inner='mlp' is not one of ('linear', 'retrieval', 'ssd')"),
        (dict(mask="alibi"), "mask='alibi' is not one of ('content', 'content_exp', 'cheems', 'position', 'none')"),
        (dict(inner="retrieval", n_values=2, top_k=3), "top_k=3 exceeds n_values=2"),
        (dict(n_heads=5), "d_model=32 is not divisible by n_heads=5"),
    ],
)
def test_bad_configuration_names_the_problem(kwargs, words):
    with pytest.raises(ValueError) as info:
        InnerFuncAttention(32, **kwargs)
    assert words in str(info.value)


def test_content_mask_value_equals_its_formula():
    # bias[b, h, j] = A_h · softplus((V W_δ)[b, j, h]): softplus keeps the mask's sign that of A.
    mixer = with_nonzero_A(make())
    x = torch.randn(2, 7, 32)
    v = mixer.value(x)  # [2, 7, 32]
    delta = v @ mixer.delta_proj.weight.T  # [2, 7, H]
    expected = (mixer.A * torch.log1p(torch.exp(delta))).transpose(1, 2)  # [2, H, 7]
    got = mixer.dynamic_bias(v, Context.default(x))
    torch.testing.assert_close(got, expected)
    assert (delta < 0).any()  # the softplus is exercised where it differs from the identity


def test_the_cheems_mask_is_the_authors_formula():
    """exp(A_h · softplus((V W_δ)[b, j, h])), one A per query head starting at 1 (the authors' Cheems code)."""
    mixer = InnerFuncAttention(32, n_heads=4, n_kv_heads=2, mask="cheems")
    assert mixer.A.tolist() == [1.0] * 4 and mixer.delta_proj.out_features == 4
    with torch.no_grad():
        mixer.A.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
    x = torch.randn(2, 7, 32)
    v = mixer.value(x)  # [2, 7, 2·8]
    written = torch.exp(mixer.A[None, :, None] * torch.log1p(torch.exp(v @ mixer.delta_proj.weight.T)).transpose(1, 2))
    torch.testing.assert_close(mixer.dynamic_bias(v, Context.default(x)), written)
