"""``Parity``: the running parity of random bits (Grazzi et al.'s state-tracking task)."""

import numpy as np
import pytest
import torch

from recipes.data import Parity
from recipes.data.parity import in_validation


def test_every_label_is_the_parity_of_the_bits_so_far():
    data = Parity(seq_len=20, val_seq_len=33, train_size=50, val_size=10)
    for split, length in ((data.train, 20), (data.val, 33)):
        for i in range(10):
            example = split[i]
            bits, labels = example["input_ids"].tolist(), example["labels"].tolist()
            assert len(bits) == len(labels) == length and set(bits) <= {0, 1}
            assert labels == [sum(bits[: t + 1]) % 2 for t in range(length)]


def test_same_seed_same_data_another_seed_other_data():
    a, b, c = Parity(seed=3), Parity(seed=3), Parity(seed=4)
    for i in (0, 9, 1234):
        assert torch.equal(a.train[i]["input_ids"], b.train[i]["input_ids"])
        assert torch.equal(a.val[i % 512]["input_ids"], b.val[i % 512]["input_ids"])
    assert not torch.equal(a.train[0]["input_ids"], c.train[0]["input_ids"])
    longer = Parity(seq_len=64, val_seq_len=128)  # the splits draw from streams of their own: no shared prefixes
    assert not any(torch.equal(longer.val[i]["input_ids"][:64], longer.train[i]["input_ids"]) for i in range(20))


def test_at_one_length_train_and_validation_never_share_a_sequence():
    data = Parity(seq_len=8, train_size=300, val_size=40)  # 256 strings of 8 bits: sharing would be likely
    train = {tuple(data.train[i]["input_ids"].tolist()) for i in range(300)}
    val = {tuple(data.val[i]["input_ids"].tolist()) for i in range(40)}
    assert not train & val
    assert all(in_validation(np.array(bits)) for bits in val) and not any(in_validation(np.array(b)) for b in train)


def test_the_bits_are_balanced_and_the_labels_are_half_ones():
    data = Parity(seq_len=64, train_size=200)
    batch = torch.stack([data.train[i]["input_ids"] for i in range(200)])
    labels = torch.stack([data.train[i]["labels"] for i in range(200)])
    assert abs(batch.float().mean().item() - 0.5) < 0.02 and abs(labels.float().mean().item() - 0.5) < 0.03


@pytest.mark.parametrize("arguments, message", [
    (dict(seq_len=0), r"seq_len=0 must be a positive integer"),
    (dict(seq_len=4), r"must be at least 8"),
    (dict(val_seq_len=5), r"val_seq_len=5 must be at least 8"),
    (dict(batch_size=True), r"batch_size=True must be a positive integer"),
    (dict(seed=-1), r"seed=-1 must be an integer >= 0"),
])
def test_bad_settings_are_named(arguments, message):
    with pytest.raises(ValueError, match=message):
        Parity(**arguments)
