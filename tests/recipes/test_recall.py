"""``python -m recipes.recall`` on made-up sweep records: its counts and exact tests equal hand-computed ones."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from recipes import recall


def record(path, runs):
    """A sweep record holding ``runs``: (recipe, seed, val_loss, val_acc), or (recipe, seed, None, None) for a failure."""
    path.write_text(json.dumps({"family": "mqar_hard", "format": 1, "runs": [
        {"config": f"mqar_hard/{name}.yaml", "folder": f"runs/{name}_{seed}", "log": None, "seed": seed,
         "returncode": 0 if loss is not None else 1,
         "stored": {"result": {"val_loss": loss, "val_acc": acc}} if loss is not None else None}
        for name, seed, loss, acc in runs]}))
    return path


def test_recall_counts_and_loss_ranks_match_hand_computed_exact_tests(tmp_path, capsys):
    first = record(tmp_path / "a.json", [("ifa_d32", 0, 1.0, 0.9), ("ifa_mask_d32", 0, 2.0, 0.8), ("qcattn_d32", 0, 5.0, 0.02),
                                         ("ifa_d64", 0, 4.4, 0.02), ("qcattn_d64", 0, 4.5, 0.02)])
    second = record(tmp_path / "b.json", [("ifa_d32", 1, 3.0, 0.7), ("ifa_mask_d32", 1, 4.0, 0.02), ("qcattn_d32", 1, 6.0, 0.02),
                                          ("qcattn_d32", 2, 7.0, 0.02), ("qcattn_d32", 3, 8.0, 0.02),
                                          ("ifa_d64", 1, None, None)])
    recall.main([str(first), str(second), "--treatment", "ifa", "ifa_mask", "--baseline", "qcattn"])
    out = capsys.readouterr().out
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
                                          if line.startswith(("| d", "| all")))}
    # d32: treatment 3 of 4 recall, baseline 0 of 4: Fisher p = 2 * C(4,3)C(4,0)... = 0.1429; losses 1-4 below 5-8 in
    # all 16 pairs: the exact Mann-Whitney p is 2 / C(8, 4) = 0.0286
    assert rows["d32"][1:6] == ["3 of 4", "0 of 4", "0.14", "16 of 16", "0.029"]
    # d64: one pair, the treatment lower; the failed run is left out and named
    assert rows["d64"][1:5] == ["0 of 1", "0 of 1", "1", "1 of 1"]
    assert rows["all"][1:4] == ["3 of 5", "0 of 5", "0.17"]
    assert "left out: b.json: ifa_d64 seed 1 (no stored result)" in out


def test_a_run_given_twice_or_an_unknown_variant_is_refused_by_name(tmp_path):
    first = record(tmp_path / "a.json", [("ifa_d32", 0, 1.0, 0.9), ("qcattn_d32", 0, 5.0, 0.02)])
    again = record(tmp_path / "b.json", [("ifa_d32", 0, 1.1, 0.9)])
    with pytest.raises(SystemExit):
        recall.main([str(first), str(again), "--treatment", "ifa", "--baseline", "qcattn"])
    with pytest.raises(ValueError, match=r"ifa_d32 seed 0 has results in both a.json and b.json"):
        recall.read_runs([first, again])
    with pytest.raises(SystemExit):
        recall.main([str(first), "--treatment", "ifa", "--baseline", "cattn"])
    with pytest.raises(SystemExit):
        recall.main([str(tmp_path / "missing.json"), "--treatment", "ifa", "--baseline", "qcattn"])


def test_a_width_one_kind_lacks_has_no_test_and_stays_out_of_the_pooled_row(tmp_path, capsys):
    path = record(tmp_path / "a.json", [("ifa_d32", 0, 1.0, 0.9), ("qcattn_d32", 0, 5.0, 0.02),
                                        ("ifa_d64", 0, 1.0, 0.9), ("ifa_d64", 1, 1.2, 0.8)])
    recall.main([str(path), "--treatment", "ifa", "--baseline", "qcattn"])
    out = capsys.readouterr().out
    assert "| d64 | 2 of 2 | 0 of 0 | - | - | - (no baseline runs at this width) |" in out
    assert "nan" not in out
    assert "| all | 1 of 1 | 0 of 1 | 1 | - | - |" in out  # d32 alone: d64's two recalls have nothing to face


BOTH = ["--treatment", "ifa", "--baseline", "qcattn"]


@pytest.mark.parametrize("argv, named", [
    ([*BOTH, "--threshold", "1"], "--threshold 1.0: an accuracy, in [0, 1)"),
    ([*BOTH, "--threshold", "-0.1"], "--threshold -0.1: an accuracy, in [0, 1)"),
    ([*BOTH, "--baseline", "ifa"], "--baseline ifa is also a --treatment variant"),
    (["--baseline", "qcattn"], "the following arguments are required: --treatment"),
    (["--treatment", "ifa"], "the following arguments are required: --baseline"),
    (["--treatment", "ifa", "--baseline", "cattn"], "no runs of cattn in these records; they hold ifa, qcattn"),
])
def test_a_bad_option_a_missing_flag_or_an_unknown_variant_is_named(tmp_path, capsys, argv, named):
    path = record(tmp_path / "a.json", [("ifa_d32", 0, 1.0, 0.9), ("qcattn_d32", 0, 5.0, 0.02)])
    with pytest.raises(SystemExit):
        recall.main([str(path), *argv])
    assert named in capsys.readouterr().err


def test_ties_count_half_and_an_accuracy_at_the_threshold_does_not_recall(tmp_path, capsys):
    path = record(tmp_path / "a.json", [("ifa_d32", 0, 1.0, 0.5), ("ifa_d32", 1, 2.0, 0.9),
                                        ("qcattn_d32", 0, 2.0, 0.5), ("qcattn_d32", 1, 3.0, 0.02)])
    recall.main([str(path), "--treatment", "ifa", "--baseline", "qcattn"])
    out = capsys.readouterr().out
    # losses 1, 2 against 2, 3: 1 < 2, 1 < 3, 2 = 2 (a half), 2 < 3; val_acc 0.5 is not above 0.5
    assert "| d32 | 1 of 2 | 0 of 2 | 1 | 3.5 of 4 |" in out
    recall.main([str(path), "--treatment", "ifa", "--baseline", "qcattn", "--threshold", "0"])
    assert "| d32 | 2 of 2 | 2 of 2 |" in capsys.readouterr().out  # --threshold 0: every run with an accuracy above 0


def test_a_recipe_not_named_variant_and_width_is_left_out_by_name(tmp_path, capsys):
    path = record(tmp_path / "a.json", [("ifa_d32", 0, 1.0, 0.9), ("qcattn_d32", 0, 5.0, 0.02), ("ifa_wide", 0, 1.0, 0.9)])
    recall.main([str(path), "--treatment", "ifa", "--baseline", "qcattn"])
    out = capsys.readouterr().out
    assert "left out: a.json: ifa_wide (not <variant>_d<width>)" in out and "| d32 | 1 of 1 | 0 of 1 |" in out


def test_a_kind_without_runs_has_no_test_statistic():
    base = [{"val_loss": 1.0, "val_acc": 0.9}]
    table = recall.recall_table([], base, 0.5)
    assert math.isnan(table["p"]) and table["base"] == (1, 1)
    for treated, baseline in (([], base), (base, [])):
        ranks = recall.loss_ranks(treated, baseline)
        assert ranks["pairs"] == 0 and math.isnan(ranks["below"]) and math.isnan(ranks["p"])


def test_a_missing_record_or_a_run_given_twice_is_named(tmp_path, capsys):
    first = record(tmp_path / "a.json", [("ifa_d32", 0, 1.0, 0.9), ("qcattn_d32", 0, 5.0, 0.02)])
    with pytest.raises(SystemExit):
        recall.main([str(first), str(tmp_path / "missing.json"), "--treatment", "ifa", "--baseline", "qcattn"])
    assert f"no such record: {tmp_path / 'missing.json'}" in capsys.readouterr().err
    again = record(tmp_path / "b.json", [("ifa_d32", 0, 1.1, 0.9)])
    with pytest.raises(SystemExit):
        recall.main([str(first), str(again), "--treatment", "ifa", "--baseline", "qcattn"])
    assert "ifa_d32 seed 0 has results in both a.json and b.json" in capsys.readouterr().err


def test_the_module_runs_as_a_command(tmp_path):
    path = record(tmp_path / "a.json", [("ifa_d32", 0, 1.0, 0.9), ("qcattn_d32", 0, 5.0, 0.02)])
    done = subprocess.run([sys.executable, "-m", "recipes.recall", str(path), "--treatment", "ifa", "--baseline", "qcattn"],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert "| d32 | 1 of 1 | 0 of 1 | 1 | 1 of 1 | 1 |" in done.stdout


def test_records_of_one_recipe_under_other_settings_are_not_pooled(tmp_path, capsys):
    """The checks a sweep's pooled table makes: runs of ``ifa_d32`` with another learning rate are not its seeds."""
    first = record(tmp_path / "a.json", [("ifa_d32", 0, 1.0, 0.9), ("qcattn_d32", 0, 5.0, 0.02)])
    other = record(tmp_path / "b.json", [("ifa_d32", 1, 1.1, 0.9)])
    for path, lr in ((first, 0.002), (other, 0.01)):
        kept = json.loads(path.read_text())
        for run in kept["runs"]:
            run["stored"].update(hparams={"lr": lr, "compile": lr == 0.01}, result={**run["stored"]["result"], "steps": 9})
        path.write_text(json.dumps(kept))
    with pytest.raises(SystemExit):
        recall.main([str(first), str(other), "--treatment", "ifa", "--baseline", "qcattn"])
    assert "error: ifa_d32's runs differ in lr: 0.002 in a.json, 0.01 in b.json" in capsys.readouterr().err


