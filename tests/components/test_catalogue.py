"""The catalogue the contract tests run over (components/catalogue.py) holds every mixer the zoo exports:
a new mixer without an entry fails here, so none can skip the decoding, document, padding, causality,
compile and bad-input tests."""

import inspect

from torch import nn

import components
from components.catalogue import SEQUENCE_MIXERS, STATE_MIXERS

NOT_MIXERS = {"Block", "WholeBlock", "HybridLM", "RMSNorm", "RotaryEmbedding", "TopKRouter", "MoE"}  # parts and wholes


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
