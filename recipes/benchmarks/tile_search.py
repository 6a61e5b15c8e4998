"""What the two tile searches (attention_tiles.py, ssd_tiles.py) share: the device they run on, and one candidate's
trial — the kernel module's ``launch_config`` answering with the candidate, its results checked against the current
tiles', timed, and ``launch_config`` put back whatever happened."""

import argparse
import math
from collections.abc import Callable
from types import ModuleType

import torch

from recipes.benchmarks.timing import median_ms


def add_device_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda",
                        help="cuda (default); cpu runs the search under the Triton interpreter in fp32: a dry run, "
                             "whose times say nothing")


def device_of(args) -> tuple[bool, torch.dtype, str]:
    """``(cuda, dtype, what to print)``: bf16 on a GPU, fp32 under the interpreter."""
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("error: the tile search times the kernels on a CUDA GPU; there is none here (--device cpu: a "
                         "dry run under the interpreter)")
    name = torch.cuda.get_device_name() if cuda else "CPU, the interpreter (a dry run)"
    return cuda, torch.bfloat16 if cuda else torch.float32, name


def kernel_us(fn: Callable[[], object], names: tuple[str, ...], repeats: int) -> dict[str, float] | None:
    """GPU time per call of ``fn`` spent in each kernel named in ``names`` (exactly: ``_chunk_scan`` is not
    ``_chunk_scan_reverse``), µs, over ``repeats`` calls under torch's profiler after one warm-up call — one kernel's
    time without the noise of the others and of the host; a name that did not run gets 0. None without CUDA (a dry
    run)."""
    if not torch.cuda.is_available():
        return None
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    spent = {e.key: e.self_device_time_total for e in profiler.key_averages() if e.key in names}
    return {name: spent.get(name, 0.0) / repeats for name in names}


def trial(kernels: ModuleType, config: dict, results: Callable[[], list[torch.Tensor]], want: list[torch.Tensor],
          timed: list[Callable[[], object]], repeats: int,
          gauges: tuple[Callable[[], float | None], ...] = (),
          warmup: int = 1) -> tuple[float, list[float | None]] | str:
    """With ``kernels.launch_config`` answering ``config``: ``(largest error of results() against want, relative to
    each result's largest value; the median ms of each of timed after ``warmup`` calls, then what each of gauges
    returns)``, or why not —
    ``"wrong: …"`` (over 5%, or not finite), ``"failed: …"`` (the candidate does not fit this GPU: shared memory,
    registers, a tile Triton refuses)."""
    original = kernels.launch_config
    kernels.launch_config = lambda *args, **kwargs: config
    try:
        error = max((got - w).abs().max().item() / max(w.abs().max().item(), 1e-6) for got, w in zip(results(), want))
        if not math.isfinite(error) or error > 0.05:
            return f"wrong: relative error {error:.3g}"
        return error, [*(median_ms(fn, repeats, warmup) for fn in timed), *(gauge() for gauge in gauges)]
    except Exception as failure:  # named in the table; the search goes on
        return f"failed: {type(failure).__name__}: {str(failure).splitlines()[0][:100]}"
    finally:
        kernels.launch_config = original
