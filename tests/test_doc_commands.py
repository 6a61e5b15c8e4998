"""Every ``python -m`` command the README, docs/, the scripts and the modules' docstrings show still parses: each
``--flag`` is one its command defines, each value of a flag with choices is one of them, and each bundled recipe,
sweep family and recipe name it names exists. Flags get renamed and recipes moved; a command copied from the docs
should not answer with "unrecognized arguments"."""

import argparse
import ast
import contextlib
import functools
import io
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

from recipes.cli import SUBCOMMANDS
from recipes.recipe_files import bundled_configs
from recipes.cli import main as lightning_main
from recipes.sweep.grid import grid_sources
from recipes.sweep.launch import recipe_files

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The scripts too: a stale flag in the GPU suite costs a lent GPU's time.
SCRIPTS = [ROOT / ".ci" / "run", *sorted((ROOT / "recipes").rglob("*.sh"))]
# And each module's docstring, which its --help prints.
MODULES = sorted(path for package in ("recipes", "zoo_kernels", "components") for path in (ROOT / package).rglob("*.py"))
LIGHTNING = SUBCOMMANDS  # `python -m recipes SUB`: LightningCLI (jsonargparse)
# Recipe names the docs use for the reader's own file, not a bundled one.
PLACEHOLDER_CONFIGS = {"my_recipe.yaml", "my.yaml", "mine.yaml", "model.yaml", "C.yaml", "NAME.yaml", "FILE.yaml",
                       "doge.yaml"}


def shown_commands() -> list[tuple[str, list[str]]]:
    """(file, the tokens after ``python -m``) for every command in a script, or a doc's code block or inline span."""
    found = []
    for path in DOCS + SCRIPTS + MODULES:
        text = path.read_text()
        if path in MODULES:  # (its indented lines are the docstring's code)
            docstring = ast.get_docstring(ast.parse(text)) or ""
            code = [line for line in docstring.splitlines() if re.match(r"\s+python3? -m ", line)]
            text = re.sub(r"^\s+python3? -m .*$", "", docstring, flags=re.M) + "\n```\n" + "\n".join(code) + "\n```"
        elif path in SCRIPTS:
            text = "```\n" + "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")) + "\n```"
        snippets = []
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
            snippets += re.sub(r"\\\n\s*", " ", block).splitlines()  # (a backslash continues the line)
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        snippets += re.findall(r"`([^`]+)`", prose.replace("\n", " "))  # (an inline span may wrap a line)
        for snippet in snippets:
            snippet = re.split(r"\s#\s", snippet)[0]  # a shell comment
            for piece in re.split(r"&&|;|\|", snippet):
                if not re.search(r"python3? -m ", piece):
                    continue
                command = re.split(r"python3? -m ", piece, maxsplit=1)[1]
                try:
                    tokens = shlex.split(command)
                except ValueError:  # (an unbalanced quote in prose)
                    tokens = command.split()
                found.append((path.name, tokens))
    return found


COMMANDS = [(where, tokens) for where, tokens in shown_commands()
            if tokens and tokens[0].split(".")[0] in ("recipes", "zoo_kernels")]


class _Parser(Exception):
    def __init__(self, parser):
        self.parser = parser


@functools.cache
def argparse_parser(module: str, sub: str | None) -> argparse.ArgumentParser:
    """The parser ``python -m module`` builds, taken from its first ``parse_args`` call (nothing runs after it)."""
    def capture(self, *args, **kwargs):
        raise _Parser(self)

    patched = pytest.MonkeyPatch()
    patched.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    patched.setattr(sys, "argv", [module])
    try:
        if module == "recipes" and sub == "generate":
            from recipes.generate import main
            main([])
        elif module == "recipes" and sub == "eval":
            from recipes.evaluation.cli import main
            main([])
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=False)
    except _Parser as found:
        return found.parser
    finally:
        patched.undo()
    raise AssertionError(f"python -m {module} parsed no arguments")


