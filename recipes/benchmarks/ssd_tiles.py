"""Tile search for the SSD's Triton kernels on this GPU: which rows per tile, warps and pipeline stages they should
take, and the log-decay gradient's pair blocks — the evidence for ``kernels.ssd.triton.launch_config``.

    python -m recipes.benchmarks.ssd_tiles                          # B 4, T 4096, H 32, P 64, N 128, chunk 256, bf16
    python -m recipes.benchmarks.ssd_tiles --chunk 64 --length 8192
    python -m recipes.benchmarks.ssd_tiles --length 16384 --sections scores   # one section: shared_scores on and off

Every kernel shares ``rows``, ``warps`` and ``stages``; the backward's log-decay pair kernel adds ``pair_rows ×
pair_cols``; ``shared_scores`` (on in bf16/fp16 on Hopper at states up to 64 × 128) has the in-chunk ``C·Bᵀ`` made
once per group of heads and read by the ``y``, ``d(dt·x)`` and log-decay kernels, and ``dC``, ``dB`` made per group, as
mamba_ssm does, in kernels with tiles of their own (``group_rows``, ``group_warps``, ``group_block``: the last
section); ``narrow_states`` (on where ``shared_scores`` is) keeps the chunks' states in the inputs' dtype. Each candidate is timed forward and forward+backward (medians) and its output and gradients are
checked against the current choice's (a wrong answer is named, not timed); a candidate that cannot launch here is
named too. mamba_ssm's ``mamba_chunk_scan_combined`` is timed beside them when it can be imported (docs/performance.md
says how to carry its Triton files). Needs CUDA; the chosen tiles go into ``launch_config`` by hand, with the table
in docs/kernels.md, after ``python -m recipes.benchmarks.compile_check --only ssd`` says whether they spill.
"""

import argparse
import importlib.util

import torch
import torch.nn.functional as F

from kernels.ssd import ssd_scan
from kernels.ssd import triton as ssd_triton
from recipes.benchmarks.tile_search import add_device_option, device_of, trial
from recipes.benchmarks.timing import median_ms

# (rows, warps, stages) for every kernel, the larger row tiles first (Hopper's warp-group products need 64 rows), so a
# search cut short keeps them; then (pair_rows, pair_cols) for the log-decay gradient's pair kernel
SHARED = [(64, 4, 3), (64, 4, 2), (64, 8, 3), (128, 4, 2), (128, 8, 2), (64, 8, 2), (32, 4, 3), (32, 8, 3), (32, 8, 4),
          (16, 4, 3)]
LOG_DECAY = [(64, 16), (32, 32), (64, 32), (128, 16), (32, 16), (128, 32)]
# (group_rows, group_warps, group_block) for the per-group backward kernels that shared_scores runs: the dC/dB kernel's
# rows and warps, the pairs' gradient blocks (which take the same warps)
GROUP = [(32, 8, 64), (16, 8, 64), (32, 4, 64), (64, 8, 64), (32, 8, 32), (16, 4, 32)]


