"""What the command lines share: argparse types, so that a number out of range is argparse's one-line
``error: argument --batch: 0 must be >= 1``, not a torch shape error (or a division by zero) later; and the
"did you mean" of a misspelt name."""

import argparse
import difflib


def bounded(kind, low, *, above: bool = False):
    """An argparse type: a ``kind`` number ``>= low`` (``> low`` when ``above``)."""
    def parse(text: str):
        value = kind(text)
        if value < low or (above and value == low):
            raise argparse.ArgumentTypeError(f"{text} must be {'>' if above else '>='} {low}")
        return value
    parse.__name__ = kind.__name__  # argparse's "invalid int value: 'x'"
    return parse


positive_int = bounded(int, 1)  # sizes, lengths, counts of rounds and threads


def close_matches(words, known, *, n: int = 1, cutoff: float = 0.6) -> list[str]:
    """The names among ``known`` that the ``words`` a user typed most likely meant (``n`` per word, difflib's
    ``cutoff``), in order, without repeats."""
    known = sorted(known)
    meant = [match for word in words for match in difflib.get_close_matches(word, known, n=n, cutoff=cutoff)]
    return list(dict.fromkeys(meant))


def did_you_mean(words, known, **kwargs) -> str:
    """``did you mean a, b?`` for :func:`close_matches`, or ``""`` when nothing is close."""
    meant = close_matches(words, known, **kwargs)
    return f"did you mean {', '.join(meant)}?" if meant else ""
