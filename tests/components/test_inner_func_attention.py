import itertools

import pytest
import torch

from components import Context, HybridLM, InnerFuncAttention
from components.sequence.inner_func_attention import RetrievedValue

SSD_SMALL = {"head_dim": 8, "d_state": 8, "chunk_size": 8}


def make(inner="linear", mask="content", **kw):
    inner = {"ssd": SSD_SMALL} if inner == "ssd" else inner
    mask = {"position": {"max_position": 64}} if mask == "position" else mask
    return InnerFuncAttention(32, n_heads=4, inner=inner, mask=mask, **kw)


def with_nonzero_A(mixer):
    if mixer.mask == "content":
        with torch.no_grad():
            mixer.key_bias.A.copy_(torch.linspace(-2, 2, mixer.n_heads))
    if mixer.mask == "position":
        with torch.no_grad():
            mixer.key_bias.table.normal_()
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
    assert mixer.key_bias.A.grad.abs().min() > 0
    # W_δ's gradient is proportional to A, which starts at 0: exactly zero on the first backward...
    assert mixer.key_bias.delta_proj.weight.grad.abs().max() == 0
    torch.optim.SGD(mixer.parameters(), lr=0.1).step()
    mixer.zero_grad()
    mixer(x).pow(2).sum().backward()
    # ...and non-zero once one step has moved A.
    assert mixer.key_bias.delta_proj.weight.grad.abs().max() > 0


def test_position_mask_table_learns_and_is_used():
    mixer = make("linear", "position")
    x = torch.randn(2, 9, 32)
    mixer(x).pow(2).sum().backward()
    grad = mixer.key_bias.table.grad
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
    with pytest.raises(ValueError, match="position 64 is past the position mask's max_position=64"):  # the first
        mixer.eval()(torch.randn(1, 65, 32), Context(position_ids=torch.arange(65)[None]))
    assert mixer(torch.randn(1, 64, 32), Context(position_ids=torch.arange(64)[None])).shape == (1, 64, 32)  # the last


def test_i_is_bound_by_default():
    model = HybridLM(vocab_size=16, d_model=32, pattern="IM")
    assert type(model.blocks[0].sequence_mixer).__name__ == "InnerFuncAttention"


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(keep_window=0), "keep_window=0 must be an integer >= 1"),
        (dict(inner="mlp"), "inner='mlp' is not one of ('linear', 'retrieval', 'ssd')"),
        (dict(mask="alibi"), "mask='alibi' is not one of ('content', 'content_exp', 'cheems', 'position', 'none')"),
        (dict(inner={"retrieval": {"n_values": 2, "top_k": 3}}), "top_k=3 exceeds n_values=2"),
        (dict(inner={"retrieval": {"n_value": 3}}), "inner='retrieval' with options {'n_value': 3}"),
        (dict(mask={"none": {"max_position": 3}}), "mask='none' takes no options"),
        (dict(inner={"retrieval": {"n_values": 3}, "linear": {}}), "alone or as a one-entry mapping"),
        (dict(inner="components.Nothing"), "module 'components' has no class 'Nothing'"),
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
    delta = v @ mixer.key_bias.delta_proj.weight.T  # [2, 7, H]
    expected = (mixer.key_bias.A * torch.log1p(torch.exp(delta))).transpose(1, 2)  # [2, H, 7]
    got = mixer.key_bias(v, Context.default(x))
    torch.testing.assert_close(got, expected)
    assert (delta < 0).any()  # the softplus is exercised where it differs from the identity


def test_the_cheems_mask_is_the_authors_formula():
    """exp(A_h · softplus((V W_δ)[b, j, h])), one A per query head starting at 1 (the authors' Cheems code)."""
    mixer = InnerFuncAttention(32, n_heads=4, n_kv_heads=2, mask="cheems")
    bias = mixer.key_bias
    assert bias.A.tolist() == [1.0] * 4 and bias.delta_proj.out_features == 4
    with torch.no_grad():
        bias.A.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
    x = torch.randn(2, 7, 32)
    v = mixer.value(x)  # [2, 7, 2·8]
    written = torch.exp(bias.A[None, :, None] * torch.log1p(torch.exp(v @ bias.delta_proj.weight.T)).transpose(1, 2))
    torch.testing.assert_close(bias(v, Context.default(x)), written)


