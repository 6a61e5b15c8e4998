"""Block options against their formulas: Doge's residual scales, OLMo 2's norms after the mixers, a QK-norm over every
head, a mixer that owns its residual (OTCE's Expresser, checked against the authors' layer written out), and RoPE's
per-sequence NTK stretch."""

import math
import re
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from components import MLP, Block, Context, Expresser, HybridLM, PatternError, QCAttention, RotaryEmbedding


def rms(v, weight, eps=1e-6):
    return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + eps) * weight


def test_residual_scales_multiply_each_residual_per_channel():
    torch.manual_seed(0)
    block = Block(8, QCAttention(8, n_heads=2), MLP(8), residual_scale=True)
    with torch.no_grad():
        for p in (block.sequence_residual, block.state_residual, block.sequence_norm.weight, block.state_norm.weight):
            p.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, 8)
    h = block.sequence_residual * x + block.sequence_mixer(rms(x, block.sequence_norm.weight))
    want = block.state_residual * h + block.state_mixer(rms(h, block.state_norm.weight))
    torch.testing.assert_close(block(x), want)
    assert torch.equal(Block(8, QCAttention(8, n_heads=2), None, residual_scale=True).sequence_residual, torch.ones(8))
    mixers = {"A": partial(QCAttention, n_heads=2)}
    model = HybridLM(20, 8, "AM -M", mixers, residual_scale=True)
    assert sum(n.endswith("_residual") for n, _ in model.named_parameters()) == 3
    assert not any(n.endswith("_residual") for n, _ in HybridLM(20, 8, "AM", mixers).named_parameters())


def test_post_norm_puts_each_norm_on_what_its_mixer_adds():
    """OLMo 2's reordered norm: ``h = x + norm(attend(x))``, ``out = h + norm(mlp(h))`` — the mixers read the raw
    stream; with residual scales, ``r ⊙ x + norm(mixer(x))``."""
    torch.manual_seed(0)
    for scaled in (False, True):
        block = Block(8, QCAttention(8, n_heads=2), MLP(8), residual_scale=scaled, post_norm=True)
        with torch.no_grad():
            for norm in (block.sequence_norm, block.state_norm):
                norm.weight.uniform_(0.5, 1.5)
        r = (lambda x, scale: x) if not scaled else (lambda x, scale: scale * x)  # noqa: E731
        x = torch.randn(2, 5, 8)
        h = r(x, block.sequence_residual) + rms(block.sequence_mixer(x), block.sequence_norm.weight)
        want = r(h, block.state_residual) + rms(block.state_mixer(h), block.state_norm.weight)
        torch.testing.assert_close(block(x), want)
    assert Block(8, None, MLP(8), post_norm=True)(x).shape == x.shape  # a state mixer alone


def test_post_norm_names_the_blocks_it_reorders():
    mixers = {"A": partial(QCAttention, n_heads=2)}
    model = HybridLM(20, 8, "SM AM SM", mixers, post_norm=["AM"])
    assert [b.post_norm for b in model.blocks] == [False, True, False]
    assert "1  AM (post-norm)  QCAttention" in model.summary() and "0  SM     " in model.summary()
    assert [b.post_norm for b in HybridLM(20, 8, "SM AM", mixers, post_norm=True).blocks] == [True, True]
    assert not any(b.post_norm for b in HybridLM(20, 8, "SM AM", mixers).blocks)
    with pytest.raises(ValueError, match=r"post_norm names blocks \['GM'\] that pattern 'SM AM' does not have "
                                         r"\(its blocks: SM, AM\)"):
        HybridLM(20, 8, "SM AM", mixers, post_norm=["GM"])
    for wrong in ("AM", 1, ["AM", 2]):
        with pytest.raises(ValueError, match=f"post_norm={re.escape(repr(wrong))} must be True, False or a list of "
                                             "block tokens"):
            HybridLM(20, 8, "SM AM", mixers, post_norm=wrong)
    with pytest.raises(ValueError, match="post_norm names block 'O-', whose letter binds a whole block"):
        HybridLM(20, 16, "AM O-", {"A": partial(QCAttention, n_heads=4),
                                   "O": partial(Expresser, n_heads=4, n_kv_heads=2, d_ff=24)}, post_norm=["O-"])


