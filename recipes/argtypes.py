"""Argparse types shared by the command lines: a number out of range is argparse's one-line
``error: argument --batch: 0 must be >= 1``, not a torch shape error (or a division by zero) later."""

import argparse


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
