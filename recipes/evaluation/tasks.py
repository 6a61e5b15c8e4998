"""Small lm-eval tasks the project makes itself, so the whole harness path runs offline (and in CI).

- ``zoo_cloze``: the last word of a sentence of Python's own documentation (``pydoc_data``), among four
  (the others are last words of other sentences); multiple choice, metric ``acc``.
- ``zoo_passkey``: the five-digit key hidden in filler text, among four keys (chance 0.25).
- a cloze over the held-out documents of a recipe's own corpus, made on demand
  (``python -m recipes.evaluation.tasks cloze --config RECIPE --out DIR``): the English corpus is not
  shipped, so neither is its task.

The data is generated here deterministically and shipped in ``recipes/evaluation/tasks/`` (a test checks
the shipped files equal a fresh generation); :func:`task_folder` writes the task YAMLs, which point at
those files by absolute path (lm-eval resolves ``data_files`` against the working folder), into a
temporary folder that ``python -m recipes eval`` adds to ``--include_path`` for the evaluation's length.
"""

import contextlib
import json
import random
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

DATA = Path(__file__).parent / "tasks"
TASKS = ("zoo_cloze", "zoo_passkey")
YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: context
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def cloze_items(count: int = 120, seed: int = 0) -> list[dict]:
    from pydoc_data.topics import topics

    sentences = []
    for key in sorted(topics):
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(topics[key].split())):
            words = sentence.rstrip(".!?").split()
            if _askable(words, 8, 30):
                sentences.append((" ".join(words[:-1]), words[-1]))
    rng = random.Random(seed)
    rng.shuffle(sentences)
    return _cloze_questions(sentences, count, rng)


def _askable(words: list[str], min_words: int, max_words: int) -> bool:
    """A sentence a cloze can ask about: ``min_words``-``max_words`` words, the last a plain lowercase word of 4+ letters."""
    return min_words <= len(words) <= max_words and re.fullmatch(r"[a-z]{4,}", words[-1]) is not None


def _cloze_questions(pairs: list[tuple[str, str]], count: int, rng: random.Random) -> list[dict]:
    """The first ``count`` of ``(context, word)`` as four-way questions; the wrong choices are other pairs' words."""
    words = sorted({word for _, word in pairs})
    return [_shuffled(context, [f" {w}" for w in [word, *rng.sample([w for w in words if w != word], 3)]], rng)
            for context, word in pairs[:count]]


def _shuffled(context: str, choices: list[str], rng: random.Random) -> dict:
    """A multiple-choice item whose right answer is ``choices[0]``, the choices in a random order."""
    order = list(range(len(choices)))
    rng.shuffle(order)
    return {"context": context, "choices": [choices[i] for i in order], "answer": order.index(0)}


def sentence_endings(text: str, min_words: int = 8, max_words: int = 40) -> Iterator[tuple[int, str, str]]:
    """``(start, sentence without its last word, last word)`` for each sentence of ``text`` that ends in a
    plain lowercase word of 4+ letters (what a cloze can ask for), ``start`` its offset in ``text``."""
    for match in re.finditer(r"[^.!?]+[.!?]", text):
        group = match.group()
        words = group.strip().rstrip(".!?").split()
        if _askable(words, min_words, max_words):
            yield match.start() + len(group) - len(group.lstrip()), " ".join(words[:-1]), words[-1]


def document_cloze_items(documents: Iterable[str], count: int = 500, seed: int = 0,
                         context_chars: int = 600) -> list[dict]:
    """A LAMBADA-like multiple-choice cloze over ``documents`` (say, a corpus's held-out split): the last
    word of a sentence, given up to ``context_chars`` of the document before it (cut at a word), among
    four (the others are last words of other sentences). At most one question per document."""
    found = []
    rng = random.Random(seed)
    for document in documents:
        endings = list(sentence_endings(document))
        if not endings:
            continue
        start, sentence, word = endings[rng.randrange(len(endings))]
        before = " ".join(document[max(start - context_chars, 0):start].split())
        if start > context_chars:  # drop the cut word at the window's start
            before = before.partition(" ")[2]
        found.append(((before + " " + sentence).strip(), word))
    if len(found) < 4:
        raise ValueError(f"only {len(found)} documents have a sentence a cloze can use; a task needs at least 4")
    rng.shuffle(found)
    return _cloze_questions(found, count, rng)


