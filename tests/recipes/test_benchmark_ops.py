"""``recipes.benchmarks.ops --profile``: the kernel tables name the ops a row spends its time in."""

import torch

from recipes.benchmarks import ops


def test_the_profile_tables_name_the_forward_and_backward_kernels():
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64)
    lines = list(ops.profile_tables(lambda: torch.tanh(x @ w), [w], rows=5))
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
