"""The catalogue the contract tests run over (components/catalogue.py) holds every mixer the zoo exports:
a new mixer without an entry fails here, so none can skip the decoding, document, padding, causality,
compile and bad-input tests."""

import inspect

from torch import nn

import components
from components.catalogue import SEQUENCE_MIXERS, STATE_MIXERS

NOT_MIXERS = {"Block", "WholeBlock", "HybridLM", "RMSNorm", "RotaryEmbedding", "TopKRouter", "SigmoidRouter", "MoE"}  # parts and wholes


def test_every_exported_mixer_is_in_the_catalogue():
    exported = {name for name in components.__all__ if inspect.isclass(getattr(components, name))
                and issubclass(getattr(components, name), nn.Module) and name not in NOT_MIXERS}
    catalogued = {factory(32).__class__.__name__ for factory in [*SEQUENCE_MIXERS.values(), *STATE_MIXERS.values()]}
    assert exported - catalogued == set(), f"add these to components/catalogue.py: {sorted(exported - catalogued)}"


def test_catalogue_entries_are_sequence_and_state_mixers_of_width_32():
    import torch

    x = torch.randn(2, 5, 32)
    for name, factory in {**SEQUENCE_MIXERS, **STATE_MIXERS}.items():
        assert factory(32)(x).shape == x.shape, name


def test_each_entry_builds_the_variant_its_name_promises():
    """The contract tests cover a switch only if some entry turns it on: each entry's printed settings hold what its
    name says (a flipped switch would quietly drop that variant from every contract test)."""
    promises = {
        "QCAttention": ["n_heads=4, n_kv_heads=2", "rope=True, qk_norm=False"],
        "QCAttention no RoPE, QK-norm": ["rope=False, qk_norm=True"],
        "QCAttention heads of 12, half RoPE, QK-norm, QKV bias": ["head_dim=12", "rope=True, rope_fraction=0.5, qk_norm=True",
                                                                  "qkv_bias=True"],
        "IFA content_exp, window 5": ["mask=content_exp", "keep_window=5", "qk_norm=True"],
        "IFA retrieval, window 3": ["inner=retrieval", "keep_window=3"],
        "IFA ssd value": ["inner=ssd", "SSDValue(\n    conv=True, rope=False"],
        "SSD rope": ["conv=False, rope=True", "gate=False"],
        "SSD decay": ["conv=False, rope=False"],
        "SSD conv+rope, gate, 2 groups": ["conv=True, rope=True", "n_groups=2", "gate=True"],
        "SSD conv, gate, recompute": ["conv=True, rope=False", "gate=True, recompute=True"],
        "SSD conv, gate after its norm": ["conv=True, rope=False", "gate=True, norm_before_gate=True"],
        "SSD conv, gate without norm": ["conv=True, rope=False", "gate=True, gate_rms_norm=False"],
        "ParallelMixers: QCAttention + SSD (Falcon-H1)": ["(0): QCAttention", "(1): SSD", "gate=True, gate_rms_norm=False"],
        "ParallelMixers: windowed attention + ShortConv + SSD rope": ["sliding_window=3", "(1): ShortConv",
                                                                       "(2): SSD(\n      conv=False, rope=True"],
        "RoutedMoE top-1": ["top_k=1"],
        "RoutedMoE normalized, swisig": ["top_k=3, normalize=True", "activation=swisig"],
        "MLP switanh": ["activation=switanh"],
        "CDMoE, balance loss": ["balance_loss=True"],
        "CDMoE Doge": ["cross_domain=parallel, balance_loss=False", "activation=swiglu"],
    }
    for name, parts in promises.items():
        shown = repr({**SEQUENCE_MIXERS, **STATE_MIXERS}[name](32))
        for part in parts:
            assert part in shown, (name, part, shown)


def test_every_linear_map_is_bias_free_and_only_the_causal_convolution_has_a_bias():
    """As in the papers' layers (and Llama's, Mamba-2's, Doge's): a bias turned on by mistake changes the parameter
    count the fair comparisons hold equal, and the weights Hugging Face models import into. The switches that ask
    for biases put them where they say: ``QCAttention(qkv_bias=True)`` (Qwen2's) on the query and key/value projections
    alone, ``ShortConv(bias=True)`` (LFM2's ``conv_bias``) on both projections and the convolution."""
    import torch

    for name, factory in {**SEQUENCE_MIXERS, **STATE_MIXERS}.items():
        biased = [n for n, m in factory(32).named_modules()
                  if isinstance(m, (torch.nn.Linear, torch.nn.Conv1d)) and m.bias is not None]
        asked = ["q_proj", "kv_proj"] if "QKV bias" in name else ["in_proj", "out_proj"] if "biases" in name else []
        assert [n for n in biased if not (n == "conv" or n.endswith(".conv"))] == asked, (name, biased)
    assert [n for n, p in components.QCAttention(32, n_heads=4).named_parameters() if n.endswith("bias")] == []