def options(parser: argparse.ArgumentParser, sub: str | None) -> dict[str, argparse.Action]:
    """The flags ``parser`` takes with subcommand ``sub``, each with its action."""
    found = {option: action for action in parser._actions for option in action.option_strings}
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    names = {name for action in subparsers for name in action.choices}
    for action in subparsers:
        for name, child in action.choices.items():
            if sub in (name, None) or sub not in names:  # (no subcommand named: any of them may take the flag)
                found |= options(child, None)
    return found


@functools.cache
def lightning_flags(sub: str) -> frozenset[str]:
    text = io.StringIO()
    with contextlib.redirect_stdout(text), pytest.raises(SystemExit):
        lightning_main([sub, "--help"])
    return frozenset(re.findall(r"(?:^|\s|,)(--[\w.]+)", text.getvalue()))


def lightning_takes(flag: str, flags: frozenset[str]) -> bool:
    """Whether LightningCLI takes ``flag``: it is one ``--help`` lists, or sits under one whose class the recipe
    chooses (``--model.mixers``, ``--data``, ...: those with a ``.help``), whose own arguments --help cannot list."""
    parts = flag.split(".")
    return flag in flags or any(".".join(parts[:i]) + ".help" in flags for i in range(1, len(parts)))


def is_option(token: str) -> bool:
    """``--flag`` or ``--flag=value``; a quoted value that holds options (``--suite-args "--multiples 1 2"``) is not."""
    return token.startswith("--") and len(token) > 2 and " " not in token


def flags_of(tokens: list[str]) -> list[str]:
    """The options' names, less a value and jsonargparse's append mark (``--trainer.callbacks+=X``)."""
    return [t.split("=")[0].removesuffix("+") for t in tokens if is_option(t)]


def test_the_docs_show_commands_of_every_kind():
    modules = {tokens[0] for _, tokens in COMMANDS}
    assert {"recipes", "recipes.sweep", "recipes.benchmarks.models", "zoo_kernels.doctor"} <= modules
    assert len(COMMANDS) > 150


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # (runpy, of a module a test imported)
@pytest.mark.parametrize("module", sorted({t[0] for _, t in COMMANDS} - {"recipes"}) + ["recipes generate",
                                                                                     "recipes eval"])
def test_every_flag_the_docs_give_an_argparse_command_exists(module):
    module, _, sub = module.partition(" ")
    shown = [(where, tokens) for where, tokens in COMMANDS
             if tokens[0] == module and (not sub or tokens[1:2] == [sub])]
    assert shown, f"no command of python -m {module} {sub} in the docs"
    parser = argparse_parser(module, sub or None)
    assert parser.prog == f"python -m {module}" + (f" {sub}" if sub else ""), "its usage line names another command"
    wrong = []
    for where, tokens in shown:
        args = tokens[2:] if sub else tokens[1:]
        known = options(parser, next((t for t in args if not t.startswith("-")), None))
        command = f"{where}: python -m {' '.join(tokens)}"
        wrong += [f"{command}  ({flag})" for flag in flags_of(args) if flag not in known]
        wrong += [f"{command}  ({flag} {value}: not one of {sorted(known[flag].choices)})" for flag in flags_of(args)
                  if flag in known and known[flag].choices for value in values_of(args, flag)
                  if not placeholder(value) and value not in known[flag].choices]
        if module == "recipes.sweep":  # --suite-args go on to `python -m recipes eval`, --set to each run's fit
            passed = flags_of([t for value in values_of(args, "--suite-args") for t in shlex.split(value)])
            wrong += [f"{command}  ({flag}: not an eval option)" for flag in passed
                      if flag not in options(argparse_parser("recipes", "eval"), None)]
            wrong += [f"{command}  ({key}: not a fit option)" for key in values_of(args, "--set")
                      if not placeholder(key) and not lightning_takes("--" + key.split("=")[0], lightning_flags("fit"))]
    assert not wrong, "flags these commands do not define:\n" + "\n".join(wrong)


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")
@pytest.mark.parametrize("module", sorted({t[0] for _, t in COMMANDS} - {"recipes"}) + ["recipes generate",
                                                                                     "recipes eval"])
