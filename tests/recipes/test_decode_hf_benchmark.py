"""``python -m recipes.benchmarks.decode_hf`` at a tiny size: its table and its check that every mode's tokens
are the full forward's argmax (a timing of a different computation would mean nothing)."""

import pytest
import torch

from recipes.benchmarks import decode_hf

pytest.importorskip("transformers")


@pytest.mark.parametrize("timer", ["measured", "noise"])
def test_the_table_gives_each_mode_its_step_time_and_argmax_check(capsys, monkeypatch, timer):
    """One round at a tiny size: the step may be within the timer's noise, which the table must say, not divide by.
    ``noise`` forces that case (the steps' medians as measured, no ratio), so both forms of the cells are checked
    whatever the machine's timings."""
    if timer == "noise":
        measured = decode_hf.step_times
        monkeypatch.setattr(decode_hf, "step_times", lambda median, n: (measured(median, n)[0], {}))
    products = ["--products"] if timer == "measured" else []  # the A/B of the CPU step's row sums, once
    decode_hf.main(["--models", "hybrid", "--batches", "2", "--width", "64", "--layers", "2", "--vocab", "97",
                    "--prompt", "9", "--new-tokens", "5", "--rounds", "1", "--threads", "1", *products])
    out = capsys.readouterr().out
    rows = {cells[2]: cells for cells in (line.split(" | ") for line in out.splitlines() if line.startswith("| hybrid"))}
    assert set(rows) == {"zoo eager", "zoo compiled"} | ({"zoo compiled, products"} if products else set())
    if products:
        assert rows["zoo compiled, products"][7] == "ok |"
    # cells: model, batch, mode, tokens/s, × baseline, step ms, step × eager, argmax
    assert rows["zoo eager"][4] == "1.00×"  # the baseline: the eager itself
    eager, compiled = tuple(rows["zoo eager"][5:7]), tuple(rows["zoo compiled"][5:7])
    if timer == "noise":
        assert eager == compiled == ("noise", "-")
    else:  # both steps measured above the noise, or both cells say it
        assert (eager, compiled) == (("noise", "-"), ("noise", "-")) or (
            eager[1] == "1.00×" and compiled[1].endswith("×") and float(eager[0]) > 0 and float(compiled[0]) > 0)
    assert rows["zoo eager"][7] == rows["zoo compiled"][7] == "ok |"
    assert "The zoo's prefill" in out and "hybrid batch 2:" in out


def test_a_departure_from_the_full_forward_is_found_where_it_is():
    model = decode_hf.zoo_hybrid(64, 2, 97)
    prompt = torch.randint(0, 97, (2, 9))
    out = model.generate(prompt, 6)
    assert decode_hf.first_departure(model, out, 9) is None
    wrong = out.clone()
    wrong[1, 9 + 3] = (wrong[1, 9 + 3] + 1) % 97
    assert decode_hf.first_departure(model, wrong, 9).startswith("departs at 3 ")


def test_a_step_time_within_the_timers_noise_gives_no_ratio():
    median = {"zoo prefill": 0.010, "zoo eager": 0.050, "zoo compiled": 0.030}
    ms, ratio = decode_hf.step_times(median, 5)
    assert ms == pytest.approx({"zoo eager": 10.0, "zoo compiled": 5.0}) and ratio == pytest.approx({"zoo eager": 1.0, "zoo compiled": 2.0})
    median["zoo compiled"] = 0.009  # faster than its own prefill: noise
    ms, ratio = decode_hf.step_times(median, 5)
    assert ms["zoo compiled"] < 0 and ratio == {}


def test_the_products_mode_compiles_its_step_without_the_row_sums(monkeypatch):
    from components import generation

    entered = []

    class Recording(generation.LinearAsRowSums):
        def __enter__(self):
            entered.append(True)
            return super().__enter__()

    monkeypatch.setattr(generation, "LinearAsRowSums", Recording)
    model = decode_hf.zoo_hybrid(64, 2, 97)
    prompt = torch.randint(0, 97, (2, 9))
    assert torch.equal(decode_hf.generate_with_products(model, prompt, 4), model.generate(prompt, 4))
    assert entered == [] and generation.ROW_SUM_MAX_ROWS == 8  # and the limit is back afterwards


