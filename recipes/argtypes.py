"""What the command lines share: argparse types, so that a number out of range is argparse's one-line
``error: argument --batch: 0 must be >= 1``, not a torch shape error (or a division by zero) later; and the
"did you mean" of a misspelt name."""

import argparse
import difflib
import math
import sys
from pathlib import Path


def bounded(kind, low, *, above: bool = False):
    """An argparse type: a ``kind`` number ``>= low`` (``> low`` when ``above``), and finite
    (``float("nan")`` passes every comparison: ``--progress nan`` and ``--limit nan`` were taken)."""
    def parse(text: str):
        value = kind(text)
        if not math.isfinite(value) or value < low or (above and value == low):
            finite = "a finite number " if kind is float else ""
            raise argparse.ArgumentTypeError(f"{text} must be {finite}{'>' if above else '>='} {low}")
        return value
    parse.__name__ = kind.__name__  # argparse's "invalid int value: 'x'"
    return parse


positive_int = bounded(int, 1)  # sizes, lengths, counts of rounds and threads


def device(text: str) -> str:
    """An argparse type: a torch device this machine has (``cpu``, ``cuda``, ``cuda:1``, ``mps``), checked before
    anything is loaded: torch's own message came from deep inside ``torch.load`` ("Attempting to deserialize object
    on a CUDA device")."""
    import torch

    try:
        where = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device (cpu, cuda, cuda:N, mps)") from None
    if where.type not in ("cpu", "cuda", "mps"):  # (meta holds no weights: torch's error came from deep in the load)
        raise argparse.ArgumentTypeError(f"{text}: a device of type {where.type!r} is not one this runs on "
                                         "(cpu, cuda, cuda:N, mps)")
    if where.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            build = f"this torch {torch.__version__} is a CPU build" if torch.version.cuda is None else "no GPU is visible"
            raise argparse.ArgumentTypeError(f"{text}: CUDA is not available here ({build})")
        if where.index is not None and where.index >= count:
            raise argparse.ArgumentTypeError(f"{text}: this machine has {count} CUDA device(s), cuda:0-{count - 1}")
    elif where.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text}: MPS is not available here")
    return where.type if where.type == "cpu" else str(where)  # (torch.load's map_location refuses "cpu:0")


def utf8_text(text: str) -> str:
    """An argparse type: ``text`` once it is UTF-8. Python hands on bytes that no UTF-8 text has (a Latin-1 shell, a
    binary pipe) as lone surrogates, which every tokenizer's encode refused with a traceback."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        byte = text[error.start].encode("utf-8", "surrogateescape")
        raise argparse.ArgumentTypeError(f"not UTF-8 text: byte 0x{byte.hex()} at character {error.start} "
                                         "(give the text in UTF-8)") from None
    return text


def text_file(path: str) -> str:
    """An argparse type: the whole text of the UTF-8 file at ``path`` (``-``: stdin), read when the arguments are
    parsed, so a missing file is argparse's one-line error before anything loads."""
    if path == "-":
        try:
            # (stdin decodes by the locale: strict, or bytes kept as surrogates; a byte-order mark is not the text's)
            return utf8_text(sys.stdin.read()).removeprefix("\ufeff")
        except UnicodeDecodeError as error:
            raise argparse.ArgumentTypeError(f"stdin: not UTF-8 text ({error.reason} at byte {error.start})") from None
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentTypeError(f"stdin: {error}") from None
    try:
        return Path(path).read_text(encoding="utf-8-sig")  # (-sig: a leading byte-order mark is not the text's)
    except FileNotFoundError:
        raise argparse.ArgumentTypeError(f"no such file: {path}") from None
    except (IsADirectoryError, UnicodeDecodeError) as error:
        raise argparse.ArgumentTypeError(f"{path}: not a UTF-8 text file ({type(error).__name__})") from None


def text_path(path: str) -> str:
    """An argparse type: ``path``, once it reads as a UTF-8 text file (:func:`text_file`, without stdin), for a
    command that reads it later."""
    if path == "-":
        raise argparse.ArgumentTypeError("a file is read here, not stdin")
    text_file(path)
    return path


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
