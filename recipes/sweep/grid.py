"""A family of recipes from one, over a grid of settings: a folder that ``python -m recipes.sweep`` runs.

    python -m recipes.sweep.grid quickstart.yaml --vary "model.optimizer=[AdamW, Muon]" "model.lr=[0.002, 0.02]" --out g
    python -m recipes.sweep g --seeds 3 --jobs 2 --vs lr

Each ``--vary KEY=[V1, V2, …]`` (a dotted key of the recipe, its values a YAML list) is one axis; every
combination of the axes' values is one recipe, the source recipe with those keys set (and the ``--set KEY=VALUE``
ones, the same in all), written to ``OUT/<name>.yaml``. A name joins one ``<key><value>`` part per axis, in the
order given (``optimizer-Muon_lr0.02``), so the sweep's ``--vs`` of the last axis draws one line per combination of
the others. Each recipe logs under a TensorBoard name of its own, ``<OUT's folder name>/<name>``, so every variant's
runs sit apart, and is parsed as ``fit`` will parse it, its model built on the ``meta`` device, before anything is
left written: a misspelt key, a value of the wrong type or a model that does not build is named then, not in every
run's log.

A family at other settings — is a verdict the learning rate's? — takes the family's folder (or several recipes):

    python -m recipes.sweep.grid english/moe_shared --vary "model.lr=[0.006, 0.012]" --out grids/moe_shared_lr
    python -m recipes.sweep grids/moe_shared_lr --seeds 3 --jobs 2 --vs lr

Each recipe is then named ``<its name>_<values>`` (``routed_lr0.012``), so ``--vs lr`` of the sweep draws one line
per recipe, joined by the family's own runs at its own rate when both are tabulated with ``--from``; a family's
``_family.yaml`` comes along, its baseline the baseline recipe at the grid's first combination. One recipe of a
family at other rates, to be pooled with the family's runs, takes ``--named`` (``otce_expresser_lr0.0015``).
"""

import argparse
import copy
import itertools
import re
import shlex
import sys
from pathlib import Path

import yaml

from recipes.recipe_files import read_config, resolve_config
from recipes.sweep.launch import family_recipes, family_settings, recipe_files


def parse_axis(text: str) -> tuple[str, list]:
    """``KEY=[V1, V2]`` → ``(KEY, [V1, V2])``, the values read as YAML (numbers, ``null``, names, mappings)."""
    key, sep, values = text.partition("=")
    if not sep or not key or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", key):
        raise ValueError(f"--vary {text!r}: write KEY=[V1, V2, ...] with a dotted key of the recipe (model.lr)")
    parsed = read_yaml("--vary", text, values)
    if not isinstance(parsed, list) or not parsed:
        raise ValueError(f"--vary {text!r}: the values are a YAML list of one or more, [V1, V2, ...]")
    return key, [yaml_number(value) for value in parsed]


