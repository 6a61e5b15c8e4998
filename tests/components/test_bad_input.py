"""Bad input gets a named error, empty input works, and padding never reaches a valid position — not
even when what sits at the padded positions is NaN or inf."""

import re
import warnings
from functools import partial

import pytest
import torch

from components.catalogue import SEQUENCE_MIXERS, STATE_MIXERS
from components import (
    CDMoE, SSD, Context, HybridLM, PatternError, QCAttention, parse_pattern,
)

SEQUENCE = {name: partial(factory, 32) for name, factory in SEQUENCE_MIXERS.items()}  # components/catalogue.py
STATE = {name: partial(factory, 32) for name, factory in STATE_MIXERS.items()}
ALL = {**SEQUENCE, **STATE}


@pytest.mark.parametrize("name", ALL)
def test_wrong_width_dtype_or_rank_is_named(name):
    mixer = ALL[name]()
    owner = type(mixer).__name__
    with pytest.raises(ValueError, match=rf"{owner}: the input must be \[.*d_model\] with d_model=32; got shape \(2, 5, 16\)"):
        mixer(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match=rf"{owner}: the input must be a floating-point tensor; got torch.int64"):
        mixer(torch.ones(2, 5, 32, dtype=torch.long))
    with pytest.raises(ValueError, match=rf"{owner}: the input is torch.float64 but the parameters are torch.float32"):
        mixer(torch.randn(2, 5, 32, dtype=torch.float64))
    if name in SEQUENCE:
        with pytest.raises(ValueError, match=rf"{owner}: the input must be \[B, T, d_model\] .* got shape \(5, 32\)"):
            mixer(torch.randn(5, 32))
    else:  # a state mixer works token by token: any leading shape, the numbers of the same tokens as [B, T]
        x = torch.randn(2, 3, 4, 32)
        torch.testing.assert_close(mixer(x), mixer(x.reshape(6, 4, 32)).reshape(2, 3, 4, 32))
        torch.testing.assert_close(mixer(x[0, 0]), mixer(x[:1, :1]).reshape(4, 32))


@pytest.mark.parametrize("name", SEQUENCE)
def test_a_context_made_for_another_input_is_named(name):
    # A context of another length or batch was a shape error from inside torch (SSD, attention), or was read at
    # the wrong positions without a word (TokenShift, which reads only the padding).
    mixer = SEQUENCE[name]()
    owner = type(mixer).__name__
    x = torch.randn(2, 7, 32)
    for other in ((2, 5), (2, 9), (3, 7)):
        context = Context.default(torch.randn(*other, 32))
        with pytest.raises(ValueError, match=rf"{owner}: the context is for \[B, T\] = {re.escape(str(other))}, the input is "
                                             r"\(2, 7, 32\): make the Context from this input's positions"):
            mixer(x, context)
    torch.testing.assert_close(mixer(x, Context.default(x)), mixer(x))


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("shape", [(2, 0, 32), (0, 5, 32)], ids=["T=0", "B=0"])
def test_empty_batches_and_sequences_work(name, shape):
    mixer = ALL[name]()
    x = torch.randn(shape, requires_grad=True)
    y = mixer(x)
    assert y.shape == shape
    y.sum().backward()
    for value in (getattr(mixer, "aux_loss", None), getattr(mixer, "expert_load", None)):
        assert value is None or torch.isfinite(value).all()


