"""The README's Python example runs as written (it went stale once when an SSD argument changed), and the recipes
the docs show build."""

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def fenced_blocks(doc: str, language: str) -> list[str]:
    """The code blocks of one language in a document of the repository, in order."""
    return re.findall(rf"```{language}\n(.*?)```", (ROOT / doc).read_text(), flags=re.S)


def test_the_readme_python_example_runs(capsys):
    blocks = fenced_blocks("README.md", "python")
    assert blocks, "the README has no Python example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
    assert "HybridLM" in capsys.readouterr().out  # the summary it prints


def test_the_architecture_docs_python_binding_builds_what_it_says():
    """docs/architecture.md's Python block: a pattern bound to a ``functools.partial``, built and run as written."""
    import torch

    from components import MLP, QCAttention

    block = fenced_blocks("docs/architecture.md", "python")[0]
    scope: dict = {}
    exec(compile(block, "docs/architecture.md", "exec"), scope)
    model = scope["model"]
    assert [type(b.sequence_mixer) for b in model.blocks] == [QCAttention] * 4
    assert all(type(b.state_mixer) is MLP and b.sequence_mixer.n_heads == 4 for b in model.blocks)
    assert model(torch.randint(0, 256, (1, 7))).shape == (1, 7, 256)


@pytest.mark.parametrize("doc, index, over", [("README.md", 0, None), ("docs/architecture.md", 0, "quickstart.yaml"),
                                              ("docs/training.md", 0, "quickstart.yaml"),  # another optimiser
                                              ("docs/training.md", 1, "quickstart.yaml")])  # compile, loss_positions
def test_the_recipes_the_docs_show_build(doc, index, over, tmp_path, monkeypatch):
    """A recipe (or a piece of one, over a bundled recipe) shown in the docs builds through the CLI as written."""
    from components import MLP, QCAttention
    from recipes.cli import main

    monkeypatch.chdir(tmp_path)
    text = fenced_blocks(doc, "yaml")[index]
    (tmp_path / "shown.yaml").write_text(text)
    shown = yaml.safe_load(text)
    cli = main([*(["--config", over] if over else []), "--config", "shown.yaml"], run=False)
    model = cli.model.model
    for key, value in shown.get("model", {}).items():
        if key == "mixers":
            kinds = {QCAttention: "components.QCAttention", MLP: "components.MLP"}
            built = {kinds[type(m)] for block in model.blocks for m in (block.sequence_mixer, block.state_mixer)}
            assert built == {spec["class_path"] for spec in value.values()}
        elif key != "compile":  # (compile is applied when fit starts)
            assert cli.config["model"][key] == value, key