def test_pooled_records_that_ran_other_code_or_read_other_data_are_named_under_the_table(tmp_path, capsys):
    """Seeds added later on other code pool, with a note; a corpus made again while a sweep ran is named too (across
    records, other data is refused, as in test_records_of_one_recipe_under_other_settings_are_not_pooled)."""
    first = record(tmp_path / "a.json", [("ifa_d32", 0, 1.0, 0.9), ("ifa_d32", 2, 1.2, 0.9), ("qcattn_d32", 0, 5.0, 0.02)])
    other = record(tmp_path / "b.json", [("ifa_d32", 1, 1.1, 0.9), ("qcattn_d32", 1, 5.1, 0.02)])
    recall.main([str(first), str(other), "--treatment", "ifa", "--baseline", "qcattn"])
    assert "note:" not in capsys.readouterr().out  # (neither recorded its code: nothing to compare)
    for path, commit in ((first, "1" * 40), (other, "2" * 40)):
        kept = json.loads(path.read_text())
        for run in kept["runs"]:
            data = ("b" if run["seed"] == 2 else "a") * 16  # (seed 2 read the corpus made again)
            run["stored"]["code"] = [{"step": 0, "commit": commit, "edits": None, "torch": "2.13", "data": data}]
        path.write_text(json.dumps(kept))
    recall.main([str(first), str(other), "--treatment", "ifa", "--baseline", "qcattn"])
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    assert notes == [
        "note: runs of one recipe read other data (the data's content hash differs), so they are not seeds of one "
        "experiment: ifa_d32 seeds 0-1 read aaaaaaaa, ifa_d32 seed 2 read bbbbbbbb",
        "note: the runs come from 2 versions of the code (a commit, +edits: uncommitted changes by hash, the torch that "
        "ran them), which may not compute the same: 1111111, torch 2.13: ifa_d32 seeds 0, 2, qcattn_d32 seed 0; "
        "2222222, torch 2.13: ifa_d32 seed 1, qcattn_d32 seed 1"]