def yaml_number(value):
    """``1e-3`` as the number it means: YAML 1.1 (PyYAML's) reads an exponent without a dot as a string."""
    if isinstance(value, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", value):
        return float(value)
    return value


def parse_setting(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` → ``(KEY, VALUE)``, the value read as YAML."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--set {text!r}: write KEY=VALUE")
    return key, yaml_number(read_yaml("--set", text, value))


def read_yaml(flag: str, text: str, value: str):
    """``value`` read as YAML, or a ValueError naming the flag's argument and where the YAML broke."""
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at column {mark.column + 1} of {value!r}" if mark is not None else ""
        raise ValueError(f"{flag} {text!r}: not YAML{where}: {getattr(error, 'problem', None) or error}") from None


def value_label(value) -> str:
    """A value as a file name's part: numbers as written shortest (``0.002``, ``1e-05``), a class by its own name
    (``Muon``, ``{class_path: torch.optim.SGD, …}`` → ``SGD``), a path by its file's stem, ``null`` as ``none``."""
    if isinstance(value, dict) and "class_path" in value:
        value = value["class_path"]
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    text = str(value)
    if isinstance(value, str) and "/" in value:  # a path: its file's stem
        text = Path(value).stem
    elif isinstance(value, str) and re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", value):  # a dotted class path
        text = value.rsplit(".", 1)[-1]
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-") or "x"


def variant_name(assignment: list[tuple[str, object]]) -> str:
    """One ``<key><value>`` part per axis, joined by ``_``: ``lr0.02``, a dash before a value that is not a number
    (``optimizer-Muon``, ``S-SSD`` rather than ``SSSD``), a key's underscores dropped (``warmupfraction0.1``)."""
    parts = []
    for key, value in assignment:
        label = value_label(value)
        name = key.rsplit(".", 1)[-1].replace("_", "")  # (an underscore would split the part: --vs reads up to one)
        parts.append(name + ("" if re.match(r"[-+.]?\d", label) else "-") + label)
    return "_".join(parts)


def set_dotted(tree: dict, key: str, value) -> None:
    """``tree[a][b][c] = value`` for ``key`` ``a.b.c``, making the mappings on the way."""
    *path, last = key.split(".")
    node = tree
    for part in path:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ValueError(f"{key}: {part!r} holds {child!r} in the recipe, not a mapping whose keys can be set")
        node = child
    node[last] = value


def grid_recipes(source: str, axes: list[tuple[str, list]], settings: list[tuple[str, object]],
                 family: str, prefix: str = "") -> dict[str, dict]:
    """``{name: recipe}`` for every combination of the axes' values, ``source``'s recipe with them and ``settings``
    set, each named ``prefix`` + :func:`variant_name` and logging to the TensorBoard name ``family/name``."""
    keys = [key for key, _ in axes]
    repeated = sorted({key for key in keys if keys.count(key) > 1} | (set(keys) & {key for key, _ in settings}))
    if repeated:
        raise ValueError(f"{', '.join(repeated)}: set twice (an axis once, and not also by --set)")
    base = read_config(source)
    folder = Path(source).resolve().parent
    recipes = {}
    for values in itertools.product(*(values for _, values in axes)):
        assignment = list(zip(keys, values))
        name = prefix + variant_name(assignment)
        if name in recipes:
            raise ValueError(f"two combinations are both named {name!r}: give values that read apart in a file name")
        recipe = copy.deepcopy(base)
        for key, value in [*settings, *assignment]:
            set_dotted(recipe, key, value)
        init_from = (recipe.get("model") or {}).get("init_from")
        if isinstance(init_from, str) and not Path(init_from).is_absolute():  # relative to the source recipe
            recipe["model"]["init_from"] = str(folder / init_from)
        logger = (recipe.get("trainer") or {}).get("logger")
        if isinstance(logger, dict) and str(logger.get("class_path", "")).endswith("TensorBoardLogger"):
            logger.setdefault("init_args", {})["name"] = f"{family}/{name}"
        recipes[name] = recipe
    return recipes


def check_recipe(path: Path, source: str) -> None:
    """``path`` parsed as the sweep's ``python -m recipes fit --config path`` parses it, and its model built on the
    ``meta`` device where ``source``'s builds there (:func:`recipes.sweep.cli.model_build_error`)."""
    from recipes.cli import parse_recipe
    from recipes.sweep.cli import model_build_error

    try:
        parsed = parse_recipe(["--config", str(path)])
    except SystemExit as stop:  # the CLI's own one-line error
        raise ValueError(f"{path.name}: {str(stop.code).removeprefix('error: ')}") from None
    problem = model_build_error(parsed.config)
    if problem and model_build_error(parse_recipe(["--config", source]).config) is None:
        raise ValueError(f"{path.name}: its model does not build: {problem}")


def grid_sources(values: list[str]) -> tuple[list[str], Path | None]:
    """The recipes a grid varies — each value a recipe (a path, or a bundled name such as ``quickstart.yaml``) or a
    family's folder (a path, or a bundled one such as ``english/moe_shared``: its recipes) — and the folder where
    the values are exactly one, whose ``_family.yaml`` the grid carries over."""
    sources, folders = [], []
    for value in values:
        if Path(value).is_file() or value.endswith(".yaml"):
            sources.append(resolve_config(value))
        else:
            files = recipe_files(value)
            sources += [str(f) for f in files]
            folders.append(files[0].parent)
    stems = [Path(s).stem for s in sources]
    twice = sorted({stem for stem in stems if stems.count(stem) > 1})
    if twice:
        raise ValueError(f"{', '.join(twice)}: two recipes of the grid share the name; give them from one family")
    return sources, folders[0] if len(values) == 1 and folders else None


def write_grid(sources: list[str], axes: list[tuple[str, list]], settings: list[tuple[str, object]], out: Path,
               command: str, family: Path | None = None, prefixed: bool = False) -> list[Path]:
    """Write the grid's recipes into ``out`` (refusing to replace a recipe there), each checked to parse; each
    named for its source too where ``prefixed`` (several sources, or a folder); ``family``'s ``_family.yaml``, the
    baseline mapped to its variant at the first combination (margin, claims and ``starts_from`` as they are), where
    there is none in ``out`` yet."""
    recipes = {}
    for source in sources:
        prefix = f"{Path(source).stem}_" if prefixed else ""
        recipes.update({name: (recipe, source) for name, recipe in
                        grid_recipes(source, axes, settings, out.name, prefix).items()})
    existing = sorted(name for name in recipes if (out / f"{name}.yaml").exists())
    if existing:
        raise ValueError(f"{out} already holds {', '.join(f'{n}.yaml' for n in existing)}: choose another --out, or "
                         "remove them")
    declared = family_settings(family) if family is not None else {}
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        for name, (recipe, source) in recipes.items():
            path = out / f"{name}.yaml"
            path.write_text(f"# {name}: a variant of {source}\n# written by: {command}\n"
                            + yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True))
            written.append(path)
            check_recipe(path, source)
    except Exception:
        for path in written:  # a grid that does not parse leaves nothing behind
            path.unlink()
        if created:
            out.rmdir()
        raise
    if declared and not (out / "_family.yaml").exists():
        first = variant_name([(key, values[0]) for key, values in axes])
        kept = {key: value for key, value in declared.items() if key in ("equivalence_margin", "claims", "starts_from")}
        if "baseline" in declared:
            kept = {"baseline": f"{declared['baseline']}_{first}", **kept}
        (out / "_family.yaml").write_text(f"# {family}'s, for this grid; written by: {command}\n"
                                          + yaml.safe_dump(kept, sort_keys=False))
    others = sorted(p.stem for p in family_recipes(out) if p not in written)
    if others:  # (a point added to a grid; or two grids mixed)
        print(f"note: {out} also holds {', '.join(others)}: python -m recipes.sweep {out} runs them too",
              file=sys.stderr)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.sweep.grid", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipes", nargs="+", metavar="RECIPE",
                        help="the recipe the grid varies (a path, or a bundled name such as quickstart.yaml), several, "
                             "or a family's folder (english/moe_shared): each variant named for its recipe too")
    parser.add_argument("--vary", nargs="+", action="extend", required=True, metavar="KEY=[V1,V2]",
                        help="one axis of the grid: a dotted key of the recipe and a YAML list of its values")
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                        help="a setting the same in every recipe of the grid")
    parser.add_argument("--out", required=True, help="the folder the recipes are written to (the sweep's FAMILY)")
    parser.add_argument("--named", action="store_true",
                        help="name one recipe's variants for it too (otce_expresser_lr0.0015, not lr0.0015), as "
                             "several recipes' or a folder's always are: to pool them with its family's runs")
    args = parser.parse_args(argv)
    command = "python -m recipes.sweep.grid " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        sources, family = grid_sources(args.recipes)
        axes = [parse_axis(text) for text in args.vary]
        settings = [parse_setting(text) for text in args.set]
        written = write_grid(sources, axes, settings, Path(args.out), command, family,
                             prefixed=args.named or len(sources) > 1 or family is not None)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
    print(f"{len(written)} recipe{'s' if len(written) != 1 else ''} in {args.out}/: {', '.join(p.stem for p in written)}")
    last, values = axes[-1]
    plotted = (last.split(".")[0] in ("model", "data", "trainer")  # (what a run records: recipes.sweep --vs)
               and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values))
    print(f"run them: python -m recipes.sweep {args.out} --seeds 3 --jobs 2"
          + (f" --vs {last.removeprefix('model.')}" if plotted else ""))


if __name__ == "__main__":
    main()
