"""``TextCorpus``: byte-level language modelling on a text that ships with Python, or a local file."""

import hashlib
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from recipes.data.order import ResumableDataModule


def default_text() -> str:
    """The documentation topics of ``pydoc_data`` (about 0.47 MB of English and Python), present in every
    CPython install, so training runs on a fresh machine with no download."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


class Windows(Dataset):
    """Windows of ``seq_len + 1`` bytes from ``data``, starting every ``stride`` bytes.

    Item: ``{"input_ids": [seq_len], "labels": [seq_len]}``, the labels shifted by one.
    """

    def __init__(self, data: torch.Tensor, seq_len: int, stride: int):
        self.data, self.seq_len, self.stride = data, seq_len, stride
        self.count = max((len(data) - seq_len - 1) // stride + 1, 0)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> dict:
        start = i * self.stride
        chunk = self.data[start:start + self.seq_len + 1].long()  # [seq_len + 1]
        return {"input_ids": chunk[:-1], "labels": chunk[1:]}


def read_text(path: str) -> str:
    """The UTF-8 text of ``path`` (without a leading byte-order mark); an empty or undecodable file is refused with its
    name."""
    data = Path(path).read_bytes()
    if not data.strip():
        raise ValueError(f"TextCorpus: {path} is empty")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        at = error.start + len(data) - len(error.object)  # (the codec's offsets count from after a byte-order mark)
        raise ValueError(
            f"TextCorpus: {path} is not UTF-8 text (byte {at}: {data[at:at + 4]!r}); "
            "convert it, e.g. iconv -f latin1 -t utf-8"
        ) from None


class TextCorpus(ResumableDataModule):
    """Byte-level text: vocabulary 256 (or larger, see ``vocab_size``), a train / val / test split by position.

    Training windows start at every byte and are drawn in random order (random windows), the order of
    each epoch fixed by ``seed`` so a resumed run continues it exactly (:mod:`recipes.data.order`);
    validation and test windows do not overlap.

    Args:
        path: a local UTF-8 ``.txt`` file; default None, the ``pydoc_data`` topics.
        seq_len: tokens per window (default 256).
        batch_size: windows per batch (default 16).
        val_fraction, test_fraction: tail fractions of the text held out (default 0.05 each).
        num_workers: dataloader workers (default 0).
        seed: seed of the training order (default None: the run's seed, ``seed_everything``).
        vocab_size: the vocabulary the model is built with (default 256, the bytes). A larger one only
            adds embedding rows the bytes never use: it builds a model at a paper's parameter count (its
            tokenizer's vocabulary) before a tokenized corpus is at hand.
    """

    def __init__(
        self,
        path: str | None = None,
        *,
        seq_len: int = 256,
        batch_size: int = 16,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        num_workers: int = 0,
        seed: int | None = None,
        vocab_size: int = 256,
    ):
        super().__init__()
        if not isinstance(vocab_size, int) or vocab_size < 256:
            raise ValueError(f"TextCorpus: vocab_size={vocab_size!r} must be an integer >= 256 (the bytes)")
        self.vocab_size = vocab_size
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"TextCorpus: path={path!r} is not a file")
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"TextCorpus: seq_len={seq_len} and batch_size={batch_size} must be >= 1")
        if not (0 < val_fraction and 0 < test_fraction and val_fraction + test_fraction < 1):
            raise ValueError(
                f"TextCorpus: val_fraction={val_fraction}, test_fraction={test_fraction} must be positive "
                "and leave some text to train on"
            )
        self.path, self.seq_len, self.batch_size, self.num_workers = path, seq_len, batch_size, num_workers
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.order_seed = torch.initial_seed() if seed is None else seed
        self.splits: dict[str, torch.Tensor] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        text = read_text(self.path) if self.path else default_text()
        self._fingerprint = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]  # (pydoc_data's differs by Python)
        data = torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8)  # [n_bytes]
        n = len(data)
        n_val, n_test = int(n * self.val_fraction), int(n * self.test_fraction)
        self.splits = {
            "train": data[: n - n_val - n_test],
            "val": data[n - n_val - n_test : n - n_test],
            "test": data[n - n_test :],
        }
        for name, split in self.splits.items():
            if len(split) < self.seq_len + 1:
                raise ValueError(
                    f"TextCorpus: the {name} split has {len(split)} bytes, fewer than seq_len + 1 = {self.seq_len + 1}; "
                    "use a longer text, a larger fraction or a shorter seq_len"
                )

    def data_fingerprint(self) -> str:
        """16 hex digits of the SHA-256 of the text's UTF-8 bytes."""
        self.setup()
        return self._fingerprint

    def validation_tokens(self) -> torch.Tensor:
        """The validation split as one token stream ``[n]`` (int64), for evaluation suites."""
        self.setup()
        return self.splits["val"].long()

    @staticmethod
    def encode(text: str) -> list[int]:
        """Text → token ids: its UTF-8 bytes."""
        return list(text.encode("utf-8"))

    @staticmethod
    def decode(ids: list[int]) -> str:
        """Token ids → text; ids past 255 (a padded vocabulary) and broken UTF-8 show as U+FFFD."""
        return bytes(i if i < 256 else 0xFF for i in ids).decode("utf-8", errors="replace")

    def _eval_loader(self, split: str) -> DataLoader:
        return DataLoader(Windows(self.splits[split], self.seq_len, self.seq_len), batch_size=self.batch_size,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self.train_loader(Windows(self.splits["train"], self.seq_len, stride=1))

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")
