"""The model-level benchmark compares like with like: each zoo model and its Hugging Face twin come from
one config and have the same parameters — and the same logits once the weights are copied — and a
measured step reports a peak and a time."""

import json

import pytest
import torch

from components import count_parameters
from recipes.benchmarks import models as bench

TINY = dict(d_model=128, layers=2, vocab=97, batch=1, d_state=16, chunk=16, lengths=[32])


@pytest.mark.parametrize("name", list(bench.TWINS))
def test_each_twin_has_the_zoo_models_parameters_and_logits(name):
    transformers = pytest.importorskip("transformers")  # noqa: F841 - the hf-* rows need it
    from recipes.hf import convert_weights

    torch.manual_seed(0)
    ours, theirs = bench.build(name, TINY, 64).eval(), bench.build(bench.TWINS[name], TINY, 64).eval()
    assert count_parameters(ours) == count_parameters(theirs)
    config = bench.hf_config(name, TINY, 64).to_dict()
    ours.load_state_dict(convert_weights(config, dict(theirs.state_dict())))
    ids = torch.randint(0, TINY["vocab"], (2, 29))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), theirs(ids).logits, rtol=1e-4, atol=1e-4)


def test_every_named_model_builds_at_the_benchmarks_width():
    for name in bench.MODELS:
        if name.startswith("hf-"):
            continue
        model = bench.build(name, TINY, 64)
        assert model.d_model == TINY["d_model"], name
    assert [block.token for block in bench.build("hybrid", TINY, 64).blocks] == ["SM", "AM"]  # SM×(L-1) AM
    # Wonderful Matrices v1 Figure 3's pair: Cheems' layout, its attention letter replaced
    kinds = {name: [type(block.sequence_mixer).__name__ for block in bench.build(name, TINY, 64).blocks]
             for name in ("cheems", "cheems-ssd-value", "cheems-attention")}
    assert kinds["cheems"].count("InnerFuncAttention") == kinds["cheems-ssd-value"].count("InnerFuncAttention") \
        == kinds["cheems-attention"].count("QCAttention") > 0
    values = {type(block.sequence_mixer.value).__name__ for block in bench.build("cheems-ssd-value", TINY, 64).blocks
              if hasattr(block.sequence_mixer, "value")}
    assert values == {"SSDValue"}


def test_a_measured_step_reports_time_peak_and_parameters():
    result = bench.measure("llama", 48, TINY, repeats=2, compiled=False)
    assert result["params"] == count_parameters(bench.build("llama", TINY, 64))
    assert result["seconds"] > 0 and result["peak_mib"] >= 0


def test_a_profiled_step_names_its_costliest_ops():
    result = bench.measure("llama", 48, TINY, repeats=1, compiled=False, profile=5)
    lines = [line.strip() for line in result["profile"].splitlines()]
    rows = [line for line in lines if line and not line.startswith(("-", "Name", "Self"))]
    assert len(rows) == 5 and any("aten::mm" in row or "aten::addmm" in row for row in rows), result["profile"]
    assert bench.measure("llama", 48, TINY, repeats=1, compiled=False)["profile"] is None


def test_a_failed_measurement_is_a_row_that_says_so():
    row = bench.table_row("otce", False, 512, {"error": "ValueError: SSD: n_heads=1 is not divisible by n_groups=2"},
                          {}, 1)
    assert "failed: ValueError: SSD: n_heads=1" in row
    good = {"params": 1e6, "seconds": 0.5, "peak_mib": 30.0, "warmup_s": 1.0, "flops_per_token": 2e6, "peak_flops": 1e12}
    base = {"params": 1e6, "seconds": 1.0, "peak_mib": 60.0, "warmup_s": 1.0, "flops_per_token": None}
    results = {("hf-llama", False): base, ("llama", False): good}
    row = bench.table_row("llama", False, 512, good, results, 1)
    cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
    # 1,024 tok/s × 3 × 2e6 FLOPs = 6.1 GFLOP/s, 0.6% of 1 TFLOP/s
    assert cells == ["llama", "1.00M", "512", "1,024", "0.006", "0.6%", "30", "hf-llama", "2.00", "0.50"]
    # the HF twin is counted as its zoo twin; with no known peak there is no MFU
    cells = [cell.strip() for cell in bench.table_row("hf-llama", False, 512, base, results, 1).strip().strip("|").split("|")]
    assert cells[4:6] == ["0.003", "-"]


