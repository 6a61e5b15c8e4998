"""Data modules of the recipes. Each exposes ``vocab_size``, which the CLI links into the model."""

from recipes.data.corpus import TokenizedCorpus
from recipes.data.hf_datasets import HFDataset
from recipes.data.mixture import MixedCorpus
from recipes.data.mqar import MQAR
from recipes.data.parity import Parity
from recipes.data.text import TextCorpus

__all__ = ["HFDataset", "MQAR", "MixedCorpus", "Parity", "TextCorpus", "TokenizedCorpus"]
