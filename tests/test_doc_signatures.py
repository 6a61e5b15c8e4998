"""Every signature the docs print — a code block's ``Name(a, *, b=1, ...)`` with a bare ``*`` — is the real one:
the same parameters in the same order, the same keyword-only ones, the same defaults. Two kernel READMEs once
showed ``attention`` and ``ssd_scan`` without the ``document_*`` and ``check_finite`` arguments added later."""

import ast
import inspect
import re
from pathlib import Path

import pytest

import components
import kernels.attention
import kernels.retrieval
import kernels.ssd

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "kernels").glob("*/README.md"))]
NAMESPACE = {name: value for module in (components, kernels.attention, kernels.retrieval, kernels.ssd)
             for name, value in vars(module).items() if callable(value) and not name.startswith("_")}
CALL = re.compile(r"\b(\w+)\(([^()]*(?:\([^()]*\)[^()]*)*)\)", flags=re.S)  # (one level of nested parentheses)


def shown_signatures() -> list[tuple[str, str, str]]:
    """(file, name, the text between its parentheses) for each documented signature."""
    found = []
    for path in DOCS:
        for block in re.findall(r"```[a-z]*\n(.*?)```", path.read_text(), flags=re.S):
            code = re.sub(r"#[^\n]*", "", block)
            found += [(str(path.relative_to(ROOT)), name, params) for name, params in CALL.findall(code)
                      if name in NAMESPACE and re.search(r"(^|,)\s*\*\s*,", params)]
    return found


SIGNATURES = shown_signatures()


def parameters(name: str, params: str) -> list[tuple[str, str, str | None]]:
    """(name, kind, default as source) of the documented parameters."""
    args = ast.parse(f"def {name}({params}): pass").body[0].args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + [ast.unparse(d) for d in args.defaults]
    shown = [(a.arg, "positional", d) for a, d in zip(positional, defaults)]
    return shown + [(a.arg, "keyword", None if d is None else ast.unparse(d))
                    for a, d in zip(args.kwonlyargs, args.kw_defaults)]


def real_parameters(function) -> list[tuple[str, str, str | None]]:
    kinds = {inspect.Parameter.POSITIONAL_ONLY: "positional", inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
             inspect.Parameter.KEYWORD_ONLY: "keyword"}
    return [(p.name, kinds[p.kind], None if p.default is inspect.Parameter.empty else repr(p.default))
            for p in inspect.signature(function).parameters.values() if p.kind in kinds]


def test_the_docs_print_the_signatures_of_the_main_components_and_kernels():
    assert {"SSD", "QCAttention", "InnerFuncAttention", "MLP", "attention", "ssd_scan"} <= {n for _, n, _ in SIGNATURES}


@pytest.mark.parametrize("where, name, params", SIGNATURES, ids=[f"{w}:{n}" for w, n, _ in SIGNATURES])
def test_a_documented_signature_is_the_real_one(where, name, params):
    unquote = lambda rows: [(n, k, None if d is None else d.replace('"', "'")) for n, k, d in rows]  # noqa: E731
    assert unquote(parameters(name, params)) == unquote(real_parameters(NAMESPACE[name])), \
        f"{where} prints {name}({params.strip()}), which is not its signature {inspect.signature(NAMESPACE[name])}"
