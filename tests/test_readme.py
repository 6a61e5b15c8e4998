"""The README's Python example runs as written (it went stale once when an SSD argument changed)."""

import re
from pathlib import Path


def test_the_readme_python_example_runs(capsys):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    assert blocks, "the README has no Python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
    assert "HybridLM" in capsys.readouterr().out  # the summary it prints
