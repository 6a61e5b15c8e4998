"""CPU benchmark: the chunked SSD against its recurrence and against causal attention of the same width.

    python -m recipes.benchmarks.ssd                      # d_model 512: 8 heads × 64, state 64, chunk 64
    python -m recipes.benchmarks.ssd --lengths 512 1024 --repeats 3

Prints one table: milliseconds (median of ``--repeats``), tokens per second, and the chunked SSD's
achieved GFLOP/s against this machine's fp32 matmul GFLOP/s, measured in the same run.
"""

import argparse
import torch

from components.flops import ssd_flops_per_token
from recipes.argtypes import bounded, positive_int
from recipes.benchmarks.timing import median_ms
from zoo_kernels.attention import attention
from zoo_kernels.ssd import ssd_recurrent, ssd_scan


def matmul_gflops(repeats: int, size: int = 2048) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    ms = median_ms(lambda: a @ b, repeats)
    return 2 * size**3 / (ms * 1e-3) / 1e9


def ssd_flops(batch: int, T: int, H: int, P: int, N: int, L: int) -> float:
    """Matmul FLOPs of one chunked forward of one group (``B`` and ``C`` shared by the heads, as
    ``ssd_inputs`` makes them): the count MFU uses, which is torch's ``FlopCounterMode``'s of the reference."""
    return batch * T * ssd_flops_per_token(T, L, H, 1, P, N)


def ssd_inputs(batch, T, H, P, N, grad):
    g = dict(requires_grad=grad)
    return dict(
        x=torch.randn(batch, T, H, P, **g),
        dt=torch.nn.functional.softplus(torch.randn(batch, T, H) - 3).requires_grad_(grad),
        A=(-torch.exp(torch.rand(H) * 2.7)).requires_grad_(grad),
        B=torch.randn(batch, T, 1, N, **g),
        C=torch.randn(batch, T, 1, N, **g),
    )


def timed(run, inputs, backward: bool, repeats: int) -> float:
    def step():
        out = run(**inputs)
        if backward:
            out.sum().backward()
    return median_ms(step, repeats)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.ssd",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--batch", type=positive_int, default=1)
    parser.add_argument("--heads", type=positive_int, default=8)
    parser.add_argument("--head-dim", type=positive_int, default=64)
    parser.add_argument("--d-state", type=positive_int, default=64)
    parser.add_argument("--chunk", type=positive_int, default=64)
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--recurrence-max-seconds", type=bounded(float, 0), default=20.0,
                        help="stop timing the recurrence once one run takes more than half this (the default lengths "
                             "double, and so does its time)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    b, H, P, N, L = args.batch, args.heads, args.head_dim, args.d_state, args.chunk
    peak = matmul_gflops(args.repeats)
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, fp32; batch {b}, d_model {H * P} "
          f"(SSD: {H} heads × {P}, state {N}, chunk {L}; attention: {H} heads × {P})")
    print(f"# fp32 matmul 2048³: {peak:.1f} GFLOP/s (the machine's reference rate)")
    print("| T | pass | SSD chunked ms | SSD tok/s | SSD GFLOP/s | % of matmul | recurrence ms | attention ms | attention / SSD |")
    print("|---|---|---|---|---|---|---|---|---|")
    recurrence_ok = {False: True, True: True}
    for T in args.lengths:
        for backward in (False, True):
            s_in = ssd_inputs(b, T, H, P, N, backward)
            ssd_ms = timed(lambda **kw: ssd_scan(**kw, chunk_size=L, backend="reference"), s_in, backward, args.repeats)
            flops = ssd_flops(b, T, H, P, N, L) * (3 if backward else 1)
            gflops = flops / (ssd_ms * 1e-3) / 1e9
            q = torch.randn(b, T, H, P, requires_grad=backward)
            k, v = torch.randn(b, T, H, P, requires_grad=backward), torch.randn(b, T, H, P, requires_grad=backward)
            attn_ms = timed(lambda **kw: attention(**kw, causal=True, backend="reference"),
                            dict(q=q, k=k, v=v), backward, args.repeats)
            rec = "skipped"
            if recurrence_ok[backward]:
                rec_ms = timed(lambda **kw: ssd_recurrent(**kw)[0], s_in, backward, 1)
                rec = f"{rec_ms:.0f}"
                recurrence_ok[backward] = rec_ms < args.recurrence_max_seconds * 1e3 / 2
            print(f"| {T} | {'fwd+bwd' if backward else 'fwd'} | {ssd_ms:.1f} | {b * T / ssd_ms * 1e3:,.0f} | "
                  f"{gflops:.1f} | {100 * gflops / peak:.0f}% | {rec} | {attn_ms:.1f} | {attn_ms / ssd_ms:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