def results(inputs: list[torch.Tensor], chunk: int) -> list[torch.Tensor]:
    """The kernel's output and the gradients of x, dt, A, B and C for a fixed random ``dy``."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    y = ssd_scan(*leaves, chunk_size=chunk, backend="triton")
    dy = torch.randn(y.shape, generator=torch.Generator(y.device).manual_seed(1), device=y.device, dtype=y.dtype)
    return [y.detach().float(), *(g.float() for g in torch.autograd.grad(y, leaves, dy))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--state", type=int, default=128)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sections", nargs="+", choices=["rows", "pairs", "scores", "states", "group"],
                        default=["rows", "pairs", "scores", "states", "group"],
                        help="which candidates to time: rows/warps/stages, the pair kernel's blocks, shared_scores, "
                             "narrow_states, the per-group kernels' tiles (with shared_scores on)")
    add_device_option(parser)
    args = parser.parse_args(argv)
    cuda, dtype, device = device_of(args)
    choose = ssd_triton.launch_config
    B, T, H, P, N, L = args.batch, args.length, args.heads, args.head_dim, args.state, args.chunk
    torch.manual_seed(0)
    x = torch.randn(B, T, H, P, device=args.device, dtype=dtype)
    dt = F.softplus(torch.randn(B, T, H, device=args.device) - 3).to(dtype)
    A = -torch.exp(torch.rand(H, device=args.device))
    Bm, Cm = (torch.randn(B, T, 1, N, device=args.device, dtype=dtype) for _ in range(2))
    inputs = [t.requires_grad_() for t in (x, dt, A, Bm, Cm)]

    def forward(fn):
        with torch.no_grad():
            return fn()

    def both(fn):
        for t in inputs:
            t.grad = None
        fn().float().sum().backward()

    ours = lambda: ssd_scan(*inputs, chunk_size=L, backend="triton")  # noqa: E731
    print(f"# {device}, torch {torch.__version__}; B {B}, T {T}, H {H}, P {P}, N {N}, chunk {L}, {dtype}; "
          f"median of {args.repeats}")
    if cuda and importlib.util.find_spec("mamba_ssm") is not None:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

        theirs = lambda: mamba_chunk_scan_combined(*inputs, chunk_size=L)  # noqa: E731
        print(f"mamba_chunk_scan_combined: {median_ms(lambda: forward(theirs), args.repeats):.2f} ms forward, "
              f"{median_ms(lambda: both(theirs), args.repeats):.2f} fwd+bwd")
    else:
        print("mamba_ssm not importable: its row is skipped")
    major, minor = torch.cuda.get_device_capability() if cuda else (9, 0)
    current = choose(P, N, cuda, dtype, 10 * major + minor)
    want = results(inputs, L)
    base = (median_ms(lambda: forward(ours), args.repeats), median_ms(lambda: both(ours), args.repeats))
    print(f"current: rows {current['rows']}, {current['warps']} warps, {current['stages']} stages, pairs "
          f"{current['pair_rows']}×{current['pair_cols']}: {base[0]:.2f} ms forward, {base[1]:.2f} fwd+bwd")
    # what mamba_ssm's row compares with, and what each candidate is timed as: the kernels alone, without ssd_scan's
    # passes that take out non-finite inputs and put their reach back (the SSD layer keeps them; they do not depend
    # on the tiles, and would only add their noise to every row)
    bare = lambda: ssd_scan(*inputs, chunk_size=L, backend="triton", check_finite=False)  # noqa: E731
    base = (median_ms(lambda: forward(bare), args.repeats), median_ms(lambda: both(bare), args.repeats))
    print(f"current, check_finite=False: {base[0]:.2f} ms forward, {base[1]:.2f} fwd+bwd")
    sections = {"rows": ("rows, warps, stages (every kernel)", ("rows", "warps", "stages"), SHARED),
                "pairs": ("pair_rows, pair_cols (the log-decay gradient's pair kernel)", ("pair_rows", "pair_cols"),
                          LOG_DECAY),
                "scores": ("shared_scores (C·Bᵀ made once per group, dC and dB per group)", ("shared_scores",),
                           [(not current["shared_scores"],)]),
                "states": ("narrow_states (the chunks' states in the inputs' dtype)", ("narrow_states",),
                           [(not current["narrow_states"],)]),
                "group": ("group_rows, group_warps, group_block (the per-group dC/dB kernels, shared_scores on)",
                          ("group_rows", "group_warps", "group_block", "shared_scores"),
                          [(*tiles, True) for tiles in GROUP])}
    for title, keys, candidates in (sections[name] for name in args.sections):
        columns = [*keys, "fwd ms", "fwd+bwd ms", "× current fwd+bwd", "max error against current"]
        print(f"\n### {title}, check_finite=False\n\n| {' | '.join(columns)} |\n|{'---|' * len(columns)}")
        for values in candidates:
            cells = " | ".join(map(str, values))
            outcome = trial(ssd_triton, {**current, **dict(zip(keys, values))}, lambda: results(inputs, L), want,
                            [lambda: forward(bare), lambda: both(bare)], args.repeats)
            if isinstance(outcome, str):
                print(f"| {cells} | {outcome} | | | |", flush=True)
                continue
            error, (fwd, total) = outcome
            print(f"| {cells} | {fwd:.2f} | {total:.2f} | {base[1] / total:.2f} | {error:.1e} |", flush=True)

if __name__ == "__main__":
    main()
