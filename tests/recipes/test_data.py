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


def first_batch(seed: int | None) -> torch.Tensor:
    data = TextCorpus(seq_len=8, batch_size=4, seed=seed)
    data.setup()
    return next(iter(data.train_dataloader()))["input_ids"]


def test_train_windows_come_in_an_order_fixed_by_the_seed():
    assert torch.equal(first_batch(0), first_batch(0))
    assert not torch.equal(first_batch(0), first_batch(1))
    # Not the text's own order: the first windows are not the first bytes.
    data = TextCorpus(seq_len=8, batch_size=4, seed=0)
    data.setup()
    assert not torch.equal(first_batch(0)[0], data.splits["train"][:8].long())
    # With no seed, the run's seed (seed_everything / torch.manual_seed) decides.
    torch.manual_seed(5)
    by_global = first_batch(None)
    assert torch.equal(by_global, first_batch(5))


def test_empty_or_non_utf8_text_file_is_named(tmp_path):
    empty, latin = tmp_path / "empty.txt", tmp_path / "latin.txt"
    empty.write_text("  \n")
    latin.write_bytes("caf\u00e9 ".encode("latin-1") * 50)
    with pytest.raises(ValueError, match=r"TextCorpus: .*empty.txt is empty"):
        TextCorpus(str(empty)).setup()
    with pytest.raises(ValueError, match=r"TextCorpus: .*latin.txt is not UTF-8 text \(byte 3: "):
        TextCorpus(str(latin)).setup()


def test_a_byte_order_mark_is_not_text_and_an_error_past_it_names_the_byte(tmp_path):
    """A UTF-8 file that starts with a byte-order mark (Windows tools write one) is read without it: its three bytes
    were trained on as text. A bad byte after one is still named with the bytes there."""
    marked, bad = tmp_path / "marked.txt", tmp_path / "bad.txt"
    marked.write_bytes(b"\xef\xbb\xbf" + b"abcdefghij" * 100)
    data = TextCorpus(str(marked), seq_len=8, batch_size=2)
    data.setup()
    assert bytes(data.splits["train"][:10].tolist()) == b"abcdefghij"
    bad.write_bytes(b"\xef\xbb\xbfab\xffcd" * 50)
    with pytest.raises(ValueError, match=r"bad.txt is not UTF-8 text \(byte 5: b'\\xffcd\\xef'\)"):  # (of the file)
        TextCorpus(str(bad)).setup()


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


def test_train_validation_and_test_windows_share_no_content(tmp_path):
    # Random letters: every 12-byte string occurs once, so a shared 12-gram means shared text.
    rng = torch.Generator().manual_seed(0)
    letters = torch.randint(0, 52, (30_000,), generator=rng)
    text = "".join("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[i] for i in letters.tolist())
    path = tmp_path / "letters.txt"
    path.write_text(text)
    data = TextCorpus(str(path), seq_len=32, batch_size=8, val_fraction=0.1, test_fraction=0.1, seed=0)
    data.setup()

    def grams(loader, n: int = 12) -> set[bytes]:
        seen = set()
        for batch in loader:
            # Each window's content is its inputs plus its last label: seq_len + 1 bytes.
            windows = torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1)
            for w in windows.to(torch.uint8):
                raw = bytes(w.tolist())
                seen.update(raw[i:i + n] for i in range(len(raw) - n + 1))
        return seen

    train, val, test = grams(data.train_dataloader()), grams(data.val_dataloader()), grams(data.test_dataloader())
    assert train and val and test
    assert not train & val and not train & test and not val & test
    # The test is not vacuous: the 12-grams seen cover most of each split (80% / 10% / 10% of the text;
    # the evaluation windows are back to back, so 12-grams across two of them are not counted).
    assert len(train) > 0.75 * len(text) and len(val) > 0.06 * len(text) and len(test) > 0.06 * len(text)


def test_windows_count_every_full_window_and_no_more():
    from recipes.data.text import Windows

    data = torch.arange(20)
    for stride, count in ((1, 16), (4, 4), (5, 4), (16, 1)):
        windows = Windows(data, seq_len=4, stride=stride)
        assert len(windows) == count, stride
        last = windows[count - 1]
        assert len(last["labels"]) == 4 and int(last["labels"][-1]) <= 19  # the last full window, inside the data
    assert len(Windows(data[:4], seq_len=4, stride=1)) == 0  # shorter than a window and its next token


@pytest.mark.parametrize("settings, message", [
    ({"vocab_size": 255}, r"vocab_size=255 must be an integer >= 256 \(the bytes\)"),
    ({"vocab_size": 256.0}, r"vocab_size=256.0 must be an integer >= 256"),
    ({"seq_len": 0}, r"seq_len=0 and batch_size=16 must be >= 1"),
    ({"batch_size": 0}, r"seq_len=256 and batch_size=0 must be >= 1"),
    ({"val_fraction": 0}, r"val_fraction=0, test_fraction=0.05 must be positive and leave some text to train on"),
    ({"test_fraction": 0}, r"val_fraction=0.05, test_fraction=0 must be positive"),
    ({"val_fraction": 0.5, "test_fraction": 0.5}, r"val_fraction=0.5, test_fraction=0.5 must be positive"),
])
def test_a_text_corpus_refuses_settings_that_cannot_work(settings, message):
    with pytest.raises(ValueError, match=message):
        TextCorpus(**settings)


def test_a_split_needs_one_window_and_its_next_byte(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("x" * 100)  # splits of 80, 10 and 10 bytes
    TextCorpus(str(path), seq_len=9, val_fraction=0.1, test_fraction=0.1).setup()  # 10 bytes: one window of 9 + 1
    with pytest.raises(ValueError, match=r"the val split has 10 bytes, fewer than seq_len \+ 1 = 11"):
        TextCorpus(str(path), seq_len=10, val_fraction=0.1, test_fraction=0.1).setup()
    data = TextCorpus(str(path), seq_len=1, val_fraction=0.1, test_fraction=0.1, vocab_size=300)  # the least
    assert torch.equal(data.validation_tokens(), torch.full((10,), ord("x"))) and data.validation_tokens().dtype == torch.long
    assert data.vocab_size == 300


def test_bytes_in_and_out_with_ids_past_the_bytes_shown_as_replacement_characters():
    assert TextCorpus.encode("hé€") == list("hé€".encode()) == [104, 195, 169, 226, 130, 172]
    assert TextCorpus.decode(TextCorpus.encode("hé€")) == "hé€"
    assert TextCorpus.decode([104, 256, 105, 299]) == "h\ufffdi\ufffd"  # a padded vocabulary's unused ids
