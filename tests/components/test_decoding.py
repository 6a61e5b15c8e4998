"""Decoding (docs/decoding.md): prefill + one token at a time equals the full forward, for every sequence mixer
and every tiny named architecture, with and without left padding; greedy generation equals the argmax
loop over full forwards; SSD's cache does not grow with the generated length."""

import copy
import itertools
import math
import re
import warnings
import dataclasses
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from components import SSD, Context, Expresser, GatedDeltaNet, HybridLM, InnerFuncAttention, QCAttention
from components.cache import InferenceCache
from components.generation import DecodingUnsupported, restricted_logits
from components.catalogue import SEQUENCE_MIXERS
from zoo_kernels._finite import split_finite

MIXERS = {name: partial(factory, 32) for name, factory in SEQUENCE_MIXERS.items()}  # components/catalogue.py


def randomize(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith(("A", "key_bias.table")):
                p.uniform_(-1.0, 1.0)  # dynamic masks away from their neutral start


def padded(B: int = 3, T: int = 13, pads: tuple = (0, 3, 6)):
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b, n in enumerate(pads):
        mask[b, :n] = True
    return mask, (torch.cumsum(~mask, dim=1) - 1).clamp_min(0)


def relative(got, want, valid=None):
    if valid is not None:
        got, want = got[valid], want[valid]
    return ((got - want).abs().max() / want.abs().max()).item()


def in_pieces(mixer, x, positions, mask, prefill, static=False, sizes=None):
    """The mixer over ``x [B, T, d]`` as decoding runs it: a prefill of ``prefill`` tokens, then one at a time, or
    pieces of ``sizes`` tokens each (``static``: the fixed-shape steps of a compiled decoder, over a capacity beyond
    ``T``)."""
    B, T = x.shape[:2]
    cache = InferenceCache(B, T + 5 * static, static=static)
    outs = []
    edges = list(itertools.accumulate([prefill, *(sizes or [1] * (T - prefill))]))  # where each piece ends
    for start, stop in zip([0, *edges[:-1]], edges):
        piece = None if mask is None else mask[:, start:stop]
        cache.begin(stop - start, piece)
        outs.append(mixer(x[:, start:stop], Context(position_ids=positions[:, start:stop], padding_mask=piece, cache=cache)))
        cache.end(stop - start)
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("name", MIXERS)
@pytest.mark.parametrize("prefill", [1, 5, 8])
@pytest.mark.parametrize("with_padding", [False, True])
def test_prefill_then_steps_equals_the_full_forward(name, prefill, with_padding):
    torch.manual_seed(0)
    mixer = MIXERS[name]()
    randomize(mixer)
    B, T = 3, 13
    mask, positions = padded(B, T) if with_padding else (None, torch.arange(T).expand(B, T))
    x = torch.randn(B, T, 32)
    full = mixer(x, Context(position_ids=positions, padding_mask=mask))
    valid = None if mask is None else ~mask
    assert relative(in_pieces(mixer, x, positions, mask, prefill), full, valid) <= 1e-5


@pytest.mark.parametrize("name", MIXERS)
def test_a_cache_continued_by_several_tokens_at_once_equals_the_full_forward(name):
    """After the prefill, pieces of several tokens (a chunked prefill, a speculative draft checked at once) as well
    as single steps: what the full forward computes. (The prefill is shorter than a window of 5 keys: the chunk after
    it reaches back to ring slots not written yet.)"""
    torch.manual_seed(0)
    mixer = MIXERS[name]()
    randomize(mixer)
    B, T = 2, 13
    positions = torch.arange(T).expand(B, T)
    x = torch.randn(B, T, 32)
    full = mixer(x, Context(position_ids=positions))
    assert relative(in_pieces(mixer, x, positions, None, 2, sizes=[3, 1, 2, 3, 2]), full) <= 1e-5


@pytest.mark.parametrize("name", MIXERS)
@pytest.mark.parametrize("static", [False, True])
def test_a_bfloat16_mixer_decodes_as_closely_as_its_full_forward(name, static):
    """A model cast to bf16 decodes (the SSD's step kept an fp32 state from the prefill beside bf16 projections and
    failed in its read-out), and its steps are no further from the float64 truth than its own bf16 full forward
    is, within a factor of 2 and a hundredth of the truth's scale."""
    torch.manual_seed(0)
    mixer = MIXERS[name]()
    randomize(mixer)
    positions = torch.arange(13).expand(3, 13)
    x = torch.randn(3, 13, 32)
    truth = mixer.double()(x.double(), Context(position_ids=positions)).float()
    mixer, x = mixer.to(torch.bfloat16), x.to(torch.bfloat16)
    full = mixer(x, Context(position_ids=positions)).float()
    steps = in_pieces(mixer, x, positions, None, 5, static=static).float()
    assert steps.dtype == full.dtype and torch.isfinite(steps).all()
    assert relative(steps, truth) <= 2 * relative(full, truth) + 1e-2


@pytest.mark.parametrize("name", MIXERS)
@pytest.mark.parametrize("with_padding", [False, True])
def test_fixed_shape_steps_equal_the_full_forward(name, with_padding):
    """A static cache's step writes at a tensor cursor and attends over the whole capacity, the positions
    after it masked: the same outputs as the growing cache's steps."""
    torch.manual_seed(0)
    mixer = MIXERS[name]()
    randomize(mixer)
    mask, positions = padded(3, 13) if with_padding else (None, torch.arange(13).expand(3, 13))
    x = torch.randn(3, 13, 32)
    full = mixer(x, Context(position_ids=positions, padding_mask=mask))
    valid = None if mask is None else ~mask
    assert relative(in_pieces(mixer, x, positions, mask, 8, static=True), full, valid) <= 1e-5


@pytest.mark.parametrize("name", MIXERS)
@pytest.mark.parametrize("static", [False, True])
def test_a_selected_or_expanded_cache_decodes_each_row_as_its_own_sequence(name, static):
    """``select`` copies each chosen sequence's cache (rows may repeat, in any order) and ``expand`` repeats each
    sequence in a row: multiple-choice scoring computes a prompt once and steps every continuation from the copies.
    Each copied row's steps equal the full forward of its own prompt and continuation (left padding kept)."""
    torch.manual_seed(0)
    mixer = MIXERS[name]()
    randomize(mixer)
    mask, positions = padded(2, 12, (0, 3))  # two prompts of 9 tokens, then 3 continuation tokens per copy
    x = torch.randn(2, 9, 32)
    cache = InferenceCache(2, 12 + 2 * static, static=static)
    cache.begin(9, mask[:, :9])
    mixer(x, Context(position_ids=positions[:, :9], padding_mask=mask[:, :9], cache=cache))
    cache.end(9)
    for rows in ([1, 0, 1], None):
        copied = cache.expand(2) if rows is None else cache.select(torch.tensor(rows))
        rows = rows or [0, 0, 1, 1]
        assert copied.batch == len(rows) and copied.seen == 9 and copied.static == static
        assert torch.equal(copied.padding, cache.padding[rows])
        more = torch.randn(len(rows), 3, 32)  # a different continuation for each copy
        steps = []
        for t in range(3):
            copied.begin(1, None)
            steps.append(mixer(more[:, t:t + 1], Context(position_ids=positions[rows, 9 + t:10 + t], cache=copied)))
            copied.end(1)
        full = mixer(torch.cat([x[rows], more], dim=1), Context(position_ids=positions[rows], padding_mask=mask[rows]))
        assert relative(torch.cat(steps, dim=1), full[:, 9:]) <= 1e-5
    assert cache.seen == 9  # the copies' steps left the original where it was


def test_a_cache_refuses_a_bad_size_copy_count_or_row():
    assert InferenceCache(1, 1).capacity == 1  # one token: a prompt of one, nothing generated
    with pytest.raises(ValueError, match=r"batch=1 and capacity=0 must be >= 1"):
        InferenceCache(1, 0)
    with pytest.raises(ValueError, match=r"batch=0 and capacity=4 must be >= 1"):
        InferenceCache(0, 4)
    cache = InferenceCache(3, 4)
    assert cache.expand(1).batch == 3
    for copies in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError, match=rf"copies={copies!r} must be a positive integer"):
            cache.expand(copies)
    assert cache.select(torch.tensor([0, 2])).batch == 2
    for rows in ([-1], [1, -1], [3], [0, 3], [[0, 1]]):
        with pytest.raises(ValueError, match=r"rows must be a 1-D tensor of indices in \[0, 3\)"):
            cache.select(torch.tensor(rows))


