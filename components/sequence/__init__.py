"""Sequence mixers: ``forward(x [B,T,d], context=None) -> [B,T,d]``, mixing across positions."""

from components.sequence.attention import QCAttention
from components.sequence.expresser import Expresser
from components.sequence.gated_deltanet import GatedDeltaNet
from components.sequence.inner_func_attention import InnerFuncAttention, RetrievedValue
from components.sequence.parallel import ParallelMixers
from components.sequence.short_conv import ShortConv
from components.sequence.ssd import SSD
from components.sequence.token_shift import TokenShift

__all__ = ["Expresser", "GatedDeltaNet", "InnerFuncAttention", "ParallelMixers", "QCAttention", "RetrievedValue", "SSD", "ShortConv", "TokenShift"]