def test_a_repeated_list_option_adds_to_its_values(module):
    """``--set a=1 … --set b=2`` with argparse's default action kept only ``b=2``, and the run went on without ``a``.
    Every list option that starts empty extends (one with a default list, a benchmark's ``--lengths``, is replaced
    by what is given, as a user expects of a default)."""
    module, _, sub = module.partition(" ")
    parser = argparse_parser(module, sub or None)
    children = [child for a in parser._actions if isinstance(a, argparse._SubParsersAction) for child in a.choices.values()]
    actions = [action for each in (parser, *children) for action in each._actions]
    replaced = [action.option_strings[0] for action in actions if action.option_strings and action.nargs in ("+", "*")
                and action.default in (None, []) and not isinstance(action, argparse._ExtendAction)]
    assert not replaced, f"python -m {module} {sub}: a repeated {replaced} keeps only its last values"


def test_every_flag_and_recipe_the_docs_give_fit_validate_and_test_exists():
    shown = [(where, tokens) for where, tokens in COMMANDS if tokens[0] == "recipes" and tokens[1:2] != []
             and tokens[1] in LIGHTNING]
    assert len(shown) > 30
    known = {sub: lightning_flags(sub) for sub in sorted({tokens[1] for _, tokens in shown})}
    bundled = set(bundled_configs())
    wrong = []
    for where, tokens in shown:
        flags = known[tokens[1]]
        wrong += [f"{where}: python -m {' '.join(tokens)}  ({flag})" for flag in flags_of(tokens[2:])
                  if not lightning_takes(flag, flags)]
        wrong += [f"{where}: python -m {' '.join(tokens)}  (no bundled recipe {name})" for name in configs_of(tokens)
                  if name not in bundled and name not in PLACEHOLDER_CONFIGS]
    assert not wrong, "flags or recipes these commands do not have:\n" + "\n".join(wrong)


def placeholder(name: str) -> bool:
    """A name the reader fills in: ``<time>``, ``FAMILY``, ``NAME``, ``runs/*``."""
    return "<" in name or "*" in name or name.isupper()


def values_of(tokens: list[str], flag: str) -> list[str]:
    """The values after each ``flag`` in ``tokens``, up to the next option."""
    values = []
    for i, token in enumerate(tokens):
        if token == flag:
            following = tokens[i + 1:]
            values += following[:next((j for j, t in enumerate(following) if is_option(t)), len(following))]
    return values


def configs_of(tokens: list[str]) -> list[str]:
    return values_of(tokens, "--config")


def test_every_sweep_family_and_recipe_name_in_the_docs_exists():
    bundled = set(bundled_configs())
    # a family the docs first write with recipes.sweep.grid (from bundled recipes or families, as the grid reads them)
    written = {out for _, tokens in COMMANDS if tokens[0] == "recipes.sweep.grid" for out in values_of(tokens, "--out")}
    wrong = []
    for where, tokens in COMMANDS:
        sources = tokens[1:next((i for i, t in enumerate(tokens) if is_option(t)), len(tokens))]
        for source in sources if tokens[0] == "recipes.sweep.grid" else ():
            if not placeholder(source):
                try:
                    grid_sources([source])
                except (FileNotFoundError, ValueError):
                    wrong.append(f"{where}: python -m {' '.join(tokens)}  (no bundled recipe or family {source})")
    for where, tokens in COMMANDS:
        if tokens[0] == "recipes.sweep" and len(tokens) > 1 and not tokens[1].startswith("-") \
                and not placeholder(tokens[1]) and tokens[1] not in written:
            try:
                names = {f.stem for f in recipe_files(tokens[1])}
            except FileNotFoundError as error:
                wrong.append(f"{where}: python -m {' '.join(tokens)}  ({error})")
                continue
            named = values_of(tokens, "--baseline") + values_of(tokens, "--only")
            wrong += [f"{where}: python -m {' '.join(tokens)}  (no recipe {name} in {tokens[1]})"
                      for name in named if name not in names and not placeholder(name)]
        if tokens[0] == "recipes" and tokens[1:2] in (["generate"], ["eval"]):
            wrong += [f"{where}: python -m {' '.join(tokens)}  (no bundled recipe {name})" for name in configs_of(tokens)
                      if name not in bundled and name not in PLACEHOLDER_CONFIGS]
    assert not wrong, "families or recipes these commands name that do not exist:\n" + "\n".join(wrong)
