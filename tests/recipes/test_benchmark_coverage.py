"""Every benchmark has a test that imports or runs it, beyond the flag checks every command line gets. Two that had
none rotted unseen: the decoding benchmark's TransXSSM rows failed (each error went by on stderr and the table
printed without them), and the SSD benchmark's FLOP count was 17-27% high — each quoted in docs/ for weeks."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = sorted(path.stem for path in (ROOT / "recipes" / "benchmarks").glob("*.py") if path.stem != "__init__")
FLAGS_ONLY = {"test_argtypes.py", "test_doc_commands.py", Path(__file__).name}  # they parse every command's flags


def test_every_benchmark_has_a_test_that_imports_or_runs_it():
    tests = [path.read_text() for path in (ROOT / "tests").rglob("test_*.py") if path.name not in FLAGS_ONLY]
    untested = [name for name in BENCHMARKS if not any(
        re.search(rf"recipes\.benchmarks(\.{name}\b| import [\w ,]*\b{name}\b)", text) for text in tests)]
    assert len(BENCHMARKS) >= 17 and untested == []
