"""propose.py: the mutants it proposes for a line, and the lines it leaves alone."""

import sys
from pathlib import Path

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
