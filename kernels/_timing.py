"""Timing helper shared by the benchmark scripts (never used by tests)."""

import statistics
import time


def median_ms(fn, repeats: int) -> float:
    """Median wall time of ``fn()`` in milliseconds over ``repeats`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)
