"""``python -m recipes.benchmarks.evaluation`` at a tiny size: each table has its rows, and the zoo computes what
lm-eval's Hugging Face model computes on the same weights (a timing of a different computation would mean nothing)."""

import tempfile

import pytest

from recipes.benchmarks import evaluation

pytest.importorskip("transformers")
pytest.importorskip("lm_eval")

TINY = ["--layers", "1", "--width", "32", "--rounds", "1", "--threads", "1", "--batch_size", "3"]


def rows(out: str) -> dict[str, list[str]]:
    lines = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| model")]
    return {cells[0].strip("| "): cells for cells in (line.split(" | ") for line in lines)}


def test_the_generation_table_times_the_same_texts_three_ways(capsys):
    evaluation.main([*TINY, "--generate", "--questions", "7", "--budget", "24"])
    out = capsys.readouterr().out
    table = rows(out)
    assert set(table) == {"lm-eval hf", "zoo", "zoo before (alone, whole budget)"}
    assert all(cells[3] == "7 of 7 |" for cells in table.values())  # the texts equal lm-eval's own
    assert table["lm-eval hf"][2] == "1.00" and "of 7 ran to the budget" in out


def test_the_scoring_table_gives_scores_within_float_rounding_of_hfs(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the saved tokenizer and model go
    evaluation.main([*TINY, "--questions", "3"])
    table = rows(capsys.readouterr().out)
    assert set(table) == {"lm-eval hf", "zoo (shared context)", "zoo (no sharing)"}
    assert all(float(cells[3].strip(" |")) < 1e-4 for cells in table.values())
    assert not list(tmp_path.iterdir())  # each run left its folder behind in /tmp


def test_the_score_column_is_the_largest_difference_of_each_model_from_hfs(capsys, tmp_path, monkeypatch):
    """A difference planted in one request of the unshared zoo model (and only there: the other row must share the
    context) is what its row reports — the largest, not a typical, difference."""
    from recipes.evaluation.harness import ZooLM

    scored = ZooLM._loglikelihood_tokens

    def planted(self, requests, **kwargs):
        results = scored(self, requests, **kwargs)
        return [(score + 0.5 * (i == 1 and not self.reuse_context), greedy) for i, (score, greedy) in enumerate(results)]

    monkeypatch.setattr(ZooLM, "_loglikelihood_tokens", planted)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    evaluation.main([*TINY, "--questions", "2"])
    table = rows(capsys.readouterr().out)
    assert float(table["zoo (shared context)"][3].strip(" |")) < 1e-4
    assert float(table["zoo (no sharing)"][3].strip(" |")) == pytest.approx(0.5, abs=1e-3)


def test_the_stop_strings_are_three_characters_of_a_continuation_and_never_empty():
    """A continuation that ends before the point drawn gives no stop string: an empty one would match everywhere
    (and ``str.split("")`` raises) — the end-of-text string is kept either way."""
    import torch

    class Bytes:
        encode = staticmethod(lambda text: list(text.encode()))
        decode = staticmethod(lambda ids: bytes(ids).decode(errors="replace"))

    class Continues:
        def __init__(self, text: bytes):
            self.text = text

        def generate(self, ids, budget):
            return torch.cat([ids, torch.tensor([list(self.text[:budget])])], 1)  # [1, T + len]

    short = evaluation.generation_requests(Continues(b"ab"), Bytes(), 8, 24, "<eot>")
    assert len(short) == 8 and all(request.args[1]["until"] == ["<eot>"] for request in short)
    letters = bytes(range(65, 65 + 48))  # 48 distinct characters: each stop string says where it was taken
    until = evaluation.generation_requests(Continues(letters), Bytes(), 8, 24, "<eot>")[0].args[1]["until"]
    stops = [stop for stop in until if stop != "<eot>"]
    assert "<eot>" in until and 1 <= len(stops) <= 2  # every fourth of 8 contexts, maybe drawing the same point
    assert all(len(stop) == 3 and 4 <= letters.decode().index(stop) < 40 for stop in stops)