@pytest.mark.parametrize("name", MIXERS)
@pytest.mark.parametrize("prefill", [1, 5, 8])
@pytest.mark.parametrize("steps", ["padded", "plain", "static"])
def test_a_nonfinite_input_reaches_the_same_outputs_when_decoding(name, prefill, steps):
    """A prompt's keys are cleaned as they enter the cache, a step's are stored as they are; the cache remembers
    which heads met a NaN or inf: the outputs from then on must be NaN exactly where the full forward's are,
    before and after the prefill boundary, and padding that holds NaN must reach nothing. With padding, every call
    takes the cleaning path; without it (plain, and the fixed-shape steps of a compiled decoder), each step takes
    the one-token path."""
    torch.manual_seed(0)
    mixer = MIXERS[name]()
    randomize(mixer)
    mask, positions = padded(3, 13) if steps == "padded" else (None, torch.arange(13).expand(3, 13))
    x = torch.randn(3, 13, 32)
    x[0, 6, 3] = float("nan")  # row 0: inside the prefill of 8, after that of 5
    x[1, 10, 0] = float("inf")  # row 1: a decoding step
    x[2, 2, :] = float("nan")  # row 2: padding (6 padded positions), never seen (a one-token call with prefill 1)
    full = mixer(x, Context(position_ids=positions, padding_mask=mask))
    got = in_pieces(mixer, x, positions, mask, prefill, static=steps == "static")
    valid = ~mask if mask is not None else torch.ones(3, 13, dtype=torch.bool)
    assert torch.equal(got.isnan()[valid], full.isnan()[valid])
    assert full.isnan()[0, 6:].any() and full.isnan()[1, 10:].any()  # the case is what it claims
    assert full.isnan()[2, 2:].any() == (mask is None) and not full.isnan()[:, :2].any()
    finite = valid[..., None] & ~full.isnan()
    assert torch.allclose(got[finite], full[finite], atol=1e-5, rtol=1e-4)


ARCHITECTURES = {
    "llama": ("AM×3", {"A": partial(QCAttention, n_heads=4, n_kv_heads=2)}, {}),
    "mamba2": ("S-×3", {"S": partial(SSD, conv=True, rope=False, gate=True, expand=2, head_dim=8, d_state=8, chunk_size=4)}, {"tie_embeddings": True}),
    "jamba": ("SM SR AM SR", {"S": partial(SSD, conv=True, rope=False, expand=2, head_dim=8, d_state=8, chunk_size=4),
                              "A": partial(QCAttention, n_heads=4, rope=False)}, {}),
    "otce": ("SM SX AX SM O-", {"S": partial(SSD, conv=True, rope=True, d_state=8, head_dim=8, chunk_size=4),
                                "A": partial(QCAttention, n_heads=4), "O": partial(Expresser, n_heads=4),
                                "X": {"class_path": "components.ExpansiveMoE", "init_args": {"n_experts": 4, "top_k": 1, "gate": "scalar"}}}, {}),
    "cheems": ("SE SE IE", {"S": partial(SSD, d_state=8, head_dim=8, chunk_size=4),
                            "I": partial(InnerFuncAttention, n_heads=4, inner={"retrieval": {"n_values": 6}}),
                            "E": {"class_path": "components.CDMoE", "init_args": {"n_experts": 48, "n_keys": [6, 8], "top_k": 4, "key_dim": 8}}}, {}),
    "transxssm": ("SM SM AM", {"S": partial(SSD, d_state=8, head_dim=8, chunk_size=4), "A": partial(QCAttention, n_heads=4)}, {}),
    "qwen3": ("AM×3", {"A": partial(QCAttention, n_heads=4, n_kv_heads=2, head_dim=12, qk_norm=True)}, {"tie_embeddings": True}),
    "bamba": ("SM AM SM", {"S": partial(SSD, conv=True, rope=False, gate=True, expand=2, head_dim=8, d_state=8, chunk_size=4),
                           "A": partial(QCAttention, n_heads=4, n_kv_heads=2, rope_fraction=0.5)}, {}),
    "doge": ("IE IM", {"I": partial(InnerFuncAttention, n_heads=4, n_kv_heads=2, mask="content_exp", qk_norm=True, keep_window=6),
                       "E": {"class_path": "components.CDMoE", "init_args": {"n_experts": 64, "n_heads": 1, "top_k": 4, "key_dim": None,
                                                                           "shared_mlp": "swiglu", "cross_domain": "parallel"}}},
             {"residual_scale": True, "tie_embeddings": True}),
    "olmo_hybrid": ("GM GM AM", {"G": partial(GatedDeltaNet, n_heads=4, n_k_heads=2, head_dim=8, chunk_size=5,
                                              allow_neg_eigval=True),
                                 "A": partial(QCAttention, n_heads=4, rope=False, qk_norm=True, qk_norm_over="all_heads")},
                    {"post_norm": ["AM"]}),
}


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_every_named_architecture_decodes_as_its_full_forward(name):
    torch.manual_seed(0)
    pattern, mixers, options = ARCHITECTURES[name]
    model = HybridLM(61, 32, pattern, mixers, **options)
    randomize(model)
    mask, positions = padded()
    ids = torch.randint(1, 61, (3, 13)).masked_fill(mask, 0)
    full = model(ids, position_ids=positions, padding_mask=mask)
    cache = model.new_cache(3, 13)
    outs = [model(ids[:, :6], position_ids=positions[:, :6], padding_mask=mask[:, :6], cache=cache)]
    outs += [model(ids[:, t:t + 1], position_ids=positions[:, t:t + 1], cache=cache) for t in range(6, 13)]
    assert relative(torch.cat(outs, dim=1), full, ~mask) <= 1e-5


def tiny_hybrid():
    torch.manual_seed(0)
    return HybridLM(61, 32, "SM AM IM", {"S": partial(SSD, d_state=8, head_dim=8, chunk_size=4, conv=True, rope=False),
                                         "A": partial(QCAttention, n_heads=4),
                                         "I": partial(InnerFuncAttention, n_heads=4, mask="content_exp")})


def position_masked():
    """A hybrid whose outputs depend on absolute positions (a learned position mask), not only relative ones as
    RoPE's: what shows that decoding numbers each sequence's positions as the full forward does."""
    torch.manual_seed(0)
    return HybridLM(61, 32, "PM SM", {"P": partial(InnerFuncAttention, n_heads=4, mask={"position": {"max_position": 32}}),
                                      "S": partial(SSD, d_state=8, head_dim=8, chunk_size=4)}, max_seq_len=16)


def windowed():
    """Mistral's kind of attention between full attention: two layers that see their last 3 keys."""
    torch.manual_seed(0)
    return HybridLM(61, 32, "WM AM WM", {"W": partial(QCAttention, n_heads=4, n_kv_heads=2, sliding_window=3),
                                         "A": partial(QCAttention, n_heads=4)})


@pytest.mark.parametrize("build", [tiny_hybrid, position_masked, windowed],
                         ids=["hybrid", "absolute positions", "sliding windows"])
