import functools
import pickle
from copy import deepcopy as copy_module

import pytest
import torch
from torch import nn

from components import (MLP, SSD, HybridLM, QCAttention, RMSNorm, RotaryEmbedding, TokenShift, count_active_parameters,
                        count_parameters)
from components.block import Block
from components.catalogue import SEQUENCE_MIXERS, STATE_MIXERS, WHOLE_BLOCKS
from components.pattern import PatternError

TINY = dict(vocab_size=50, d_model=32, mixers={"A": functools.partial(QCAttention, n_heads=4)})


def test_hybridlm_is_causal(assert_causal):
    model = HybridLM(pattern="AM -M A-", **TINY)
    assert_causal(model, torch.randint(0, 50, (2, 13)))


def test_no_two_blocks_share_parameters():
    model = HybridLM(pattern="(AM)×3 -M", **TINY)
    seen: dict[int, str] = {}
    for i, block in enumerate(model.blocks):
        for name, p in block.named_parameters():
            assert id(p) not in seen, f"block {i} {name} shares a parameter with {seen[id(p)]}"
            seen[id(p)] = f"block {i} {name}"
    assert model.blocks[0].sequence_mixer is not model.blocks[1].sequence_mixer


def test_blocks_follow_the_pattern():
    model = HybridLM(pattern="AM -M A-", **TINY)
    kinds = [(type(b.sequence_mixer).__name__, type(b.state_mixer).__name__) for b in model.blocks]
    assert kinds == [("QCAttention", "MLP"), ("NoneType", "MLP"), ("QCAttention", "NoneType")]


def test_tied_embeddings_share_the_matrix_and_count_once():
    tied = HybridLM(pattern="AM", tie_embeddings=True, **TINY)
    untied = HybridLM(pattern="AM", **TINY)
    assert tied.lm_head.weight is tied.embedding.weight
    assert count_parameters(untied) - count_parameters(tied) == 50 * 32
    assert count_active_parameters(tied) == count_parameters(tied)
    # a child that shares one of its parameters with its parent and owns another: each counted once
    parent = torch.nn.Module()
    parent.shared = torch.nn.Parameter(torch.zeros(3, 4))
    parent.child = torch.nn.Linear(4, 3)
    parent.child.weight = parent.shared
    assert count_active_parameters(parent) == count_parameters(parent) == 12 + 3


