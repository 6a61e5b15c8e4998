"""``ParallelMixers``: sequence mixers side by side in one block, each reading the block's normed input, their outputs
summed — Falcon-H1's hybrid layer (TII, 2025: attention and Mamba-2 in every block) where the other hybrids of the zoo
alternate them from block to block::

    y = mixer_1(x) + mixer_2(x) + …

Each mixer keeps its own decoding cache, reads the one context (its positions, padding, documents and rotary
tables) and is checked by its own contract; the sum mixes nothing across positions that they do not.
"""

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from components._checks import check_mixer_input
from components.bindings import binding_factory
from components.block import WholeBlock
from components.context import Context


class ParallelMixers(nn.Module):
    """``[B, T, d_model] → [B, T, d_model]``: the sum of ``mixers``' outputs on the same input.

    Args:
        d_model: model width.
        mixers: two or more sequence mixers' specs ``{class_path, init_args}``, each built with ``d_model`` (which
            their ``init_args`` leave out): plain values, so a checkpoint records and rebuilds them. Summed in this
            order; a state mixer or a whole block is refused.
    """

    mixer_slot = "sequence"  # the block slot it fills; a pattern placing it in the other is refused

    def __init__(self, d_model: int, *, mixers: Sequence[Mapping]):
        super().__init__()
        if isinstance(mixers, (str, Mapping)) or not isinstance(mixers, Sequence) or len(mixers) < 2:
            raise ValueError(f"ParallelMixers: mixers={mixers!r} must be a list of two or more specs "
                             "{class_path: ..., init_args: {...}}")
        built = []
        for i, mixer in enumerate(mixers):
            if not isinstance(mixer, Mapping):
                raise ValueError(f"ParallelMixers: mixers[{i}]={mixer!r} must be a spec {{class_path: ..., init_args: {{...}}}}")
            try:
                module = binding_factory(f"mixers[{i}]", mixer)(d_model)
            except (TypeError, ValueError) as error:
                raise ValueError(f"ParallelMixers: mixers[{i}]: {error}") from None
            slot = getattr(module, "mixer_slot", None)
            if isinstance(module, WholeBlock) or slot == "state":
                what = "a whole block (norms and residual its own)" if isinstance(module, WholeBlock) else "a state mixer"
                raise ValueError(f"ParallelMixers: mixers[{i}] is {type(module).__name__}, {what}; each must be a "
                                 "sequence mixer")
            built.append(module)
        self.d_model, self.mixers = d_model, nn.ModuleList(built)

    @property
    def summary_name(self) -> str:
        """What the model's summary calls it: its mixers' classes, summed (``QCAttention + SSD``)."""
        return " + ".join(getattr(m, "summary_name", type(m).__name__) for m in self.mixers)

    def forward(self, x: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        check_mixer_input(type(self).__name__, x, self.d_model, next(self.parameters(), x), sequence=True)
        context = Context.for_input(type(self).__name__, x, context)  # one context: the rotary tables made once
        y = self.mixers[0](x, context)
        for mixer in self.mixers[1:]:
            y = y + mixer(x, context)
        return y