def test_greedy_generate_equals_the_argmax_loop_over_full_forwards(build):
    model = build()
    randomize(model)
    with torch.no_grad():  # position masks from U(-4, 4): each position's bias tells in the argmax
        for name, p in model.named_parameters():
            if name.endswith("key_bias.table"):
                p.mul_(4)
    mask, _ = padded(3, 7, (0, 2, 4))
    prompt = torch.randint(1, 61, (3, 7)).masked_fill(mask, 0)
    out = model.generate(prompt, 9, padding_mask=mask)
    assert out.shape == (3, 16) and torch.equal(out[:, :7], prompt)
    ids, pad = prompt, mask
    for _ in range(9):
        positions = (torch.cumsum(~pad, dim=1) - 1).clamp_min(0)
        nxt = model(ids, position_ids=positions, padding_mask=pad)[:, -1].argmax(-1, keepdim=True)
        ids, pad = torch.cat([ids, nxt], 1), torch.cat([pad, torch.zeros(3, 1, dtype=torch.bool)], 1)
    assert torch.equal(out, ids)


@pytest.mark.parametrize("where", ["cpu", "accelerator", "fixed-shape"])
def test_the_bookkeeping_each_decoding_call_takes(monkeypatch, where):
    """Attention's decoding calls take non-finite entries out (``split_finite``) only for a call of several tokens or
    with padding, and flag heads (``_step``) at a one-token step. On a CPU, a finite call in a cache that has met no
    non-finite entry skips both (one sum tells it) until a NaN enters; an accelerator's cache (no sum: it would
    stall the host) and a fixed-shape (compiled) one always keep them. The full forward's outputs every time."""
    import components.context as context_module

    calls, steps = [], []
    monkeypatch.setattr(context_module, "split_finite", lambda x, dims: calls.append(dims) or split_finite(x, dims))
    monkeypatch.setattr(context_module, "_step", lambda *a, step=context_module._step: steps.append(1) or step(*a))
    if where == "accelerator":
        monkeypatch.setattr(Context, "_known_finite", lambda self, *tensors: False)
    torch.manual_seed(0)
    mixer = InnerFuncAttention(32, n_heads=4, mask="content_exp")  # keys, values and a per-key bias
    randomize(mixer)
    x = torch.randn(2, 9, 32)
    positions = torch.arange(9).expand(2, 9)
    static = where == "fixed-shape"
    full = mixer(x, Context(position_ids=positions))
    calls.clear()
    torch.testing.assert_close(in_pieces(mixer, x, positions, None, 4, static=static), full, atol=1e-5, rtol=1e-4)
    kept = where != "cpu"
    assert (calls, len(steps)) == (([1, 1, 0], 5) if kept else ([], 0))  # keys, values, bias at the prefill of 4
    calls.clear(), steps.clear()
    x[1, 6, 0] = float("nan")  # a step's input: the NaN reaching what it reaches
    got, full = in_pieces(mixer, x, positions, None, 4, static=static), mixer(x, Context(position_ids=positions))
    assert (calls, len(steps)) == (([1, 1, 0], 5) if kept else ([], 3))  # on a CPU, flags from the NaN's step on
    assert torch.equal(got.isnan(), full.isnan()) and full.isnan()[1, 6:].all()
    assert not got.isnan()[0].any() and torch.allclose(got[0], full[0], atol=1e-5, rtol=1e-4)


def test_finite_entries_whose_sum_overflows_take_the_flagging_path():
    cache = InferenceCache(1, 4)
    context = Context(position_ids=torch.zeros(1, 1, dtype=torch.long), cache=cache)
    big = torch.full((1, 1, 2, 4), 3e38)
    assert not context._known_finite(big, None) and context._known_finite(big / 1e30, None)
    assert not context._known_finite(torch.tensor([1.0, float("inf"), -float("inf")]), None)
    assert not Context(position_ids=torch.zeros(1, 1, dtype=torch.long), cache=InferenceCache(1, 4, static=True))._known_finite(big / 1e30)


def test_a_padded_one_token_call_cleans_its_entries():
    """A one-token call with padding takes the cleaning path: a padded key that holds NaN is never attended to, so it
    must leave no flag behind (the mixers zero their padded inputs first; a caller of ``Context.attend`` may not)."""
    from zoo_kernels.attention import attention

    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 2, 1, 4).unbind(0)  # each [B 2, T 2, H 1, Dh 4]
    k[1, 0, 0, 1] = float("nan")  # row 1's first token: padding
    pad = torch.tensor([[False, False], [True, False]])
    owner, cache, outs = torch.nn.Module(), InferenceCache(2, 2), []
    for t, mask in enumerate([pad[:, :1], None]):  # a padded first token, then a step as generate makes it
        cache.begin(1, mask)
        context = Context(position_ids=torch.zeros(2, 1, dtype=torch.long), padding_mask=mask, cache=cache)
        outs.append(context.attend(owner, q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1]))
        cache.end(1)
    got, full = torch.cat(outs, dim=1), attention(q, k, v, causal=True, key_padding_mask=pad)
    assert not full[1, 1].isnan().any() and torch.allclose(got[~pad], full[~pad], atol=1e-6)


@pytest.mark.parametrize("at", [1, 3], ids=["in the prompt", "at a step"])
def test_a_nonfinite_key_reaches_only_its_own_heads_when_decoding(at):
    """A NaN in one key head's key (2 key heads, 4 query heads) reaches the outputs of that head's 2 query heads from
    its position on, as in the full forward, and no other head's: the mixers' projections spread a NaN input over
    every head, so only a direct call of ``Context.attend`` can tell a flag put on the wrong head."""
    from zoo_kernels.attention import attention

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 6, 4, 4), torch.randn(1, 6, 2, 4), torch.randn(1, 6, 2, 4)  # [B, T, heads, Dh]
    k[0, at, 1, 2] = float("nan")
    owner, cache, outs = torch.nn.Module(), InferenceCache(1, 6), []
    for start, stop in [(0, 2), (2, 3), (3, 4), (4, 5), (5, 6)]:  # a prompt of 2, then steps
        cache.begin(stop - start, None)
        context = Context(position_ids=torch.zeros(1, stop - start, dtype=torch.long), cache=cache)
        outs.append(context.attend(owner, q[:, start:stop], k[:, start:stop], v[:, start:stop]))
        cache.end(stop - start)
    got, full = torch.cat(outs, dim=1), attention(q, k, v, causal=True)
    assert full.isnan()[0, at:, 2:].all() and not full.isnan()[0, :, :2].any() and not full.isnan()[0, :at].any()
    assert torch.equal(got.isnan(), full.isnan())
    finite = ~full.isnan()
    assert torch.allclose(got[finite], full[finite], atol=1e-6)


def test_attention_keeps_its_cache_head_major():
    """Keys and values are kept ``[B, heads, capacity, Dh]``, each head's rows contiguous as attention reads them: a
    CPU step's SDPA over time-major entries took 10% longer (the eager Llama step 6-9%, docs/decoding.md)."""
    torch.manual_seed(0)
    mixer = QCAttention(32, n_heads=4, n_kv_heads=2)
    cache = InferenceCache(3, 10)
    x, positions = torch.randn(3, 6, 32), torch.arange(6).expand(3, 6)
    for start, stop in [(0, 5), (5, 6)]:
        cache.begin(stop - start, None)
        mixer(x[:, start:stop], Context(position_ids=positions[:, start:stop], cache=cache))
        cache.end(stop - start)
    k, v = cache.state(mixer)["k"], cache.state(mixer)["v"]
    assert k.shape == v.shape == (3, 2, 10, 8) and k.is_contiguous() and v.is_contiguous()
    assert k[:, :, 6:].eq(0).all() and not k[:, :, :6].eq(0).all(-1).any()  # six tokens in, the rest untouched


