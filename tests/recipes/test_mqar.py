import zlib

import numpy as np
import pytest
import torch

from recipes.data import MQAR
from recipes.data.mqar import IGNORE_INDEX, is_test_sequence


def examples(data: MQAR, split: str, n: int):
    dataset = data.train if split == "train" else data.test
    return [dataset[i] for i in range(n)]


@pytest.fixture(scope="module")
def small():
    return MQAR(vocab_size=256, seq_len=64, num_pairs=16, batch_size=8, test_size=64, train_size=1000)


def test_every_query_target_is_the_value_that_followed_its_key(small):
    for example in examples(small, "train", 50):
        ids, labels = example["input_ids"].tolist(), example["labels"].tolist()
        pairs = {ids[2 * i]: ids[2 * i + 1] for i in range(16)}
        queries = [p for p, label in enumerate(labels) if label != IGNORE_INDEX]
        assert len(queries) == 16
        for p in queries:
            assert p >= 32  # after the pairs
            assert ids[p] in pairs and labels[p] == pairs[ids[p]]
        assert sorted(ids[p] for p in queries) == sorted(pairs)  # each key asked once


def test_keys_are_unique_and_fillers_never_look_like_keys(small):
    for example in examples(small, "test", 30):
        ids, labels = example["input_ids"], example["labels"]
        keys = ids[0:32:2]
        assert len(set(keys.tolist())) == 16 and (keys >= 1).all() and (keys < 128).all()
        values = ids[1:32:2]  # distinct too: a query's answer is never another key's
        assert len(set(values.tolist())) == 16 and (values >= 128).all()
        query = labels != IGNORE_INDEX
        fillers = ids[32:][~query[32:]]
        assert (fillers >= 128).all()


def test_loss_mask_covers_exactly_the_queries(small):
    batch = next(iter(small.val_dataloader()))
    assert batch["input_ids"].shape == (8, 64)
    assert ((batch["labels"] != IGNORE_INDEX).sum(dim=1) == 16).all()


def test_same_seed_same_data_and_another_seed_differs():
    a, b = MQAR(256, 64, 16, seed=3), MQAR(256, 64, 16, seed=3)
    c = MQAR(256, 64, 16, seed=4)
    for i in (0, 7, 123):
        assert torch.equal(a.train[i]["input_ids"], b.train[i]["input_ids"])
        assert torch.equal(a.test[i]["labels"], b.test[i]["labels"])
    assert not torch.equal(a.train[0]["input_ids"], c.train[0]["input_ids"])


def test_train_and_test_are_disjoint(small):
    train = {bytes(e["input_ids"].numpy().tobytes()) for e in examples(small, "train", 1000)}
    test = {bytes(e["input_ids"].numpy().tobytes()) for e in examples(small, "test", 64)}
    assert not train & test
    assert all(is_test_sequence(np.frombuffer(t, dtype=np.int64)) for t in test)
    assert not any(is_test_sequence(np.frombuffer(t, dtype=np.int64)) for t in train)
    # the split rule itself, written out: one sequence in 16 (by its bytes' CRC-32) is a test sequence
    assert all(zlib.crc32(t) % 16 == 0 for t in test) and not any(zlib.crc32(t) % 16 == 0 for t in train)


def test_queries_follow_a_power_law_close_to_the_pairs():
    data = MQAR(vocab_size=1024, seq_len=512, num_pairs=16)
    offsets = np.concatenate([
        np.flatnonzero(data.train[i]["labels"].numpy() != IGNORE_INDEX) - 32 for i in range(200)
    ])
    # With a = 0.01 the density falls like 1/slot: the first eighth of the space gets far more than an eighth.
    assert (offsets < (512 - 32) / 8).mean() > 0.4


