"""Mutation testing: plant each bug of ``mutants.txt`` in a copy of the project, run the tests its
line names, and report the bugs no test caught (the survivors).

    python tests/mutation/run.py                 # every mutant, 2 at a time
    python tests/mutation/run.py --only ssd rope # the mutants whose line mentions a word
    python tests/mutation/run.py --list          # print the list and check every line applies
    python tests/mutation/run.py --file F        # another list, such as propose.py's candidates for one file

A line of ``mutants.txt`` is ``file :: old text :: new text :: tests`` (tests: pytest node ids or
files, space-separated; ``\n`` in the texts stands for a line break). ``old text`` must occur exactly once in ``file``, so a line that no longer
applies after an edit is an error, not a silent pass; a mutated Python file must compile (one that does not would fail
its tests' imports and count as killed). Before the mutants, the union of their tests
runs once on the unchanged copy: a test that already fails would "kill" every mutant it touches.
Exit status: 0 when every mutant is killed, 1 when some survive, 2 when the list or the baseline is
broken. docs/testing.md says how to use it and what the list covers.
"""

import argparse
import concurrent.futures as futures
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIST = Path(__file__).with_name("mutants.txt")
SEPARATOR = " :: "


@dataclass
class Mutant:
    line: int
    file: str
    old: str
    new: str
    tests: list[str]

    def __str__(self) -> str:
        return f"#{self.line} {self.file}: {self.old.strip()!r} -> {self.new.strip()!r}"


def read_mutants(path: Path = LIST) -> list[Mutant]:
    """Parse and check every line: its file exists and its old text occurs there exactly once."""
    mutants, problems = [], []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        parts = raw.split(SEPARATOR)
        if len(parts) != 4:
            problems.append(f"line {number}: expected 'file :: old :: new :: tests', got {len(parts)} fields")
            continue
        file, old, new, tests = (p.strip() if i in (0, 3) else p.replace("\\n", "\n") for i, p in enumerate(parts))
        source = ROOT / file
        if not source.is_file():
            problems.append(f"line {number}: no file {file}")
            continue
        found = source.read_text().count(old)
        if found != 1:
            problems.append(f"line {number}: {old!r} occurs {found} times in {file} (must be exactly once)")
            continue
        if old == new or not tests.split():
            problems.append(f"line {number}: the new text equals the old, or no tests are named")
            continue
        # a test that cannot be collected fails, and would count as killing a bug it never saw
        if bad := [t for t in tests.split() if not (ROOT / t.split("::")[0]).is_file() or ("[" in t) != t.endswith("]")]:
            problems.append(f"line {number}: no such test file, or a parametrised id cut short: {' '.join(bad)}")
            continue
        if file.endswith(".py") and (error := syntax_error(source.read_text().replace(old, new, 1), file)):
            # (its tests would fail to import it, and it would count as killed: a bug that was never planted)
            problems.append(f"line {number}: the mutated {file} is not Python ({error}); mutate the whole statement")
            continue
        mutants.append(Mutant(number, file, old, new, tests.split()))
    if not problems and (lost := uncollected({t for m in mutants for t in m.tests})):
        problems = [f"line {m.line}: pytest collects no {' '.join(sorted(set(m.tests) & lost))} (renamed, or its "
                    "parameters changed)" for m in mutants if lost & set(m.tests)]
    if problems:
        raise SystemExit(f"{path} is broken:\n  " + "\n  ".join(problems))
    return mutants


def uncollected(tests: set[str]) -> set[str]:
    """The named tests pytest does not collect: a test function renamed, or a parametrised id that changed with its
    parameters. Each run of such a test fails whatever the mutant, and would count as killing it."""
    named = {t for t in tests if "::" in t}
    if not named:
        return set()
    files = sorted({t.split("::")[0] for t in named})
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                           *files], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    found = set()
    for node in done.stdout.splitlines():  # each id, and what names it in part: its function, class, file
        found.add(node)
        found.add(node.split("[")[0])
        parts = node.split("[")[0].split("::")
        found.update("::".join(parts[:i]) for i in range(1, len(parts)))
    return named - found