def test_model_takes_empty_input_and_refuses_a_non_bool_padding_mask():
    model = HybridLM(50, 32, "AM SR IE", mixers={"S": partial(SSD, d_state=8), "E": partial(CDMoE, n_experts=64, top_k=4)})
    assert model(torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0, 50)
    assert model(torch.zeros(0, 3, dtype=torch.long)).shape == (0, 3, 50)
    ids = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="HybridLM: padding_mask must be a bool tensor .*; got torch.int64"):
        model(ids, padding_mask=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="HybridLM: position_ids must be an integer tensor"):
        model(ids, position_ids=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="Context: padding_mask must be a bool tensor"):
        Context(position_ids=ids, padding_mask=torch.zeros(2, 3))
    for documents in (torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool), torch.zeros(2, 4, dtype=torch.long)):
        with pytest.raises(ValueError, match=r"Context: document_ids must be integers of the shape of position_ids "
                                             r"\(2, 3\); got torch\.\w+ \(2, \d\)"):
            Context(position_ids=ids, document_ids=documents)
    with pytest.raises(ValueError, match=r"Context: padding_mask \(2, 4\) must have the shape of position_ids \(2, 3\)"):
        Context(position_ids=ids, padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    mask = torch.zeros(2, 3, dtype=torch.bool)  # a mixer called with another length than its context's
    with pytest.raises(ValueError, match=r"Context: the input's \[B, T\] = \(2, 4\) does not match the padding mask "
                                         r"\(2, 3\)"):
        Context(position_ids=ids, padding_mask=mask).zero_padding(torch.randn(2, 4, 8))


def test_the_models_inputs_are_checked_by_name_and_positions_past_max_seq_len_are_refused():
    """Each of ``input_ids``' companions is named with the shape it needs; a position past ``max_seq_len`` (RoPE's
    trained range) is refused unless the model extrapolates, in eval with the values found, in training by an
    assert on the device (no host sync), which names the rule."""
    model = HybridLM(50, 16, "AM", mixers={"A": partial(QCAttention, n_heads=2)}, max_seq_len=8).eval()
    ids = torch.zeros(2, 3, dtype=torch.long)
    for bad, got in ((ids.float(), r"torch.float32 \(2, 3\)"), (ids[0], r"torch.int64 \(3,\)")):
        with pytest.raises(ValueError, match=rf"HybridLM: input_ids must be an integer tensor \[B, T\]; got {got}"):
            model(bad)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, vocab_size=50\); got values in \[0, 50\]"):
        model(torch.tensor([[0, 50, 1]]))
    for name, wrong in (("position_ids", ids[:, :2]), ("padding_mask", ids[:, :2].bool()), ("document_ids", [0, 1, 2])):
        got = "list" if isinstance(wrong, list) else r"\(2, 2\)"
        with pytest.raises(ValueError, match=rf"HybridLM: {name} must have the shape of input_ids \(2, 3\); got {got}"):
            model(ids, **{name: wrong})
    rule = r"position_ids must be >= 0 and below max_seq_len=8 \(extrapolate=True stretches RoPE past it\)"
    for positions, values in (([[0, 1, 8], [0, 1, 2]], "0, 8"), ([[-1, 0, 1], [5, 6, 7]], "-1, 7")):
        with pytest.raises(ValueError, match=rf"HybridLM: {rule}; got values in \[{values}\]"):
            model(ids, position_ids=torch.tensor(positions))
        with pytest.raises(RuntimeError, match=rf"HybridLM: {rule}"):
            model.train()(ids, position_ids=torch.tensor(positions))
        model.eval()
    assert model(ids, position_ids=torch.tensor([[5, 6, 7], [0, 1, 2]])).shape == (2, 3, 50)  # the last trained one
    stretched = HybridLM(50, 16, "AM", mixers={"A": partial(QCAttention, n_heads=2)}, max_seq_len=8,
                         extrapolate=True).eval()
    assert stretched(ids, position_ids=torch.tensor([[0, 9, 20], [0, 1, 2]])).shape == (2, 3, 50)
    with pytest.raises(ValueError, match=r"position_ids must be >= 0 \(extrapolate=True stretches RoPE past it\); "
                                         r"got values in \[-1, 2\]"):
        stretched(ids, position_ids=torch.tensor([[-1, 1, 2], [0, 1, 2]]))


def left_padded(batch: int = 3, T: int = 11, pad: tuple = (0, 4, 7)) -> torch.Tensor:
    mask = torch.zeros(batch, T, dtype=torch.bool)
    for b, n in enumerate(pad):
        mask[b, :n] = True
    return mask