def test_safe_with_worker_processes(small):
    loader = torch.utils.data.DataLoader(small.test, batch_size=8, num_workers=2)
    in_workers = torch.cat([b["input_ids"] for b in loader])
    in_process = torch.stack([small.test[i]["input_ids"] for i in range(64)])
    assert torch.equal(in_workers, in_process)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(seq_len=60, num_pairs=16), "seq_len=60 is too short for num_pairs=16"),
        (dict(vocab_size=20, seq_len=64, num_pairs=16), "num_pairs=16 needs more distinct keys than the 9"),
        (dict(vocab_size=20, seq_len=64, num_pairs=10), "num_pairs=10 needs more distinct keys than the 9"),
        (dict(train_min_pairs=0), "train_min_pairs=0 must lie in [1, num_pairs=64]"),
        (dict(seq_len=0), "seq_len=0 must be a positive integer"),
        (dict(power_a=float("nan")), "power_a=nan must be a finite positive number"),  # numpy's "contain NaN" at setup
        (dict(power_a=float("inf")), "power_a=inf must be a finite positive number"),
        (dict(power_a=0), "power_a=0 must be a finite positive number"),  # every slot's weight 0: numpy's NaN p
        (dict(seed=-1), "seed=-1 must be an integer >= 0"),  # numpy's "expected non-negative integer" at the first batch
    ],
)
def test_bad_settings_name_the_problem(kwargs, words):
    with pytest.raises(ValueError) as info:
        MQAR(**{"vocab_size": 256, **kwargs})
    assert words in str(info.value)


def test_the_edges_of_the_settings_are_accepted():
    """Every key of [1, vocab_size/2) in use, and the easiest mixture (one pair at the least)."""
    data = MQAR(vocab_size=20, seq_len=64, num_pairs=9, train_size=8, test_size=4, batch_size=4, train_min_pairs=1)
    assert sorted(data.test[0]["input_ids"][:18:2].tolist()) == list(range(1, 10))
    assert min(len(set(data.train[i]["input_ids"][:18:2].tolist()) & set(range(1, 10))) for i in range(8)) >= 1
    # one of everything: one pair in four tokens, one example per split, a batch of one
    data = MQAR(vocab_size=256, seq_len=4, num_pairs=1, train_size=1, test_size=1, batch_size=1)
    ids, labels = data.test[0]["input_ids"].tolist(), data.test[0]["labels"].tolist()
    assert ids[2] == ids[0] and labels[2] == ids[1] and len(data.train_dataloader()) == 1


def test_a_training_set_smaller_than_one_batch_is_named_before_training():
    """Lightning stopped at once with "No training batches" and the run ended as if done ("fit finished: no step")."""
    from types import SimpleNamespace

    data = MQAR(vocab_size=256, seq_len=64, num_pairs=16, train_size=6, batch_size=4)
    assert len(data.train_dataloader()) == 1
    data = MQAR(vocab_size=256, seq_len=64, num_pairs=16, train_size=3, batch_size=4)
    with pytest.raises(ValueError, match=r"MQAR: the training set has 3 examples, fewer than one batch of batch_size=4; "
                                         "a partial batch is dropped"):
        data.train_dataloader()
    data = MQAR(vocab_size=256, seq_len=64, num_pairs=16, train_size=6, batch_size=4)
    data.trainer = SimpleNamespace(world_size=2, global_rank=0, overfit_batches=0)
    with pytest.raises(ValueError, match=r"batch_size=4 on each of 2 processes \(6 // 2 = 3\)"):
        data.train_dataloader()


def test_train_min_pairs_mixes_difficulties_in_training_only():
    data = MQAR(vocab_size=256, seq_len=64, num_pairs=16, train_min_pairs=4, test_size=32)
    counts = []
    for example in examples(data, "train", 200):
        ids, labels = example["input_ids"].tolist(), example["labels"].tolist()
        n = sum(label != IGNORE_INDEX for label in labels)
        pairs = {ids[2 * i]: ids[2 * i + 1] for i in range(n)}
        assert all(labels[p] == pairs[ids[p]] for p, label in enumerate(labels) if label != IGNORE_INDEX)
        counts.append(n)
    assert min(counts) == 4 and max(counts) == 16 and len(set(counts)) == 13
    assert all((e["labels"] != IGNORE_INDEX).sum() == 16 for e in examples(data, "test", 32))
    with pytest.raises(ValueError, match=r"train_min_pairs=17 must lie in \[1, num_pairs=16\]"):
        MQAR(vocab_size=256, seq_len=64, num_pairs=16, train_min_pairs=17)
