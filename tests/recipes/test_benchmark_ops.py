"""``recipes.benchmarks.ops``: with ``--profile`` the kernel tables name the ops a row spends its time in; the
SSD's and attention's TFLOP/s count each op's own FLOPs and forward+backward passes."""

import re

import pytest
import torch

from recipes.benchmarks import ops


def test_the_profile_tables_name_the_forward_and_backward_kernels():
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64)
    # rows enough for every op: with 5, which backward ops made the cut changed with the timings (a flaky test)
    lines = list(ops.profile_tables(lambda: torch.tanh(x @ w), [w], rows=50))
    forward, backward = "\n".join(lines[: lines.index("forward+backward:")]), "\n".join(lines)
    assert lines[0] == "forward:" and "aten::mm" in forward and "aten::tanh" in forward
    assert "tanh_backward" not in forward and "tanh_backward" in backward  # the backward ran in the second table only
    assert w.grad is not None  # and reached the inputs


def test_profiled_rows_are_nothing_without_the_option_and_a_headed_table_per_case_with_it():
    w = torch.randn(8, 8, requires_grad=True)
    case = ("a product", lambda: w @ w, [w])
    assert list(ops.profiled_rows([case], 7, 0)) == []
    lines = list(ops.profiled_rows([case, ("another", lambda: w * 2, [w])], 7, 3))
    assert [line for line in lines if line.startswith("####")] == [
        "#### a product, T=7: the 3 costliest kernels", "#### another, T=7: the 3 costliest kernels"]
    assert lines[-2:] == ["```", ""]  # a blank line ends the last table before the next rows


def test_the_tile_searchs_winners_reach_the_ssd_kernels_through_ssd_config(tmp_path, monkeypatch, capsys):
    """``ssd_tiles --write-winners`` writes the winners' ``launch_config`` entries; ``ops --ssd-config`` lays them over
    the SSD kernels' own choice for the process (so one lease times them against mamba_ssm before they are written
    into the code). No winners: the file is not left behind from an earlier run. A bad file is named."""
    from zoo_kernels.ssd import triton as ssd_triton
    from recipes.benchmarks import ssd_tiles

    monkeypatch.setattr(ssd_triton, "launch_config", ssd_triton.launch_config)  # put back after the test
    own = ssd_triton.launch_config(64, 128, True, torch.bfloat16, 90)
    winners = {"group_order": "blocks", "y": {"order": "blocks"}}
    path = tmp_path / "winners.json"
    ssd_tiles.write_winners(str(path), winners)
    ops.main(["--device", "cpu", "--ops", "ssd", "--lengths", "16", "--repeats", "1", "--ssd-config", str(path)])
    assert f"SSD launch_config entries from {path}, over its own: {winners}" in capsys.readouterr().out
    chosen = ssd_triton.launch_config(64, 128, True, torch.bfloat16, 90)
    assert chosen == {**own, "group_order": "blocks", "y": {**own["y"], "order": "blocks"}}  # y's tiles kept
    assert ssd_triton._tiles(chosen, "dx") == ssd_triton._tiles(own, "dx")

    ssd_tiles.write_winners(str(path), None)
    assert not path.exists()
    for text, says in (("[1, 2]", "must hold a JSON object"), ('{"rows": 64, "row": 32}', "['row'] are not"),
                       ("{", "is not JSON")):
        path.write_text(text)
        with pytest.raises(SystemExit, match=re.escape(says)):
            ops.ssd_config_over(str(path))
    with pytest.raises(SystemExit, match="no such file"):
        ops.ssd_config_over(str(tmp_path / "missing.json"))


