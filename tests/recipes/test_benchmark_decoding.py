"""``recipes.benchmarks.decoding``: each model is the pattern and SSD flavour its name says, a row's rates are its
times inverted, the cache it reports grows with the context for attention and not for Mamba-2, its cache holds the
prompt, the warm-up steps and the timed steps (one more and it would refuse), and the table compares each model with
Llama at the same context."""

import json
import subprocess
import warnings

import pytest
import torch

from components import SSD, QCAttention, RoutedMoE
from recipes.benchmarks import decoding

D_MODEL, VOCAB = 64, 64


def mixer_kinds(model) -> str:
    """A letter per SSD, attention and routed MoE, block by block (an MLP has none)."""
    kinds = {SSD: "S", QCAttention: "A", RoutedMoE: "R"}
    return "".join(kinds[type(c)] for block in model.blocks for c in block.children() if type(c) in kinds)


@pytest.mark.parametrize("name, kinds, expand, gate, rope", [
    ("llama", "A" * 8, None, None, None),
    ("mistral", "A" * 8, None, None, None),
    ("mamba2", "S" * 8, 2, True, False),
    ("transxssm", "S" * 7 + "A", 1, False, True),
    ("jamba", "S SR S SR A SR S SR".replace(" ", ""), 2, False, False),
])
def test_each_model_is_the_pattern_and_ssd_its_name_says(name, kinds, expand, gate, rope):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. a letter bound that the pattern does not use
        model = decoding.build(name, D_MODEL, VOCAB, "cpu")
    assert mixer_kinds(model) == kinds and not model.training
    for ssd in (m for m in model.modules() if isinstance(m, SSD)):
        assert (ssd.d_inner // D_MODEL, ssd.gate_norm is not None, ssd.rope) == (expand, gate, rope)
        assert (ssd.head_dim, ssd.d_state, ssd.chunk_size, ssd.conv is not None) == (64, 64, 256, True)
    attention = [m for m in model.modules() if isinstance(m, QCAttention)]
    assert all(a.n_heads == D_MODEL // 64 for a in attention)
    assert {a.sliding_window for a in attention} <= ({decoding.WINDOW} if name == "mistral" else {None})
    torch.manual_seed(1)
    rebuilt = decoding.build(name, D_MODEL, VOCAB, "cpu")  # seeded inside: the same weights for every row
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), rebuilt.state_dict().values()))


@pytest.mark.parametrize("name", ["llama", "mamba2"])
def test_a_row_inverts_its_times_and_reports_the_cache_it_decoded_from(name):
    rows = [decoding.one(name, context, D_MODEL, VOCAB, steps=3, device="cpu") for context in (24, 40)]
    for row, context in zip(rows, (24, 40)):
        assert (row["model"], row["context"]) == (name, context)
        assert row["prefill_tok_s"] == pytest.approx(context / row["prefill_s"])
        assert row["step_tok_s"] == pytest.approx(1e3 / row["step_ms"]) and row["step_ms"] > 0
        assert row["peak_mib"] >= 0
    grown = (rows[1]["cache_mib"] - rows[0]["cache_mib"]) * 2**20
    # Llama keeps K and V of each of 8 layers for every position (fp32), Mamba-2 a fixed state; both a padding flag
    assert grown == (8 * 2 * 16 * D_MODEL * 4 if name == "llama" else 0) + 16


def test_a_sliding_windows_cache_stops_growing_at_its_window():
    """Mistral's 8 layers keep K and V of the last ``window`` positions (the ring): from 24 to 40 cached positions
    with a window of 20 only the padding flags grow; at a window of 64 it grows as Llama's."""
    def grown(window):
        rows = [decoding.one("mistral", context, D_MODEL, VOCAB, steps=3, device="cpu", window=window)
                for context in (24, 40)]
        return (rows[1]["cache_mib"] - rows[0]["cache_mib"]) * 2**20

    assert grown(20) == 16 and grown(64) == 8 * 2 * 16 * D_MODEL * 4 + 16
    assert decoding.build("mistral", D_MODEL, VOCAB, "cpu", window=20).blocks[3].sequence_mixer.sliding_window == 20


def test_the_cache_holds_exactly_the_prompt_warm_up_and_timed_steps(monkeypatch):
    sizes = []
    new_cache = decoding.HybridLM.new_cache

    def recorded(self, batch, capacity, **kwargs):
        sizes.append(capacity)
        return new_cache(self, batch, capacity, **kwargs)

    monkeypatch.setattr(decoding.HybridLM, "new_cache", recorded)
    decoding.one("llama", 24, D_MODEL, VOCAB, steps=3, device="cpu")
    assert sizes == [24 + 3 + 2, 8]  # the timed cache, then the warm-up's own
    # the timed cache is full at the end: a smaller one would have refused a step
    monkeypatch.setattr(decoding.HybridLM, "new_cache", lambda self, batch, capacity, **kw: new_cache(
        self, batch, capacity - (capacity == 29), **kw))
    with pytest.raises(ValueError, match="exceed its capacity=28"):
        decoding.one("llama", 24, D_MODEL, VOCAB, steps=3, device="cpu")


