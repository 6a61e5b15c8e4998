"""``TokenizedCorpus``: language modelling on local corpora, tokenized once into a memory-mapped cache.

Documents come from plain-text files (``.txt``, and ``.text``, ``.md``, ``.markdown``, ``.rst``, ``.tex`` read the
same way; a file is one document, or split on ``txt_separator``), ``.jsonl`` files (one JSON object per line, the
document in ``text_field``) and ``.parquet`` files (the column ``column``; needs ``pyarrow``). The tokenizer is
a ``tokenizers`` JSON file, or, when none is given, a byte-level BPE of ``vocab_size`` tokens trained on the training
documents and saved in the cache.

The cache is a directory ``cache_dir/<key>/`` holding ``train.bin`` and ``val.bin`` (the token ids,
``uint16`` when the vocabulary fits, else ``uint32``, an end-of-document token after each document),
``meta.json`` and ``tokenizer.json``. ``key`` hashes what the tokens depend on: each file's path, size
and modification time, the tokenizer file's bytes (or the BPE's size), the fields, the separator and
the split. A second run with the same key memory-maps the cache and tokenizes nothing; a changed file
or tokenizer makes a new key. The cache is written under a temporary name and renamed when complete,
so an interrupted build is never mistaken for a finished one.

Tokenization streams: documents are read a piece at a time (``.txt`` files in pieces of about 1 MB cut
at line ends, ``.parquet`` in record batches), encoded in batches, and appended to the ``.bin`` files;
memory stays bounded by a batch, not the corpus. Validation takes whole documents (every
``round(1 / val_fraction)``-th), so no validation text is ever trained on.
"""

import glob
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from recipes.data.hf_datasets import HFDataset
from recipes.data.order import ResumableDataModule

END_OF_DOCUMENT = "<|endoftext|>"
PLAIN_TEXT = (".txt", ".text", ".md", ".markdown", ".rst", ".tex")  # read as .txt: the whole file is text
FORMATS = (*PLAIN_TEXT, ".jsonl", ".parquet")
PIECE_BYTES = 1 << 20  # a .txt document is read and encoded in pieces of about this size
BATCH_PIECES = 256  # pieces encoded together (the tokenizer parallelises a batch)
CACHE_VERSION = 2  # 2: keyed by the sources' content, with a fingerprint that is verified on use


def unprepared_hint(path: Path) -> str:
    """For a bundled corpus's file that is missing (the english recipes read ``data/english/english.jsonl``,
    relative to the working folder): the command that prepares it."""
    from recipes.corpora import CORPORA

    if path.suffix != ".jsonl" or path.stem not in CORPORA:
        return ""
    return (f": prepare it with python -m recipes.corpora prepare {path.stem} --out {path.parent} (once; the recipes "
            "read it relative to the folder you run in)")


def corpus_files(paths: str | list[str]) -> list[Path]:
    """The files named by ``paths`` (files or glob patterns), sorted within each pattern; each must exist,
    match something and have a supported suffix. A file named twice (overlapping globs, ``a.txt`` and ``./a.txt``) is
    read once, with a note: twice, its documents would fall on both sides of the split, validation text trained on."""
    files, named = [], {}
    patterns = [paths] if isinstance(paths, str) else paths
    if not patterns or "" in patterns:
        raise ValueError(f"TokenizedCorpus: paths={paths!r} names no file; give files or glob patterns (or no paths: "
                         "the pydoc topics)")
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(pattern), recursive=True)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise FileNotFoundError(f"TokenizedCorpus: the pattern {pattern!r} matches no file")
        for match in matches:
            path = Path(match)
            if path.is_dir():
                raise FileNotFoundError(f"TokenizedCorpus: {str(path)!r} is a folder; name its files with a glob, "
                                        f"such as {str(path / '*.txt')!r} or {str(path / '**' / '*.jsonl')!r}")
            if not path.is_file():
                raise FileNotFoundError(f"TokenizedCorpus: {str(path)!r} is not a file{unprepared_hint(path)}")
            if path.suffix not in FORMATS:
                raise ValueError(f"TokenizedCorpus: {str(path)!r} has suffix {path.suffix!r}; supported: .jsonl, .parquet "
                                 f"and the plain text of {', '.join(PLAIN_TEXT)} (name another text file .txt)")
            named.setdefault(path.resolve(), []).append(pattern)
            if len(named[path.resolve()]) == 1:
                files.append(path)
    note_files_named_twice(named, "paths")
    return files


