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


def test_the_tile_searchs_winners_reach_the_ssd_kernels_through_ssd_config(tmp_path, monkeypatch, capsys):
    """``ssd_tiles --write-winners`` writes the winners' ``launch_config`` entries; ``ops --ssd-config`` lays them over
    the SSD kernels' own choice for the process (so one lease times them against mamba_ssm before they are written
    into the code). No winners: the file is not left behind from an earlier run. A bad file is named."""
    from kernels.ssd import triton as ssd_triton
    from recipes.benchmarks import ssd_tiles

    monkeypatch.setattr(ssd_triton, "launch_config", ssd_triton.launch_config)  # put back after the test
    own = ssd_triton.launch_config(64, 128, True, torch.bfloat16, 90)
    winners = {"group_order": "blocks", "y": {"order": "blocks"}}
    path = tmp_path / "winners.json"
    ssd_tiles.write_winners(str(path), winners)
    ops.main(["--device", "cpu", "--ops", "ssd", "--lengths", "16", "--repeats", "1", "--ssd-config", str(path)])
    assert "SSD launch_config entries from" in capsys.readouterr().out
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
