"""Tile search for the SSD's Triton kernels on this GPU: which rows per tile, warps and pipeline stages they should
take, and the log-decay gradient's pair blocks — the evidence for ``zoo_kernels.ssd.triton.launch_config``.

    python -m recipes.benchmarks.ssd_tiles                          # B 4, T 4096, H 32, P 64, N 128, chunk 256, bf16
    python -m recipes.benchmarks.ssd_tiles --chunk 64 --length 8192
    python -m recipes.benchmarks.ssd_tiles --length 16384 --sections scores   # one section: shared_scores on and off
    python -m recipes.benchmarks.ssd_tiles --length 16384 --sections y dx pair_tiles order   # the kernels' own tiles
    python -m recipes.benchmarks.ssd_tiles --length 16384 --sections order group_order keep  # the grid orders, states kept

Every kernel shares ``rows``, ``warps`` and ``stages``; the backward's log-decay pair kernel adds ``pair_rows ×
pair_cols``; ``shared_scores`` (on in bf16/fp16 on Hopper at states up to 64 × 128) has the in-chunk ``C·Bᵀ`` made
once per group of heads and read by the ``y``, ``d(dt·x)`` and log-decay kernels, and ``dC``, ``dB`` made per group, as
mamba_ssm does, in kernels with tiles of their own (``group_rows``, ``group_warps``, ``group_block``: the last
section); ``narrow_states`` (on where ``shared_scores`` is) keeps the chunks' states in the inputs' dtype; ``y`` and
``dx`` give the forward's output kernel and the backward's ``d(dt·x)`` kernel tiles of their own (a column block apart
from the rows, and for ``y`` the head dim split over programs), ``pair_tiles`` the log-decay pair kernel warps and
stages of its own, ``order`` launches the per-head kernels' programs in another order (a chunk's heads innermost,
or each head's blocks of rows), ``group_order`` the per-group kernels' (each chunk's blocks innermost), and ``keep``
hands the forward's entering states to the backward (``keep_states``: more memory, two kernels fewer). Each candidate is timed
forward and forward+backward (medians) and its output and gradients are checked against the current choice's (a
wrong answer is named, not timed); a candidate that cannot launch here is named too. Those sections and ``pairs`` also give the GPU time of the kernels they change, from torch's profiler
(steadier than the whole op's wall time, whose spread between two timings of one configuration has reached 10%).
Last, every section's winner (by those kernels' GPU time where the profiler gives it, else by fwd+bwd wall time; only
a candidate faster than the current tiles wins; in ``order``, each scan kernel's fastest order, from the per-kernel
times, where that beats every single order) is applied at once, checked and timed, with the ``launch_config``
entries it takes printed.
mamba_ssm's ``mamba_chunk_scan_combined`` is timed beside them when it can be imported (docs/performance.md says how
to carry its Triton files). Needs CUDA; the chosen tiles go into ``launch_config`` by hand, with the table in
docs/kernels.md, after ``python -m recipes.benchmarks.compile_check --only ssd`` says whether they spill.
"""

import argparse
import importlib.util
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from zoo_kernels.ssd import ssd_scan
from zoo_kernels.ssd import triton as ssd_triton
from recipes.argtypes import positive_int
from recipes.benchmarks.mamba_ssm_triton import MAMBA_MISSING
from recipes.benchmarks.tile_search import add_device_option, device_of, kernel_us, trial
from recipes.benchmarks.timing import median_ms

# (rows, warps, stages) for every kernel, the larger row tiles first (Hopper's warp-group products need 64 rows), so a
# search cut short keeps them; then (pair_rows, pair_cols) for the log-decay gradient's pair kernel
SHARED = [(64, 4, 3), (64, 4, 2), (64, 8, 3), (128, 4, 2), (128, 8, 2), (64, 8, 2), (32, 4, 3), (32, 8, 3), (32, 8, 4),
          (16, 4, 3)]
