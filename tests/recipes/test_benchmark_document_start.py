"""``python -m recipes.benchmarks.document_start``: each document's losses read after the start token and alone, against
the model's own log-softmax over each document written out one at a time."""

import json

import pytest
import torch
import torch.nn.functional as F

from recipes.benchmarks.document_start import buckets, documents, main
from recipes.cli import main as cli


def test_documents_are_cut_at_each_end_and_lose_a_start_token_of_their_own():
    stream = torch.tensor([1, 5, 6, 7, 2, 1, 8, 2, 1, 9, 9, 9, 2, 1, 4])  # <s>=1 ... </s>=2, an unended tail
    assert [d.tolist() for d in documents(stream, 2, 1, 2)] == [[5, 6], [9, 9]]
    assert [d.tolist() for d in documents(stream, 2, 1, 3)] == [[5, 6, 7], [9, 9, 9]]  # (exactly long enough: taken)
    assert [d.tolist() for d in documents(stream, 2, 2, 3)] == [[1, 5, 6], [1, 9, 9]]
    assert buckets(32) == [(0, 1), (1, 4), (4, 16), (16, 32)] and buckets(3) == [(0, 1), (1, 3)]


def test_the_table_is_each_documents_loss_written_out(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps({"text": f"the cat sat on mat {i} " * (1 + i % 3)}) + "\n"
                                                 for i in range(60)))
    cli(["fit", "--config", "quickstart_bpe.yaml", "--model.d_model", "32", "--model.mixers.A.init_args.n_heads", "2",
         "--data.paths", "mine.jsonl", "--data.vocab_size", "300", "--data.cache_dir", "cache", "--data.seq_len", "16",
         "--data.batch_size", "4", "--trainer.max_steps", "3", "--trainer.limit_val_batches", "0",
         "--trainer.enable_progress_bar", "false"])
    capsys.readouterr()
    result = main(["--config", "quickstart_bpe.yaml", "--tokens", "6", "--batch", "2"])
    out = capsys.readouterr().out
    from recipes.runs import load_run

    run = load_run("quickstart_bpe.yaml", "last", text_only=False)
    model, end = run.lm.model, run.data.end_of_document
    stream = run.data.validation_tokens().tolist()
    after, alone = [], []
    document = []
    for token in stream:  # each document, one at a time
        if token != end:
            document.append(token)
            continue
        if len(document) >= 7:
            for first, ids, into in ((end, [end, *document[:7]], after), (None, document[:7], alone)):
                with torch.no_grad():
                    logprobs = F.log_softmax(model(torch.tensor([ids[:-1]]))[0], dim=-1)
                picked = -logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
                into.append(picked[1:] if first is not None else picked)  # tokens 2 … 7
        document = []
    after, alone = torch.stack(after), torch.stack(alone)  # [D, 6]
    assert result["documents"] == len(after) > 2 and f"{len(after)} validation documents of at least 7 tokens" in out
    spans = {"2": (0, 1), "3–5": (1, 4), "6–7": (4, 6), "2–7": (0, 6)}
    for row in result["rows"]:
        lo, hi = spans[row["tokens"]]
        assert row["after_start"] == pytest.approx(float(after[:, lo:hi].mean()), abs=1e-5)
        assert row["alone"] == pytest.approx(float(alone[:, lo:hi].mean()), abs=1e-5)
    assert [row["tokens"] for row in result["rows"]] == list(spans)
    with pytest.raises(SystemExit, match="no validation document has 1001 tokens; give a smaller --tokens"):
        main(["--config", "quickstart_bpe.yaml", "--tokens", "1000"])
