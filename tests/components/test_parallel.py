"""``ParallelMixers`` (Falcon-H1's layer: attention and Mamba-2 side by side) against the mixers it holds run one by
one on the same input and context — outputs and every gradient, with padding — inside a model, through a checkpoint's
spec, and its refusals. (The catalogue's contract tests check decoding, documents, padding and causality of two
entries; those compare the module with itself, so a dropped or doubled branch would pass them.)"""

from functools import partial

import pytest
import torch

from components import SSD, Context, HybridLM, ParallelMixers, QCAttention
from components.bindings import binding_spec

ATTENTION = {"class_path": "components.QCAttention", "init_args": {"n_heads": 4, "n_kv_heads": 2}}
SSD_SPEC = {"class_path": "components.SSD", "init_args": {"head_dim": 8, "d_state": 8, "chunk_size": 4, "conv": True,
                                                           "rope": False, "gate": True}}
SHORT_CONV = {"class_path": "components.ShortConv", "init_args": {"kernel_size": 2}}


def padded_context(B: int, T: int) -> Context:
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[1, :4] = True  # the second row left-padded
    return Context(position_ids=(torch.cumsum(~mask, 1) - 1).clamp_min(0), padding_mask=mask)


@pytest.mark.parametrize("specs", [[ATTENTION, SSD_SPEC], [SSD_SPEC, SHORT_CONV, ATTENTION]],
                         ids=["attention + SSD", "SSD + ShortConv + attention"])
def test_the_output_is_the_sum_of_its_mixers_run_alone_outputs_and_gradients(specs):
    torch.manual_seed(0)
    parallel = ParallelMixers(32, mixers=specs).double()
    assert [type(m).__name__ for m in parallel.mixers] == [s["class_path"].split(".")[-1] for s in specs]
    x = torch.randn(2, 13, 32, dtype=torch.float64, requires_grad=True)
    got = parallel(x, padded_context(2, 13))
    want = sum(m(x, padded_context(2, 13)) for m in parallel.mixers)
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # (the same sums, in the same order)
    alone = [m(x, padded_context(2, 13)) for m in parallel.mixers]
    assert all(a.abs().max() > 1e-3 for a in alone)  # every branch contributes: none could be dropped unseen
    target = torch.randn_like(got)
    params = [x, *parallel.parameters()]
    for a, b in zip(torch.autograd.grad((got * target).sum(), params), torch.autograd.grad((want * target).sum(), params)):
        torch.testing.assert_close(a, b)


def test_without_a_context_every_mixer_reads_the_same_default_one():
    torch.manual_seed(0)
    parallel = ParallelMixers(32, mixers=[ATTENTION, {**SSD_SPEC, "init_args": {"head_dim": 8, "d_state": 8}}])
    x = torch.randn(1, 9, 32)
    torch.testing.assert_close(parallel(x), sum(m(x) for m in parallel.mixers))


def test_a_model_of_parallel_blocks_records_plain_specs_and_rebuilds_from_them():
    torch.manual_seed(0)
    factory = partial(ParallelMixers, mixers=[ATTENTION, SSD_SPEC])
    model = HybridLM(61, 32, "PM×2", {"P": factory})
    spec = binding_spec("P", factory)
    assert spec == {"class_path": "components.ParallelMixers", "init_args": {"mixers": [ATTENTION, SSD_SPEC]}}
    again = HybridLM(61, 32, "PM×2", {"P": spec})
    again.load_state_dict(model.state_dict())
    assert "blocks.1.sequence_mixer.mixers.1.in_proj.weight" in model.state_dict()
    ids = torch.randint(0, 61, (2, 11))
    torch.testing.assert_close(again(ids), model(ids))
    assert isinstance(model.blocks[0].sequence_mixer.mixers[0], QCAttention)
    assert isinstance(model.blocks[0].sequence_mixer.mixers[1], SSD)
    assert "0  PM     QCAttention + SSD  MLP" in model.summary()  # (the summary names what is summed)


@pytest.mark.parametrize("mixers, words", [
    ([ATTENTION], "ParallelMixers: mixers=[{'class_path': 'components.QCAttention'"),
    ("components.QCAttention", "must be a list of two or more specs"),
    (ATTENTION, "must be a list of two or more specs"),
    ([ATTENTION, "components.SSD"], "ParallelMixers: mixers[1]='components.SSD' must be a spec"),
    ([ATTENTION, {"class_path": "components.MLP", "init_args": {}}],
     "ParallelMixers: mixers[1] is MLP, a state mixer; each must be a sequence mixer"),
    ([ATTENTION, {"class_path": "components.Expresser", "init_args": {"n_heads": 4}}],
     "mixers[1] is Expresser, a whole block (norms and residual its own)"),
    ([ATTENTION, {"class_path": "components.SSD", "init_args": {"heads": 4}}], "ParallelMixers: mixers[1]: "),
    ([ATTENTION, {"class_path": "components.Nothing"}], "ParallelMixers: mixers[1]: class_path 'components.Nothing'"),
])
def test_bad_mixers_are_refused_by_name(mixers, words):
    with pytest.raises(ValueError) as info:
        ParallelMixers(32, mixers=mixers)
    assert words in str(info.value)


def test_an_input_of_the_wrong_width_is_named_for_the_parallel_mixer():
    with pytest.raises(ValueError, match=r"ParallelMixers: the input must be \[B, T, d_model\] with d_model=32"):
        ParallelMixers(32, mixers=[ATTENTION, SSD_SPEC])(torch.randn(1, 4, 16))
