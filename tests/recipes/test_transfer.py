"""``python -m recipes.transfer`` joins a transfer family's three stages by model and seed, and refuses a join that
does not hold. (The end-to-end run over real sweeps is in test_sweep.py's fine-tuning test.)"""

import json
import statistics
from pathlib import Path

import pytest
from scipy import stats as scipy_stats

from recipes.stats import detectable_effect
from recipes.transfer import main

# Final validation losses by model and seed: (pre-training, fine-tuned, from scratch). otce_attention's control
# seed 2 failed, so its gain comes from seeds 0 and 1 only.
LOSSES = {
    "jamba": [(4.50, 5.20, 6.10), (4.52, 5.22, 6.15), (4.54, 5.21, 6.12)],
    "otce_attention": [(4.49, 5.18, 6.10), (4.50, 5.19, 6.14), (4.52, 5.20, None)],
    "otce_expresser": [(4.80, 5.45, 6.20), (4.85, 5.50, 6.22), (4.83, 5.48, 6.21)],
}


def write_records(tmp_path, losses=LOSSES, wrong_seed=False, control_from=None) -> dict[str, str]:
    """One record per stage, as a sweep of the bundled english/transfer recipes would write it."""
    paths = {}
    for index, stage in enumerate(("pretrain", "finetune", "control")):
        runs = []
        for name, seeds in losses.items():
            for seed, values in enumerate(seeds):
                folder = f"/elsewhere/runs/{stage}/{name}_seed{seed}"
                source = f"/elsewhere/runs/pretrain/{name}_seed{(seed + 1) % 3 if wrong_seed else seed}"
                init = {"pretrain": None, "finetune": f"{source}/checkpoints/last.ckpt", "control": control_from}[stage]
                loss = values[index]
                runs.append({"config": f"english/transfer/{'pretrain' if stage == 'pretrain' else 'finetune'}/{name}.yaml",
                             "folder": folder, "returncode": 0 if loss is not None else 1, "log": f"{folder}.log",
                             "seed": seed, "init_from": init,
                             **({} if loss is None else {"stored": {"result": {"val_loss": loss}, "hparams": {},
                                                                    "curves": {"val/loss": [[99, loss + 0.5],
                                                                                            [299, loss]]}}})})
        paths[stage] = tmp_path / f"{stage}.json"
        paths[stage].write_text(json.dumps({"family": stage, "format": 1, "runs": runs}))
    return {stage: str(path) for stage, path in paths.items()}


def rows(text: str) -> dict[str, list[str]]:
    return {cells[0]: cells for cells in ([c.strip() for c in line.split("|")[1:-1]]
                                          for line in text.splitlines() if line.startswith("| ") and "---" not in line)}


def test_each_cell_over_seeds_the_gain_paired_by_seed_and_holm_over_the_models(tmp_path, capsys):
    paths = write_records(tmp_path)
    main(["--pretrain", paths["pretrain"], "--finetune", paths["finetune"], "--control", paths["control"],
          "--out", str(tmp_path / "table.md")])
    text = capsys.readouterr().out
    assert (tmp_path / "table.md").read_text() == text
    table = rows(text)
    column = lambda name, i: [v[i] for v in LOSSES[name] if v[i] is not None]  # noqa: E731
    gain = {name: [v[2] - v[1] for v in LOSSES[name] if v[2] is not None] for name in LOSSES}
    assert gain["otce_attention"] == pytest.approx([0.92, 0.95])  # not 6.12 - 5.19: seed 2 has no control
    for name in LOSSES:  # jamba is the fine-tuning family's baseline (its _family.yaml)
        for index, values in ((2, column(name, 0)), (3, column(name, 1)), (5, column(name, 2)), (6, gain[name])):
            expected = f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}"
            if name != "jamba":
                reference = {2: column("jamba", 0), 3: column("jamba", 1), 5: column("jamba", 2), 6: gain["jamba"]}
                expected += f" ({statistics.fmean(values) - statistics.fmean(reference[index]):+.4f})"
            assert table[name][index] == expected, (name, index)
    assert table["jamba"][4] == table["jamba"][7] == "(baseline)"
    for index, values in ((4, lambda name: column(name, 1)), (7, lambda name: gain[name])):
        raw = {name: scipy_stats.ttest_ind(values(name), values("jamba"), equal_var=False).pvalue
               for name in ("otce_attention", "otce_expresser")}
        low, high = sorted(raw, key=raw.get)  # Holm over two: the smaller ×2, the larger no lower than that
        adjusted = {low: min(1, 2 * raw[low]), high: max(min(1, 2 * raw[low]), raw[high])}
        for name in raw:
            detectable = detectable_effect(statistics.stdev(values(name)), len(values(name)),
                                           statistics.stdev(values("jamba")), len(values("jamba")))
            assert table[name][index] == f"{raw[name]:.3g} / {adjusted[name]:.3g} ({detectable:.3f})", (name, index)
    assert "- control otce_attention seed 2 FAILED (exit 1" in text


