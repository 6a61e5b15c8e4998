"""The CPU benchmark compares like with like: within each op, the cases that compute the same thing by
different means (the baseline and the path measured) agree on outputs and every gradient."""

import pytest
import torch

from recipes.benchmarks import ops_cpu as cpu_bench

SAME_MATH = [
    ("attention bias (fused)", "attention bias (written-out mask)"),
    ("ssd four-operand einsum", "ssd reference"),
    ("experts, one matmul per expert (loop)", "experts, grouped_mm"),
    ("cdmoe mix, 65,536 experts", "cdmoe mix, 65,536 experts, sparse grads"),
    ("loss, head then cross-entropy (written-out logits)", "loss, head and cross-entropy in chunks"),
]


def output_and_grads(case: str, T: int):
    tensors = cpu_bench.inputs(case, T)  # seeded: both cases of a pair get the same tensors
    out = cpu_bench.run(case, tensors)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
    grads = [t.grad.to_dense() if t.grad.is_sparse else t.grad for t in tensors if t.is_floating_point()]
    return out.detach(), grads


@pytest.mark.parametrize("baseline, case", SAME_MATH, ids=[pair[1] for pair in SAME_MATH])
def test_the_cases_of_a_pair_compute_the_same(baseline, case):
    T = 128  # a multiple of the chunk, as the four-operand baseline requires
    want, want_grads = output_and_grads(baseline, T)
    got, got_grads = output_and_grads(case, T)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert len(got_grads) == len(want_grads) > 0
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=f"gradient {i}")


def test_every_listed_case_runs():
    for cases in cpu_bench.PAIRS.values():
        for case in cases:
            assert torch.isfinite(cpu_bench.run(case, cpu_bench.inputs(case, 64))).all(), case


def test_the_table_gives_each_case_its_median_and_peak_against_the_baseline_of_its_op(monkeypatch, capsys):
    rounds = {"ssd four-operand einsum": [0.010, 0.002, 0.003], "ssd reference": [0.001, 0.0015, 0.009]}
    peaks = {("ssd four-operand einsum", 64): 8.0, ("ssd reference", 64): 2.0,
             ("ssd four-operand einsum", 32): 0.4, ("ssd reference", 32): 0.1}
    monkeypatch.setattr(cpu_bench, "interleaved_seconds", lambda cases, repeats: {c: rounds[c] for c in cases})
    monkeypatch.setattr(cpu_bench, "peak_mib", lambda case, T: peaks[case, T])
    cpu_bench.main(["--ops", "ssd", "--lengths", "64", "32", "--repeats", "3"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| ssd f", "| ssd r"))]
    assert rows == ["| ssd four-operand einsum | 64 | 3.0 | 1.00 | 8.0 | 1.00 |",
                    "| ssd reference | 64 | 1.5 | 0.50 | 2.0 | 0.25 |",
                    # a baseline peak under a MiB is the counters' noise: no ratio to it
                    "| ssd four-operand einsum | 32 | 3.0 | 1.00 | 0.4 | — |",
                    "| ssd reference | 32 | 1.5 | 0.50 | 0.1 | — |"]
