"""``Block``: a sequence mixer then a state mixer, each behind an RMSNorm (before it, or after it) and a residual;
``WholeBlock``: a block a pattern letter binds as it is."""

import inspect

import torch
from torch import nn

from components._checks import check_flags
from components.context import Context
from components.norm import RMSNorm
from zoo_kernels._backend import autocast_dtype


class WholeBlock(nn.Module):
    """The base of a module that is a whole block (OTCE's Expresser): ``forward(x [B,T,d], context) → [B,T,d]``
    takes the residual stream and returns the next one, norms and residuals its own. A pattern letter may
    bind one; its token has no state mixer (``"O-"``), and the model places the module as the block, with
    no norm and no residual around it (:class:`components.HybridLM`)."""

    token: str = ""  # the pattern token it was placed by (set by the model)
    mixer_slot = "sequence"  # a pattern places it where a sequence mixer goes (its token's first letter)


def block_mixers(block: nn.Module) -> tuple[nn.Module | None, nn.Module | None]:
    """A block's (sequence mixer, state mixer); a :class:`WholeBlock` is its own and has no state mixer."""
    if isinstance(block, WholeBlock):
        return block, None
    return block.sequence_mixer, block.state_mixer


def _check_call(mixer: nn.Module, slot: str, token: str) -> None:
    """Refuse, at build time and by name, a mixer whose ``forward`` cannot take what its slot passes: a sequence
    mixer ``(x, context)``, a state mixer ``(x)`` (plus ``padding_mask=`` when it reads it), all positional but
    that keyword. Without this, a zoology-style ``forward(self, x)`` fails at the first batch with Python's
    ``takes 2 positional arguments but 3 were given`` from inside the block."""
    try:
        signature = inspect.signature(mixer.forward)
    except (TypeError, ValueError):  # a forward Python cannot introspect: leave it to the call
        return
    padding = slot == "state" and bool(getattr(mixer, "reads_padding_mask", False))
    try:
        if slot == "sequence":
            signature.bind(None, None)
        else:
            signature.bind(None, **({"padding_mask": None} if padding else {}))
    except TypeError as error:
        wanted = ("forward(self, x, context=None): the block passes the context positionally"
                  if slot == "sequence" else
                  "forward(self, x, padding_mask=None)" if padding else "forward(self, x)")
        raise ValueError(
            f"block {token!r}: {slot} mixer {type(mixer).__name__}.forward{signature} cannot be called as a "
            f"{slot} mixer ({error}); write {wanted} (docs/architecture.md, 'The mixer contract')") from None


def _check_slot(mixer: nn.Module, slot: str, token: str) -> None:
    """Refuse a mixer that declares the other slot (``mixer_slot``, as every zoo mixer does). Both kinds map
    ``[B, T, d]`` to ``[B, T, d]``, and an attention's ``forward(x, context=None)`` can even be called as a state
    mixer: it would run, on a default context — with no padding, no documents and no decoding cache."""
    declared = getattr(mixer, "mixer_slot", None)
    if declared is not None and declared != slot:
        raise ValueError(f"block {token!r}: {type(mixer).__name__} is a {declared} mixer, not a {slot} mixer "
                         "(a block is a sequence mixer, then a state mixer)")


class Block(nn.Module):
    """``x += sequence_mixer(norm(x), context)``; ``x += state_mixer(norm(x))``. Either may be None.

    With ``post_norm=True`` each norm comes after its mixer instead, on what the mixer adds to the residual stream:
    ``x += norm(sequence_mixer(x, context))``; ``x += norm(state_mixer(x))`` — OLMo 2's reordered norm (in OLMo 2,
    OLMo 3 and OLMo-Hybrid's attention layers), which keeps the residual stream itself un-normalised as pre-norm does,
    but bounds each update. With ``residual_scale=True`` (Doge) each residual is scaled by a learned per-channel
    vector, ``x ← r ⊙ x + mixer(norm(x))``, ``r`` initialised to 1. A state mixer that leaves padding out of
    what it computes across tokens (a MoE's load) sets ``reads_padding_mask = True`` and is called
    ``state_mixer(h, padding_mask=…)``.

    Args:
        d_model: model width.
        sequence_mixer: a module ``(x [B,T,d], context) -> [B,T,d]``, or None.
        state_mixer: a module ``x [B,T,d] -> [B,T,d]``, or None.
        token: the pattern token this block was built from (for summaries and messages).
        norm_eps: RMSNorm epsilon.
        residual_scale: learned per-channel residual scales (default False).
        post_norm: each norm after its mixer, on the mixer's output (default False: before it, on its input).
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
        post_norm: bool = False,
    ):
        super().__init__()
        if sequence_mixer is None and state_mixer is None:
            raise ValueError("Block: needs a sequence mixer, a state mixer, or both")
        check_flags("Block", residual_scale=residual_scale, post_norm=post_norm)
        for slot, mixer in (("sequence", sequence_mixer), ("state", state_mixer)):
            if isinstance(mixer, WholeBlock):
                raise ValueError(f"block {token!r}: {type(mixer).__name__} is a whole block, not a {slot} mixer; "
                                 "bind it to a letter and give it a token of its own ('O-')")
            if mixer is not None:
                _check_slot(mixer, slot, token)
                _check_call(mixer, slot, token)
        self.token, self.post_norm = token, post_norm
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
            h = x if self.post_norm else self.sequence_norm(x)
            y = self._checked(self.sequence_mixer(h, context), x, "sequence")
            x = self._residual(x, self.sequence_residual) + (self.sequence_norm(y) if self.post_norm else y)
        if self.state_mixer is not None:
            h = x if self.post_norm else self.state_norm(x)
            padding = context.padding_mask if context is not None else None
            y = self._checked(self.state_mixer(h, padding_mask=padding) if self._state_takes_padding
                              else self.state_mixer(h), x, "state")
            x = self._residual(x, self.state_residual) + (self.state_norm(y) if self.post_norm else y)
        return x

    @staticmethod
    def _residual(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        return x if scale is None else scale * x

    def _checked(self, y: torch.Tensor, x: torch.Tensor, slot: str) -> torch.Tensor:
        if y.shape != x.shape:
            raise ValueError(
                f"block {self.token!r}: {slot} mixer {self._mixer_name(slot)} returned shape {tuple(y.shape)}; "
                f"mixers must map [B, T, d_model] = {tuple(x.shape)} to the same shape"
            )
        # A mixer returns its input's dtype, or autocast's: another would change the residual stream's, and the next
        # mixer's input check would name that mixer instead of this one.
        if y.dtype != x.dtype and y.dtype != autocast_dtype(x.device.type):
            raise ValueError(f"block {self.token!r}: {slot} mixer {self._mixer_name(slot)} returned {y.dtype} for a "
                             f"{x.dtype} input; mixers return their input's dtype (or torch.autocast's)")
        return y

    def _mixer_name(self, slot: str) -> str:
        return type(getattr(self, f"{slot}_mixer")).__name__

    def extra_repr(self) -> str:
        return "post_norm=True" if self.post_norm else ""