def passkey_items(count: int = 40, length_bytes: int = 400, seed: int = 0) -> list[dict]:
    from recipes.evaluation.suites import FILLER, QUESTION

    rng = random.Random(seed)
    items = []
    for i in range(count):
        keys = rng.sample(range(10_000, 100_000), 4)
        needle = f"The pass key is {keys[0]}. Remember it. {keys[0]} is the pass key. "
        room = max(length_bytes - len(needle) - len(QUESTION), 0)
        filler = (FILLER * (room // len(FILLER) + 1))[:room]
        at = filler.rfind(" ", 0, int(len(filler) * (i % 5) / 4) + 1) + 1 if i % 5 else 0
        items.append(_shuffled(filler[:at] + needle + filler[at:] + QUESTION, [f" {key}" for key in keys], rng))
    return items


def generate() -> dict[str, list[dict]]:
    return {"zoo_cloze": cloze_items(), "zoo_passkey": passkey_items()}


def write_data(folder: Path = DATA) -> None:
    """Regenerate the shipped data (``python -c "from recipes.evaluation.tasks import write_data; write_data()"``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, items in generate().items():
        with open(folder / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for item in items:
                f.write(json.dumps(item) + "\n")


@contextlib.contextmanager
def task_folder() -> Iterator[Path]:
    """A temporary folder with one lm-eval YAML per shipped task, pointing at its data file; removed on leaving
    the ``with`` block (lm-eval reads the YAMLs when it loads the tasks, so the evaluation runs inside it)."""
    with tempfile.TemporaryDirectory(prefix="zoo-tasks-") as name:
        folder = Path(name)
        for task in TASKS:
            data = json.dumps(str((DATA / f"{task}.jsonl").resolve()))
            (folder / f"{task}.yaml").write_text(YAML.format(name=task, data=data))
        yield folder


def write_task(folder: Path, name: str, items: list[dict], *, overwrite: bool = True) -> Path:
    """A multiple-choice task of one's own (``context``, ``choices``, ``answer``) in ``folder``: its data and YAML.
    Without ``overwrite``, a task of that name there with other questions is refused (``FileExistsError``): scores
    stored under the name would no longer be of the questions it holds."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    text = "".join(json.dumps(item) + "\n" for item in items)
    if not overwrite and data.is_file() and data.read_text() != text:
        raise FileExistsError(f"{data} holds other questions of a task {name!r} (another corpus, count, seed or "
                              "context length): --force replaces it (scores stored under its name would no longer be "
                              "of its questions), or choose another --name or --out")
    data.write_text(text)
    (folder / f"{name}.yaml").write_text(YAML.format(name=name, data=json.dumps(str(data.resolve()))))
    return folder


def main(argv: list[str] | None = None) -> Path:
    """``python -m recipes.evaluation.tasks cloze --config RECIPE --out DIR``: a cloze task over the held-out
    documents of a recipe's corpus, written as an lm-eval task for ``python -m recipes eval --include_path DIR``."""
    import argparse
    import sys

    from recipes.argtypes import bounded, positive_int

    parser = argparse.ArgumentParser(prog="python -m recipes.evaluation.tasks", description=main.__doc__)
    parser.add_argument("kind", choices=["cloze"])
    parser.add_argument("--config", required=True, action="append",
                        help="a recipe whose data module has documents (TokenizedCorpus); repeat it as for fit")
    parser.add_argument("--out", required=True, help="the folder to write the task's YAML and data into")
    parser.add_argument("--name", default=None, help="the task's name (default: <corpus>_cloze)")
    parser.add_argument("--count", type=positive_int, default=500, help="questions (default 500)")
    parser.add_argument("--seed", type=bounded(int, 0), default=0)
    parser.add_argument("--context-chars", type=bounded(int, 0), default=600, help="document text before the sentence (default 600)")
    parser.add_argument("--force", action="store_true", help="replace a task of that name in --out with other questions")
    args = parser.parse_args(argv)
    from recipes.runs import data_module, load_recipe

    try:
        data = data_module(load_recipe(args.config))
        if not hasattr(data, "documents"):
            raise ValueError(f"{type(data).__name__} has no documents to build a cloze from (use a TokenizedCorpus recipe)")
        items = document_cloze_items(data.documents("val"), args.count, args.seed, args.context_chars)
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
    files = getattr(data, "files", None)
    name = args.name or (f"{Path(files[0]).stem}_cloze" if files else "corpus_cloze")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        sys.exit(f"error: --name {name!r}: a task name is letters, digits and underscores")
    try:
        folder = write_task(Path(args.out), name, items, overwrite=args.force)
    except FileExistsError as error:
        sys.exit(f"error: {error}")
    print(f"wrote {len(items)} questions from the held-out documents: task {name!r} in {folder} "
          f"(python -m recipes eval ... --tasks {name} --include_path {folder})")
    return folder


if __name__ == "__main__":
    main()
