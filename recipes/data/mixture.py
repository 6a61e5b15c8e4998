"""``MixedCorpus``: several tokenized corpora trained on together, each in a chosen proportion.

    data:
      class_path: recipes.data.MixedCorpus
      init_args:
        corpora:
          - {paths: data/english/english.jsonl, tokenizer: data/english/tokenizer.json, domains: [literature]}
          - {dataset: {path: json, data_files: notes/*.jsonl}, tokenizer: data/english/tokenizer.json}
        weights: [0.7, 0.3]
        seq_len: 256
        batch_size: 16

Every corpus is a :class:`TokenizedCorpus` (each entry is its arguments) with the same tokenizer. An epoch
has as many windows as the corpora together; window ``i`` is drawn from corpus ``s`` with probability
``weights[s]`` (the draw fixed by the seed), and corpus ``s``'s ``j``-th draw is its window ``perm_s[j mod n_s]``
(a fixed permutation): a corpus whose share exceeds its size repeats its windows, a smaller share takes a
fixed subset. The order is the :class:`ResumableLoader`'s, so a resumed run continues it exactly. Validation
is every corpus's validation split.
"""

import hashlib
import inspect
import itertools
import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from torch.utils.data import ConcatDataset, DataLoader, Dataset

from recipes.argtypes import did_you_mean
from recipes.data.corpus import TokenizedCorpus
from recipes.data.order import ResumableDataModule


class MixtureWindows(Dataset):
    """Windows of several datasets in fixed proportions: item ``i`` is ``(source[i], window[i])`` of a table
    drawn once from ``seed``."""

    def __init__(self, sources: list[Dataset], weights: list[float], seed: int):
        self.sources = sources
        total = sum(len(s) for s in sources)
        rng = np.random.default_rng(seed)
        self.source = rng.choice(len(sources), size=total, p=np.asarray(weights) / sum(weights)).astype(np.int64)  # [N]
        self.window = np.empty(total, dtype=np.int64)
        for s, dataset in enumerate(sources):
            where = np.flatnonzero(self.source == s)
            order = rng.permutation(len(dataset))
            self.window[where] = order[np.arange(len(where)) % len(dataset)]

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> dict:
        return self.sources[self.source[i]][int(self.window[i])]


def sources(corpus: TokenizedCorpus) -> set[str]:
    """What ``corpus`` reads its documents from: its files, resolved (a dataset's local data files too), else the
    dataset's name and patterns, or the pydoc topics."""
    dataset = corpus.dataset
    if corpus.files is not None:
        return {str(path.resolve()) for path in corpus.files}
    if dataset is None:
        return {"the pydoc topics"}
    if dataset.saved():
        return {str(Path(dataset.path).expanduser().resolve())}
    try:
        files = dataset.data_file_paths() if dataset.data_files is not None else []
    except FileNotFoundError:  # (not here: generate and eval read only the tokenizer file)
        files = []
    return {str(path.resolve()) for path in files} or {f"the dataset {dataset.path!r} {dataset.patterns()}"}


def documents_shared(corpora: list[TokenizedCorpus]) -> str | None:
    """What is wrong where two of ``corpora`` read the same documents (a file, and a domain of it both select): each
    corpus numbers its own documents for its every-n-th validation split, so a document one of them validates on, the
    other trains on."""
    for (i, first), (j, second) in itertools.combinations(enumerate(corpora), 2):
        files = sorted(sources(first) & sources(second))
        if not files:
            continue
        if first.domains is None or second.domains is None:
            domains = first.domains or second.domains  # (None: every domain)
        else:
            domains = sorted(set(first.domains) & set(second.domains))
            if not domains:
                continue  # disjoint domains of one file: no document in both
        which = f"the documents of domains {domains}" if domains else "every document"
        return (f"MixedCorpus: corpora[{i}] and corpora[{j}] both read {which} of {files[0]}"
                f"{f' (and {len(files) - 1} more)' if len(files) > 1 else ''}: each corpus splits its own "
                "documents for validation, so a document one validates on, the other trains on. Give each corpus "
                "its own files, or disjoint domains of one file (the weights set each one's share)")
    return None


