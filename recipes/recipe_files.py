"""The recipe files: the bundled ones (``recipes/configs/``), a ``--config`` value resolved to a file, a file read
as a recipe's mapping, and where a sweep puts the runs of a recipe that names no logger. Nothing here imports torch
or Lightning: the tools that read recipes and runs without training (``recipes.sweep``'s tables, its grid,
``recipes.transfer``) start in a second, not ten."""

import json
from pathlib import Path

import yaml

from recipes.argtypes import close_matches

CONFIG_DIR = Path(__file__).parent / "configs"
# what a run writes into its folder's checkpoints/ (recipes.training.CheckpointPolicy)
RUN_CHECKPOINTS = ("last.ckpt", "best.ckpt", "swa.ckpt")


def bundled_configs() -> list[str]:
    return sorted(str(p.relative_to(CONFIG_DIR)) for p in CONFIG_DIR.rglob("*.yaml") if not p.name.startswith("_"))


def resolve_config(value: str) -> str:
    """An existing path stays; otherwise ``NAME.yaml`` resolves to the bundled ``recipes/configs/NAME.yaml``."""
    if Path(value).is_file():
        return value
    bundled = CONFIG_DIR / value
    if bundled.is_file():
        return str(bundled)
    raise FileNotFoundError(f"config file {value!r} not found: it is not a path to a file, nor a bundled config "
                            f"({bundled_hint(value)})")


def bundled_hint(value: str) -> str:
    """The bundled recipes a missing ``--config`` may have meant (same file name, or a near spelling), else the
    top-level ones and the folders of the rest (a list of 150 names helps nobody)."""
    names = bundled_configs()
    wanted = value if value.endswith(".yaml") else value + ".yaml"
    meant = ([wanted] if wanted in names else [name for name in names if Path(name).name == Path(wanted).name]
             or close_matches([wanted], names, n=3, cutoff=0.75))
    if meant:
        return f"did you mean {', '.join(meant)}?"
    folders = sorted({name.split("/")[0] + "/" for name in names if "/" in name})
    return (f"bundled: {', '.join(name for name in names if '/' not in name)}, and {len(names)} in all under "
            f"{', '.join(folders)}: ls {CONFIG_DIR}")


def read_config(path: str) -> dict:
    """A recipe file's mapping, or a ``ValueError`` that names the file when it is empty, not YAML, or not a
    mapping of sections."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"config file {path} is not valid YAML: {str(error).splitlines()[0]}") from None
    if data is None:
        raise ValueError(f"config file {path} is empty; a recipe is a mapping of sections (model:, data:, trainer:)")
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} holds a {type(data).__name__}; a recipe is a mapping of sections "
                         "(model:, data:, trainer:)")
    return data


def sweep_root(config: Path) -> Path:
    """Where ``recipes.sweep`` puts the runs of a recipe that names no logger: ``runs/<its folder>/<its name>``."""
    return Path("runs") / config.parent.name / config.stem


def flat_settings(tree, prefix: str = "") -> dict:
    """``{dotted key: value}`` of a nested config, its values as JSON has them (tuples as lists, paths as text)."""
    if isinstance(tree, dict):
        return {key: value for k, v in tree.items() for key, value in flat_settings(v, f"{prefix}{k}.").items()}
    return {prefix[:-1]: json.loads(json.dumps(tree, default=str))}