def test_a_qk_norm_over_all_heads_normalises_each_projection_whole():
    """OLMo 2's QK-norm: one RMSNorm over the query projection's ``H·Dh`` channels (and the keys' ``Hkv·Dh``), a gain
    per channel — not one per head."""
    torch.manual_seed(0)
    attention = QCAttention(16, n_heads=4, n_kv_heads=2, qk_norm=True, qk_norm_over="all_heads", rope=False)
    positions = attention.positions
    assert positions.q_norm.weight.shape == (16,) and positions.k_norm.weight.shape == (8,)
    with torch.no_grad():
        positions.q_norm.weight.uniform_(0.5, 1.5)
        positions.k_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 6, 16)
    q = rms(x @ attention.q_proj.weight.T, positions.q_norm.weight).view(2, 6, 4, 4).transpose(1, 2)  # [B, H, T, Dh]
    k, v = (x @ attention.kv_proj.weight.T).split(8, dim=-1)
    k = rms(k, positions.k_norm.weight).view(2, 6, 2, 4).transpose(1, 2).repeat_interleave(2, dim=1)
    v = v.view(2, 6, 2, 4).transpose(1, 2).repeat_interleave(2, dim=1)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 6, 16)
    torch.testing.assert_close(attention(x), y @ attention.out_proj.weight.T)
    assert "over all heads" in repr(attention)
    with pytest.raises(ValueError, match="qk_norm_over='all_heads' says what a QK-norm spans, and qk_norm is False"):
        QCAttention(16, n_heads=4, qk_norm_over="all_heads")
    with pytest.raises(ValueError, match="qk_norm_over='heads' is not one of head, all_heads"):
        QCAttention(16, n_heads=4, qk_norm=True, qk_norm_over="heads")


def test_expresser_is_the_authors_expression_layer():
    torch.manual_seed(0)
    expresser = Expresser(16, n_heads=4, n_kv_heads=2, d_ff=24)
    with torch.no_grad():
        for norm in (expresser.attention_norm, expresser.mlp_norm, expresser.dense_norm):
            norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 7, 16)
    # CheemsExpressionLayer.forward, step by step.
    original = x
    h = x + expresser.attention(rms(x, expresser.attention_norm.weight))
    gate, up = (rms(h, expresser.mlp_norm.weight) @ expresser.mlp.in_proj.weight.T).chunk(2, dim=-1)
    h = h + (F.silu(gate) * torch.tanh(up)) @ expresser.mlp.out_proj.weight.T
    h = rms(h, expresser.dense_norm.weight) + original
    want = F.silu(h @ expresser.dense.weight.T) @ expresser.projection.weight.T
    torch.testing.assert_close(expresser(x), want)
    # A letter binds it as a whole block: on the raw stream, its output the next stream (no norm, no residual).
    model = HybridLM(20, 16, "AM O-", {"A": partial(QCAttention, n_heads=4),
                                       "O": partial(Expresser, n_heads=4, n_kv_heads=2, d_ff=24)}, residual_scale=True)
    placed = model.blocks[1]
    assert isinstance(placed, Expresser) and placed.token == "O-"
    placed.load_state_dict(expresser.state_dict())
    torch.testing.assert_close(placed(x, Context.default(x)), want)
    assert "Expresser" in model.summary()


def test_a_whole_block_has_no_state_mixer_and_is_no_mixer_of_a_block():
    mixers = {"O": partial(Expresser, n_heads=2)}
    with pytest.raises(PatternError, match="letter 'O' binds a whole block \\(Expresser\\), which has no state mixer: write its token O-"):
        HybridLM(20, 8, "AM OM", {"A": partial(QCAttention, n_heads=2), **mixers})
    with pytest.raises(PatternError, match="column 5: letter 'O'") as info:  # the state letter's column
        HybridLM(20, 8, "AM OM", {"A": partial(QCAttention, n_heads=2), **mixers})
    assert info.value.column == 5
    with pytest.raises(ValueError, match="Expresser is a whole block, not a sequence mixer"):
        Block(8, Expresser(8, n_heads=2), None)


