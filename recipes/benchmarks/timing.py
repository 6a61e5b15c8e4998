"""The one timing and memory helper every benchmark uses (never the tests: speed is measured here, not
asserted). Times are wall-clock medians; on CUDA the device is synchronised around each call so a
time covers the work, not the launch. Memory on CPU is the growth of the resident set's high-water mark
(Linux ``/proc``), on CUDA ``max_memory_allocated``."""

import statistics
import time
from collections.abc import Callable

import torch


def synchronize() -> None:
    """Wait for queued CUDA work (no-op on CPU), so a timer stops when the work is done."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def seconds_of(fn: Callable[[], object]) -> float:
    """Wall time of one call of ``fn``, device work included."""
    synchronize()
    start = time.perf_counter()
    fn()
    synchronize()
    return time.perf_counter() - start


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``repeats`` calls, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    return statistics.median(seconds_of(fn) for _ in range(repeats)) * 1e3


def interleaved_seconds(cases: dict[str, Callable[[], object]], rounds: int, warmup: int = 1) -> dict[str, list[float]]:
    """Each case's wall times over ``rounds`` rounds that run every case once, in turn: a machine that
    slows down mid-run (another job, thermal limits) slows every case alike, so ratios stay fair."""
    for fn in cases.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            times[name].append(seconds_of(fn))
    return times


def resident_kib(field: str) -> int:
    """A field of this process's ``/proc/self/status`` in KiB: ``VmRSS`` (resident now), ``VmHWM`` (peak)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def reset_peak_resident() -> None:
    """Make the resident high-water mark (``VmHWM``) the current resident set (Linux)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def peak_growth_mib(fn: Callable[[], object], device: str = "cpu") -> float:
    """How far memory rises above its level before ``fn()`` while it runs, in MiB, never below 0. On CPU run
    it in a fresh process for a clean number: the allocator keeps freed pages, so a second call reads low.
    The kernel's resident counters are approximate (per-CPU batches), so ``VmRSS`` read just after the reset
    can stand a fraction of a MiB above ``VmHWM``: the baseline is the lower of the two, and a step that
    grows nothing reads 0, not a small negative number."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    reset_peak_resident()
    before = min(resident_kib("VmRSS"), resident_kib("VmHWM"))
    fn()
    return max(0, resident_kib("VmHWM") - before) / 1024
