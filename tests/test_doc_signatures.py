"""Every signature the docs print — a code block's ``Name(a, *, b=1, ...)`` with a bare ``*`` — is the real one:
the same parameters in the same order, the same keyword-only ones, the same defaults. Two kernel READMEs once
showed ``attention`` and ``ssd_scan`` without the ``document_*`` and ``check_finite`` arguments added later."""

import ast
import inspect
import re
from pathlib import Path

import pytest

import components
import zoo_kernels.attention
import zoo_kernels.retrieval
import zoo_kernels.ssd

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "zoo_kernels").glob("*/README.md"))]


def public_callables(*modules) -> dict:
    return {name: value for module in modules for name, value in vars(module).items()
            if callable(value) and not name.startswith("_")}


NAMESPACE = public_callables(components, zoo_kernels.attention, zoo_kernels.retrieval, zoo_kernels.ssd)
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


def single_default(text: str, real) -> list:
    """The one default a parameter's description gives — ``(default X`` or ``; default X`` (X a literal, or a word
    for a string parameter), else the choice written just before ``(default`` — or none."""
    for pattern in (r"(?:\(|; )default:? ``([^`]*)``", r"(?:\(|; )default:? ([^;,:)`]+)", r"``(\w+)`` \(default"):
        if found := re.search(pattern, text):
            value = found.group(1).strip()
            try:
                return [ast.literal_eval(value)]
            except (ValueError, SyntaxError):
                if re.fullmatch(r"\w+", value) and isinstance(real, str):
                    return [value]
    return []


def documented_defaults() -> list[tuple[str, str, object, object]]:
    """(owner, parameter, the default its docstring's ``Args:`` gives, the real default) for every exported component
    and kernel entry point: ``name: … (default X…)``, ``… ``X`` (default…`` in a list of choices, ``a, b: … (defaults
    X, Y)``, and ``a, b: as :class:`Other``` (then Other's defaults). A default described in words is left out."""
    owners = {**NAMESPACE, **public_callables(components.sequence, components.state)}
    found = []
    for owner, obj in sorted(owners.items()):
        doc = inspect.getdoc(obj) or ""
        section = re.search(r"^Args:\n(.*?)(?:\n\n|\Z)", doc, flags=re.S | re.M)
        if section is None:
            continue
        real = {n: p.default for n, p in inspect.signature(obj).parameters.items()}
        for names, text in re.findall(r"^    ([\w, ]+): (.*?)(?=^    [\w, ]+: |\Z)", section.group(1), flags=re.S | re.M):
            names, text = [n.strip() for n in names.split(",")], " ".join(text.split())
            pairs = []  # (parameter, documented default)
            if other := re.match(r"as :class:`(\w+)`", text):
                theirs = inspect.signature(owners[other.group(1)]).parameters
                pairs += [(n, theirs[n].default) for n in names if n in theirs]
            if many := re.search(r"\(defaults ([^;)]*)", text):
                pairs += zip(names, [ast.literal_eval(v.strip()) for v in many.group(1).split(",")])
            elif len(names) == 1:
                pairs += [(names[0], shown) for shown in single_default(text, real.get(names[0]))]
            found += [(owner, n, shown, real[n]) for n, shown in pairs if n in real]
    return found


def test_every_default_a_docstring_gives_is_the_real_one():
    """A flipped default (``recompute=True``, ``normalize=True``) changes every recipe that leaves it out; the
    docstrings say what each default is, and this holds them to it."""
    checked = documented_defaults()
    wrong = [f"{owner}({name}): the docstring says {shown!r}, the signature {real!r}"
             for owner, name, shown, real in checked if shown != real]
    assert not wrong, "\n".join(wrong)
    owners = {owner for owner, *_ in checked}
    assert len(checked) >= 60 and {"HybridLM", "SSD", "QCAttention", "InnerFuncAttention", "CohesiveMoE", "ExpansiveMoE",
                                   "CDMoE", "RoutedMoE", "MLP", "ssd_scan", "attention"} <= owners, sorted(owners)
