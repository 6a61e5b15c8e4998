import pytest
import torch

from recipes.data import TextCorpus


def test_default_corpus_ships_with_python_and_splits_by_position():
    data = TextCorpus(seq_len=64, batch_size=4)
    data.setup()
    sizes = {k: len(v) for k, v in data.splits.items()}
    assert sizes["train"] > 400_000 and sizes["val"] > 20_000 and sizes["test"] > 20_000
    # The three splits tile the text with no overlap.
    whole = torch.cat([data.splits["train"], data.splits["val"], data.splits["test"]])
    assert len(whole) == sum(sizes.values())


def test_windows_are_shifted_by_one_and_bytes():
    data = TextCorpus(seq_len=16, batch_size=3)
    data.setup()
    batch = next(iter(data.val_dataloader()))
    assert batch["input_ids"].shape == batch["labels"].shape == (3, 16)
    torch.testing.assert_close(batch["input_ids"][:, 1:], batch["labels"][:, :-1])
    assert batch["input_ids"].max() < 256 and batch["input_ids"].dtype == torch.long


def test_train_windows_come_in_random_order():
    data = TextCorpus(seq_len=8, batch_size=4)
    data.setup()
    torch.manual_seed(0)
    first = next(iter(data.train_dataloader()))["input_ids"]
    torch.manual_seed(1)
    second = next(iter(data.train_dataloader()))["input_ids"]
    assert not torch.equal(first, second)


def test_local_text_file(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("abcdefghij" * 100)
    data = TextCorpus(str(path), seq_len=8, batch_size=2)
    data.setup()
    assert bytes(data.splits["train"][:10].tolist()) == b"abcdefghij"


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="TextCorpus: path='.*nope.txt' is not a file"):
        TextCorpus(str(tmp_path / "nope.txt"))


def test_text_too_short_for_the_window(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("x" * 100)
    with pytest.raises(ValueError, match="the val split has 5 bytes, fewer than seq_len \\+ 1 = 33"):
        TextCorpus(str(path), seq_len=32).setup()