def note_files_named_twice(named: dict[Path, list[str]], key: str) -> None:
    """Say which files (``named``: each with the patterns of ``key`` that matched it) are read once though named
    more than once."""
    twice = {path: patterns for path, patterns in named.items() if len(patterns) > 1}
    if twice:
        print(f"note: TokenizedCorpus reads each file once; named more than once by {key}: "
              + "; ".join(f"{path} (by {', '.join(map(repr, patterns))})" for path, patterns in twice.items())
              + ". To weight a source, give it its own corpus in recipes.data.MixedCorpus", file=sys.stderr)


def _parquet_module():
    try:
        import pyarrow.parquet
    except ImportError:
        raise ImportError("TokenizedCorpus: reading .parquet files needs pyarrow: pip install 'hybrid-zoo[parquet]' "
                          "(or pip install pyarrow)") from None
    return pyarrow.parquet


def document_pieces(files: list[Path], text_field: str, column: str, txt_separator: str | None,
                    domains: list[str] | None = None, domain_field: str = "domain",
                    seen: dict[str, int] | None = None) -> Iterator[tuple[str, bool]]:
    """``(text, ends_document)`` pieces of every document of ``files`` in order; with ``domains``, only the
    ``.jsonl`` documents whose ``domain_field`` is one of them (counted per domain into ``seen``)."""
    for path in files:
        try:
            yield from _file_pieces(path, text_field, column, txt_separator, domains, domain_field, seen)
        except UnicodeDecodeError as error:
            raise ValueError(f"TokenizedCorpus: {path} is not UTF-8 text (near "
                             f"{error.object[max(error.start - 8, 0):error.start + 8]!r})") from None


def _file_pieces(path: Path, text_field: str, column: str, txt_separator: str | None, domains: list[str] | None,
                 domain_field: str, seen: dict[str, int] | None) -> Iterator[tuple[str, bool]]:
    """The pieces of one file (see :func:`document_pieces`)."""
    if path.suffix in PLAIN_TEXT:
        yield from _txt_pieces(path, txt_separator)
    elif path.suffix == ".jsonl":
        with open(path, encoding="utf-8-sig") as lines:  # (-sig: without the byte-order mark Windows tools write)
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"TokenizedCorpus: {path}, line {number} is not JSON ({error}): a .jsonl file "
                                     "holds one JSON object a line") from None
                if not isinstance(record, dict) or text_field not in record:
                    has = (f"its fields: {', '.join(map(str, record)) or 'none'}" if isinstance(record, dict)
                           else f"it is a JSON {type(record).__name__}, not an object")
                    raise ValueError(f"TokenizedCorpus: {path}, line {number}: no field {text_field!r} ({has}); "
                                     "text_field names the one holding the document")
                text = record[text_field]
                if domains is not None:
                    if domain_field not in record:
                        raise ValueError(f"TokenizedCorpus: {path}, line {number}: no field {domain_field!r} "
                                         f"to select domains {domains} by")
                    if record[domain_field] not in domains:
                        continue
                    if seen is not None:
                        seen[record[domain_field]] = seen.get(record[domain_field], 0) + 1
                if not isinstance(text, str):
                    raise ValueError(f"TokenizedCorpus: {path}, line {number}: {text_field!r} is {type(text).__name__}, not text")
                yield text, True
    else:
        parquet = _parquet_module().ParquetFile(path)
        if column not in parquet.schema_arrow.names:
            raise ValueError(f"TokenizedCorpus: {path} has no column {column!r}; it has {parquet.schema_arrow.names}")
        row = 0
        for batch in parquet.iter_batches(columns=[column]):
            for text in batch.column(0).to_pylist():
                if not isinstance(text, str):
                    raise ValueError(f"TokenizedCorpus: {path}, row {row}: column {column!r} is "
                                     f"{'null' if text is None else type(text).__name__}, not text")
                row += 1
                yield text, True


def separator_begun(text: str, separator: str) -> int:
    """The length of the longest end of ``text`` that begins ``separator`` (shorter than it): what the next lines
    may complete."""
    return next((n for n in range(min(len(separator) - 1, len(text)), 0, -1) if text.endswith(separator[:n])), 0)


def _txt_pieces(path: Path, separator: str | None) -> Iterator[tuple[str, bool]]:
    """A ``.txt`` file as pieces of at most about PIECE_BYTES, cut at line ends; with a separator, each
    occurrence ends a document (the separator itself is dropped)."""
    buffer = ""
    with open(path, encoding="utf-8-sig", newline="") as text:  # (-sig: a leading byte-order mark is no text)
        for line in text:
            buffer += line
            if separator is not None:
                *documents, buffer = buffer.split(separator)
                for document in documents:
                    yield document, True
            if len(buffer) >= PIECE_BYTES:
                # keep what could be the start of a separator that the next lines complete (only that: holding back
                # len(separator) - 1 characters cut the text inside a word, which then became other tokens)
                cut = len(buffer) - (separator_begun(buffer, separator) if separator is not None else 0)
                yield buffer[:cut], False
                buffer = buffer[cut:]
    yield buffer, True