def step_flags(k, v, bias=None, earlier=None):
    """``Context``'s one-token flags for ``q [B, 1, H, 4]`` (H from the bias or the values): ``[B, 1, H]``."""
    from components.context import _step

    H = bias.shape[1] if bias is not None else v.shape[2]
    q = torch.zeros(k.shape[0], 1, H, 4, dtype=k.dtype, device=k.device)
    return _step({} if earlier is None else {"nonfinite": earlier}, q, k, v, bias)[3].cpu()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_steps_flag_is_nan_exactly_at_the_heads_a_nonfinite_entry_reaches(device, dtype):
    """Keys of 1 head repeated to 2 value heads, each repeated to 2 query heads; finite entries whose sum
    overflows (3e38 · 4) are not flagged, and each of NaN, inf and -inf is, in the key, the value or the bias
    (on a GPU too: the flag is ``0 · x`` summed, which a kernel that skipped zero factors would get wrong)."""
    new = partial(torch.full, dtype=dtype, device=device)
    big, v, zero_bias = new((1, 1, 1, 4), 3e38), new((1, 1, 2, 4), -3e38), new((1, 4, 1), 0.0)
    assert torch.equal(step_flags(big, v), torch.zeros(1, 1, 2, dtype=dtype))
    assert torch.equal(step_flags(big, v, new((1, 4, 1), 3e38)), torch.zeros(1, 1, 4, dtype=dtype))
    for bad in (float("nan"), float("inf"), -float("inf")):
        k = big.clone()
        k[0, 0, 0, 2] = bad
        assert step_flags(k, v).isnan().tolist() == [[[True, True]]]  # the one key head reaches both value heads
        w = v.clone()
        w[0, 0, 1, 3] = bad
        assert step_flags(big, w, zero_bias).isnan().tolist() == [[[False, False, True, True]]]
        bias = zero_bias.clone()
        bias[0, 2] = bad
        assert step_flags(big, v, bias).isnan().tolist() == [[[False, False, True, False]]]
    earlier = new((1, 4), 0.0)
    earlier[0, 1] = float("nan")  # a head that met one in an earlier call stays NaN
    assert step_flags(big, v, zero_bias, earlier).isnan().tolist() == [[[False, True, False, False]]]


def test_a_generation_past_max_seq_len_is_refused_before_any_work():
    """The steps skip the model's input checks, so ``generate`` checks every position up front: the prompt and the
    new tokens but the last (never fed back) must fit ``max_seq_len`` unless the model extrapolates."""
    torch.manual_seed(0)
    mixers = {"A": partial(QCAttention, n_heads=2)}
    model = HybridLM(20, 8, "AM", mixers, max_seq_len=12)
    prompt = torch.randint(0, 20, (1, 5))
    assert model.generate(prompt, 8).shape == (1, 13)  # 12 positions fed
    for compile in (False, True):
        with pytest.raises(ValueError, match=r"5 tokens and 9 new ones .* 13 positions, past max_seq_len=12; generate "
                                             r"fewer tokens"):
            model.generate(prompt, 9, compile=compile)
    with pytest.raises(ValueError, match=r"a prompt of 13 tokens .* past max_seq_len=12; shorten the prompt"):
        model.generate(torch.randint(0, 20, (1, 13)), 1)  # (fewer new tokens cannot help)
    assert HybridLM(20, 8, "AM", mixers, max_seq_len=12, extrapolate=True).generate(prompt, 9).shape == (1, 14)


def test_compiled_generate_gives_the_eager_tokens():
    """``generate(compile=True)``: each step through torch.compile from a fixed-shape cache, the prompts
    left-padded; the tokens must be the eager ones, and a second call must reuse the compiled step."""
    from components.generation import compiled_step

    model = tiny_hybrid()
    randomize(model)
    mask, _ = padded(3, 7, (0, 2, 4))
    prompt = torch.randint(1, 61, (3, 7)).masked_fill(mask, 0)
    eager = model.generate(prompt, 12, padding_mask=mask)
    assert torch.equal(model.generate(prompt, 12, padding_mask=mask, compile=True), eager)
    step = compiled_step(model)
    assert torch.equal(model.generate(prompt[:, :6], 5, padding_mask=mask[:, :6], compile=True),
                       model.generate(prompt[:, :6], 5, padding_mask=mask[:, :6]))
    # a one-token prompt: its call is itself a fixed-shape step (it failed: its keys were cut to the one token
    # while its padding covered the whole capacity)
    assert torch.equal(model.generate(prompt[:, -1:], 4, compile=True), model.generate(prompt[:, -1:], 4))
    assert compiled_step(model) is step


def test_a_sliding_windows_cache_keeps_w_entries_in_place_and_compiled_gives_the_eager_tokens():
    """A windowed layer's cache is its ring of ``w`` keys and values per row, ``[B, H_kv, w, Dh]`` whatever the
    capacity (a full attention layer's grows with it), written in place: a fixed-shape (static) cache's steps keep
    every address from the prompt on and decode as the full forward, and a compiled generation of 20 tokens past
    a window of 3, from left-padded prompts, is one graph with the eager tokens."""
    from torch._dynamo.utils import counters

    model = windowed()
    randomize(model)
    mask, positions = padded(3, 13, (0, 2, 4))
    ids = torch.randint(1, 61, (3, 13)).masked_fill(mask, 0)
    full = model(ids, position_ids=positions, padding_mask=mask)
    cache = model.new_cache(3, 64, static=True)
    outs = [model(ids[:, :5], position_ids=positions[:, :5], padding_mask=mask[:, :5], cache=cache)]
    window, dense = (cache.state(model.blocks[i].sequence_mixer) for i in (0, 1))
    assert tuple(window["k"].shape) == tuple(window["v"].shape) == (3, 2, 3, 8)
    assert tuple(dense["k"].shape) == (3, 4, 64, 8)
    addresses = {name: t.data_ptr() for name, t in window.items()}
    outs += [model(ids[:, t:t + 1], position_ids=positions[:, t:t + 1], cache=cache) for t in range(5, 13)]
    assert relative(torch.cat(outs, dim=1), full, ~mask) <= 1e-5
    assert {name: t.data_ptr() for name, t in window.items()} == addresses
    prompt = ids[:, :7]
    counters.clear()
    compiled = model.generate(prompt, 20, padding_mask=mask[:, :7], compile=True)
    assert counters["stats"]["unique_graphs"] == 1
    assert torch.equal(compiled, model.generate(prompt, 20, padding_mask=mask[:, :7]))


def test_a_compiled_generation_compiles_its_step_once_and_writes_the_cache_in_place(monkeypatch):
    """Every cache entry keeps its strides from the prompt to the steps (the SSD's conv window, the token shift's
    last input), so one compilation serves every step: the steps after the second skip torch.compile's Python
    guards, and a second compilation would mean a cache entry that changes under them. And every entry keeps its
    memory (the SSD's state and conv window, the token shift's last input, attention's keys, values and non-finite
    heads): a CUDA graph of the step replays on the addresses it was recorded with. No entry is a view into a
    larger tensor (the prompt's whole conv input or hidden states, kept alive for the whole generation)."""
    from torch._dynamo.utils import counters

    from components.cache import InferenceCache
    from components.sequence.token_shift import TokenShift

    torch.manual_seed(0)
    model = HybridLM(61, 32, "SM TM AM", {"S": partial(SSD, d_state=8, head_dim=8, chunk_size=4, conv=True),
                                          "T": TokenShift, "A": partial(QCAttention, n_heads=4)})
    randomize(model)
    prompt = torch.randint(0, 61, (2, 9))
    addresses = []  # after the prompt and after each step: every entry's address
    end = InferenceCache.end
    monkeypatch.setattr(InferenceCache, "end", lambda cache, T: (end(cache, T), addresses.append(
        {(id(owner), name): t.data_ptr() for owner, state in cache.layers.items() for name, t in state.items()}),
        held.append(max(t.untyped_storage().nbytes() - t.nbytes for t in cache.tensors()))))
    held = []  # after the prompt and after each step: the most memory an entry keeps beyond its own
    stances, set_stance = [], torch.compiler.set_stance
    monkeypatch.setattr(torch.compiler, "set_stance", lambda **kw: stances.append(kw) or set_stance(**kw))
    counters.clear()
    out = model.generate(prompt, 6, compile=True)
    assert counters["stats"]["unique_graphs"] == 1
    assert stances == [{"skip_guard_eval_unsafe": True}] * 3  # steps 3-5; the first two check their guards in full
    assert len(addresses) == 6 and len(addresses[0]) == 2 + 1 + 3  # SSD state, conv; token shift; k, v, nonfinite
    assert all(after == addresses[0] for after in addresses[1:])
    assert held == [0] * 6
    assert torch.equal(out, model.generate(prompt, 6))


