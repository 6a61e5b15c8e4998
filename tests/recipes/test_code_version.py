"""Which code a run ran (recipes.code_version): the commit and a hash of uncommitted edits, recorded by every fit,
kept by a sweep's record, and named under a table whose runs ran different code."""

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from recipes.checkpoints import load_checkpoint
from recipes.code_version import code_label, code_version, read_code, record_code, resume_note
from recipes.sweep import records
from recipes.sweep.records import Run, code_note, data_note, seeds_named, stored_numbers

sys.path.insert(0, str(Path(__file__).parent))
from test_training import TEXT, fit_here  # noqa: E402


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()


def checkout(root: Path) -> Path:
    """A git checkout laid out as this project is (recipes/, components/, recipes/configs/, docs/), committed."""
    for name, text in (("recipes/__init__.py", ""), ("components/mixer.py", "WIDTH = 1\n"),
                       ("recipes/configs/a.yaml", "model: {}\n"), ("docs/notes.md", "notes\n"),
                       ("zoo_kernels/ssd/README.md", "math\n")):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    return root


def test_the_code_version_is_the_commit_and_a_hash_of_the_uncommitted_code_edits(tmp_path):
    root = checkout(tmp_path / "repo")
    clean = code_version(root)
    assert clean["commit"] == git(root, "rev-parse", "HEAD") and clean["edits"] is None
    assert clean["torch"] == metadata.version("torch") and clean["python"] == ".".join(map(str, sys.version_info[:3]))
    (root / "components/mixer.py").write_text("WIDTH = 2\n")
    first = code_version(root)["edits"]
    (root / "components/mixer.py").write_text("WIDTH = 3\n")
    second = code_version(root)["edits"]
    assert len(first) == 16 and first != second and code_version(root)["commit"] == clean["commit"]
    (root / "components/mixer.py").write_text("WIDTH = 1\n")
    assert code_version(root)["edits"] is None  # put back: the commit's code again
    (root / "docs/notes.md").write_text("more notes\n")
    (root / "recipes/configs/a.yaml").write_text("model: {d_model: 8}\n")  # (a recipe: the run's settings, not code)
    (root / "recipes/configs/b.yaml").write_text("model: {}\n")
    (root / "zoo_kernels/ssd/README.md").write_text("more math\n")  # (an op's notes)
    (root / "components/words.txt").write_text("a list\n")
    assert code_version(root)["edits"] is None
    (root / "zoo_kernels/ssd/triton.py").write_text("KERNEL = 1\n")  # (nested: a new op's kernel)
    nested = code_version(root)["edits"]
    (root / "zoo_kernels/ssd/triton.py").unlink()
    assert nested is not None and code_version(root)["edits"] is None
    (root / "components/new_mixer.py").write_text("A = 1\n")  # a new, untracked module is code too
    added = code_version(root)["edits"]
    (root / "components/new_mixer.py").write_text("A = 2\n")
    assert added is not None and code_version(root)["edits"] not in (None, added)
    plain = tmp_path / "plain"  # not a checkout (an installed copy)
    (plain / "recipes").mkdir(parents=True)
    assert (code_version(plain)["commit"], code_version(plain)["edits"]) == (None, None)
    other = tmp_path / "repo" / "site"  # inside someone's checkout, untracked there: not its commit
    (other / "recipes").mkdir(parents=True)
    (other / "recipes/__init__.py").write_text("")
    assert code_version(other)["commit"] is None


def test_a_label_names_the_commit_the_edits_and_torch_and_each_part_of_a_resumed_run():
    base = {"commit": "1a2b3c4d5e6f", "edits": None, "torch": "2.13.0", "python": "3.11.7"}
    assert code_label([{"step": 0, **base}]) == "1a2b3c4, torch 2.13.0"
    edited = {**base, "edits": "9f8e7d6c5b4a3210"}
    assert code_label([{"step": 0, **edited}]) == "1a2b3c4+edits 9f8e7d6c, torch 2.13.0"
    assert code_label([{"step": 0, **base}, {"step": 40, **edited}]) == (
        "1a2b3c4, torch 2.13.0 (from step 0) then 1a2b3c4+edits 9f8e7d6c, torch 2.13.0 (from step 40)")
    assert code_label([{"step": 0, **base, "commit": None}]) == "no git checkout, torch 2.13.0"


