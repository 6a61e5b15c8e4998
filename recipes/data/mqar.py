"""``MQAR``: multi-query associative recall, generated on the fly (Zoology's task, Wonderful Matrices v2's harder form).

A sequence of length ``T`` holds ``num_pairs`` key-value pairs at its start, ``k₁ v₁ k₂ v₂ …``; after
them every key comes back once as a query, at positions drawn with Zoology's power law (``a = 0.01``:
most queries close to the pairs, a long tail far away). The target at a query position is the value
that followed that key. Every other position holds a random filler token (Wonderful Matrices v2; Zoology used 0).

Vocabulary: keys are drawn from ``[1, V/2)``, values and fillers from ``[V/2, V)``; so a filler never
looks like a key, and no spurious pair can be read from the noise. Keys are unique within a sequence.

Determinism and disjointness: sample ``i`` of a split is generated from its own seed, so any worker
makes the same data; a sequence belongs to the test split iff the CRC32 of its tokens is 0 mod 16,
and each split rejects the other's sequences, so train and test never share a sequence.
"""

import math
import zlib

import numpy as np
import torch
from torch.utils.data import Dataset

from zoo_kernels.linear_cross_entropy import IGNORE_INDEX
from recipes.data.order import GeneratedTask

TEST_MODULUS = 16


def power_law_positions(rng: np.random.Generator, slots: int, count: int, a: float) -> np.ndarray:
    """``count`` distinct slots out of ``slots``, slot ``i`` drawn with probability ∝ ``(i+1)^(a-1)``."""
    p = a * np.arange(1, slots + 1, dtype=np.float64) ** (a - 1)
    return rng.choice(slots, size=count, replace=False, p=p / p.sum())


def make_sequence(rng: np.random.Generator, vocab_size: int, seq_len: int, num_pairs: int, power_a: float):
    """One MQAR example: ``(input_ids [seq_len], labels [seq_len])`` as int64 arrays."""
    half = vocab_size // 2
    keys = rng.choice(np.arange(1, half), size=num_pairs, replace=False)
    # distinct: MQAR checks num_pairs < vocab_size/2, fewer than the vocab_size - half values
    values = rng.choice(np.arange(half, vocab_size), size=num_pairs, replace=False)
    # Tokens are one longer than the model's input: targets are the next token (standard LM shift).
    tokens = rng.integers(half, vocab_size, size=seq_len + 1)  # random fillers
    tokens[0 : 2 * num_pairs : 2], tokens[1 : 2 * num_pairs : 2] = keys, values
    # Queries go into even offsets of the space after the pairs, so the position after each is free.
    context = 2 * num_pairs
    slots = (seq_len - context) // 2
    query_pos = context + 2 * power_law_positions(rng, slots, num_pairs, power_a)  # [num_pairs]
    tokens[query_pos] = keys
    labels = np.full(seq_len + 1, IGNORE_INDEX)
    labels[query_pos + 1] = values
    return tokens[:-1].astype(np.int64), labels[1:].astype(np.int64)


def is_test_sequence(input_ids: np.ndarray) -> bool:
    return zlib.crc32(input_ids.tobytes()) % TEST_MODULUS == 0


class MQARSplit(Dataset):
    """``size`` MQAR examples of one split; example ``i`` is the same on every call and every worker."""

    def __init__(self, split: str, size: int, seed: int, *, min_pairs: int | None = None, **task):
        self.split, self.size, self.seed, self.task, self.min_pairs = split, size, seed, task, min_pairs
        self.stream = {"train": 0, "test": 1}[split]

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict:
        for attempt in range(10_000):
            rng = np.random.default_rng([self.seed, self.stream, i, attempt])
            task = self.task
            if self.min_pairs is not None:  # a mixture of difficulties: this example's pair count
                task = {**task, "num_pairs": int(rng.integers(self.min_pairs, task["num_pairs"] + 1))}
            input_ids, labels = make_sequence(rng, **task)
            if is_test_sequence(input_ids) == (self.split == "test"):
                return {"input_ids": torch.from_numpy(input_ids), "labels": torch.from_numpy(labels)}
        raise RuntimeError(f"MQAR: no {self.split} sequence found for example {i} in 10,000 attempts")


class MQAR(GeneratedTask):
    """Multi-query associative recall; accuracy on the query positions is logged as ``val/acc``.

    Args:
        vocab_size: tokens (default 8192, Wonderful Matrices v2); keys from the lower half, values from the upper.
        seq_len: ``T`` (default 256).
        num_pairs: key-value pairs per sequence (default ``T/4``); needs ``T ≥ 4·num_pairs`` and
            ``num_pairs < vocab_size/2``.
        power_a: exponent of the query-position power law (default 0.01, Zoology).
        train_min_pairs: if set, each training example draws its pair count uniformly from
            ``[train_min_pairs, num_pairs]`` (test examples always have ``num_pairs``). Zoology also
            trains on a mixture of pair counts; at ``T=128`` with 32 pairs the easier examples are what
            lets a small attention model leave the recall plateau (docs/attention.md).
        train_size, test_size: examples per split (defaults 2¹⁸ and 1024, Wonderful Matrices v2 Table 5).
        batch_size: examples per batch (default 64).
        seed: the data seed (default 0): the examples and the training order.
        num_workers: dataloader workers (default 0).
    """

    def __init__(
        self,
        vocab_size: int = 8192,
        seq_len: int = 256,
        num_pairs: int | None = None,
        *,
        power_a: float = 0.01,
        train_min_pairs: int | None = None,
        train_size: int = 2**18,
        test_size: int = 1024,
        batch_size: int = 64,
        seed: int = 0,
        num_workers: int = 0,
    ):
        super().__init__()
        num_pairs = seq_len // 4 if num_pairs is None else num_pairs
        for name, value in (("vocab_size", vocab_size), ("seq_len", seq_len), ("num_pairs", num_pairs),
                            ("train_size", train_size), ("test_size", test_size), ("batch_size", batch_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"MQAR: {name}={value!r} must be a positive integer")
        if seq_len < 4 * num_pairs:
            raise ValueError(
                f"MQAR: seq_len={seq_len} is too short for num_pairs={num_pairs}: the pairs take 2·{num_pairs} "
                f"positions and their queries 2·{num_pairs} more, so seq_len must be at least {4 * num_pairs}"
            )
        if num_pairs >= vocab_size // 2:
            raise ValueError(
                f"MQAR: num_pairs={num_pairs} needs more distinct keys than the {vocab_size // 2 - 1} of "
                f"vocab_size={vocab_size} (keys come from [1, vocab_size/2))"
            )
        if train_min_pairs is not None and not 1 <= train_min_pairs <= num_pairs:
            raise ValueError(f"MQAR: train_min_pairs={train_min_pairs!r} must lie in [1, num_pairs={num_pairs}]")
        if not (isinstance(power_a, (int, float)) and math.isfinite(power_a) and power_a > 0):
            raise ValueError(f"MQAR: power_a={power_a} must be a finite positive number")
        if not isinstance(seed, int) or seed < 0:  # numpy's generators take no negative seed
            raise ValueError(f"MQAR: seed={seed!r} must be an integer >= 0")
        self.vocab_size, self.batch_size, self.num_workers, self.order_seed = vocab_size, batch_size, num_workers, seed
        task = dict(vocab_size=vocab_size, seq_len=seq_len, num_pairs=num_pairs, power_a=power_a)
        self.train = MQARSplit("train", train_size, seed, min_pairs=train_min_pairs, **task)
        self.test = self.held_out = MQARSplit("test", test_size, seed, **task)
