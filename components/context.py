"""``Context``: what a sequence mixer may need beyond its input, made once per model forward."""

import math
from dataclasses import dataclass, field

import torch

from components.cache import InferenceCache
from components.rotary import RotaryEmbedding
from zoo_kernels._finite import seen_so_far, split_finite
from zoo_kernels.attention import attention, document_runs, round_bias


@dataclass
class Context:
    """Per-forward information shared by all sequence mixers.

    Attributes:
        position_ids: ``[B, T]`` integer positions.
        padding_mask: ``[B, T]`` bool, True where the token is padding; None for no padding.
        rotary: the model's one RotaryEmbedding; its tables are computed once per dimension.
        cache: when decoding, the :class:`InferenceCache` the mixers read and extend; None otherwise.
        document_ids: ``[B, T]`` integers, for packed documents: no mixer lets a token see another
            document (attention keeps to the document, the SSD's state and conv restart at its start);
            None: each row is one sequence. A document is a run of equal ids; they are stored renumbered
            0, 1, … per run (:func:`zoo_kernels.attention.document_runs`), so an id that comes back after
            another is a new document for every mixer.
    """

    position_ids: torch.Tensor
    padding_mask: torch.Tensor | None = None
    rotary: RotaryEmbedding = field(default_factory=RotaryEmbedding)
    cache: InferenceCache | None = None
    document_ids: torch.Tensor | None = None
    _tables: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.position_ids.dim() != 2:
            raise ValueError(f"Context: position_ids must be [B, T]; got shape {tuple(self.position_ids.shape)}")
        ids = self.document_ids
        if ids is not None:
            if ids.shape != self.position_ids.shape or ids.dtype.is_floating_point or ids.dtype == torch.bool:
                raise ValueError(f"Context: document_ids must be integers of the shape of position_ids "
                                 f"{tuple(self.position_ids.shape)}; got {ids.dtype} {tuple(ids.shape)}")
            if self.cache is not None:
                raise ValueError("Context: document_ids are for packed training batches, not for decoding with a cache")
            self.document_ids = document_runs(ids)  # [B, T] non-decreasing: mixers may compare ids for equality
        mask = self.padding_mask
        if mask is not None:
            if mask.dtype != torch.bool:
                raise ValueError(f"Context: padding_mask must be a bool tensor (True = padding); got {mask.dtype}")
            if mask.shape != self.position_ids.shape:
                raise ValueError(f"Context: padding_mask {tuple(mask.shape)} must have the shape of position_ids "
                                 f"{tuple(self.position_ids.shape)}")

    @property
    def document_starts(self) -> torch.Tensor | None:
        """``[B, T]`` bool, True where a document begins after another (never at ``t = 0``); None without documents."""
        if self.document_ids is None:
            return None
        ids = self.document_ids
        return torch.cat([torch.zeros_like(ids[:, :1], dtype=torch.bool), ids[:, 1:] != ids[:, :-1]], dim=1)

    def attend(self, owner, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bias: torch.Tensor | None = None,
               keep_window: int | None = None, backend: str = "auto") -> torch.Tensor:
        """Causal attention of an attention layer ``owner``: queries ``q [B, T, H, Dh]`` over this call's keys
        ``k [B, T, Hk, Dh]``, values ``v [B, T, Hv, Dh]`` and per-key bias ``[B, H, T]`` — and, when decoding,
        over every cached one too (this call's are appended to the cache first). Keys with fewer heads than
        the values are repeated to the values' heads (InnerFuncAttention); the kernel repeats both to ``H``.

        Decoding keeps the non-finite bookkeeping of :func:`zoo_kernels.attention.attention` per token instead of
        per step, with the cache's record of which heads of each sequence have met a non-finite key, value or bias
        (``nonfinite``, ``[B, H]``: 0, or NaN for such a head), so a step costs ``O(T)`` checks, not ``O(S)``.
        A call of several tokens (the prompt) or with a padding mask cleans each entry as it enters the cache
        (:meth:`_exact_entries`). A one-token step without padding stores its entries as they are (:func:`_step`):
        a head that met one is NaN from then on whatever its cached entries hold, and every other head's are finite.
        Neither reads anything back. On a CPU, where reading back costs nothing, a call whose entries are all finite,
        in a cache that has met none, skips both (5-7% of an eager step at width 256): one sum says so.
        Returns ``[B, T, H, Dh]``."""
        if self.cache is None:
            return attention(q, _heads(k, v.shape[2]), v, bias=bias, causal=True, key_padding_mask=self.padding_mask,
                             keep_window=keep_window, document_ids=self.document_ids, backend=backend)
        T = q.shape[1]
        # rounded as attention() rounds it, before the finite pass and the cache: each entry once, not the whole
        # cached bias at every step
        bias = round_bias(bias, q.dtype)
        state = self.cache.state(owner)
        flag = None  # [B, T, H]: 0, or NaN where a non-finite entry reaches the output
        if "nonfinite" in state or not self._known_finite(k, v, bias):
            entries = _step if T == 1 and self.padding_mask is None else self._exact_entries
            k, v, bias, flag = entries(state, q, k, v, bias)
            self.cache.keep(owner, "nonfinite", flag[:, -1].contiguous(), T)  # [B, H], the same strides each call
        if keep_window is not None and bias is None and keep_window < self.cache.capacity:
            # a sliding window: a ring of each row's last keep_window keys and values (O(w) memory and reading)
            ring, padding = self.cache.window(owner, keep_window, self.padding_mask, k=k.transpose(1, 2),
                                              v=v.transpose(1, 2))
            k, v = ring["k"].transpose(1, 2), ring["v"].transpose(1, 2)  # [B, S, H·, Dh]: S = w, or w - 1 + T
        else:
            # kept head-major ([B, heads, capacity, Dh]) and handed on as [B, S, heads, Dh] views: each head's keys
            # are contiguous rows, as attention reads them (over time-major ones a CPU step's SDPA took 10% longer,
            # the step 6-9%)
            k = self.cache.append(owner, "k", k.transpose(1, 2), dim=2).transpose(1, 2)  # [B, S, Hk, Dh]
            v = self.cache.append(owner, "v", v.transpose(1, 2), dim=2).transpose(1, 2)  # [B, S, Hv, Dh]
            bias = self.cache.append(owner, "bias", bias, dim=2) if bias is not None else None  # [B, H, S]
            padding = self.cache.key_padding(T)  # [B, S] or None
        y = attention(q, _heads(k, v.shape[2]), v, bias=bias, causal=True, key_padding_mask=padding,
                      keep_window=keep_window, backend=backend, check_finite=False)
        return y if flag is None else y + flag[..., None].to(y.dtype)  # y + NaN is NaN whatever y is; y + 0 is y

    def _known_finite(self, *tensors: torch.Tensor | None) -> bool:
        """True when every entry of ``tensors`` is known finite without a cost on the device: on a CPU, by one
        reduction each (a sum is finite only if every entry is; an overflowing sum says False, which only takes
        the flagging path). Always False on an accelerator, where reading the answer would stall the host, in a
        compiled region, and with a fixed-shape cache (a compiled step's cache keeps the same entries at every step)."""
        tensors = [t for t in tensors if t is not None]
        if self.cache.static or torch.compiler.is_compiling() or any(t.device.type != "cpu" for t in tensors):
            return False
        total = sum(t.sum(dtype=torch.float32) for t in tensors)  # 0-dim; NaN or inf if any entry is
        return math.isfinite(total.item())

    def _exact_entries(self, state: dict, q, k, v, bias):
        """This call's entries with the non-finite ones set to 0, and ``[B, T, H]``: NaN at a query that a
        non-finite key, value or bias reaches (one of this call's, unless padded, or one the cache met before)."""
        H = q.shape[2]
        (k, bad_k), (v, bad_v) = split_finite(k, 1), split_finite(v, 1)  # bad: [B, T, heads]
        bad = _heads(bad_k, H) | _heads(bad_v, H)  # [B, T, H]
        if bias is not None:
            bias, bad_bias = split_finite(bias, 0)
            bad = bad | bad_bias.transpose(1, 2)
        if self.padding_mask is not None:
            bad = bad & ~self.padding_mask[:, :, None]  # a padded key is never attended to
        reach = seen_so_far(bad)  # [B, T, H]
        if "nonfinite" in state:
            reach = reach | state["nonfinite"].isnan()[:, None]  # heads that met one in an earlier call
        flag = torch.where(reach, float("nan"), 0.0).to(q.dtype)  # [B, T, H]
        return k, v, bias, flag

    def zero_padding(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, T, ...]`` with the padded positions set to 0 — whatever they held, NaN or inf
        included — so that nothing computed from them can reach a valid position."""
        if self.padding_mask is None:
            return x
        if x.shape[:2] != self.padding_mask.shape:
            raise ValueError(f"Context: the input's [B, T] = {tuple(x.shape[:2])} does not match the padding mask "
                             f"{tuple(self.padding_mask.shape)}")
        return x.masked_fill(self.padding_mask.view(*self.padding_mask.shape, *(1,) * (x.dim() - 2)), 0.0)

    @classmethod
    def default(cls, x: torch.Tensor, rotary: RotaryEmbedding | None = None) -> "Context":
        """Positions ``0..T-1`` and no padding for ``x [B, T, ...]``: what a mixer assumes alone."""
        B, T = x.shape[:2]
        position_ids = torch.arange(T, device=x.device).expand(B, T)  # [B, T]
        return cls(position_ids=position_ids, rotary=rotary or RotaryEmbedding())

    @classmethod
    def for_input(cls, owner: str, x: torch.Tensor, context: "Context | None") -> "Context":
        """``context`` for a mixer ``owner``'s input ``x [B, T, d]``, or :meth:`default` when None. A context made
        for another batch or length is refused by name: it would fail as a shape error deep inside the mixer,
        or be read at the wrong positions."""
        if context is None:
            return cls.default(x)
        if context.position_ids.shape != x.shape[:2]:
            raise ValueError(f"{owner}: the context is for [B, T] = {tuple(context.position_ids.shape)}, the input is "
                             f"{tuple(x.shape)}: make the Context from this input's positions")
        return context

    def rotary_tables(self, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` each ``[B, T, dim]`` for this context's positions, shared across layers."""
        if dim not in self._tables:
            self._tables[dim] = self.rotary(self.position_ids, dim)
        return self._tables[dim]


