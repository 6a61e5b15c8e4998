"""Decoding for :class:`components.HybridLM`: greedy and sampled generation from a cache (docs/decoding.md)."""

import contextlib
import types
import warnings
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from components.cache import InferenceCache
from components._checks import check_flags
from components.context import Context
from zoo_kernels._backend import autocast_dtype

STATIC_CAPACITY = 64
"""A compiled step's cache capacity is rounded up to a multiple of this, so that prompts of nearby lengths
share one compiled step instead of each compiling its own."""

_compiled_steps: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model → its compiled step

ROW_SUM_MAX_ROWS = 8
"""A compiled CPU step computes a linear layer over at most this many rows (batch × 1 token) as row sums
(:class:`LinearAsRowSums`); above it, as the matrix product it is (measured, docs/decoding.md)."""


class LinearAsRowSums(TorchFunctionMode):
    """While active, ``F.linear(x, w, b)`` over at most ``max_rows`` rows of ``x`` is ``(x[..., None, :] * w).sum(-1) + b``:
    the same numbers summed in another order. Only for a step that ``torch.compile`` traces on a CPU: there the product
    and the sum fuse into one vectorised loop that reads each weight once, on every thread, where the matrix-vector
    product it replaces (one thread, a transposed read) ran at a fifth of that speed — the matrix products were
    three quarters of a compiled Llama step. Run eagerly it would build the ``[rows, out, in]`` product in memory.
    Under autocast the operands take autocast's dtype first, as ``F.linear``'s would."""

    def __init__(self, max_rows: int = ROW_SUM_MAX_ROWS):
        super().__init__()
        self.max_rows = max_rows

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, *rest = args
            bias = rest[0] if rest else kwargs.get("bias")
            if x.numel() <= self.max_rows * x.shape[-1]:
                dtype = autocast_dtype(x.device.type)  # the dtype autocast gives F.linear, not promotion's
                if dtype is not None:
                    x, weight = x.to(dtype), weight.to(dtype)
                    bias = None if bias is None else bias.to(dtype)
                y = (x.unsqueeze(-2) * weight).sum(-1)  # [..., 1, in] * [out, in] → [..., out]
                return y if bias is None else y + bias
        return func(*args, **kwargs)


def decode_step(model, token: torch.Tensor, position: torch.Tensor, cache: InferenceCache,
                tables: dict | None = None) -> torch.Tensor:
    """``token, position [B, 1]`` → next-token logits ``[B, V]``: one step from ``cache``, without the model's
    input checks (the tokens come from the model itself) or the cache's bookkeeping (the caller's).
    ``tables``: the step's rotary tables ``{dim: (cos, sin)}``, made by the caller (:func:`rotary_tables`)."""
    context = Context(position_ids=position, rotary=model.rotary, cache=cache, _tables=dict(tables or {}))
    return model.lm_head(model.mix(token, context)[:, -1])


def rotary_dims(model) -> list[int]:
    """The dimensions of the rotary tables ``model``'s modules read (each says so in ``rotary_dim``)."""
    return sorted({m.rotary_dim for m in model.modules() if getattr(m, "rotary_dim", None)})


def rotary_tables(model, position: torch.Tensor, dims: list[int]) -> dict:
    """The rotary tables of ``dims`` (:func:`rotary_dims`) at ``position [B, T]``, ``{dim: (cos, sin)}``. Made outside a
    compiled step and passed in: inside it, the compiler fuses the few dozen ops of a table into each consumer's
    loop and recomputes them per element — a whole SSD state per layer (7 ms of a 8 ms step, measured)."""
    return {dim: model.rotary(position, dim) for dim in dims}


