"""Tile search for the bias-attention kernels on this GPU: which tiles, warps and pipeline stages each of the
three kernels (forward, dQ, dK/dV) should take — the evidence behind ``zoo_kernels.attention.triton.launch_config``.

    python -m recipes.benchmarks.attention_tiles                          # D 64 and 128, T 4096, B 4, H 16, bf16
    python -m recipes.benchmarks.attention_tiles --head-dims 128 --length 8192

For each head dim and kernel, every candidate ``(BLOCK_M, BLOCK_N, warps, stages)`` is timed with the other two
kernels at their current choice — the forward alone, the two backward kernels through forward+backward, so each
row's difference from the current one is that kernel's — and its output and gradients are checked against the
current choice's (a wrong answer is named, not timed). A candidate that cannot launch here (shared memory,
registers) is named too. Beside them, torch's SDPA without a bias and the reference's route (the bias through
SDPA's extra column), the baselines of docs/kernels.md. Needs CUDA; the chosen tiles are written into
``launch_config`` by hand, with the table that chose them in docs/kernels.md.
"""

import argparse

import torch
import torch.nn.functional as F

from zoo_kernels.attention import attention
from zoo_kernels.attention import triton as attention_triton
from recipes.argtypes import positive_int
from recipes.benchmarks.tile_search import add_device_option, device_of, trial
from recipes.benchmarks.timing import median_ms

# (BLOCK_M, BLOCK_N, num_warps, num_stages); BLOCK_M is the query rows, BLOCK_N the key rows of each kernel's tile
# (the dK/dV kernel keeps BLOCK_N keys and steps through BLOCK_M queries).
CANDIDATES = {
    "forward": [(64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3), (128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 3),
                (128, 32, 4, 3), (128, 64, 8, 2), (64, 32, 4, 3), (128, 128, 8, 2), (64, 64, 8, 2)],
    "backward_q": [(64, 64, 4, 3), (128, 64, 8, 3), (128, 32, 8, 3), (64, 32, 4, 3), (128, 64, 4, 3), (64, 128, 8, 3),
                   (128, 128, 8, 2), (64, 64, 8, 2)],
    "backward_kv": [(32, 64, 4, 3), (32, 128, 8, 3), (64, 64, 8, 3), (64, 128, 8, 3), (16, 64, 4, 3), (32, 128, 4, 3),
                    (64, 64, 4, 2), (16, 128, 8, 3), (32, 64, 8, 2)],
}


def with_tiles(current: dict, part: str, tiles: tuple[int, int, int, int]) -> dict:
    """``current`` (launch_config's answer) with kernel ``part`` at ``tiles``."""
    block_m, block_n, warps, stages = tiles
    return {**current, part: {**current[part], "BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps,
                              "num_stages": stages}}


def results(q, k, v, bias) -> list[torch.Tensor]:
    """The kernel's output and the gradients of q, k, v and the bias for a fixed random ``dO``."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v, bias)]
    out = attention(*leaves[:3], bias=leaves[3], backend="triton")
    dout = torch.randn(out.shape, generator=torch.Generator(out.device).manual_seed(1), device=out.device, dtype=out.dtype)
    return [out.detach().float(), *(g.float() for g in torch.autograd.grad(out, leaves, dout))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.attention_tiles",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", type=positive_int, nargs="+", default=[64, 128])
    parser.add_argument("--length", type=positive_int, default=4096)
    parser.add_argument("--batch", type=positive_int, default=4)
    parser.add_argument("--heads", type=positive_int, default=16)
    parser.add_argument("--repeats", type=positive_int, default=5)
    add_device_option(parser)
    args = parser.parse_args(argv)
    cuda, dtype, device = device_of(args)
    warmup = 1 if cuda else 0  # a dry run under the interpreter: nothing compiled to warm, times that mean nothing
    choose = attention_triton.launch_config
    B, T, H = args.batch, args.length, args.heads
    print(f"# {device}, torch {torch.__version__}; B {B}, T {T}, H {H}, causal, a per-key bias, {dtype}; "
          f"median of {args.repeats}")
    for D in args.head_dims:
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, T, H, D, device=args.device, dtype=dtype, requires_grad=True) for _ in range(3))
        bias = torch.randn(B, H, T, device=args.device, dtype=dtype, requires_grad=True)
        major, minor = torch.cuda.get_device_capability() if cuda else (9, 0)
        current = choose(D, cuda, dtype, "ieee", 10 * major + minor)
        flops = 4 * B * H * T * T * D / 2  # causal: half the scores

        def forward(backend="triton"):
            with torch.no_grad():
                return attention(q, k, v, bias=bias, backend=backend)

        def both(backend="triton"):
            for t in (q, k, v, bias):
                t.grad = None
            attention(q, k, v, bias=bias, backend=backend).float().sum().backward()

        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        sdpa_fwd = median_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True), args.repeats, warmup)
        sdpa_both = median_ms(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).float().sum().backward(),
                              args.repeats, warmup)
        print(f"\n## D = {D}: SDPA without a bias {sdpa_fwd:.2f} ms forward, {sdpa_both:.2f} fwd+bwd; the reference's "
              f"SDPA route {median_ms(lambda: forward('reference'), args.repeats, warmup):.2f} / "
              f"{median_ms(lambda: both('reference'), args.repeats, warmup):.2f}")
        want = results(q, k, v, bias)
        base = {"forward": median_ms(forward, args.repeats, warmup), "backward": median_ms(both, args.repeats, warmup)}
        for part, candidates in CANDIDATES.items():
            timed = "forward" if part == "forward" else "backward"
            now = current[part]
            print(f"\n### {part} (current: {now['BLOCK_M']}×{now['BLOCK_N']}, {now['num_warps']} warps, "
                  f"{now['num_stages']} stages: {base[timed]:.2f} ms {'forward' if part == 'forward' else 'fwd+bwd'})\n")
            print(f"| BLOCK_M | BLOCK_N | warps | stages | {'fwd' if part == 'forward' else 'fwd+bwd'} ms | "
                  f"× current | TFLOP/s | max error against current |\n|---|---|---|---|---|---|---|---|")
            for tiles in candidates:
                cells = " | ".join(map(str, tiles))
                outcome = trial(attention_triton, with_tiles(current, part, tiles), lambda: results(q, k, v, bias), want,
                                [forward if part == "forward" else both], args.repeats, warmup=warmup)
                if isinstance(outcome, str):
                    print(f"| {cells} | {outcome} | | | |", flush=True)
                    continue
                error, (ms,) = outcome
                tflops = flops * (1 if part == "forward" else 3.5) / (ms * 1e-3) / 1e12
                print(f"| {cells} | {ms:.2f} | {base[timed] / ms:.2f} | {tflops:.0f} | {error:.1e} |", flush=True)


if __name__ == "__main__":
    main()