def _heads(t: torch.Tensor, n: int) -> torch.Tensor:
    """``[B, ·, h, ·] → [B, ·, n, ·]``, each head repeated ``n / h`` times."""
    return t if t.shape[2] == n else t.repeat_interleave(n // t.shape[2], dim=2)


def _step(state: dict, q, k, v, bias):
    """A one-token step's entries as they are, and ``[B, 1, H]``: NaN for a head whose key, value or bias is
    non-finite now or was before, 0 for the others — in four ops (five with a bias; the output's ``+ flag`` one more)
    and no host sync: an eager GPU step is its launches. ``0 · x`` is 0 for a finite ``x`` and NaN for NaN or ±inf,
    and a sum of zeros stays 0, so no finite entries can overflow the flag (``add(…, alpha=0)`` adds ``0 · x``)."""
    B, H, Hv, Hk = q.shape[0], q.shape[2], v.shape[2], k.shape[2]
    zeros = (k * 0)[:, :, :, None].add(v.view(B, 1, Hk, Hv // Hk, -1), alpha=0)  # [B, 1, Hk, Hv / Hk, Dh]
    earlier = state.get("nonfinite")  # [B, H]
    if earlier is None:
        earlier = q.new_zeros(B, H)
    flag = earlier.view(B, 1, Hv, H // Hv) + zeros.sum(-1).view(B, 1, Hv, 1).to(q.dtype)  # [B, 1, Hv, H / Hv]
    flag = flag.view(B, 1, H)
    if bias is not None:  # [B, H, 1]
        flag = flag.add(bias.transpose(1, 2), alpha=0)
    return k, v, bias, flag