def syntax_error(source: str, name: str) -> str | None:
    """Why ``source`` does not compile, or None."""
    try:
        compile(source, name, "exec")
    except SyntaxError as error:
        return f"{error.msg}, line {error.lineno}"
    return None


def copy_project(into: Path) -> None:
    """Copy the files git tracks (and untracked, unignored ones) — the project as the tests see it."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout.split("\n")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)


def run_tests(where: Path, tests: list[str], timeout: float) -> tuple[int | None, str]:
    """pytest in ``where`` (its modules first on the path), stopping at the first failure."""
    env = {**os.environ, "PYTHONPATH": str(where), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-n", "0", "-x", "-q", "-p", "no:cacheprovider", "--no-header", *tests]
    try:
        done = subprocess.run(command, cwd=where, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out"
    return done.returncode, done.stdout + done.stderr


def first_failure(output: str) -> str:
    for line in output.splitlines():
        if line.startswith(("FAILED", "ERROR")):
            return line.split(" - ")[0]
    return output.strip().splitlines()[-1] if output.strip() else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=[], help="only the mutants whose line mentions one of these words")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once (default 2)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant; past it counts as killed")
    parser.add_argument("--skip-baseline", action="store_true", help="do not first run the tests unmutated")
    parser.add_argument("--list", action="store_true", help="check and print the list, run nothing")
    parser.add_argument("--file", type=Path, default=LIST,
                        help="another list in the same format (default: mutants.txt), e.g. what propose.py writes")
    args = parser.parse_args(argv)

    mutants = read_mutants(args.file)
    if args.only:
        mutants = [m for m in mutants if any(w in f"{m.file} {m.old} {m.new} {' '.join(m.tests)}" for w in args.only)]
        if not mutants:  # else the baseline would run pytest with no targets: the whole suite
            parser.error(f"no mutant's line mentions {' or '.join(map(repr, args.only))} (file, old, new and tests are "
                         "read joined by single spaces, not by ' :: ')")
    if args.list:
        for m in mutants:
            print(m)
        print(f"{len(mutants)} mutants, every line applies")
        return 0

    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        copies = [Path(tmp) / f"copy{i}" for i in range(max(args.jobs, 1))]
        for copy in copies:
            copy_project(copy)
        if not args.skip_baseline:
            tests = sorted({t for m in mutants for t in m.tests})
            started = time.perf_counter()
            code, output = run_tests(copies[0], tests, args.timeout * 4)
            if code != 0:
                print(output[-4000:])
                print(f"baseline: the unmutated tests fail ({first_failure(output)}); fix them first")
                return 2
            print(f"baseline: {len(tests)} test targets pass unmutated ({time.perf_counter() - started:.0f} s)", flush=True)

        free = list(copies)

        def trial(m: Mutant) -> tuple[Mutant, str, str, float]:
            copy = free.pop()
            target = copy / m.file
            original = target.read_text()
            started = time.perf_counter()
            try:
                target.write_text(original.replace(m.old, m.new, 1))
                code, output = run_tests(copy, m.tests, args.timeout)
            finally:
                target.write_text(original)
                free.append(copy)
            verdict = "killed" if code != 0 else "SURVIVED"
            how = "timed out" if code is None else (first_failure(output) if code else "")
            return m, verdict, how, time.perf_counter() - started

        survivors = []
        with futures.ThreadPoolExecutor(max_workers=len(copies)) as pool:
            for i, (m, verdict, how, seconds) in enumerate(pool.map(trial, mutants), start=1):
                print(f"[{i}/{len(mutants)}] {verdict:8s} {seconds:5.0f} s  {m}" + (f"\n{'':18}by {how}" if how else ""),
                      flush=True)
                if verdict == "SURVIVED":
                    survivors.append(m)
    print(f"\n{len(mutants)} mutants: {len(mutants) - len(survivors)} killed, {len(survivors)} survived")
    for m in survivors:
        print(f"  survived: {m}")
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())
