"""What the non-finite bookkeeping costs: ``ssd_scan`` and ``attention`` forward+backward with their finite passes
(the default, ``check_finite=True``: non-finite inputs taken out, their reach put back as NaN; zoo_kernels/_finite.py)
against the same call without them, in interleaved rounds so that a machine slowing down mid-run slows both alike.

    python -m recipes.benchmarks.finite                       # CPU: the plain-torch paths at training sizes
    python -m recipes.benchmarks.finite --lengths 4096 16384  # CUDA: bf16, the Triton kernels at ops' shapes

Prints one markdown row per op and length: median ms with and without the passes, their difference and its share
of the whole. The inputs are finite, as in training: the passes find nothing and cost what they cost every step.
Then the split of the SSD's ``x`` alone (its entries taken out, and which rows held one) in three exact forms, each
checked against ``split_finite`` on an input with a NaN, an inf and a -inf: ``split_finite``'s comparison and
word-wise ``any``, ``torch.aminmax`` over each row, and a row sum accumulated in fp64 — slower on a CPU
(docs/performance.md), untimed on a GPU.
"""

import argparse
import statistics

import torch
import torch.nn.functional as F

from zoo_kernels._finite import split_finite
from zoo_kernels.attention import attention
from zoo_kernels.ssd import ssd_scan
from recipes.argtypes import device, positive_int
from recipes.benchmarks.timing import interleaved_seconds


def _fwd_bwd(fn, leaves: list[torch.Tensor]):
    """``(call, leaves)``: ``call()`` runs one forward and backward with a dense cotangent, as a next layer sends
    (the backward of a ``sum`` is a stride-0 expansion, which a plain-torch backward's batched matmuls copy batch by
    batch)."""
    cotangent = []

    def call():
        for t in leaves:
            t.grad = None
        y = fn()
        if not cotangent:
            g = torch.Generator(y.device).manual_seed(1)  # the same for both calls of a row
            cotangent.append(torch.randn(y.shape, device=y.device, dtype=y.dtype, generator=g))
        y.backward(cotangent[0])

    return call, leaves


def ssd_case(T: int, device: str, dtype: torch.dtype, check_finite: bool, seed: int = 0):
    """``ssd_scan`` with ``D`` at ops' GPU shape (B 4, H 32, P 64, N 128, chunk 256) on CUDA; B 2, H 8, P 64, N 64,
    chunk 64 on a CPU (a small model's layer)."""
    cuda = device == "cuda"
    B, H, P, N, L = (4, 32, 64, 128, 256) if cuda else (2, 8, 64, 64, 64)
    g = torch.Generator(device).manual_seed(seed)
    x = torch.randn(B, T, H, P, device=device, dtype=dtype, generator=g, requires_grad=True)
    dt = F.softplus(torch.randn(B, T, H, device=device, generator=g) - 3).requires_grad_()  # fp32, as a model's
    A = -torch.exp(torch.rand(H, device=device, generator=g))
    Bm, Cm = (torch.randn(B, T, 1, N, device=device, dtype=dtype, generator=g, requires_grad=True) for _ in range(2))
    D = torch.randn(H, device=device, generator=g, requires_grad=True)  # the skip, as Mamba-2's layer passes it
    return _fwd_bwd(lambda: ssd_scan(x, dt, A, Bm, Cm, chunk_size=L, D=D, check_finite=check_finite), [x, dt, Bm, Cm, D])


def attention_case(T: int, device: str, dtype: torch.dtype, check_finite: bool, seed: int = 0):
    """``attention`` with a per-key bias (B 4, H 16, D 64 on CUDA; B 1, H 8, D 64 on a CPU), causal."""
    B, H, D = (4, 16, 64) if device == "cuda" else (1, 8, 64)
    g = torch.Generator(device).manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, device=device, dtype=dtype, generator=g, requires_grad=True) for _ in range(3))
    bias = torch.randn(B, H, T, device=device, generator=g, requires_grad=True)  # fp32, as a model's
    return _fwd_bwd(lambda: attention(q, k, v, bias=bias, check_finite=check_finite), [q, k, v, bias])


