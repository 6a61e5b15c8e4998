"""Propose mutants for one file: every line's comparison, boolean and constant flipped, each ``if`` made false (a
condition over several lines as a whole), each guarded ``raise`` dropped (over several lines, the whole statement),
each ``return`` made ``None`` — in ``mutants.txt``'s format, for a file of candidates.

    python tests/mutation/propose.py recipes/stats.py tests/recipes/test_stats.py > /tmp/stats.txt
    python tests/mutation/run.py --file /tmp/stats.txt --skip-baseline    # which of them the tests miss

A survivor is a place to look, not a verdict: some are equivalent (the program computes the same), some need a GPU
to show. Those that show a missing test get the test, and their line is copied into ``mutants.txt``. Lines that
occur more than once in the file, docstrings and comments are skipped; a flip inside a string literal (a message's
"and") is left out.
"""

import argparse
import ast
import re
import sys
from pathlib import Path

from run import syntax_error  # (the check run.py makes of every list line)

ROOT = Path(__file__).resolve().parents[2]
FLIPS = [(" < ", " <= "), (" <= ", " < "), (" > ", " >= "), (" >= ", " > "), (" == ", " != "), (" != ", " == "),
         (" and ", " or "), (" or ", " and "), (" not in ", " in "), ("not ", ""), (" + 1", " - 1"), (" - 1", " + 1"),
         ("True", "False"), ("False", "True"), (" is None", " is not None"), (" is not None", " is None"),
         ("any(", "all("), ("all(", "any("), ("min(", "max("), ("max(", "min(")]
STRING = re.compile(r"(f?\"[^\"]*\"|f?'[^']*')")


def docstring_lines(source: str) -> set[int]:
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def variants(line: str, previous: str) -> list[str]:
    """The mutated versions of one line of code (``previous``: the line above it)."""
    code = line.split("  #")[0]
    out = [line.replace(a, b, 1) for a, b in FLIPS if a in code]
    if match := re.match(r"(\s*)(if|elif) .*:$", code):
        out.append(f"{match.group(1)}{match.group(2)} False:")
    if line.strip().startswith("raise ") and previous.strip().startswith(("if ", "elif ")):
        out.append(line[:len(line) - len(line.lstrip())] + "pass")
    if (match := re.match(r"(\s*)return (.+)$", code)) and match.group(2) not in ("None", "True", "False") \
            and not code.rstrip().endswith(("(", "[", "{", ",")):
        out.append(f"{match.group(1)}return None")
    same_code = STRING.sub('""', line)
    return [v for v in dict.fromkeys(out) if v != line and STRING.sub('""', v) != same_code]


def list_line(file: str, old: str, new: str, tests: list[str]) -> str:
    """One line of ``mutants.txt``: ``file :: old :: new :: tests``, line breaks written ``\\n``."""
    return f"{file} :: {old.replace(chr(10), chr(92) + 'n')} :: {new} :: {' '.join(tests)}"


def raise_ends(source: str) -> dict[int, int]:
    """``{first line: last line}`` of each ``raise`` that spans several lines (its message continued)."""
    return {node.lineno: node.end_lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Raise) and node.end_lineno > node.lineno}


def condition_ends(source: str) -> dict[int, int]:
    """``{first line: last line}`` of each ``if``/``elif`` header whose condition spans several lines."""
    return {node.lineno: node.test.end_lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.If) and node.test.end_lineno > node.lineno}


def propose(file: str, tests: list[str]) -> list[str]:
    """The mutants of ``file``, each as a line of ``mutants.txt`` naming ``tests``. A ``raise`` over several lines is
    dropped whole (its first line alone would leave the message's continuation behind: not Python); a mutant that
    does not compile is not proposed, since it would fail its tests' imports and count as killed."""
    source = (ROOT / file).read_text()
    skip = docstring_lines(source)
    ends = raise_ends(source)
    lines = source.splitlines()
    out = []
    for first, last in condition_ends(source).items():  # a condition over several lines, made false as a whole
        header = "\n".join(lines[first - 1:last])
        match = re.match(r"(\s*)(if|elif) ", header)
        if match and lines[last - 1].split("  #")[0].rstrip().endswith(":") and source.count(header) == 1 \
                and " :: " not in header and "\\n" not in header:
            new = f"{match.group(1)}{match.group(2)} False:"
            if not syntax_error(source.replace(header, new, 1), file):
                out.append(list_line(file, header, new, tests))
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if (number in skip or not text or text.startswith(("#", "def ", "class ", "import ", "from ", "@"))
                or source.count(line) != 1 or " :: " in line or "\\n" in line):
            continue
        for new in variants(line, lines[number - 2]):
            old = line
            if new.strip() == "pass" and number in ends:
                old = "\n".join(lines[number - 1:ends[number]])
                if " :: " in old or "\\n" in old or source.count(old) != 1:
                    continue
            if not syntax_error(source.replace(old, new, 1), file):
                out.append(list_line(file, old, new, tests))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="the file to mutate, relative to the project root")
    parser.add_argument("tests", nargs="+", help="the tests each mutant runs (pytest node ids or files)")
    args = parser.parse_args(argv)
    if not (ROOT / args.file).is_file():
        parser.error(f"no file {args.file} under {ROOT}")
    print("\n".join(propose(args.file, args.tests)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
