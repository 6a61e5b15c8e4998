"""propose.py: the mutants it proposes for a line, and the lines it leaves alone."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from propose import propose, variants  # noqa: E402 - a script beside this test, not a package


def test_a_condition_is_flipped_made_false_and_its_raise_dropped():
    line = "    if count < 1 and not strict:"
    assert variants(line, "") == ["    if count <= 1 and not strict:", "    if count < 1 or not strict:",
                                  "    if count < 1 and strict:", "    if False:"]
    assert variants('        raise ValueError(f"{count} must be at least 1 and even")', line) == ["        pass"]
    assert variants("    return max(low, high)", "") == ["    return min(low, high)", "    return None"]


def test_docstrings_comments_and_repeated_lines_are_left_alone():
    proposed = propose("recipes/stats.py", ["tests/recipes/test_stats.py"])
    assert proposed and all(line.count(" :: ") == 3 and line.endswith(" :: tests/recipes/test_stats.py")
                            for line in proposed)
    olds = {line.split(" :: ")[1] for line in proposed}
    assert not any("Welch's test is chosen" in old or old.lstrip().startswith("#") for old in olds)
    source = Path(__file__).parents[2].joinpath("recipes/stats.py").read_text()
    assert all(source.count(old) == 1 for old in olds)


def test_a_raise_over_several_lines_is_dropped_whole_and_every_mutant_compiles():
    """Its first line alone replaced by ``pass`` left the message's continuation behind: a file that does not import,
    whose tests then fail, so the mutant counted as killed without a bug ever being planted (7 of optimizer.py's 87)."""
    root = Path(__file__).parents[2]
    source = root.joinpath("recipes/optimizer.py").read_text()
    proposed = propose("recipes/optimizer.py", ["t"])
    whole = [line for line in proposed if "\\n" in line.split(" :: ")[1]]
    assert whole and all(line.split(" :: ")[1].lstrip().startswith("raise ") and line.split(" :: ")[2].strip() == "pass"
                         for line in whole)
    for line in proposed:
        _, old, new, _ = line.split(" :: ")
        old = old.replace("\\n", "\n")
        assert source.count(old) == 1
        compile(source.replace(old, new, 1), "recipes/optimizer.py", "exec")


def test_run_refuses_a_mutant_that_is_not_python_rather_than_count_it_killed(tmp_path):
    from run import read_mutants

    raise_line = '        raise ValueError(f"optimizer={name!r} is not a torch.optim.Optimizer")'
    test = "tests/recipes/test_optimizer.py"
    good = f"recipes/optimizer.py :: {raise_line} :: {raise_line.replace('raise ValueError', 'raise TypeError')} :: {test}\n"
    listed = tmp_path / "mutants.txt"
    listed.write_text(good)
    assert len(read_mutants(listed)) == 1
    listed.write_text(good + f"recipes/optimizer.py :: import inspect :: import inspect( :: {test}\n")
    with pytest.raises(SystemExit, match=r"line 2: the mutated recipes/optimizer.py is not Python \(.*\); mutate the"):
        read_mutants(listed)


@pytest.mark.parametrize("tests", ["tests/recipes/test_optimiser.py", "tests/recipes/test_optimizer.py::test_x[a-b"])
def test_run_refuses_a_test_that_cannot_be_collected_rather_than_count_it_killed(tmp_path, tests):
    """A missing file, or a parametrised id cut at a space (an id copied from a log), fails to collect: the mutant
    would count as killed by a test that never ran. 186 listed ids were cut so until 2026-12-02."""
    from run import read_mutants

    listed = tmp_path / "mutants.txt"
    listed.write_text(f"recipes/optimizer.py :: import inspect :: import os :: {tests}\n")
    with pytest.raises(SystemExit, match=r"line 1: no such test file, or a parametrised id cut short: "):
        read_mutants(listed)


@pytest.mark.parametrize("tests", ["tests/recipes/test_optimizer.py::test_no_such_test",
                                   "tests/components/test_attention.py::test_qcattention_is_causal[99]"])
def test_run_refuses_a_test_pytest_does_not_collect_rather_than_count_it_killed(tmp_path, tests):
    """A renamed test, or a parametrised id whose parameters changed, fails to collect as surely as a missing file:
    nine listed ids named parameters a test no longer had until 2026-12-05."""
    from run import read_mutants

    listed = tmp_path / "mutants.txt"
    good = "tests/components/test_attention.py::test_qcattention_is_causal[4]"
    listed.write_text(f"recipes/optimizer.py :: import inspect :: import os :: {good}\n")
    assert len(read_mutants(listed)) == 1
    listed.write_text(f"recipes/optimizer.py :: import inspect :: import os :: {good} {tests}\n")
    with pytest.raises(SystemExit, match=rf"line 1: pytest collects no {re.escape(tests)} \(renamed, or its"):
        read_mutants(listed)


def test_a_condition_over_several_lines_is_made_false_as_a_whole():
    """One-line conditions were the only ones flipped: a multi-line ``if`` header (a long guard) got no ``if False``."""
    root = Path(__file__).parents[2]
    source = root.joinpath("recipes/sweep/cli.py").read_text()
    whole = [line for line in propose("recipes/sweep/cli.py", ["t"])
             if line.split(" :: ")[2].strip() in ("if False:", "elif False:") and "\\n" in line.split(" :: ")[1]]
    assert whole
    for line in whole:
        _, old, new, _ = line.split(" :: ")
        old = old.replace("\\n", "\n")
        assert old.lstrip().startswith(("if ", "elif ")) and old.rstrip().endswith(":") and source.count(old) == 1
        compile(source.replace(old, new, 1), "recipes/sweep/cli.py", "exec")