def test_sequence_longer_than_supported_is_refused():
    model = HybridLM(pattern="AM", max_seq_len=16, **TINY)
    model(torch.zeros(1, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="sequence length 17 exceeds max_seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_token_ids_out_of_range_are_refused():
    model = HybridLM(pattern="AM", **TINY).eval()
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, vocab_size=50\); got values in \[0, 50\]"):
        model(torch.tensor([[0, 50]]))
    with pytest.raises(ValueError, match=r"got values in \[-1, 3\]"):
        model(torch.tensor([[-1, 3]]))
    # In training the check is an assert on the device (no host sync): on CPU it fails at once.
    with pytest.raises(RuntimeError, match=r"token ids must lie in \[0, vocab_size=50\)"):
        model.train()(torch.tensor([[0, 50]]))


def test_mixer_with_the_wrong_output_shape_is_named():
    class Shrink(nn.Module):
        def __init__(self, d_model):
            super().__init__()
            self.proj = nn.Linear(d_model, d_model // 2)

        def forward(self, x):
            return self.proj(x)

    model = HybridLM(pattern="-K", vocab_size=10, d_model=8, mixers={"K": Shrink})
    with pytest.raises(ValueError, match="state mixer Shrink returned shape"):
        model(torch.zeros(1, 3, dtype=torch.long))


def test_mixer_with_the_wrong_output_dtype_is_named():
    # A float64 output turned the residual stream float64, and the next mixer's input check named that mixer.
    class Widen(nn.Module):
        def __init__(self, d_model, dtype=torch.float64):
            super().__init__()
            self.proj, self.dtype = nn.Linear(d_model, d_model), dtype

        def forward(self, x, context=None):
            return self.proj(x).to(self.dtype)

    model = HybridLM(pattern="KM", vocab_size=10, d_model=8, mixers={"K": Widen})
    ids = torch.zeros(1, 3, dtype=torch.long)
    message = (r"block 'KM': sequence mixer Widen returned torch.float64 for a torch.float32 input; mixers return their "
               r"input's dtype \(or torch.autocast's\)")
    with pytest.raises(ValueError, match=message):
        model(ids)
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match=message):
        model(ids)
    model = HybridLM(pattern="KM", vocab_size=10, d_model=8, mixers={"K": functools.partial(Widen, dtype=torch.bfloat16)})
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast's dtype, as its matrix products give
        assert model(ids).shape == (1, 3, 10)
    with pytest.raises(ValueError, match="returned torch.bfloat16 for a torch.float32 input"):
        model(ids)


def test_a_mixer_whose_forward_cannot_take_its_slots_arguments_is_named_at_build():
    class NoContext(nn.Module):  # zoology's form: forward(x), no context
        def __init__(self, d_model):
            super().__init__()
            self.proj = nn.Linear(d_model, d_model)

        def forward(self, x):
            return self.proj(x)

    class KeywordsOnly(NoContext):
        def forward(self, x, **kwargs):  # takes context by keyword only; the block passes it positionally
            return self.proj(x)

    class NeedsContext(NoContext):
        def forward(self, x, context):
            return self.proj(x)

    for cls in (NoContext, KeywordsOnly):
        with pytest.raises(ValueError, match=f"block 'KM': sequence mixer {cls.__name__}.forward.* cannot be called as "
                                             "a sequence mixer .*write forward\\(self, x, context=None\\)"):
            HybridLM(pattern="KM", vocab_size=10, d_model=8, mixers={"K": cls})
    with pytest.raises(ValueError, match="block '-K': state mixer NeedsContext.forward.*write forward\\(self, x\\)"):
        HybridLM(pattern="-K", vocab_size=10, d_model=8, mixers={"K": NeedsContext})
    # What the contract allows builds and runs: a state mixer with only x, a sequence mixer with (x, context).
    model = HybridLM(pattern="CK", vocab_size=10, d_model=8, mixers={"K": NoContext, "C": NeedsContext})
    assert model(torch.zeros(1, 3, dtype=torch.long)).shape == (1, 3, 10)


@pytest.mark.parametrize("name", [*SEQUENCE_MIXERS, *STATE_MIXERS])
def test_a_zoo_mixer_in_the_other_kinds_place_is_refused_at_build(name):
    # Both kinds map [B, T, d] to [B, T, d], and an attention's forward(x, context=None) can be called as a state
    # mixer: 'AA' used to build and train, its second attention on a default context (no padding, no documents, no
    # decoding cache: a silent wrong answer); 'X-' failed at the first batch inside the MoE's padding check.
    sequence = name in SEQUENCE_MIXERS
    factory = SEQUENCE_MIXERS[name] if sequence else STATE_MIXERS[name]
    kind, other = ("sequence", "state") if sequence else ("state", "sequence")
    pattern = "AM -K" if sequence else "AM K-"  # alone in the other place (a whole block's token is 'K-')
    column = 5 if sequence else 4
    with pytest.raises(PatternError, match=f"column {column}: letter 'K' binds .*, a {kind} mixer, in the "
                                           f"{'second' if sequence else 'first'} place of .*, a {other} mixer's") as info:
        HybridLM(pattern=pattern, vocab_size=10, d_model=32, mixers={"K": factory})
    assert info.value.column == column
    # in its own place it builds; a Block given it directly refuses it by name as well
    HybridLM(pattern="K-" if name in WHOLE_BLOCKS else ("KM" if sequence else "AK"), vocab_size=10, d_model=32,
             mixers={"K": factory})
    if name not in WHOLE_BLOCKS:
        slots = (None, factory(32)) if sequence else (factory(32), None)
        with pytest.raises(ValueError, match=f"block 'T': .* is a {kind} mixer, not a {other} mixer"):
            Block(32, *slots, token="T")


def test_a_mixer_that_declares_no_kind_goes_in_either_place():
    class Identity(nn.Module):  # a user's module without mixer_slot: the call-signature check alone applies
        def __init__(self, d_model):
            super().__init__()

        def forward(self, x, context=None):
            return x

    model = HybridLM(pattern="KK AK", vocab_size=10, d_model=8, mixers={"K": Identity, "A": TINY["mixers"]["A"]})
    assert model(torch.zeros(1, 3, dtype=torch.long)).shape == (1, 3, 10)


def test_auxiliary_losses_are_collected_by_module_name():
    class WithAux(MLP):
        def forward(self, x):
            y = super().forward(x)
            self.aux_loss = y.pow(2).mean()
            return y

    model = HybridLM(pattern="AM AW", vocab_size=10, d_model=16, mixers={"W": WithAux, "A": TINY["mixers"]["A"]})
    assert model.auxiliary_losses() == {}  # nothing before a forward
    model(torch.zeros(1, 4, dtype=torch.long))
    aux = model.auxiliary_losses()
    assert list(aux) == ["blocks.1.state_mixer"]
    assert aux["blocks.1.state_mixer"].requires_grad


def test_a_trained_model_with_every_default_mixer_copies_and_pickles():
    # An EMA twin (deepcopy), torch.save of the whole model, ddp_spawn's pickling: a mixture's last balancing loss
    # holds its forward's graph, which cannot be copied, and a gate given as a lambda cannot be pickled.
    torch.manual_seed(0)
    model = HybridLM(pattern="SM AE IR SH AC SX", **TINY)
    ids = torch.randint(0, 50, (2, 11))
    model(ids).float().pow(2).mean().backward()
    assert set(model.auxiliary_losses()) >= {"blocks.2.state_mixer", "blocks.5.state_mixer"}
    for copy in (copy_module(model), pickle.loads(pickle.dumps(model))):
        assert copy.auxiliary_losses() == {} == copy.router_z_losses()  # the records of the original's forward stay with it
        assert torch.equal(copy(ids), model(ids))
        assert set(copy.auxiliary_losses()) == set(model.auxiliary_losses())


def test_a_mixer_of_your_own_with_an_auxiliary_loss_copies_after_a_forward_with_forward_records():
    """What docs/architecture.md tells a user whose mixer keeps ``aux_loss``: without the mixin a copy after a forward
    fails (the loss holds the graph); with it, the copy leaves the record behind and computes the same."""
    from components import ForwardRecords

    class WithAux(MLP):
        def forward(self, x):
            y = super().forward(x)
            self.aux_loss = y.pow(2).mean()
            return y

    class Recorded(ForwardRecords, WithAux):
        pass

    ids = torch.zeros(1, 4, dtype=torch.long)
    for mixer, copies in ((WithAux, False), (Recorded, True)):
        model = HybridLM(pattern="AW", vocab_size=10, d_model=16, mixers={"W": mixer, "A": TINY["mixers"]["A"]})
        model(ids)
        if not copies:
            with pytest.raises(RuntimeError, match="deepcopy"):
                copy_module(model)
            continue
        twin = copy_module(model)
        assert twin.auxiliary_losses() == {} and torch.equal(twin(ids), model(ids))


def test_shapes_are_inferred_on_the_meta_device():
    model = HybridLM(pattern="SM AM IE", **TINY).to("meta")
    logits = model(torch.zeros(2, 13, dtype=torch.long, device="meta"))
    assert logits.shape == (2, 13, 50) and logits.is_meta


def test_summary_lists_every_block_and_the_total():
    model = HybridLM(pattern="AM -M", **TINY)
    text = model.summary()
    assert "QCAttention" in text and "MLP" in text
    rows = [line for line in text.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert len(rows) == 2 and "-M" in rows[1]
    assert f"total parameters: {count_parameters(model):,}" in text
    table = text.splitlines()[1:-1]  # the header, a rule, the blocks, embed and head, a rule: one width, aligned
    assert len({len(line) for line in table}) == 1 and len(table) == 7


def test_invalid_sizes_are_refused():
    with pytest.raises(ValueError, match="d_model=0 must be a positive integer"):
        HybridLM(vocab_size=10, d_model=0, pattern="AM")


@pytest.mark.parametrize("argument, value, rule", [
    ("norm_eps", -1e-3, ">= 0"), ("rope_base", 0.0, "> 0"), ("rope_ntk_factor", float("nan"), "> 0"),
    ("rope_ntk_factor", -2.0, "> 0"), ("init_std", -0.02, "> 0 \\(or None\\)"), ("init_std", 0.0, "> 0"),
])
def test_numbers_that_give_nan_at_the_first_forward_are_refused_by_name(argument, value, rule):
    """Each of these built a model whose first forward was NaN (or, for init_std, torch's "normal expects std")."""
    with pytest.raises(ValueError, match=f"HybridLM: {argument}={value!r} must be a finite number {rule}"):
        HybridLM(pattern="AM", **TINY, **{argument: value})
    assert torch.isfinite(HybridLM(pattern="AM", **TINY, **{argument: 1.0})(torch.zeros(1, 3, dtype=torch.long))).all()


def test_a_bound_that_is_inclusive_takes_its_edge_and_a_bool_is_no_number():
    assert HybridLM(pattern="AM", **TINY, norm_eps=0.0).norm.eps == 0.0  # eps >= 0: zero is allowed
    with pytest.raises(ValueError, match=r"HybridLM: norm_eps=True must be a finite number >= 0"):
        HybridLM(pattern="AM", **TINY, norm_eps=True)


@pytest.mark.parametrize("build, message", [
    (lambda: RMSNorm(8, eps=-1e-6), "RMSNorm: eps=-1e-06 must be a finite number >= 0"),
    (lambda: SSD(32, gate=True, norm_eps=-1.0), "GroupedRMSNorm: eps=-1.0 must be"),
    (lambda: RotaryEmbedding(16, base=-1.0), "RotaryEmbedding: base=-1.0 must be"),
    (lambda: TokenShift(8, mix=float("inf")), "TokenShift: mix=inf must be a finite number$"),
], ids=["rmsnorm", "ssd-gate-norm", "rotary", "token-shift"])
def test_components_refuse_such_numbers_too(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_checkpointed_blocks_give_the_same_loss_and_gradients_and_run_each_block_again():
    """checkpoint_blocks: the same numbers (aux losses included), each block's forward run twice in a training step
    (once more in the backward), once without gradients, and never when decoding."""
    from functools import partial

    from components import SSD, QCAttention, RoutedMoE

    def build(checkpoint_blocks):
        torch.manual_seed(0)
        return HybridLM(50, 32, "SM AR", {"S": partial(SSD, head_dim=8, d_state=8, chunk_size=8),
                                          "A": partial(QCAttention, n_heads=4),
                                          "R": partial(RoutedMoE, n_experts=4, top_k=2, d_ff=16)},
                        checkpoint_blocks=checkpoint_blocks)

    ids = torch.randint(0, 50, (2, 19))
    results = []
    for flag in (False, True):
        model = build(flag)
        calls = []
        for block in model.blocks:
            block.register_forward_pre_hook(lambda *args: calls.append(1))  # (a recomputation stops once it has what the backward needs)
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten()) + sum(model.auxiliary_losses().values())
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()], len(calls)))
    (loss, grads, calls), (loss_ckpt, grads_ckpt, calls_ckpt) = results
    assert torch.equal(loss, loss_ckpt)
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-5) for a, b in zip(grads, grads_ckpt))
    assert (calls, calls_ckpt) == (2, 4)
    model = build(True)
    with torch.no_grad():
        model(ids)
    cache = model.new_cache(2, 20)
    model(ids, cache=cache)  # decoding with gradients on: no checkpoint (the cache is written once)
    model(ids[:, :1], cache=cache)
