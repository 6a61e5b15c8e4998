"""``recipes.benchmarks.finite``: both calls of a row compute the same thing (finite inputs: the passes change no
bit of the outputs' gradients), and the table has a row per op and length."""

import pytest
import torch

from recipes.benchmarks import finite


@pytest.mark.parametrize("op", list(finite.CASES))
def test_with_and_without_the_passes_the_gradients_are_the_same(op):
    grads = []
    for check_finite in (True, False):
        call, leaves = finite.CASES[op](19, "cpu", torch.float32, check_finite)
        call()
        grads.append([t.grad.clone() for t in leaves])
        call()  # a second call starts from cleared gradients, not accumulated ones
        assert all(torch.equal(t.grad, g) for t, g in zip(leaves, grads[-1]))
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_the_table_has_a_row_per_op_and_length(capsys):
    finite.main(["--device", "cpu", "--lengths", "9", "17", "--rounds", "2"])
    passes, split = capsys.readouterr().out.split("The SSD's x alone")
    rows = [line for line in passes.splitlines() if line.startswith("| ") and "ms" not in line]
    assert [row.split(" | ")[:2] for row in rows] == [["| ssd", "9"], ["| ssd", "17"], ["| attention", "9"],
                                                      ["| attention", "17"]]
    assert all(len(row.split("|")) == 8 for row in rows)
    forms = [line.split(" | ")[:2] for line in split.splitlines() if line.startswith("| ") and "ms" not in line]
    assert [length for _, length in forms] == ["9"] * 3 + ["17"] * 3 and forms[0][0] == "| split_finite: comparison, " \
        "word-wise any"


def test_each_row_test_is_checked_on_planted_non_finite_entries(monkeypatch):
    """Every form agrees with ``split_finite`` where a NaN, an inf and a -inf are planted (each in a row of its own:
    a form blind to one of them fails), and a form that misses one is named rather than timed."""
    x = torch.randn(2, 5, 3, 4)
    x[0, 1, 2, 3], x[1, 4, 0, 0], x[1, 0, 1, 2] = float("nan"), float("inf"), -float("inf")
    want = finite.split_finite(x, 1)
    for name, form in finite.row_test_forms(x).items():
        got = form()
        assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0]), name
        assert int(got[1].sum()) == 3, name
    forms = finite.row_test_forms
    blind = lambda x: {**forms(x), "max only": lambda: (x.nan_to_num(0.0, 0.0, 0.0), ~torch.isfinite(x.amax(-1)))}  # noqa: E731
    monkeypatch.setattr(finite, "row_test_forms", blind)
    with pytest.raises(AssertionError, match="'max only' disagrees"):
        finite.row_tests(9, "cpu", torch.float32, rounds=1)


def test_the_passes_cost_is_the_median_of_each_rounds_difference(monkeypatch, capsys):
    """With, without, and the median of the per-round differences (not the difference of the medians): rounds
    with the machine's state shared by both calls."""
    times = {True: [0.010, 0.030, 0.012], False: [0.009, 0.020, 0.002]}  # differences 1, 10, 10 ms; medians 12, 9
    monkeypatch.setattr(finite, "interleaved_seconds", lambda cases, rounds: times if set(cases) == {True, False}
                        else {name: [0.001] for name in cases})
    finite.main(["--device", "cpu", "--lengths", "9", "--ops", "ssd", "--rounds", "3"])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| ssd"))
    assert row == "| ssd | 9 | 12.00 | 9.00 | 10.00 | 83% |"
