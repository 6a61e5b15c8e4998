"""``recipes.benchmarks.corpus`` end to end at 1 MB: both tokenizations (a BPE trained, then its file) give the same
tokens, each in a child process whose last line is its result, and the training rates of the two loaders are steps
of the same batch size over the same windows, the in-memory one the baseline."""

import json
import subprocess

import pytest

from recipes.benchmarks import corpus as bench


def test_the_command_tokenizes_twice_to_the_same_tokens_and_compares_the_loaders(monkeypatch, tmp_path, capsys):
    children = []

    def in_process(paths, cache, tokenizer, args):  # the child's work, here (a fresh process costs seconds)
        children.append(tokenizer)
        return bench.tokenize_child(paths, cache, tokenizer, args.vocab, args.format)

    monkeypatch.setattr(bench, "run_tokenize", in_process)
    bench.main(["--mb", "1", "--vocab", "300", "--steps", "1", "--format", "txt", "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert children[0] is None and children[1].endswith("tokenizer.json") and bench.Path(children[1]).exists()
    assert out.startswith("# 1 MB of .txt in 1 files")
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in out.splitlines() if line.startswith("| ")}
    trained, encoded = rows["train a BPE of 300, then encode"], rows["encode with the trained tokenizer file"]
    assert trained[3] == encoded[3] and int(trained[3].replace(",", "")) > 100_000  # the same tokens, both ways
    assert rows["in memory"][2] == "1.00 |" and float(rows["memory-mapped"][2].strip(" |")) > 0
    assert (tmp_path / "corpus" / "part000.txt").exists()  # --dir keeps the corpus


def test_training_rates_are_tokens_of_a_step_over_its_median(monkeypatch, tmp_path):
    paths = bench.generate(tmp_path / "new" / "corpus", 1, "jsonl")  # folders made as needed
    cache = bench.tokenize_child(paths, str(tmp_path / "cache"), None, 300, "jsonl")["cache"]
    steps = []

    def interleaved_seconds(cases, rounds):
        for fn in cases.values():
            fn()  # one real step from each loader
        steps.append(rounds)
        return {"memory-mapped": [0.5, 2.0, 1.0], "in memory": [4.0, 0.25, 2.0]}

    monkeypatch.setattr(bench, "interleaved_seconds", interleaved_seconds)
    loaders, DataLoader = [], bench.torch.utils.data.DataLoader
    monkeypatch.setattr(bench.torch.utils.data, "DataLoader", lambda ds, **kwargs: loaders.append(kwargs) or
                        DataLoader(ds, **kwargs))
    rates = bench.train_rates(bench.Path(cache), 300, 3)
    assert rates == {"memory-mapped": 16 * 256 / 1.0, "in memory": 16 * 256 / 2.0} and steps == [3]
    # windows in random order, as training reads them: in order, the memory map would read ahead and look fast
    assert loaders == [{"batch_size": 16, "shuffle": True, "drop_last": True}] * 2


def test_a_tokenization_is_a_child_process_whose_last_line_is_its_result(monkeypatch):
    calls = []

    def run(command, **kwargs):
        calls.append((command, kwargs))
        child = json.loads(command[command.index("--child") + 1])
        ok = child[2] is None
        return subprocess.CompletedProcess(command, 0 if ok else 1, 'a warning\n{"seconds": 2.5}' if ok else "",
                                           "" if ok else "Traceback …\nMemoryError")

    monkeypatch.setattr(bench.subprocess, "run", run)
    args = bench.argparse.Namespace(vocab=300, format="txt")
    assert bench.run_tokenize(["a.txt"], "cache", None, args) == {"seconds": 2.5}
    command, kwargs = calls[0]
    assert command[1:4] == ["-m", "recipes.benchmarks.corpus", "--child"] and kwargs == {"capture_output": True,
                                                                                       "text": True}
    assert json.loads(command[4]) == [["a.txt"], "cache", None, 300, "txt"]
    with pytest.raises(RuntimeError, match="tokenization failed:\nTraceback …\nMemoryError"):
        bench.run_tokenize(["a.txt"], "cache", "tokenizer.json", args)


def test_the_child_does_its_one_tokenization_and_starts_nothing(monkeypatch, capsys):
    # a child that ran the whole command would start children of its own, without end
    monkeypatch.setattr(bench.subprocess, "run", lambda *args, **kwargs: pytest.fail("the child started a process"))
    monkeypatch.setattr(bench, "tokenize_child", lambda *child: {"child": list(child)})
    bench.main(["--child", json.dumps([["a.txt"], "cache", None, 300, "txt"])])
    assert json.loads(capsys.readouterr().out) == {"child": [["a.txt"], "cache", None, 300, "txt"]}