CUSTOM_PARTS = """
import torch
from torch import nn


class HalfValue(nn.Module):
    def __init__(self, d_model, *, kv_width, scale=0.5):
        super().__init__()
        self.width, self.scale = d_model, scale

    def forward(self, x, context):
        return self.scale * x


class WideValue(nn.Module):
    def __init__(self, d_model, *, kv_width, width=12):
        super().__init__()
        self.width = width

    def forward(self, x, context):
        return x[..., :self.width]


class RecencyBias(nn.Module):
    def __init__(self, *, n_heads, value_heads, head_dim, slope=1.0):
        super().__init__()
        self.n_heads, self.slope = n_heads, slope

    def forward(self, v_flat, context):
        return (self.slope * context.position_ids.to(v_flat.dtype))[:, None, :].expand(-1, self.n_heads, -1)
"""


def test_a_new_value_and_mask_are_classes_of_their_own_not_branches(tmp_path, monkeypatch):
    """A part from any package, by its dotted path, with its options: the engine computes with it as written."""
    (tmp_path / "my_parts.py").write_text(CUSTOM_PARTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    for width in (12, 24, 0):  # not whole heads of 8; 3 heads, which do not divide 2; none
        with pytest.raises(ValueError, match=f"InnerFuncAttention: the value's width {width} must be a multiple of "
                                             "head_dim=8 giving a number of heads that divides n_heads=2"):
            InnerFuncAttention(16, n_heads=2, inner={"my_parts.WideValue": {"width": width}})
    mixer = InnerFuncAttention(16, n_heads=2, inner={"my_parts.HalfValue": {"scale": 0.5}},
                               mask={"my_parts.RecencyBias": {"slope": 0.7}}, rope=False)
    x = torch.randn(2, 5, 16)
    q = mixer.q_proj(x).view(2, 5, 2, 8).transpose(1, 2)  # [2, H, 5, 8]
    k = mixer.k_proj(x).view(2, 5, 2, 8).transpose(1, 2)
    v = (0.5 * x).view(2, 5, 2, 8).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / 8**0.5 + 0.7 * torch.arange(5.0)  # the bias per key
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    y = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(2, 5, 16)
    torch.testing.assert_close(mixer(x), mixer.out_proj(y))
    model = HybridLM(16, 16, "IM", {"I": {"class_path": "components.InnerFuncAttention",
                                          "init_args": {"n_heads": 2, "inner": {"my_parts.HalfValue": {}}}}})
    assert type(model.blocks[0].sequence_mixer.value).__name__ == "HalfValue"
    assert model.binding_specs()["I"]["init_args"]["inner"] == {"my_parts.HalfValue": {}}


def test_the_options_that_moved_into_the_parts_are_refused_with_the_form_to_use():
    with pytest.raises(TypeError, match=r"options of the value or mask part now; write inner=\{'retrieval': \{'n_values': 6\}\}"):
        InnerFuncAttention(32, inner="retrieval", n_values=6)


def test_a_model_recorded_before_the_parts_were_injected_loads_and_computes_the_same():
    """Old checkpoints: the letter spec had n_values / top_k / max_position / ssd beside inner and mask, and
    the masks' parameters sat on the attention (A, delta_proj, position_bias)."""
    old_specs = {
        "I": {"class_path": "components.InnerFuncAttention",
              "init_args": {"n_heads": 4, "inner": "retrieval", "n_values": 6, "top_k": 3, "mask": "content", "max_position": 9}},
        "P": {"class_path": "components.InnerFuncAttention",
              "init_args": {"n_heads": 4, "inner": "ssd", "ssd": SSD_SMALL, "mask": "position", "max_position": 40}},
    }
    model = HybridLM(50, 32, "IM PM", old_specs)
    retrieval, position = model.blocks[0].sequence_mixer, model.blocks[1].sequence_mixer
    assert retrieval.value.values.num_embeddings == 6 and retrieval.value.top_k == 3
    assert position.key_bias.table.shape == (4, 40) and position.value.head_dim == 8
    assert model.binding_specs()["I"]["init_args"] == {
        "n_heads": 4, "inner": {"retrieval": {"n_values": 6, "top_k": 3}}, "mask": "content"}  # today's form
    with torch.no_grad():
        retrieval.key_bias.A.normal_()
        position.key_bias.table.normal_()
    old_names = {"key_bias.A": "A", "key_bias.delta_proj.weight": "delta_proj.weight", "key_bias.table": "position_bias"}
    old_state = {}
    for key, value in model.state_dict().items():
        for new, old in old_names.items():
            key = key.replace(f"sequence_mixer.{new}", f"sequence_mixer.{old}")
        old_state[key] = value
    assert "blocks.0.sequence_mixer.A" in old_state and "blocks.1.sequence_mixer.position_bias" in old_state
    again = HybridLM(50, 32, "IM PM", old_specs)
    again.load_state_dict(old_state)  # strict
    ids = torch.randint(0, 50, (2, 11))
    torch.testing.assert_close(again(ids), model(ids))
