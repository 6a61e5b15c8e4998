"""``recipes.benchmarks.ssd``: the FLOPs its GFLOP/s column divides are the ones torch's counter sees the chunked
reference make (forward, and three times that forward+backward), and each row's columns are computed from the
times of the same run: tokens/s, GFLOP/s, the share of the matmul rate, attention over SSD, the recurrence dropped
once it runs long."""

import pytest
from torch.utils.flop_counter import FlopCounterMode

from zoo_kernels.ssd import ssd_scan
from recipes.benchmarks import ssd as bench


@pytest.mark.parametrize("T", [67, 128])
def test_the_flops_are_what_the_counter_sees_the_reference_make(T):
    inputs = bench.ssd_inputs(2, T, 3, 8, 4, grad=True)
    with FlopCounterMode(display=False) as forward:
        y = ssd_scan(**inputs, chunk_size=16, backend="reference")
    with FlopCounterMode(display=False) as both:
        ssd_scan(**inputs, chunk_size=16, backend="reference").sum().backward()
    assert bench.ssd_flops(2, T, 3, 8, 4, 16) == forward.get_total_flops() > 0
    assert 3 * bench.ssd_flops(2, T, 3, 8, 4, 16) == both.get_total_flops()
    assert y.shape == (2, T, 3, 8) and inputs["B"].shape[2] == 1  # one group: B and C shared by the heads


def test_each_row_is_computed_from_the_same_runs_times(monkeypatch, capsys):
    calls = []

    def timed(run, inputs, backward, repeats):
        run(**inputs)  # the ops below record how they are called
        if "q" in inputs:
            return 40.0 * (1 + backward)  # attention
        return 300.0 if repeats == 1 else 10.0 * (1 + backward)  # the recurrence is timed once

    monkeypatch.setattr(bench, "timed", timed)
    monkeypatch.setattr(bench, "matmul_gflops", lambda repeats: 50.0)
    def ssd_flops(b, T, H, P, N, L):
        assert (H, P, N, L) == (2, 8, 4, 16)
        return b * T * 1e6

    monkeypatch.setattr(bench, "ssd_flops", ssd_flops)
    monkeypatch.setattr(bench, "ssd_scan", lambda **kw: calls.append(("scan", kw["chunk_size"], kw["backend"])))
    monkeypatch.setattr(bench, "ssd_recurrent", lambda **kw: calls.append(("recurrence", kw["x"].shape)) or [0])
    monkeypatch.setattr(bench, "attention", lambda **kw: calls.append(("attention", kw["causal"], kw["backend"])))
    bench.main(["--lengths", "32", "64", "--repeats", "2", "--batch", "2", "--heads", "2", "--head-dim", "8",
                "--d-state", "4", "--chunk", "16", "--recurrence-max-seconds", "0.5"])
    out = capsys.readouterr().out
    assert "# fp32 matmul 2048³: 50.0 GFLOP/s" in out
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if line.startswith("| ")][1:]
    assert [row[:2] for row in rows] == [["32", "fwd"], ["32", "fwd+bwd"], ["64", "fwd"], ["64", "fwd+bwd"]]
    for row in rows:
        T, backward = int(row[0]), row[1] == "fwd+bwd"
        ms = 10.0 * (1 + backward)
        gflops = 2 * T * 1e6 * (3 if backward else 1) / (ms * 1e-3) / 1e9  # the backward counted as two forwards
        assert row[2:6] == [f"{ms:.1f}", f"{2 * T / ms * 1e3:,.0f}", f"{gflops:.1f}", f"{100 * gflops / 50.0:.0f}%"]
        assert row[7:] == [f"{40.0 * (1 + backward):.1f}", "4.00"]
    # 300 ms is past half the 0.5 s limit: the recurrence is timed at the first length only, in each pass
    assert [row[6] for row in rows] == ["300", "300", "skipped", "skipped"]
    assert set(calls) == {("scan", 16, "reference"), ("attention", True, "reference"),
                          ("recurrence", (2, 32, 2, 8))}


@pytest.mark.parametrize("backward", [False, True])
def test_a_timed_pass_runs_the_backward_when_asked(backward):
    inputs = bench.ssd_inputs(1, 9, 2, 4, 4, grad=backward)
    ms = bench.timed(lambda **kw: ssd_scan(**kw, chunk_size=4, backend="reference"), inputs, backward, repeats=2)
    assert ms > 0 and isinstance(ms, float)
    assert all((t.grad is not None) == backward for t in inputs.values())


def test_the_machines_rate_is_the_flops_of_one_square_matmul_over_its_median(monkeypatch):
    def median_ms(fn, repeats):
        assert fn().shape == (100, 100) and repeats == 3
        return 2.0
    monkeypatch.setattr(bench, "median_ms", median_ms)
    assert bench.matmul_gflops(3, size=100) == pytest.approx(2 * 100**3 / 2e-3 / 1e9)