def test_the_ssd_and_attention_rates_count_their_own_flops(monkeypatch):
    """The SSD's rate divides the FLOPs torch's counter sees its reference make (``ssd_flops``), three forwards'
    worth forward+backward; attention's the causal half of its scores and sum, FlashAttention's 3.5 forwards."""
    monkeypatch.setattr(ops, "measure", lambda fn, ins, backward, repeats: (2.0 if backward else 0.5, float("nan")))
    rows = [line for line in ops.bench_ssd([300], "cpu", torch.float32, 1, False, B=1) if line.startswith("| ref")]
    flops = ops.ssd_flops(1, 300, 32, 64, 128, 256)
    assert rows == [f"| reference (chunked torch) | 300 | 0.50 | {flops / 0.5e-3 / 1e12:.3g} | 2.00 | "
                    f"{3 * flops / 2e-3 / 1e12:.3g} | - |"]
    rows = [line for line in ops.bench_attention([40], "cpu", torch.float32, 1, False, B=1)
            if line.startswith("| SDPA, no")]
    flops = 4 * 16 * 40 * 40 * 64 / 2
    assert rows == [f"| SDPA, no bias | 40 | 0.50 | {flops / 0.5e-3 / 1e12:.3g} | 2.00 | "
                    f"{3.5 * flops / 2e-3 / 1e12:.3g} | - |"]


def to_reference(op, backends: list):
    """``op`` with whatever backend a row asks for run on its plain-torch reference; ``(name, backend asked,
    check_finite)`` of each call appended to ``backends``."""
    def call(*args, backend, **kwargs):
        backends.append((op.__name__, backend, kwargs.get("check_finite", True)))
        return op(*args, backend="reference", **kwargs)
    return call