@pytest.mark.parametrize("name", ["otce", "doge", "mamba2"])
def test_a_named_architecture_generates_the_eager_tokens_compiled_with_one_graph(name):
    """What the tiny hybrid does not have — OTCE's Expresser and expansive MoE, Doge's InnerFuncAttention with
    GQA, QK-norm, a mask bias in the cache and a key window, and CDMoE, Mamba-2's gated grouped norm — under the
    compiled step that skips the Python guards: the eager tokens, one compilation. (Every named architecture passed
    this once, 15-41 s each; these three are kept. Mamba-2's norm called ``Tensor.unflatten``, a Python method
    torch.compile could not trace while the step's :class:`LinearAsRowSums` mode was active: the step broke in two,
    and each new generation's cache compiled the second part again.)"""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    pattern, mixers, options = ARCHITECTURES[name]
    model = HybridLM(61, 32, pattern, mixers, **options)
    randomize(model)
    mask, _ = padded(3, 7, (0, 2, 4))
    prompt = torch.randint(1, 61, (3, 7)).masked_fill(mask, 0)
    counters.clear()
    compiled = model.generate(prompt, 9, padding_mask=mask, compile=True)
    assert counters["stats"]["unique_graphs"] == 1
    assert torch.equal(compiled, model.generate(prompt, 9, padding_mask=mask))


def test_the_rotary_tables_of_all_steps_at_once_equal_each_steps_own():
    """A compiled generation makes every step's rotary tables in one call; past ``max_seq_len`` the base is
    stretched by each sequence's own length, which grows by one a step — made at once, each step keeps its own."""
    from components.generation import rotary_dims, rotary_tables, step_rotary_tables

    model = tiny_hybrid()
    dims = rotary_dims(model)
    later = torch.tensor([[5000], [7]]) + torch.arange(4)  # [2, 4]: row 0 past max_seq_len 2048, a stretched base
    tables = step_rotary_tables(model, later, dims)
    steps = [rotary_tables(model, later[:, i:i + 1], dims) for i in range(4)]
    assert dims and set(tables) == set(dims)
    for dim, (cos, sin) in tables.items():
        assert torch.equal(cos, torch.cat([s[dim][0] for s in steps], dim=1))
        assert torch.equal(sin, torch.cat([s[dim][1] for s in steps], dim=1))


def test_mamba2_decoding_stays_on_its_full_forward_over_a_long_generation():
    """Hugging Face's Mamba-2 greedy decoding departs from its own full forward after ~54 tokens (a width-256,
    8-layer model); ours must not: 80 greedy tokens equal the argmax loop over full forwards."""
    torch.manual_seed(0)
    model = HybridLM(61, 32, "S-×3", {"S": partial(SSD, conv=True, rope=False, gate=True, expand=2, head_dim=8, d_state=8,
                                                    chunk_size=16)}, tie_embeddings=True)
    randomize(model)
    prompt = torch.randint(0, 61, (2, 21))
    out = model.generate(prompt, 80)
    ids = prompt
    for _ in range(80):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ids)


def test_ssd_cache_does_not_grow_with_the_generated_length():
    model = HybridLM(61, 32, "S-×2", {"S": partial(SSD, d_state=8, head_dim=8, chunk_size=4, conv=True, rope=False)})
    ssd = model.blocks[0].sequence_mixer
    sizes = {}
    for steps in (3, 40):
        cache = model.new_cache(1, 5 + steps)
        model(torch.randint(0, 61, (1, 5)), cache=cache)
        for t in range(steps):
            model(torch.randint(0, 61, (1, 1)), cache=cache)
        sizes[steps] = {k: tuple(v.shape) for k, v in cache.state(ssd).items()}
    assert sizes[3] == sizes[40] == {"conv": (1, 3, ssd.d_xbc), "state": (1, ssd.n_heads, ssd.head_dim, ssd.d_state)}
    # what the decoding benchmark reports: the padding flags, the row's real count (int64) and, per SSD layer, its
    # window and state (fp32)
    per_layer = 4 * (3 * ssd.d_xbc + ssd.n_heads * ssd.head_dim * ssd.d_state)
    assert cache.nbytes() == cache.capacity + 8 + 2 * per_layer


def test_stop_token_ends_each_sequence_and_fills_the_rest():
    model = tiny_hybrid()
    prompt = torch.randint(1, 61, (2, 4))
    greedy = model.generate(prompt, 6)
    stop = int(greedy[0, 5])  # the second token sequence 0 produces
    out = model.generate(prompt, 6, stop_token=stop)
    row = out[0, 4:].tolist()
    first = row.index(stop)
    assert first <= 1 and all(t == stop for t in row[first:])
    assert torch.equal(out[0, :4 + first + 1], greedy[0, :4 + first + 1])
    # Every row as its own: the greedy tokens up to its own first stop (none: all six), then the stop token — a row
    # is not ended by another's stop, nor by a token that is not the stop.
    for r in range(2):
        new = greedy[r, 4:].tolist()
        end = new.index(stop) + 1 if stop in new else len(new)
        assert out[r, 4:].tolist() == new[:end] + [stop] * (len(new) - end), r
    assert stop not in greedy[1, 4:6].tolist()  # (row 1 still runs when row 0 has stopped: what the loop checks)


def test_stop_when_ends_generation_at_the_step_it_holds_for_every_sequence_with_the_same_tokens():
    model = tiny_hybrid()
    prompt = torch.randint(1, 61, (3, 5))
    greedy = model.generate(prompt, 12)
    calls = []

    def stop(new):  # sequence r has ended once it has made 2 + 2r tokens
        calls.append(new.shape[1])
        return torch.tensor([new.shape[1] >= 2 + 2 * r for r in range(3)])

    out = model.generate(prompt, 12, stop_when=stop)
    assert out.shape == (3, 5 + 6) and torch.equal(out, greedy[:, :11]) and calls == [1, 2, 3, 4, 5, 6]
    sampled = model.generate(prompt, 12, temperature=1.0, generator=torch.Generator().manual_seed(1))
    early = model.generate(prompt, 12, temperature=1.0, generator=torch.Generator().manual_seed(1),
                           stop_when=lambda new: (new == sampled[:, 5 + 3, None]).any(1))
    assert torch.equal(early, sampled[:, :early.shape[1]]) and early.shape[1] <= 5 + 4
    assert torch.equal(model.generate(prompt, 12, stop_when=lambda new: torch.zeros(3, dtype=torch.bool)), greedy)
    with pytest.raises(ValueError, match=r"stop_when must return a bool tensor \[B\] = \[3\], one entry per sequence; "
                                         r"got torch.int64 \(3,\)"):
        model.generate(prompt, 12, stop_when=lambda new: torch.ones(3, dtype=torch.long))


