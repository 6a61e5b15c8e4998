import pytest
import torch
import torch.nn.functional as F

from components import MLP


@pytest.mark.parametrize(
    "activation, formula",
    [
        ("swiglu", lambda x, W, V, W2: (F.silu(x @ W) * (x @ V)) @ W2),
        ("swisig", lambda x, W, V, W2: (F.silu(x @ W) * torch.sigmoid(x @ V)) @ W2),
        ("switanh", lambda x, W, V, W2: (F.silu(x @ W) * torch.tanh(x @ V)) @ W2),
    ],
)
def test_gated_forms_match_their_formula(activation, formula):
    mlp = MLP(16, d_ff=24, activation=activation)
    W, V = mlp.in_proj.weight.T.chunk(2, dim=1)  # [16, 24] each
    x = torch.randn(3, 5, 16)
    torch.testing.assert_close(mlp(x), formula(x, W, V, mlp.out_proj.weight.T))


def test_gelu_form_is_two_matrices():
    mlp = MLP(16, d_ff=40, activation="gelu")
    x = torch.randn(3, 16)
    torch.testing.assert_close(mlp(x), F.gelu(x @ mlp.in_proj.weight.T) @ mlp.out_proj.weight.T)
    assert sum(p.numel() for p in mlp.parameters()) == 2 * 16 * 40


def test_plain_form_is_two_matrices_with_the_chosen_activation():
    mlp = MLP(16, d_ff=40, activation="plain", act="relu")
    x = torch.randn(3, 16)
    torch.testing.assert_close(mlp(x), F.relu(x @ mlp.in_proj.weight.T) @ mlp.out_proj.weight.T)
    assert MLP(16, activation="plain").d_ff == 64


def test_default_widths_give_about_equal_parameters():
    sizes = {a: sum(p.numel() for p in MLP(192, activation=a).parameters()) for a in ("swiglu", "switanh", "gelu")}
    assert max(sizes.values()) / min(sizes.values()) < 1.02
    # the gated forms' 8/3·d rounds up to a multiple of 8 (64 → 170.7 → 176), never down below equal parameters
    assert [MLP(d).d_ff for d in (64, 96, 100)] == [176, 256, 272] and MLP(64, activation="gelu").d_ff == 256


def test_is_position_wise():
    mlp = MLP(8)
    x = torch.randn(2, 6, 8)
    torch.testing.assert_close(mlp(x)[:, 2], mlp(x[:, 2]))


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(activation="relu2"), "activation='relu2' is not one of ('swiglu', 'swisig', 'switanh', 'gelu', 'plain')"),
        (dict(act="tanhh"), "act='tanhh' is not one of"),
        (dict(d_ff=0), "d_ff=0 must be a positive integer"),
    ],
)
def test_bad_configuration_names_the_problem(kwargs, words):
    with pytest.raises(ValueError) as info:
        MLP(16, **kwargs)
    assert words in str(info.value)


def test_a_gated_mlps_fused_input_projection_is_declared_as_its_two_matrices_and_a_summary_names_the_form():
    for activation, blocks in (("swiglu", {"in_proj.weight": (24, 24)}), ("switanh", {"in_proj.weight": (24, 24)}),
                               ("gelu", {}), ("plain", {})):
        assert MLP(16, d_ff=24, activation=activation).fused_row_blocks() == blocks, activation
    assert repr(MLP(16, d_ff=24, activation="swisig", act="relu")) == (
        "MLP(\n  activation=swisig, act=relu, d_ff=24\n  (in_proj): Linear(in_features=16, out_features=48, bias=False)\n"
        "  (out_proj): Linear(in_features=24, out_features=16, bias=False)\n)")