def test_a_failed_child_reports_its_error_not_the_advice_after_it():
    trace = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
             "torch._dynamo.exc.Unsupported: TypeError when making fake tensor call\n\nfrom user code:\n"
             "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace")
    assert bench.error_line(trace) == "torch._dynamo.exc.Unsupported: TypeError when making fake tensor call"
    assert bench.error_line("Killed") == "Killed"


def test_what_a_step_keeps_for_the_backward_is_counted_per_mixer_kind():
    ids = torch.randint(0, TINY["vocab"], (1, 34), generator=torch.Generator().manual_seed(0))
    full = bench.saved_for_backward(bench.build("hybrid", TINY, 64).train(), ids)
    lean = bench.saved_for_backward(bench.build("hybrid-recompute", TINY, 64).train(), ids)
    assert set(full) == {"SSD", "QCAttention", "MLP", "other"} and full["SSD"][0] == TINY["layers"] - 1
    # Recomputed, an SSD keeps only its input: [1, 33, d_model] fp32 per layer, each storage counted once.
    assert lean["SSD"] == (TINY["layers"] - 1, (TINY["layers"] - 1) * 33 * TINY["d_model"] * 4)
    assert full["SSD"][1] > 5 * lean["SSD"][1]
    assert full["MLP"] == lean["MLP"] and full["QCAttention"] == lean["QCAttention"]


class Toy(torch.nn.Module):
    """Embedding, then ``e·e`` (a product that saves the same tensor twice) or ``e²`` (saves it once)."""

    def __init__(self, twice: bool):
        super().__init__()
        self.twice, self.embedding, self.head = twice, torch.nn.Embedding(11, 8), torch.nn.Linear(8, 11)

    def forward(self, ids):
        e = self.embedding(ids)  # [B, T, 8]
        return self.head(e * e if self.twice else e.square())  # [B, T, 11]


def test_a_tensor_saved_twice_is_counted_once():
    ids = torch.randint(0, 11, (2, 9))
    assert bench.saved_for_backward(Toy(twice=True), ids) == bench.saved_for_backward(Toy(twice=False), ids)


def test_trials_give_the_median_and_the_range_and_a_failed_trial_fails_the_cell():
    trials = [{"params": 10, "seconds": s, "peak_mib": m} for s, m in ((2.0, 30.0), (1.0, 10.0), (4.0, 20.0))]
    r = bench.over_trials(trials)
    assert (r["seconds"], r["peak_mib"], r["fastest_s"], r["slowest_s"], r["trials"]) == (2.0, 20.0, 1.0, 4.0, 3)
    assert bench.over_trials([trials[0], {"error": "Killed"}]) == {"error": "Killed"}
    base = bench.over_trials([{"params": 10, "seconds": 4.0, "peak_mib": 40.0}] * 3)
    row = bench.table_row("mamba2", False, 512, r, {("llama", False): base}, 1, baseline="llama")
    cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
    # tok/s: 512 / 2 s, range 512 / 4 s to 512 / 1 s; divided by llama (not mamba2's HF twin), as asked
    assert cells == ["mamba2", "0.00M", "512", "256 (128–512)", "-", "-", "20", "llama", "2.00", "0.50"]