def test_sampling_options():
    model = tiny_hybrid()
    prompt = torch.randint(1, 61, (2, 4))
    greedy = model.generate(prompt, 5)
    assert torch.equal(model.generate(prompt, 5, temperature=1.0, top_k=1), greedy)  # top-1 is the argmax
    assert torch.equal(model.generate(prompt, 5, temperature=0.7, top_p=1e-6), greedy)  # the nucleus of one token
    draw = lambda seed: model.generate(prompt, 8, temperature=1.5, generator=torch.Generator().manual_seed(seed))  # noqa: E731
    assert torch.equal(draw(3), draw(3)) and not torch.equal(draw(3), draw(4))
    with pytest.raises(ValueError, match="top_p=1.5 must lie in"):
        model.generate(prompt, 2, temperature=1.0, top_p=1.5)
    with pytest.raises(ValueError, match="top_k=5, top_p=0.9 restricts a sampled draw, and temperature=0 is greedy"):
        model.generate(prompt, 2, top_k=5, top_p=0.9)  # (the greedy tokens came back, as if sampled)
    with pytest.raises(ValueError, match="prompts must be left-padded"):
        model.generate(prompt, 2, padding_mask=torch.tensor([[False, False, False, True]] * 2))
    # what would fail inside torch (a 1-D prompt) or name a tensor the user never gave (the positions made from a
    # mask of the wrong shape), named as given
    with pytest.raises(ValueError, match=r"input_ids must be a \[B, T\] tensor of token ids \(one prompt: ids\[None\]\); "
                                         r"got \(4,\)"):
        model.generate(prompt[0], 2)
    with pytest.raises(ValueError, match=r"padding_mask must be a bool tensor of input_ids' shape \(2, 4\) \(True = "
                                         r"padding\); got torch.bool \(2, 3\)"):
        model.generate(prompt, 2, padding_mask=torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"padding_mask must be a bool tensor .*; got torch.float32 \(2, 4\)"):
        model.generate(prompt, 2, padding_mask=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="exceed its capacity=3"):
        model(torch.zeros(1, 4, dtype=torch.long), cache=model.new_cache(1, 3))
    for batch, capacity in ((0, 4), (2, 0)):
        with pytest.raises(ValueError, match=rf"batch={batch} and capacity={capacity} must be >= 1"):
            model.new_cache(batch, capacity)
    cache = model.new_cache(2, 300)
    model(prompt, cache=cache)
    assert repr(cache) == f"InferenceCache(batch=2, capacity=300, seen=4, layers={len(cache.layers)}, static=False, device=cpu)"


def test_a_cache_another_model_filled_is_refused_even_with_the_same_weights():
    """A cache's states are keyed by the mixers that wrote them: another model (a reload of the same weights, say)
    found none of its own, and decoded the next token as if nothing came before it, at position 6."""
    model, reloaded = tiny_hybrid(), tiny_hybrid()
    reloaded.load_state_dict(model.state_dict())
    ids = torch.randint(1, 61, (2, 7))
    cache = model.new_cache(2, 7)
    model(ids[:, :6], cache=cache)
    with pytest.raises(ValueError, match=r"the cache holds the decoding state of another model's mixers; make this "
                                         r"model's own with model.new_cache\(batch, capacity\)"):
        reloaded(ids[:, 6:], cache=cache)
    assert cache.seen == 6  # (refused before it took the token)
    assert relative(model(ids[:, 6:], cache=cache)[:, 0], reloaded(ids)[:, 6]) < 1e-5  # its own model goes on
    assert reloaded(ids[:, :1], cache=reloaded.new_cache(2, 3)).shape == (2, 1, 61)


def test_positions_continue_after_the_cached_tokens_by_default():
    model = tiny_hybrid()
    ids = torch.randint(1, 61, (2, 9))
    full = model(ids)
    cache = model.new_cache(2, 9)
    model(ids[:, :6], cache=cache)  # no position_ids given: 0..5, then 6, 7, 8
    steps = torch.cat([model(ids[:, t:t + 1], cache=cache) for t in range(6, 9)], dim=1)
    assert relative(steps, full[:, 6:]) < 1e-5


@pytest.mark.parametrize("options, message", [
    (dict(max_new_tokens=-1), "max_new_tokens=-1 must be an integer >= 0"),
    (dict(max_new_tokens=2.0), "max_new_tokens=2.0 must be an integer >= 0"),
    (dict(temperature=-0.5), "temperature=-0.5 must be a finite number >= 0"),
    (dict(temperature=float("inf")), "temperature=inf must be a finite number >= 0"),
    (dict(temperature=1.0, top_k=0), "top_k=0 must be a positive integer or None"),
    (dict(temperature=1.0, top_k=2.0), "top_k=2.0 must be a positive integer or None"),
    (dict(temperature=1.0, top_p=0.0), "top_p=0.0 must lie in (0, 1] or be None"),
    (dict(top_k=5), "top_k=5 restricts a sampled draw, and temperature=0 is greedy"),  # each alone: it would be ignored
    (dict(top_p=0.9), "top_p=0.9 restricts a sampled draw, and temperature=0 is greedy"),
])
def test_a_sampling_setting_out_of_its_range_is_named(options, message):
    model = tiny_hybrid()
    prompt = torch.randint(1, 61, (2, 4))
    with pytest.raises(ValueError, match=re.escape(f"generate: {message}")):
        model.generate(prompt, **{"max_new_tokens": 3, **options})


def test_a_stop_an_empty_prompt_or_a_right_padded_row_is_named_and_generation_is_eager_by_default():
    from components import generation

    model = tiny_hybrid()  # vocabulary 61
    prompt = torch.randint(1, 61, (2, 4))
    for stop in (-1, 61, 2.0):
        with pytest.raises(ValueError, match=re.escape(f"generate: stop_token={stop!r} is not a token of the vocabulary "
                                                       "[0, 61)")):
            model.generate(prompt, 3, stop_token=stop)
    assert model.generate(prompt, 3, stop_token=0).shape == (2, 7)  # the first id and the last are tokens
    assert model.generate(prompt, 3, stop_token=60).shape == (2, 7)
    with pytest.raises(ValueError, match=r"generate: stop_when must be a function of the new tokens \[B, n\] -> bool "
                                         r"\[B\]; got 'eos'"):
        model.generate(prompt, 3, stop_when="eos")
    with pytest.raises(ValueError, match="generate: the prompt is empty; give at least one token per sequence"):
        model.generate(prompt[:, :0], 3)
    with pytest.raises(ValueError, match=r"generate: no prompts \(input_ids is a batch of 0\); give at least one"):
        model.generate(prompt[:0], 3)
    with pytest.raises(ValueError, match="prompts must be left-padded"):  # one row of two padded on the right
        model.generate(prompt, 2, padding_mask=torch.tensor([[False, False, False, True], [False] * 4]))
    assert model not in generation._compiled_steps  # (compile is asked for, never the default)


def test_the_generate_function_takes_the_models_method_defaults():
    """``HybridLM.generate`` documents the options; ``components.generation.generate`` (what it calls, and what a
    caller holding a bare model calls) must not default otherwise — an eager default turned compiled, say."""
    import inspect

    from components import generation

    method = list(inspect.signature(HybridLM.generate).parameters.values())[1:]  # without self
    function = list(inspect.signature(generation.generate).parameters.values())[1:]  # without model
    assert [(p.name, p.default, p.kind) for p in function] == [(p.name, p.default, p.kind) for p in method]


def test_generation_stops_computing_once_every_sequence_has_its_stop_token():
    model = tiny_hybrid()
    prompt = torch.randint(1, 61, (2, 4))
    greedy = model.generate(prompt, 8)
    heads = []
    model.lm_head.register_forward_hook(lambda *args: heads.append(1))
    # each prompt alone, its third new token as the stop: it stops by the third step, so the prompt and at most two
    # steps run, not seven
    for r in range(2):
        stop = int(greedy[r, 6])
        heads.clear()
        out = model.generate(prompt[r:r + 1], 8, stop_token=stop)[0, 4:].tolist()
        end = out.index(stop)
        assert end <= 2 and out == greedy[r, 4:4 + end + 1].tolist() + [stop] * (7 - end)
        assert len(heads) == 1 + end, (r, end)


def test_a_decoding_step_reads_the_rotary_tables_it_is_given():
    """They are made outside a compiled step (``rotary_tables``): the step must take them, not make its own."""
    from components.generation import decode_step, rotary_dims, rotary_tables

    model = tiny_hybrid()
    model.eval()
    prompt = torch.randint(1, 61, (2, 4))
    logits = {}
    for name in ("own", "given", "doctored"):
        cache = model.new_cache(2, 5)
        model(prompt, cache=cache)
        position = torch.full((2, 1), 4)
        tables = rotary_tables(model, position, rotary_dims(model))
        if name == "doctored":
            tables = {dim: (cos, -sin) for dim, (cos, sin) in tables.items()}  # the rotation the other way
        cache.begin(1, None)
        logits[name] = decode_step(model, prompt[:, -1:], position, cache, None if name == "own" else tables)
        cache.end(1)
    assert rotary_dims(model) == [8]  # QCAttention's and IFA's heads; the SSD here has no RoPE
    torch.testing.assert_close(logits["given"], logits["own"])
    assert not torch.allclose(logits["doctored"], logits["own"], atol=1e-3)