CASES = {"ssd": ssd_case, "attention": attention_case}


def row_test_forms(x: torch.Tensor) -> dict:
    """``(x with its non-finite entries set to 0, True for each row of the last dimension that held one)`` in three
    exact forms, as calls: NaN, inf and -inf each reach their row's minimum or maximum (``aminmax`` propagates NaN) and
    leave an fp64 sum non-finite (64 entries of at most 3.4e38 cannot overflow it)."""
    def aminmax():
        low, high = torch.aminmax(x, dim=-1)
        return x.nan_to_num(0.0, 0.0, 0.0), ~(torch.isfinite(low) & torch.isfinite(high))

    def row_sum():
        return x.nan_to_num(0.0, 0.0, 0.0), ~torch.isfinite(x.sum(-1, dtype=torch.float64))

    return {"split_finite: comparison, word-wise any": lambda: split_finite(x, 1), "aminmax over each row": aminmax,
            "row sum in fp64": row_sum}


def row_tests(T: int, device: str, dtype: torch.dtype, rounds: int) -> list[str]:
    """The table of :func:`row_test_forms` on the SSD's ``x`` at length ``T`` (``ssd_case``'s shape): each form's
    flags checked against ``split_finite``'s where a NaN, an inf and a -inf are planted, then the median ms of each
    on finite values in interleaved rounds, and its ratio to ``split_finite``'s."""
    B, H, P = (4, 32, 64) if device == "cuda" else (2, 8, 64)
    x = torch.randn(B, T, H, P, device=device, dtype=dtype, generator=torch.Generator(device).manual_seed(0))
    planted = x.clone()
    for (t, h, p), value in zip(((0, 0, 5), (T // 2, H - 1, 0), (T - 1, 1, P - 1)), (float("nan"), float("inf"),
                                                                                       -float("inf"))):
        planted[0, t, h, p] = value
    want = split_finite(planted, 1)
    for name, form in row_test_forms(planted).items():
        got = form()
        if not (torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])):
            raise AssertionError(f"the row test {name!r} disagrees with split_finite on planted non-finite entries")
    times = interleaved_seconds(row_test_forms(x), rounds)
    base = statistics.median(times["split_finite: comparison, word-wise any"])
    return [f"| {name} | {T} | {statistics.median(ts) * 1e3:.2f} | {base / statistics.median(ts):.2f}× |"
            for name, ts in times.items()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.finite", description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=device, default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--lengths", type=positive_int, nargs="+", action="extend",
                        help="default: 4096 16384 on a GPU, 2048 on a CPU")
    parser.add_argument("--ops", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--rounds", type=positive_int, default=20)
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    lengths = args.lengths or ([4096, 16384] if cuda else [2048])
    print(f"Finite passes, forward+backward, {args.device}, {dtype}, median of {args.rounds} interleaved rounds:\n")
    print("| op | T | with the passes ms | without ms | passes ms | share |\n|---|---|---|---|---|---|")
    for op in args.ops:
        for T in lengths:
            cases = {on: CASES[op](T, args.device, dtype, on)[0] for on in (True, False)}
            times = interleaved_seconds(cases, args.rounds)
            with_, without = (statistics.median(times[on]) * 1e3 for on in (True, False))
            # the median of the per-round differences: the two calls of a round share the machine's state
            passes = statistics.median(a - b for a, b in zip(times[True], times[False])) * 1e3
            print(f"| {op} | {T} | {with_:.2f} | {without:.2f} | {passes:.2f} | {passes / with_:.0%} |")
    print(f"\nThe SSD's x alone, split (entries taken out, rows that held one found), {dtype}:\n")
    print("| form | T | ms | × split_finite |\n|---|---|---|---|")
    for T in lengths:
        print("\n".join(row_tests(T, args.device, dtype, args.rounds)))


if __name__ == "__main__":
    main()
