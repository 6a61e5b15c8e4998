"""``GatedDeltaNet`` against transformers' ``Qwen3NextGatedDeltaNet`` on copied weights (outputs, the input's and
every weight's gradient, a left-padded batch), with key heads shared by value heads; and its arguments. The
catalogue's contract tests compare the mixer with itself (decoding, documents, padding, causality, compile); this
file is the independent check."""

import pytest
import torch

from components import Context, GatedDeltaNet
from components.cache import InferenceCache

qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def transformers_layer(d_model=32, n_heads=4, n_k_heads=2, head_dim=8, v_head_dim=6, seed=0):
    from transformers import Qwen3NextConfig

    config = Qwen3NextConfig(hidden_size=d_model, linear_num_value_heads=n_heads, linear_num_key_heads=n_k_heads,
                             linear_key_head_dim=head_dim, linear_value_head_dim=v_head_dim, linear_conv_kernel_dim=4,
                             num_hidden_layers=1, layer_types=["linear_attention"], rms_norm_eps=1e-6)
    torch.manual_seed(seed)
    layer = qwen3_next.Qwen3NextGatedDeltaNet(config, layer_idx=0).double()
    with torch.no_grad():  # away from the ones they start at, so a weight read in the wrong place shows
        layer.norm.weight.normal_(1.0, 0.3)
        layer.dt_bias.normal_(0.0, 1.0)
    return layer


def zoo_weights(layer, tensors=None) -> dict[str, torch.Tensor]:
    """The zoo's parameters from transformers' (or the same rearrangement of ``tensors``, their gradients): transformers
    groups ``in_proj_qkvz``'s rows by key head, ``[q | k | v | z]`` for each, and ``in_proj_ba``'s as ``[β | a]`` for
    each; the zoo has one ``[q | k | v | z | β | a]``, each part head after head."""
    t = tensors or dict(layer.named_parameters())
    Hk, r = layer.num_k_heads, layer.num_v_heads // layer.num_k_heads
    K, V = layer.head_k_dim, layer.head_v_dim
    qkvz = t["in_proj_qkvz.weight"].view(Hk, 2 * K + 2 * r * V, -1)  # [Hk, rows of one key head, d]
    q, k, v, z = qkvz.split([K, K, r * V, r * V], dim=1)
    b, a = t["in_proj_ba.weight"].view(Hk, 2 * r, -1).split([r, r], dim=1)
    rows = [part.flatten(0, 1) for part in (q, k, v, z, b, a)]  # each [heads · dim, d], head after head
    return {"in_proj.weight": torch.cat(rows), "conv.weight": t["conv1d.weight"], "A_log": t["A_log"],
            "dt_bias": t["dt_bias"], "norm.weight": t["norm.weight"], "out_proj.weight": t["out_proj.weight"]}


def close(got: torch.Tensor, want: torch.Tensor, msg: str = "") -> None:
    """Within transformers' rounding: its rule computes in fp32 whatever the layer's dtype (the zoo's, in float64 here)."""
    err = float((got - want).norm() / want.norm())
    assert err <= 1e-4, f"{msg}: relative error {err:.2e}"


def same_outputs_and_gradients(layer, ours: GatedDeltaNet, as_zoo) -> None:
    """``ours`` computes ``layer``'s output on a batch of 23 positions, and the gradients of the input and of every weight
    (``as_zoo``: transformers' parameters, or their gradients, in the zoo's names and layout)."""
    x = torch.randn(2, 23, 32, dtype=torch.float64, requires_grad=True)
    want, got = layer(x), ours(x)
    close(got, want, "output")
    target = torch.randn_like(want)
    theirs = dict(zip(["x", *dict(layer.named_parameters())],
                      torch.autograd.grad((want * target).sum(), [x, *layer.parameters()])))
    mine = dict(zip(["x", *dict(ours.named_parameters())],
                    torch.autograd.grad((got * target).sum(), [x, *ours.parameters()])))
    close(mine.pop("x"), theirs.pop("x"), "x")
    for name, grad in as_zoo(theirs).items():
        close(mine[name], grad, name)


