"""A Hugging Face ``datasets`` dataset as a source of documents for :class:`recipes.data.TokenizedCorpus`.

    data:
      class_path: recipes.data.TokenizedCorpus
      init_args:
        dataset: {path: my_saved_dataset}                                    # a save_to_disk folder
        dataset: {path: json, data_files: "books/*.jsonl"}                    # load_dataset on local files
        dataset: {path: wikitext, name: wikitext-2-raw-v1, revision: b08601e}  # a hub dataset (a connected machine)
        dataset: {path: json, data_files: "big/*.jsonl", streaming: true}     # read as a stream, never held whole

The documents go into the same token cache as files do, with the same resumable training order.
``datasets`` is an optional dependency: ``pip install "hybrid-zoo[datasets]"``.
"""

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path


FILE_READERS = {"json": ".jsonl", "csv": ".csv", "text": ".txt", "parquet": ".parquet", "arrow": ".arrow"}
"""``datasets``' builders that read local files, with the suffix of their files."""


@dataclass
class HFDataset:
    """Which dataset: ``path`` is a ``save_to_disk`` folder, or the first argument of ``datasets.load_dataset``
    (a builder such as ``json``/``text``/``parquet`` with ``data_files``, or a hub name) with its ``name``,
    ``data_files``, ``split`` (default ``train``), ``revision`` and ``streaming``."""

    path: str
    name: str | None = None
    data_files: str | list[str] | dict | None = None
    split: str = "train"
    revision: str | None = None
    streaming: bool = False

    def __post_init__(self):
        suffix = FILE_READERS.get(self.path)
        if suffix is not None and self.data_files is None and not self.saved():
            raise ValueError(f"TokenizedCorpus: dataset path {self.path!r} is datasets' reader of {suffix} files; name "
                             f"them in data_files, e.g. {{path: {self.path}, data_files: \"books/*{suffix}\"}} (without "
                             "them, datasets reads the working folder's files)")

    def saved(self) -> bool:
        folder = Path(self.path).expanduser()
        return folder.is_dir() and ((folder / "dataset_info.json").is_file() or (folder / "state.json").is_file()
                                    or (folder / "dataset_dict.json").is_file())

    def load(self):
        datasets = _datasets()
        if self.saved():
            loaded = datasets.load_from_disk(str(Path(self.path).expanduser()))
            if isinstance(loaded, datasets.DatasetDict):
                if self.split not in loaded:
                    raise ValueError(f"TokenizedCorpus: {self.path} has splits {sorted(loaded)}, not {self.split!r}")
                loaded = loaded[self.split]
            return loaded.to_iterable_dataset() if self.streaming else loaded
        return datasets.load_dataset(self.path, self.name, data_files=self.data_files_once(), split=self.split,
                                     revision=self.revision, streaming=self.streaming)

    def documents(self, text_field: str) -> Iterator[str]:
        for number, row in enumerate(self.load()):
            text = row.get(text_field) if isinstance(row, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"TokenizedCorpus: dataset {self.path!r}, row {number}: no string field {text_field!r} "
                                 f"(its fields: {sorted(row) if isinstance(row, dict) else type(row).__name__})")
            yield text

    def expanded_data_files(self) -> str | list[str] | dict | None:
        """``data_files`` with ``~`` expanded in each pattern (``datasets`` would look for a folder named ``~``)."""
        expand = lambda files: [expand(f) for f in files] if isinstance(files, (list, tuple)) else (  # noqa: E731
            {split: expand(f) for split, f in files.items()} if isinstance(files, dict)
            else str(Path(files).expanduser()) if isinstance(files, str) and "://" not in files else files)
        return expand(self.data_files)

    def data_files_once(self) -> str | list[str] | dict | None:
        """:meth:`expanded_data_files`, each split's local files listed once where its patterns name one twice
        (overlapping globs, one file by two names), with a note: ``datasets`` reads such a file as often as named, so
        its rows fell on both sides of the every-n-th split, validation text trained on. Unchanged otherwise."""
        from recipes.data.corpus import note_files_named_twice

        base = self.files_base()

        def once(patterns):
            listed = [patterns] if isinstance(patterns, str) else patterns
            if not isinstance(listed, (list, tuple)) or any("://" in pattern for pattern in listed):
                return patterns  # (none, or remote files: read as given)
            named = {}
            for pattern in listed:
                for file in matched_files(pattern, base):
                    named.setdefault(Path(file).resolve(), []).append(pattern)
            if all(len(found) == 1 for found in named.values()):
                return patterns
            note_files_named_twice(named, "data_files")
            return [str(file) for file in named]

        files = self.expanded_data_files()
        return {split: once(f) for split, f in files.items()} if isinstance(files, dict) else once(files)

    def patterns(self) -> list[str]:
        """Every pattern ``data_files`` names (of every split), ``~`` expanded."""
        files = self.expanded_data_files()
        return [f for v in (files.values() if isinstance(files, dict) else [files])
                for f in ([v] if isinstance(v, str) else v or [])]

    def data_file_paths(self) -> list[Path]:
        """The local files ``data_files`` names, matched as ``datasets`` matches them (:func:`matched_files`),
        relative to a local dataset folder ``path`` as ``datasets`` reads them, else to the working folder."""
        return sorted({Path(f) for pattern in self.patterns() for f in matched_files(pattern, self.files_base())})

    def files_base(self) -> str | None:
        """What ``data_files`` are relative to: a local dataset folder ``path``, as ``datasets`` reads them (None: the
        working folder)."""
        base = Path(self.path).expanduser()
        return str(base) if base.is_dir() else None

    def identity(self) -> list:
        """What the tokens depend on: the files' content for a saved folder or local data files, else the name,
        configuration, split and revision (pin ``revision`` for a hub dataset that may change)."""
        files = []
        if self.saved():
            files = sorted(p for p in Path(self.path).expanduser().rglob("*") if p.is_file())
        elif self.data_files is not None:
            files = self.data_file_paths()
        from recipes.data.corpus import file_hash

        settings = {k: v for k, v in asdict(self).items() if k != "streaming"}  # streaming reads the same rows
        return [json.dumps(settings, sort_keys=True, default=str),
                [[str(f.resolve()), f.stat().st_size, file_hash(f)] for f in files]]

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.identity()).encode()).hexdigest()[:16]


def _datasets():
    try:
        import datasets
    except ImportError:
        raise ImportError('TokenizedCorpus: a `dataset` source needs the datasets package: pip install '
                          '"hybrid-zoo[datasets]" (or pip install datasets)') from None
    return datasets


def matched_files(pattern: str, base: str | None = None) -> list[str]:
    """The local files ``datasets.load_dataset`` reads for one ``data_files`` pattern, matched by ``datasets``' own
    resolver (its ``**`` takes files at any depth, the folder itself included, where Python's ``glob`` takes one
    level: the tokens' identity missed the files an edit then changed); none for a remote one (``hf://``, ``https://``:
    its settings are its identity). Relative to ``base``, a local dataset folder (default: the working folder). A
    pattern that matches nothing is named, a folder with the patterns that read it."""
    if "://" in pattern:
        return []
    resolve_pattern = _datasets().data_files.resolve_pattern

    try:
        return resolve_pattern(pattern, base_path=base or os.getcwd())
    except FileNotFoundError:
        folder = (Path(base or ".") / pattern).is_dir()
        hint = (f": it is a folder; name its files, e.g. '{Path(pattern) / '*.jsonl'}' (or '{Path(pattern) / '**'}' "
                "for every file under it)" if folder else "")
        raise FileNotFoundError(f"TokenizedCorpus: dataset data_files {pattern!r} matches no file{hint}") from None