def test_a_fit_records_its_code_and_a_resume_on_other_code_adds_an_entry_from_its_step(tmp_path, monkeypatch, capsys):
    import recipes.training as training
    from recipes.data.text import TextCorpus

    quiet = ["--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "2", "--trainer.log_every_n_steps",
             "1", "--trainer.val_check_interval", "2"]
    fit_here(tmp_path, *TEXT, *quiet, "--trainer.max_steps", "2")
    folder = tmp_path / "runs" / "quickstart" / "version_0"
    now = {**code_version(), "data": TextCorpus(seq_len=32, batch_size=8).data_fingerprint()}  # (and what it read)
    assert read_code(folder) == [{"step": 0, **now}]
    assert f"\n  code       {code_label([now])}\n" in capsys.readouterr().out  # (in the summary the run ends with)
    fit_here(tmp_path, *TEXT, *quiet, "--trainer.max_steps", "4", "--ckpt_path", "last")  # the same code: no entry
    assert read_code(folder) == [{"step": 0, **now}]
    assert "on other code or data" not in capsys.readouterr().err
    other = {key: value for key, value in now.items() if key != "data"}
    monkeypatch.setattr(training, "code_version", lambda root=None: {**other, "commit": "f" * 40, "edits": None})
    fit_here(tmp_path, *TEXT, *quiet, "--trainer.max_steps", "6", "--ckpt_path", "last")
    entries = read_code(folder)
    assert entries == [{"step": 0, **now}, {"step": 4, **now, "commit": "f" * 40, "edits": None}]
    said = capsys.readouterr()
    assert "\n  code       ffffff" in said.out  # (the code that trained the last steps)
    assert (f"note: this run resumes at step 4 on other code or data than it trained on until then: commit "
            f"{str(now['commit'])[:8]} → ffffffff") in said.err
    assert stored_numbers(Run(Path("quickstart.yaml"), folder))["code"] == entries  # (a sweep's record keeps it)
    assert load_checkpoint(folder / "checkpoints" / "last.ckpt")["code"] == entries  # (and each checkpoint)
    (folder / "code.json").write_text("{not json")  # damaged: a resume says which file, rather than drop its history
    with pytest.raises(SystemExit, match="^error: runs/quickstart/version_0/code.json: not a run's code record"):
        fit_here(tmp_path, *TEXT, *quiet, "--trainer.max_steps", "8", "--ckpt_path", "last")


def test_a_resume_note_names_each_value_that_changed():
    before = {"step": 0, "commit": "1a2b3c4d5e", "edits": None, "data": "aaaa1111bbbb", "python": "3.11.7",
              "torch": "2.12.0", "lightning": "2.6.6", "triton": None}
    assert resume_note(before, {**before, "step": 40}) is None
    assert resume_note(before, {**before, "step": 40, "edits": "9f8e7d6c5b4a", "data": "cccc2222dddd",
                                "torch": "2.13.0"}) == (
        "note: this run resumes at step 40 on other code or data than it trained on until then: edits None → 9f8e7d6c; "
        "data aaaa1111 → cccc2222; torch 2.12.0 → 2.13.0 (its code.json keeps both: its result is not that of one "
        "version)")


def test_record_code_appends_only_what_differs_from_the_last_entry(tmp_path):
    one, two = {"commit": "a" * 40, "edits": None}, {"commit": "b" * 40, "edits": None}
    assert record_code(tmp_path, 0, one) == [{"step": 0, **one}]
    assert record_code(tmp_path, 5, one) == [{"step": 0, **one}]
    assert record_code(tmp_path, 9, two) == [{"step": 0, **one}, {"step": 9, **two}]
    assert record_code(tmp_path, 12, one)[-1] == {"step": 12, **one}  # (back to the first: its own entry)
    assert json.loads((tmp_path / "code.json").read_text()) == read_code(tmp_path)


def test_a_table_of_runs_from_several_versions_of_the_code_says_which_ran_which(tmp_path):
    def run(name: str, seed, code, returncode: int = 0) -> Run:
        stored = {"result": {}} if code is None else {"result": {}, "code": code}
        return Run(Path(f"{name}.yaml"), tmp_path / f"{name}{seed}", returncode, seed=seed, stored=stored)

    old = [{"step": 0, "commit": "1a2b3c4d", "edits": None, "torch": "2.12.0"}]
    new = [{"step": 0, "commit": "5e6f7a8b", "edits": "0123456789abcdef", "torch": "2.13.0"}]
    same = [run("a", 0, old), run("a", 1, old), run("b", 0, old)]
    assert code_note(same) is None
    assert code_note(same + [run("b", 1, new, returncode=1)]) is None  # (a failed run is not in the cells)
    note = code_note(same + [run("a", 2, new), run("a", 3, new), run("b", 7, None)])
    assert note == ("the runs come from 3 versions of the code (a commit, +edits: uncommitted changes by hash, the "
                    "torch that ran them), which may not compute the same: 1a2b3c4, torch 2.12.0: a seeds 0-1, b seed 0; "
                    "5e6f7a8+edits 01234567, torch 2.13.0: a seeds 2-3; not recorded (runs from before 2026-12-04 did "
                    "not record their code): b seed 7")


