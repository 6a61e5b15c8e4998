"""``Block``: a sequence mixer then a state mixer, each behind pre-RMSNorm and a residual; ``WholeBlock``: a
block a pattern letter binds as it is."""

import torch
from torch import nn

from components.context import Context
from components.norm import RMSNorm


class WholeBlock(nn.Module):
    """The base of a module that is a whole block (OTCE's Expresser): ``forward(x [B,T,d], context) → [B,T,d]``
    takes the residual stream and returns the next one, norms and residuals its own. A pattern letter may
    bind one; its token has no state mixer (``"O-"``), and the model places the module as the block, with
    no norm and no residual around it (:class:`components.HybridLM`)."""

    token: str = ""  # the pattern token it was placed by (set by the model)


def block_mixers(block: nn.Module) -> tuple[nn.Module | None, nn.Module | None]:
    """A block's (sequence mixer, state mixer); a :class:`WholeBlock` is its own and has no state mixer."""
    if isinstance(block, WholeBlock):
        return block, None
    return block.sequence_mixer, block.state_mixer


class Block(nn.Module):
    """``x += sequence_mixer(norm(x), context)``; ``x += state_mixer(norm(x))``. Either may be None.

    With ``residual_scale=True`` (Doge) each residual is scaled by a learned per-channel vector,
    ``x ← r ⊙ x + mixer(norm(x))``, ``r`` initialised to 1. A state mixer that leaves padding out of
    what it computes across tokens (a MoE's load) sets ``reads_padding_mask = True`` and is called
    ``state_mixer(h, padding_mask=…)``.

    Args:
        d_model: model width.
        sequence_mixer: a module ``(x [B,T,d], context) -> [B,T,d]``, or None.
        state_mixer: a module ``x [B,T,d] -> [B,T,d]``, or None.
        token: the pattern token this block was built from (for summaries and messages).
        norm_eps: RMSNorm epsilon.
        residual_scale: learned per-channel residual scales (default False).
    """

    def __init__(
        self,
        d_model: int,
        sequence_mixer: nn.Module | None,
        state_mixer: nn.Module | None,
        *,
        token: str = "",
        norm_eps: float = 1e-6,
        residual_scale: bool = False,
    ):
        super().__init__()
        if sequence_mixer is None and state_mixer is None:
            raise ValueError("Block: needs a sequence mixer, a state mixer, or both")
        for slot, mixer in (("sequence", sequence_mixer), ("state", state_mixer)):
            if isinstance(mixer, WholeBlock):
                raise ValueError(f"block {token!r}: {type(mixer).__name__} is a whole block, not a {slot} mixer; "
                                 "bind it to a letter and give it a token of its own ('O-')")
        self.token = token
        has_norm = sequence_mixer is not None
        self.sequence_norm = RMSNorm(d_model, eps=norm_eps) if has_norm else None
        self.sequence_mixer = sequence_mixer
        self.state_norm = RMSNorm(d_model, eps=norm_eps) if state_mixer is not None else None
        self.state_mixer = state_mixer
        self._state_takes_padding = bool(getattr(state_mixer, "reads_padding_mask", False))
        scaled = lambda mixer: nn.Parameter(torch.ones(d_model)) if residual_scale and mixer is not None else None  # noqa: E731
        self.sequence_residual = scaled(sequence_mixer)
        self.state_residual = scaled(state_mixer)

    def forward(self, x: torch.Tensor, context: Context | None = None) -> torch.Tensor:
        if self.sequence_mixer is not None:
            x = self._residual(x, self.sequence_residual) + self._checked(
                self.sequence_mixer(self.sequence_norm(x), context), x, "sequence")
        if self.state_mixer is not None:
            h = self.state_norm(x)
            padding = context.padding_mask if context is not None else None
            y = self.state_mixer(h, padding_mask=padding) if self._state_takes_padding else self.state_mixer(h)
            x = self._residual(x, self.state_residual) + self._checked(y, x, "state")
        return x

    @staticmethod
    def _residual(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        return x if scale is None else scale * x

    def _checked(self, y: torch.Tensor, x: torch.Tensor, slot: str) -> torch.Tensor:
        if y.shape != x.shape:
            mixer = getattr(self, f"{slot}_mixer")
            raise ValueError(
                f"block {self.token!r}: {slot} mixer {type(mixer).__name__} returned shape {tuple(y.shape)}; "
                f"mixers must map [B, T, d_model] = {tuple(x.shape)} to the same shape"
            )
        return y