def step_rotary_tables(model, position: torch.Tensor, dims: list[int]) -> dict:
    """The tables of many one-token steps at once: ``position [B, n]`` (step ``i`` at column ``i``) →
    ``{dim: (cos, sin)}`` each ``[B, n, dim]``, column ``i`` equal to ``rotary_tables(model, position[:, i:i+1], dims)``.
    Each step is its own row of the call, so a stretched base (past ``max_position``) comes from that step's
    own length, as in a step-by-step call; one call instead of one per step (a tenth of a compiled Llama step)."""
    B, n = position.shape
    tables = rotary_tables(model, position.reshape(B * n, 1), dims)  # {dim: ([B·n, 1, dim], ...)}
    return {dim: tuple(t.view(B, n, dim) for t in pair) for dim, pair in tables.items()}


def compiled_step(model):
    """:func:`decode_step` through ``torch.compile``, one per model (kept while the model lives).

    Each model compiles its own copy of the function: torch.compile keeps its compiled graphs per code object,
    at most 8 (``recompile_limit``) before it falls back to running uncompiled, so with one shared function a few
    models and batch sizes in one process (a benchmark) would silently end up eager. A second batch size or
    capacity makes those sizes dynamic (torch's automatic dynamic shapes) instead of compiling again per size.

    On a CPU the step's generated code is called from C++ (inductor's ``cpp_wrapper``), not from a Python wrapper
    that launches each kernel: a one-token step is a few milliseconds, and the Python launches were a fifth of
    it (docs/decoding.md). The first compilation takes longer (the wrapper is C++ too); inductor caches it on disk.
    On a GPU the step is a CUDA graph (``mode="reduce-overhead"``): one launch replays every kernel of the step,
    reading and writing the cache where the prompt left it (:meth:`InferenceCache.keep`, :func:`decoder`)."""
    if model not in _compiled_steps:
        code = decode_step.__code__.replace(co_name=f"decode_step_{len(_compiled_steps)}")
        own = types.FunctionType(code, decode_step.__globals__, code.co_name, decode_step.__defaults__)
        if uses_cuda_graphs(model):
            _compiled_steps[model] = torch.compile(own, mode="reduce-overhead")
        else:
            _compiled_steps[model] = torch.compile(own, options={"cpp_wrapper": True})
    return _compiled_steps[model]


def uses_cuda_graphs(model) -> bool:
    """Whether ``model``'s compiled step is a CUDA graph: every parameter on a CUDA device."""
    return all(p.device.type == "cuda" for p in model.parameters())


def takes_row_sums(model, batch: int) -> bool:
    """Whether ``model``'s compiled step at ``batch`` one-token rows runs under :class:`LinearAsRowSums`: on a CPU
    (a CUDA graph keeps the GPU's matrix products) at up to ``ROW_SUM_MAX_ROWS`` rows."""
    return not uses_cuda_graphs(model) and batch <= ROW_SUM_MAX_ROWS