def test_a_model_saved_when_the_expresser_sat_inside_a_block_loads_the_same():
    torch.manual_seed(0)
    mixers = {"A": partial(QCAttention, n_heads=2), "O": partial(Expresser, n_heads=2)}
    model = HybridLM(20, 8, "AM O-", mixers)
    old = {k.replace("blocks.1.", "blocks.1.sequence_mixer."): v for k, v in model.state_dict().items()}
    assert "blocks.1.sequence_mixer.dense.weight" in old
    again = HybridLM(20, 8, "AM O-", mixers)
    again.load_state_dict(old)  # strict
    ids = torch.randint(0, 20, (2, 9))
    torch.testing.assert_close(again(ids), model(ids))


def test_ntk_stretch_is_per_sequence_and_follows_the_dynamic_formula():
    rope = RotaryEmbedding(16, base=10000.0, scaling_factor=4.0)
    short, long = torch.arange(10)[None], torch.arange(40)[None]
    batch = torch.cat([F.pad(short, (0, 30)), long])  # row 0: positions 0..9 then zeros
    cos, _ = rope(batch, 8)
    cos_short, _ = rope(short, 8)
    torch.testing.assert_close(cos[0, :10], cos_short[0])  # the long row does not stretch the short one
    base = 10000.0 * (4.0 * 40 / 16 - 3.0) ** (8 / 6)  # Hugging Face's "dynamic" RoPE at length 40
    angle = 39 * base ** (-2 / 8)
    torch.testing.assert_close(cos[1, 39, 1], torch.tensor(math.cos(angle)), rtol=1e-5, atol=1e-6)


def test_longer_sequences_need_extrapolate():
    mixers = {"A": partial(QCAttention, n_heads=2)}
    with pytest.raises(ValueError, match="exceeds max_seq_len=8; .* extrapolate=True"):
        HybridLM(20, 8, "AM", mixers, max_seq_len=8)(torch.zeros(1, 9, dtype=torch.long))
    assert HybridLM(20, 8, "AM", mixers, max_seq_len=8, extrapolate=True)(torch.zeros(1, 9, dtype=torch.long)).shape == (1, 9, 20)


def test_the_expresser_is_the_authors_layer_by_default_and_a_token_shift_projects_without_a_bias():
    from components import TokenShift

    expresser = Expresser(16, n_heads=4)
    assert expresser.attention.positions.q_norm is None  # no QK-norm
    assert expresser.mlp.activation == "switanh" and expresser.act_name == "silu"
    assert repr(expresser).startswith("Expresser(\n  act=silu\n")
    assert TokenShift(8).out_proj.bias is None


def test_a_block_needs_a_mixer_and_a_state_mixer_that_reads_padding_must_take_it():
    """A state mixer that says ``reads_padding_mask`` is called with ``padding_mask=``: one whose forward cannot take
    it is refused when the block is built, not at the first padded batch."""

    class LoadWithoutMask(torch.nn.Module):
        reads_padding_mask = True

        def forward(self, x):
            return x

    with pytest.raises(ValueError, match=r"state mixer LoadWithoutMask.forward\(x\) cannot be called as a state mixer "
                                         r".*write forward\(self, x, padding_mask=None\)"):
        Block(8, None, LoadWithoutMask(), token="-L")
    LoadWithoutMask.reads_padding_mask = False
    assert Block(8, None, LoadWithoutMask())(torch.randn(1, 2, 8), None).shape == (1, 2, 8)
    with pytest.raises(ValueError, match="Block: needs a sequence mixer, a state mixer, or both"):
        Block(8, None, None)


def test_a_context_refuses_positions_that_are_not_b_by_t_and_documents_with_a_cache():
    from components.cache import InferenceCache

    with pytest.raises(ValueError, match=r"Context: position_ids must be \[B, T\]; got shape \(3,\)"):
        Context(position_ids=torch.arange(3))
    ids = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="Context: document_ids are for packed training batches, not for decoding"):
        Context(position_ids=ids, document_ids=ids, cache=InferenceCache(1, 4))