def test_every_rotary_table_a_decoding_step_reads_is_made_before_it():
    """The decoder makes each step's tables outside the (compiled) step, for every dimension a module reads — the SSD's
    RoPE on B and C (TransXSSM's, width ``d_state``) as well as the attention heads': a table left out would be made
    inside the step, where the compiler recomputes it per element (``rotary_tables``)."""
    from components.generation import decoder, rotary_dims

    torch.manual_seed(0)
    model = HybridLM(61, 32, "SM AM", {"S": partial(SSD, d_state=12, head_dim=8, chunk_size=4, rope=True),
                                       "A": partial(QCAttention, n_heads=4)})
    model.eval()
    assert rotary_dims(model) == [8, 12]  # the attention heads' and the SSD's d_state
    prompt = torch.randint(1, 61, (2, 4))
    cache = model.new_cache(2, 8)
    with torch.no_grad():
        logits = model(prompt, cache=cache)[:, -1]
        step = decoder(model, cache, torch.full((2, 1), 3), 3)
        made = []
        hook = model.rotary.register_forward_hook(lambda module, args, out: made.append(args[1]))
        try:
            for i in (1, 2):
                token = logits.argmax(-1, keepdim=True)  # [2, 1]
                logits = step(i, token, torch.full((2, 1), 3 + i))
        finally:
            hook.remove()
    assert made == []
    with torch.no_grad():  # the steps read the tables they were given: the full forward's last logits
        torch.testing.assert_close(logits, model(model.generate(prompt, 2))[:, -1], rtol=1e-4, atol=1e-4)


def test_the_edges_of_the_sampling_settings_are_taken():
    """No new token is the prompt itself; ``top_p=1`` is the whole distribution; a nucleus whose mass reaches
    ``top_p`` exactly stops there (Hugging Face's rule: the smallest set of at least ``top_p``)."""
    model = tiny_hybrid()
    prompt = torch.randint(1, 61, (2, 4))
    assert torch.equal(model.generate(prompt, 0), prompt)
    seeded = lambda **kw: model.generate(prompt, 6, temperature=1.0, generator=torch.Generator().manual_seed(5), **kw)  # noqa: E731
    assert torch.equal(seeded(top_p=1.0), seeded())
    logits = torch.tensor([[math.log(2.0), 0.0, 0.0]])  # probabilities 0.5, 0.25, 0.25: exact in binary
    assert restricted_logits(logits, top_p=0.5).isfinite().tolist() == [[True, False, False]]
    assert restricted_logits(logits, top_p=0.5001).isfinite().tolist() == [[True, True, False]]
    # a temperature so small that a logit over it overflows float32 is greedy, as the limit is (it was a NaN softmax,
    # torch.multinomial's "probability tensor contains either inf, nan or element < 0")
    for tiny in (1e-30, 1e-45):
        assert torch.equal(model.generate(prompt, 5, temperature=tiny), model.generate(prompt, 5))


def test_top_k_and_top_p_keep_exactly_their_tokens():
    from components.generation import sample_next

    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().expand(4000, 4)  # probabilities 0.5, 0.3, 0.15, 0.05
    draw = lambda **kw: set(sample_next(logits, temperature=1.0, generator=torch.Generator().manual_seed(0), **kw).tolist())  # noqa: E731
    assert draw() == {0, 1, 2, 3}
    assert draw(top_k=2) == {0, 1} and draw(top_k=3) == {0, 1, 2}
    # The nucleus is the smallest set whose mass reaches top_p: 0.6 needs the second token, 0.85 the third.
    assert draw(top_p=0.6) == {0, 1} and draw(top_p=0.85) == {0, 1, 2} and draw(top_p=0.4) == {0}
    counts = torch.bincount(sample_next(logits, temperature=1.0, top_k=2, generator=torch.Generator().manual_seed(1)),
                            minlength=4).float()
    assert abs(counts[0] / counts[:2].sum() - 0.5 / 0.8) < 0.03  # renormalised over the kept tokens


@pytest.mark.parametrize("top_k, top_p", [(None, 0.9), (5, None), (5, 0.5), (40, 0.95), (1, None), (None, 1.0)])
def test_the_kept_tokens_are_those_of_hugging_faces_top_k_and_top_p_warpers(top_k, top_p):
    """An independent check: transformers' TopKLogitsWarper then TopPLogitsWarper (the order its generate applies
    them in) keep the same tokens. With ties (logits rounded to 0.25) the nucleus may end inside a run of equal
    logits, where each library keeps some of them in its sort's order: there the kept logits, as a multiset, agree."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    torch.manual_seed(0)
    logits = (torch.randn(64, 50) * 2).div(0.25).round().mul(0.25)  # [B, V] with ties
    ours = restricted_logits(logits, top_k=top_k, top_p=top_p)
    theirs = logits.clone()
    if top_k is not None:
        theirs = TopKLogitsWarper(top_k)(None, theirs)
    if top_p is not None:
        theirs = TopPLogitsWarper(top_p)(None, theirs)
    assert torch.equal(ours.sort(dim=-1).values, theirs.sort(dim=-1).values)  # the kept logits, unchanged, per row
    untied = torch.randn(64, 50) * 2
    assert torch.equal(restricted_logits(untied, top_k=top_k, top_p=top_p).isfinite(),
                       TopPLogitsWarper(top_p or 1.0)(None, TopKLogitsWarper(top_k or 50)(None, untied.clone())).isfinite())


def test_left_padded_generation_equals_each_prompt_alone():
    # RoPE sees only relative positions, so a position mask (absolute positions) is what shows that each
    # sequence counts its positions from its own first token.
    model = HybridLM(61, 32, "PM SM", {"P": partial(InnerFuncAttention, n_heads=4, mask={"position": {"max_position": 32}}),
                                       "S": partial(SSD, d_state=8, head_dim=8, chunk_size=4)})
    randomize(model)
    with torch.no_grad():
        model.blocks[0].sequence_mixer.key_bias.table.mul_(4)
    prompts = [torch.randint(1, 61, (n,)) for n in (7, 4, 2)]
    batch = torch.zeros(3, 7, dtype=torch.long)
    mask = torch.ones(3, 7, dtype=torch.bool)
    for b, p in enumerate(prompts):
        batch[b, 7 - len(p):], mask[b, 7 - len(p):] = p, False
    out = model.generate(batch, 5, padding_mask=mask)
    for b, p in enumerate(prompts):
        assert torch.equal(out[b, 7:], model.generate(p[None], 5)[0, len(p):]), f"prompt {b}"


class Forgetful(torch.nn.Module):
    """A mixer as a user may write one for training alone: it ignores the decoding cache."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x, context=None):
        return self.inner(x, None if context is None else dataclasses.replace(context, cache=None))


@pytest.mark.parametrize("build", ["hybrid", "absolute positions"])
def test_a_mixer_without_decoding_state_generates_by_recomputing_what_the_cache_would_give(build):
    # The step-by-step path of the same weights is the reference. A position mask sees absolute positions, so it
    # shows that a recomputed step counts each left-padded sequence's positions from its own first token.
    torch.manual_seed(0)
    model = tiny_hybrid() if build == "hybrid" else HybridLM(61, 32, "PM SM", {
        "P": partial(InnerFuncAttention, n_heads=4, mask={"position": {"max_position": 32}}),
        "S": partial(SSD, d_state=8, head_dim=8, chunk_size=4)})
    randomize(model)
    mask, _ = padded(3, 7, (0, 2, 4))
    prompt = torch.randint(1, 61, (3, 7)).masked_fill(mask, 0)
    with warnings.catch_warnings():  # mixers that keep their state: no word of recomputing
        warnings.simplefilter("error")
        expected = model.generate(prompt, 9, padding_mask=mask)
    forgetful = copy.deepcopy(model)
    for block in forgetful.blocks:
        block.sequence_mixer = Forgetful(block.sequence_mixer)
    with pytest.warns(UserWarning, match=r"generate: block 0's sequence mixer Forgetful, block 1's sequence mixer "
                                         r"Forgetful.* keeps no decoding state in context.cache: each new token "
                                         r"recomputes the whole sequence"):
        got = forgetful.generate(prompt, 9, padding_mask=mask)
    assert torch.equal(got, expected)
    with warnings.catch_warnings():  # one new token is the prompt's forward alone: nothing is recomputed
        warnings.simplefilter("error")
        assert torch.equal(forgetful.generate(prompt, 1, padding_mask=mask), expected[:, :8])
    with pytest.raises(DecodingUnsupported, match="Forgetful.* keeps no decoding state .* no step to compile"):
        forgetful.generate(prompt, 9, padding_mask=mask, compile=True)


