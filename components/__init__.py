"""hybrid-zoo components: every mixer is a plain ``nn.Module`` reusable outside the zoo."""

from components.block import Block, WholeBlock
from components.context import Context
from components.model import DEFAULT_MIXERS, HybridLM, count_active_parameters, count_parameters
from components.norm import RMSNorm
from components.pattern import PatternError, parse_pattern
from components.rotary import RotaryEmbedding, apply_rotary
from components.sequence import SSD, Expresser, GatedDeltaNet, InnerFuncAttention, ParallelMixers, QCAttention, ShortConv, TokenShift
from components.state import (MLP, CDMoE, CohesiveMoE, ComposedMoE, ExpansiveMoE, ForwardRecords, MoE, RoutedMoE,
                              SharedExpertMoE, SigmoidRouter, TopKRouter)

__all__ = [
    "Block", "CDMoE", "Expresser", "CohesiveMoE", "ComposedMoE", "Context", "ExpansiveMoE", "ForwardRecords", "GatedDeltaNet", "MoE", "RoutedMoE", "SharedExpertMoE", "SigmoidRouter", "TopKRouter", "DEFAULT_MIXERS", "HybridLM", "InnerFuncAttention", "MLP", "ParallelMixers", "PatternError", "QCAttention", "RMSNorm",
    "RotaryEmbedding", "SSD", "ShortConv", "TokenShift", "WholeBlock", "apply_rotary", "count_active_parameters", "count_parameters", "parse_pattern",
]