def test_the_efficiency_family_is_a_preset_that_options_override(monkeypatch, tmp_path):
    calls = []

    def fake_child(name, T, args):
        calls.append((name, T, args.repeats))
        return {"params": 1e6, "seconds": T / 1000 * (2.0 if name == "llama" else 1.0), "peak_mib": T / 64}

    monkeypatch.setattr(bench, "run_child", fake_child)
    bench.main(["--family", "efficiency", "--lengths", "64", "128", "--plot", str(tmp_path / "eff.png")])
    models = bench.FAMILIES["efficiency"]["models"]
    assert sorted(calls) == sorted((m, T, 2) for m in models for T in (64, 128) for _ in range(3))  # 3 trials each
    assert (tmp_path / "eff.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit, match="--baseline llama is not one of --models"):
        bench.main(["--family", "efficiency", "--models", "mamba2", "jamba"])


def test_the_zoo_rows_need_no_transformers(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    for name in bench.TWINS:
        assert bench.build(name, TINY, 64).d_model == TINY["d_model"]
    with pytest.raises(ImportError):
        bench.build(bench.TWINS["llama"], TINY, 64)  # only the hf-* rows need it


def test_a_failed_row_makes_the_benchmark_exit_non_zero(monkeypatch, capsys):
    monkeypatch.setattr(bench, "run_child", lambda name, T, args: {"error": "out of memory"} if name == "doge"
                        else {"seconds": 1.0, "params": 1000, "peak_mib": 10.0, "first_step_s": 1.0})
    with pytest.raises(SystemExit, match=r"error: 1 row\(s\) failed: doge at T=32"):
        bench.main(["--models", "llama", "doge", "--lengths", "32", "--d-model", "128", "--layers", "2"])
    out = capsys.readouterr().out
    assert "| doge | - | 32 | failed: out of memory |" in out and "| llama |" in out


def test_each_row_prints_once_what_it_is_compared_with_is_measured(monkeypatch, capsys):
    """A run cut at a time limit (the GPU suite's) keeps its finished rows: a row prints as soon as its baseline
    (and, for an HF twin, the zoo twin it takes its FLOPs from) is measured, not when the whole length is done."""
    seen = []

    def child(name, T, args):
        seen.append((name, capsys.readouterr().out))  # what was printed before this child ran
        return {"seconds": 1.0, "params": 1000, "peak_mib": 10.0, "first_step_s": 1.0}

    monkeypatch.setattr(bench, "run_child", child)
    bench.main(["--models", "llama", "hf-llama", "hybrid", "mamba2", "--lengths", "32", "--d-model", "128", "--layers", "2"])
    before = dict(seen)
    assert "| llama |" not in before["hf-llama"]  # llama waits for its baseline, hf-llama
    assert "| llama |" in before["hybrid"] and "| hf-llama |" in before["hybrid"]
    assert "| hybrid |" in before["mamba2"]  # hybrid's baseline (llama) was measured before it
    # mamba2's baseline is hf-mamba2, not in this run: it prints alone, after its own measurement
    assert "| mamba2 | 0.00M | 32 |" in capsys.readouterr().out


def test_a_child_measures_its_one_row_and_starts_nothing(monkeypatch, capsys):
    # a child that ran the whole table would start children of its own, without end
    monkeypatch.setattr(bench.subprocess, "Popen", lambda *args, **kwargs: pytest.fail("the child started a process"))
    monkeypatch.setattr(bench, "measure", lambda name, T, s, repeats, compiled, profile=0: {
        "name": name, "T": T, "d_model": s["d_model"], "repeats": repeats, "compiled": compiled})
    bench.main(["--child", "mamba2", "48", "--d-model", "96", "--repeats", "2"])
    assert json.loads(capsys.readouterr().out) == {"name": "mamba2", "T": 48, "d_model": 96, "repeats": 2,
                                                   "compiled": False}


@pytest.mark.parametrize("name", ["hybrid", *bench.NAMED])
def test_each_mixer_is_scaled_to_the_benchmarks_width_and_state(name):
    """Heads of 64 (the tiny recipes' query-to-key-value grouping kept), SSD states of ``d_state`` and chunks of
    ``chunk`` at the benchmark's sizes, CDMoE's retrieval heads as the recipe has them; the hybrid's SSD is
    Mamba-2's (conv, expanded, no rotary)."""
    from components import SSD

    model = bench.build(name, TINY, 64)
    ssds = [m for m in model.modules() if isinstance(m, SSD)]
    assert (ssds or name == "doge_moe") and all((m.head_dim, m.d_state, m.chunk_size) == (64, 16, 16) for m in ssds)
    if name in bench.NAMED:  # CDMoE's heads are retrieval heads, not a width: the recipe's
        recipe = bench.yaml.safe_load((bench.CONFIGS / "arch" / "tiny" / f"{name}.yaml").read_text())["model"]
        want = {spec["init_args"]["n_heads"] for spec in recipe["mixers"].values()
                if spec["class_path"].endswith("CDMoE")}
        assert {m.n_heads for m in model.modules() if type(m).__name__ == "CDMoE"} == want
    attention = [m for m in model.modules() if hasattr(m, "n_kv_heads") and hasattr(m, "n_heads")]  # not CDMoE
    assert all(m.n_heads == 2 for m in attention), name  # d_model 128: two heads of 64
    if name == "hybrid":
        assert [(m.n_heads, m.n_kv_heads) for m in attention] == [(2, 1)]  # 4:2 in the recipe, kept as 2:1
        assert all(m.conv is not None and not m.rope and m.d_inner == 2 * TINY["d_model"] for m in ssds)


def test_a_measured_step_trains_on_sequences_of_the_length_asked(monkeypatch):
    seen = []
    forward = bench.HybridLM.forward
    monkeypatch.setattr(bench.HybridLM, "forward", lambda self, ids, *a, **kw: seen.append(ids.shape[1]) or
                        forward(self, ids, *a, **kw))
    bench.measure("llama", 40, TINY, repeats=2, compiled=False)
    assert seen == [64] + [40] * 3  # the warm-up step, the first step at T (its peak), the timed steps


def test_the_hugging_face_doge_runs_on_sdpa():
    pytest.importorskip("transformers")
    assert bench.build("hf-doge", TINY, 64).config._attn_implementation == "sdpa"


class FakeChild:
    """What ``subprocess.Popen`` gives ``run_child``: stderr lines as they come, then stdout, then the status."""

    def __init__(self, stderr: str, stdout: str, returncode: int):
        self.stderr, self._stdout, self.returncode = iter(stderr.splitlines(keepends=True)), stdout, returncode
        self.stdout = self

    def read(self):
        return self._stdout

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_child_passes_on_its_progress_and_gives_its_last_line_or_its_error(monkeypatch, capsys):
    args = bench.argparse.Namespace(repeats=2, compile_child=True, profile=0, d_model=128, layers=2, vocab=97, batch=1,
                                    d_state=16, chunk=16)
    commands = []
    ok = FakeChild(f"{bench.PROGRESS}built (0.5 s)\nsome warning\n", 'a line\n{"seconds": 2.0}\n', 0)
    monkeypatch.setattr(bench.subprocess, "Popen", lambda command, **kw: commands.append(command) or ok)
    assert bench.run_child("mamba2", 48, args) == {"seconds": 2.0}
    assert "  mamba2 T=48: built (0.5 s)" in capsys.readouterr().err  # passed on; the warning is not
    assert commands[0][3:6] == ["--child", "mamba2", "48"] and "--compile" in commands[0]
    assert commands[0][commands[0].index("--d-state") + 1] == "16"
    failed = FakeChild("Traceback …\nRuntimeError: out of memory\n", "", 1)
    monkeypatch.setattr(bench.subprocess, "Popen", lambda command, **kw: failed)
    assert bench.run_child("mamba2", 48, args) == {"error": "RuntimeError: out of memory"}


def test_compiled_rows_are_the_zoo_models_and_profiles_and_saved_tensors_are_reported(monkeypatch, capsys):
    calls = []

    def child(name, T, args):
        calls.append((name, args.compile_child))
        return {"seconds": 1.0, "params": 1000, "peak_mib": 10.0, "first_step_s": 1.0, "profile": f"ops of {name}\n"}

    monkeypatch.setattr(bench, "run_child", child)
    bench.main(["--models", "llama", "hf-llama", "--lengths", "32", "--d-model", "128", "--layers", "2", "--compile",
                "--profile", "3"])
    out = capsys.readouterr().out
    assert calls == [("llama", False), ("hf-llama", False), ("llama", True)]  # no compiled row for an HF model
    assert "| llama (compiled) |" in out and "(compiled)" not in out.split("| llama (compiled) |")[0].split("\n")[-1]
    assert "### llama (compiled) at T=32: one step's 3 costliest ops\n\n```\nops of llama\n```" in out
    saved = []
    monkeypatch.setattr(bench, "print_saved", lambda models, lengths, s: saved.append((models, lengths)))
    bench.main(["--models", "llama", "hf-llama", "hybrid", "--lengths", "32", "--saved"])
    assert saved == [(["llama", "hybrid"], [32])]  # the zoo's models: the HF twins' steps are not theirs to count


def test_a_row_is_compared_with_its_twin_or_llama_unless_told():
    assert [bench.baseline_of(name) for name in ("llama", "hf-llama", "mamba2", "jamba", "hybrid")] == [
        "hf-llama", "hf-llama", "hf-mamba2", "llama", "llama"]
    assert bench.baseline_of("jamba", "mamba2") == "mamba2"
