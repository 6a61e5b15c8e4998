"""``InferenceCache``: what the sequence mixers keep between decoding calls (docs/decoding.md).

A model forward with a cache in its :class:`~components.context.Context` processes the next ``T``
tokens of each sequence (the prompt at prefill, then one token per step) and leaves in the cache what
the next call needs:

- attention (QCAttention, InnerFuncAttention, the Expresser's): keys and values after RoPE and
  QK-norm, ``[B, capacity, H_kv, Dh]``, and InnerFuncAttention's per-key mask bias ``[B, H, capacity]``,
  written in place into buffers sized once for the whole generation; a sliding window of ``w`` keys
  (:meth:`InferenceCache.window`) keeps only each row's last ``w`` real keys and values, ``[B, H_kv, w, Dh]``,
  in a ring: its memory and each step's reading stay ``O(w)`` however long the generation;
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
        real: ``[B]`` int64, each row's tokens so far that are not padding (where a sliding window's ring writes).
        fewest_real: a Python lower bound of ``real``'s smallest entry (known without reading the device).
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
    real: torch.Tensor | None = None
    fewest_real: int = 0
    _call_padding: torch.Tensor | None = field(default=None, repr=False)  # this call's mask, from begin to end
    _call_fewest: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.batch < 1:
            raise ValueError(f"InferenceCache: batch={self.batch} and capacity={self.capacity} must be >= 1")
        if self.padding is None:
            self.padding = torch.zeros(self.batch, self.capacity, dtype=torch.bool, device=self.device)
        if self.static and self.cursor is None:
            self.cursor = torch.tensor(self.seen, dtype=torch.int64, device=self.padding.device)
        if self.real is None:
            self.real = (~self.padding[:, :self.seen]).sum(dim=1)  # [B] int64

    def __repr__(self) -> str:  # the dataclass's would print every padding flag and every layer's state
        return (f"InferenceCache(batch={self.batch}, capacity={self.capacity}, seen={self.seen}, "
                f"layers={len(self.layers)}, static={self.static}, device={self.padding.device})")

    def begin(self, T: int, padding_mask: torch.Tensor | None) -> None:
        """Called by the model before a forward over the next ``T`` tokens."""
        if self.seen + T > self.capacity:
            raise ValueError(f"InferenceCache: {self.seen} cached + {T} new tokens exceed its capacity={self.capacity}")
        self._call_padding = padding_mask
        if padding_mask is not None:
            self.padding[:, self.seen:self.seen + T] = padding_mask
            # one sync, at prefill: whether any position is padding, and the fewest real tokens a row brings
            anywhere, fewest = torch.stack([padding_mask.any(), (~padding_mask).sum(dim=1).min()]).tolist()
            self.has_padding = self.has_padding or bool(anywhere)
            self._call_fewest = fewest

    def end(self, T: int) -> None:
        """Called by the model after the forward: the ``T`` tokens are now cached."""
        self.seen += T
        if self.static:
            self.cursor.add_(T)
        if self._call_padding is None:
            self.real.add_(T)
            self.fewest_real += T
        else:
            self.real.add_((~self._call_padding).sum(dim=1))
            self.fewest_real += self._call_fewest
            self._call_padding = None

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

    def window(self, owner: nn.Module, window: int, padding_mask: torch.Tensor | None,
               **new: torch.Tensor) -> tuple[dict, torch.Tensor | None]:
        """A sliding window's entries: each ``new`` tensor ``[B, heads, T, Dh]`` (this call's keys, values, …) goes into
        ``owner``'s ring of each row's last ``window`` real entries, ``[B, heads, window, Dh]``, and comes back with
        the entries this call's queries can reach, and their padding ``[B, S]`` (True: no entry; None: none padded).

        The ring keeps a row's ``g``-th real (not padded) entry at slot ``g mod window``, so padding never takes a
        slot: it takes no place in the window either (:func:`zoo_kernels.attention.attention`), and however the rows
        are padded the ring holds every key a window can keep. A one-token step without padding writes its entry at
        its row's slot (a scatter at ``real``, a tensor: a compiled step's shapes and reads are the same each step) and
        gets the whole ring, in slot order — its one query sees every entry, in whatever order — with the slots not
        written yet as padding. Any other call (the prompt, a chunk, a padded step) gets each row's last
        ``window - 1`` ring entries in order (none at the first call) before its own, ``S = window - 1 + T``, and then
        leaves its last real entries in the ring."""
        state = self.state(owner)
        B, T = self.batch, next(iter(new.values())).shape[2]
        for name, t in new.items():
            if name not in state:
                state[name] = t.new_zeros(t.shape[0], t.shape[1], window, *t.shape[3:])  # [B, heads, w, Dh]
        slots = torch.arange(window, device=self.real.device)  # [w]
        if T == 1 and padding_mask is None:
            at = (self.real % window).view(B, 1, 1, 1)  # [B, 1, 1, 1]
            for name, t in new.items():
                state[name].scatter_(2, at.expand(t.shape), t)
            unwritten = None if not self.static and self.fewest_real + 1 >= window else slots > self.real[:, None]
            return {name: state[name] for name in new}, unwritten  # [B, heads, w, Dh] each, [B, w]
        call_padding = padding_mask if padding_mask is not None else torch.zeros(B, T, dtype=torch.bool,
                                                                                   device=self.real.device)
        if self.seen == 0:  # nothing in the ring yet
            entries, padding = dict(new), padding_mask
        else:
            earlier = self.real[:, None] - (window - 1) + slots[:-1]  # [B, w - 1]: each row's real-entry numbers
            take = earlier.remainder(window)[:, None, :, None]  # [B, 1, w - 1, 1]
            entries = {name: torch.cat([state[name].gather(2, take.expand(*t.shape[:2], window - 1, *t.shape[3:])), t],
                                       dim=2) for name, t in new.items()}  # [B, heads, w - 1 + T, Dh]
            padding = None
            if padding_mask is not None or self.fewest_real < window - 1:
                padding = torch.cat([earlier < 0, call_padding], dim=1)  # [B, w - 1 + T]
        # slot j now holds the row's latest real entry numbered j mod w: from this call where that number is new
        total = self.real + (~call_padding).sum(dim=1)  # [B]
        latest = (total[:, None] - 1) - (total[:, None] - 1 - slots).remainder(window)  # [B, w]
        fresh = latest >= self.real[:, None]  # [B, w]
        order = torch.argsort(call_padding.to(torch.int8), dim=1, stable=True)  # [B, T]: real positions first, in order
        source = order.gather(1, (latest - self.real[:, None]).clamp(0, T - 1))[:, None, :, None]  # [B, 1, w, 1]
        for name, t in new.items():
            ring = state[name]
            picked = t.gather(2, source.expand(*t.shape[:2], window, *t.shape[3:]))  # [B, heads, w, Dh]
            ring.copy_(torch.where(fresh[:, None, :, None], picked, ring))
        return entries, padding

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
        """Every tensor the cache holds: the padding, the real counts, the cursor (static) and each mixer's entries."""
        held = [self.padding, self.real] + ([self.cursor] if self.cursor is not None else [])
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
        # (fewest_real stays a lower bound: a selection's rows are some of these)
        return InferenceCache(len(rows), self.capacity, self.device, self.seen, pick(self.padding), layers,
                              self.has_padding, self.static, None if self.cursor is None else self.cursor.clone(),
                              pick(self.real), self.fewest_real)

    def nbytes(self) -> int:
        """Bytes held by the cached tensors (buffers at full capacity)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())