def row(model, context, tok_s):
    return {"model": model, "context": context, "prefill_s": 0.5, "prefill_tok_s": context / 0.5,
            "step_ms": 1e3 / tok_s, "step_tok_s": tok_s, "cache_mib": 1.5, "peak_mib": 3.0}


def test_the_table_compares_each_model_with_llama_at_its_own_context():
    table = decoding.table([row("llama", 1024, 100.0), row("mamba2", 1024, 250.0), row("llama", 2048, 50.0),
                            row("mamba2", 2048, 200.0), row("jamba", 4096, 80.0)])
    ratios = [line.split(" | ")[6] for line in table.splitlines()[2:]]
    assert ratios == ["1.00×", "2.50×", "1.00×", "4.00×", "—"]  # no Llama row at 4K: no ratio
    assert table.splitlines()[3] == "| mamba2 | 1,024 | 0.50 | 2,048 | 4.0 | 250.0 | 2.50× | 1.5 | 3 |"


def test_the_command_runs_each_row_in_its_own_process_and_skips_a_failed_one(monkeypatch, capsys):
    commands = []

    def run(command, **kwargs):
        assert kwargs == {"capture_output": True, "text": True}  # the child's JSON line is read from its stdout
        commands.append(command)
        name, context = command[command.index("--one") + 1:command.index("--one") + 3]
        if name == "mamba2":
            return subprocess.CompletedProcess(command, 1, "", "Traceback …\nRuntimeError: out of memory")
        return subprocess.CompletedProcess(command, 0, "a warning\n" + json.dumps(row(name, int(context), 10.0)), "")

    monkeypatch.setattr(decoding.subprocess, "run", run)
    with pytest.raises(SystemExit, match="^2 of 4 rows failed .*: mamba2 at 16, mamba2 at 32$"):
        decoding.main(["--models", "llama", "mamba2", "--contexts", "16", "32", "--d-model", "128", "--steps", "5"])
    out, err = capsys.readouterr()
    assert [c[c.index("--one") + 1:c.index("--one") + 3] for c in commands] == [
        ["llama", "16"], ["mamba2", "16"], ["llama", "32"], ["mamba2", "32"]]
    assert all(c[c.index("--d-model") + 1] == "128" and c[c.index("--steps") + 1] == "5" for c in commands)
    assert all(c[c.index("--window") + 1] == str(decoding.WINDOW) for c in commands)
    assert [line.split(" | ")[:2] for line in out.splitlines() if line.startswith("| llama")] == [
        ["| llama", "16"], ["| llama", "32"]]
    assert "mamba2" not in out.split("\n\n", 1)[1] and "mamba2 at 16: failed" in err and "out of memory" in err


def test_one_row_from_the_command_line_prints_its_json(monkeypatch, capsys):
    # a child process that ran the table's loop would start children of its own, without end
    monkeypatch.setattr(decoding.subprocess, "run", lambda *args, **kwargs: pytest.fail("--one started a process"))
    decoding.main(["--one", "mamba2", "12", "--d-model", str(D_MODEL), "--vocab", str(VOCAB), "--steps", "2"])
    got = json.loads(capsys.readouterr().out)
    assert (got["model"], got["context"]) == ("mamba2", 12) and got["cache_mib"] > 0


def test_attention_takes_a_head_per_64_channels():
    heads = lambda d: {m.n_heads for m in decoding.build("llama", d, VOCAB, "cpu").modules()  # noqa: E731
                       if isinstance(m, QCAttention)}
    assert (heads(32), heads(64), heads(192)) == ({1}, {1}, {3})


def test_the_peak_is_the_growth_above_the_loaded_model(monkeypatch):
    readings = iter([300 * 2**20, 364 * 2**20])  # before the prefill, after the steps
    monkeypatch.setattr(decoding, "peak_bytes", lambda device: next(readings))
    assert decoding.one("mamba2", 12, D_MODEL, VOCAB, steps=2, device="cpu")["peak_mib"] == pytest.approx(64.0)
    assert next(readings, None) is None


def test_the_peak_on_cuda_is_the_allocators(monkeypatch):
    monkeypatch.setattr(decoding.torch.cuda, "max_memory_allocated", lambda: 123 * 2**20)
    monkeypatch.setattr(decoding, "resident_kib", lambda field: pytest.fail("read the host's memory for a GPU run"))
    assert decoding.peak_bytes("cuda:0") == 123 * 2**20