LOG_DECAY = [(64, 16), (32, 32), (64, 32), (128, 16), (32, 16), (128, 32)]
# (group_rows, group_warps, group_block, group_n, group_pair_warps) for the per-group backward kernels that
# shared_scores runs: the dC/dB kernel's rows, warps and the state's columns a program makes (N split over programs),
# the pairs' gradient blocks and that kernel's warps. The third search at 16K (H200, 2026-12-04, the day's second
# lease) took 64 rows on 4 warps over all of N's 128 columns (1,419 -> 1,042 µs; the N split of the search before,
# which had timed 64 rows only split, is the last entry); these are its neighbours. Compiled for sm_90 (bf16, P 64,
# N 128; compile_check with each patched in, the pairs' gradients then fp32), aligned: no spill on 8 warps (201-234
# registers) nor at 32 rows, 216 bytes at 128 rows on 8 warps, 112 in the dB kernel as launch_config has it (none
# with them in bf16, as launched since); 32-row pair blocks take _group_pair_grads to 87 registers, 8 warps to 146
GROUP = [(64, 8, 64, 128, 4), (64, 4, 32, 128, 4), (64, 4, 64, 128, 8), (128, 8, 64, 128, 4), (32, 4, 32, 128, 4),
         (64, 4, 64, 64, 4)]
# the y and d(dt·x) kernels' tiles of their own (launch_config's "y" and "dx" entries): (rows, cols: the column block of
# the in-chunk loop, warps, stages[, p_block: the head dim's columns a y program makes, None: all]). The first search
# (T 16K, H200, 2026-11-27: docs/kernels.md) took y 64 × 32 on 4 warps, 3 stages, and dx 32 × 64 on 4 warps, 2 stages,
# out of wider lists (splitting the head dim lost 2-3× there); these are their neighbours. None of the first lists
# spilled on sm_90 in bf16 at P 64, N 128 with shared scores (compile_check); mamba_ssm's forward steps 32 columns.
Y = [(64, 32, 4, 2, None), (64, 16, 4, 3, None), (64, 16, 4, 4, None), (64, 64, 4, 3, None), (128, 32, 4, 3, None),
     (32, 32, 4, 3, None), (64, 32, 2, 3, None), (32, 64, 4, 2, None)]
DX = [(32, 64, 4, 3), (32, 32, 4, 2), (32, 64, 2, 2), (32, 128, 4, 2), (16, 64, 4, 2), (32, 64, 8, 2), (32, 32, 4, 3),
      (64, 64, 4, 2)]
# the log-decay pair kernel's blocks with warps and stages of their own (launch_config's "pairs" entry): (rows, cols,
# warps, stages), around the first search's 64 × 16 on 2 warps (its stages change nothing in the compiled code: its
# loop is not pipelined)
PAIRS = [(64, 16, 2, 2), (32, 16, 2, 3), (128, 16, 2, 3), (32, 32, 2, 3), (64, 16, 1, 3), (64, 32, 2, 3),
         (32, 16, 1, 3)]
# the kernels whose GPU time a section's rows also give (torch's profiler; kernel names as Triton launches them)
KERNELS = {"y": ("_chunk_scan",), "dx": ("_chunk_scan_reverse",), "pairs": ("_log_decay_pairs",),
           "pair_tiles": ("_log_decay_pairs",), "order": ("_chunk_scan", "_chunk_scan_reverse", "_log_decay_pairs"),
           "group_order": ("_group_scores", "_group_pair_grads", "_group_bc_grads"),
           "rows": ("_chunk_state", "_decayed_scan"), "group": ("_group_pair_grads", "_group_bc_grads"),
           "keep": ("_chunk_state", "_decayed_scan")}