class MixedCorpus(ResumableDataModule):
    """Tokenized corpora in proportions ``weights`` (normalised), one tokenizer for all.

    Args:
        corpora: each a :class:`TokenizedCorpus`'s arguments (a mapping) or one already built; their
            ``seq_len``, ``batch_size`` and ``seed`` are this module's (a mapping that sets one is refused, and a
            built corpus must have this ``seq_len``).
        weights: one positive number per corpus.
        seq_len, batch_size: as :class:`TokenizedCorpus` (defaults 256, 16).
        seed: the mixture's and the order's seed (default None: the run's).
        num_workers: dataloader workers (default 0).
    """

    def __init__(self, corpora: list, weights: list[float], *, seq_len: int = 256, batch_size: int = 16,
                 seed: int | None = None, num_workers: int = 0):
        super().__init__()
        if not corpora or len(corpora) != len(weights):
            raise ValueError(f"MixedCorpus: {len(corpora)} corpora and {len(weights)} weights: give one weight per corpus")
        if any(not isinstance(w, (int, float)) or not w > 0 for w in weights):
            raise ValueError(f"MixedCorpus: weights {weights} must be positive numbers")
        if not all(isinstance(c, (TokenizedCorpus, Mapping)) for c in corpora):
            raise ValueError("MixedCorpus: each corpus is a TokenizedCorpus or the mapping of its arguments")
        import torch

        self.order_seed = torch.initial_seed() if seed is None else seed
        self.corpora = [c if isinstance(c, TokenizedCorpus) else self._corpus(i, c, seq_len, batch_size)
                        for i, c in enumerate(corpora)]
        for i, corpus in enumerate(self.corpora):  # windows of two lengths would meet in one batch
            if corpus.seq_len != seq_len:
                raise ValueError(f"MixedCorpus: corpora[{i}] was built with seq_len={corpus.seq_len}, the mixture's "
                                 f"is {seq_len}: every corpus's windows are the mixture's length")
        shared = documents_shared(self.corpora)
        if shared is not None:
            raise ValueError(shared)
        ends = [corpus.end_of_document_token for corpus in self.corpora]
        if len(set(ends)) > 1:  # one corpus's documents would end in a token the others' never do
            named = ", ".join(f"corpora[{i}]: {end!r}" for i, end in enumerate(ends))
            raise ValueError(f"MixedCorpus: the corpora end their documents with different tokens ({named}); give "
                             "every corpus one end_of_document_token, so a model learns one end and generation stops at it")
        starts = [corpus.start_of_document_token for corpus in self.corpora]
        if len(set(starts)) > 1:
            named = ", ".join(f"corpora[{i}]: {start!r}" for i, start in enumerate(starts))
            raise ValueError(f"MixedCorpus: the corpora begin their documents differently ({named}); give every corpus "
                             "one start_of_document_token (or none)")
        self.weights = [float(w) for w in weights]
        self.seq_len, self.batch_size, self.num_workers = seq_len, batch_size, num_workers
        self.vocab_size = max(c.vocab_size for c in self.corpora)
        self._train = None

    def _corpus(self, index: int, arguments: Mapping, seq_len: int, batch_size: int) -> TokenizedCorpus:
        """``corpora[index]``'s :class:`TokenizedCorpus`, given the mixture's shared settings (not taking its own)."""
        shared = {"seq_len": seq_len, "batch_size": batch_size, "seed": self.order_seed}
        if set(arguments) & set(shared):  # set there, it would be silently overridden
            raise ValueError(f"MixedCorpus: corpora[{index}] sets {', '.join(sorted(set(arguments) & set(shared)))}; "
                             "the mixture's seq_len, batch_size and seed are every corpus's: set them on MixedCorpus")
        known = inspect.signature(TokenizedCorpus).parameters
        unknown = [key for key in arguments if key not in known]
        if unknown:
            hint = did_you_mean(unknown, known)
            raise ValueError(f"MixedCorpus: corpora[{index}] has {', '.join(map(repr, unknown))}, not an argument of "
                             f"TokenizedCorpus" + (f" ({hint})" if hint else
                                                   f"; it takes {', '.join(k for k in known if k not in shared)}"))
        return TokenizedCorpus(**{**dict(arguments), **shared})

    def setup(self, stage: str | None = None) -> None:
        for corpus in self.corpora:
            corpus.setup(stage)
        hashes = {corpus.meta["tokenizer_hash"] for corpus in self.corpora}
        if len(hashes) > 1:
            raise ValueError("MixedCorpus: the corpora are tokenized differently; give them one tokenizer file "
                             "(tokenizer: …), so a token means the same in each")
        if self._train is None:
            self._train = MixtureWindows([c.windows("train") for c in self.corpora], self.weights, self.order_seed)

    def prepare_data(self) -> None:
        for corpus in self.corpora:
            corpus.prepare_data()

    @property
    def end_of_document(self) -> int:
        return self.corpora[0].end_of_document

    @property
    def start_of_document(self) -> int:
        return self.corpora[0].start_of_document

    def tokenizer_fingerprint(self) -> str:
        return self.corpora[0].tokenizer_fingerprint()  # (one tokenizer for all: setup checks)

    def data_fingerprint(self) -> str:
        """A hash of the corpora's own, in order (their weights are settings)."""
        keys = [corpus.data_fingerprint() for corpus in self.corpora]
        return hashlib.sha256(json.dumps(keys).encode()).hexdigest()[:16]

    @property
    def tokenizer_path(self) -> str | None:
        return self.corpora[0].tokenizer_path

    def encode(self, text: str) -> list[int]:
        return self.corpora[0].encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.corpora[0].decode(ids)

    def validation_tokens(self):
        import torch

        return torch.cat([c.validation_tokens() for c in self.corpora])

    def train_dataloader(self) -> DataLoader:
        self.setup()
        return self.train_loader(self._train)

    def val_dataloader(self) -> DataLoader:
        self.setup()
        return DataLoader(ConcatDataset([c.windows("val") for c in self.corpora]), batch_size=self.batch_size,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0)
