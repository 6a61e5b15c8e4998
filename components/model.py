"""``HybridLM``: embedding → blocks built from a layer pattern → final RMSNorm → LM head."""

import functools
import warnings
from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from components.bindings import MixerFactory, binding_factory, binding_spec
from components.block import Block, WholeBlock, block_mixers
from components._checks import check_flags, check_number, check_on_device, check_positive
from components.cache import InferenceCache
from components.context import Context
from components.generation import generate
from components.norm import RMSNorm
from components.pattern import PatternError, parse_tokens
from components.rotary import RotaryEmbedding
from components.sequence import SSD, InnerFuncAttention, QCAttention
from components.state import MLP, CDMoE, CohesiveMoE, ExpansiveMoE, RoutedMoE, SharedExpertMoE

DEFAULT_MIXERS: dict[str, MixerFactory] = {
    "A": QCAttention,
    "M": MLP,
    "S": SSD,
    "I": InnerFuncAttention,
    "E": CDMoE,
    "R": RoutedMoE,
    "H": SharedExpertMoE,
    "C": CohesiveMoE,
    "X": ExpansiveMoE,
}
"""Letters bound when a recipe does not bind them (docs/architecture.md)."""


def bound_mixers(mixers: Mapping[str, MixerFactory | Mapping] | None) -> dict[str, MixerFactory]:
    """Every letter's factory: ``mixers`` (factories or specs) over :data:`DEFAULT_MIXERS`."""
    for letter in mixers or {}:
        if not (isinstance(letter, str) and len(letter) == 1 and "A" <= letter <= "Z"):
            raise ValueError(f"HybridLM: mixers key {letter!r} is not a pattern letter: each binding's key is one "
                             "capital letter A–Z (a pattern's token 'SM' is two letters, bound separately)")
    return {letter: binding_factory(letter, b) for letter, b in {**DEFAULT_MIXERS, **(mixers or {})}.items()}


def factory_class(factory) -> type | None:
    """The class behind a binding's factory (a class or a ``partial`` of one); None for a function."""
    cls = factory.func if isinstance(factory, functools.partial) else factory
    return cls if isinstance(cls, type) else None


def mixer_kind(factory) -> str | None:
    """``"sequence"`` or ``"state"``: the slot that the class behind ``factory`` declares as ``mixer_slot``, as every
    zoo mixer does; None for a class that declares none, or a function."""
    return getattr(factory_class(factory), "mixer_slot", None)


def document_positions(document_ids: torch.Tensor) -> torch.Tensor:
    """``document_ids [B, T]`` → ``[B, T]`` positions counted from each document's first token."""
    B, T = document_ids.shape
    t = torch.arange(T, device=document_ids.device).expand(B, T)  # [B, T]
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]  # [B, T]
    first = torch.cummax(torch.where(starts, t, 0), dim=1).values  # [B, T] the current document's first token
    return t - first


