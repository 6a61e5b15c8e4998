"""``Parity``: the running parity of a bit string, generated on the fly — the state-tracking task of Grazzi et al.,
"Unlocking State-Tracking in Linear RNNs Through Negative Eigenvalues" (ICLR 2025).

A sequence is ``T`` random bits (tokens 0 and 1); the target at position ``t`` is the parity of bits ``0 … t`` (their
sum mod 2), so every position is a question and ``val/acc`` is the fraction of positions answered right (chance 0.5).
A recurrent mixer solves it by flipping a sign at each 1: a transition with eigenvalue -1, which a state that only
decays (eigenvalues in ``[0, 1]``: the SSD's, the delta rule's with ``beta <= 1``) cannot express.

Determinism and disjointness: example ``i`` of a split is generated from its own seed, so any worker makes the same
data. When the two splits have one length, a sequence belongs to the validation split iff the CRC32 of its bits is
0 mod 16, and each split rejects the other's, so train and validation never share a sequence; at another validation
length (``val_seq_len``) they cannot.
"""

import zlib

import numpy as np
import torch
from torch.utils.data import Dataset

from recipes.data.order import GeneratedTask

VALIDATION_MODULUS = 16


def make_sequence(rng: np.random.Generator, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """One example: ``(input_ids [seq_len], labels [seq_len])`` as int64 arrays, the labels the running parity."""
    bits = rng.integers(0, 2, size=seq_len)
    return bits.astype(np.int64), (np.cumsum(bits) % 2).astype(np.int64)


def in_validation(bits: np.ndarray) -> bool:
    return zlib.crc32(bits.astype(np.int8).tobytes()) % VALIDATION_MODULUS == 0


class ParitySplit(Dataset):
    """``size`` parity examples of one split; example ``i`` is the same on every call and every worker. ``disjoint``:
    keep only this split's sequences (by CRC32), when the other split has the same length."""

    def __init__(self, split: str, size: int, seq_len: int, seed: int, *, disjoint: bool):
        self.split, self.size, self.seq_len, self.seed, self.disjoint = split, size, seq_len, seed, disjoint
        self.stream = {"train": 0, "val": 1}[split]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict:
        for attempt in range(10_000):
            bits, labels = make_sequence(np.random.default_rng([self.seed, self.stream, i, attempt]), self.seq_len)
            if not self.disjoint or in_validation(bits) == (self.split == "val"):
                return {"input_ids": torch.from_numpy(bits), "labels": torch.from_numpy(labels)}
        raise RuntimeError(f"Parity: no {self.split} sequence found for example {i} in 10,000 attempts")


class Parity(GeneratedTask):
    """Running parity of random bits; ``val/acc`` is the fraction of positions whose parity is right (chance 0.5).

    Args:
        seq_len: training length ``T`` (default 64), at least 8 (shorter strings are too few to keep the two
            splits apart).
        val_seq_len: validation length (default ``seq_len``); longer, it measures length generalisation (the model's
            ``max_seq_len`` must allow it).
        train_size, val_size: examples per split (defaults 2¹⁶ and 512).
        batch_size: examples per batch (default 32).
        seed: the data seed (default 0): the examples and the training order.
        num_workers: dataloader workers (default 0).
    """

    vocab_size = 2

    def __init__(self, seq_len: int = 64, *, val_seq_len: int | None = None, train_size: int = 2**16,
                 val_size: int = 512, batch_size: int = 32, seed: int = 0, num_workers: int = 0):
        super().__init__()
        val_seq_len = seq_len if val_seq_len is None else val_seq_len
        for name, value in (("seq_len", seq_len), ("val_seq_len", val_seq_len), ("train_size", train_size),
                            ("val_size", val_size), ("batch_size", batch_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Parity: {name}={value!r} must be a positive integer")
        if min(seq_len, val_seq_len) < 8:
            raise ValueError(f"Parity: seq_len={seq_len} and val_seq_len={val_seq_len} must be at least 8: shorter bit "
                             "strings are too few to keep training and validation sequences apart")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:  # numpy's generators take no negative seed
            raise ValueError(f"Parity: seed={seed!r} must be an integer >= 0")
        self.batch_size, self.num_workers, self.order_seed = batch_size, num_workers, seed
        disjoint = val_seq_len == seq_len
        self.train = ParitySplit("train", train_size, seq_len, seed, disjoint=disjoint)
        self.val = self.held_out = ParitySplit("val", val_size, val_seq_len, seed, disjoint=disjoint)