def results(inputs: list[torch.Tensor], chunk: int) -> list[torch.Tensor]:
    """The kernel's output and the gradients of x, dt, A, B, C and D (``inputs`` in that order) for a fixed random
    ``dy``."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    y = ssd_scan(*leaves[:5], chunk_size=chunk, D=leaves[5], backend="triton")
    dy = torch.randn(y.shape, generator=torch.Generator(y.device).manual_seed(1), device=y.device, dtype=y.dtype)
    return [y.detach().float(), *(g.float() for g in torch.autograd.grad(y, leaves, dy))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.ssd_tiles",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=positive_int, default=4096)
    parser.add_argument("--batch", type=positive_int, default=4)
    parser.add_argument("--heads", type=positive_int, default=32)
    parser.add_argument("--head-dim", type=positive_int, default=64)
    parser.add_argument("--state", type=positive_int, default=128)
    parser.add_argument("--chunk", type=positive_int, default=256)
    parser.add_argument("--repeats", type=positive_int, default=5)
    sections = ["rows", "pairs", "scores", "states", "group", "y", "dx", "pair_tiles", "order", "group_order", "keep"]
    parser.add_argument("--sections", nargs="+", choices=sections, default=sections,
                        help="which candidates to time: rows/warps/stages, the pair kernel's blocks, shared_scores, "
                             "narrow_states, the per-group kernels' tiles (with shared_scores on), the y, d(dt·x) and "
                             "pair kernels' own tiles, the per-head and the per-group kernels' grid orders (order, "
                             "group_order), the forward's states kept for the backward (keep_states)")
    parser.add_argument("--write-winners", metavar="FILE",
                        help="write the winners' launch_config entries (where together they passed the check and beat "
                             "the current tiles) as JSON, for recipes.benchmarks.ops --ssd-config")
    parser.add_argument("--no-mamba", action="store_true",
                        help="leave mamba_ssm's row out even where it imports (its autotuning takes about 80 s)")
    add_device_option(parser)
    args = parser.parse_args(argv)
    cuda, dtype, device = device_of(args)
    warmup = 1 if cuda else 0  # a dry run under the interpreter: nothing compiled to warm, times that mean nothing
    choose = ssd_triton.launch_config
    B, T, H, P, N, L = args.batch, args.length, args.heads, args.head_dim, args.state, args.chunk
    torch.manual_seed(0)
    x = torch.randn(B, T, H, P, device=args.device, dtype=dtype)
    dt = F.softplus(torch.randn(B, T, H, device=args.device) - 3)  # fp32, as a model's (Δ's bias is an fp32 parameter)
    A = -torch.exp(torch.rand(H, device=args.device))
    Bm, Cm = (torch.randn(B, T, 1, N, device=args.device, dtype=dtype) for _ in range(2))
    D = torch.randn(H, device=args.device)  # the skip, as Mamba-2's layer passes it (fp32: a parameter)
    inputs = [t.requires_grad_() for t in (x, dt, A, Bm, Cm, D)]

    def forward(fn):
        with torch.no_grad():
            return fn()

    def both(fn):
        for t in inputs:
            t.grad = None
        fn().float().sum().backward()

    ours = lambda: ssd_scan(*inputs[:5], chunk_size=L, D=D, backend="triton")  # noqa: E731
    print(f"# {device}, torch {torch.__version__}; B {B}, T {T}, H {H}, P {P}, N {N}, chunk {L}, {dtype}; "
          f"median of {args.repeats}")
    if cuda and not args.no_mamba and importlib.util.find_spec("mamba_ssm") is not None:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

        theirs = lambda: mamba_chunk_scan_combined(*inputs[:5], chunk_size=L, D=D)  # noqa: E731
        mamba_ms = median_ms(lambda: both(theirs), args.repeats, warmup)
        print(f"mamba_chunk_scan_combined: {median_ms(lambda: forward(theirs), args.repeats, warmup):.2f} ms forward, "
              f"{mamba_ms:.2f} fwd+bwd")
    else:
        mamba_ms = None
        print("mamba_ssm's row left out (--no-mamba)" if args.no_mamba else MAMBA_MISSING)
    major, minor = torch.cuda.get_device_capability() if cuda else (9, 0)
    current = choose(P, N, cuda, dtype, 10 * major + minor)
    want = results(inputs, L)
    base = (median_ms(lambda: forward(ours), args.repeats, warmup), median_ms(lambda: both(ours), args.repeats, warmup))
    print(f"current: rows {current['rows']}, {current['warps']} warps, {current['stages']} stages, pairs "
          f"{current['pair_rows']}×{current['pair_cols']}: {base[0]:.2f} ms forward, {base[1]:.2f} fwd+bwd")
    # what mamba_ssm's row compares with, and what each candidate is timed as: the kernels alone, without ssd_scan's
    # passes that take out non-finite inputs and put their reach back (the SSD layer keeps them; they do not depend
    # on the tiles, and would only add their noise to every row)
    bare = lambda: ssd_scan(*inputs[:5], chunk_size=L, D=D, backend="triton", check_finite=False)  # noqa: E731
    base = (median_ms(lambda: forward(bare), args.repeats, warmup), median_ms(lambda: both(bare), args.repeats, warmup))
    print(f"current, check_finite=False: {base[0]:.2f} ms forward, {base[1]:.2f} fwd+bwd")
    own = lambda kernel, keys: lambda values: {kernel: dict(zip(keys, values))}  # noqa: E731  a kernel's own tiles
    sections = {"rows": ("rows, warps, stages (every kernel)", ("rows", "warps", "stages"), SHARED),
                "pairs": ("pair_rows, pair_cols (the log-decay gradient's pair kernel)", ("pair_rows", "pair_cols"),
                          LOG_DECAY),
                "scores": ("shared_scores (C·Bᵀ made once per group, dC and dB per group)", ("shared_scores",),
                           [(not current["shared_scores"],)]),
                "states": ("narrow_states (the chunks' states in the inputs' dtype)", ("narrow_states",),
                           [(not current["narrow_states"],)]),
                "group": ("group_rows, group_warps, group_block, group_n, group_pair_warps (the per-group dC/dB "
                          "kernels, shared_scores on)",
                          ("group_rows", "group_warps", "group_block", "group_n", "group_pair_warps", "shared_scores"),
                          [(*tiles, True) for tiles in GROUP]),
                "y": ("y rows, cols, warps, stages, p_block (the forward's output kernel, tiles of its own)",
                      ("rows", "cols", "warps", "stages", "p_block"), Y),
                "dx": ("dx rows, cols, warps, stages (the backward's d(dt·x) kernel, tiles of its own)",
                       ("rows", "cols", "warps", "stages"), DX),
                "pair_tiles": ("pairs rows, cols, warps, stages (the log-decay pair kernel, warps of its own)",
                               ("rows", "cols", "warps", "stages"), PAIRS),
                "order": ("order (what varies fastest across the per-head scan kernels' programs: chunks, heads, "
                          "or each head's blocks of rows)", ("order",),
                          [(order,) for order in ssd_triton.ORDERS if order != current["order"]]),
                "group_order": ("group_order (the per-group kernels' programs: chunks or each chunk's blocks "
                                "innermost; shared_scores on)", ("group_order", "shared_scores"),
                                [(order, True) for order in ("chunks", "blocks") if order != current["group_order"]]),
                "keep": ("keep_states (the forward's entering states kept for the backward, not made again)",
                         ("keep_states",), [(not current["keep_states"],)])}
    apply = {"y": own("y", sections["y"][1]), "dx": own("dx", sections["dx"][1]),
             "pair_tiles": own("pairs", sections["pair_tiles"][1])}
    winners = {}  # section: (its best candidate's score, the launch_config entries that candidate changes)

    def run(config: dict, gauges=()):  # one candidate: checked against the current tiles, then timed
        return trial(ssd_triton, config, lambda: results(inputs, L), want, [lambda: forward(bare), lambda: both(bare)],
                     args.repeats, gauges, warmup=warmup)

    for name in args.sections:
        title, keys, candidates = sections[name]
        to_config = apply.get(name, lambda values, keys=keys: dict(zip(keys, values)))
        names = KERNELS.get(name, ())
        gauge = lambda: kernel_us(lambda: both(bare), names, args.repeats)  # noqa: E731  {kernel: µs} or None
        gauges = (gauge,) if names else ()
        columns = [*keys, "fwd ms", "fwd+bwd ms", "× current fwd+bwd", "max error against current"]
        if names:  # the kernels' own GPU time, beside the current tiles' measured now (and each kernel's, where several)
            now_each = gauge()
            now = _total(now_each)
            print(f"\ncurrent {' + '.join(names)}: {'-' if now is None else f'{now:.0f}'} µs of GPU time per fwd+bwd"
                  + ("" if now_each is None or len(names) < 2 else f" ({_each(now_each)})"))
            columns[-1:-1] = [f"{' + '.join(names)} µs", "× current µs"] + (["each µs"] if len(names) > 1 else [])
        print(f"\n### {title}, check_finite=False\n\n| {' | '.join(columns)} |\n|{'---|' * len(columns)}")
        timed = []  # (values, each kernel's µs) of the candidates the profiler timed
        for values in candidates:
            cells = " | ".join(map(str, values))
            outcome = run(ssd_triton.with_entries(current, to_config(values)), gauges)
            if isinstance(outcome, str):
                print(f"| {cells} | {outcome} |{' |' * (len(columns) - len(keys) - 1)}", flush=True)
                continue
            error, (fwd, total, *spent) = outcome
            us = _total(spent[0]) if names else None
            if us is not None:
                timed.append((values, spent[0]))
            kernel_cells = ""
            if names:
                kernel_cells = ("- | - | " if us is None or now is None
                                else f"{us:.0f} | {now / us if us else float('nan'):.2f} | ")
                if len(names) > 1:
                    kernel_cells += ("- | " if us is None else f"{_each(spent[0])} | ")
            print(f"| {cells} | {fwd:.2f} | {total:.2f} | {base[1] / total:.2f} | {kernel_cells}{error:.1e} |",
                  flush=True)
            # by the kernels' GPU time where the profiler gives it (steadier than the whole op's wall time)
            score, against = (us, now) if us is not None and now is not None else (total, base[1])
            if score < against and score < winners.get(name, (against,))[0]:
                winners[name] = (score, to_config(values))
        if name == "order" and now is not None:  # the kernels apart: each its fastest order
            picked = per_kernel_orders(current, now_each, timed)
            if picked is not None and picked[0] < winners.get(name, (now,))[0]:
                winners[name] = picked
                print(f"\neach kernel its fastest order: {picked[1]} ({picked[0]:.0f} µs)")
    change = together(winners, current, run, base[1], mamba_ms)
    if args.write_winners:
        write_winners(args.write_winners, change)


ORDER_ENTRIES = {"_chunk_scan": "y", "_chunk_scan_reverse": "dx", "_log_decay_pairs": "pairs"}
"""The per-head scan kernels the ``order`` section times, and the ``launch_config`` entry each takes its tiles from.
(Without shared scores, ``_chunk_scan`` and ``_chunk_scan_reverse`` also make the per-head ``dC`` and ``dB``, under one
name with ``y`` and ``dx``; Hopper, where the orders are timed, shares them.)"""


def per_kernel_orders(current: dict, now_each: dict[str, float],
                      timed: list[tuple[tuple, dict[str, float]]]) -> tuple[float, dict] | None:
    """The ``order`` section's candidates taken apart by kernel: each per-head scan kernel's fastest order among the
    current one (``now_each``, each kernel's µs now) and those ``timed`` (``((order,), each kernel's µs)``), as
    (their µs summed, the launch_config entries that give each kernel its order, such as ``{"y": {"order": "blocks"}}``,
    laid over a configuration key by key by ``zoo_kernels.ssd.triton.with_entries``), or None where every kernel is
    fastest as it is — so the winners' "together" takes ``y`` on one order and ``dx`` on another where that is what
    the profiler says, rather than the one order best for the three summed."""
    change, total = {}, 0.0
    for kernel, entry in ORDER_ENTRIES.items():
        best_us, best = now_each[kernel], None
        for (order,), each in timed:
            if each[kernel] < best_us:
                best_us, best = each[kernel], order
        total += best_us
        if best is not None:
            change[entry] = {"order": best}
    return (total, change) if change else None


def _total(each: dict[str, float] | None) -> float | None:
    """The kernels' GPU time summed (None in a dry run)."""
    return None if each is None else sum(each.values())


