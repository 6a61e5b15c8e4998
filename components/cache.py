"""``InferenceCache``: what the sequence mixers keep between decoding calls (docs/decoding.md).

A model forward with a cache in its :class:`~components.context.Context` processes the next ``T``
tokens of each sequence (the prompt at prefill, then one token per step) and leaves in the cache what
the next call needs:

- attention (QCAttention, InnerFuncAttention, the Expresser's): keys and values after RoPE and
  QK-norm, ``[B, capacity, H_kv, Dh]``, and InnerFuncAttention's per-key mask bias ``[B, H, capacity]``,
  written in place into buffers sized once for the whole generation;
- SSD: its conv window (the last ``conv_kernel - 1`` inputs of the convolution) and its state
  ``[B, H, P, N]``: a constant size, whatever the length;
- the model: which of the cached positions are padding, ``[B, capacity]``.

State mixers keep nothing: they act on each token alone.
"""

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class InferenceCache:
    """Decoding state of one batch of sequences.

    Attributes:
        batch: sequences in the batch.
        capacity: the most tokens (prompt + generated) any call may bring the cache to.
        seen: tokens already processed, the same for every sequence (shorter prompts are left-padded).
        padding: ``[B, capacity]`` bool, True at padded positions (valid up to ``seen``).
        layers: each mixer's own state, keyed by the mixer.
        static: one-token steps keep every shape fixed (default False): a step writes at ``cursor`` (a
            tensor, not ``seen``) and attends over the whole ``capacity``, later positions masked as
            padding — so ``torch.compile`` (and CUDA graphs) can take a step whole, once, for every step.
        cursor: with ``static``, ``seen`` as a 0-dim int64 tensor on the device.
        prefix_padding: every padded position comes before its row's first token (left padding, as generation pads;
            True without padding): a sliding window's last ``w`` cached keys then hold every key it keeps.
    """

    batch: int
    capacity: int
    device: torch.device | str = "cpu"
    seen: int = 0
    padding: torch.Tensor | None = None
    layers: dict = field(default_factory=dict)
    has_padding: bool = False
    static: bool = False
    cursor: torch.Tensor | None = None
    prefix_padding: bool = True

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.batch < 1:
            raise ValueError(f"InferenceCache: batch={self.batch} and capacity={self.capacity} must be >= 1")
        if self.padding is None:
            self.padding = torch.zeros(self.batch, self.capacity, dtype=torch.bool, device=self.device)
        if self.static and self.cursor is None:
            self.cursor = torch.tensor(self.seen, dtype=torch.int64, device=self.padding.device)

    def __repr__(self) -> str:  # the dataclass's would print every padding flag and every layer's state
        return (f"InferenceCache(batch={self.batch}, capacity={self.capacity}, seen={self.seen}, "
                f"layers={len(self.layers)}, static={self.static}, device={self.padding.device})")

    def begin(self, T: int, padding_mask: torch.Tensor | None) -> None:
        """Called by the model before a forward over the next ``T`` tokens."""
        if self.seen + T > self.capacity:
            raise ValueError(f"InferenceCache: {self.seen} cached + {T} new tokens exceed its capacity={self.capacity}")
        if padding_mask is not None:
            self.padding[:, self.seen:self.seen + T] = padding_mask
            # one sync, at prefill: whether any position is padding, and any after a real token of its row
            later = padding_mask[:, 1:] & ~padding_mask[:, :-1]  # [B, T - 1]
            anywhere, after_a_token = torch.stack([padding_mask.any(), later.any()]).tolist()
            self.has_padding = self.has_padding or anywhere
            self.prefix_padding = self.prefix_padding and not after_a_token and not (self.seen and anywhere)

    def end(self, T: int) -> None:
        """Called by the model after the forward: the ``T`` tokens are now cached."""
        self.seen += T
        if self.static:
            self.cursor.add_(T)

    def fixed_step(self, T: int) -> bool:
        """Whether a call of ``T`` tokens runs at fixed shapes (a static cache's one-token step)."""
        return self.static and T == 1

    def key_padding(self, T: int) -> torch.Tensor | None:
        """``[B, seen + T]``: the padding of every key a query of this call may see (None: no padding,
        so attention needs no mask beyond causality). A static step's keys are the whole capacity: the
        positions past this token are padding too."""
        if self.fixed_step(T):
            later = torch.arange(self.capacity, device=self.padding.device) > self.cursor  # [capacity]
            return self.padding | later
        return self.padding[:, :self.seen + T] if self.has_padding else None

    def append(self, owner: nn.Module, name: str, new: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """Write ``new`` (this call's ``T`` entries along ``dim``) into ``owner``'s buffer ``name`` and
        return every entry so far: ``[..., seen + T, ...]``. The buffer is allocated at the first call."""
        state = self.layers.setdefault(owner, {})
        T = new.shape[dim]
        if name not in state:
            shape = list(new.shape)
            shape[dim] = self.capacity
            state[name] = new.new_zeros(shape)
        buffer = state[name]
        if self.fixed_step(T):  # at the tensor cursor; every entry, later ones masked (a one-token prompt's too)
            return buffer.index_copy_(dim, self.cursor.view(1), new)
        buffer.narrow(dim, self.seen, T).copy_(new)
        return buffer.narrow(dim, 0, self.seen + T)

    def state(self, owner: nn.Module) -> dict:
        """``owner``'s own entries (a recurrent mixer keeps its fixed-size state here)."""
        return self.layers.setdefault(owner, {})

    def keep(self, owner: nn.Module, name: str, value: torch.Tensor, T: int) -> torch.Tensor:
        """Make ``value`` ``owner``'s entry ``name`` after a call of ``T`` tokens, and return the entry. A static
        cache's one-token step writes it into the entry the prompt left, so that from the prompt on every entry
        keeps its memory: a CUDA graph of the step reads and writes the same addresses at each replay, where an
        entry bound anew would be memory the graph's next replay overwrites."""
        state = self.state(owner)
        if self.fixed_step(T) and name in state:
            return state[name].copy_(value)
        state[name] = value
        return value

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the cache holds: the padding, the cursor (static) and each mixer's entries."""
        held = [self.padding] + ([self.cursor] if self.cursor is not None else [])
        return held + [t for state in self.layers.values() for t in state.values() if isinstance(t, torch.Tensor)]

    def expand(self, copies: int) -> "InferenceCache":
        """A cache of ``batch · copies`` sequences, each sequence of this one repeated ``copies`` times in a
        row (sequence ``i`` becomes ``i·copies … i·copies + copies - 1``): one prompt, several continuations
        (multiple-choice scoring) without computing the prompt again."""
        if not isinstance(copies, int) or copies < 1:
            raise ValueError(f"InferenceCache.expand: copies={copies!r} must be a positive integer")
        return self.select(torch.arange(self.batch, device=self.padding.device).repeat_interleave(copies))

    def select(self, rows: torch.Tensor) -> "InferenceCache":
        """A cache whose sequence ``j`` is this one's sequence ``rows[j]`` (rows may repeat: a prompt's
        cache copied to each of its continuations)."""
        rows = torch.as_tensor(rows, device=self.padding.device)
        if rows.dim() != 1 or (rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= self.batch)):
            raise ValueError(f"InferenceCache.select: rows must be a 1-D tensor of indices in [0, {self.batch})")
        pick = lambda t: t.index_select(0, rows.to(t.device)) if isinstance(t, torch.Tensor) else t  # noqa: E731
        layers = {owner: {name: pick(t) for name, t in state.items()} for owner, state in self.layers.items()}
        return InferenceCache(len(rows), self.capacity, self.device, self.seen, pick(self.padding), layers,
                              self.has_padding, self.static, None if self.cursor is None else self.cursor.clone(),
                              self.prefix_padding)

    def nbytes(self) -> int:
        """Bytes held by the cached tensors (buffers at full capacity)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())
