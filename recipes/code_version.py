"""Which code a run ran: its git commit, a hash of the uncommitted edits, and the versions of the libraries that
compute. Each fit appends it, with its data's fingerprint, to its run folder's ``code.json`` (a resumed run a new
entry where either changed; ``recipes.training.RunConfigCallback``), a sweep's record keeps it, and a table whose runs come from more than one version says so under it: runs of one
recipe made a week apart, or a sweep whose later runs started after a ``git pull``, may not compute the same."""

import hashlib
import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path

CODE_FILE = "code.json"
SOURCE_ROOT = Path(__file__).resolve().parents[1]  # (the folder that holds recipes/, components/, zoo_kernels/)
SOURCES = tuple(f"{folder}/*.py" for folder in ("components", "recipes", "zoo_kernels"))  # (git's * spans folders)
LIBRARIES = ("torch", "lightning", "triton")


def git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=30, check=False)


def code_version(root: Path = SOURCE_ROOT) -> dict:
    """``{"commit", "edits", "python", "torch", "lightning", "triton"}``: the git commit the code in ``root`` is
    checked out at (None where it is not a git checkout of this project: an installed copy, or no git), and 16 hex
    digits of the SHA-256 of its uncommitted changes to the code (the Python files under components/, recipes/ and
    zoo_kernels/: the tracked ones' diff against the commit, and the untracked ones; recipes, notes and data are not
    code; None: no change); a library that is not installed is None."""
    commit = edits = None
    try:
        ours = git(root, "ls-files", "--error-unmatch", "--", "recipes/__init__.py").returncode == 0
        head = git(root, "rev-parse", "HEAD") if ours else None
        if head is not None and head.returncode == 0:
            commit = head.stdout.decode().strip()
            changed = git(root, "diff", "HEAD", "--no-ext-diff", "--binary", "--", *SOURCES).stdout
            untracked = git(root, "ls-files", "-z", "--others", "--exclude-standard", "--", *SOURCES).stdout
            if changed or untracked:
                digest = hashlib.sha256(changed)
                for name in sorted(filter(None, untracked.split(b"\0"))):
                    path = root / name.decode()
                    digest.update(b"\0" + name + b"\0" + (path.read_bytes() if path.is_file() else b""))
                edits = digest.hexdigest()[:16]
    except (OSError, subprocess.SubprocessError):  # (no git on the PATH, or one that hangs)
        commit = edits = None
    return {"commit": commit, "edits": edits, "python": platform.python_version(),
            **{name: installed(name) for name in LIBRARIES}}


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def record_code(folder: Path, step: int, version: dict | None = None) -> list[dict]:
    """Append the running code's version (``version``, default :func:`code_version`), from training step ``step``
    on, to ``folder/code.json`` where it differs from the last entry there (a resumed run on the same code adds
    none); returns the entries."""
    path = Path(folder) / CODE_FILE
    entries = read_code(folder) or []
    version = code_version() if version is None else version
    if not entries or {k: v for k, v in entries[-1].items() if k != "step"} != version:
        entries.append({"step": step, **version})
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(entries, indent=1))
        temporary.replace(path)
    return entries


def read_code(folder: Path) -> list[dict] | None:
    """The entries of ``folder/code.json``, or None where the run recorded none (a run from before runs did); a file
    that is not such a list is a ValueError naming it."""
    path = Path(folder) / CODE_FILE
    if not path.is_file():
        return None
    try:
        entries = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not a run's code record ({error})") from None
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise ValueError(f"{path}: not a run's code record (a list of entries, one per code a run trained with)")
    return entries


def code_label(entries: list[dict]) -> str:
    """A run's code in a few words: ``1a2b3c4`` (its commit), ``+edits 9f8e7d6c`` (uncommitted changes, by hash),
    the torch it ran; a resumed run on other code gives each, from the step it took over."""
    def one(entry: dict) -> str:
        commit = entry.get("commit")
        where = commit[:7] if commit else "no git checkout"
        edits = f"+edits {entry['edits'][:8]}" if entry.get("edits") else ""
        return f"{where}{edits}, torch {entry.get('torch')}"

    if len(entries) == 1:
        return one(entries[0])
    return " then ".join(f"{one(entry)} (from step {entry.get('step')})" for entry in entries)


def resume_note(before: dict, now: dict) -> str | None:
    """What a resumed run changes at step ``now["step"]``: the entries' values that differ (commit, edits, data,
    library versions), each ``old → new``; None where nothing does."""
    def short(key: str, value) -> str:
        return str(value)[:8] if key in ("commit", "edits", "data") and value else str(value)

    changed = [f"{key} {short(key, before.get(key))} → {short(key, now.get(key))}"
               for key in ("commit", "edits", "data", "python", *LIBRARIES) if before.get(key) != now.get(key)]
    if not changed:
        return None
    return (f"note: this run resumes at step {now.get('step')} on other code or data than it trained on until then: "
            f"{'; '.join(changed)} (its code.json keeps both: its result is not that of one version)")