def _each(each: dict[str, float]) -> str:
    """Each kernel's GPU time, in the section's order: ``874 / 1066 / 940``."""
    return " / ".join(f"{us:.0f}" for us in each.values())


def together(winners: dict[str, tuple[float, dict]], current: dict, run, current_ms: float,
             mamba_ms: float | None) -> dict | None:
    """Each section's winner (the candidate faster than the current tiles, fastest of its section) applied at once,
    checked and timed by ``run(config)`` (a ``trial``), with the ``launch_config`` entries to write in: the sections
    change different entries, or the later one's keys win, a kernel's entry merged key by key (``with_entries``: the
    ``order`` section's ``{"y": {"order": …}}`` keeps the ``y`` section's tiles). Returns those entries where they
    passed the check and beat the current tiles' forward and backward together, else None."""
    if not winners:
        print("\nno candidate was faster than the current tiles: nothing to put together")
        return None
    change = {}
    for _, entries in winners.values():
        change = ssd_triton.with_entries(change, entries)
    print(f"\n### every section's winner together, check_finite=False\n\nlaunch_config entries: {change}\n")
    outcome = run(ssd_triton.with_entries(current, change))
    if isinstance(outcome, str):
        print(f"together: {outcome}")
        return None
    error, (fwd, total) = outcome
    theirs = "" if mamba_ms is None else f", {mamba_ms / total:.2f}× mamba_chunk_scan_combined's fwd+bwd"
    print(f"together: {fwd:.2f} ms forward, {total:.2f} fwd+bwd ({current_ms / total:.2f}× current{theirs}); "
          f"max error against current {error:.1e}")
    return change if total < current_ms else None


def write_winners(path: str, change: dict | None) -> None:
    """The winners' ``launch_config`` entries as JSON at ``path``, for ``recipes.benchmarks.ops --ssd-config`` to time
    in the same lease; nothing where none won (a stale file from an earlier run is removed)."""
    target = Path(path)
    if change is None:
        target.unlink(missing_ok=True)
        print(f"\n--write-winners: no winners to write ({path} not written)")
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(change, indent=1) + "\n")
    print(f"\nthe winners' launch_config entries: {path} (recipes.benchmarks.ops --ssd-config times them)")


if __name__ == "__main__":
    main()