@pytest.mark.parametrize("name", SEQUENCE)
def test_padded_nan_and_inf_never_reach_valid_positions(name):
    mixer = SEQUENCE[name]()
    mask = left_padded()
    positions = (torch.cumsum(~mask, dim=1) - 1).clamp_min(0)  # each sequence counts from its first token
    context = lambda: Context(position_ids=positions, padding_mask=mask)  # noqa: E731
    x = torch.randn(3, 11, 32)
    clean = mixer(x.masked_fill(mask[..., None], 0.0), context())
    poisoned = x.clone()
    poisoned[mask] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30]).repeat(8)
    poisoned.requires_grad_(True)
    y = mixer(poisoned, context())
    torch.testing.assert_close(y[~mask], clean[~mask])
    y[~mask].sum().backward()
    assert torch.isfinite(poisoned.grad).all() and (poisoned.grad[mask] == 0).all()
    assert all(torch.isfinite(p.grad).all() for p in mixer.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", [n for n in STATE if not n.startswith("MLP")])
def test_expert_load_and_balancing_loss_ignore_padding(name):
    mixer = STATE[name]()
    mask = left_padded(2, 7, (0, 3))
    x = torch.randn(2, 7, 32)
    x[mask] = float("nan")
    y = mixer(x, padding_mask=mask)
    assert torch.isfinite(y[~mask]).all()
    load, aux = mixer.expert_load, mixer.aux_loss
    mixer(x[~mask][None])  # the valid tokens alone, no padding at all
    torch.testing.assert_close(load, mixer.expert_load)
    if aux is not None:  # (a CDMoE without balance_loss has none)
        torch.testing.assert_close(aux, mixer.aux_loss)
        assert torch.isfinite(aux)


def test_a_model_with_a_nan_pad_embedding_computes_what_it_computes_without_it():
    torch.manual_seed(0)
    model = HybridLM(50, 32, "AM SR IE SM", mixers={"S": partial(SSD, d_state=8, chunk_size=4, conv=True, rope=False),
                                                    "E": partial(CDMoE, n_experts=64, top_k=4, balance_loss=True)})
    mask = left_padded()
    ids = torch.randint(1, 50, (3, 11)).masked_fill(mask, 0)
    positions = (torch.cumsum(~mask, dim=1) - 1).clamp_min(0)
    clean = model(ids, position_ids=positions, padding_mask=mask)
    with torch.no_grad():
        model.embedding.weight[0] = float("nan")  # the pad token's row
    poisoned = model(ids, position_ids=positions, padding_mask=mask)
    torch.testing.assert_close(poisoned[~mask], clean[~mask])
    aux = model.auxiliary_losses()
    assert aux and all(torch.isfinite(v) for v in aux.values())


def test_bindings_that_would_fail_later_or_silently_are_named_at_build():
    build = partial(HybridLM, vocab_size=64, d_model=32, pattern="AM×2")
    # a module instead of a factory: called with d_model, it ran a forward on an int
    with pytest.raises(TypeError, match=r"letter 'A' is a QCAttention module; bind a factory .*functools.partial"):
        build(mixers={"A": QCAttention(32, n_heads=4)})
    # a factory ignoring d_model: a shape error at the first forward
    with pytest.raises(ValueError, match=r"letter 'A' built a QCAttention of d_model=64 for a model of d_model=32"):
        build(mixers={"A": lambda d: QCAttention(64, n_heads=4)})
    # a letter the pattern does not use while a used one takes its default: likely a binding under the wrong name
    with pytest.warns(UserWarning, match=r"mixers binds Q, which pattern 'AM×2' does not use, while its A, M take"):
        build(mixers={"Q": partial(QCAttention, n_heads=2)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # every used letter bound: a family's spare binding, no warning
        build(mixers={"A": QCAttention, "M": STATE_MIXERS["MLP"], "R": STATE_MIXERS["RoutedMoE"]})
        build(mixers={"A": QCAttention, "M": STATE_MIXERS["MLP"], "Z": lambda d: torch.nn.Identity()})  # of any kind
        # spare sequence mixers while only a state mixer takes its default (a helper reused across patterns)
        build(pattern="-M -M", mixers={"S": SSD, "A": partial(QCAttention, n_heads=2)})
        # and spare state mixers while only a sequence mixer takes its default
        build(mixers={"M": STATE_MIXERS["MLP"], "Z": STATE_MIXERS["RoutedMoE"], "Y": STATE_MIXERS["CDMoE Doge"]})


@pytest.mark.parametrize("pattern, problem", [
    ("SM×²", "needs a count after it (ASCII digits 0-9)"),
    ("SM×٣", "needs a count after it (ASCII digits 0-9)"),
    ("SM×10001", "exceeds the limit of 10,000 blocks"),
    ("SM×" + "9" * 5000, "exceeds the limit of 10,000 blocks"),
    ("((SM×1000)×1000)×1000", "exceeds the limit of 10,000 blocks"),
    ("(SM×6000 AM×6000)", "the pattern exceeds the limit of 10,000 blocks"),
    ("(" * 5000 + "SM" + ")" * 5000, "parentheses nest deeper than 32 levels"),
])
def test_pathological_patterns_are_named_not_hung(pattern, problem):
    with pytest.raises(PatternError, match=r"column \d+: .*" + problem.replace("(", r"\(").replace(")", r"\)")) as info:
        parse_pattern(pattern)
    assert len(str(info.value)) < 400  # a window of a long pattern, not all of it


@pytest.mark.parametrize("name", SEQUENCE)
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_nonfinite_input_reaches_its_position_and_later_never_earlier(name, value):
    """Causality holds for non-finite inputs too: a NaN at t (inside a chunk, T = 11 and chunks of 4) leaves
    every earlier output as it was, makes every output that depends on x_t non-finite (t and, for attention
    and the SSD, every later one of its document; for a token shift t and t + 1: found by perturbing x_t),
    and touches no other document or row. (Masked terms used to be multiplied by zero: 0 · NaN poisoned
    the past.)"""
    mixer = SEQUENCE[name]().eval()
    x = torch.randn(2, 11, 32)
    documents = torch.tensor([[0] * 7 + [1] * 4, [0] * 11])
    for context in (None, Context(position_ids=torch.arange(11).expand(2, 11), document_ids=documents)):
        clean = mixer(x, context)
        dirty = x.clone()
        dirty[0, 5, 3] = value
        y = mixer(dirty, context)
        torch.testing.assert_close(y[0, :5], clean[0, :5], rtol=0, atol=1e-6)
        torch.testing.assert_close(y[1], clean[1], rtol=0, atol=1e-6)
        last = 7 if context is not None else 11  # the end of t's document
        moved = x.clone()
        moved[0, 5, 3] += 1.0
        depends = (mixer(moved, context)[0] != clean[0]).any(-1)  # [T]: the outputs x_t reaches
        assert depends[5] and not depends[:5].any()
        assert not torch.isfinite(y[0, depends]).all(-1).any(), "an output that depends on x_t stayed finite"
        if context is not None:
            # the next document starts afresh; a mixer that looks at values alone (not their finiteness) agrees
            assert torch.isfinite(y[0, last:]).all()


def test_constructor_arguments_out_of_range_are_named():
    from components import MLP, InnerFuncAttention, RoutedMoE, SharedExpertMoE

    for bad in (50, -1, 2.0):
        with pytest.raises(ValueError, match=rf"HybridLM: padding_idx={bad!r} must be a token id in \[0, vocab_size=50\)"):
            HybridLM(50, 16, "-M", padding_idx=bad)
    assert HybridLM(50, 16, "-M", padding_idx=49).embedding.padding_idx == 49  # the last id is a token
    assert HybridLM(50, 16, "-M", padding_idx=0).embedding.padding_idx == 0  # and the first
    for key in ("SM", "a", 1):
        with pytest.raises(ValueError, match=rf"HybridLM: mixers key {key!r} is not a pattern letter"):
            HybridLM(50, 16, "-M", mixers={key: MLP})
    with pytest.raises(ValueError, match="SharedExpertMoE: n_shared=-1 must be a non-negative integer"):
        SharedExpertMoE(16, n_shared=-1)
    torch.manual_seed(0)  # no shared expert is a routed MoE
    alone, routed = SharedExpertMoE(16, n_shared=0), RoutedMoE(16)
    routed.load_state_dict(alone.state_dict())
    x = torch.randn(3, 16)
    torch.testing.assert_close(alone(x), routed(x))
    with pytest.raises(ValueError, match=r"keep_window=0 must be an integer >= 1"):
        InnerFuncAttention(16, n_heads=2, keep_window=0)
    x = torch.randn(1, 5, 16)
    assert InnerFuncAttention(16, n_heads=2, keep_window=1)(x).shape == x.shape  # a window of one key is a window


@pytest.mark.parametrize("name", ["SSD", "QCAttention", "InnerFuncAttention", "CDMoE"])
def test_an_unknown_backend_is_refused_by_the_module_given_it(name):
    """In a pattern of many blocks, ``backend='cuda'`` alone did not say which binding held it."""
    import components

    with pytest.raises(ValueError, match=rf"^{name}: backend='cuda' is not one of \('auto', 'reference', 'triton'\)$"):
        getattr(components, name)(16, backend="cuda")


def test_init_std_draws_every_linear_and_embedding_weight_and_keeps_the_padding_row_zero():
    torch.manual_seed(0)
    model = HybridLM(300, 64, "AM", padding_idx=7, init_std=0.5)
    weights = [m.weight.detach() for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))]
    assert len(weights) >= 6 and all(0.45 < float(w.std()) < 0.55 and abs(float(w.mean())) < 0.05 for w in weights)
    embedding = model.embedding.weight.detach()
    assert not embedding[7].any() and embedding[6].abs().sum() > 0
    assert float(HybridLM(300, 64, "AM").lm_head.weight.detach().std()) < 0.1  # without it: torch's own initialisation


def test_a_binding_that_builds_no_module_and_a_cache_of_another_batch_are_named():
    with pytest.raises(TypeError, match="HybridLM: the binding of letter 'Z' returned builtin_function_or_method, not an nn.Module"):
        HybridLM(50, 16, "-Z", mixers={"Z": lambda d: torch.tanh})
    model = HybridLM(50, 16, "SM AM", mixers={"S": partial(SSD, d_state=8)})
    cache = model.new_cache(batch=3, capacity=8)
    with pytest.raises(ValueError, match="HybridLM: the cache holds 3 sequences; input_ids has 2"):
        model(torch.zeros(2, 4, dtype=torch.long), cache=cache)


def test_a_mixer_names_an_input_that_is_no_tensor_and_a_state_mixer_takes_one_vector():
    """Sequence mixers read ``[B, T, d_model]``; state mixers act per token, ``[..., d_model]``, one vector too."""
    with pytest.raises(TypeError, match="QCAttention: the input must be a tensor; got list"):
        SEQUENCE["QCAttention"]()([[0.0] * 32])
    with pytest.raises(ValueError, match=r"MLP: the input must be \[\.\.\., d_model\] with d_model=32; got shape \(\)"):
        STATE["MLP"]()(torch.tensor(1.0))
    x = torch.randn(32)
    mlp = STATE["MLP"]()
    torch.testing.assert_close(mlp(x), mlp(x[None, None])[0, 0])


def _flag_cases():
    """(call, flag, owner) for every ``bool`` (or ``bool | None``) argument of every catalogued mixer's class, the
    model, the block and ``generate``: each flag once, in the first catalogue entry whose class takes it."""
    import inspect
    import typing

    from components import Block, HybridLM, InnerFuncAttention, TopKRouter
    from components.generation import generate
    from components.sequence.inner_func_attention import ExpContentBias

    model = partial(HybridLM, 16, 32, "AM", max_seq_len=16)
    owners = [(name, factory.func, factory) for name, factory in ALL.items()] + [
        ("HybridLM", HybridLM, model), ("Block", Block, partial(Block, 32, None, torch.nn.Identity())),
        ("generate", generate, lambda **flag: generate(model(), torch.zeros(1, 2, dtype=torch.long), 1, **flag)),
        ("IFA content_exp", ExpContentBias, lambda **flag: InnerFuncAttention(32, n_heads=4, mask={"content_exp": flag})),
        ("TopKRouter", TopKRouter, partial(TopKRouter, 32, 4, 2))]  # a part a ComposedMoE names
    seen = set()
    for name, target, call in owners:
        hints = typing.get_type_hints(target.__init__ if isinstance(target, type) else target)
        for flag, hint in hints.items():
            if (hint is bool or hint == bool | None) and (target, flag) not in seen and flag in inspect.signature(target).parameters:
                seen.add((target, flag))
                yield pytest.param(call, flag, target.__name__, id=f"{name}-{flag}")


FLAG_CASES = list(_flag_cases())


def test_every_flag_is_found():
    flags = {case.id for case in FLAG_CASES}
    assert {"QCAttention-rope", "SSD rope-d_skip", "SSD rope-recompute", "RoutedMoE-normalize",
            "CDMoE, balance loss-balance_loss", "HybridLM-tie_embeddings", "Block-residual_scale",
            "generate-compile", "IFA content_exp-per_kv_head", "TopKRouter-normalize"} <= flags
    assert len(flags) >= 24


@pytest.mark.parametrize("call, flag, owner", FLAG_CASES)
def test_a_flag_that_is_not_a_bool_is_refused(call, flag, owner):
    """``rope="false"`` is truthy: taken as it is, it would switch RoPE on without a word. The error names what the
    user called (the MoE, not its router; the Expresser, not its attention)."""
    for value in ("no", 0, None) if flag != "d_skip" else ("no", 1):  # d_skip's None means "as conv"
        with pytest.raises(ValueError, match=rf"^{owner}: {flag}={value!r} must be True or False"):
            call(**{flag: value})


@pytest.mark.parametrize("cls, kwargs, argument", [
    ("RoutedMoE", {"activation": "gelu"}, "activation"), ("RoutedMoE", {"act": "tanh"}, "act"),
    ("SharedExpertMoE", {"activation": "plain"}, "activation"), ("CohesiveMoE", {"gate": "sigmoid"}, "gate"),
    ("CohesiveMoE", {"act": "tanh"}, "act"), ("ExpansiveMoE", {"activation": "gelu"}, "activation"),
    ("ExpansiveMoE", {"gate": "vector"}, "gate"), ("ExpansiveMoE", {"act": "tanh"}, "act"),
])
def test_a_named_moe_names_itself_for_a_bad_choice(cls, kwargs, argument):
    """Not the part the user never named (``MLPExperts``, ``SharedGate``)."""
    import components

    value = next(iter(kwargs.values()))
    with pytest.raises(ValueError, match=rf"^{cls}: {argument}={value!r} is not one of"):
        getattr(components, cls)(32, n_experts=4, top_k=2, **kwargs)
