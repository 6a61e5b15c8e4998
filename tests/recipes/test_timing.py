"""The benchmarks' memory helper: CPU peak growth reads what a step allocates, and never a negative
number when the kernel's approximate resident counters put ``VmRSS`` a little above ``VmHWM``."""

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