def zoo_layer(layer) -> GatedDeltaNet:
    ours = GatedDeltaNet(layer.hidden_size, n_heads=layer.num_v_heads, n_k_heads=layer.num_k_heads,
                         head_dim=layer.head_k_dim, v_head_dim=layer.head_v_dim, chunk_size=5).double()
    ours.load_state_dict(zoo_weights(layer))
    return ours


@pytest.mark.parametrize("shape", [dict(n_heads=4, n_k_heads=2), dict(n_heads=2, n_k_heads=2, v_head_dim=8)],
                         ids=["2 key heads for 4", "a key head each"])
def test_gated_deltanet_matches_qwen3_next_outputs_and_every_gradient(shape):
    layer = transformers_layer(**shape)
    ours = zoo_layer(layer)
    same_outputs_and_gradients(layer, ours, lambda grads: zoo_weights(layer, grads))


@pytest.mark.parametrize("allow_neg_eigval", [False, True])
def test_gated_deltanet_matches_olmo_hybrid_outputs_and_every_gradient(allow_neg_eigval):
    """AI2's OLMo-Hybrid layer (``OlmoHybridGatedDeltaNet``): separate projections, its own gate projection, the output
    norm's eps 1e-5, and ``linear_allow_neg_eigval`` (``beta`` in ``(0, 2)``)."""
    olmo = pytest.importorskip("transformers.models.olmo_hybrid.modeling_olmo_hybrid")
    from transformers import OlmoHybridConfig

    config = OlmoHybridConfig(hidden_size=32, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
                              linear_value_head_dim=6, linear_conv_kernel_dim=4, num_hidden_layers=2,
                              layer_types=["linear_attention", "full_attention"], linear_allow_neg_eigval=allow_neg_eigval)
    torch.manual_seed(0)
    layer = olmo.OlmoHybridGatedDeltaNet(config, layer_idx=0).double()
    with torch.no_grad():
        layer.o_norm.weight.normal_(1.0, 0.3)
        for proj in (layer.a_proj, layer.b_proj):
            proj.weight.mul_(8.0)  # decays and write strengths spread over their range
    ours = GatedDeltaNet(32, n_heads=4, n_k_heads=2, head_dim=8, v_head_dim=6, norm_eps=1e-5, chunk_size=5,
                         allow_neg_eigval=allow_neg_eigval).double()
    names = ["q_proj", "k_proj", "v_proj", "g_proj", "b_proj", "a_proj"]  # the zoo's row order
    weights = lambda t: {"in_proj.weight": torch.cat([t[f"{n}.weight"] for n in names]),  # noqa: E731
                         "conv.weight": t["conv1d.weight"], "A_log": t["A_log"], "dt_bias": t["dt_bias"],
                         "norm.weight": t["o_norm.weight"], "out_proj.weight": t["o_proj.weight"]}
    ours.load_state_dict(weights(dict(layer.named_parameters())))
    same_outputs_and_gradients(layer, ours, weights)


def test_a_left_padded_batch_matches_qwen3_next_with_its_attention_mask():
    layer = transformers_layer()
    ours = zoo_layer(layer)
    x = torch.randn(2, 19, 32, dtype=torch.float64)
    mask = torch.ones(2, 19, dtype=torch.bool)
    mask[0, :6] = False  # the first row left-padded by 6
    want = layer(x, attention_mask=mask.long())
    positions = (mask.cumsum(1) - 1).clamp_min(0)
    got = ours(x, Context(position_ids=positions, padding_mask=~mask))
    close(got[mask], want[mask], "real positions")
    torch.testing.assert_close(got[0, 6:], ours(x[:1, 6:])[0])  # and the padded row is the row alone


def test_decoding_one_token_at_a_time_gives_qwen3_next_full_forward():
    """A prefill of 4 tokens, then steps (the recurrence from the chunked state, the conv from its window): what
    transformers' full forward computes for every position."""
    layer = transformers_layer()
    ours = zoo_layer(layer)
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    want = layer(x)
    cache, outs = InferenceCache(2, 11), []
    for start, stop in [(0, 4), *((t, t + 1) for t in range(4, 11))]:
        cache.begin(stop - start, None)
        context = Context(position_ids=torch.arange(start, stop).expand(2, -1), cache=cache)
        outs.append(ours(x[:, start:stop], context))
        cache.end(stop - start)
    assert cache.state(ours)["state"].shape == (2, 4, 8, 6)  # [B, H, K, V]: a constant size
    close(torch.cat(outs, dim=1), want, "decoded")


