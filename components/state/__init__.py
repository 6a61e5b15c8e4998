"""State mixers: ``forward(x [B,T,d]) -> [B,T,d]``, transforming each position on its own."""

from components.state.cdmoe import CDMoE
from components.state.experts import CohesiveExperts, ExpansiveExperts, MLPExperts, SharedGate
from components.state.gated import SigmoidGated
from components.state.mlp import MLP
from components.state.moe import MoE, CohesiveMoE, ComposedMoE, ExpansiveMoE, RoutedMoE, SharedExpertMoE
from components.state.router import (ForwardRecords, Routing, SigmoidRouter, TopKRouter, sequence_balancing_loss,
                                     switch_balancing_loss)

__all__ = [
    "CDMoE", "CohesiveExperts", "ForwardRecords", "CohesiveMoE", "ComposedMoE", "ExpansiveExperts", "ExpansiveMoE", "MLP", "MLPExperts", "MoE",
    "RoutedMoE", "Routing", "SharedExpertMoE", "SigmoidGated", "SigmoidRouter", "SharedGate", "TopKRouter", "sequence_balancing_loss",
    "switch_balancing_loss",
]
