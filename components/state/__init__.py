"""State mixers: ``forward(x [B,T,d]) -> [B,T,d]``, transforming each position on its own."""

from components.state.mlp import MLP

__all__ = ["MLP"]