def test_one_seed_gives_values_without_spread_or_tests(tmp_path, capsys):
    paths = write_records(tmp_path, {name: seeds[:1] for name, seeds in LOSSES.items()})
    main(["--pretrain", paths["pretrain"], "--finetune", paths["finetune"], "--control", paths["control"],
          "--baseline", "otce_attention"])
    table = rows(capsys.readouterr().out)
    assert table["jamba"][1] == "0" and table["jamba"][3] == "5.2000 (+0.0200)" and table["jamba"][4] == "< 2 runs"
    assert table["jamba"][6] == "0.9000 (-0.0200)"


def test_only_some_models_holm_over_their_comparisons_alone(tmp_path, capsys):
    paths = write_records(tmp_path)
    main(["--pretrain", paths["pretrain"], "--finetune", paths["finetune"], "--control", paths["control"],
          "--only", "jamba", "otce_expresser"])
    text = capsys.readouterr().out
    table = rows(text)
    assert set(table) == {"model", "jamba", "otce_expresser"} and "otce_attention" not in text
    finetuned = lambda name: [v[1] for v in LOSSES[name]]  # noqa: E731
    raw = scipy_stats.ttest_ind(finetuned("otce_expresser"), finetuned("jamba"), equal_var=False).pvalue
    assert table["otce_expresser"][4].startswith(f"{raw:.3g} / {raw:.3g} (")  # one comparison: Holm leaves it
    with pytest.raises(SystemExit, match=r"--only names \['mamba'\], not models of these sweeps"):
        main(["--pretrain", paths["pretrain"], "--finetune", paths["finetune"], "--control", paths["control"],
              "--only", "mamba"])


def test_a_model_whose_every_control_failed_has_empty_cells_and_a_missing_stage_is_named(tmp_path, capsys):
    losses = {**LOSSES, "otce_expresser": [(p, f, None) for p, f, _ in LOSSES["otce_expresser"]]}
    paths = write_records(tmp_path, losses)
    main(["--pretrain", paths["pretrain"], "--finetune", paths["finetune"], "--control", paths["control"]])
    table = rows(capsys.readouterr().out)
    assert table["otce_expresser"][5] == table["otce_expresser"][6] == "-"  # no control run: no loss, no gain
    assert table["otce_expresser"][7] == "< 2 runs" and table["otce_expresser"][3].startswith("5.4767 ± ")
    with pytest.raises(SystemExit):
        main(["--pretrain", paths["pretrain"], "--finetune", paths["finetune"]])
    assert "the following arguments are required: --control" in capsys.readouterr().err


@pytest.mark.parametrize("change, problem", [
    ({"wrong_seed": True}, "finetune jamba seed 0 started from /elsewhere/runs/pretrain/jamba_seed1/checkpoints/"
                           "last.ckpt, not from the last checkpoint of a --pretrain run of jamba seed 0"),
    ({"control_from": "/x/last.ckpt"}, "control jamba seed 0 started from /x/last.ckpt: a control trains from scratch"),
])
def test_a_join_that_does_not_hold_is_refused_by_name(tmp_path, change, problem):
    paths = write_records(tmp_path, **change)
    with pytest.raises(SystemExit, match=f"error: .*{problem}"):
        main(["--pretrain", paths["pretrain"], "--finetune", paths["finetune"], "--control", paths["control"]])