class HybridLM(nn.Module):
    """A language model whose blocks are listed by a layer pattern.

    Args:
        vocab_size: number of token ids.
        d_model: model width, passed to every mixer factory.
        pattern: the layer pattern, e.g. ``"SM SM SM AM"`` (see :mod:`components.pattern`).
        mixers: letter → factory ``d_model -> nn.Module`` or spec ``{"class_path", "init_args"}``
            (:mod:`components.bindings`), merged over :data:`DEFAULT_MIXERS`. Each factory is called
            once per block, so no two blocks share parameters.
        max_seq_len: RoPE's trained range, and the longest sequence accepted unless ``extrapolate``.
        extrapolate: accept sequences longer than ``max_seq_len`` (default False); RoPE's base is then
            NTK-stretched, per sequence, past ``max_seq_len`` (:class:`RotaryEmbedding`).
        rope_ntk_factor: the NTK stretch's factor ``f`` (default 1.0; Doge-320M uses 4).
        tie_embeddings: share the embedding matrix with the LM head (default False).
        rope_base: base of the shared rotary table (default 10000).
        init_std: if set, re-initialise every ``nn.Linear`` and ``nn.Embedding`` weight from
            ``N(0, init_std²)`` (GPT-2 style 0.02). Default None keeps PyTorch's own initialisation
            (embeddings ``N(0, 1)``, linear layers ``U(±1/√fan_in)``): on MQAR the 0.02 init kept a
            2-layer attention model on the recall plateau for thousands of steps, the default
            solved it in under 1,000 (docs/attention.md). Other parameters always keep their
            component's own initialisation.
        norm_eps: RMSNorm epsilon of the blocks' and the final norms (default 1e-6).
        residual_scale: learned per-channel scales on every residual, Doge's (default False).
        post_norm: the blocks whose norms come after their mixers, on what each adds to the residual stream (OLMo 2's
            reordered norm, :class:`Block`): False none (default), True every block, or a list of the pattern's block
            tokens (``["AM"]``: the attention blocks of ``"GM×3 AM"``, as OLMo-Hybrid's). A whole block keeps its own.
        padding_idx: a token whose embedding row starts at zero and never learns (its gradient is zero), as
            ``nn.Embedding(padding_idx=…)`` and Hugging Face's models with a ``pad_token_id`` (default None).
        checkpoint_blocks: activation checkpointing per block (default False): in training, each block keeps
            only its input for the backward and runs its forward again there — the activations of one block
            at a time instead of all of them, for about one more forward (docs/performance.md).
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        pattern: str,
        mixers: Mapping[str, MixerFactory] | None = None,
        *,
        max_seq_len: int = 2048,
        extrapolate: bool = False,
        tie_embeddings: bool = False,
        rope_base: float = 10000.0,
        rope_ntk_factor: float = 1.0,
        init_std: float | None = None,
        norm_eps: float = 1e-6,
        residual_scale: bool = False,
        post_norm: bool | list[str] = False,
        padding_idx: int | None = None,
        checkpoint_blocks: bool = False,
    ):
        super().__init__()
        check_positive("HybridLM", vocab_size=vocab_size, d_model=d_model, max_seq_len=max_seq_len)
        for name, value in (("rope_base", rope_base), ("rope_ntk_factor", rope_ntk_factor), ("init_std", init_std)):
            check_number("HybridLM", name, value, low=0, above=True, optional=name == "init_std")
        check_number("HybridLM", "norm_eps", norm_eps, low=0)
        check_flags("HybridLM", extrapolate=extrapolate, tie_embeddings=tie_embeddings, residual_scale=residual_scale,
                    checkpoint_blocks=checkpoint_blocks)
        self.vocab_size, self.d_model, self.pattern, self.max_seq_len = vocab_size, d_model, pattern, max_seq_len
        self.extrapolate, self.checkpoint_blocks = extrapolate, checkpoint_blocks
        self.bindings = bound_mixers(mixers)
        tokens = parse_tokens(pattern)
        self._check_bound(tokens)
        self._warn_if_misbound(tokens, set(mixers or {}))
        post_norm_tokens = self._post_norm_tokens(post_norm, tokens)

        if padding_idx is not None and not (isinstance(padding_idx, int) and 0 <= padding_idx < vocab_size):
            raise ValueError(f"HybridLM: padding_idx={padding_idx!r} must be a token id in [0, vocab_size={vocab_size})")
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
        self.rotary = RotaryEmbedding(max_seq_len, base=rope_base, scaling_factor=rope_ntk_factor)
        self.blocks = nn.ModuleList(self._place(t, d_model, norm_eps, residual_scale, str(t) in post_norm_tokens)
                                    for t in tokens)
        self.norm = RMSNorm(d_model, eps=norm_eps)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        if init_std is not None:
            self._init_weights(init_std)
            if padding_idx is not None:
                with torch.no_grad():
                    self.embedding.weight[padding_idx].zero_()
        if tie_embeddings:
            self.lm_head.weight = self.embedding.weight
        self.tie_embeddings = tie_embeddings
        self.register_load_state_dict_pre_hook(_rename_whole_blocks_inside_blocks)

    def _warn_if_misbound(self, tokens, given: set[str]) -> None:
        """Warn when a letter bound but absent from the pattern could be one of its letters that took its default
        (``{"Q": QCAttention}`` for ``"AM×2"``): a mixer of the kind of that letter's slot, or of a kind unknown here.
        Spare bindings of another kind (a family's, or a helper's reused across patterns) stay quiet."""
        slots = {**{t.state: "state" for t in tokens if t.state}, **{t.seq: "sequence" for t in tokens if t.seq}}
        defaulted = sorted(set(slots) - given)
        kinds = {slots[letter] for letter in defaulted}
        unused = [letter for letter in sorted(given - set(slots))
                  if mixer_kind(self.bindings[letter]) in kinds | {None}]
        if unused and defaulted:
            warnings.warn(f"HybridLM: mixers binds {', '.join(unused)}, which pattern {self.pattern!r} does not use, "
                          f"while its {', '.join(defaulted)} take their defaults: a letter bound under the wrong name?",
                          stacklevel=3)

    def _check_bound(self, tokens) -> None:
        """Every letter bound, and bound to a mixer of its slot's kind where the class says which (``mixer_slot``)."""
        for t in tokens:
            for letter, column, slot in ((t.seq, t.column, "sequence"), (t.state, t.column + 1, "state")):
                if letter is None:
                    continue
                if letter not in self.bindings:
                    bound = ", ".join(sorted(self.bindings))
                    raise PatternError(self.pattern, column, f"letter {letter!r} is not bound (bound: {bound})")
                kind = mixer_kind(self.bindings[letter])
                if kind is not None and kind != slot:
                    name = factory_class(self.bindings[letter]).__name__
                    place, alone = ("first", f"-{letter}") if slot == "sequence" else ("second", f"{letter}-")
                    raise PatternError(self.pattern, column, f"letter {letter!r} binds {name}, a {kind} mixer, in the "
                                       f"{place} place of {str(t)!r}, a {slot} mixer's (a token is a sequence mixer, "
                                       f"then a state mixer; {alone!r} is a {kind} mixer alone)")

    def _post_norm_tokens(self, post_norm, tokens) -> set[str]:
        """The block tokens ``post_norm`` names (True: every one), each checked to be the pattern's."""
        used = [str(t) for t in tokens]
        if isinstance(post_norm, bool):
            return set(used) if post_norm else set()
        if not isinstance(post_norm, (list, tuple)) or not all(isinstance(t, str) for t in post_norm):
            raise ValueError(f"HybridLM: post_norm={post_norm!r} must be True, False or a list of block tokens such as "
                             "['AM']")
        strangers = [t for t in post_norm if t not in used]
        if strangers:
            raise ValueError(f"HybridLM: post_norm names blocks {strangers} that pattern {self.pattern!r} does not have "
                             f"(its blocks: {', '.join(dict.fromkeys(used))})")
        return set(post_norm)

    def _place(self, token, d_model: int, norm_eps: float, residual_scale: bool, post_norm: bool) -> nn.Module:
        """The block of one pattern token: a :class:`Block` around its mixers, or the whole block its letter binds."""
        first = self._build(token.seq, d_model)
        if isinstance(first, WholeBlock):
            if post_norm:
                raise ValueError(f"HybridLM: post_norm names block {str(token)!r}, whose letter binds a whole block "
                                 f"({type(first).__name__}) with norms of its own")
            if token.state is not None:
                raise PatternError(self.pattern, token.column + 1, f"letter {token.seq!r} binds a whole block "
                                   f"({type(first).__name__}), which has no state mixer: write its token {token.seq}-")
            first.token = str(token)
            return first
        return Block(d_model, first, self._build(token.state, d_model), token=str(token), norm_eps=norm_eps,
                     residual_scale=residual_scale, post_norm=post_norm)

    def _build(self, letter: str | None, d_model: int) -> nn.Module | None:
        if letter is None:
            return None
        module = self.bindings[letter](d_model)
        if not isinstance(module, nn.Module):
            raise TypeError(f"HybridLM: the binding of letter {letter!r} returned {type(module).__name__}, not an nn.Module")
        if getattr(module, "d_model", d_model) != d_model:  # else a shape error at the first forward
            raise ValueError(f"HybridLM: the binding of letter {letter!r} built a {type(module).__name__} of "
                             f"d_model={module.d_model} for a model of d_model={d_model}; a factory is called with "
                             "the model's d_model and must build the mixer at that width")
        return module

    def binding_specs(self) -> dict[str, dict]:
        """``{letter: {"class_path", "init_args"}}`` for every letter the pattern uses: what a checkpoint
        records so the same modules can be rebuilt (:func:`components.bindings.binding_spec`)."""
        used = sorted({letter for t in parse_tokens(self.pattern) for letter in (t.seq, t.state) if letter})
        return {letter: binding_spec(letter, self.bindings[letter]) for letter in used}

    def _init_weights(self, std: float) -> None:
        for module in self.modules():
            # a meta tensor holds no values to draw: skipped, as drawing them costs about a millisecond a tensor (the
            # paper-size recipes are built on meta to check and size them)
            if isinstance(module, (nn.Linear, nn.Embedding)) and not module.weight.is_meta:
                nn.init.normal_(module.weight, mean=0.0, std=std)

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        *,
        position_ids: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        cache: InferenceCache | None = None,
        document_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``input_ids [B, T]`` → final-normed hidden states ``[B, T, d_model]``.

        ``position_ids [B, T]`` default to ``0..T-1`` (after the cached tokens, when decoding; from each
        document's first token with ``document_ids``); ``padding_mask [B, T]`` is True at padding. With
        ``cache`` (:meth:`new_cache`) the tokens continue the cached ones: the prompt at prefill, then a
        few (usually one) per step. ``document_ids [B, T]`` (integers, for packed training batches)
        keeps every document to itself: a packed row computes what its documents would alone.
        """
        self._check_input(input_ids, position_ids, padding_mask, cache, document_ids)
        B, T = input_ids.shape
        seen = cache.seen if cache is not None else 0
        if position_ids is None and document_ids is not None:
            position_ids = document_positions(document_ids)  # [B, T]
        if position_ids is None:
            position_ids = torch.arange(seen, seen + T, device=input_ids.device).expand(B, T)  # [B, T]
        if cache is not None:
            cache.begin(T, padding_mask)
        context = Context(position_ids=position_ids, padding_mask=padding_mask, rotary=self.rotary, cache=cache,
                          document_ids=document_ids)
        x = self.mix(input_ids, context)
        if cache is not None:
            cache.end(T)
        return x

    def mix(self, input_ids: torch.Tensor, context: Context) -> torch.Tensor:
        """Embedding → blocks → final norm: ``[B, T]`` → ``[B, T, d_model]``, with no checks and no cache
        bookkeeping (:meth:`hidden_states` does both): what a compiled decoding step runs."""
        x = self.embedding(input_ids)  # [B, T, d_model]
        recompute = self.checkpoint_blocks and torch.is_grad_enabled() and context.cache is None
        for block in self.blocks:
            # non-reentrant: the context's tensors need no gradient, and RNG states are replayed as they were
            x = checkpoint(block, x, context, use_reentrant=False) if recompute else block(x, context)
        return self.norm(x)

    def forward(self, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        """``input_ids [B, T]`` → logits ``[B, T, vocab_size]``; keywords as :meth:`hidden_states`."""
        return self.lm_head(self.hidden_states(input_ids, **kwargs))

    def new_cache(self, batch: int, capacity: int, *, static: bool = False) -> InferenceCache:
        """An empty decoding cache for ``batch`` sequences of at most ``capacity`` tokens in all (``static``:
        fixed-shape steps, for a compiled step; :class:`~components.cache.InferenceCache`)."""
        return InferenceCache(batch, capacity, device=self.embedding.weight.device, static=static)

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, stop_token: int | None = None,
                 padding_mask: torch.Tensor | None = None, generator: torch.Generator | None = None,
                 compile: bool = False, stop_when: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """Continue each prompt of ``input_ids [B, T]`` by ``max_new_tokens`` tokens → ``[B, T + max_new_tokens]``.

        Greedy at ``temperature=0`` (default); otherwise sampled from the softmax at that temperature,
        restricted to the ``top_k`` best tokens and the ``top_p`` nucleus, drawing from ``generator`` (``top_k`` or
        ``top_p`` at temperature 0 is refused: greedy would ignore them).
        A sequence that produces ``stop_token`` stops: its later positions hold ``stop_token``, and
        generation ends when every sequence has stopped. ``stop_when(new [B, n]) → bool [B]``, called after each
        new token with those so far (a stop string found in their text, say), ends generation early once it has held
        for every sequence (or it has produced ``stop_token``): the output is then ``[B, T + n]``, the tokens the
        same as without it. Prompts of different lengths are
        left-padded, ``padding_mask [B, T]`` True at the padding; each sequence's positions count from
        its first real token. The prompt goes through the chunked forward once (prefill); each new
        token is one step from the cache (attention: keys and values; SSD: a constant-size state).
        ``compile=True`` runs each step through ``torch.compile`` from a fixed-shape cache: the first call
        compiles (seconds to a minute), later steps and calls reuse it (docs/decoding.md).
        """
        return generate(self, input_ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        stop_token=stop_token, padding_mask=padding_mask, generator=generator, compile=compile,
                        stop_when=stop_when)

    def auxiliary_losses(self) -> dict[str, torch.Tensor]:
        """The auxiliary losses of the last forward, by module name.

        The one mechanism for them (docs/architecture.md): a mixer with an auxiliary loss (a routed MoE's balancing
        loss) assigns a scalar tensor to its attribute ``aux_loss`` in every forward.
        """
        return {
            name: module.aux_loss
            for name, module in self.named_modules()
            if isinstance(getattr(module, "aux_loss", None), torch.Tensor)
        }

    def router_z_losses(self) -> dict[str, torch.Tensor]:
        """ST-MoE's router z-loss of the last forward, by module name: every routed MoE whose router gives its logits
        assigns the mean ``logsumexp²`` of them over its tokens to ``router_z_loss``."""
        return {
            name: module.router_z_loss
            for name, module in self.named_modules()
            if isinstance(getattr(module, "router_z_loss", None), torch.Tensor)
        }

    def expert_loads(self) -> dict[str, torch.Tensor]:
        """The expert load of the last forward, by module name: every MoE assigns to ``expert_load``
        a vector ``[n_experts]`` of the fraction of routed assignments each expert took."""
        return {
            name: module.expert_load
            for name, module in self.named_modules()
            if isinstance(getattr(module, "expert_load", None), torch.Tensor)
        }

    def sequence_loads(self) -> dict[str, torch.Tensor]:
        """Each MoE's load within each sequence of the last forward, by module name: ``[B, n_experts]``, a row the
        fraction of that sequence's assignments each expert took (0 for a sequence of padding alone)."""
        return {name: module.sequence_load for name, module in self.named_modules()
                if isinstance(getattr(module, "sequence_load", None), torch.Tensor)}

    def update_routing_balance(self) -> None:
        """One step of every self-balancing router's bias (:class:`~components.state.router.SigmoidRouter`, DeepSeek-V3's
        auxiliary-loss-free balancing) from the loads of the training forwards since the last: the recipe calls it after
        each optimizer step; a loop of one's own calls it likewise."""
        for module in self.modules():
            if module is not self and callable(getattr(module, "update_balance", None)):
                module.update_balance()

    def _check_input(self, input_ids, position_ids, padding_mask, cache=None, document_ids=None) -> None:
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"HybridLM: input_ids must be an integer tensor [B, T]; got {input_ids.dtype} {tuple(input_ids.shape)}"
            )
        T = input_ids.shape[1] + (cache.seen if cache is not None else 0)
        if T > self.max_seq_len and not self.extrapolate:
            raise ValueError(
                f"HybridLM: sequence length {T} exceeds max_seq_len={self.max_seq_len}; build the model with a "
                "larger max_seq_len, or with extrapolate=True to stretch RoPE (NTK) past it"
            )
        if cache is not None and cache.batch != input_ids.shape[0]:
            raise ValueError(f"HybridLM: the cache holds {cache.batch} sequences; input_ids has {input_ids.shape[0]}")
        if cache is not None and cache.layers and not set(cache.layers) <= set(self.modules()):
            # (its states are keyed by the mixers that wrote them: this model's would find none, and decode its
            # tokens as if nothing came before them, at positions after the cached ones)
            raise ValueError("HybridLM: the cache holds the decoding state of another model's mixers; make this "
                             "model's own with model.new_cache(batch, capacity)")
        if input_ids.numel():
            low, high = torch.aminmax(input_ids)  # one pass
            rule = f"HybridLM: token ids must lie in [0, vocab_size={self.vocab_size})"
            # In training, an assert on the device: no host sync (the data modules check their ids).
            check_on_device((low >= 0) & (high < self.vocab_size), rule,
                            lambda: f"{rule}; got values in [{int(low)}, {int(high)}]", sync=not self.training)
        for name, t in (("position_ids", position_ids), ("padding_mask", padding_mask), ("document_ids", document_ids)):
            if t is not None and (not isinstance(t, torch.Tensor) or t.shape != input_ids.shape):
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"HybridLM: {name} must have the shape of input_ids {tuple(input_ids.shape)}; got {got}")
        if padding_mask is not None and padding_mask.dtype != torch.bool:
            raise ValueError(f"HybridLM: padding_mask must be a bool tensor (True = padding); got {padding_mask.dtype}")
        for name, t in (("position_ids", position_ids), ("document_ids", document_ids)):
            if t is not None and t.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"HybridLM: {name} must be an integer tensor; got {t.dtype}")
        if position_ids is not None and position_ids.numel():
            low, high = torch.aminmax(position_ids)
            limit = "" if self.extrapolate else f" and below max_seq_len={self.max_seq_len}"
            rule = f"HybridLM: position_ids must be >= 0{limit} (extrapolate=True stretches RoPE past it)"
            ok = (low >= 0) if self.extrapolate else (low >= 0) & (high < self.max_seq_len)
            check_on_device(ok, rule, lambda: f"{rule}; got values in [{int(low)}, {int(high)}]", sync=not self.training)

    # ---- parameter accounting -------------------------------------------------------------------

    def summary(self) -> str:
        """A table: one row per block (token, mixer classes, parameters), then the totals."""
        rows = [("#", "token", "sequence mixer", "state mixer", "params", "active")]
        for i, block in enumerate(self.blocks):
            mixers = block_mixers(block)
            rows.append((
                str(i), block.token + (" (post-norm)" if getattr(block, "post_norm", False) else ""),
                *(getattr(m, "summary_name", type(m).__name__) if m is not None else "-" for m in mixers),
                f"{count_parameters(block):,}", f"{count_active_parameters(block):,}",
            ))
        head = 0 if self.tie_embeddings else self.lm_head.weight.numel()
        rows.append(("", "embed", "Embedding", "", f"{self.embedding.weight.numel():,}", f"{self.embedding.weight.numel():,}"))
        rows.append(("", "head", "RMSNorm + Linear" + (" (tied)" if self.tie_embeddings else ""), "",
                     f"{head + self.norm.weight.numel():,}", f"{head + self.norm.weight.numel():,}"))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        line = lambda r: "  ".join(  # noqa: E731 - a formatting helper local to this table
            cell.rjust(w) if c in (0, 4, 5) else cell.ljust(w) for c, (cell, w) in enumerate(zip(r, widths))
        )
        rule = "-" * len(line(rows[0]))
        total, active = count_parameters(self), count_active_parameters(self)
        return "\n".join([
            f"HybridLM  pattern={self.pattern!r}  blocks={len(self.blocks)}  d_model={self.d_model}  vocab={self.vocab_size}",
            line(rows[0]), rule, *map(line, rows[1:]), rule,
            f"total parameters: {total:,}   active per token: {active:,}",
        ])