def test_every_row_times_its_forward_then_its_forward_and_backward_to_every_input(monkeypatch):
    """With the Triton rows on (each routed here to the reference, its backend recorded): each row is measured
    forward alone, then forward+backward with a gradient reaching every input it lists; SDPA's rows compute causal
    attention without and with the bias; the SSD's kernels-alone row turns the finite checks off and only it."""
    from zoo_kernels.attention import attention as attention_op
    from zoo_kernels.retrieval import expert_mix as expert_mix_op
    from zoo_kernels.ssd import ssd_scan as ssd_scan_op

    backends, measured, inputs = [], [], []
    def measure(fn, ins, backward, repeats):
        ops.step(fn, ins, backward)
        measured.append((backward, [t.grad is not None for t in ins], fn().detach()))
        inputs.append(ins)
        return 1.0, float("nan")

    for name, op in (("attention", attention_op), ("ssd_scan", ssd_scan_op), ("expert_mix", expert_mix_op)):
        monkeypatch.setattr(ops, name, to_reference(op, backends))
    monkeypatch.setattr(ops, "measure", measure)

    lines = list(ops.bench_attention([24], "cpu", torch.float32, 1, True, B=1))
    assert [line.split(" | ")[0] for line in lines if line.startswith("| ") and " 24 " in line] == [
        "| SDPA, no bias", "| SDPA, dense float bias mask", "| reference (bias)", "| triton flash (bias)"]
    assert lines[-1] == "flash-dmattn not installed: its row is skipped"
    assert [backward for backward, _, _ in measured] == [False, True] * 4
    assert all(all(grads) == backward for backward, grads, _ in measured)  # cleared, then every input's
    sdpa, masked, reference, triton = (out for backward, _, out in measured if not backward)
    assert torch.equal(reference, triton)
    torch.testing.assert_close(masked.transpose(1, 2), reference, rtol=1e-5, atol=1e-5)
    q, k, v = inputs[0]
    torch.testing.assert_close(sdpa.transpose(1, 2), attention_op(q, k, v, backend="reference"), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(sdpa, masked)  # the bias counts
    assert [b for _, b, _ in backends[:2]] == ["reference", "reference"] and "triton" in [b for _, b, _ in backends]

    measured.clear()
    backends.clear()
    list(ops.bench_ssd([40], "cpu", torch.float32, 1, True, B=1))
    assert [backward for backward, _, _ in measured] == [False, True] * 3
    assert all(all(grads) == backward for backward, grads, _ in measured)
    assert sorted(set(backends)) == [("ssd_scan", "reference", True), ("ssd_scan", "triton", False),
                                     ("ssd_scan", "triton", True)]
    reference, with_checks, without = (out for backward, _, out in measured if not backward)
    torch.testing.assert_close(with_checks, reference)
    torch.testing.assert_close(without, reference)

    measured.clear()
    backends.clear()
    list(ops.bench_retrieval("cpu", torch.float32, 1, True, tokens=8))
    assert [backward for backward, _, _ in measured] == [False, True] * 2
    assert all(all(grads) == backward for backward, grads, _ in measured)
    assert [b for _, b, _ in dict.fromkeys(backends)] == ["reference", "triton"]


def test_a_decoding_step_row_names_its_route_window_speed_and_largest_difference(monkeypatch):
    """One query against the cache with the bias, causal, the first sixteenth of the keys padded, each window, finite
    checks off; ``× auto`` the ratio of the times; the difference column the largest over the output."""
    seen = []

    def attention(q, k, v, **kwargs):
        seen.append({"k": k, "v": v, **kwargs})
        out = torch.zeros_like(q)
        if kwargs["backend"] == "triton":
            out[0, 0, 3, 5] = 0.5  # one element off
        return out

    monkeypatch.setattr(ops, "attention", attention)

    def measure(fn, ins, backward, repeats):
        assert not backward  # a step decodes: nothing to differentiate
        fn()
        return 0.5 if seen[-1]["backend"] == "triton" else 2.0, float("nan")

    monkeypatch.setattr(ops, "measure", measure)
    lines = list(ops.bench_decode([32], "cpu", torch.float32, 1, True, [1]))
    gbs = (2 * 32 * 16 * 128 + 16 * 32) * 4 / 1e9
    assert [line for line in lines if line.startswith("| auto") or line.startswith("| triton")] == [
        f"| auto (SDPA) | 1 | 32 | - | 2.000 | {gbs / 2e-3:.0f} | 1.00× | 0.0e+00 |",
        f"| triton forced | 1 | 32 | - | 0.500 | {gbs / 0.5e-3:.0f} | 4.00× | 5.0e-01 |",
        f"| auto (SDPA) | 1 | 32 | 8 | 2.000 | {gbs / 2e-3:.0f} | 1.00× | 0.0e+00 |",
        f"| triton forced | 1 | 32 | 8 | 0.500 | {gbs / 0.5e-3:.0f} | 4.00× | 5.0e-01 |"]
    call = seen[0]
    assert {key: call[key] for key in ("backend", "causal", "keep_window", "check_finite")} == {
        "backend": "auto", "causal": True, "keep_window": None, "check_finite": False}
    assert call["key_padding_mask"].tolist() == [[True] * 2 + [False] * 30] and call["bias"].shape == (1, 16, 32)
    assert call["k"].shape == (1, 32, 16, 128) and torch.equal(call["k"][:, :, 0], call["k"][:, :, 3])  # GQA 4:1
    assert not torch.equal(call["k"][:, :, 0], call["k"][:, :, 4])
    assert {c["keep_window"] for c in seen} == {None, 8} and {c["backend"] for c in seen} == {"auto", "triton"}


def test_the_sizes_follow_the_device(monkeypatch, capsys):
    """On a CPU: T 512 … 2048, batch 1, fp32, no Triton rows (said so), 1,024 retrieval tokens; on a GPU: T 1024 …
    8192, batch 4, bf16, Triton rows, 4,096 tokens; the decoding step at batch 1 and twice the batch."""
    calls = {}

    def recorder(name):
        def bench(*args, **kwargs):
            calls[name] = (args, kwargs)
            yield f"{name} ran"
        return bench

    for name in ("bench_attention", "bench_ssd", "bench_gated_delta", "bench_retrieval", "bench_decode"):
        monkeypatch.setattr(ops, name, recorder(name))
    ops.main(["--device", "cpu"])
    out = capsys.readouterr().out
    assert "No CUDA: Triton rows are skipped" in out and out.count(" ran\n") == 5 and "float32" in out
    assert calls["bench_gated_delta"] == (([512, 1024, 2048], "cpu", torch.float32, 10, False, 1, 0), {})
    assert calls["bench_attention"] == (([512, 1024, 2048], "cpu", torch.float32, 10, False, 1, 64, 0), {})
    assert calls["bench_ssd"] == (([512, 1024, 2048], "cpu", torch.float32, 10, False, 1, 0), {})
    assert calls["bench_retrieval"] == (("cpu", torch.float32, 10, False), {"tokens": 1024})
    assert calls["bench_decode"] == (([512, 1024, 2048], "cpu", torch.float32, 10, False, [1, 2]), {})

    monkeypatch.setattr(ops, "device", str)  # the option's check of CUDA's presence, off
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "a GPU")
    ops.main(["--device", "cuda", "--ops", "attention", "retrieval", "decode"])
    out = capsys.readouterr().out
    assert out.startswith("device: a GPU") and "No CUDA" not in out and "bfloat16" in out
    assert calls["bench_attention"] == (([1024, 2048, 4096, 8192], "cuda", torch.bfloat16, 10, True, 4, 64, 0), {})
    assert calls["bench_retrieval"] == (("cuda", torch.bfloat16, 10, True), {"tokens": 4096})
    assert calls["bench_decode"][0][-1] == [1, 8]
    ops.main(["--device", "cuda", "--ops", "decode", "--batch", "3", "--lengths", "5"])
    assert calls["bench_decode"][0][0] == [5] and calls["bench_decode"][0][-1] == [1, 6]


