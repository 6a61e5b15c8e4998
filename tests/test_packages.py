"""The project's three top-level packages: names no other installed distribution ships, and imports that point one
way (``zoo_kernels ← components ← recipes``)."""
import ast
import importlib
import importlib.metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("zoo_kernels", "components", "recipes")


@pytest.mark.parametrize("package", PACKAGES)
def test_no_other_installed_distribution_ships_a_top_level_package_of_the_same_name(package):
    # Two distributions with one top-level name share one folder in site-packages (the second install overwrites
    # the first's files), and in a checkout the one first on sys.path hides the other: transformers 5.25 requires
    # Hugging Face's `kernels`, this project's kernels package was called `kernels` too, and either side failed
    # to import (ImportError: cannot import name 'CUDAProperties' from 'kernels').
    shippers = set(importlib.metadata.packages_distributions().get(package, [])) - {"hybrid-zoo"}
    assert not shippers, f"{package!r} is also the top-level package of {sorted(shippers)}"
    assert Path(importlib.import_module(package).__file__).resolve().is_relative_to(ROOT / package)


def imported_packages(path: Path) -> set[str]:
    """The top-level names a module imports (absolute imports only: the project uses no others)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args \
                and isinstance(node.args[0], ast.Constant):
            names.add(str(node.args[0].value).split(".")[0])
    return names


@pytest.mark.parametrize("package", PACKAGES[:2])
def test_dependencies_point_one_way(package):
    above = set(PACKAGES[PACKAGES.index(package) + 1:])
    wrong = {str(path.relative_to(ROOT)): sorted(imported_packages(path) & above)
             for path in sorted((ROOT / package).rglob("*.py"))}
    assert not {path: names for path, names in wrong.items() if names}, f"{package} imports from {sorted(above)}"


def test_the_tools_that_read_recipes_and_runs_without_training_start_without_torch_or_lightning():
    """``python -m recipes.sweep``, ``recipes.sweep.grid``, ``recipes.transfer`` and ``python -m recipes generate`` and
    ``eval`` import torch and Lightning only where they build or train a model: their --help and argument errors came
    after 8-10 s of importing Lightning (and with it torchmetrics and, where installed, transformers), now in a fraction
    of a second."""
    import subprocess
    import sys

    code = ("import sys, recipes.sweep.cli, recipes.sweep.grid, recipes.transfer, recipes.recipe_files, "
            "recipes.generate, recipes.evaluation.cli; "
            "print(sorted(m for m in ('torch', 'lightning', 'recipes.cli', 'recipes.module') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