def count_parameters(module: nn.Module) -> int:
    """Unique parameters of ``module`` (tied weights counted once)."""
    return sum(p.numel() for p in module.parameters())


def count_active_parameters(module: nn.Module) -> int:
    """Parameters one token uses. A module that activates only part of itself per token (a routed MoE)
    defines ``active_parameters() -> int``; every other module counts all of its parameters."""
    if hasattr(module, "active_parameters"):
        return module.active_parameters()
    own = sum(p.numel() for p in module.parameters(recurse=False))
    seen = {id(p) for p in module.parameters(recurse=False)}
    total = own
    for child in module.children():
        if any(id(p) in seen for p in child.parameters()):
            # A child sharing a parameter with us (tied weights): count only what is new.
            total += sum(p.numel() for p in child.parameters() if id(p) not in seen)
            continue
        total += count_active_parameters(child)
        seen.update(id(p) for p in child.parameters())
    return total


def _rename_whole_blocks_inside_blocks(model: HybridLM, state_dict: dict, prefix: str, *args) -> None:
    """Load a state dict written when a whole block (the Expresser) sat inside a ``Block`` as its sequence
    mixer (``blocks.i.sequence_mixer.…``, now ``blocks.i.…``)."""
    for i, block in enumerate(model.blocks):
        if isinstance(block, WholeBlock):
            old = f"{prefix}blocks.{i}.sequence_mixer."
            for key in [k for k in state_dict if k.startswith(old)]:
                state_dict[f"{prefix}blocks.{i}." + key[len(old):]] = state_dict.pop(key)
