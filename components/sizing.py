"""Size a model to a target parameter count by solving for one width, as the papers' equal-parameter
ablations do ("adjust the dimension size of FFN so that any combination has the same total")."""

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from components.bindings import MixerFactory, binding_spec, import_class
from components.model import HybridLM, bound_mixers, count_parameters
from components.pattern import parse_tokens


@dataclass
class SizeTarget:
    """Solve ``arg`` of the mixers bound to ``letters`` (one common value) so that the model's total
    parameter count is as close as possible to ``params``.

    Attributes:
        params: the target total parameter count.
        letters: the letters whose mixers take the solved width (default ``["M"]``); a string is its characters
            (``"MR"`` and ``"M, R"`` are ``["M", "R"]``).
        arg: the keyword the width is passed as (default ``d_ff``).
        multiple_of: the width is a multiple of this (default 8).
    """

    params: int
    letters: list[str] | str = field(default_factory=lambda: ["M"])  # (str: the command line's `letters: MR`)
    arg: str = "d_ff"
    multiple_of: int = 8

    def __post_init__(self):
        for name in ("params", "multiple_of"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"size_to: {name}={value!r} must be a positive integer")
        if isinstance(self.letters, str):  # `letters: MR` in YAML: each character a letter (`M, R` too)
            self.letters = [letter for letter in self.letters if not letter.isspace() and letter != ","]
        if not self.letters or not all(isinstance(letter, str) and len(letter) == 1 for letter in self.letters):
            raise ValueError(f"size_to: letters={self.letters!r} must be a non-empty list of pattern letters, e.g. [M, R]")


def solve_width(count: Callable[[int], int], target: int, *, multiple_of: int = 8, limit: int = 1 << 20) -> int:
    """The multiple of ``multiple_of`` whose ``count(width)`` is closest to ``target`` (``count`` must grow
    with the width). Raises if even the smallest width overshoots the target.

    The search starts where the line through the counts at the two smallest widths meets the target — the
    answer itself where the count grows linearly with the width, as a model's with its FFN or experts' width
    does — then gallops out from there to a bracket and bisects it, so a model is built a handful of times
    rather than twice per bit of the width."""
    count = functools.cache(count)  # a model built once per width
    if count(multiple_of) > target:
        smaller = f"; multiple_of={multiple_of} makes {multiple_of} the smallest width tried: 1 tries every width" \
            if multiple_of > 1 and count(1) <= target else ""
        raise ValueError(f"target of {target:,} parameters is below the smallest model ({count(multiple_of):,} "
                         f"parameters at width {multiple_of}){smaller}")
    # in units of multiple_of from here; the bracket's invariant: count(low·m) ≤ target < count(high·m)
    slope = count(2 * multiple_of) - count(multiple_of)
    guess = 1 + (target - count(multiple_of)) // slope if slope > 0 else 1
    top = max(1, limit // multiple_of)
    low = high = max(1, min(guess, top))
    step = 1
    while count(low * multiple_of) > target:  # the line overshoots: step down (width 1·m fits, so this ends)
        high, low, step = low, max(1, low - step), 2 * step
    while count(high * multiple_of) <= target:  # or it falls short: step up, as far as the limit
        if high == top:
            raise ValueError(f"target of {target:,} parameters needs a width above {limit:,}")
        low, high, step = high, min(high + step, top), 2 * step
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if count(mid * multiple_of) <= target else (low, mid)
    best = min((low, high), key=lambda n: abs(count(n * multiple_of) - target))
    return best * multiple_of


def sized_mixers(
    vocab_size: int,
    d_model: int,
    pattern: str,
    mixers: Mapping[str, MixerFactory] | None,
    target: SizeTarget,
    **model_kwargs,
) -> tuple[dict[str, MixerFactory], int]:
    """The bindings with ``target.letters`` given the solved width, and that width.

    Models are built on the ``meta`` device while solving, so no memory is allocated.
    """
    bindings = bound_mixers(mixers)
    unknown = [letter for letter in target.letters if letter not in bindings]
    if unknown or not target.letters:
        raise ValueError(f"size_to: letters={target.letters} must name bound letters (bound: {', '.join(sorted(bindings))})")
    used = {letter for t in parse_tokens(pattern) for letter in (t.seq, t.state)}
    if not any(letter in used for letter in target.letters):
        raise ValueError(f"size_to: none of letters={target.letters} occurs in pattern {pattern!r}, so no width can be solved")

    for letter in target.letters:
        _check_takes(bindings[letter], letter, target.arg)

    def with_width(width: int) -> dict[str, MixerFactory]:
        return {**bindings, **{letter: functools.partial(bindings[letter], **{target.arg: width}) for letter in target.letters}}

    @functools.cache  # the search asks for some widths twice (its bracket's ends); each is built once
    def count(width: int) -> int:
        with torch.device("meta"):
            return count_parameters(HybridLM(vocab_size, d_model, pattern, with_width(width), **model_kwargs))

    step = target.multiple_of
    if count(step) == count(2 * step):
        raise ValueError(f"size_to: the parameter count does not change with {target.arg} of letters={target.letters} "
                         f"({count(step):,} at {target.arg}={step} and at {2 * step}), so it cannot size the model")
    width = solve_width(count, target.params, multiple_of=target.multiple_of)
    return with_width(width), width


def _check_takes(factory: MixerFactory, letter: str, arg: str) -> None:
    """Refuse a width keyword the letter's mixer does not take, naming the keywords it does take."""
    try:  # the class behind every recordable binding (a recipe's, from jsonargparse, takes **kwargs as a callable)
        target = import_class(binding_spec(letter, factory)["class_path"])
    except ValueError:  # a binding that names no class (a lambda): its own signature
        target = factory.func if isinstance(factory, functools.partial) else factory
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):  # not introspectable: the build will say
        return
    if arg in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    takes = [name for name, p in parameters.items() if name != "d_model" and p.kind is not inspect.Parameter.VAR_POSITIONAL]
    raise ValueError(f"size_to: arg={arg!r} is not an argument of the mixer of letter {letter!r}, "
                     f"{getattr(target, '__name__', type(target).__name__)} (it takes: {', '.join(takes)})")


def describe_size(model: nn.Module, target: SizeTarget, width: int) -> str:
    total = count_parameters(model)
    return (f"sized: {target.arg}={width} for {', '.join(target.letters)} → {total:,} parameters "
            f"(target {target.params:,}, {100 * (total - target.params) / target.params:+.2f}%)")