def test_a_stage_given_twice_an_unknown_baseline_and_a_missing_record_are_refused(tmp_path):
    paths = write_records(tmp_path)
    with pytest.raises(SystemExit, match="control jamba seed 0 is given twice"):
        main(["--pretrain", paths["pretrain"], "--finetune", paths["finetune"],
              "--control", paths["control"], paths["control"]])
    with pytest.raises(SystemExit, match="control jamba seed 0 is a recipe of .*english/transfer/pretrain, not of the "
                                         "fine-tuning family"):  # pre-training runs (from scratch too) as the control
        main(["--pretrain", paths["pretrain"], "--finetune", paths["finetune"], "--control", paths["pretrain"]])
    with pytest.raises(SystemExit, match="--baseline 'mamba' is not one of the models"):
        main(["--pretrain", paths["pretrain"], "--finetune", paths["finetune"], "--control", paths["control"],
              "--baseline", "mamba"])
    with pytest.raises(SystemExit, match="nowhere.json"):
        main(["--pretrain", str(tmp_path / "nowhere.json"), "--finetune", paths["finetune"],
              "--control", paths["control"]])
    # a stage's sweeps pool as seeds, checked as a pooled sweep table checks them: not one model under other settings
    control = json.loads(open(paths["control"]).read())
    for run in control["runs"]:
        run.get("stored", {}).get("hparams", {}).update(lr=0.002)
    open(paths["control"], "w").write(json.dumps(control))
    more = dict(control, runs=[dict(control["runs"][0], seed=3, stored={**control["runs"][0]["stored"],
                                                                        "hparams": {"lr": 0.01}})])
    (tmp_path / "more.json").write_text(json.dumps(more))
    with pytest.raises(SystemExit, match=r"error: --control: jamba's runs differ in lr: 0.002 in .*control.json, 0.01 in "
                                         r".*more.json"):
        main(["--pretrain", paths["pretrain"], "--finetune", paths["finetune"], "--control", paths["control"],
              str(tmp_path / "more.json")])


def test_the_curves_on_the_held_out_domain_average_each_stage_over_its_finished_runs(tmp_path):
    from recipes.sweep.records import read_manifest
    from recipes.transfer import transfer_curves

    paths = write_records(tmp_path)
    stages = {stage: read_manifest(paths[stage])[1] for stage in ("pretrain", "finetune", "control")}
    curves = transfer_curves(stages, ["jamba", "otce_attention"])
    assert set(curves) == {(name, stage) for name in ("jamba", "otce_attention") for stage in ("finetune", "control")}
    for name, stage, index in (("jamba", "finetune", 1), ("otce_attention", "control", 2)):
        values = [v[index] for v in LOSSES[name] if v[index] is not None]  # the failed control run is left out
        steps, mean, _, n = curves[name, stage]
        assert steps == [100, 300] and n  # steps done, as in the tables == len(values)
        assert mean == pytest.approx([statistics.fmean(values) + 0.5, statistics.fmean(values)])
    main(["--pretrain", paths["pretrain"], "--finetune", paths["finetune"], "--control", paths["control"],
          "--plot", str(tmp_path / "curves.png")])
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stages_that_ran_other_code_or_a_stages_runs_that_read_other_data_are_named(tmp_path, capsys):
    """Pre-training last week and fine-tuning today ran other code: a note says which; the stages read two corpora by
    design, so data is compared within a stage (a fine-tuning seed that read its corpus made again: named)."""
    paths = write_records(tmp_path, {name: seeds[:2] for name, seeds in LOSSES.items()})
    for stage, path in paths.items():
        kept = json.loads(Path(path).read_text())
        for run in kept["runs"]:
            data = {"pretrain": "p" * 16, "finetune": "f" * 16, "control": "f" * 16}[stage]
            if stage == "finetune" and run["seed"] == 1 and run["config"].endswith("/jamba.yaml"):
                data = "e" * 16
            commit = ("1" if stage == "pretrain" else "2") * 40
            if run.get("stored"):
                run["stored"]["code"] = [{"step": 0, "commit": commit, "edits": None, "torch": "2.13", "data": data}]
        Path(path).write_text(json.dumps(kept))
    main(["--pretrain", paths["pretrain"], "--finetune", paths["finetune"], "--control", paths["control"]])
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("- ")]
    assert notes == [
        "- finetune: runs of one recipe read other data (the data's content hash differs), so they are not seeds of "
        "one experiment: jamba seed 0 read ffffffff, jamba seed 1 read eeeeeeee",
        "- the runs come from 2 versions of the code (a commit, +edits: uncommitted changes by hash, the torch that ran "
        "them), which may not compute the same: 1111111, torch 2.13: jamba seeds 0-1, otce_attention seeds 0-1, "
        "otce_expresser seeds 0-1; 2222222, torch 2.13: jamba seeds 0-1, otce_attention seeds 0-1, otce_expresser "
        "seeds 0-1"]
