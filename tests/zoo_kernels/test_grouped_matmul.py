import pytest
import torch

from zoo_kernels.grouped_matmul import fused_available, grouped_matmul, grouped_matmul_reference


def per_row_oracle(x, weight, sizes):
    """Row by row, each with its group's matrix, in float64: no grouping logic shared with the code."""
    group = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))  # [R]
    return torch.einsum("rk,rkn->rn", x.double(), weight.double()[group])


# (sizes per group, K, N): empty groups first, last and in the middle; widths off the 16-byte grid.
CASES = [([3, 0, 5, 2], 8, 12), ([0, 7, 0], 5, 3), ([4, 4, 4, 4, 4], 16, 1), ([1], 3, 7), ([0, 0, 9, 0], 12, 20)]


@pytest.mark.parametrize("sizes, K, N", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_grouped_matmul_matches_rows_times_their_group_matrix_outputs_and_gradients(sizes, K, N, dtype):
    assert fused_available(torch.zeros(1, dtype=dtype))  # this torch has F.grouped_mm on CPU
    torch.manual_seed(0)
    ends = torch.tensor(sizes).cumsum(0).to(torch.int32)
    x = torch.randn(sum(sizes), K, dtype=dtype, requires_grad=True)
    weight = torch.randn(len(sizes), K, N, dtype=dtype, requires_grad=True)
    grad = torch.randn(sum(sizes), N, dtype=torch.float64)
    y = grouped_matmul(x, weight, ends)
    assert y.dtype == dtype and y.shape == (sum(sizes), N)
    gx, gw = torch.autograd.grad(y, (x, weight), grad.to(dtype))

    x64, w64 = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    want = per_row_oracle(x64, w64, sizes)
    want_gx, want_gw = torch.autograd.grad(want, (x64, w64), grad)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.1, rtol=2e-2)
    torch.testing.assert_close(y.double(), want, **tol)
    torch.testing.assert_close(gx.double(), want_gx, **tol)
    torch.testing.assert_close(gw.double(), want_gw, **tol)  # an empty group's matrix gets a zero gradient


def test_backward_accepts_a_broadcast_incoming_gradient():
    # y.sum()'s gradient is an expanded (stride-0) tensor, which torch's own grouped_mm backward rejects.
    ends = torch.tensor([2, 2, 5], dtype=torch.int32)
    x, weight = torch.randn(5, 4, requires_grad=True), torch.randn(3, 4, 8, requires_grad=True)
    grouped_matmul(x, weight, ends).sum().backward()
    want_x = torch.cat([weight[0].sum(1).expand(2, 4), weight[2].sum(1).expand(3, 4)]).detach()
    torch.testing.assert_close(x.grad, want_x)
    torch.testing.assert_close(weight.grad[1], torch.zeros(4, 8))


def test_reference_loop_and_fused_op_agree_and_fp64_takes_the_loop():
    torch.manual_seed(1)
    sizes = [2, 0, 3]
    ends = torch.tensor(sizes).cumsum(0)
    x, weight = torch.randn(5, 6, dtype=torch.float64), torch.randn(3, 6, 4, dtype=torch.float64)
    assert not fused_available(x)
    torch.testing.assert_close(grouped_matmul(x, weight, ends), per_row_oracle(x, weight, sizes))
    torch.testing.assert_close(grouped_matmul_reference(x.float(), weight.float(), ends),
                               grouped_matmul(x.float(), weight.float(), ends))


def test_autocast_runs_both_operands_in_autocast_dtype():
    ends = torch.tensor([3, 4], dtype=torch.int32)
    x, weight = torch.randn(4, 8), torch.randn(2, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = grouped_matmul(x, weight, ends)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), per_row_oracle(x, weight, [3, 1]).float(), atol=0.1, rtol=2e-2)


def test_mismatched_shapes_are_named():
    with pytest.raises(ValueError, match=r"need x \[R, K\], weight \[E, K, N\], ends \[E\]"):
        grouped_matmul(torch.randn(4, 8), torch.randn(2, 6, 8), torch.tensor([2, 4]))
    # One operand wrong at a time (the other two agreeing with each other), so each check is needed.
    for x, weight, ends in ((torch.randn(4, 8, 2), torch.randn(2, 8, 3), torch.tensor([2, 4])),
                            (torch.randn(4, 8), torch.randn(8, 3), torch.tensor([2, 4])),
                            (torch.randn(4, 8), torch.randn(2, 8, 3), torch.tensor([4]))):
        with pytest.raises(ValueError, match=r"need x \[R, K\], weight \[E, K, N\], ends \[E\]"):
            grouped_matmul(x, weight, ends)


def test_the_custom_ops_shape_functions_and_autograd_pass_torchs_opcheck():
    """Their fake (shape) functions give what the ops give, so torch.compile traces a mixture of experts right."""
    ends = torch.tensor([2, 2, 5], dtype=torch.int32)
    x, weight = torch.randn(5, 8, requires_grad=True), torch.randn(3, 8, 16, requires_grad=True)
    for op, args in ((torch.ops.hybrid_zoo.grouped_mm.default, (x, weight, ends)),
                     (torch.ops.hybrid_zoo.grouped_mm_weight_grad.default, (x.detach(), torch.randn(5, 16), ends))):
        assert set(torch.library.opcheck(op, args).values()) == {"SUCCESS"}


def test_only_cpu_and_bf16_cuda_tensors_take_the_fused_op():
    assert [fused_available(torch.zeros(1, dtype=d)) for d in (torch.float32, torch.bfloat16, torch.float16,
                                                              torch.float64)] == [True, True, True, False]
    for dtype in (torch.bfloat16, torch.float32):  # neither CPU nor CUDA: the loop, without asking CUDA anything
        assert fused_available(torch.zeros(1, dtype=dtype, device="meta")) is False


def test_on_cuda_only_bf16_from_ampere_on_takes_the_fused_op(monkeypatch):
    from types import SimpleNamespace

    gpu = lambda dtype: SimpleNamespace(device=torch.device("cuda", 0), is_cuda=True, dtype=dtype)  # noqa: E731
    for capability, dtype, fused in (((8, 0), torch.bfloat16, True), ((8, 0), torch.float32, False),
                                     ((8, 0), torch.float16, False), ((9, 0), torch.bfloat16, True),
                                     ((7, 5), torch.bfloat16, False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, c=capability: c)
        assert fused_available(gpu(dtype)) is fused, (capability, dtype)