def test_the_public_baselines_get_the_rows_inputs_when_installed(monkeypatch):
    """mamba_ssm's ``mamba_chunk_scan_combined`` gets the SSD row's own tensors at its chunk (the comparison the GPU
    goal is judged by) and flash-dmattn the bias as a broadcast ``[B, H, T, S]`` view, causal; each is then a row,
    and the note says which ran. Stand-ins for both packages, computing with the references."""
    import importlib.util
    import sys
    import types

    from zoo_kernels.attention import attention as attention_op
    from zoo_kernels.ssd import ssd_scan as ssd_scan_op

    calls = {}

    def chunk_scan(x, dt, A, B, C, chunk_size, D):
        calls["mamba"] = (x, dt, A, B, C, chunk_size, D)
        return ssd_scan_op(x, dt, A, B, C, chunk_size=chunk_size, D=D, backend="reference")

    def dmattn(q, k, v, attn_bias, is_causal):
        calls["dmattn"] = (attn_bias, is_causal)
        return attention_op(q, k, v, bias=attn_bias[:, :, 0], causal=is_causal, backend="reference")

    combined = types.ModuleType("mamba_ssm.ops.triton.ssd_combined")
    combined.mamba_chunk_scan_combined = chunk_scan
    flash = types.ModuleType("flash_dmattn")
    flash.flash_dmattn_func_auto = lambda: dmattn
    monkeypatch.setitem(sys.modules, "mamba_ssm.ops.triton.ssd_combined", combined)
    monkeypatch.setitem(sys.modules, "flash_dmattn", flash)
    installed = {"mamba_ssm", "flash_dmattn"}
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name in installed else find_spec(name, *a))
    # the Triton rows (on with a GPU, as the baselines are) routed to the reference
    monkeypatch.setattr(ops, "attention", to_reference(attention_op, []))
    monkeypatch.setattr(ops, "ssd_scan", to_reference(ssd_scan_op, []))
    monkeypatch.setattr(ops, "measure", lambda fn, ins, backward, repeats: (ops.step(fn, ins, backward), (1.0, 0.0))[1])

    lines = list(ops.bench_ssd([40], "cpu", torch.float32, 1, True, B=2))
    assert any(line.startswith("| mamba_ssm mamba_chunk_scan_combined | 40 | 1.00 |") for line in lines)
    x, dt, A, B, C, chunk, D = calls["mamba"]
    assert (x.shape, dt.shape, A.shape, B.shape, C.shape, chunk, D.shape) == ((2, 40, 32, 64), (2, 40, 32), (32,),
                                                                              (2, 40, 1, 128), (2, 40, 1, 128), 256, (32,))
    assert x.grad is not None and D.grad is not None and ops.MAMBA_MISSING not in lines

    lines = list(ops.bench_attention([24], "cpu", torch.float32, 1, True, B=2))
    assert any(line.startswith("| flash-dmattn (bias) | 24 | 1.00 |") for line in lines)
    bias, causal = calls["dmattn"]
    assert causal is True and bias.shape == (2, 16, 24, 24) and bias.stride(2) == 0  # a view, not a copy
    assert lines[-1].startswith("flash-dmattn: flash_dmattn_func_auto()")