def default_documents() -> list[str]:
    """The ``pydoc_data`` topics, one document each: a corpus every CPython install has."""
    from pydoc_data.topics import topics

    return [topics[key] for key in sorted(topics)]


def file_hash(path: Path) -> str:
    """BLAKE2b of a file's bytes (about 350 MB/s on one core: 0.3 s for a 100 MB corpus)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "blake2b").hexdigest()[:32]


def tokenizer_problem(data, recorded: str | None) -> str | None:
    """What is wrong when the data module ``data`` tokenizes text otherwise than the run whose checkpoint recorded the
    tokenizer fingerprint ``recorded`` (None: nothing recorded, or a data module without a tokenizer file)."""
    fingerprint = getattr(data, "tokenizer_fingerprint", None)
    if recorded is None or fingerprint is None or fingerprint() == recorded:
        return None
    given = getattr(data, "tokenizer_path", None)
    where = f"the tokenizer file {given}" if given else "the BPE trained on the corpus files as they are now"
    return (f"the checkpoint was trained on text tokenized by another tokenizer (hash {recorded[:12]}) than the data "
            f"module gives ({fingerprint()[:12]}, from {where}): each text would become other tokens than the model "
            "learned. Give the run's own tokenizer (data.init_args.tokenizer), or the corpus files it trained on (a "
            "corpus without a tokenizer file trains its BPE on them)")


def _identity(files: list[Path]) -> list:
    """What the tokens depend on in each source file: its path, size and content (not its timestamp, which an
    edit can restore)."""
    return [[str(path.resolve()), path.stat().st_size, file_hash(path)] for path in files]


class MemmapWindows(Dataset):
    """Windows of ``seq_len + 1`` tokens from a token file, starting every ``stride`` tokens; the file is
    opened lazily (once per process, so dataloader workers map it themselves).

    Item: ``{"input_ids": [seq_len], "labels": [seq_len]}`` (int64), the labels shifted by one; with
    ``end_of_document``, also ``"document_ids" [seq_len]``, which start a new document at each such token.
    """

    def __init__(self, path: Path, dtype: str, seq_len: int, stride: int, end_of_document: int | None = None):
        self.path, self.dtype, self.seq_len, self.stride = path, dtype, seq_len, stride
        self.end_of_document = end_of_document
        tokens = path.stat().st_size // np.dtype(dtype).itemsize
        self.count = max((tokens - seq_len - 1) // stride + 1, 0)
        self._tokens = None

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> dict:
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r")
        start = i * self.stride
        chunk = torch.from_numpy(self._tokens[start:start + self.seq_len + 1].astype(np.int64))  # [seq_len + 1]
        item = {"input_ids": chunk[:-1], "labels": chunk[1:]}
        if self.end_of_document is not None:
            # Each end-of-document token opens the next document (it is that document's BOS): the
            # previous one learns to end, the next one starts from it and sees nothing before it.
            item["document_ids"] = torch.cumsum(item["input_ids"] == self.end_of_document, dim=0)  # [seq_len]
        return item

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokens": None}


class TokenizedCorpus(ResumableDataModule):
    """Tokenized local corpora (or, with no ``paths``, the ``pydoc_data`` topics), memory-mapped.

    Training windows are ``seq_len + 1`` tokens, non-overlapping, drawn in a random order fixed by
    ``seed`` per epoch (a resumed run continues it exactly: the loader's position is in the checkpoint);
    validation windows come from the validation documents only. Windows run across document ends; the
    end-of-document token marks them, and with ``packed`` the model also keeps the documents apart.

    Args:
        paths: files or glob patterns of ``.txt`` (or ``.md``, ``.rst``, …: :data:`PLAIN_TEXT`), ``.jsonl``,
            ``.parquet`` files; default None, the
            ``pydoc_data`` topics.
        dataset: instead of ``paths``, a Hugging Face ``datasets`` dataset (:class:`recipes.data.HFDataset`: a
            ``save_to_disk`` folder, or ``load_dataset`` on local files or a hub name, streaming or not); its
            documents are the rows' ``text_field``.
        tokenizer: a ``tokenizers`` JSON file; default None: train a byte-level BPE on the training documents.
        vocab_size: the trained BPE's vocabulary (default 8192; ignored with ``tokenizer``, whose size is used).
        padded_vocab_size: with ``tokenizer``, the model's vocabulary when its embedding is padded past the
            tokenizer's tokens, as a Hugging Face model's often is (default None: the tokenizer's size).
        end_of_document_token: the special token that ends each document (default ``<|endoftext|>``; a model
            imported from Hugging Face ends them with its own end-of-sequence token); added to a tokenizer file
            that lacks it.
        start_of_document_token: a token put before each document, as a Hugging Face model's beginning-of-sequence
            token (``<s>``) was before each of its training documents; the tokenizer file must have it (default
            None: none, the end of the document before opening each one, as GPT-2's ``<|endoftext|>`` does).
            ``generate`` puts it (or else the end-of-document token) before a prompt.
        text_field: the ``.jsonl`` field holding the text (default ``"text"``).
        column: the ``.parquet`` column holding the text (default ``"text"``).
        txt_separator: splits plain-text files into documents; default None, one document per file.
        cache_dir: where token caches live (default ``$HYBRID_ZOO_CACHE/corpora``, the variable's default
            ``~/.cache/hybrid-zoo``).
        seq_len: tokens per window (default 256).
        batch_size: windows per batch (default 16).
        val_fraction: the fraction of documents held out for validation (default 0.05).
        num_workers: dataloader workers (default 0).
        seed: seed of the training order (default None: the run's seed).
        domains: keep only the ``.jsonl`` documents whose ``domain_field`` is one of these (default None: all);
            a domain that selects no document is an error. Give such a corpus a ``tokenizer`` shared with the
            full corpus when models move between domains (``python -m recipes.corpora`` writes one).
        domain_field: the ``.jsonl`` field naming a document's domain (default ``"domain"``).
        packed: give every batch ``document_ids`` (default False), so the model keeps each document of a
            window to itself: attention within it, SSD state and conv restarting, positions from its
            start (docs/data.md). False: windows are plain token streams, as in most LM training.
    """

    def __init__(
        self,
        paths: str | list[str] | None = None,
        *,
        dataset: HFDataset | None = None,
        tokenizer: str | None = None,
        vocab_size: int = 8192,
        padded_vocab_size: int | None = None,
        end_of_document_token: str = END_OF_DOCUMENT,
        start_of_document_token: str | None = None,
        text_field: str = "text",
        column: str = "text",
        txt_separator: str | None = None,
        cache_dir: str | None = None,
        seq_len: int = 256,
        batch_size: int = 16,
        val_fraction: float = 0.05,
        num_workers: int = 0,
        seed: int | None = None,
        domains: list[str] | None = None,
        domain_field: str = "domain",
        packed: bool = False,
    ):
        super().__init__()
        self.packed = packed
        if paths is not None and dataset is not None:
            raise ValueError("TokenizedCorpus: give paths or a dataset, not both (a mixture of sources is recipes.data.MixedCorpus)")
        if isinstance(dataset, dict):  # as jsonargparse or a checkpoint may hand it over
            dataset = HFDataset(**dataset)
        self.dataset = dataset
        self.files = corpus_files(paths) if paths is not None else None
        if domains is not None:
            if isinstance(domains, str) or not domains or not all(isinstance(d, str) for d in domains):
                raise ValueError(f"TokenizedCorpus: domains={domains!r} must be a non-empty list of names")
            if self.files is None or any(path.suffix != ".jsonl" for path in self.files):
                raise ValueError("TokenizedCorpus: domains select .jsonl documents by their domain field; "
                                 f"these paths are not all .jsonl: {paths!r}")
        self.domains, self.domain_field = (sorted(domains) if domains is not None else None), domain_field
        if tokenizer is not None and not Path(tokenizer).is_file():
            raise FileNotFoundError(f"TokenizedCorpus: tokenizer={tokenizer!r} is not a file")
        if not isinstance(end_of_document_token, str) or not end_of_document_token:
            raise ValueError(f"TokenizedCorpus: end_of_document_token={end_of_document_token!r} must be a token's text")
        self.end_of_document_token = end_of_document_token
        if start_of_document_token is not None:
            if not isinstance(start_of_document_token, str) or not start_of_document_token:
                raise ValueError(f"TokenizedCorpus: start_of_document_token={start_of_document_token!r} must be a "
                                 "token's text, or None")
            if start_of_document_token == end_of_document_token:
                raise ValueError(f"TokenizedCorpus: start_of_document_token={start_of_document_token!r} is the end of "
                                 "document token, which already comes before every document; leave it None")
            if tokenizer is None or self._load_tokenizer(tokenizer).token_to_id(start_of_document_token) is None:
                where = f"the tokenizer file {tokenizer}" if tokenizer else "a BPE trained on the corpus (no tokenizer file)"
                raise ValueError(f"TokenizedCorpus: start_of_document_token={start_of_document_token!r} is not a token "
                                 f"of {where}; it takes a token the tokenizer file has, as a model's <s>")
        self.start_of_document_token = start_of_document_token
        if tokenizer is None and not (isinstance(vocab_size, int) and 257 <= vocab_size <= 2**32):
            raise ValueError(f"TokenizedCorpus: vocab_size={vocab_size!r} must be an integer >= 257 (bytes + end of document)")
        if padded_vocab_size is not None and tokenizer is None:
            raise ValueError("TokenizedCorpus: padded_vocab_size pads a tokenizer file's vocabulary; a trained BPE has "
                             "vocab_size tokens")
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"TokenizedCorpus: seq_len={seq_len} and batch_size={batch_size} must be >= 1")
        if not 0 < val_fraction < 1:
            raise ValueError(f"TokenizedCorpus: val_fraction={val_fraction} must lie in (0, 1)")
        if val_fraction > 0.5:  # (it was taken as 0.5 without a word)
            raise ValueError(f"TokenizedCorpus: val_fraction={val_fraction}: validation takes every n-th whole "
                             "document, at most every 2nd (0.5)")
        if txt_separator == "":
            raise ValueError("TokenizedCorpus: txt_separator must not be empty (None: one document per file)")
        self.tokenizer_path, self.text_field, self.column, self.txt_separator = tokenizer, text_field, column, txt_separator
        default_root = Path(os.environ.get("HYBRID_ZOO_CACHE", "~/.cache/hybrid-zoo")) / "corpora"
        self.cache_root = Path(cache_dir or default_root).expanduser()
        self.seq_len, self.batch_size, self.num_workers = seq_len, batch_size, num_workers
        self.val_every = max(round(1 / val_fraction), 2)
        self.order_seed = torch.initial_seed() if seed is None else seed
        if tokenizer:
            tokens = self._tokenizer_file_vocab(tokenizer, end_of_document_token)
            if padded_vocab_size is not None and not (isinstance(padded_vocab_size, int) and padded_vocab_size >= tokens):
                raise ValueError(f"TokenizedCorpus: padded_vocab_size={padded_vocab_size!r} is below the {tokens} tokens "
                                 f"of {tokenizer} (its end-of-document token included)")
            vocab_size = tokens if padded_vocab_size is None else padded_vocab_size
        self.vocab_size = vocab_size
        self._tokenizer, self._cache = None, None
        self._tokenizer_hash: str | None = None  # with a tokenizer file read without the cache
        self.meta: dict | None = None

    # ---- the cache -------------------------------------------------------------------------------

    @classmethod
    def _tokenizer_file_vocab(cls, path: str, end_of_document_token: str) -> int:
        """The vocabulary of a tokenizer file once the end-of-document token is in it (added if missing)."""
        tokenizer = cls._load_tokenizer(path)
        return tokenizer.get_vocab_size() + (tokenizer.token_to_id(end_of_document_token) is None)

    @staticmethod
    def _load_tokenizer(path):
        from tokenizers import Tokenizer

        try:
            return Tokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises a bare Exception for a file it cannot parse
            raise ValueError(f"TokenizedCorpus: {path} is not a tokenizers JSON file ({str(error)[:160]})") from None

    def _copy_tokenizer(self, source: str, destination: Path):
        """The tokenizer file ``source`` as the tokens are made with it, written to ``destination`` and returned: the
        end-of-document token added as a special token where the file lacks it."""
        shutil.copyfile(source, destination)
        tokenizer = self._load_tokenizer(destination)
        if tokenizer.token_to_id(self.end_of_document_token) is None:
            tokenizer.add_special_tokens([self.end_of_document_token])
            tokenizer.save(str(destination))
        return tokenizer

    def _file_tokenizer(self) -> tuple:
        """``(tokenizer, hash)`` of the tokenizer file as the token cache would hold it, without tokenizing the corpus:
        encoding a prompt, decoding and the checkpoint's check need no more (and the corpus need not be here)."""
        with tempfile.TemporaryDirectory() as folder:
            tokenizer = self._copy_tokenizer(self.tokenizer_path, Path(folder) / "tokenizer.json")
            return tokenizer, file_hash(Path(folder) / "tokenizer.json")

    def cache_key(self) -> str:
        source = (_identity(self.files) if self.files is not None else self.dataset.identity() if self.dataset is not None
                  else ["pydoc_data", sys.version])
        tokenizer = (hashlib.sha256(Path(self.tokenizer_path).read_bytes()).hexdigest() if self.tokenizer_path
                     else f"bpe:{self.vocab_size}")
        what = [CACHE_VERSION, source, tokenizer, self.text_field, self.column, self.txt_separator, self.val_every]
        if self.end_of_document_token != END_OF_DOCUMENT:  # (the default's caches keep their keys)
            what.append(self.end_of_document_token)
        if self.start_of_document_token is not None:
            what.append(["start", self.start_of_document_token])
        if self.domains is not None:
            what += [self.domains, self.domain_field]
        return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:20]

    @property
    def cache(self) -> Path:
        """This corpus's cache directory, keyed when first asked for (a file changed later is a new corpus)."""
        if self._cache is None:
            self._cache = self.cache_root / self.cache_key()
        return self._cache

    def _pieces(self, seen: dict[str, int] | None = None) -> Iterator[tuple[str, bool]]:
        if self.dataset is not None:
            return ((document, True) for document in self.dataset.documents(self.text_field))
        if self.files is None:
            return ((document, True) for document in default_documents())
        return document_pieces(self.files, self.text_field, self.column, self.txt_separator, self.domains,
                               self.domain_field, seen)

    def split_of(self, document: int) -> str:
        """``"val"`` for every ``val_every``-th document (counted from 0), else ``"train"``."""
        return "val" if document % self.val_every == self.val_every - 1 else "train"

    def _training_documents(self) -> Iterator[str]:
        """The training documents' pieces (what the BPE is trained on)."""
        document = 0
        for text, ends in self._pieces():
            if self.split_of(document) == "train":
                yield text
            document += ends

    def documents(self, split: str) -> Iterator[str]:
        """The text of each whole document of ``split`` (``"train"`` or ``"val"``), in corpus order: the same
        documents the token cache holds for that split (what a held-out evaluation task is built from)."""
        if split not in ("train", "val"):
            raise ValueError(f"TokenizedCorpus.documents: split={split!r} must be 'train' or 'val'")
        document, parts = 0, []
        for text, ends in self._pieces():
            if self.split_of(document) == split:
                parts.append(text)
                if ends:
                    yield "".join(parts)
            if ends:
                parts = []
            document += ends

    def _train_bpe(self, path: Path) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=self.vocab_size, special_tokens=[self.end_of_document_token],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tokenizer.train_from_iterator(self._training_documents(), trainer)
        tokenizer.save(str(path))

    def cache_problem(self) -> str | None:
        """Why this corpus's cache cannot be used as it is (None: it can), checked against the fingerprint
        its ``meta.json`` records: the token files' sizes and the tokenizer's hash."""
        if not self.cache.exists():
            return "it does not exist"
        try:
            meta = json.loads((self.cache / "meta.json").read_text())
        except FileNotFoundError:
            return "meta.json is missing"
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            return f"meta.json is not valid JSON ({error})"
        if not isinstance(meta, dict) or meta.get("version") != CACHE_VERSION:
            return f"meta.json is not of cache version {CACHE_VERSION}"
        try:
            itemsize = np.dtype(meta["dtype"]).itemsize
            for split in ("train", "val"):
                size = (self.cache / f"{split}.bin").stat().st_size
                if size != meta["tokens"][split] * itemsize:
                    return f"{split}.bin has {size:,} bytes where meta.json records {meta['tokens'][split] * itemsize:,}"
            if file_hash(self.cache / "tokenizer.json") != meta["tokenizer_hash"]:
                return "tokenizer.json is not the tokenizer the tokens were made with"
            if not meta.get("ends_only_between_documents"):
                return self._ends_problem(meta)
        except FileNotFoundError as error:
            return f"{Path(error.filename).name} is missing"
        except (KeyError, TypeError) as error:
            return f"meta.json lacks {error}"
        return None

    def _ends_problem(self, meta: dict) -> str | None:
        """For a cache made before 2026-12-05, when a document's own end-of-document text was made that token (a false
        document boundary): what is wrong where its end-of-document tokens outnumber its documents; a sound one is
        marked in its ``meta.json``, so as to be counted once."""
        for split in ("train", "val"):
            path, step = self.cache / f"{split}.bin", 1 << 24  # (counted a slice at a time: memory stays bounded)
            tokens = np.memmap(path, dtype=meta["dtype"], mode="r") if path.stat().st_size else np.empty(0)  # [n]
            ends = sum(int(np.count_nonzero(tokens[i:i + step] == meta["end_of_document"]))
                       for i in range(0, len(tokens), step))
            if ends != meta["documents"][split]:
                return (f"{split}.bin holds {ends:,} end-of-document tokens for {meta['documents'][split]:,} documents: "
                        f"a document's own {self.end_of_document_token!r} text was made that token, as caches made "
                        "before 2026-12-05 did")
        marked = self.cache / f"meta.json.{os.getpid()}"
        try:
            marked.write_text(json.dumps({**meta, "ends_only_between_documents": True}, indent=1))
            marked.replace(self.cache / "meta.json")
        except OSError:  # (a cache folder this user cannot write: counted again next time)
            marked.unlink(missing_ok=True)
        return None

    def prepare_data(self) -> None:
        """Build the cache unless a sound one exists (on one process: Lightning calls this on rank 0); a damaged
        one (:meth:`cache_problem`) is rebuilt, and what interrupted builds left is removed."""
        from recipes.training import remove_orphans

        remove_orphans(self.cache_root, "*.building-*")
        problem = self.cache_problem()
        if problem is None:
            return
        if self.cache.exists():
            print(f"TokenizedCorpus: the token cache {self.cache} is damaged ({problem}); rebuilding it",
                  file=sys.stderr, flush=True)
            stale = self.cache_root / f"{self.cache.name}.stale-{os.getpid()}"
            self.cache.rename(stale)
            shutil.rmtree(stale, ignore_errors=True)
        building = self.cache_root / f"{self.cache.name}.building-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir(parents=True)
        if self.tokenizer_path:
            tokenizer = self._copy_tokenizer(self.tokenizer_path, building / "tokenizer.json")
        else:
            self._train_bpe(building / "tokenizer.json")  # (its special tokens: the end of document)
            tokenizer = self._load_tokenizer(building / "tokenizer.json")
        end = tokenizer.token_to_id(self.end_of_document_token)
        start = [] if self.start_of_document_token is None else [tokenizer.token_to_id(self.start_of_document_token)]
        # A document's text is text: an "<|endoftext|>" it writes (a page about tokenizers) is its characters, not the
        # end of a document, which only the loop below puts, after each one (nanoGPT's encode_ordinary).
        tokenizer.encode_special_tokens = True
        # ids stay below the tokenizer's size (vocab_size may pad past it: not stored, not in the key)
        vocab = tokenizer.get_vocab_size()
        dtype = "uint16" if vocab <= 2**16 else "uint32"
        counts = {"train": [0, 0], "val": [0, 0]}  # documents, tokens
        seen_domains: dict[str, int] = {}
        total = sum(path.stat().st_size for path in self.files) if self.files else None
        with open(building / "train.bin", "wb") as train, open(building / "val.bin", "wb") as val, \
                tqdm(total=total, unit="B", unit_scale=True, desc=f"tokenizing into {self.cache}") as progress:
            out = {"train": train, "val": val}
            batch: list[tuple[str, bool, str, bool]] = []
            document, begins = 0, True

            def flush():
                encodings = tokenizer.encode_batch([text for text, *_ in batch], add_special_tokens=False)
                for (text, ends, split, first), encoding in zip(batch, encodings):
                    ids = (start if first else []) + encoding.ids + ([end] if ends else [])
                    np.asarray(ids, dtype=dtype).tofile(out[split])
                    counts[split][0] += ends
                    counts[split][1] += len(ids)
                    progress.update(len(text.encode("utf-8")))
                batch.clear()

            for text, ends in self._pieces(seen_domains):
                batch.append((text, ends, self.split_of(document), begins))  # (a document may come in several pieces)
                document += ends
                begins = ends
                if len(batch) >= BATCH_PIECES:
                    flush()
            flush()
        meta = {"dtype": dtype, "vocab_size": vocab, "end_of_document": end,
                "tokenizer_hash": file_hash(building / "tokenizer.json"),
                "documents": {k: v[0] for k, v in counts.items()}, "tokens": {k: v[1] for k, v in counts.items()},
                "files": _identity(self.files) if self.files else self.dataset.identity() if self.dataset else "pydoc_data",
                "version": CACHE_VERSION, "ends_only_between_documents": True}
        if self.domains is not None:
            meta["domains"] = seen_domains
        (building / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            building.rename(self.cache)
        except OSError:  # another process finished the same cache first
            shutil.rmtree(building, ignore_errors=True)

    def setup(self, stage: str | None = None) -> None:
        if self.meta is not None:
            return
        self.prepare_data()  # a no-op when the cache exists; builds it when called without a Trainer
        self.meta = json.loads((self.cache / "meta.json").read_text())
        if self.meta["vocab_size"] > self.vocab_size:
            raise ValueError(f"TokenizedCorpus: the tokenizer has {self.meta['vocab_size']} tokens, more than "
                             f"vocab_size={self.vocab_size}")
        missing = sorted(set(self.domains or ()) - set(self.meta.get("domains", {})))
        if missing:
            raise ValueError(f"TokenizedCorpus: no document of {[str(f) for f in self.files]} has {self.domain_field} "
                             f"{missing}; of the domains asked for it found {sorted(self.meta['domains'])}")
        for split in ("train", "val"):
            if self.meta["tokens"][split] < self.seq_len + 1:
                raise ValueError(f"TokenizedCorpus: the {split} split has {self.meta['tokens'][split]} tokens "
                                 f"({self.meta['documents'][split]} document"
                                 f"{'s' * (self.meta['documents'][split] != 1)}), fewer than seq_len + 1 = "
                                 f"{self.seq_len + 1}; {self._too_short_hint()}")

    def _too_short_hint(self) -> str:
        """What to change when a split is shorter than one window. Documents, not tokens, are split: a corpus of
        fewer than ``val_every`` documents (one ``.txt`` file is one) has no validation text at all."""
        documents = sum(self.meta["documents"].values())
        if documents >= self.val_every:
            return "use more text, a larger val_fraction or a shorter seq_len"
        whole_files = [f.name for f in self.files or [] if f.suffix in PLAIN_TEXT] if self.txt_separator is None else []
        split = (f"split {', '.join(whole_files[:3])} into documents with txt_separator (for example a blank line, "
                 "--data.init_args.txt_separator $'\\n\\n'), " if whole_files else "")
        return (f"validation takes every {self.val_every}th document and the corpus has {documents}: {split}give "
                "more documents or a larger val_fraction")

    # ---- text <-> tokens -------------------------------------------------------------------------

    @property
    def _file_only(self) -> bool:
        """Text goes through the tokenizer file itself: there is one and the corpus is not tokenized (yet)."""
        return self.meta is None and self.tokenizer_path is not None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            if self._file_only:  # the file is enough: no corpus tokenized
                self._tokenizer, self._tokenizer_hash = self._file_tokenizer()
            else:
                self.setup()
                self._tokenizer = self._load_tokenizer(self.cache / "tokenizer.json")
        return self._tokenizer

    @property
    def end_of_document(self) -> int:
        """The end-of-document token's id."""
        if self._file_only:
            return int(self.tokenizer.token_to_id(self.end_of_document_token))
        self.setup()
        return int(self.meta["end_of_document"])

    @property
    def start_of_document(self) -> int:
        """The id of the token before every document: ``start_of_document_token``'s, else the end of the document
        before (what an empty context is, and what a prompt follows)."""
        if self.start_of_document_token is None:
            return self.end_of_document
        return int(self.tokenizer.token_to_id(self.start_of_document_token))

    def validation_tokens(self) -> torch.Tensor:
        """The validation split as one token stream ``[n]`` (int64; documents separated by end-of-document)."""
        self.setup()
        return torch.from_numpy(np.fromfile(self.cache / "val.bin", dtype=self.meta["dtype"]).astype(np.int64))

    def data_fingerprint(self) -> str:
        """The token cache's key: the sources' content, the tokenizer and the options that make the tokens."""
        return self.cache.name

    def tokenizer_fingerprint(self) -> str:
        """The hash of the tokenizer the tokens are made with (its JSON's :func:`file_hash`): a checkpoint records it,
        so that a resumed run, ``generate`` and ``eval`` can tell text that would become other tokens
        (:func:`tokenizer_problem`). With a tokenizer file, the file's (the same hash) until the corpus is tokenized."""
        if self._file_only:
            if self._tokenizer_hash is None:
                self._tokenizer, self._tokenizer_hash = self._file_tokenizer()
            return self._tokenizer_hash
        self.setup()
        return str(self.meta["tokenizer_hash"])

    def write_tokenizer_file(self, path: Path) -> None:
        """Write the tokenizer the tokens are made with to ``path`` (a ``tokenizers`` JSON file): the token cache's, or
        with a tokenizer file and no cache yet, that file as the cache would hold it (no corpus tokenized)."""
        if self._file_only:
            self._copy_tokenizer(self.tokenizer_path, Path(path))
        else:
            self.setup()
            shutil.copyfile(self.cache / "tokenizer.json", path)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    # ---- loaders ---------------------------------------------------------------------------------

    def windows(self, split: str) -> MemmapWindows:
        self.setup()
        return MemmapWindows(self.cache / f"{split}.bin", self.meta["dtype"], self.seq_len, self.seq_len,
                             self.meta["end_of_document"] if self.packed else None)

    def train_dataloader(self) -> DataLoader:
        return self.train_loader(self.windows("train"))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.windows("val"), batch_size=self.batch_size, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0)