def test_linear_as_row_sums_sums_the_same_products_over_few_rows_and_leaves_more_rows_alone():
    from components.generation import LinearAsRowSums

    torch.manual_seed(0)
    weight, bias = torch.randn(48, 256), torch.randn(48)
    few, many = torch.randn(2, 3, 256), torch.randn(3, 3, 256)  # 6 rows, 9 rows
    products = (few.unsqueeze(-2) * weight).sum(-1)  # [2, 3, 1, 256] * [48, 256] summed → [2, 3, 48]
    row_sums = products + bias
    product = F.linear(many, weight, bias)  # outside the mode
    assert not torch.equal(row_sums, F.linear(few, weight, bias))  # else the checks below could not tell them apart
    assert not torch.equal((many.unsqueeze(-2) * weight).sum(-1) + bias, product)
    torch.testing.assert_close(row_sums, F.linear(few, weight, bias))
    with LinearAsRowSums(max_rows=5):  # a row past the bound: the product
        assert not torch.equal(F.linear(few, weight, bias), row_sums)
    with LinearAsRowSums(max_rows=6):  # few's 6 rows exactly: the bound is inclusive
        assert torch.equal(F.linear(few, weight, bias), row_sums)
        assert torch.equal(F.linear(few, weight), products)
        assert torch.equal(F.linear(many, weight, bias), product)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast's dtype, as F.linear would give (a generation
            autocast = F.linear(few, weight, bias)          # under autocast: its keys meet a bf16 cache)
    assert autocast.dtype == torch.bfloat16
    torch.testing.assert_close(autocast.float(), row_sums, atol=0.5, rtol=2e-2)


def test_a_compiled_step_is_a_cuda_graph_when_every_weight_is_on_a_gpu_and_cpp_wrapped_on_a_cpu(monkeypatch):
    """What ``torch.compile`` is asked for, recorded by a stand-in: a CUDA graph only when the whole model lies on
    CUDA (a graph cannot hold a CPU weight's ops); on a CPU inductor's C++ wrapper (docs/decoding.md)."""
    import components.generation as generation

    class ModelOn:  # all that compiled_step reads of a model: its weights' devices (no GPU needed)
        def __init__(self, *devices):
            self.devices = [torch.device(d) for d in devices]

        def parameters(self):
            return [type("Weight", (), {"device": d})() for d in self.devices]

    assert generation.uses_cuda_graphs(ModelOn("cuda", "cuda:1")) is True
    assert generation.uses_cuda_graphs(ModelOn("cuda", "cpu")) is False
    assert generation.uses_cuda_graphs(ModelOn("cpu")) is False
    asked = []
    monkeypatch.setattr(torch, "compile", lambda fn, **options: asked.append(options) or fn)
    monkeypatch.setattr(generation, "_compiled_steps", {})
    cpu, gpu = ModelOn("cpu"), ModelOn("cuda")
    for model in (cpu, gpu, cpu):  # the third call finds the first model's step
        generation.compiled_step(model)
    assert asked == [{"options": {"cpp_wrapper": True}}, {"mode": "reduce-overhead"}]
    assert generation.compiled_step(cpu) is not generation.compiled_step(gpu)
    assert generation.compiled_step(cpu).__name__ == "decode_step_0"  # a code object of its own per model


def test_a_compiled_cpu_step_runs_its_linears_as_row_sums_up_to_eight_rows(monkeypatch):
    """Compiled on a CPU, a step of up to 8 rows computes its linear layers as row sums (the compiler fuses them
    into one pass over each weight, docs/decoding.md); an eager step, and a batch of more rows, never."""
    import components.generation as generation

    entered = []

    class Recording(generation.LinearAsRowSums):
        def __enter__(self):
            entered.append(self.max_rows)
            return super().__enter__()

    monkeypatch.setattr(generation, "LinearAsRowSums", Recording)
    model = tiny_hybrid()
    randomize(model)
    prompt = torch.randint(1, 61, (2, 5))
    eager = model.generate(prompt, 6)
    assert entered == []
    assert torch.equal(model.generate(prompt, 6, compile=True), eager)
    assert len(entered) == 5  # one per step after the prefill
    assert generation.takes_row_sums(model, 8) and not generation.takes_row_sums(model, 9)


@pytest.mark.parametrize("pad", ["none", "left", "after a token"])
def test_a_sliding_window_reads_only_the_keys_its_queries_can_reach(monkeypatch, pad):
    """A windowed attention decoding keeps each row's last ``w`` real keys in a ring and hands the attention only what
    a call's queries can reach: a step the ``w`` ring entries, a call of ``T`` tokens ``w - 1 + T`` — however the rows
    are padded (padding takes no ring slot, as it takes no place in the window), so a step costs ``O(w)``. The
    outputs equal the full forward's: the prompt, a chunk of 3 and the steps past the window."""
    import components.context

    torch.manual_seed(0)
    w = 4
    mixer = QCAttention(32, n_heads=4, n_kv_heads=2, sliding_window=w)
    x = torch.randn(3, 13, 32)
    if pad == "none":
        mask, positions = None, torch.arange(13).expand(3, 13)
    elif pad == "left":
        mask, positions = padded()
    else:
        mask = torch.zeros(3, 13, dtype=torch.bool)
        mask[1, 2:4] = True  # two tokens, two padded positions, then the rest
        mask[2, 7:10] = True  # padding in the chunk and at the first step
        positions = (torch.cumsum(~mask, dim=1) - 1).clamp_min(0)
    want = mixer(x, Context(position_ids=positions, padding_mask=mask))
    keys, attention = [], components.context.attention

    def counting(q, k, *args, **kwargs):  # the keys each call hands the attention
        keys.append(k.shape[1])
        return attention(q, k, *args, **kwargs)

    monkeypatch.setattr(components.context, "attention", counting)
    got = in_pieces(mixer, x, positions, mask, prefill=6, sizes=[3] + [1] * 4)
    assert relative(got, want, None if mask is None else ~mask) < 1e-5
    assert keys == [6, w + 3 - 1, w, w, w, w]  # the prompt (6 keys), a chunk of 3, then each step's w


def test_the_cache_counts_each_rows_real_tokens_and_its_copies_keep_them():
    """``real``: each row's tokens that are not padding, over every call (where a sliding window's ring writes);
    ``fewest_real``: a lower bound of the smallest, known on the host. A selection or expansion keeps both."""
    cache = InferenceCache(2, 10)
    cache.begin(4, torch.tensor([[True, True, False, False], [False] * 4]))
    cache.end(4)
    assert cache.real.tolist() == [2, 4] and cache.fewest_real == 2 and cache.has_padding
    cache.begin(1, None)
    cache.end(1)
    cache.begin(2, torch.tensor([[False, True], [True, True]]))  # padding after the rows' tokens
    cache.end(2)
    assert cache.real.tolist() == [4, 5] and cache.fewest_real == 3
    picked = cache.select(torch.tensor([1, 1, 0]))
    assert picked.real.tolist() == [5, 5, 4] and picked.fewest_real == 3
    assert cache.expand(2).real.tolist() == [4, 4, 5, 5]
    assert InferenceCache(3, 10).real.tolist() == [0, 0, 0]