def test_a_table_whose_runs_of_one_recipe_read_other_data_says_which_read_which(tmp_path):
    """A corpus made again while a sweep ran: its later seeds read other tokens than its first, under one recipe."""
    def run(name: str, seed: int, data: str | None, returncode: int = 0) -> Run:
        code = [{"step": 0, "commit": "1a2b3c4d", "edits": None, "torch": "2.13.0", "data": data}]
        return Run(Path(f"{name}.yaml"), tmp_path / f"{name}{seed}", returncode, seed=seed,
                   stored={"result": {}, "code": code})

    alike = [run("a", 0, "aaaa1111bbbb2222"), run("a", 1, "aaaa1111bbbb2222"), run("b", 0, "cccc3333dddd4444")]
    assert data_note(alike) is None  # (two recipes over two corpora: that is the comparison)
    assert data_note(alike + [run("a", 2, None), run("a", 3, "ffff", returncode=1)]) is None  # (none, or failed)
    assert data_note(alike + [run("a", 2, "eeee5555ffff6666"), run("a", 3, "eeee5555ffff6666")]) == (
        "runs of one recipe read other data (the data's content hash differs), so they are not seeds of one "
        "experiment: a seeds 0-1 read aaaa1111, a seeds 2-3 read eeee5555")


def test_a_damaged_code_record_is_named_under_the_table_and_stops_nothing(tmp_path, monkeypatch):
    """A run folder whose ``code.json`` cannot be read (a disk that filled mid-write, a hand edit): the table's code
    note names it as unreadable, the data note and the pooling check pass it by, its record keeps no code."""
    def run(name: str, seed: int, text: str) -> Run:
        folder = tmp_path / f"{name}{seed}"
        folder.mkdir()
        (folder / "code.json").write_text(text)
        return Run(Path(f"{name}.yaml"), folder, 0, seed=seed)

    good = json.dumps([{"step": 0, "commit": "1a2b3c4d", "edits": None, "torch": "2.13.0", "data": "aaaa1111"}])
    runs = [run("a", 0, good), run("a", 1, good), run("a", 2, "[{\"step\": 0, \"commit")]
    assert code_note(runs[:2]) is None
    note = code_note(runs)  # (the JSON error's own words are the json module's)
    assert note.startswith(
        "the runs come from 2 versions of the code (a commit, +edits: uncommitted changes by hash, the torch that ran "
        "them), which may not compute the same: 1a2b3c4, torch 2.13.0: a seeds 0-1; unreadable "
        f"({tmp_path}/a2/code.json: not a run's code record (Unterminated string") and note.endswith(")): a seed 2")
    assert data_note(runs) is None
    monkeypatch.setattr(records, "run_hparams", lambda run: {"d_model": 8})
    monkeypatch.setattr(records, "run_result", lambda run: {"val_loss": 1.0})
    monkeypatch.setattr(records, "run_curve", lambda run: {10: 1.0})
    assert records.settings_of(runs[0], {"steps": 10})["the data's content hash"] == "aaaa1111"
    assert records.settings_of(runs[2], {"steps": 10}) == {"d_model": 8, "steps": 10}  # (pooled without a hash)
    assert stored_numbers(runs[0])["code"] == json.loads(good) and "code" not in stored_numbers(runs[2])


@pytest.mark.parametrize("seeds, named", [([0, 1, 2, 4], "a seeds 0-2, 4"), ([3], "a seed 3"), ([None], "a"),
                                          ([None, None], "a (2 runs)"), ([5, None], "a seeds 5, unseeded")])
def test_seeds_are_named_in_ranges(seeds, named):
    assert seeds_named("a", seeds) == named


def test_a_code_record_that_is_not_one_is_named():
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        for text in ("{not json", '{"commit": "1a2b"}', "[1, 2]"):
            (Path(folder) / "code.json").write_text(text)
            with pytest.raises(ValueError, match=f"{folder}/code.json: not a run's code record"):
                read_code(Path(folder))