def test_the_hugging_face_models_rows_are_its_caches_and_the_zoos_on_the_same_weights(capsys, monkeypatch):
    """Llama and Mamba-2 built by ``transformers`` and imported: Hugging Face's dynamic cache is the baseline, Llama
    adds its static cache (Mamba-2 has none), and every mode, Hugging Face's too, decodes the full forward's argmax."""
    from components import HybridLM

    compiled = []
    generate = HybridLM.generate
    monkeypatch.setattr(HybridLM, "generate", lambda self, *a, **kw: compiled.append(kw.get("compile", False)) or
                        generate(self, *a, **kw))
    decode_hf.main(["--models", "llama", "mamba2", "--batches", "1", "--width", "64", "--layers", "1", "--vocab", "97",
                    "--prompt", "5", "--new-tokens", "3", "--rounds", "1", "--threads", "1"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith(("| llama", "| mamba2"))]
    assert [cells[:3] for cells in rows] == [
        ["| llama", "1", "hf dynamic"], ["| llama", "1", "hf static"], ["| llama", "1", "zoo eager"],
        ["| llama", "1", "zoo compiled"],
        ["| mamba2", "1", "hf dynamic"], ["| mamba2", "1", "zoo eager"], ["| mamba2", "1", "zoo compiled"]]
    assert rows[0][4] == rows[4][4] == "1.00×" and all(cells[7] == "ok |" for cells in rows)
    assert True in compiled and False in compiled  # the zoo's two modes: eager and compiled steps


def test_the_hybrid_is_transxssms_pattern_at_the_layers_asked():
    model = decode_hf.zoo_hybrid(128, 3, 97)
    assert model.pattern.replace(" ", "") == "SMSMAM" and len(model.blocks) == 3
    assert {m.n_heads for m in model.modules() if type(m).__name__ == "QCAttention"} == {2}  # a head per 64


def test_a_departures_margin_is_the_full_forwards_best_logit_over_the_token_taken():
    model = decode_hf.zoo_hybrid(64, 2, 97)
    out = model.generate(torch.randint(0, 97, (1, 9)), 4)
    wrong = out.clone()
    wrong[0, 9 + 1] = (wrong[0, 9 + 1] + 1) % 97
    logits = model(wrong[:, :-1])[0, 9 + 1 - 1]  # what predicts the changed position
    margin = float(decode_hf.first_departure(model, wrong, 9).split("margin ")[1].rstrip(")"))
    assert margin == pytest.approx(float(logits.max() - logits[wrong[0, 10]]), rel=0.06) and margin > 0


def test_mistrals_rows_run_past_its_window_with_the_full_forwards_argmax(capsys):
    """Mistral: Llama's shapes with every layer attending to its last ``--window`` keys; Hugging Face's dynamic and
    static caches and the zoo's two modes, over a prompt and new tokens past a window of 3, all the full forward's
    argmax (which the zoo model computes with the imported window)."""
    assert decode_hf.hf_model("mistral", 64, 1, 97, window=3).config.sliding_window == 3
    assert type(decode_hf.hf_model("llama", 64, 1, 97)).__name__ == "LlamaForCausalLM"
    decode_hf.main(["--models", "mistral", "--batches", "2", "--width", "64", "--layers", "2", "--vocab", "97",
                    "--prompt", "5", "--new-tokens", "4", "--rounds", "1", "--threads", "1", "--window", "3"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| mistral")]
    assert [cells[2] for cells in rows] == ["hf dynamic", "hf static", "zoo eager", "zoo compiled"]
    assert all(cells[7] == "ok |" for cells in rows)


def test_falcon_h1s_rows_are_hugging_faces_dynamic_cache_and_the_zoos_two_modes_with_the_full_forwards_argmax(capsys):
    """Falcon-H1 (attention and Mamba-2 side by side in every layer, imported as ``ParallelMixers``): transformers has
    no static cache for its Mamba-2 state, so its dynamic cache and the zoo's two modes run, all the full forward's
    argmax."""
    model = decode_hf.hf_model("falcon_h1", 64, 1, 97)
    assert (model.config.mamba_d_ssm, model.config.mamba_n_heads, model.config.num_attention_heads) == (128, 2, 1)
    decode_hf.main(["--models", "falcon_h1", "--batches", "2", "--width", "64", "--layers", "2", "--vocab", "97",
                    "--prompt", "5", "--new-tokens", "4", "--rounds", "1", "--threads", "1"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| falcon_h1")]
    assert [cells[2] for cells in rows] == ["hf dynamic", "zoo eager", "zoo compiled"]
    assert all(cells[7] == "ok |" for cells in rows)


def test_qwen3_nexts_rows_are_hugging_faces_dynamic_cache_and_the_zoos_two_modes_with_the_full_forwards_argmax(capsys):
    """Qwen3-Next (Gated DeltaNet in three layers of four, gated attention in the fourth, imported): its dynamic cache
    (a recurrent state and a conv window beside the keys: no static form) and the zoo's two modes, all the full
    forward's argmax."""
    model = decode_hf.hf_model("qwen3_next", 128, 4, 97)
    assert model.config.layer_types == ["linear_attention"] * 3 + ["full_attention"] and model.config.num_experts == 0
    decode_hf.main(["--models", "qwen3_next", "--batches", "2", "--width", "128", "--layers", "4", "--vocab", "97",
                    "--prompt", "5", "--new-tokens", "4", "--rounds", "1", "--threads", "1"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| qwen3_next")]
    assert [cells[2] for cells in rows] == ["hf dynamic", "zoo eager", "zoo compiled"]
    assert all(cells[7] == "ok |" for cells in rows)


def test_olmo_hybrids_rows_are_hugging_faces_dynamic_cache_and_the_zoos_two_modes_with_the_full_forwards_argmax(capsys):
    """OLMo-Hybrid (Gated DeltaNet in three layers of four, attention without RoPE behind norms after its mixers in the
    fourth, imported from the files transformers writes): its dynamic cache and the zoo's two modes, all the full
    forward's argmax."""
    model = decode_hf.hf_model("olmo_hybrid", 128, 4, 97)
    assert model.config.layer_types == ["linear_attention"] * 3 + ["full_attention"] and model.model.rotary_emb is None
    decode_hf.main(["--models", "olmo_hybrid", "--batches", "2", "--width", "128", "--layers", "4", "--vocab", "97",
                    "--prompt", "5", "--new-tokens", "4", "--rounds", "1", "--threads", "1"])
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| olmo_hybrid")]
    assert [cells[2] for cells in rows] == ["hf dynamic", "zoo eager", "zoo compiled"]
    assert all(cells[7] == "ok |" for cells in rows)
