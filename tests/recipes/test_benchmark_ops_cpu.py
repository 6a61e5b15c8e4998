"""The CPU benchmark compares like with like: within each op, the cases that compute the same thing by
different means (the baseline and the path measured) agree on outputs and every gradient."""

import pytest
import torch

from recipes.benchmarks import ops_cpu as cpu_bench

SAME_MATH = [
    ("attention bias (fused)", "attention bias (written-out mask)"),
    ("sliding window (written-out mask)", "sliding window (blocks)"),
    ("ssd four-operand einsum", "ssd reference"),
    ("experts, one matmul per expert (loop)", "experts, grouped_mm"),
    ("cdmoe mix, 65,536 experts", "cdmoe mix, 65,536 experts, sparse grads"),
    ("loss, head then cross-entropy (written-out logits)", "loss, head and cross-entropy in chunks"),
]


def output_and_grads(case: str, T: int):
    tensors = cpu_bench.inputs(case, T)  # seeded: both cases of a pair get the same tensors
    out = cpu_bench.run(case, tensors)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
    # (a case that leaves an input unused, the window's bias, gives it no gradient: both of its pair then do)
    grads = [t.grad.to_dense() if t.grad.is_sparse else t.grad for t in tensors if t.is_floating_point() and
             t.grad is not None]
    return out.detach(), grads


@pytest.mark.parametrize("baseline, case", SAME_MATH, ids=[pair[1] for pair in SAME_MATH])
def test_the_cases_of_a_pair_compute_the_same(baseline, case):
    T = 640 if "window" in case else 128  # past the window; else a multiple of the chunk, as the four-operand SSD requires
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
             ("ssd four-operand einsum", 32): 0.4, ("ssd reference", 32): 0.1,
             ("ssd four-operand einsum", 16): 1.0, ("ssd reference", 16): 3.0}
    monkeypatch.setattr(cpu_bench, "interleaved_seconds", lambda cases, repeats: {c: rounds[c] for c in cases})
    monkeypatch.setattr(cpu_bench, "peak_mib", lambda case, T: peaks[case, T])
    cpu_bench.main(["--ops", "ssd", "--lengths", "64", "32", "16", "--repeats", "3"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| ssd f", "| ssd r"))]
    assert rows == ["| ssd four-operand einsum | 64 | 3.0 | 1.00 | 8.0 | 1.00 |",
                    "| ssd reference | 64 | 1.5 | 0.50 | 2.0 | 0.25 |",
                    # a baseline peak under a MiB is the counters' noise: no ratio to it
                    "| ssd four-operand einsum | 32 | 3.0 | 1.00 | 0.4 | — |",
                    "| ssd reference | 32 | 1.5 | 0.50 | 0.1 | — |",
                    "| ssd four-operand einsum | 16 | 3.0 | 1.00 | 1.0 | 1.00 |",  # a MiB exactly: a ratio
                    "| ssd reference | 16 | 1.5 | 0.50 | 3.0 | 3.00 |"]


def test_the_sparse_case_gives_the_tables_sparse_gradients_and_the_dense_one_dense():
    """The pair measures sparse against dense table gradients: equal values (above), but of the two kinds."""
    for case, sparse in (("cdmoe mix, 65,536 experts", False), ("cdmoe mix, 65,536 experts, sparse grads", True)):
        x, experts, weights, down, up = tensors = cpu_bench.inputs(case, 16)
        cpu_bench.step(case, tensors)
        assert (down.grad.is_sparse, up.grad.is_sparse, x.grad.is_sparse) == (sparse, sparse, False), case


def test_the_attention_cases_without_bias_or_padding_are_what_they_say():
    """SDPA's row is causal attention without a bias (the fused reference's math with no bias), and the padded row
    hides the first quarter of the keys of its one sequence (so it differs from the unpadded row)."""
    from zoo_kernels.attention.reference import attention_reference

    q, k, v, bias, padding = tensors = cpu_bench.inputs("attention SDPA, no bias", 40)
    sdpa = cpu_bench.run("attention SDPA, no bias", tensors).transpose(1, 2)  # [B, T, H, D]
    torch.testing.assert_close(sdpa, attention_reference(q, k, v), rtol=1e-5, atol=1e-5)
    assert padding.tolist() == [[True] * 10 + [False] * 30]
    padded, fused = (cpu_bench.run(case, tensors) for case in ("attention bias + padding (fused)",
                                                               "attention bias (fused)"))
    assert not torch.allclose(padded[:, 10:], fused[:, 10:])


def test_a_step_starts_from_cleared_gradients():
    """Each timed step computes its gradients afresh, not added to the last step's (which would time an add and
    hold a second buffer)."""
    tensors = cpu_bench.inputs("ssd reference", 64)
    cpu_bench.step("ssd reference", tensors)
    once = [t.grad.clone() for t in tensors]
    cpu_bench.step("ssd reference", tensors)
    for before, t in zip(once, tensors):
        torch.testing.assert_close(t.grad, before)


def test_the_peak_is_read_in_a_fresh_process_that_prints_it():
    """``peak_mib`` starts ``--peak-of CASE T`` in a child and reads its one JSON line: the written-out mask's
    forward+backward at T = 1024 holds several ``H·T²`` score matrices (32 MiB each) above its inputs."""
    assert cpu_bench.peak_mib("attention bias (written-out mask)", 1024) > 32


def test_the_peak_command_prints_the_growth_as_json(monkeypatch, capsys):
    monkeypatch.setattr(cpu_bench, "peak_growth_mib", lambda fn: fn() or 12.5)
    cpu_bench.main(["--peak-of", "loss, head and cross-entropy in chunks", "64"])
    assert capsys.readouterr().out == '{"mib": 12.5}\n'
