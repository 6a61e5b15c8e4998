"""``python -m recipes.recall`` on made-up sweep records: its counts and exact tests equal hand-computed ones."""

import json

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


@pytest.mark.parametrize("options, named", [
    (["--threshold", "1"], "--threshold 1.0: an accuracy, in [0, 1)"),
    (["--threshold", "-0.1"], "--threshold -0.1: an accuracy, in [0, 1)"),
    (["--baseline", "ifa"], "--baseline ifa is also a --treatment variant"),
])
def test_a_threshold_outside_accuracies_or_a_baseline_among_the_treatments_is_refused(tmp_path, capsys, options, named):
    path = record(tmp_path / "a.json", [("ifa_d32", 0, 1.0, 0.9), ("qcattn_d32", 0, 5.0, 0.02)])
    with pytest.raises(SystemExit):
        recall.main([str(path), "--treatment", "ifa", "--baseline", "qcattn", *options])
    assert named in capsys.readouterr().err
