"""The benchmarks' timing and memory helpers: CPU peak growth reads what a step allocates, and never a negative
number when the kernel's approximate resident counters put ``VmRSS`` a little above ``VmHWM``; CUDA's is the
allocator's peak; a time is taken between synchronisations, a median over the timed calls after the warm-up, and
interleaved rounds run every case once per round."""

import subprocess
import sys
from pathlib import Path

import pytest

from recipes.benchmarks import timing

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")


@linux_only
def test_cpu_peak_growth_sees_a_touched_allocation():
    # In a fresh process, as the helper's docstring asks: a pytest worker that freed 48 MiB in an earlier test
    # may hand those resident pages back, and the growth then reads 0 (CI saw exactly that).
    script = ("import torch\nfrom recipes.benchmarks import timing\n"
              "def allocate():\n"
              "    block = torch.ones(48 * 2**20 // 4)  # 48 MiB of float32, every page written\n"
              "    return float(block[-1])\n"
              "print(timing.peak_growth_mib(allocate))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert 40 <= float(done.stdout.split()[-1]) <= 200


def test_cpu_peak_growth_is_never_negative_when_counters_disagree(monkeypatch):
    # what CI saw: VmRSS read after the reset stood 204 KiB above the reset high-water mark
    readings = {"VmRSS": 100_204, "VmHWM": 100_000}
    monkeypatch.setattr(timing, "reset_peak_resident", lambda: None)
    monkeypatch.setattr(timing, "resident_kib", lambda field: readings[field])
    assert timing.peak_growth_mib(lambda: None) == 0.0


def test_cpu_peak_growth_measures_from_the_lower_baseline(monkeypatch):
    calls = iter([100_204, 100_000, 103_072])  # VmRSS, VmHWM before; VmHWM after (3 MiB above the lower)
    monkeypatch.setattr(timing, "reset_peak_resident", lambda: None)
    monkeypatch.setattr(timing, "resident_kib", lambda field: next(calls))
    assert timing.peak_growth_mib(lambda: None) == pytest.approx(3.0)


def test_cuda_peak_growth_is_the_allocators_peak_above_what_was_allocated_before(monkeypatch):
    calls = []
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda: calls.append("sync"))
    monkeypatch.setattr(timing.torch.cuda, "reset_peak_memory_stats", lambda: calls.append("reset"))
    monkeypatch.setattr(timing.torch.cuda, "memory_allocated", lambda: 100 * 2**20)
    monkeypatch.setattr(timing.torch.cuda, "max_memory_allocated", lambda: 164 * 2**20)
    assert timing.peak_growth_mib(lambda: calls.append("step"), device="cuda") == pytest.approx(64.0)
    # the peak is reset after queued work ends and read after the step's work ends
    assert calls == ["sync", "reset", "step", "sync"]


def test_a_call_is_timed_with_the_device_synchronised_on_both_sides(monkeypatch):
    events, clock = [], iter([10.0, 10.25])

    def tick():
        events.append("clock")
        return next(clock)

    monkeypatch.setattr(timing, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(timing.time, "perf_counter", tick)
    assert timing.seconds_of(lambda: events.append("call")) == pytest.approx(0.25)
    assert events == ["sync", "clock", "call", "sync", "clock"]


@pytest.mark.parametrize("available, initialized, synced", [(True, True, True), (True, False, False),
                                                            (False, True, False)])
def test_synchronise_waits_only_for_a_cuda_context_that_exists(monkeypatch, available, initialized, synced):
    # an uninitialised CUDA has no queued work, and synchronising would create a context (and its memory)
    waited = []
    monkeypatch.setattr(timing.torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(timing.torch.cuda, "is_initialized", lambda: initialized)
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda: waited.append(True))
    timing.synchronize()
    assert waited == ([True] if synced else [])


def test_the_median_is_in_milliseconds_over_the_timed_calls_after_the_warm_up(monkeypatch):
    times = iter([0.004, 0.001, 0.009, 0.003, 0.002])
    calls = []
    monkeypatch.setattr(timing, "seconds_of", lambda fn: next(times))  # timed calls do not reach ``fn`` here
    assert timing.median_ms(lambda: calls.append(1), repeats=5, warmup=3) == pytest.approx(3.0)
    assert len(calls) == 3  # the warm-up calls, untimed
    assert next(times, None) is None  # every repeat was timed


def test_interleaved_rounds_warm_every_case_then_run_each_once_per_round(monkeypatch):
    order = []
    monkeypatch.setattr(timing, "seconds_of", lambda fn: (fn(), len(order))[1])
    cases = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    times = timing.interleaved_seconds(cases, rounds=3, warmup=2)
    assert order == ["a", "a", "b", "b"] + ["a", "b"] * 3
    assert times == {"a": [5, 7, 9], "b": [6, 8, 10]}  # each case's own rounds, in order


@linux_only
def test_resident_fields_are_read_in_kib_from_proc():
    rss, peak = timing.resident_kib("VmRSS"), timing.resident_kib("VmHWM")
    assert 10_000 < rss <= peak * 1.01 + 1024  # a Python with torch holds tens of MiB; the peak is at least that
