"""TokenizedCorpus: text → cache → tokens round trips for every format, the cache's reuse and rebuild,
the split by documents, the token width, and the errors that name the problem."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers

from recipes.data import TokenizedCorpus
from recipes.data import corpus as corpus_module

DOCUMENTS = [f"Document {i}: the {'quick ' * (i % 5)}brown fox {i * 7} jumps.\nSecond line ünïcode {i}." for i in range(40)]


def write(tmp_path, fmt: str, documents=DOCUMENTS) -> str:
    if fmt == "txt":  # one file per document
        for i, document in enumerate(documents):
            (tmp_path / f"doc{i:03d}.txt").write_text(document, encoding="utf-8")
        return str(tmp_path / "doc*.txt")
    if fmt == "txt-separated":
        (tmp_path / "all.txt").write_text("<DOC>".join(documents), encoding="utf-8")
        return str(tmp_path / "all.txt")
    if fmt == "jsonl":
        with open(tmp_path / "all.jsonl", "w", encoding="utf-8") as f:
            for document in documents:
                f.write(json.dumps({"body": document, "id": 1}) + "\n")
        return str(tmp_path / "all.jsonl")
    import pyarrow
    import pyarrow.parquet

    pyarrow.parquet.write_table(pyarrow.table({"content": documents}), tmp_path / "all.parquet", row_group_size=7)
    return str(tmp_path / "all.parquet")


def corpus(tmp_path, paths, **kwargs) -> TokenizedCorpus:
    options = dict(vocab_size=320, seq_len=8, batch_size=2, val_fraction=0.1, cache_dir=str(tmp_path / "cache"),
                   text_field="body", column="content", seed=0)
    return TokenizedCorpus(paths, **{**options, **kwargs})


def documents_of(data: TokenizedCorpus, split: str) -> list[str]:
    tokens = np.fromfile(data.cache / f"{split}.bin", dtype=data.meta["dtype"]).tolist()
    end = data.meta["end_of_document"]
    assert tokens[-1] == end
    documents, current = [], []
    for token in tokens:
        if token == end:
            documents.append(data.decode(current))
            current = []
        else:
            current.append(token)
    return documents


@pytest.mark.parametrize("fmt", ["txt", "txt-separated", "jsonl", "parquet"])
def test_text_to_cache_to_tokens_round_trips_and_splits_by_documents(tmp_path, fmt):
    extra = {"txt_separator": "<DOC>"} if fmt == "txt-separated" else {}
    data = corpus(tmp_path, write(tmp_path, fmt), **extra)
    data.setup()
    train, val = documents_of(data, "train"), documents_of(data, "val")
    assert val == DOCUMENTS[9::10]  # every 10th document, whole
    assert train == [d for i, d in enumerate(DOCUMENTS) if i % 10 != 9]
    assert data.meta["documents"] == {"train": 36, "val": 4} and data.meta["dtype"] == "uint16"
    window = data.windows("train")[1]
    assert torch.equal(window["input_ids"][1:], window["labels"][:-1]) and window["input_ids"].dtype == torch.int64


def test_markdown_restructuredtext_and_latex_files_are_read_as_plain_text(tmp_path):
    """A folder of notes (``docs/*.md``) was refused for its suffix: each plain-text suffix now gives the documents,
    and the tokens, that the same text in a ``.txt`` file gives."""
    for suffix in corpus_module.PLAIN_TEXT:
        folder = tmp_path / suffix.lstrip(".")
        folder.mkdir()
        (folder / f"all{suffix}").write_text("<DOC>".join(DOCUMENTS), encoding="utf-8")
        data = corpus(folder, str(folder / f"all{suffix}"), txt_separator="<DOC>")
        data.setup()
        assert documents_of(data, "val") == DOCUMENTS[9::10], suffix
        assert documents_of(data, "train") == [d for i, d in enumerate(DOCUMENTS) if i % 10 != 9], suffix
    assert set(corpus_module.PLAIN_TEXT) == {".txt", ".text", ".md", ".markdown", ".rst", ".tex"}
    with pytest.raises(ValueError, match="the corpus has 1: split all.md into documents with txt_separator"):
        corpus(tmp_path / "md", str(tmp_path / "md" / "all.md")).setup()  # one file, one document, as for .txt


def test_too_few_documents_for_a_validation_split_names_the_way_out(tmp_path):
    """One .txt file is one document, so it has no validation text whatever val_fraction says: the error says to
    split it (txt_separator), which then gives a corpus that trains; a corpus of many documents keeps the old hint."""
    (tmp_path / "all.txt").write_text("\n\n".join(DOCUMENTS), encoding="utf-8")
    with pytest.raises(ValueError, match=r"the val split has 0 tokens \(0 documents\).*every 10th document and the "
                                         r"corpus has 1: split all.txt into documents with txt_separator"):
        corpus(tmp_path, str(tmp_path / "all.txt")).setup()
    corpus(tmp_path, str(tmp_path / "all.txt"), txt_separator="\n\n").setup()  # 40 documents: 4 for validation
    with pytest.raises(ValueError, match="use more text, a larger val_fraction or a shorter seq_len") as info:
        corpus(tmp_path, write(tmp_path, "jsonl"), seq_len=4000).setup()
    assert "txt_separator" not in str(info.value)
    (tmp_path / "ten").mkdir()  # as many documents as val_every: one of them validates, and it is too short
    with pytest.raises(ValueError, match=r"the val split has \d+ tokens \(1 document\), .*use more text"):
        corpus(tmp_path / "ten", write(tmp_path / "ten", "jsonl", DOCUMENTS[:10]), seq_len=100).setup()


@pytest.mark.parametrize("separator", ["<DOC>", "\n<DOC>\n"])
def test_a_long_txt_document_is_read_in_pieces_and_still_round_trips(tmp_path, monkeypatch, separator):
    monkeypatch.setattr(corpus_module, "PIECE_BYTES", 50)  # many pieces per document
    (tmp_path / "all.txt").write_text(separator.join(DOCUMENTS), encoding="utf-8")
    # a separator over two lines must be found even when a piece is cut between them
    data = corpus(tmp_path, str(tmp_path / "all.txt"), txt_separator=separator)
    data.setup()
    assert documents_of(data, "val") == DOCUMENTS[9::10]
    assert documents_of(data, "train") == [d for i, d in enumerate(DOCUMENTS) if i % 10 != 9]


def test_the_cache_is_reused_and_rebuilt_when_a_file_or_the_tokenizer_changes(tmp_path, monkeypatch):
    paths = write(tmp_path, "jsonl")
    first = corpus(tmp_path, paths)
    first.setup()

    def no_build(*args, **kwargs):
        raise AssertionError("the cache was rebuilt")

    with monkeypatch.context() as patch:
        patch.setattr(TokenizedCorpus, "_train_bpe", no_build)
        patch.setattr(corpus_module, "document_pieces", no_build)
        again = corpus(tmp_path, paths)
        again.setup()
    assert again.cache == first.cache and again.encode("brown fox") == first.encode("brown fox")

    write(tmp_path, "jsonl", DOCUMENTS[:-1])  # a file changed
    changed = corpus(tmp_path, paths)
    changed.setup()
    assert changed.cache != first.cache and changed.meta["documents"] == {"train": 36, "val": 3}

    tokenizer_file = tmp_path / "words.json"
    word_level(tokenizer_file, ["brown", "fox"])
    with_file = corpus(tmp_path, paths, tokenizer=str(tokenizer_file))
    with_file.setup()
    word_level(tokenizer_file, ["brown", "fox", "quick"])  # the tokenizer changed
    rebuilt = corpus(tmp_path, paths, tokenizer=str(tokenizer_file))
    rebuilt.setup()
    assert len({with_file.cache, rebuilt.cache, changed.cache}) == 3
    assert rebuilt.vocab_size == with_file.vocab_size + 1


def word_level(path, words):
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))


def test_a_tokenizer_file_encodes_without_the_corpus_as_the_token_cache_does(tmp_path):
    """With a tokenizer file, encode/decode, the end-of-document id and the fingerprint come from the file (the
    end-of-document token added as the cache adds it), without tokenizing the corpus, and equal the cache's."""
    word_level(tmp_path / "words.json", ["brown", "fox", "quick"])  # no end-of-document token: one is added
    paths = write(tmp_path, "jsonl")
    unbuilt = corpus(tmp_path, paths, tokenizer=str(tmp_path / "words.json"))
    text = "quick brown fox jumps"
    ids, end, fingerprint = unbuilt.encode(text), unbuilt.end_of_document, unbuilt.tokenizer_fingerprint()
    assert unbuilt.meta is None and not any(unbuilt.cache_root.glob("*"))  # nothing tokenized, no cache written
    built = corpus(tmp_path, paths, tokenizer=str(tmp_path / "words.json"))
    built.setup()
    assert (ids, end, fingerprint) == (built.encode(text), built.meta["end_of_document"], built.meta["tokenizer_hash"])
    assert ids == [3, 1, 2, 0] and end == 4 and unbuilt.decode(ids) == built.decode(ids)
    assert corpus(tmp_path, paths, tokenizer=str(tmp_path / "words.json"), padded_vocab_size=64).vocab_size == 64
    with pytest.raises(ValueError, match=r"padded_vocab_size=4 is below the 5 tokens of .*words.json \(its end-of-doc"):
        corpus(tmp_path, paths, tokenizer=str(tmp_path / "words.json"), padded_vocab_size=4)
    assert corpus(tmp_path, paths, tokenizer=str(tmp_path / "words.json"), padded_vocab_size=5).vocab_size == 5


def test_a_vocabulary_past_65536_is_stored_in_uint32(tmp_path):
    words = [f"w{i}" for i in range(70_000)]
    word_level(tmp_path / "big.json", words)
    documents = [" ".join(words[i::997]) for i in range(30)]  # ids up to 70,000
    data = corpus(tmp_path, write(tmp_path, "jsonl", documents), tokenizer=str(tmp_path / "big.json"))
    assert data.vocab_size == 70_002  # [UNK], the words, and the end-of-document token it adds
    data.setup()
    assert data.meta["dtype"] == "uint32"
    tokens = np.fromfile(data.cache / "train.bin", dtype="uint32")
    assert tokens.max() == data.meta["end_of_document"] == 70_001 and (tokens > 65_535).sum() > 100
    assert documents_of(data, "train")[0].split() == documents[0].split()
    (tmp_path / "edge").mkdir()  # 65,536 tokens in all: ids up to 65,535, which uint16 holds
    word_level(tmp_path / "edge.json", words[:65_534])
    edge_documents = [" ".join(words[i:65_534:997]) for i in range(30)]
    edge = corpus(tmp_path / "edge", write(tmp_path / "edge", "jsonl", edge_documents),
                  tokenizer=str(tmp_path / "edge.json"))
    edge.setup()
    assert edge.vocab_size == 65_536 and edge.meta["dtype"] == "uint16"
    assert np.fromfile(edge.cache / "train.bin", dtype="uint16").max() == edge.meta["end_of_document"] == 65_535


def test_with_no_paths_it_tokenizes_the_pydoc_topics(tmp_path):
    data = TokenizedCorpus(cache_dir=str(tmp_path), vocab_size=400, seq_len=64, val_fraction=0.1)
    data.setup()
    from pydoc_data.topics import topics

    assert data.meta["documents"]["train"] + data.meta["documents"]["val"] == len(topics)
    assert data.decode(data.encode("The with statement")) == "The with statement"
    assert max(data.encode("The with statement")) < data.vocab_size


def test_the_training_order_resumes_exactly(tmp_path):
    data = corpus(tmp_path, write(tmp_path, "jsonl"))
    data.setup()
    loader = data.train_dataloader()
    batches = iter(loader)
    for _ in range(3):
        next(batches)
        loader.took_batch(0)
    rest = [b["input_ids"] for b in batches]
    resumed = corpus(tmp_path, write(tmp_path, "jsonl"))  # same files, same times: the same cache
    resumed.setup()
    loader2 = resumed.train_dataloader()
    loader2.load_state_dict(loader.state_dict() | {"batches": 3})
    got = [b["input_ids"] for b in loader2]
    assert len(got) == len(rest) > 0 and all(torch.equal(a, b) for a, b in zip(got, rest))


@pytest.mark.parametrize("make, message", [
    (lambda p: TokenizedCorpus(str(p / "missing.txt")), "missing.txt' is not a file"),
    (lambda p: TokenizedCorpus(str(p / "english.jsonl")),  # an unprepared bundled corpus: the command that makes it
     "english.jsonl' is not a file: prepare it with python -m recipes.corpora prepare english --out "),
    (lambda p: TokenizedCorpus(str(p / "nothing*.jsonl")), "matches no file"),
    (lambda p: TokenizedCorpus(str(p)), "' is a folder; name its files with a glob, such as '"),
    (lambda p: (p / "a.csv").write_text("x") and TokenizedCorpus(str(p / "a.csv")),
     "has suffix '.csv'; supported: .jsonl, .parquet and the plain text of .txt, .text, .md, .markdown, .rst, .tex"),
    (lambda p: TokenizedCorpus(tokenizer=str(p / "none.json")), "tokenizer='"),
    (lambda p: TokenizedCorpus(vocab_size=100), "vocab_size=100"),
    (lambda p: TokenizedCorpus(val_fraction=1.5), "val_fraction=1.5"),
    (lambda p: TokenizedCorpus(val_fraction=0), "val_fraction=0 must lie in (0, 1)"),  # no validation text at all
    (lambda p: TokenizedCorpus(val_fraction=0.7), "val_fraction=0.7: validation takes every n-th whole document, at "
                                                  "most every 2nd (0.5)"),  # (taken as 0.5 before)
    (lambda p: TokenizedCorpus(str(p / "notes.jsonl")), "notes.jsonl' is not a file$"),  # no hint: not a bundled corpus
    (lambda p: TokenizedCorpus(str(p / "english.txt")), "english.txt' is not a file$"),
    (lambda p: TokenizedCorpus(domains="even"), "domains='even' must be a non-empty list of names"),
    (lambda p: TokenizedCorpus(domains=[]), "domains=[] must be a non-empty list of names"),
    (lambda p: TokenizedCorpus(domains=["even", 2]), "domains=['even', 2] must be a non-empty list of names"),
    (lambda p: TokenizedCorpus(domains=["even"]), "domains select .jsonl documents by their domain field; these paths "
                                                  "are not all .jsonl: None"),  # (the pydoc topics have no domains)
    (lambda p: (p / "a.jsonl").write_text("{}") and (p / "b.txt").write_text("x") and TokenizedCorpus(
        [str(p / "a.jsonl"), str(p / "b.txt")], domains=["even"]), "these paths are not all .jsonl"),
    (lambda p: TokenizedCorpus(end_of_document_token=""), "end_of_document_token='' must be a token's text"),
    (lambda p: TokenizedCorpus(end_of_document_token=5), "end_of_document_token=5 must be a token's text"),
    (lambda p: TokenizedCorpus(padded_vocab_size=300), "padded_vocab_size pads a tokenizer file's vocabulary; a "
                                                       "trained BPE has vocab_size tokens"),
    (lambda p: TokenizedCorpus(seq_len=0), "seq_len=0 and batch_size=16 must be >= 1"),
    (lambda p: TokenizedCorpus(batch_size=0), "seq_len=256 and batch_size=0 must be >= 1"),
    (lambda p: TokenizedCorpus(txt_separator=""), "txt_separator must not be empty (None: one document per file)"),
    # (an empty list was a corpus of 0 documents, an empty pattern the working folder)
    (lambda p: TokenizedCorpus([]), "paths=[] names no file; give files or glob patterns (or no paths: the pydoc"),
    (lambda p: TokenizedCorpus(""), "paths='' names no file"),
    (lambda p: TokenizedCorpus([str(p), ""]), "names no file"),
])
def test_bad_arguments_are_named(tmp_path, make, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message.replace(".", r"\.").replace("(", r"\(")
                       .replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        make(tmp_path)


def test_the_smallest_settings_each_check_allows_are_taken(tmp_path):
    """The edges of the refusals above: a window of one token, a 257-token BPE (the bytes and the end of document),
    the run's seed when none is given, plain windows unless ``packed``."""
    torch.manual_seed(123)
    data = TokenizedCorpus(seq_len=1, batch_size=1, vocab_size=257, cache_dir=str(tmp_path))
    assert (data.seq_len, data.vocab_size, data.order_seed, data.packed) == (1, 257, 123, False)
    assert TokenizedCorpus(seed=7, cache_dir=str(tmp_path)).order_seed == 7
    assert TokenizedCorpus(val_fraction=0.5, cache_dir=str(tmp_path)).val_every == 2  # (the most validation there is)


def test_bad_files_are_named_with_their_line_or_column(tmp_path, monkeypatch):
    (tmp_path / "bad.jsonl").write_text('{"body": "ok"}\n{"text": "no body"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl, line 2: no field 'body' \(its fields: text\); text_field names"):
        corpus(tmp_path, str(tmp_path / "bad.jsonl")).setup()
    (tmp_path / "cut.jsonl").write_text('{"body": "ok"}\n{"body": "cut off\n')
    with pytest.raises(ValueError, match=r"cut.jsonl, line 2 is not JSON \(.*\): a .jsonl file holds one JSON object a line"):
        corpus(tmp_path, str(tmp_path / "cut.jsonl")).setup()
    (tmp_path / "list.jsonl").write_text('["body", "ok"]\n')
    with pytest.raises(ValueError, match=r"list.jsonl, line 1: no field 'body' \(it is a JSON list, not an object\)"):
        corpus(tmp_path, str(tmp_path / "list.jsonl")).setup()
    paths = write(tmp_path, "parquet")
    with pytest.raises(ValueError, match=r"has no column 'body'"):
        corpus(tmp_path, paths, column="body").setup()
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # as if pyarrow were not installed
    with pytest.raises(ImportError, match=r"pip install 'hybrid-zoo\[parquet\]'"):
        corpus(tmp_path, paths, cache_dir=str(tmp_path / "other")).setup()
    short = write(tmp_path, "jsonl", DOCUMENTS[:3])
    with pytest.raises(ValueError, match=r"the val split has 0 tokens"):
        corpus(tmp_path, short).setup()


def test_the_bpe_never_sees_the_validation_documents(tmp_path):
    # A word repeated only in validation documents would become one token if the BPE were trained on them.
    documents = [f"plain words {i} " * 5 + ("qzvxkjw " * 60 if i % 10 == 9 else "") for i in range(40)]
    data = corpus(tmp_path, write(tmp_path, "jsonl", documents))
    data.setup()
    assert len(data.encode("qzvxkjw")) >= 4
    assert len(data.encode(" plain words")) <= 2  # while the training documents' words did merge


def test_the_benchmarks_generated_corpus_has_the_size_and_documents_it_says(tmp_path):
    from recipes.benchmarks import corpus as corpus_bench

    paths = corpus_bench.generate(tmp_path / "corpus", 1, "txt")
    size = sum((tmp_path / "corpus" / p).stat().st_size for p in paths)
    assert 1e6 <= size < 1.05e6
    separators = sum(open(p, encoding="utf-8").read().count("\n<DOC>\n") for p in paths)
    data = corpus(tmp_path, paths, txt_separator="\n<DOC>\n", vocab_size=400)
    data.setup()
    # each document ends at a separator; the text after the last one is one more (empty) document
    assert data.meta["documents"]["train"] + data.meta["documents"]["val"] == separators + len(paths)


def test_packed_windows_open_a_document_at_each_end_of_document_and_the_model_keeps_them_apart(tmp_path):
    from recipes import LanguageModel

    data = corpus(tmp_path, write(tmp_path, "jsonl"), packed=True, seq_len=48)
    data.setup()
    end = data.meta["end_of_document"]
    training_text = "".join(documents_of(data, "train"))
    lm = LanguageModel(32, "AM", {"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2}}},
                       vocab_size=data.vocab_size).eval()
    for i in (0, 3, 7):
        item = data.windows("train")[i]
        ids, documents = item["input_ids"], item["document_ids"]
        pieces = ids.split(torch.unique_consecutive(documents, return_counts=True)[1].tolist())
        assert len(pieces) >= 2
        for n, piece in enumerate(pieces):
            assert (piece == end).sum() == (n > 0) and (n == 0 or piece[0] == end)  # each opens with its end token
            assert data.decode([t for t in piece.tolist() if t != end]) in training_text
        # The recipe's loss reads the batch's documents: its logits are those of each piece alone.
        batch = {k: v[None] for k, v in item.items()}
        with torch.no_grad():
            packed = lm.model.lm_head(lm._hidden(batch))[0]  # [T, V]
            alone = torch.cat([lm.model(piece[None])[0] for piece in pieces])
        torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("damage, problem", [
    (lambda c: (c / "train.bin").write_bytes((c / "train.bin").read_bytes()[: (c / "train.bin").stat().st_size // 2]),
     "train.bin has"),
    (lambda c: (c / "train.bin").write_bytes(b""), "train.bin has 0 bytes"),
    (lambda c: word_level(c / "tokenizer.json", ["brown", "fox"]), "tokenizer.json is not the tokenizer"),
    (lambda c: (c / "meta.json").unlink(), "meta.json is missing"),
    (lambda c: (c / "meta.json").write_text('{"dtype": "uint16", "tok'), "meta.json is not valid JSON"),
    (lambda c: (c / "val.bin").unlink(), "val.bin is missing"),
    (lambda c: (c / "meta.json").write_text(json.dumps({**json.loads((c / "meta.json").read_text()), "version": 1})),
     "meta.json is not of cache version 2"),  # an older layout, read as if it were this one
    (lambda c: (c / "meta.json").write_text("[2]"), "meta.json is not of cache version 2"),
    (lambda c: (c / "meta.json").write_text(json.dumps({k: v for k, v in json.loads((c / "meta.json").read_text()).items()
                                                        if k != "tokens"})), "meta.json lacks 'tokens'"),
], ids=["train-halved", "train-empty", "tokenizer-swapped", "meta-deleted", "meta-corrupted", "val-deleted",
        "meta-old-version", "meta-not-a-mapping", "meta-without-tokens"])
def test_a_damaged_cache_is_named_and_rebuilt(tmp_path, capsys, damage, problem):
    paths = write(tmp_path, "jsonl")
    first = corpus(tmp_path, paths)
    assert first.cache_problem() == "it does not exist"  # (built, not rebuilt: no word of damage)
    first.setup()
    assert "is damaged (" not in capsys.readouterr().err
    tokens = {split: np.fromfile(first.cache / f"{split}.bin", dtype=first.meta["dtype"]) for split in ("train", "val")}
    damage(first.cache)
    again = corpus(tmp_path, paths)
    assert problem in again.cache_problem()
    again.setup()
    assert f"the token cache {first.cache} is damaged ({problem}" in capsys.readouterr().err
    assert again.cache == first.cache and again.cache_problem() is None
    for split, expected in tokens.items():
        assert np.array_equal(np.fromfile(again.cache / f"{split}.bin", dtype=again.meta["dtype"]), expected)


def test_a_documents_own_end_of_document_text_is_text_and_an_old_cache_that_made_it_the_token_is_rebuilt(tmp_path,
                                                                                                         capsys):
    """A document that writes ``<|endoftext|>`` (a page about tokenizers) keeps it as text: it was made the token, a
    false document boundary inside it (packed windows cut it in two; the model learned to end documents there). A cache
    made so, before 2026-12-05, holds more end-of-document tokens than documents: named and rebuilt; a sound cache of
    that time is counted once and marked, not rebuilt."""
    documents = [*DOCUMENTS[:19], "A tokenizer ends documents with <|endoftext|> as GPT-2's does.", *DOCUMENTS[19:]]
    data = corpus(tmp_path, write(tmp_path, "jsonl", documents))
    data.setup()
    assert sorted(documents_of(data, "train") + documents_of(data, "val")) == sorted(documents)  # (val: document 19)
    assert data.encode("<|endoftext|>") == [data.meta["end_of_document"]]  # (a prompt's is the token, as HF reads it)
    meta = json.loads((data.cache / "meta.json").read_text())
    del meta["ends_only_between_documents"]  # a cache made before it was recorded ...
    (data.cache / "meta.json").write_text(json.dumps(meta))
    built = (data.cache / "train.bin").stat().st_mtime_ns
    sound = corpus(tmp_path, write(tmp_path, "jsonl", documents))
    assert sound.cache_problem() is None and json.loads((data.cache / "meta.json").read_text())[
        "ends_only_between_documents"]  # ... counted, found sound, marked
    val = np.fromfile(data.cache / "val.bin", dtype=meta["dtype"])
    expected = val.copy()
    val[3] = meta["end_of_document"]  # ... and one whose document's text became the token
    val.tofile(data.cache / "val.bin")
    (data.cache / "meta.json").write_text(json.dumps(meta))
    again = corpus(tmp_path, write(tmp_path, "jsonl", documents))
    said = "val.bin holds 5 end-of-document tokens for 4 documents: a document's own '<|endoftext|>' text was made"
    assert said in again.cache_problem()
    again.setup()
    assert said in capsys.readouterr().err
    assert np.array_equal(np.fromfile(again.cache / "val.bin", dtype=meta["dtype"]), expected)
    assert built != (again.cache / "train.bin").stat().st_mtime_ns  # (rebuilt)


def test_a_corpus_edited_in_place_with_its_timestamp_restored_is_a_new_cache(tmp_path):
    import os

    paths = write(tmp_path, "jsonl")
    first = corpus(tmp_path, paths)
    first.setup()
    path = tmp_path / "all.jsonl"
    stat = path.stat()
    path.write_text(path.read_text().replace("brown", "green"))  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    edited = corpus(tmp_path, paths)
    edited.setup()
    assert edited.cache != first.cache
    assert "green" in "".join(documents_of(edited, "train")) and "brown" not in "".join(documents_of(edited, "train"))


def test_an_interrupted_build_leaves_nothing_that_survives_the_next_one(tmp_path):
    import subprocess

    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout)
    paths = write(tmp_path, "jsonl")
    data = corpus(tmp_path, paths)
    orphan = data.cache_root / f"{data.cache.name}.building-{dead}"
    orphan.mkdir(parents=True)
    (orphan / "train.bin").write_bytes(b"\x00" * 10)
    data.setup()
    assert not orphan.exists() and data.cache_problem() is None


def test_jsonl_blank_lines_domains_and_text_fields_are_read_or_named(tmp_path):
    """Blank lines are skipped; a document without the domain field, or whose text is not a string, is named with its
    file and line (a missing domain was skipped as if of another domain; a number was tokenized as its digits)."""
    (tmp_path / "gaps.jsonl").write_text("\n".join(json.dumps({"body": d}) + ("\n  " if i % 3 else "") for i, d in
                                                   enumerate(DOCUMENTS)) + "\n\n")
    data = corpus(tmp_path, str(tmp_path / "gaps.jsonl"))
    data.setup()
    assert sorted(documents_of(data, "train") + documents_of(data, "val")) == sorted(DOCUMENTS)
    (tmp_path / "nodomain.jsonl").write_text('{"body": "a", "domain": "x"}\n{"body": "b"}\n')
    with pytest.raises(ValueError, match=r"nodomain.jsonl, line 2: no field 'domain' to select domains \['x'\] by"):
        corpus(tmp_path, str(tmp_path / "nodomain.jsonl"), domains=["x"]).setup()
    (tmp_path / "number.jsonl").write_text('{"body": "a"}\n{"body": 17}\n')
    with pytest.raises(ValueError, match=r"number.jsonl, line 2: 'body' is int, not text"):
        corpus(tmp_path, str(tmp_path / "number.jsonl")).setup()


def test_a_file_named_twice_is_read_once_so_no_document_is_on_both_sides_of_the_split(tmp_path, capsys):
    """Overlapping globs, or one file by two names, read it once with a note: twice, its documents fell on both sides
    of the every-n-th split (37 documents, every 10th: the second copy's are shifted), validation text trained on."""
    paths = write(tmp_path, "jsonl", DOCUMENTS[:37])
    (tmp_path / "sub").mkdir()
    data = corpus(tmp_path, [paths, str(tmp_path / "*.jsonl"), str(tmp_path / "sub" / ".." / "all.jsonl")])
    data.setup()
    train, val = documents_of(data, "train"), documents_of(data, "val")
    assert not set(train) & set(val) and sorted(train + val) == sorted(DOCUMENTS[:37])
    assert f"all.jsonl (by {paths!r}, {str(tmp_path / '*.jsonl')!r}, " in capsys.readouterr().err
    corpus(tmp_path, paths)
    assert "note" not in capsys.readouterr().err  # (named once: no note)


def test_a_byte_order_mark_opening_a_file_is_not_text(tmp_path):
    """A UTF-8 byte-order mark (Windows tools write one) is read past: a ``.jsonl`` file's first line was refused as
    not JSON, and a ``.txt`` file's mark was trained on as a character of its document."""
    (tmp_path / "marked.jsonl").write_text("\ufeff" + "".join(json.dumps({"body": d}) + "\n" for d in DOCUMENTS),
                                           encoding="utf-8")
    data = corpus(tmp_path, str(tmp_path / "marked.jsonl"))
    data.setup()
    assert sorted(documents_of(data, "train") + documents_of(data, "val")) == sorted(DOCUMENTS)
    for i, document in enumerate(DOCUMENTS):
        (tmp_path / f"m{i:03d}.txt").write_text("\ufeff" + document, encoding="utf-8")
    data = corpus(tmp_path, str(tmp_path / "m*.txt"), cache_dir=str(tmp_path / "txt"))
    data.setup()
    assert sorted(documents_of(data, "train") + documents_of(data, "val")) == sorted(DOCUMENTS)


def test_a_double_star_pattern_reaches_nested_folders(tmp_path):
    for folder in ("a", "a/b", "a/b/c"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "d.txt").write_text(folder)
    files = corpus_module.corpus_files(str(tmp_path / "**" / "*.txt"))
    assert [f.relative_to(tmp_path).as_posix() for f in files] == ["a/b/c/d.txt", "a/b/d.txt", "a/d.txt"]


def test_a_long_txt_document_comes_in_pieces_cut_at_line_ends_that_join_to_it(tmp_path, monkeypatch):
    """A document is read a piece of about PIECE_BYTES at a time (a cut after the line that reaches it), never cutting
    a separator that the next line completes; ``documents`` joins the pieces again."""
    monkeypatch.setattr(corpus_module, "PIECE_BYTES", 16)
    (tmp_path / "lines.txt").write_text("abcdefg\n" * 5)  # lines of 8: a cut after every second one
    pieces = list(corpus_module._txt_pieces(tmp_path / "lines.txt", None))
    assert pieces == [("abcdefg\nabcdefg\n", False)] * 2 + [("abcdefg\n", True)]
    (tmp_path / "sep.txt").write_text("0123456789abcde\n\nxy\n")  # documents separated by a blank line
    pieces = list(corpus_module._txt_pieces(tmp_path / "sep.txt", "\n\n"))
    # the first line reaches 16: all of it goes but its last character, which the next line makes a separator
    assert pieces == [("0123456789abcde", False), ("", True), ("xy\n", True)]
    # only a separator's possible beginning is held back: holding len(separator) - 1 characters cut the word
    (tmp_path / "word.txt").write_text("abcdefghijklmnopqrstuvwxyz\n<DOC>\nxy\n")
    pieces = list(corpus_module._txt_pieces(tmp_path / "word.txt", "\n<DOC>\n"))
    assert pieces == [("abcdefghijklmnopqrstuvwxyz", False), ("", True), ("xy\n", True)]
    documents = ["line %d of a long document\n" % i * 3 for i in range(12)]
    (tmp_path / "long.txt").write_text("<DOC>".join(documents))
    data = corpus(tmp_path, str(tmp_path / "long.txt"), txt_separator="<DOC>", val_fraction=0.25)
    assert list(data.documents("train")) + list(data.documents("val")) == (
        [d for i, d in enumerate(documents) if i % 4 != 3] + documents[3::4])
    with pytest.raises(ValueError, match="TokenizedCorpus.documents: split='test' must be 'train' or 'val'"):
        list(data.documents("test"))


def test_memmap_windows_count_every_whole_window_and_pickle_without_their_map(tmp_path):
    import pickle

    np.arange(20, dtype="uint16").tofile(tmp_path / "t.bin")
    windows = corpus_module.MemmapWindows(tmp_path / "t.bin", "uint16", seq_len=4, stride=5)
    assert len(windows) == 4 and windows[3]["input_ids"].tolist() == [15, 16, 17, 18]  # 15 + 5 tokens: the last whole one
    assert windows[3]["labels"].tolist() == [16, 17, 18, 19]
    copy = pickle.loads(pickle.dumps(windows))  # (a worker process's copy maps the file itself)
    assert copy._tokens is None and copy[0]["input_ids"].tolist() == [0, 1, 2, 3]


def test_a_dataset_given_as_a_mapping_is_read_as_hfdataset(tmp_path):
    from recipes.data import HFDataset

    data = TokenizedCorpus(dataset={"path": "json", "data_files": str(tmp_path / "x.jsonl")}, cache_dir=str(tmp_path))
    assert data.dataset == HFDataset(path="json", data_files=str(tmp_path / "x.jsonl"))


def test_another_end_of_document_token_is_another_cache(tmp_path):
    paths = write(tmp_path, "jsonl")
    keys = {token: corpus(tmp_path, paths, end_of_document_token=token).cache_key()
            for token in ("<|endoftext|>", "</s>", "<eod>")}
    assert len(set(keys.values())) == 3


def test_a_start_of_document_token_opens_every_document_once_and_is_what_a_prompt_follows(tmp_path, monkeypatch):
    """A model imported from Hugging Face saw its ``<s>`` before each document: fine-tuned, it sees it there too (once
    per document, though a long one is read in pieces), and ``start_of_document`` is what ``generate`` and lm-eval's
    empty context put first. Without one, the end of the document before opens each one."""
    monkeypatch.setattr(corpus_module, "PIECE_BYTES", 50)  # several pieces per document
    word_level(tmp_path / "words.json", ["<s>", "brown", "fox", "quick", "<|endoftext|>"])
    documents = [" ".join(["quick brown fox"] * (1 + i % 9)) for i in range(30)]
    (tmp_path / "all.txt").write_text("\n<DOC>\n".join(documents))
    data = corpus(tmp_path, str(tmp_path / "all.txt"), tokenizer=str(tmp_path / "words.json"), txt_separator="\n<DOC>\n",
                  start_of_document_token="<s>")
    assert data.start_of_document == 1 and data.end_of_document == 5  # (from the file: nothing tokenized yet)
    data.setup()
    for split in ("train", "val"):
        tokens = np.fromfile(data.cache / f"{split}.bin", dtype=data.meta["dtype"]).tolist()
        opened = [tokens[0]] + [after for before, after in zip(tokens, tokens[1:]) if before == 5]
        assert tokens.count(1) == tokens.count(5) == data.meta["documents"][split] > 1
        assert opened == [1] * tokens.count(5) and tokens[-1] == 5  # each document opened by <s>, and only there
        held = [d for i, d in enumerate(documents) if (i % 10 == 9) == (split == "val")]
        assert tokens == [t for d in held for t in [1, *data.encode(d), 5]]
    plain = corpus(tmp_path, str(tmp_path / "all.txt"), tokenizer=str(tmp_path / "words.json"), txt_separator="\n<DOC>\n")
    assert plain.start_of_document == plain.end_of_document == 5 and plain.cache_key() != data.cache_key()
    with pytest.raises(ValueError, match=r"start_of_document_token='<bos>' is not a token of the tokenizer file "):
        corpus(tmp_path, str(tmp_path / "all.txt"), tokenizer=str(tmp_path / "words.json"), start_of_document_token="<bos>")
    with pytest.raises(ValueError, match=r"start_of_document_token='<s>' is not a token of a BPE trained on the corpus"):
        corpus(tmp_path, str(tmp_path / "all.txt"), start_of_document_token="<s>")
    with pytest.raises(ValueError, match=r"start_of_document_token='<\|endoftext\|>' is the end of document token"):
        corpus(tmp_path, str(tmp_path / "all.txt"), tokenizer=str(tmp_path / "words.json"),
               start_of_document_token="<|endoftext|>")


def test_encoding_adds_no_special_token_a_tokenizer_would_add_and_decoding_keeps_them(tmp_path):
    """A tokenizer file with a post-processor (a BOS before every text, as Llama's adds) gives the cache and
    ``encode`` the text's own tokens: the documents' boundaries are the end-of-document tokens alone. A trained
    corpus encodes before it is set up (its cache is built then)."""
    from tokenizers import processors

    word_level(tmp_path / "words.json", ["<s>", "brown", "fox", "quick"])
    tokenizer = Tokenizer.from_file(str(tmp_path / "words.json"))
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer.save(str(tmp_path / "bos.json"))
    paths = write(tmp_path, "jsonl", ["quick brown fox"] * 20)
    data = corpus(tmp_path, paths, tokenizer=str(tmp_path / "bos.json"), seq_len=2)
    assert data.encode("quick fox") == [4, 3]
    data.setup()
    assert 1 not in np.fromfile(data.cache / "train.bin", dtype=data.meta["dtype"]).tolist()
    end = data.meta["end_of_document"]
    assert data.decode([4, end, 2]) == "quick <|endoftext|> brown"
    trained = corpus(tmp_path, write(tmp_path, "jsonl"))
    assert trained.decode(trained.encode("brown fox")) == "brown fox" and trained.meta is not None


def test_a_split_of_exactly_one_window_is_taken_and_one_token_less_is_refused(tmp_path):
    paths = write(tmp_path, "jsonl")
    data = corpus(tmp_path, paths)
    data.setup()
    fewest = min(data.meta["tokens"].values())
    corpus(tmp_path, paths, seq_len=fewest - 1).setup()  # (the cache is the same: seq_len is not in its key)
    with pytest.raises(ValueError, match=f"split has {fewest} tokens .*fewer than seq_len \\+ 1 = {fewest + 1}"):
        corpus(tmp_path, paths, seq_len=fewest).setup()


def test_domains_select_jsonl_documents_and_a_missing_domain_is_named(tmp_path):
    with open(tmp_path / "mixed.jsonl", "w", encoding="utf-8") as f:
        for i, document in enumerate(DOCUMENTS):
            f.write(json.dumps({"body": document, "domain": "odd" if i % 2 else "even"}) + "\n")
    even = corpus(tmp_path, str(tmp_path / "mixed.jsonl"), domains=["even"])
    even.setup()
    kept = documents_of(even, "train") + documents_of(even, "val")
    assert sorted(kept) == sorted(DOCUMENTS[::2]) and even.meta["domains"] == {"even": 20}
    both = corpus(tmp_path, str(tmp_path / "mixed.jsonl"), domains=["odd", "even"])
    both.setup()
    assert both.cache != even.cache and both.meta["documents"]["train"] + both.meta["documents"]["val"] == 40
    with pytest.raises(ValueError, match=r"has domain \['poetry'\]; of the domains asked for it found \['even'\]"):
        corpus(tmp_path, str(tmp_path / "mixed.jsonl"), domains=["even", "poetry"]).setup()
    with pytest.raises(ValueError, match="domains select .jsonl documents"):
        corpus(tmp_path, write(tmp_path, "txt"), domains=["even"])


def test_a_null_parquet_row_is_named(tmp_path):
    import pyarrow
    import pyarrow.parquet

    pyarrow.parquet.write_table(pyarrow.table({"content": ["fine text", None, "more"]}), tmp_path / "nulls.parquet")
    with pytest.raises(ValueError, match=r"nulls.parquet, row 1: column 'content' is null, not text"):
        corpus(tmp_path, str(tmp_path / "nulls.parquet")).setup()


def test_a_hugging_face_dataset_gives_the_same_tokens_as_its_files(tmp_path):
    """A save_to_disk folder, load_dataset on the jsonl, and the same streamed: each is the jsonl's tokens."""
    datasets = pytest.importorskip("datasets")
    from recipes.data import HFDataset

    paths = write(tmp_path, "jsonl")
    tokenizer = tmp_path / "words.json"
    word_level(tokenizer, ["brown", "fox", "quick", "jumps"])
    reference = corpus(tmp_path, paths, tokenizer=str(tokenizer))
    reference.setup()
    datasets.Dataset.from_dict({"body": DOCUMENTS}).save_to_disk(str(tmp_path / "saved"))
    for source in (HFDataset(path=str(tmp_path / "saved")), HFDataset(path="json", data_files=paths),
                   HFDataset(path="json", data_files=paths, streaming=True)):
        data = TokenizedCorpus(dataset=source, tokenizer=str(tokenizer), text_field="body", seq_len=8, batch_size=2,
                               val_fraction=0.1, cache_dir=str(tmp_path / "cache"), seed=0)
        data.setup()
        for split in ("train", "val"):
            assert np.array_equal(np.fromfile(data.cache / f"{split}.bin", dtype=data.meta["dtype"]),
                                  np.fromfile(reference.cache / f"{split}.bin", dtype=reference.meta["dtype"])), source
    with pytest.raises(ValueError, match=r"row 0: no string field 'text'"):
        TokenizedCorpus(dataset=HFDataset(path=str(tmp_path / "saved")), cache_dir=str(tmp_path / "c2")).setup()
    with pytest.raises(ValueError, match="give paths or a dataset, not both"):
        TokenizedCorpus(paths, dataset=HFDataset(path="json", data_files=paths))
    # a file reader without its files: it read the working folder's, and failed in datasets' words
    with pytest.raises(ValueError, match=r"dataset path 'json' is datasets' reader of .jsonl files; name them in "
                                         r"data_files, e.g. \{path: json, data_files: \"books/\*.jsonl\"\}"):
        HFDataset(path="json")
    assert HFDataset(path="json", data_files=paths).data_files == paths


def test_a_datasets_file_named_twice_is_read_once_as_paths_read_it(tmp_path, capsys):
    """``data_files`` that name one file twice (overlapping globs, two names; in a list or a split's entry, streamed
    or not) give the tokens of the file read once, with a note: ``datasets`` read it twice, validation text trained
    on (37 documents: the copies split apart)."""
    pytest.importorskip("datasets")
    from recipes.data import HFDataset

    paths = write(tmp_path, "jsonl", DOCUMENTS[:37])
    reference = corpus(tmp_path, paths)
    reference.setup()
    (tmp_path / "sub").mkdir()
    twice = [paths, str(tmp_path / "*.jsonl"), str(tmp_path / "sub" / ".." / "all.jsonl")]
    for n, source in enumerate((HFDataset(path="json", data_files=twice), HFDataset(path="json", data_files={
            "train": twice}), HFDataset(path="json", data_files=twice, streaming=True))):
        capsys.readouterr()
        data = corpus(tmp_path, None, dataset=source, cache_dir=str(tmp_path / f"c{n}"))
        data.setup()
        for split in ("train", "val"):
            assert documents_of(data, split) == documents_of(reference, split), source
        assert f"by data_files: {tmp_path / 'all.jsonl'} (by {paths!r}, " in capsys.readouterr().err
    assert HFDataset(path="json", data_files=[paths]).data_files_once() == [paths]  # named once: as given


def test_a_hugging_face_datasets_split_folder_and_identity(tmp_path):
    """A saved DatasetDict gives the named split (another is refused, naming those it has); a plain folder of files is
    load_dataset's, not a saved one; the identity the token cache is keyed by follows the files' content and every
    setting but ``streaming`` (which reads the same rows)."""
    datasets = pytest.importorskip("datasets")
    from recipes.data import HFDataset

    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a b", "c"]}),
                                   "test": datasets.Dataset.from_dict({"text": ["zz"]})})
    splits.save_to_disk(str(tmp_path / "splits"))
    saved = str(tmp_path / "splits")
    assert list(HFDataset(path=saved).documents("text")) == ["a b", "c"]
    assert list(HFDataset(path=saved, split="test", streaming=True).documents("text")) == ["zz"]
    with pytest.raises(ValueError, match=r"splits has splits \['test', 'train'\], not 'validation'"):
        list(HFDataset(path=saved, split="validation").documents("text"))
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "rows.jsonl").write_text(json.dumps({"text": "from a file"}) + "\n")
    assert not HFDataset(path=str(tmp_path / "plain")).saved() and HFDataset(path=saved).saved()
    for marker in ("dataset_info.json", "state.json", "dataset_dict.json"):  # any one of what save_to_disk writes
        (tmp_path / marker).mkdir()
        (tmp_path / marker / marker).write_text("{}")
        assert HFDataset(path=str(tmp_path / marker)).saved(), marker
    assert isinstance(HFDataset(path=saved).load(), datasets.Dataset)  # not streamed unless asked: a table, not a stream
    assert list(HFDataset(path=str(tmp_path / "plain")).documents("text")) == ["from a file"]

    rows = str(tmp_path / "plain" / "rows.jsonl")
    forms = [HFDataset(path="json", data_files=files) for files in (rows, [rows], {"train": rows})]
    before = [form.fingerprint() for form in forms]
    assert len(set(before)) == 3 and all(len(f) == 16 for f in before)  # (the settings differ in form)
    assert HFDataset(path="json", data_files=rows, streaming=True).fingerprint() == before[0]
    assert HFDataset(path="json", data_files=rows, split="test").fingerprint() != before[0]
    both = [HFDataset(path="json", data_files=dict(splits)).fingerprint()  # the same files, named in either order
            for splits in ([("train", rows), ("test", [rows])], [("test", [rows]), ("train", rows)])]
    assert both[0] == both[1]
    (tmp_path / "plain" / "rows.jsonl").write_text(json.dumps({"text": "edited"}) + "\n")
    assert all(form.fingerprint() != old for form, old in zip(forms, before))  # the content is in the identity
    edited = HFDataset(path=saved).fingerprint()
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["other"]})}).save_to_disk(saved)
    assert HFDataset(path=saved).fingerprint() != edited


def test_data_files_are_matched_as_datasets_matches_them_for_the_tokens_identity(tmp_path, monkeypatch):
    """The token cache's key hashes the files ``load_dataset`` reads: ``books/**/*.jsonl`` takes ``books/``'s own
    files too (Python's ``glob`` took only the subfolders', so an edit of ``books/a.jsonl`` reused the stale tokens);
    the files are those of Hugging Face's own builder; a folder or a pattern that matches nothing is named; ``~`` is
    the home folder, for the load as for the key."""
    import datasets

    from recipes.data import HFDataset

    monkeypatch.chdir(tmp_path)
    (tmp_path / "books" / "sub").mkdir(parents=True)
    for name in ("books/a.jsonl", "books/b.jsonl", "books/sub/c.jsonl"):
        (tmp_path / name).write_text(json.dumps({"text": f"the text of {name}"}) + "\n")
    source = HFDataset(path="json", data_files="books/**/*.jsonl")
    builder = datasets.load_dataset_builder("json", data_files="books/**/*.jsonl")
    assert [Path(f) for f, _, _ in source.identity()[1]] == sorted(Path(f) for f in builder.config.data_files["train"])
    assert len(source.identity()[1]) == 3
    before = source.fingerprint()
    (tmp_path / "books" / "a.jsonl").write_text(json.dumps({"text": "edited"}) + "\n")
    assert source.fingerprint() != before
    with pytest.raises(FileNotFoundError, match=r"data_files 'books' matches no file: it is a folder; name its files, "
                                                r"e.g. 'books/\*.jsonl'"):
        HFDataset(path="json", data_files="books").fingerprint()
    with pytest.raises(FileNotFoundError, match=r"data_files 'books/\*.txt' matches no file$"):
        HFDataset(path="json", data_files={"train": ["books/a.jsonl"], "test": "books/*.txt"}).fingerprint()
    monkeypatch.setenv("HOME", str(tmp_path))
    home = HFDataset(path="json", data_files={"train": "~/books/*.jsonl"})
    assert home.patterns() == [str(tmp_path / "books" / "*.jsonl")] and len(home.identity()[1]) == 2
    assert sorted(home.documents("text")) == ["edited", "the text of books/b.jsonl"]
    assert HFDataset(path="json", data_files="hf://datasets/x/y/*.jsonl").identity()[1] == []  # (remote: its name)
    local = HFDataset(path=str(tmp_path / "books"), data_files="*.jsonl")  # (a folder's data_files are relative to it)
    assert [Path(f).name for f, _, _ in local.identity()[1]] == ["a.jsonl", "b.jsonl"]
    assert sorted(local.documents("text")) == ["edited", "the text of books/b.jsonl"]


def test_a_missing_datasets_package_is_named(tmp_path, monkeypatch):
    from recipes.data import HFDataset

    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match=r'pip install "hybrid-zoo\[datasets\]"'):
        TokenizedCorpus(dataset=HFDataset(path="json", data_files="x.jsonl"), cache_dir=str(tmp_path)).setup()


def test_a_mixture_trains_validates_records_its_tokenizer_and_generates(tmp_path, monkeypatch, capsys):
    """A recipe on ``MixedCorpus`` end to end: the model's vocabulary is the mixture's, validation reads every
    corpus's held-out windows, the checkpoint records the shared tokenizer, and ``generate`` encodes the prompt
    and decodes the continuation with it."""
    from recipes.cli import main
    from recipes.generate import main as generate

    monkeypatch.chdir(tmp_path)
    tokenizer = tmp_path / "words.json"
    word_level(tokenizer, ["brown", "fox", "quick", "jumps", "Document", "<|endoftext|>"])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    small, large = write(tmp_path / "a", "jsonl", DOCUMENTS[:20]), write(tmp_path / "b", "jsonl", DOCUMENTS * 3)
    common = {"tokenizer": str(tokenizer), "text_field": "body", "val_fraction": 0.2, "cache_dir": "cache"}
    recipe = tmp_path / "mixed.yaml"
    recipe.write_text(json.dumps({
        "seed_everything": 0,
        "model": {"d_model": 16, "pattern": "AM", "mixers": {"A": {"class_path": "components.QCAttention",
                                                                   "init_args": {"n_heads": 2}},
                                                             "M": {"class_path": "components.MLP"}}},
        "data": {"class_path": "recipes.data.MixedCorpus",
                 "init_args": {"corpora": [{"paths": small, **common}, {"paths": large, **common}], "weights": [1, 1],
                               "seq_len": 8, "batch_size": 4}},
        "trainer": {"max_steps": 4, "val_check_interval": 2, "limit_val_batches": 2, "enable_progress_bar": False,
                    "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                               "init_args": {"save_dir": "runs", "name": "mixed"}}}}))
    main(["fit", "--config", str(recipe)])
    out = capsys.readouterr().out
    assert "vocab=7" in out and "fit finished: 4 steps" in out and "val/loss   last" in out
    from recipes.data import MixedCorpus, TokenizedCorpus

    last = torch.load(tmp_path / "runs" / "mixed" / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    alone = TokenizedCorpus(small, **common, seq_len=8)
    assert last["tokenizer"] == alone.tokenizer_fingerprint()
    mixed = MixedCorpus([{"paths": small, **common}, {"paths": large, **common}], [1, 1], seq_len=8, batch_size=4)
    mixed.setup()
    assert mixed.end_of_document == 6 and mixed.tokenizer_path == str(tokenizer)
    assert mixed.decode(mixed.encode("brown fox")) == "brown fox"
    held_out = mixed.validation_tokens()
    assert len(held_out) == sum(len(c.validation_tokens()) for c in mixed.corpora) > 0
    assert next(iter(mixed.train_dataloader()))["input_ids"].shape == (4, 8)
    text = generate(["--config", str(recipe), "--ckpt_path", "last", "--prompt", "brown fox", "--max_new_tokens", "3"])
    assert text.startswith("brown fox ") and len(text.split()) == 2 + 3  # (one word a token: the decoded ones)


def test_a_mixture_takes_its_proportions_and_resumes_exactly(tmp_path):
    from recipes.data import MixedCorpus
    from recipes.data.order import ResumableLoader

    tokenizer = tmp_path / "words.json"
    word_level(tokenizer, ["brown", "fox", "quick", "jumps", "ünïcode"])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    small, large = write(tmp_path / "a", "jsonl", DOCUMENTS[:20]), write(tmp_path / "b", "jsonl", DOCUMENTS * 3)
    common = dict(tokenizer=str(tokenizer), text_field="body", val_fraction=0.1, cache_dir=str(tmp_path / "cache"))
    mixed = MixedCorpus([{"paths": small, **common}, {"paths": large, **common}], [3, 1], seq_len=8, batch_size=4, seed=5)
    mixed.setup()
    sources = mixed._train.source
    assert len(sources) == sum(len(c.windows("train")) for c in mixed.corpora)
    assert abs((sources == 0).mean() - 0.75) < 0.08  # the small corpus gets its 3:1 share, repeating its windows
    first = mixed.corpora[0].windows("train")
    assert all(torch.equal(mixed._train[i]["input_ids"], first[int(mixed._train.window[i])]["input_ids"])
               for i in np.flatnonzero(sources == 0)[:10])
    reference = [b["input_ids"] for b in ResumableLoader(mixed._train, batch_size=4, seed=5)]
    resumed = ResumableLoader(mixed._train, batch_size=4, seed=5)
    resumed.load_state_dict({"epoch": 0, "batches": 3, "seed": 5})
    assert all(torch.equal(a, b) for a, b in zip([b["input_ids"] for b in resumed], reference[3:]))
    other = tmp_path / "other.json"
    word_level(other, ["brown"])
    clash = MixedCorpus([{"paths": small, **common}, {"paths": large, **{**common, "tokenizer": str(other)}}], [1, 1],
                        seq_len=8, batch_size=4, seed=5)
    with pytest.raises(ValueError, match="the corpora are tokenized differently"):
        clash.setup()
    with pytest.raises(ValueError, match="give one weight per corpus"):
        MixedCorpus([{"paths": small, **common}], [1, 2])
    # one tokenizer holding both tokens: the documents of one corpus would end in a token the mixture never reports
    both = tmp_path / "both.json"
    word_level(both, ["brown", "<eod>", "<|endoftext|>"])
    with pytest.raises(ValueError, match=r"different tokens \(corpora\[0\]: '<\|endoftext\|>', corpora\[1\]: '<eod>'\)"):
        MixedCorpus([{"paths": small, **common, "tokenizer": str(both)},
                     {"paths": large, **common, "tokenizer": str(both), "end_of_document_token": "<eod>"}], [1, 1])
    with pytest.raises(ValueError, match=r"begin their documents differently \(corpora\[0\]: None, corpora\[1\]: '<eod>'\)"):
        MixedCorpus([{"paths": small, **common, "tokenizer": str(both)},
                     {"paths": large, **common, "tokenizer": str(both), "start_of_document_token": "<eod>"}], [1, 1])
    # a corpus's own setting that the mixture would override, a typo, a built corpus of another length: named
    with pytest.raises(ValueError, match=r"corpora\[1\] sets seq_len; the mixture's seq_len, batch_size and seed"):
        MixedCorpus([{"paths": small, **common}, {"paths": large, "seq_len": 16, **common}], [1, 1], seq_len=8)
    with pytest.raises(ValueError, match=r"corpora\[0\] has 'text_fields', not an argument of TokenizedCorpus "
                                         r"\(did you mean text_field\?\)"):
        MixedCorpus([{"paths": small, "text_fields": "body"}], [1], seq_len=8)
    with pytest.raises(ValueError, match=r"corpora\[1\] was built with seq_len=16, the mixture's is 8"):
        MixedCorpus([{"paths": small, **common}, TokenizedCorpus(large, seq_len=16, **common)], [1, 1], seq_len=8)
    for weights in ([1, 0], [1, -2], [1, "2"], [1, None]):
        with pytest.raises(ValueError, match=r"weights .* must be positive numbers"):
            MixedCorpus([{"paths": small, **common}, {"paths": large, **common}], weights, seq_len=8)
    with pytest.raises(ValueError, match="each corpus is a TokenizedCorpus or the mapping of its arguments"):
        MixedCorpus([{"paths": small, **common}, large], [1, 1], seq_len=8)  # a path alone
    torch.manual_seed(11)
    padded = MixedCorpus([{"paths": small, **common}, {"paths": large, **common, "padded_vocab_size": 64}], [1, 1],
                         seq_len=8)
    assert padded.order_seed == padded.corpora[0].order_seed == 11  # the run's seed, without one of its own
    assert padded.vocab_size == 64 > padded.corpora[0].vocab_size  # the largest: every corpus's ids have a row


def test_a_mixture_whose_corpora_share_documents_is_refused_and_one_of_disjoint_domains_is_built(tmp_path):
    """Two corpora that read the same documents (one file, all of it in one, a domain of it in the other, or the same
    file under two names) each number them apart for the every-n-th validation split: shown here, a document one
    validates on is one the other trains on. Refused by name; disjoint domains of one file are the way to weight them."""
    from recipes.data import MixedCorpus

    rows = [{"body": document, "domain": "even" if i % 2 == 0 else "odd"} for i, document in enumerate(DOCUMENTS)]
    (tmp_path / "all.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "sub").mkdir()
    common = dict(text_field="body", vocab_size=300, val_fraction=0.1, cache_dir=str(tmp_path / "cache"))
    whole = {"paths": str(tmp_path / "all.jsonl"), **common}
    even = {**whole, "domains": ["even"]}
    built = [TokenizedCorpus(**whole, seq_len=8), TokenizedCorpus(**even, seq_len=8)]
    for data in built:
        data.setup()
    assert set(documents_of(built[1], "val")) & set(documents_of(built[0], "train"))  # the leak the refusal stops
    for corpora, said in [([whole, even], r"corpora\[0\] and corpora\[1\] both read the documents of domains "
                                         r"\['even'\] of .*all.jsonl: each corpus splits its own documents"),
                          ([even, {**even, "domains": ["odd", "even"]}, whole], r"domains \['even'\]"),
                          ([{**whole, "paths": str(tmp_path / "sub" / ".." / "all.jsonl")}, whole],
                           r"both read every document of .*all.jsonl: .* Give each corpus its own files, or disjoint "
                           r"domains of one file")]:
        with pytest.raises(ValueError, match=said):
            MixedCorpus(corpora, [1] * len(corpora), seq_len=8)
    mixed = MixedCorpus([even, {**whole, "domains": ["odd"]}], [3, 1], seq_len=8)
    mixed.setup()
    validated = [set(documents_of(corpus, "val")) for corpus in mixed.corpora]
    trained = [set(documents_of(corpus, "train")) for corpus in mixed.corpora]
    assert not (validated[0] & trained[1]) and not (validated[1] & trained[0]) and all(validated)


def test_the_validation_loader_gives_the_validation_windows_in_order(tmp_path):
    data = corpus(tmp_path, write(tmp_path, "jsonl"))
    val = data.windows("val")
    batches = list(data.val_dataloader())
    assert sum(len(b["input_ids"]) for b in batches) == len(val) > 2
    assert torch.equal(torch.cat([b["input_ids"] for b in batches]), torch.stack([val[i]["input_ids"] for i in range(len(val))]))


def test_each_data_modules_fingerprint_is_the_content_its_batches_are_cut_from(tmp_path):
    """What a run records beside its code (``code.json``'s ``data``), so that runs pooled as seeds read the same text:
    the text's hash, the token cache's key, a mixture's of its corpora in order; none for MQAR, made from settings."""
    import hashlib

    from recipes.data import MQAR, MixedCorpus, TextCorpus
    from recipes.data.text import default_text

    assert TextCorpus(seq_len=8, batch_size=2).data_fingerprint() == hashlib.sha256(
        default_text().encode()).hexdigest()[:16]
    (tmp_path / "a.txt").write_text("some text " * 50)
    first = TextCorpus(path=str(tmp_path / "a.txt"), seq_len=8, batch_size=2).data_fingerprint()
    (tmp_path / "a.txt").write_text("other text " * 50)
    assert TextCorpus(path=str(tmp_path / "a.txt"), seq_len=8, batch_size=2).data_fingerprint() != first
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    small, large = write(tmp_path / "one", "jsonl", DOCUMENTS[:20]), write(tmp_path / "two", "jsonl", DOCUMENTS)
    data = corpus(tmp_path, small)
    data.setup()
    assert data.data_fingerprint() == data.cache.name
    before = data.data_fingerprint()
    write(tmp_path / "one", "jsonl", DOCUMENTS[1:21])  # the corpus made again, other documents at the same path
    assert corpus(tmp_path, small).data_fingerprint() != before
    options = dict(vocab_size=320, val_fraction=0.2, cache_dir=str(tmp_path / "cache"), text_field="body")
    mixed = MixedCorpus([{"paths": small, **options}, {"paths": large, **options}], [1, 1], seq_len=8, batch_size=2)
    swapped = MixedCorpus([{"paths": large, **options}, {"paths": small, **options}], [1, 1], seq_len=8, batch_size=2)
    assert mixed.data_fingerprint() != swapped.data_fingerprint()
    assert mixed.data_fingerprint() == MixedCorpus([{"paths": small, **options}, {"paths": large, **options}], [3, 1],
                                                   seq_len=8, batch_size=2).data_fingerprint()  # (weights: settings)
    assert MQAR(seq_len=16, batch_size=2).data_fingerprint() is None