def sample_next(logits: torch.Tensor, *, temperature: float = 0.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """``logits [B, V]`` → next tokens ``[B]``: the argmax at temperature 0, else a draw from the
    softmax of ``logits / temperature`` restricted to the ``top_k`` best tokens and to the smallest set
    whose probability reaches ``top_p`` (nucleus), in that order."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float()  # [B, V]
    # Shifted so that the best is 0 before dividing: a tiny temperature sends the rest to -inf (greedy, in the limit)
    # rather than the best to inf, whose softmax was NaN (torch.multinomial's error); the softmax is shift-invariant.
    logits = restricted_logits((logits - logits.amax(dim=-1, keepdim=True)) / temperature, top_k=top_k, top_p=top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]


def restricted_logits(logits: torch.Tensor, *, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """``logits [B, V]`` with ``-inf`` outside the ``top_k`` best (ties at the k-th kept) and then outside the
    smallest set whose probability reaches ``top_p`` — what Hugging Face's top-k and top-p warpers keep."""
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the better tokens: keep while it is below top_p
        sorted_logits = sorted_logits.masked_fill(before >= top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def check_sampling(max_new_tokens: int, temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens={max_new_tokens!r} must be an integer >= 0")
    if not temperature >= 0 or temperature == float("inf"):  # (NaN fails every comparison)
        raise ValueError(f"generate: temperature={temperature} must be a finite number >= 0 (0 is greedy)")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"generate: top_k={top_k!r} must be a positive integer or None")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"generate: top_p={top_p} must lie in (0, 1] or be None")
    if temperature == 0 and (top_k is not None or top_p is not None):  # (ignored, the greedy tokens would come back)
        given = ", ".join(f"{name}={value}" for name, value in (("top_k", top_k), ("top_p", top_p)) if value is not None)
        raise ValueError(f"generate: {given} restricts a sampled draw, and temperature=0 is greedy (the argmax): give a "
                         "temperature > 0 to sample")


class DecodingUnsupported(ValueError):
    """A generation a model cannot do: a compiled one with a sequence mixer that keeps no decoding state."""


def stateless_mixers(model, cache: InferenceCache) -> list[str]:
    """After the prompt: the blocks whose sequence mixer (and every module inside it) left no state in ``cache``, as
    ``"block i's sequence mixer Name"``. Such a mixer (a user's, written for training alone) would see only the new
    token at each step, and decode something else than its full forward, without a word."""
    from components.block import block_mixers

    found = []
    for i, block in enumerate(model.blocks):
        mixer, _ = block_mixers(block)
        if mixer is not None and not any(module in cache.layers for module in mixer.modules()):
            found.append(f"block {i}'s sequence mixer {type(mixer).__name__}")
    return found


def recomputing_step(model, out: torch.Tensor, prompt_length: int, positions: torch.Tensor,
                     padding_mask: torch.Tensor | None):
    """The step of a model with a mixer that keeps no decoding state: the full forward over the prompt and the
    ``i`` tokens generated so far (written into ``out [B, T + n]`` before the step), its last position's logits.
    Exact by construction, at the cost of the whole sequence at every step. ``positions [B, T + n - 1]``."""
    def one_step(i: int, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        length = prompt_length + i
        mask = None if padding_mask is None else F.pad(padding_mask, (0, i), value=False)  # [B, T + i]
        hidden = model.hidden_states(out[:, :length], position_ids=positions[:, :length], padding_mask=mask)
        return model.lm_head(hidden[:, -1])  # [B, V]

    return one_step


def left_padded(rows: list[list[int]], device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Token id lists of any lengths → ``(ids [B, T], padding_mask [B, T])`` on ``device``, left-padded with id 0 (the
    mask, True at the padding, keeps the model from reading it) to the longest: prompts of different lengths as
    :func:`generate` takes them (give it ``padding_mask=None`` when ``padding_mask.any()`` is False)."""
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)  # [B, T]
    padding = torch.zeros(len(rows), width, dtype=torch.bool, device=device)  # [B, T]
    for row, tokens in enumerate(rows):
        ids[row, width - len(tokens):] = torch.tensor(tokens, dtype=torch.long)
        padding[row, :width - len(tokens)] = True
    return ids, padding


@torch.no_grad()
def generate(model, input_ids: torch.Tensor, max_new_tokens: int, *, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, stop_token: int | None = None,
             padding_mask: torch.Tensor | None = None, generator: torch.Generator | None = None,
             compile: bool = False, stop_when: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """See :meth:`components.HybridLM.generate`."""
    check_sampling(max_new_tokens, temperature, top_k, top_p)
    check_flags("generate", compile=compile)
    if stop_when is not None and not callable(stop_when):
        raise ValueError(f"generate: stop_when must be a function of the new tokens [B, n] -> bool [B]; got {stop_when!r}")
    if stop_token is not None and not (isinstance(stop_token, int) and 0 <= stop_token < model.vocab_size):
        raise ValueError(f"generate: stop_token={stop_token!r} is not a token of the vocabulary [0, {model.vocab_size})")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        got = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"generate: input_ids must be a [B, T] tensor of token ids (one prompt: ids[None]); got {got}")
    B, T = input_ids.shape
    if T == 0:
        raise ValueError("generate: the prompt is empty; give at least one token per sequence")
    if B == 0:  # (the cache would refuse a batch of 0, naming itself)
        raise ValueError("generate: no prompts (input_ids is a batch of 0); give at least one")
    if padding_mask is not None and not (isinstance(padding_mask, torch.Tensor) and padding_mask.dtype == torch.bool
                                         and padding_mask.shape == input_ids.shape):  # the positions are made from it
        got = (f"{padding_mask.dtype} {tuple(padding_mask.shape)}" if isinstance(padding_mask, torch.Tensor)
               else type(padding_mask).__name__)
        raise ValueError(f"generate: padding_mask must be a bool tensor of input_ids' shape {tuple(input_ids.shape)} "
                         f"(True = padding); got {got}")
    if padding_mask is not None and bool(padding_mask[:, -1].any()):
        raise ValueError("generate: prompts must be left-padded (the last position of each one a real token)")
    real = ~padding_mask if padding_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    positions = (real.long().cumsum(dim=1) - 1).clamp_min(0)  # each sequence counts from its first real token
    if not model.extrapolate and T + max_new_tokens - 1 > model.max_seq_len:  # the steps skip the model's checks
        raise ValueError(f"generate: a prompt of {T} tokens and {max_new_tokens} new ones (the last one not fed back) "
                         f"take {T + max_new_tokens - 1} positions, past max_seq_len={model.max_seq_len}; "
                         f"{'shorten the prompt' if T > model.max_seq_len else 'generate fewer tokens'}, or let the "
                         "model extrapolate (model.extrapolate = True: RoPE's base NTK-stretched past it; the "
                         "generate command's --extrapolate)")
    capacity = T + max(max_new_tokens, 1)
    if compile:
        capacity = -(-capacity // STATIC_CAPACITY) * STATIC_CAPACITY
    cache = InferenceCache(B, capacity, device=input_ids.device, static=compile)
    # the prompt's last position only: the logits of the others would be thrown away
    hidden = model.hidden_states(input_ids, position_ids=positions, padding_mask=padding_mask, cache=cache)
    logits = model.lm_head(hidden[:, -1])  # [B, V]
    position = positions[:, -1:]  # [B, 1]
    out = torch.empty(B, T + max_new_tokens, dtype=input_ids.dtype, device=input_ids.device)
    out[:, :T] = input_ids
    stateless = stateless_mixers(model, cache) if max_new_tokens > 1 else []
    if stateless and compile:
        raise DecodingUnsupported(
            f"generate: {', '.join(stateless)} keeps no decoding state in context.cache, so there is no step to "
            "compile; without compile each token recomputes the whole sequence (a mixer decodes step by step by "
            "keeping what the next step needs in context.cache.state(self): docs/architecture.md, the mixer contract)")
    if stateless:
        warnings.warn(
            f"generate: {', '.join(stateless)} keeps no decoding state in context.cache: each new token recomputes "
            "the whole sequence with the full forward (exact, but each step costs the whole sequence); a mixer "
            "decodes step by step by keeping what the next step needs in context.cache.state(self) "
            "(docs/architecture.md, the mixer contract)")
        later = position + torch.arange(1, max_new_tokens, device=position.device)  # [B, n - 1]
        step = recomputing_step(model, out, T, torch.cat([positions, later], dim=1), padding_mask)
    else:
        step = decoder(model, cache, position, max_new_tokens, compile=compile)
    done = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    ended = torch.zeros(B, dtype=torch.bool, device=input_ids.device)  # stop_when has held (it does not change tokens)
    for i in range(max_new_tokens):
        token = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        if stop_token is not None:
            token = token.masked_fill(done, stop_token)
            done |= token == stop_token
        out[:, T + i] = token
        if stop_when is not None:
            ended |= stop_criterion(stop_when, out[:, T:T + i + 1], B).to(ended.device)
            if bool((ended | done).all()):
                return out[:, :T + i + 1]
        if i == max_new_tokens - 1 or (stop_token is not None and bool(done.all())):
            out[:, T + i + 1:] = stop_token if stop_token is not None else 0
            break
        position = position + 1
        logits = step(i + 1, token[:, None], position)
    return out


def stop_criterion(stop_when, new: torch.Tensor, batch: int) -> torch.Tensor:
    """``stop_when(new [B, n])`` as a bool tensor ``[B]``, or a named error."""
    ended = torch.as_tensor(stop_when(new))
    if ended.shape != (batch,) or ended.dtype != torch.bool:
        raise ValueError(f"generate: stop_when must return a bool tensor [B] = [{batch}], one entry per sequence; got "
                         f"{ended.dtype} {tuple(ended.shape)}")
    return ended


def decoder(model, cache: InferenceCache, position: torch.Tensor, max_new_tokens: int, *, compile: bool = False):
    """One generation's step as ``(i, token [B, 1], position [B, 1]) → logits [B, V]``, for the ``i``-th new token
    (``i >= 1``): :func:`decode_step` between the cache's bookkeeping, eager or compiled (``compile``).

    The rotary tables of all steps are made before the first (:func:`step_rotary_tables`, one call instead of a
    few dozen small ops per step), and the step skips the model's input checks: the tokens come from the model, and
    :func:`generate` has checked the positions against ``max_seq_len`` for the whole generation.

    Compiled, every step passes the same objects but the token and position (of the same shapes and dtypes): each
    step's tables are copied into the same two buffers, and the step reads no Python value that changes between
    steps (the cache's write position is the tensor ``cursor``). So the guards torch.compile checks before each
    call (about 0.35 ms of a 5 ms Llama step on a CPU) can only pass once they have passed at the first steps: the
    first two are checked in full (and compile when nothing compiled fits), the later ones run only the tensor
    checks (``skip_guard_eval_unsafe``: shapes, strides and dtypes, which would raise rather than run a wrong graph)."""
    dims = rotary_dims(model)
    later = position + torch.arange(1, max(max_new_tokens, 2), device=position.device)  # [B, n - 1]
    tables = step_rotary_tables(model, later, dims)  # {dim: ([B, n-1, dim], ...)}
    graphs = compile and uses_cuda_graphs(model)
    row_sums = compile and takes_row_sums(model, position.shape[0])
    if compile:
        step = compiled_step(model)
        buffers = {dim: tuple(t[:, :1].clone() for t in pair) for dim, pair in tables.items()}  # {dim: ([B, 1, dim], ...)}
        # the same memory at every step (the entries are written in place): a CUDA graph reads and writes it where
        # it lies, instead of copying each into memory of its own before each replay (and refusing the writes)
        for t in cache.tensors() + [t for pair in buffers.values() for t in pair]:
            torch._dynamo.mark_static_address(t)

    def one_step(i: int, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cache.begin(1, None)
        if not compile:
            step_tables = {dim: tuple(t[:, i - 1:i] for t in pair) for dim, pair in tables.items()}  # {dim: ([B, 1, dim], ...)}
            logits = decode_step(model, token, pos, cache, step_tables)
        else:
            for dim, pair in tables.items():
                for buffer, table in zip(buffers[dim], pair):
                    buffer.copy_(table[:, i - 1:i])
            if graphs:  # a CUDA graph's outputs are overwritten by its next replay: the last step's logits are used
                torch.compiler.cudagraph_mark_step_begin()
            with LinearAsRowSums() if row_sums else contextlib.nullcontext():
                if i <= 2:  # the first step compiles; a cache entry changed by it would compile once more at the second
                    logits = step(model, token, pos, cache, buffers)
                else:
                    with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                        logits = step(model, token, pos, cache, buffers)
        cache.end(1)
        return logits

    return one_step
