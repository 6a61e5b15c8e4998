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
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "ms" not in line]
    assert [row.split(" | ")[:2] for row in rows] == [["| ssd", "9"], ["| ssd", "17"], ["| attention", "9"],
                                                      ["| attention", "17"]]
    assert all(len(row.split("|")) == 8 for row in rows)