def test_a_padded_position_neither_decays_nor_writes_the_state(monkeypatch):
    """Padding anywhere in a row (here in its middle, where the conv still reads the real tokens before it and gives
    a nonzero key): the rule receives ``beta = 0`` and ``g = 0`` there, and the real positions' values unchanged."""
    import components.sequence.gated_deltanet as module

    seen = {}
    rule = module.gated_delta_rule
    monkeypatch.setattr(module, "gated_delta_rule", lambda q, k, v, g, beta, **kw: seen.update(g=g, beta=beta, k=k)
                        or rule(q, k, v, g, beta, **kw))
    torch.manual_seed(0)
    ours = GatedDeltaNet(32, head_dim=8)
    x = torch.randn(1, 9, 32)
    mask = torch.zeros(1, 9, dtype=torch.bool)
    mask[0, 4] = True
    ours(x, Context(position_ids=torch.arange(9)[None], padding_mask=mask))
    assert seen["k"][0, 4].abs().sum() > 0  # the position still has a key ...
    assert (seen["beta"][0, 4] == 0).all() and (seen["g"][0, 4] == 0).all()  # ... and writes nothing, decays nothing
    assert (seen["beta"][0, ~mask[0]] > 0).all() and (seen["g"][0, ~mask[0]] < 0).all()


def test_without_the_gate_the_output_is_the_normed_rule_alone(monkeypatch):
    """``gate=False``: ``out = rms_norm(y) · w W_out`` with the same rule output ``y`` as the gated layer's (the same
    weights less the ``z`` rows), whose output is ``(rms_norm(y) · w ⊙ silu(z)) W_out``."""
    import components.sequence.gated_deltanet as module

    outputs = []
    rule = module.gated_delta_rule
    monkeypatch.setattr(module, "gated_delta_rule", lambda *a, **kw: outputs.append(rule(*a, **kw)) or outputs[-1])
    torch.manual_seed(0)
    gated = GatedDeltaNet(32, head_dim=8).double()
    plain = GatedDeltaNet(32, head_dim=8, gate=False).double()
    with torch.no_grad():
        gated.norm.weight.normal_(1.0, 0.3)
    assert gated.fused_row_blocks()["in_proj.weight"] == (32, 32, 32, 32, 4, 4)
    assert plain.fused_row_blocks()["in_proj.weight"] == (32, 32, 32, 4, 4)
    q, k, v, z, b, a = gated.in_proj.weight.split(gated.fused_row_blocks()["in_proj.weight"])
    plain.load_state_dict({**gated.state_dict(), "in_proj.weight": torch.cat([q, k, v, b, a])})
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    got_gated, got_plain = gated(x), plain(x)
    torch.testing.assert_close(outputs[0], outputs[1])  # the same rule output y [B, T, H, V]
    normed = torch.nn.functional.rms_norm(outputs[0], (8,), gated.norm.weight, 1e-6)
    torch.testing.assert_close(got_plain, plain.out_proj(normed.flatten(2)))
    gate = torch.nn.functional.silu(x @ z.t()).view(2, 9, 4, 8)
    torch.testing.assert_close(got_gated, gated.out_proj((normed * gate).flatten(2)))


@pytest.mark.parametrize("arguments, message", [
    (dict(head_dim=12), r"d_model=32 is not divisible by head_dim=12"),
    (dict(n_heads=4, n_k_heads=3), r"n_heads=4 is not divisible by n_k_heads=3"),
    (dict(head_dim=0), r"head_dim"),
    (dict(v_head_dim=0), r"v_head_dim"),
    (dict(gate="yes"), r"gate"),
    (dict(norm_eps=-1.0), r"norm_eps"),
    (dict(chunk_size=0), r"chunk_size"),
])
def test_bad_arguments_are_named(arguments, message):
    with pytest.raises((ValueError, TypeError), match=message):
        GatedDeltaNet(32, **arguments)