def test_the_gated_delta_rows_time_the_reference_the_kernel_and_flash_linear_attention_to_every_input(monkeypatch):
    """With the Triton rows on (routed here to the reference, the backends recorded) and a stand-in
    flash-linear-attention: rows in order, each measured forward then forward+backward with every input's gradient;
    unit keys, fp32 log-decays; the kernels-alone row (and only it) without the finite checks; TFLOP/s from the
    chunked form's FLOP count over 3 passes."""
    import sys
    import types

    from components.flops import gated_delta_flops_per_token
    from zoo_kernels.gated_delta import gated_delta_rule

    backends, measured, fla_calls = [], [], []
    monkeypatch.setattr(ops, "gated_delta_rule", to_reference(gated_delta_rule, backends))

    def measure(fn, ins, backward, repeats):
        ops.step(fn, ins, backward)
        measured.append((backward, [t.grad is not None for t in ins]))
        return 2.0, float("nan")

    def chunk_gated_delta_rule(q, k, v, g, beta):
        fla_calls.append((k.norm(dim=-1), g.dtype))
        return gated_delta_rule(q, k, v, g, beta, backend="reference"), None

    module = types.ModuleType("fla.ops.gated_delta_rule")
    module.chunk_gated_delta_rule = chunk_gated_delta_rule
    for name in ("fla", "fla.ops", "fla.ops.gated_delta_rule"):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(ops.importlib.util, "find_spec", lambda name, *a: object() if name == "fla" else None)
    monkeypatch.setattr(ops, "measure", measure)
    lines = list(ops.bench_gated_delta([20], "cpu", torch.float32, 1, True, B=1))
    rows = [line for line in lines if line.startswith("| ") and " 20 " in line]
    assert [row.split(" | ")[0] for row in rows] == [
        "| reference (chunked torch)", "| triton (recurrence over chunks)", "| triton, check_finite=False",
        "| flash-linear-attention chunk_gated_delta_rule"]
    assert [backward for backward, _ in measured] == [False, True] * 4
    assert all(all(grads) == backward for backward, grads in measured)
    assert sorted(set(backends)) == [("gated_delta_rule", "reference", True), ("gated_delta_rule", "triton", False),
                                     ("gated_delta_rule", "triton", True)]
    norms, g_dtype = fla_calls[0]
    torch.testing.assert_close(norms, torch.ones_like(norms))
    assert g_dtype == torch.float32
    tflops = gated_delta_flops_per_token(20, 64, 16, 128, 128) * 20 / 2e-3 / 1e12
    assert rows[0].split(" | ")[3] == f"{tflops:.3g}" and rows[0].split(" | ")[5] == f"{3 * tflops:.3g}"
    assert ops.FLA_MISSING not in lines
