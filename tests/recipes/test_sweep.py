"""``python -m recipes.sweep`` tabulates exactly the runs it launched and reports the ones that failed."""

import json
import math
import re
import shutil
from functools import partial
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from components import HybridLM, QCAttention, count_parameters
from recipes.sweep.cli import main
from recipes.sweep.records import read_manifest

TINY = """seed_everything: 0
model:
  d_model: {width}
  pattern: "AM"
  mixers:
    A: {{class_path: components.QCAttention, init_args: {{n_heads: 2}}}}
    M: {{class_path: {mlp}}}
data:
  class_path: recipes.data.TextCorpus
  init_args: {{seq_len: 16, batch_size: 4}}
trainer:
  max_steps: 4
  val_check_interval: 2
  limit_val_batches: 2
  logger:
    class_path: lightning.pytorch.loggers.TensorBoardLogger
    init_args: {{save_dir: runs, name: fake/{name}, default_hp_metric: false}}
"""


def test_sweep_reads_the_runs_it_launched_and_fails_on_a_failed_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    family = tmp_path / "family"
    family.mkdir()
    for name, width, mlp in (("a_narrow", 16, "components.MLP"), ("b_wide", 32, "components.MLP"),
                             ("c_broken", 16, "components.MLP, init_args: {act: nope}")):  # fails when built
        (family / f"{name}.yaml").write_text(TINY.format(name=name, width=width, mlp=mlp))
    # A decoy: an older run of a_narrow with a newer-looking version and an impossible loss.
    write_run(tmp_path / "runs" / "fake" / "a_narrow" / "version_99", {3: 0.001}, [], pattern="decoy")

    with pytest.raises(SystemExit) as info:
        main([str(family), "--set", "trainer.enable_checkpointing=false"])
    assert str(info.value.code) == "error: 1 of 3 runs failed: c_broken"
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert "FAILED (exit" in rows["c_broken"] and "c_broken.log" in rows["c_broken"]
    for name, width in (("a_narrow", 16), ("b_wide", 32)):
        params = count_parameters(HybridLM(256, width, "AM", {"A": partial(QCAttention, n_heads=2)}))
        assert f"| `AM` | {params:,} |" in rows[name]
        assert "| 4 |" in rows[name]  # the steps of the launched run (validated at steps 2 and 4)
        loss = float(rows[name].split("|")[6])
        assert 2.0 < loss < 6.0  # a real byte-level loss, not the decoy's 0.001


@pytest.mark.parametrize("folder, message", [
    ("positionz", "recipe folder 'positionz' not found (did you mean positions, english/positions?)"),
    ("nothing_close_here", "recipe folder 'nothing_close_here' not found (bundled folders: arch, attention, english"),
])
def test_a_misspelt_family_names_the_bundled_ones_it_may_mean(folder, message):
    from recipes.sweep.launch import recipe_files

    with pytest.raises(FileNotFoundError) as info:
        recipe_files(folder)
    assert message in str(info.value)


def test_a_misspelt_set_or_a_recipe_that_does_not_parse_is_refused_before_any_run(tmp_path, monkeypatch):
    """Each run failed on it, named only in its log (30 such runs for 6 recipes over 5 seeds)."""
    monkeypatch.chdir(tmp_path)
    family = tmp_path / "family"
    family.mkdir()
    (family / "a.yaml").write_text(TINY.format(name="a", width=16, mlp="components.MLP"))
    with pytest.raises(SystemExit, match=r"--set model.d_modle=8, for recipe a: unrecognized arguments: --model.d_modle "
                                         r"8 \(did you mean --model.d_model\?\)"):
        main([str(family), "--set", "model.d_modle=8"])
    with pytest.raises(SystemExit, match=r"--set trainer.max_steps=2 configures new runs; --table-only launches none"):
        main([str(family), "--table-only", "--set", "trainer.max_steps=2"])
    # A second --set adds to the first (argparse's default kept only the last, and the first was dropped unread).
    with pytest.raises(SystemExit, match=r"--set model.d_modle=8 trainer.max_steps=2, for recipe a: unrecognized"):
        main([str(family), "--set", "model.d_modle=8", "--only", "a", "--set", "trainer.max_steps=2"])
    with pytest.raises(SystemExit, match=r"(?s)--set trainer.max_steps=x, for recipe a: .*Expected a <class 'int'>"):
        main([str(family), "--set", "trainer.max_steps=x"])
    (family / "b.yaml").write_text(TINY.format(name="b", width=16, mlp="components.NoSuchMixer"))
    with pytest.raises(SystemExit, match=r"(?s)recipe .*b.yaml: .*NoSuchMixer.*; mend it, or leave it out with --only"):
        main([str(family), "--set", "trainer.max_steps=2"])
    assert not (tmp_path / "runs").exists()  # no log folder, no run


def test_a_family_of_recipes_without_a_logger_gets_one_run_folder_per_recipe(tmp_path, monkeypatch, capsys):
    """A user's recipes need not name a logger: the sweep gives each run runs/<folder>/<recipe>/ (it failed on a
    KeyError, and Lightning's default would have put every recipe in one lightning_logs/); table-only finds them.
    A recipe that turns logging off has nothing to tabulate and is refused before anything runs."""
    monkeypatch.chdir(tmp_path)
    family = tmp_path / "mine"
    family.mkdir()
    for name, width in (("a", 16), ("b", 32)):
        text = TINY.format(name=name, width=width, mlp="components.MLP")
        (family / f"{name}.yaml").write_text(text[:text.index("  logger:")])
    main([str(family)])
    for name in ("a", "b"):
        [run] = (tmp_path / "runs" / "mine" / name).iterdir()
        assert (run / "hparams.yaml").is_file() and run.name.startswith("sweep_")
    assert not (tmp_path / "lightning_logs").exists()
    first = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| a ")]
    main([str(family), "--table-only"])
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith("| a ")] == first
    # and --ckpt_path last finds the sweep's run of the recipe (a plain fit of it writes to lightning_logs/)
    from recipes.runs import checkpoint_path, load_recipe

    found = Path(checkpoint_path(load_recipe(str(family / "a.yaml")), "last", str(family / "a.yaml")))
    assert found.parts[:3] == ("runs", "mine", "a") and found.name == "last.ckpt"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "z.yaml").write_text((family / "a.yaml").read_text())
    with pytest.raises(FileNotFoundError, match=r"no last.ckpt under lightning_logs/\*/checkpoints/ or runs/other/z/\*/"):
        checkpoint_path(load_recipe(str(tmp_path / "other" / "z.yaml")), "last", str(tmp_path / "other" / "z.yaml"))
    (family / "c.yaml").write_text(TINY.format(name="c", width=16, mlp="components.MLP").split("  logger:")[0]
                                   + "  logger: false\n")
    logs = set((tmp_path / "runs" / "sweep-logs").iterdir())
    with pytest.raises(SystemExit, match=r"c.yaml: trainer.logger is False; a sweep reads each run's TensorBoard logs"):
        main([str(family)])
    assert set((tmp_path / "runs" / "sweep-logs").iterdir()) == logs  # refused before it made a log folder


def write_run(folder, losses: dict[int, float], speeds: list[float], pattern: str = "AM", acc: float | None = None,
              d_model: int = 64, loads: dict[int, list[float]] | None = None,
              within: dict[int, list[float]] | None = None) -> None:
    """A run's folder as a fit leaves it; ``loads``: MoE block → its logged busiest-expert loads over the mean;
    ``within``: the same within each sequence."""
    folder.mkdir(parents=True)
    (folder / "hparams.yaml").write_text(f"pattern: {pattern}\nn_params: 1234\nn_active_params: 1000\nd_model: {d_model}\n")
    with SummaryWriter(str(folder)) as writer:
        for block, values in (loads or {}).items():
            for step, value in enumerate(values):
                writer.add_scalar(f"moe/block{block}/max_over_mean_load", value, step)
                writer.add_scalar(f"moe/block{block}/load_entropy", 0.5, step)  # (another MoE scalar, not read)
        for block, values in (within or {}).items():
            for step, value in enumerate(values):
                writer.add_scalar(f"moe/block{block}/max_over_mean_load_per_sequence", value, step)
        for step, loss in losses.items():
            writer.add_scalar("val/loss", loss, step)
            if acc is not None:
                writer.add_scalar("val/acc", acc, step)
        for step, speed in enumerate(speeds):
            writer.add_scalar("train/tokens_per_sec", speed, step)


def ended(logs: Path, index: int, returncode: int) -> None:
    """Record in the sweep's manifest that its run ``index`` ended with ``returncode`` (a run to resume)."""
    manifest = json.loads((logs / "sweep.json").read_text())
    manifest["runs"][index]["returncode"] = returncode
    (logs / "sweep.json").write_text(json.dumps(manifest))


def test_a_manifest_keeps_every_runs_fields_and_names_how_each_ended(tmp_path):
    from recipes.sweep.records import Run, read_manifest, write_manifest

    runs = [Run(tmp_path / "a.yaml", tmp_path / "a", 0, tmp_path / "a.log", 0, tmp_path / "pre" / "last.ckpt",
                args=["--seed_everything", "0"], pid=None),
            Run(tmp_path / "b.yaml", tmp_path / "b", None, None, None, None, pid=4242)]
    write_manifest(tmp_path, "family", runs)
    family, again = read_manifest(tmp_path)
    assert family == "family" and again == runs
    with pytest.raises(FileNotFoundError, match=r"elsewhere.sweep.json not found: give a folder a sweep wrote"):
        read_manifest(tmp_path / "elsewhere")
    endings = {code: Run(tmp_path / "a.yaml", tmp_path / "a", code, log=tmp_path / "a.log").ending
               for code in (None, 130, 143, 1)}
    assert endings[None].startswith("NOT FINISHED (the sweep stopped before this run ended; log ")
    assert endings[130].startswith("INTERRUPTED (stopped by a signal") and endings[143] == endings[130]
    assert endings[1] == f"FAILED (exit 1; log {tmp_path / 'a.log'})"


def test_a_record_names_bundled_recipes_relatively_and_is_read_where_a_finished_runs_folder_is_gone(tmp_path):
    from recipes.recipe_files import CONFIG_DIR
    from recipes.sweep.records import Run, read_manifest, run_hparams, write_manifest, write_record

    stored = {"result": {"val_loss": 1.0}, "curves": {"val/loss": [[1, 1.0]]}, "hparams": {"lr": 0.5}}
    (tmp_path / "here").mkdir()
    runs = [Run(CONFIG_DIR / "quickstart.yaml", tmp_path / "gone", 0, None, 0, stored=stored),
            Run(tmp_path / "mine.yaml", tmp_path / "here", 0, None, 1, stored=stored)]
    write_manifest(tmp_path, "family", runs)
    write_record(tmp_path, "family", runs)
    record = json.loads((tmp_path / "record.json").read_text())
    assert [r["config"] for r in record["runs"]] == ["quickstart.yaml", str((tmp_path / "mine.yaml").resolve())]
    _, read = read_manifest(tmp_path)  # a finished run's folder is gone: the record, with its numbers
    assert read[0].config == CONFIG_DIR / "quickstart.yaml" and read[0].stored == stored
    assert run_hparams(read[0]) == {"lr": 0.5}
    (tmp_path / "gone").mkdir()
    _, read = read_manifest(tmp_path)  # every finished run's folder is there: the manifest, read from the folders
    assert [r.stored for r in read] == [None, None]


def test_a_run_is_read_at_its_last_validation_and_median_speed(tmp_path):
    from recipes.sweep.records import read_run

    write_run(tmp_path / "run", {9: 4.0, 19: 3.0, 29: 2.5}, [100.0, 900.0, 300.0, 200.0, 250.0])
    result = read_run(tmp_path / "run")
    assert result["val_loss"] == 2.5 and result["steps"] == 30  # the last validation, not the first or the best
    assert result["tok_s"] == 250.0 and result["params"] == 1234 and result["active"] == 1000


def test_a_table_of_moe_runs_says_how_balanced_each_recipes_experts_ended(tmp_path):
    """Under both tables: per recipe, the last busiest-expert load over the mean, averaged over the MoE blocks, as
    mean ± std over its runs; a recipe that logged none is left out, and a family without MoE has no such line."""
    from recipes.sweep.records import Run
    from recipes.sweep.report import seed_table, table

    write_run(tmp_path / "a0", {5: 3.0}, [], loads={1: [3.0, 1.2], 2: [2.0, 1.4]})  # last: 1.2 and 1.4, mean 1.3
    write_run(tmp_path / "a1", {5: 3.1}, [], loads={1: [1.5], 2: [1.7]})  # mean 1.6
    write_run(tmp_path / "dense", {5: 3.0}, [])
    runs = [Run(tmp_path / "a.yaml", tmp_path / "a0", seed=0), Run(tmp_path / "a.yaml", tmp_path / "a1", seed=1),
            Run(tmp_path / "dense.yaml", tmp_path / "dense", seed=0)]
    expected = ("Experts' balance (the busiest expert's load over the mean at the last logged step, 1 = uniform, "
                "averaged over the MoE blocks): a 1.45 ± 0.21")
    assert seed_table(runs).splitlines()[-1] == expected
    assert table(runs).splitlines()[-1] == expected
    assert "Experts' balance" not in seed_table(runs[2:]) + table(runs[2:])
    write_run(tmp_path / "b0", {5: 3.0}, [], loads={1: [1.1]}, within={1: [2.0, 1.8]})
    write_run(tmp_path / "b1", {5: 3.0}, [], loads={1: [1.3]}, within={1: [1.4]})
    runs.append(Run(tmp_path / "b.yaml", tmp_path / "b0", seed=0))
    runs.append(Run(tmp_path / "b.yaml", tmp_path / "b1", seed=1))
    assert seed_table(runs).splitlines()[-1] == (
        "Experts' balance (the busiest expert's load over the mean at the last logged step, 1 = uniform, averaged over "
        "the MoE blocks; within a sequence: the same in each sequence, averaged over them): a 1.45 ± 0.21; "
        "b 1.20 ± 0.14 (within a sequence 1.60 ± 0.28)")


def test_a_run_that_logged_no_speed_shows_a_dash_not_nan(tmp_path):
    """A run shorter than ``log_every_n_steps`` logs no training speed: both tables say "-" ("nan" before)."""
    from recipes.sweep.records import Run
    from recipes.sweep.report import seed_table, table

    write_run(tmp_path / "quiet", {5: 3.0}, [])
    write_run(tmp_path / "timed", {5: 3.0}, [1234.0, 1500.0, 1300.0])
    runs = [Run(tmp_path / f"{name}.yaml", tmp_path / name, seed=0) for name in ("quiet", "timed")]
    for text, column in ((table(runs), 9), (seed_table(runs), 8)):
        cells = {line.split("|")[1].strip(): line.split("|")[column].strip() for line in text.splitlines()[2:]
                 if line.startswith("| ")}
        assert cells == {"quiet": "-", "timed": "1,300"}, text
    for text in (table(runs), seed_table(runs)):
        notes = [line for line in text.splitlines() if line.startswith("- ")]
        assert notes == ["- quiet logged no training speed (timed over each logging window of trainer.log_every_n_steps "
                         "steps after the first: a shorter run has none)"]
    accuracy = {line.split("|")[1].strip(): line.split("|")[7].strip() for line in seed_table(runs).splitlines()[2:]
                if line.startswith("| ")}
    assert accuracy == {"quiet": "-", "timed": "-"}  # no val/acc logged: no value, not "nan"


def test_table_only_takes_the_most_recently_written_run(tmp_path, monkeypatch):
    import os

    from recipes.sweep.launch import newest_run

    monkeypatch.chdir(tmp_path)
    config = tmp_path / "a.yaml"
    config.write_text(TINY.format(name="a", width=16, mlp="components.MLP"))
    root = tmp_path / "runs" / "fake" / "a"
    for i, (version, written) in enumerate((("version_9", 1_000), ("version_2", 1_500), ("version_10", 2_000))):
        write_run(root / version, {1: 5.0 - i}, [1.0])
        os.utime(root / version, (1_000_000 + written, 1_000_000 + written))
    # version_10 was written last, but sorts before version_9 (and version_2) by name.
    assert newest_run(config).resolve() == root / "version_10"


def test_table_only_leaves_out_a_recipe_never_run_and_names_it(tmp_path, monkeypatch, capsys):
    # It was a row "FAILED (exit -1; …)" per recipe not run yet and "error: 2 of 3 runs failed", and the line under
    # the table promised a record.json that --table-only does not write.
    monkeypatch.chdir(tmp_path)
    family = tmp_path / "family"
    family.mkdir()
    for name in ("a", "b", "c"):
        (family / f"{name}.yaml").write_text(TINY.format(name=name, width=16, mlp="components.MLP"))
    with pytest.raises(SystemExit, match="--table-only: no recipe of family has a run under runs/fake/ yet"):
        main([str(family), "--table-only"])
    write_run(tmp_path / "runs" / "fake" / "b" / "version_0", {3: 2.5}, [1.0])
    main([str(family), "--table-only"])  # no SystemExit: the table of what ran is the answer
    out, err = capsys.readouterr()
    rows = {line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")} - {"recipe", "---"}
    assert rows == {"b"} and "FAILED" not in out and "record.json" not in out
    assert f"not run yet, so not in the table: a, c (python -m recipes.sweep {family} --only a c runs them)" in err


def test_table_only_names_the_settings_its_runs_were_fit_with_that_their_recipes_do_not_hold(tmp_path, monkeypatch,
                                                                                           capsys):
    """``--table-only`` tabulates each recipe's newest run: a debugging ``fit`` with another learning rate, or a sweep's
    ``--set``, stood in the table as the recipe without a word. A note under the table names each such setting, the
    runs fit with it and the recipes' values; runs fit as their recipes say get none."""
    from recipes.cli import main as cli

    monkeypatch.chdir(tmp_path)
    family = tmp_path / "family"
    family.mkdir()
    for name in ("a", "b"):
        (family / f"{name}.yaml").write_text(TINY.format(name=name, width=16, mlp="components.MLP"))
    quiet = ["--trainer.enable_progress_bar", "false"]  # (the sweep's own runs set it too: it computes nothing)
    cli(["fit", "--config", str(family / "a.yaml"), *quiet])
    main([str(family), "--table-only"])
    assert "| a |" in (out := capsys.readouterr().out) and "fit with settings" not in out
    cli(["fit", "--config", str(family / "b.yaml"), "--trainer.max_steps", "2", *quiet])
    cli(["fit", "--config", str(family / "a.yaml"), "--model.lr", "0.05", "--trainer.max_steps", "2", *quiet])
    capsys.readouterr()
    main([str(family), "--table-only"])
    out = capsys.readouterr().out
    note = ("- the newest runs tabulated were fit with settings their recipe files do not hold — where the runs differ "
            "in one, the table compares it too: model.lr: 0.05 in a (recipe: 0.001); trainer.max_steps: 2 in a, b "
            "(recipes: 4)")
    assert note in out.splitlines(), out
    written = re.search(r"table and figures: (\S+)/ ", out)[1]
    assert note in (tmp_path / written / "table.md").read_text().splitlines()


def test_a_vs_figure_that_cannot_be_drawn_is_a_note_under_the_table_not_the_table_lost(tmp_path):
    from recipes.sweep.records import Run
    from recipes.sweep.report import report

    for name, width in (("w_16", 16), ("w_32", 32)):
        write_run(tmp_path / name, {9: 3.0}, [1.0], d_model=width, acc=0.5)
    runs = [Run(tmp_path / f"{name}.yaml", tmp_path / name) for name in ("w_16", "w_32")]
    text = report(runs, tmp_path / "logs", "fam", False, None, "d_model", "val_acc")
    assert (tmp_path / "logs" / "val_acc_vs_d_model.png").is_file() and "no val_acc" not in text
    for key, why in (("nonsense", "hyper-parameter 'nonsense' is not in"), ("pattern", "hyper-parameter 'pattern' is 'AM' in")):
        text = report(runs, tmp_path / "logs", "fam", False, None, key, "val_acc")  # it raised KeyError / ValueError
        assert f"no val_acc against {key} figure: {why}" in text and "| w_16 |" in text
        assert text in (tmp_path / "logs" / "table.md").read_text()


def test_vs_draws_a_data_setting_from_each_runs_config_and_a_one_axis_grid_as_one_line(tmp_path):
    """``--vs data.init_args.seq_len`` reads each run's ``config.yaml`` (its record keeps the data and trainer parts),
    where it read the model's hyper-parameters alone; a one-axis grid's recipes (``seqlen16``, ``seqlen32``, or
    ``lr0.002``, ``lr0.006``) are points of one line, where each was a line of one point."""
    import yaml

    from recipes.sweep.records import Run, read_record, write_record
    from recipes.sweep.report import metric_vs, vs_line

    runs = []
    for name, length, acc in (("seqlen16", 16, 0.25), ("seqlen32", 32, 0.5)):
        write_run(tmp_path / name, {9: 3.0}, [1.0], acc=acc)
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump(
            {"model": {"d_model": 64}, "data": {"init_args": {"seq_len": length}}, "trainer": {"max_steps": 10}}))
        runs.append(Run(tmp_path / f"{name}.yaml", tmp_path / name))
    assert metric_vs(runs, "data.init_args.seq_len") == {"seq_len": [(16.0, 0.25, 0.0, 1), (32.0, 0.5, 0.0, 1)]}
    write_record(tmp_path, "grid", runs)
    _, kept = read_record(tmp_path / "record.json")
    assert kept[0].stored["config"] == {"data": {"init_args": {"seq_len": 16}}, "trainer": {"max_steps": 10}}
    assert metric_vs(kept, "data.init_args.seq_len") == metric_vs(runs, "data.init_args.seq_len")
    with pytest.raises(ValueError, match=r"setting 'data.init_args.seq_ln' is not in .*seqlen16/config.yaml"):
        metric_vs(runs, "data.init_args.seq_ln")
    del kept[0].stored["config"]  # a record from before they kept it
    with pytest.raises(ValueError, match=r"'data.init_args.seq_len': the record of .*seqlen16 keeps no config.yaml"):
        metric_vs(kept, "data.init_args.seq_len")
    assert [vs_line(name, "lr") for name in ("lr0.002", "lr1e-05", "optimizer-SGD_lr0.01", "ssd_T64_d16")] == [
        "lr", "lr", "optimizer-SGD", "ssd_T64"]
    assert vs_line("ssd_T64_d16", "d_model") == "ssd_T64" and vs_line("dense", "d_model") == "dense"


def test_runs_of_other_data_settings_are_not_pooled_as_seeds(tmp_path):
    """Two sweeps of one recipe at another ``seq_len`` or batch size (a ``--set data.init_args.batch_size=8``) are
    other experiments; a loader's workers or a cache folder change no result. Records from before they kept the
    runs' ``config.yaml`` compare on what they hold."""
    import yaml

    from recipes.sweep.records import Run, pooling_problem

    def run(name, seed, **data):
        write_run(tmp_path / name, {9: 3.0}, [1.0])
        settings = {"seq_len": 32, "batch_size": 16, "num_workers": 0, **data}
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump(
            {"data": {"class_path": "recipes.data.TextCorpus", "init_args": settings}}))
        return Run(tmp_path / "a.yaml", tmp_path / name, seed=seed)

    base = ("one", [run("s0", 0)])
    assert pooling_problem([base, ("two", [run("s1", 1, num_workers=2)])]) is None
    assert "a's runs differ in data.init_args.batch_size: 16 in one, 8 in two" in pooling_problem(
        [base, ("two", [run("s2", 2, batch_size=8)])])
    assert "differ in data.init_args.seq_len" in pooling_problem([base, ("two", [run("s3", 3, seq_len=64)])])
    old = run("s4b", 4, seq_len=64)
    (tmp_path / "s4b" / "config.yaml").unlink()  # (no config: compared on its model settings and steps alone)
    assert pooling_problem([base, ("two", [old])]) is None
    # the same settings over other text (a corpus made again, Python's bundled text of another version): the data's
    # content hash in code.json tells them apart; a run that recorded none is compared without it
    for name, data in (("s0", "1a2b"), ("s5", "1a2b"), ("s6", "9f9f")):
        if name != "s0":
            run(name, int(name[1:]))
        (tmp_path / name / "code.json").write_text(json.dumps([{"step": 0, "commit": None, "data": data}]))
    same, other = Run(tmp_path / "a.yaml", tmp_path / "s5", seed=5), Run(tmp_path / "a.yaml", tmp_path / "s6", seed=6)
    assert pooling_problem([base, ("two", [same])]) is None
    assert "a's runs differ in the data's content hash: 1a2b in one, 9f9f in two" in pooling_problem(
        [base, ("two", [other])])
    assert pooling_problem([base, ("two", [run("s7", 7)])]) is None


def test_a_mistyped_vs_key_stops_a_sweep_before_it_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    family = tmp_path / "family"
    family.mkdir()
    (family / "a.yaml").write_text(TINY.format(name="a", width=16, mlp="components.MLP"))
    with pytest.raises(SystemExit, match="--vs d_modle: not a hyper-parameter a run records; did you mean d_model?"):
        main([str(family), "--vs", "d_modle"])
    with pytest.raises(SystemExit, match=r"--vs data.init_args.seq_ln: not a setting of a.yaml"):
        main([str(family), "--vs", "data.init_args.seq_ln"])
    assert not (tmp_path / "runs").exists()


def test_every_key_a_run_records_is_one_vs_accepts(tmp_path, monkeypatch):
    from recipes.cli import main as recipes_main
    from recipes.module import hyperparameter_keys

    monkeypatch.chdir(tmp_path)
    lm = recipes_main(["--config", "quickstart.yaml"], run=False).model
    recorded = set(lm.hparams) | set(lm.sizes)
    assert {"d_model", "lr", "n_params", "mixers"} <= recorded <= hyperparameter_keys()


def test_seed_statistics_over_a_fake_family_with_known_outcomes(tmp_path):
    """Three recipes × 3 seeds written by hand: the means, deviations and 95% intervals (t₀.₉₇₅,₂ =
    4.3027), the runs behind each cell, Welch's p against the baseline, and a failed run named and left out."""
    from recipes.sweep.report import seed_table
    from recipes.sweep.records import Run

    losses = {"base": [2.0, 2.1, 1.9], "worse": [3.0, 3.1, 2.9], "same": [2.05, 1.95, 2.0], "lonely": [2.5]}
    runs = []
    for name, values in losses.items():
        for seed, loss in enumerate(values):
            write_run(tmp_path / name / f"s{seed}", {9: 9.0, 19: loss}, [100.0 * (seed + 1)])
            runs.append(Run(tmp_path / f"{name}.yaml", tmp_path / name / f"s{seed}", seed=seed))
    runs.append(Run(tmp_path / "same.yaml", tmp_path / "same" / "s3", returncode=1, log="same_seed3.log", seed=3))
    runs.append(Run(tmp_path / "same.yaml", tmp_path / "same" / "gone", seed=4))  # finished, its folder gone
    out = seed_table(runs, baseline="base")
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| recipe")}
    half = 4.302652729911275 * 0.1 / 3 ** 0.5
    assert rows["base"][:5] == ["3 of 3", "1,234", "1,000", "2.0000 ± 0.1000", f"[{2 - half:.4f}, {2 + half:.4f}]"]
    assert rows["base"][6] == "200" and rows["base"][7:12] == ["(baseline)", "-", "-", "-", "-"]
    assert rows["worse"][7] == "+1.0000" and 2e-4 < float(rows["worse"][8]) < 3e-4  # t = 12.25 on 4 df
    assert rows["same"][0] == "3 of 5" and rows["same"][7] == "+0.0000" and float(rows["same"][8]) > 0.9
    assert rows["lonely"][0] == "1 of 1" and rows["lonely"][7:9] == ["+0.5000", "< 2 runs"]  # no test on one run
    assert rows["lonely"][3:5] == ["2.5000", "-"]  # one run: its value, no spread and no interval (not "± nan")
    assert "same seed 3 FAILED (exit 1; log same_seed3.log)" in out
    assert f"same seed 4 has no results in {tmp_path / 'same' / 'gone'}" in out
    no_baseline = seed_table(runs).splitlines()  # no comparison columns, which held only dashes
    assert no_baseline[0].split(" | ")[8:] == ["best val loss (step) |"] and no_baseline[1] == "|---" * 9 + "|"
    cells = {line.split("|")[1].strip(): line.split("|")[1:-1] for line in out.splitlines()[2:] if line.startswith("| ")}
    alone = {line.split("|")[1].strip(): line.split("|")[1:-1] for line in no_baseline[2:] if line.startswith("| ")}
    assert alone.keys() == cells.keys() and all(alone[k] == cells[k][:8] + cells[k][13:] for k in cells)
    with pytest.raises(ValueError, match=r"--baseline 'bsae' is not one of the recipes run \(base, worse, same, lonely\)"):
        seed_table(runs, baseline="bsae")


def test_seeds_launch_one_run_per_seed_in_parallel_and_tabulate_them(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    family = tmp_path / "family"
    family.mkdir()
    for name, width in (("a_narrow", 16), ("b_wide", 32)):
        (family / f"{name}.yaml").write_text(TINY.format(name=name, width=width, mlp="components.MLP"))
    main([str(family), "--seeds", "2", "--jobs", "2", "--baseline", "a_narrow", "--progress", "0.5",
          "--set", "trainer.enable_checkpointing=false"])
    out = capsys.readouterr().out
    assert "sweep: 4 runs, 2 at a time" in out and " running, " in out  # progress while the runs ran
    for name in ("a_narrow", "b_wide"):
        folders = sorted((tmp_path / "runs" / "fake" / name).glob("sweep_*_seed*"))
        assert [f.name[-5:] for f in folders] == ["seed0", "seed1"]
        assert f"| {name} | 2 of 2 |" in out
    logs = next((tmp_path / "runs" / "sweep-logs").iterdir())
    assert (logs / "table.md").read_text().count("| 2 of 2 |") == 2
    assert (logs / "val_loss.png").read_bytes()[:4] == b"\x89PNG"
    assert f"tensorboard --logdir {Path('runs') / 'fake'}" in out
    from recipes.sweep.records import read_manifest, read_run

    family_name, recorded = read_manifest(logs)
    assert family_name == "family" and sorted((r.config.stem, r.seed, r.returncode) for r in recorded) == [
        ("a_narrow", 0, 0), ("a_narrow", 1, 0), ("b_wide", 0, 0), ("b_wide", 1, 0)]

    a0, a1 = (read_run(tmp_path / "runs" / "fake" / "a_narrow" / f) for f in
              sorted(p.name for p in (tmp_path / "runs" / "fake" / "a_narrow").glob("sweep_*")))
    assert a0["val_loss"] != a1["val_loss"]  # the seeds differ
    # The sweep's record holds the numbers: with every run folder gone, the same table comes back from it.
    table = (logs / "table.md").read_text()
    import shutil

    shutil.copy(logs / "record.json", tmp_path / "kept.json")
    shutil.rmtree(tmp_path / "runs")
    main(["--from", str(tmp_path / "kept.json"), "--baseline", "a_narrow"])
    again = next((tmp_path / "runs" / "sweep-logs").iterdir())
    assert again.name.endswith("-record") and (again / "table.md").read_text() == table
    assert (again / "val_loss.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit, match="--baseline 'nope' is not one of the recipes"):
        main([str(family), "--seeds", "2", "--baseline", "nope"])


def test_a_run_that_never_validated_gets_dashes_and_a_note_saying_why(tmp_path):
    """A run in an epoch that ``check_val_every_n_epoch`` skips: the run is fine but has no validation loss. Both tables say "-" (``nan`` and ``+nan`` before) and say why under the table."""
    from recipes.sweep.records import Run
    from recipes.sweep.report import seed_table, table

    write_run(tmp_path / "short", {}, [1000.0])
    write_run(tmp_path / "base", {5: 3.0}, [1000.0])
    runs = [Run(tmp_path / f"{name}.yaml", tmp_path / name, seed=0) for name in ("short", "base")]
    plain, seeded = table(runs), seed_table(runs, baseline="base")
    assert "nan" not in plain + seeded
    row = next(line for line in plain.splitlines() if line.startswith("| short"))
    assert [cell.strip() for cell in row.split("|")[6:9]] == ["-", "-", "-"]
    row = next(line for line in seeded.splitlines() if line.startswith("| short"))
    assert row.split("|")[2].strip() == "0 of 1" and row.split("|")[3:5] == [" 1,234 ", " 1,000 "]  # (it finished)
    assert row.split("|")[9].strip() == "-"
    for text in (plain, seeded):
        notes = [line for line in text.splitlines() if line.startswith("- ")]
        assert len(notes) == 1 and notes[0].startswith("- short") and "ran no validation" in notes[0]
        assert "--set trainer.check_val_every_n_epoch=1" in notes[0]


def fake_family(tmp_path) -> list:
    """Two recipes × 3 seeds with hand-written validation curves; seed 2 of ``b`` validated one step less."""
    from recipes.sweep.records import Run

    runs = []
    for name, curves in {"a": [{10: 4.0, 20: 3.0}, {10: 5.0, 20: 3.5}, {10: 6.0, 20: 4.0}],
                         "b": [{10: 2.0, 20: 1.0}, {10: 2.0, 20: 1.0}, {10: 2.0}]}.items():
        for seed, curve in enumerate(curves):
            write_run(tmp_path / name / f"s{seed}", curve, [1.0])
            runs.append(Run(tmp_path / f"{name}.yaml", tmp_path / name / f"s{seed}", seed=seed))
    return runs


def test_pooled_records_name_their_recipes_relative_to_the_bundled_configs():
    """A record written on another machine names a bundled recipe by its absolute path there: the same recipe file
    as this machine's, which pooling must not take for another family's."""
    from recipes.sweep.records import Run, pooling_problem, recipe_file

    there = Path("/work/sweep-tree/recipes/configs/english/attention/ssd_ifa.yaml")
    here = Path("/home/me/hybrid-zoo/recipes/configs/english/attention/ssd_ifa.yaml")
    assert recipe_file(there) == recipe_file(here) == "english/attention/ssd_ifa.yaml"
    assert recipe_file(Path("/tmp/mine/a.yaml")) == "/tmp/mine/a.yaml"
    sweeps = [("one", [Run(there, Path("r0"), returncode=1, seed=0)]), ("two", [Run(here, Path("r1"), seed=1)])]
    assert pooling_problem(sweeps) is None
    other = [("two", [Run(Path("/home/me/hybrid-zoo/recipes/configs/attention/ssd_ifa.yaml"), Path("r1"), seed=1)])]
    assert "other recipes under one name" in pooling_problem(sweeps[:1] + other)


def test_validation_curves_are_averaged_over_the_seeds_at_the_steps_all_of_them_have(tmp_path):
    from recipes.sweep.report import plot_curves, val_curves
    from recipes.sweep.records import Run

    runs = fake_family(tmp_path) + [Run(tmp_path / "a.yaml", tmp_path / "a" / "s9", returncode=1, seed=9)]
    curves = val_curves(runs)
    # steps done (TensorBoard's step + 1, as the tables count them); the failed seed 9 is not read
    assert curves["a"] == ([11, 21], [5.0, 3.5], [1.0, 0.5], 3)
    assert curves["b"] == ([11], [2.0], [0.0], 3)  # step 20 is missing from one run: not averaged over two
    plot_curves(curves, tmp_path / "curves.png", "fake")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_from_an_earlier_sweep_retabulates_exactly_its_runs(tmp_path, capsys):
    from recipes.sweep.cli import main
    from recipes.sweep.records import read_manifest, write_manifest

    runs = fake_family(tmp_path)
    runs[1].returncode = None  # the sweep was stopped while a seed 1 ran: named, and left out of the cells
    write_run(tmp_path / "a" / "s_other", {20: 0.5}, [1.0])  # a run of the same recipe not in the sweep
    logs = tmp_path / "logs"
    logs.mkdir()
    write_manifest(logs, "fake", runs)
    assert not (logs / "record.json").exists()  # a sweep from before records were kept
    main(["--from", str(logs), "--baseline", "a"])
    out = capsys.readouterr().out
    family, recorded = read_manifest(logs / "record.json")  # it gains one, with the runs' numbers
    assert family == "fake" and [r.config.stem for r in recorded] == [r.config.stem for r in runs]
    assert "| a | 2 of 3 | 1,234 | 1,000 | 3.5000 ± 0.7071 |" in out
    assert "| b | 3 of 3 | 1,234 | 1,000 | 1.3333 ± 0.5774 |" in out
    assert "a seed 1 NOT FINISHED (the sweep stopped before this run ended; log None)" in out
    assert (logs / "table.md").read_text().startswith("# fake") and (logs / "val_loss.png").is_file()
    partly = fake_family(tmp_path / "partly")
    (partly[0].folder / "hparams.yaml").unlink()  # one run's numbers no longer all there: no record of it is made
    shutil.rmtree(partly[1].folder)  # and another run's folder deleted: named under the table, not a traceback
    (tmp_path / "partly" / "logs").mkdir()
    write_manifest(tmp_path / "partly" / "logs", "fake", partly)
    main(["--from", str(tmp_path / "partly" / "logs")])
    assert not (tmp_path / "partly" / "logs" / "record.json").exists()
    out = capsys.readouterr().out
    assert f"has no results in {partly[1].folder}" in out and "| a | 1 of 3 |" in out and "| b | 3 of 3 |" in out
    with pytest.raises(SystemExit, match="sweep.json not found"):
        main(["--from", str(tmp_path)])
    # Two sweeps read together: one table of both, the second's seeds added to the first's.
    from recipes.sweep.records import Run

    write_run(tmp_path / "a" / "s3", {10: 4.0, 20: 4.5}, [1.0])
    more = tmp_path / "more"
    more.mkdir()
    write_manifest(more, "fake", [Run(tmp_path / "a.yaml", tmp_path / "a" / "s3", seed=3)])
    main(["--from", str(logs), str(more)])
    assert "| a | 3 of 4 | 1,234 | 1,000 | 3.8333 ± 0.7638 |" in capsys.readouterr().out
    again = tmp_path / "again"  # the seed the first sweep stopped in, run to its end by another: pooled once
    again.mkdir()
    write_manifest(again, "fake", [Run(tmp_path / "a.yaml", tmp_path / "a" / "s1", seed=1)])
    main(["--from", str(logs), str(again)])
    assert "| a | 3 of 4 | 1,234 | 1,000 | 3.5000 ± 0.5000 |" in capsys.readouterr().out
    # What pooling would count wrong is refused (the same sweep twice doubled every cell without a word): a seed
    # finished in both, a recipe name of two files (another family's), fine-tuned runs beside runs from scratch.
    with pytest.raises(SystemExit, match=r"--from: a seed 0 finished in .*logs and in .*logs: pooled, it would count "
                                         r"twice"):
        main(["--from", str(logs), str(logs)])
    (tmp_path / "english").mkdir()
    for name, run in (("other", Run(tmp_path / "english" / "a.yaml", tmp_path / "a" / "s3", seed=7)),
                      ("tuned", Run(tmp_path / "a.yaml", tmp_path / "a" / "s3", seed=7, init_from=tmp_path / "x.ckpt"))):
        (tmp_path / name).mkdir()
        write_manifest(tmp_path / name, "fake", [run])
    with pytest.raises(SystemExit, match=r"--from: a is .*/a.yaml in .*logs and .*/english/a.yaml in .*other: other "
                                         r"recipes under one name"):
        main(["--from", str(logs), str(tmp_path / "other")])
    with pytest.raises(SystemExit, match=r"--from: a's runs start from a checkpoint \(--init-from\) in .*tuned and "
                                         r"from scratch in .*logs"):
        main(["--from", str(logs), str(tmp_path / "tuned")])
    # runs of one recipe with other settings (a sweep's --set model.lr=…, a shorter debugging sweep) are not seeds of
    # one; settings that change how a run computes, not what, are (compile, a kernel's backend)
    for name, curve, extra, message in (
            ("wider", {10: 4.0, 20: 4.5}, "", r"--from: a's runs differ in d_model: 64 in .*logs, 32 in .*wider: runs "
                                              r"of other settings would count as seeds of one"),
            ("shorter", {10: 4.0}, "", r"--from: a's runs differ in steps: 21 in .*logs, 11 in .*shorter"),
            ("compiled", {10: 4.0, 20: 4.5}, "compile: true\nmixers: {S: {init_args: {backend: torch}}}\n", None)):
        write_run(tmp_path / "a" / name, curve, [1.0], d_model=32 if name == "wider" else 64)
        with open(tmp_path / "a" / name / "hparams.yaml", "a") as f:
            f.write(extra)
        (tmp_path / name).mkdir()
        write_manifest(tmp_path / name, "fake", [Run(tmp_path / "a.yaml", tmp_path / "a" / name, seed=5)])
        if message:
            with pytest.raises(SystemExit, match=message):
                main(["--from", str(logs), str(tmp_path / name)])
        else:
            main(["--from", str(logs), str(tmp_path / name)])
            assert "| a | 3 of 4 |" in capsys.readouterr().out
    from recipes.sweep.records import run_settings

    assert run_settings(Run(tmp_path / "a.yaml", tmp_path / "a" / "compiled")) == {
        "pattern": "AM", "n_params": 1234, "n_active_params": 1000, "d_model": 64, "steps": 21}
    # --only: the table of those recipes' runs alone (it was the whole sweep's, without a word).
    main(["--from", str(logs), "--only", "b"])
    out = capsys.readouterr().out
    assert "| b | 3 of 3 | 1,234 | 1,000 | 1.3333 ± 0.5774 |" in out and "| a |" not in out
    with pytest.raises(SystemExit, match=r"error: --only names \['c'\], not recipes of that sweep \(a, b\)"):
        main(["--from", str(logs), "--only", "b", "c"])
    main(["fake", "--from", str(logs), "--only", "a"])  # its family named (as docs/results.md does): the same table
    assert "| a | 2 of 3 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="error: --from reads a sweep of fake, not of positions: name its own"):
        main(["positions", "--from", str(logs)])
    with pytest.raises(SystemExit, match="error: --baseline 'c' is not one of the recipes of that sweep"):
        main(["--from", str(logs), "--baseline", "c"])
    with pytest.raises(SystemExit, match="error: --suite or --tasks, one at a time"):
        main(["--from", str(logs), "--suite", "length", "--tasks", "zoo_cloze"])
    main(["--from", str(logs)])
    plain = capsys.readouterr().out
    main(["--from", str(logs), "--baseline", "b"])
    against_b = capsys.readouterr().out
    (tmp_path / "_family.yaml").write_text("baseline: b\n")  # the family's own baseline, beside its recipes
    main(["--from", str(logs)])
    assert capsys.readouterr().out == against_b != plain


@pytest.mark.parametrize("flags, message", [
    (["--set", "trainer.max_steps=9"], "--set configures new runs"),
    (["--seeds", "3", "--launcher", "gpus"], "--seeds, --launcher configure new runs"),
    (["--table-only"], "--table-only configures new runs"),
    (["--first-seed", "3"], "--first-seed configures"),
    (["--init-from", "none"], "--init-from configures"),
    (["--threads", "2", "--slurm", "timeout_min=5"], "--slurm, --threads configure"),
    (["--devices-per-run", "2", "--submitit-cluster", "local"], "--devices-per-run, --submitit-cluster configure"),
])
def test_from_refuses_what_would_launch_runs_rather_than_ignore_it(tmp_path, flags, message):
    """``--from`` tabulates runs that exist: an option that configures new runs was ignored without a word, so the
    table was not of the runs the command line described. Refused, before the sweep is read."""
    with pytest.raises(SystemExit, match=f"error: .*{message}"):
        main([*flags, "--from", str(tmp_path / "never-read")])


def test_resume_refuses_the_options_of_a_new_sweep_rather_than_ignore_them(tmp_path):
    with pytest.raises(SystemExit, match="--resume goes on with a sweep as it was launched, so it takes no --only, "
                                         "--seeds, --table-only$"):
        main(["--resume", str(tmp_path), "--seeds", "5", "--table-only", "--only", "a"])


def test_a_metric_against_a_hyperparameter_has_one_line_per_recipe_series(tmp_path):
    from recipes.sweep.report import metric_vs, plot_vs
    from recipes.sweep.records import Run

    runs = []
    for name, d, accs in (("ssd_T64_d16", 16, [0.1, 0.3]), ("ssd_T64_d32", 32, [0.5, 0.5]),
                          ("attn_T64_d16", 16, [1.0, 0.9])):
        for seed, acc in enumerate(accs):
            write_run(tmp_path / name / f"s{seed}", {5: 1.0}, [1.0], acc=acc, d_model=d)
            runs.append(Run(tmp_path / f"{name}.yaml", tmp_path / name / f"s{seed}", seed=seed))
    lines = metric_vs(runs, "d_model", "val_acc")
    assert set(lines) == {"ssd_T64", "attn_T64"}
    (x16, mean16, std16, n16), (x32, mean32, std32, n32) = lines["ssd_T64"]
    assert (x16, n16, x32, n32) == (16.0, 2, 32.0, 2)
    assert mean16 == pytest.approx(0.2) and std16 == pytest.approx(2 ** 0.5 / 10) and mean32 == pytest.approx(0.5)
    plot_vs(lines, tmp_path / "acc.png", "d_model", "val_acc", "fake")
    assert (tmp_path / "acc.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="'n_layers' is not in"):
        metric_vs(runs, "n_layers")


def test_a_recipe_at_the_familys_own_rate_joins_the_line_of_its_variants_at_others(tmp_path):
    """english/moe_placement's ``ablate_moe`` (lr 3e-3) beside english/moe_placement_lr's ``ablate_moe_lr4x``: one
    line, ``ablate_moe``, where the bare name lost its last ``_`` part (``ablate``) and drew a line of one point; and
    english/moe_shared's ``routed_switanh`` (3e-3 only) a line of its own, not a second point at 3e-3 on routed's."""
    from recipes.sweep.records import Run
    from recipes.sweep.report import metric_vs

    runs = []
    for name, lr, acc in (("ablate_moe", 3e-3, 0.2), ("ablate_moe_lr4x", 1.2e-2, 0.3), ("dense", 3e-3, 0.25),
                          ("dense_lr4x", 1.2e-2, 0.35), ("dense_switanh", 3e-3, 0.1)):
        write_run(tmp_path / name, {5: 1.0}, [1.0], acc=acc)
        with open(tmp_path / name / "hparams.yaml", "a") as hparams:
            hparams.write(f"lr: {lr}\n")
        runs.append(Run(tmp_path / f"{name}.yaml", tmp_path / name))
    lines = metric_vs(runs, "lr")
    points = {line: [(x, round(mean, 6), n) for x, mean, _, n in points] for line, points in lines.items()}
    assert points["ablate_moe"] == [(3e-3, 0.2, 1), (1.2e-2, 0.3, 1)]  # (the accuracies logged in fp32)
    assert points["dense"] == [(3e-3, 0.25, 1), (1.2e-2, 0.35, 1)]
    assert points["dense_switanh"] == [(3e-3, 0.1, 1)]
    assert set(lines) == {"ablate_moe", "dense", "dense_switanh"}
    from recipes.sweep.report import report, vs_table

    text = report(runs, tmp_path / "logs", "moe_placement", False, None, "lr", "val_acc")  # the table, then the points
    assert text.endswith("\n\n" + vs_table(lines, "lr", "val_acc")) and "| dense | 0.2500" in text
    assert (tmp_path / "logs" / "val_acc_vs_lr.png").is_file() and text in (tmp_path / "logs" / "table.md").read_text()


def test_the_metric_against_a_setting_is_a_table_too_with_each_lines_best():
    """``--vs lr`` on a learning-rate check: which rate is each stack's best, read off a table rather than a PNG."""
    from recipes.sweep.report import vs_table

    lines = {"ssd": [(0.003, 4.7156, 0.0081, 5), (0.012, 4.4720, 0.0072, 3), (0.024, 4.4682, 0.0117, 3)],
             "gdn": [(0.003, 4.7380, 0.0028, 5), (0.012, 4.5040, 0.0088, 3), (0.024, 4.5200, 0.0110, 3)],
             "jamba": [(0.012, 4.4792, 0.0073, 3)]}
    rows = vs_table(lines, "model.lr", "val_loss").splitlines()
    assert rows[0] == "| val loss against lr | 0.003 | 0.012 | 0.024 | best |"
    assert rows[2] == "| ssd | 4.7156 ± 0.0081 (5) | 4.4720 ± 0.0072 (3) | **4.4682 ± 0.0117 (3)** | 0.024 |"
    assert rows[3] == "| gdn | 4.7380 ± 0.0028 (5) | **4.5040 ± 0.0088 (3)** | 4.5200 ± 0.0110 (3) | 0.012 |"
    assert rows[4] == "| jamba | - | **4.4792 ± 0.0073 (3)** | - | 0.012 |"
    accuracy = vs_table({"qcattn": [(16.0, 0.06, 0.0, 3), (64.0, 0.99, 0.01, 3)]}, "d_model", "val_acc")
    assert accuracy.splitlines()[-1] == "| qcattn | 0.0600 ± 0.0000 (3) | **0.9900 ± 0.0100 (3)** | 64 |"  # the most


def test_the_seed_table_gives_each_recipes_parameter_counts():
    # The family's point is a comparison at equal parameters; the seed table left the counts to the one-seed table.
    from recipes.sweep.report import counts

    assert counts([{"params": 60_124}, {"params": 60_124}], "params") == "60,124"
    assert counts([{"params": 60_124}, {"params": 58_000}], "params") == "58,000–60,124"  # a recipe edited between runs
    assert counts([{"params": math.nan}], "params") == counts([], "params") == "-"


def test_holm_tost_detectable_effect_and_the_best_loss_in_the_seed_table(tmp_path):
    """Four recipes × 3 seeds with hand-made curves: the new columns equal the statistics computed by hand,
    and a run whose best loss came long before its end is flagged."""
    from recipes.stats import detectable_effect, holm, tost, welch
    from recipes.sweep.report import seed_table
    from recipes.sweep.records import Run

    finals = {"base": [2.0, 2.1, 1.9], "worse": [3.0, 3.1, 2.9], "close": [2.01, 2.11, 1.91], "peaked": [2.3, 2.2, 2.4]}
    runs = []
    for name, values in finals.items():
        for seed, loss in enumerate(values):
            curve = {9: 9.0, 49: loss - 0.2, 99: loss} if name == "peaked" else {9: 9.0, 49: loss + 0.5, 99: loss}
            write_run(tmp_path / name / f"s{seed}", curve, [1.0])
            runs.append(Run(tmp_path / f"{name}.yaml", tmp_path / name / f"s{seed}", seed=seed))
    out = seed_table(runs, baseline="base", margin=0.05)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in out.splitlines()
            if line.startswith("| ") and not line.startswith("| recipe")}
    names = ["worse", "close", "peaked"]
    raw = [welch(finals[n], finals["base"])[1] for n in names]
    for name, p, adjusted in zip(names, raw, holm(raw)):
        assert rows[name][8] == f"{p:.3g}" and rows[name][9] == f"{adjusted:.3g}"
        assert rows[name][10] == f"{detectable_effect(0.1, 3, 0.1, 3):.4f}"
        assert rows[name][11] == f"{tost(finals[name], finals['base'], 0.05):.3g}"
    assert rows["base"][12] == "2.0000 (100)" and rows["peaked"][12] == "2.1000 (50)"
    assert "peaked seed 0: best val loss 2.1000 at step 50 of 100; final 2.3000" in out
    assert "worse seed" not in out  # the others improved to their end


def test_an_early_best_is_at_or_before_80_percent_of_the_steps_and_worse_at_the_end_by_at_least_0_005():
    from recipes.sweep.records import scalar_series
    from recipes.sweep.report import early_best

    edge = dict(best_step=80, steps=100, best_val_loss=0.0, val_loss=0.005)  # both bounds met exactly
    assert early_best(edge)
    assert not early_best({**edge, "best_step": 81})  # late enough: the run was still improving near its end
    assert not early_best({**edge, "val_loss": 0.0049})  # as good at the end, within noise
    assert not early_best({**edge, "best_step": 81, "val_loss": 1.0})  # much worse, but late: both are needed
    assert not early_best({**edge, "best_step": 0, "val_loss": 0.0})  # early, but no worse
    assert scalar_series(Path("no-such-run-folder"), "val/loss") == {}  # (TensorBoard's reader would raise)


def test_progress_names_each_running_run_with_its_step_loss_and_log(tmp_path):
    from recipes.sweep.launch import progress_lines
    from recipes.sweep.records import Run

    write_run(tmp_path / "a" / "s0", {9: 3.0}, [1.0])
    with SummaryWriter(str(tmp_path / "a" / "s0")) as writer:
        for step, loss in ((0, 5.0), (1, 4.5), (2, 4.25)):
            writer.add_scalar("train/loss", loss, step)
    runs = [Run(tmp_path / "a.yaml", tmp_path / "a" / "s0", returncode=None, log=tmp_path / "a0.log", seed=0),
            Run(tmp_path / "a.yaml", tmp_path / "a" / "s1", returncode=0, seed=1),
            Run(tmp_path / "b.yaml", tmp_path / "b" / "s0", returncode=3, seed=0),
            Run(tmp_path / "b.yaml", tmp_path / "b" / "s1", returncode=None, log=tmp_path / "b1.log", seed=1),
            Run(tmp_path / "b.yaml", tmp_path / "b" / "s2", returncode=None, seed=2)]
    lines = progress_lines(runs, {0, 3}, tmp_path / "logs")
    assert lines[0].endswith(f"1 done, 2 running, 1 failed, 1 waiting; logs in {tmp_path / 'logs'}/")
    assert lines[1] == f"  a seed 0: step 3, train loss 4.2500 ({tmp_path / 'a0.log'})"
    assert lines[2] == f"  b seed 1: starting ({tmp_path / 'b1.log'})"


def test_the_table_is_the_same_whichever_launcher_ran_the_family(tmp_path, monkeypatch, capsys):
    """The same runs through submitit's job array (its local executor stands in for SLURM) and as local
    processes: the same final losses, so the same table."""
    pytest.importorskip("submitit")
    monkeypatch.chdir(tmp_path)
    family = tmp_path / "family"
    family.mkdir()
    (family / "a_narrow.yaml").write_text(TINY.format(name="a_narrow", width=16, mlp="components.MLP"))
    tables = {}
    for launcher in (["--launcher", "local"], ["--launcher", "slurm", "--submitit-cluster", "local"]):
        main([str(family), "--seeds", "1", "--jobs", "1", "--progress", "0", *launcher,
              "--set", "trainer.enable_checkpointing=false"])
        out = capsys.readouterr().out
        rows = [line for line in out.splitlines() if line.startswith("| a_narrow")]
        assert len(rows) == 1 and "| 1 of 1 |" in rows[0], out
        tables[launcher[1]] = rows[0].split("|")[3:6]  # loss mean ± sd, interval, accuracy
    assert "job array (local" in out
    assert tables["local"] == tables["slurm"]


def test_gpu_groups_and_what_a_run_is_given(monkeypatch):
    import torch

    from recipes.launchers import device_groups, gpu_arguments, visible_gpus

    assert device_groups(["0", "1", "2", "3", "4"], 2) == [["0", "1"], ["2", "3"]]  # GPU 4 stays idle
    assert device_groups(["3"], 1) == [["3"]]
    with pytest.raises(ValueError, match="fewer than --devices-per-run=2"):
        device_groups(["0"], 2)
    with pytest.raises(ValueError, match=r"--devices-per-run=0 must be >= 1"):
        device_groups(["0", "1"], 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6,")
    assert visible_gpus() == ["4", "6"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_gpus() == [str(i) for i in range(torch.cuda.device_count())]  # (none on a CPU machine)
    env, flags = gpu_arguments(["2", "3"])
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3"} and flags[-2:] == ["--trainer.devices", "2"]


def test_a_slurm_job_array_asks_for_each_runs_gpus_and_one_task_per_gpu(tmp_path, monkeypatch):
    """What the SLURM executor is given (a stand-in ``srun`` on the path: submitit looks for it): one task per GPU
    (Lightning runs a process per task), the array's parallelism, a day by default, the user's own parameters; the
    local executor gets no GPU request. Each job runs this interpreter's ``python -m recipes fit``."""
    import os
    import sys

    pytest.importorskip("submitit")
    from recipes.launchers import python_command, submitit_executor

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "bin" / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    slurm = submitit_executor(tmp_path / "s", cluster="slurm", devices_per_run=2, parallel=3,
                              slurm={"slurm_partition": "gpu"})
    assert slurm._executor.parameters == {"time": 1440, "gpus_per_node": 2, "ntasks_per_node": 2,
                                          "array_parallelism": 3, "partition": "gpu"}
    local = submitit_executor(tmp_path / "l", cluster="local", devices_per_run=2, parallel=3, slurm={})
    assert "gpus_per_node" not in local._executor.parameters
    assert python_command() == [sys.executable, "-m", "recipes", "fit"]


def test_a_slurm_sweep_where_there_is_no_slurm_is_refused_before_it_writes_anything(tmp_path, monkeypatch):
    """Without SLURM (no ``srun`` on the PATH) submitit took its local executor: ``--launcher slurm`` ran the whole
    array on this machine — on a login node, say — saying only "(local, 1 at a time)". Now refused by name, before the
    sweep's folder exists; ``--submitit-cluster local`` still runs it locally, and without submitit the error is one
    line too."""
    import sys

    pytest.importorskip("submitit")
    from recipes.launchers import check_slurm

    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # (no srun, whatever machine runs the test)
    family = tmp_path / "family"
    family.mkdir()
    (family / "a.yaml").write_text(TINY.format(name="a", width=16, mlp="components.MLP"))
    message = (r"^error: --launcher slurm: SLURM is not available here \(submitit finds no srun on the PATH\); run "
               r"the sweep where SLURM is, or --launcher local, or --submitit-cluster local to run the array as local "
               r"processes$")
    with pytest.raises(SystemExit, match=message):
        main([str(family), "--launcher", "slurm", "--progress", "0"])
    assert not (tmp_path / "runs").exists()  # no sweep folder, no run
    assert check_slurm("local").__name__ == "submitit"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "bin" / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert check_slurm(None).__name__ == "submitit"
    monkeypatch.setitem(sys.modules, "submitit", None)  # not installed
    with pytest.raises(SystemExit, match=r'^error: --launcher slurm needs submitit: pip install "hybrid-zoo\[slurm\]"'):
        main([str(family), "--launcher", "slurm", "--progress", "0"])
    assert not (tmp_path / "runs").exists()


def test_gpus_launcher_gives_each_concurrent_run_its_own_device(tmp_path, monkeypatch, capsys):
    """Four runs on two visible 'GPUs': never two runs on one device at a time (the fit is a stub that records
    its CUDA_VISIBLE_DEVICES and the time it held it)."""
    import json
    import sys

    import recipes.sweep.launch as sweep

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    stub = tmp_path / "stub.py"
    stub.write_text("import json, os, sys, time\nstart = time.time(); time.sleep(0.5)\n"
                    "print(json.dumps({'gpu': os.environ['CUDA_VISIBLE_DEVICES'], 'start': start, 'end': time.time(), "
                    "'args': sys.argv[1:]}))\n")
    monkeypatch.setattr(sweep, "python_command", lambda: [sys.executable, str(stub)])
    family = tmp_path / "family"
    family.mkdir()
    (family / "a.yaml").write_text(TINY.format(name="a", width=16, mlp="components.MLP"))
    logs, runs = sweep.launch(sorted(family.glob("*.yaml")), [], seeds=4, jobs=1, family="family", progress_every=0,
                              launcher="gpus")
    spans = [json.loads(run.log.read_text().strip().splitlines()[-1]) for run in runs]
    assert {s["gpu"] for s in spans} == {"5", "7"} and all(s["args"][-2:] == ["--trainer.devices", "1"] for s in spans)
    for a in spans:
        for b in spans:
            if a is not b and a["gpu"] == b["gpu"]:
                assert a["end"] <= b["start"] or b["end"] <= a["start"]  # one run per device at a time
    out = capsys.readouterr().out
    assert "2 at a time on GPUs" in out
    # progress_every=0 prints no progress table: CI once lost a worker to a zero-wait loop that printed one
    # table after another for the whole sweep
    assert "[sweep " not in out
    recipes = {str((family / "a.yaml").resolve()): sweep.recipe_hash(family / "a.yaml")}  # (a resume checks them)
    assert json.loads((logs / "launcher.json").read_text()) == dict(
        launcher="gpus", devices_per_run=1, submitit_cluster=None, slurm={}, cwd=str(tmp_path), recipes=recipes)
    # a resume runs where the sweep ran (on the GPUs, given the same flags) unless told otherwise
    for run in runs:
        run.folder.mkdir(parents=True)  # (as a run leaves it; else the sweep's record.json would stand for the runs)
    for launcher in (None, "local"):
        ended(logs, 1, 1)
        sweep.resume(logs, progress_every=0, launcher=launcher)
        resumed = json.loads(runs[1].log.read_text().strip().splitlines()[-1])
        assert ("--trainer.accelerator" in resumed["args"]) == (launcher is None), resumed["args"]
    assert "1 runs, 2 at a time on GPUs" in capsys.readouterr().out


def echo_family(tmp_path, monkeypatch) -> Path:
    """``tmp_path/family`` with one tiny recipe ``a``, in ``tmp_path`` as the working folder, whose runs print their
    arguments in place of training."""
    import sys

    import recipes.sweep.launch as sweep

    monkeypatch.chdir(tmp_path)
    stub = tmp_path / "stub.py"
    stub.write_text("import sys\nprint(' '.join(sys.argv[1:]))\n")
    monkeypatch.setattr(sweep, "python_command", lambda: [sys.executable, str(stub)])
    family = tmp_path / "family"
    family.mkdir()
    (family / "a.yaml").write_text(TINY.format(name="a", width=16, mlp="components.MLP"))
    return family


def test_a_slurm_sweep_resumes_as_a_job_array(tmp_path, monkeypatch, capsys):
    """A sweep submitted as a job array resumes as one (submitit's local executor stands in for SLURM): only its
    unfinished runs, with the SLURM parameters it was launched with; a resume on the login node's cores would be
    the wrong machine."""
    pytest.importorskip("submitit")
    import recipes.sweep.launch as sweep

    family = echo_family(tmp_path, monkeypatch)
    logs, runs = sweep.launch(sorted(family.glob("*.yaml")), [], seeds=2, jobs=1, family="family", progress_every=0)
    # (run here, the sweep is quicker than submitit's local executor; its record made what a job array's would be)
    (logs / "launcher.json").write_text(json.dumps(dict(launcher="slurm", devices_per_run=1, submitit_cluster="local",
                                                        slurm={"timeout_min": 5})))
    for run in runs:
        run.folder.mkdir(parents=True)  # (as a run leaves it)
    ended(logs, 0, 130)
    capsys.readouterr()
    family_name, resumed = sweep.resume(logs, progress_every=0)
    out = capsys.readouterr().out
    assert "sweep: 1 runs submitted as a job array (local" in out and "[sweep " not in out  # (0: no progress table)
    assert [run.returncode for run in resumed] == [0, 0]
    assert len(runs[0].log.read_text().splitlines()) == 2 and len(runs[1].log.read_text().splitlines()) == 1
    assert [r["returncode"] for r in json.loads((logs / "sweep.json").read_text())["runs"]] == [0, 0]


def test_a_sweep_launched_as_a_job_array_submits_its_runs_and_records_how(tmp_path, monkeypatch, capsys):
    """``launcher="slurm"`` (submitit's local executor standing in): every run goes into one job array, the sweep
    waits for them, printing its progress table, and ``launcher.json`` says how it ran, so that a resume submits
    again."""
    pytest.importorskip("submitit")
    import re

    import recipes.sweep.launch as sweep

    family = echo_family(tmp_path, monkeypatch)
    (tmp_path / "stub.py").write_text("import sys, time\ntime.sleep(1)\nprint(' '.join(sys.argv[1:]))\n")
    logs, runs = sweep.launch(sorted(family.glob("*.yaml")), [], seeds=2, jobs=2, family="family", progress_every=0.2,
                              launcher="slurm", submitit_cluster="local")
    out = capsys.readouterr().out
    assert "sweep: 2 runs submitted as a job array (local, 2 at a time)" in out
    tables = re.findall(r"^\[sweep [0-9:]{8}\] (.*); logs in", out, re.MULTILINE)
    assert tables[0] == "0 done, 2 running, 0 failed, 0 waiting"  # (the first table: the jobs take a second)
    assert [run.returncode for run in runs] == [0, 0] and (logs / "submitit").is_dir()
    assert [run.log.read_text().split()[-1] for run in runs] == ["0", "1"]  # (each ran with its own --seed_everything)
    assert json.loads((logs / "launcher.json").read_text()) == dict(
        launcher="slurm", devices_per_run=1, submitit_cluster="local", slurm={}, cwd=str(tmp_path),
        recipes={str((family / "a.yaml").resolve()): sweep.recipe_hash(family / "a.yaml")})


def test_a_held_sweep_lock_refuses_a_second_writer_naming_the_runs_recorded_as_running(tmp_path):
    """The lock a sweep and its runs hold: taken again while held (a resume while the sweep's runs go on), it is
    refused, naming each run recorded as running with its process, or, where the manifest names none, how to find
    the holders."""
    from recipes.sweep.launch import sweep_lock
    from recipes.sweep.records import Run, write_manifest

    runs = [Run(tmp_path / "a.yaml", tmp_path / "a", returncode=None, seed=0, pid=4242),  # running
            Run(tmp_path / "a.yaml", tmp_path / "a1", returncode=None, seed=1, pid=None),  # not started
            Run(tmp_path / "b.yaml", tmp_path / "b", returncode=0, seed=None, pid=77),  # ended
            Run(tmp_path / "b.yaml", tmp_path / "b1", returncode=None, seed=None, pid=4343)]
    write_manifest(tmp_path, "family", runs)
    with sweep_lock(tmp_path) as held:
        assert held is not None
        with pytest.raises(ValueError) as info:
            with sweep_lock(tmp_path):
                pass
        assert str(info.value).startswith(f"{tmp_path}: the sweep or a run it started still runs (a seed 0 (process "
                                          "4242), b (process 4343)); a second writer")
        write_manifest(tmp_path, "family", runs[1:3])
        with pytest.raises(ValueError, match=r"still runs \(`fuser .*/sweep.lock` names the processes\)"):
            with sweep_lock(tmp_path):
                pass
    with sweep_lock(tmp_path) as again:  # released with its block
        assert again is not None


def test_a_seeded_sweep_of_a_family_compares_with_its_declared_baseline_within_its_margin(tmp_path, monkeypatch):
    """``_family.yaml``'s ``baseline`` and ``equivalence_margin`` reach a new seeded sweep's table (the runs print
    their arguments in place of training); ``--baseline`` and ``--margin`` win over them, and a baseline that
    ``--only`` leaves out is not used. A sweep without seeds makes no comparison."""
    import recipes.sweep.cli as cli

    family = echo_family(tmp_path, monkeypatch)
    (family / "b.yaml").write_text(TINY.format(name="b", width=16, mlp="components.MLP"))
    (family / "_family.yaml").write_text("baseline: b\nequivalence_margin: 0.05\n")
    asked = []
    monkeypatch.setattr(cli, "report", lambda runs, logs, family, seeded, baseline, vs, metric, margin, notes: asked.append(
        ([(run.config.stem, run.seed) for run in runs], seeded, baseline, margin)) or "table")
    main([str(family), "--seeds", "2", "--progress", "0"])
    assert asked.pop() == ([("a", 0), ("a", 1), ("b", 0), ("b", 1)], True, "b", 0.05)
    main([str(family), "--seeds", "1", "--progress", "0", "--baseline", "a", "--margin", "0.2"])
    assert asked.pop() == ([("a", 0), ("b", 0)], True, "a", 0.2)
    main([str(family), "--seeds", "1", "--progress", "0", "--only", "a"])
    assert asked.pop() == ([("a", 0)], True, None, 0.05)
    main([str(family), "--progress", "0"])
    assert asked.pop() == ([("a", None), ("b", None)], False, None, None)


def test_a_resumed_sweep_whose_run_fails_again_ends_in_an_error_naming_it(tmp_path, monkeypatch, capsys):
    import recipes.sweep.launch as sweep

    family = echo_family(tmp_path, monkeypatch)
    (tmp_path / "stub.py").write_text("import sys\nsys.exit(3)\n")
    logs, runs = sweep.launch(sorted(family.glob("*.yaml")), [], jobs=1, family="family", progress_every=0)
    assert [run.returncode for run in runs] == [3]
    with pytest.raises(SystemExit) as info:
        main(["--resume", str(logs), "--progress", "0"])
    assert str(info.value.code) == "error: 1 of 1 runs failed: a"
    assert "| a |" in capsys.readouterr().out  # (the table first)
    (tmp_path / "stub.py").write_text("print('trained')\n")
    # a recipe edited since the sweep began: the runs left would train another recipe than its finished ones did
    recipe = family / "a.yaml"
    text = recipe.read_text()
    recipe.write_text(text.replace("max_steps: 4", "max_steps: 5"))
    with pytest.raises(SystemExit, match=r"a.yaml changed since the sweep began \(or is gone\): its runs left would "
                                         r"train another recipe .* put it back as it was"):
        main(["--resume", str(logs), "--progress", "0"])
    recipe.write_text(text)
    main(["--resume", str(logs), "--progress", "0"])  # (it ends without an error now)
    assert (logs / "a.log").read_text().splitlines()[-1] == "trained"


def test_first_seed_adds_later_seeds_to_an_earlier_sweep(tmp_path, monkeypatch):
    import recipes.sweep.launch as sweep

    family = echo_family(tmp_path, monkeypatch)
    logs, runs = sweep.launch(sorted(family.glob("*.yaml")), [], seeds=2, jobs=1, family="family", progress_every=0,
                              first_seed=3)
    assert [run.seed for run in runs] == [3, 4] and [run.folder.name[-6:] for run in runs] == ["_seed3", "_seed4"]
    assert "--seed_everything 4" in runs[1].log.read_text()
    # The record grows as each run ends (a sweep stopped halfway keeps its finished runs); the stub left no
    # numbers to keep, so its runs are recorded as finished with none, and their cells will say so.
    record = json.loads((logs / "record.json").read_text())
    assert [(r["seed"], r["returncode"], "stored" in r) for r in record["runs"]] == [(3, 0, False), (4, 0, False)]
    with pytest.raises(SystemExit, match="--first-seed 2 must be >= 0, and goes with --seeds"):
        main([str(family), "--first-seed", "2"])


def test_a_requeued_job_resumes_from_its_own_last_checkpoint(tmp_path):
    """A requeued job, or a resumed sweep's run, continues from its run's ``last.ckpt``; without one it starts again,
    and the checkpoints its killed attempt left (which a fresh fit would refuse to write over) are removed."""
    pytest.importorskip("submitit")
    from recipes.launchers import RecipeJob, resume_arguments

    folder = tmp_path / "run"
    command = ["python", "-m", "recipes", "fit", "--config", "x.yaml"]
    assert resume_arguments(command, folder) == command  # nothing written yet: start from scratch
    checkpoints = folder / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "best.ckpt").write_bytes(b"")  # a first attempt killed before its first last.ckpt
    (checkpoints / "swa.ckpt").mkdir()  # (sharded)
    (checkpoints / "mine.ckpt").write_bytes(b"")
    assert resume_arguments(command, folder) == command  # from scratch again, its own stale checkpoints removed
    assert [path.name for path in checkpoints.iterdir()] == ["mine.ckpt"]
    (checkpoints / "best.ckpt").write_bytes(b"")
    (checkpoints / "last.ckpt").mkdir()  # a sharded last checkpoint resumes too
    assert resume_arguments(command, folder)[-2:] == ["--ckpt_path", str(checkpoints / "last.ckpt")]
    assert (checkpoints / "best.ckpt").exists()
    assert resume_arguments([*command, "--ckpt_path", "x"], folder) == [*command, "--ckpt_path", "x"]
    again = RecipeJob(command, {}, tmp_path / "log", folder, tmp_path).checkpoint()
    assert isinstance(again.function, RecipeJob) and again.function.command == command


def test_a_job_runs_its_command_in_its_folder_with_its_environment_and_appends_to_its_log(tmp_path):
    """What a SLURM job runs (``RecipeJob.__call__``): the command in ``cwd`` with the run's environment on top of the
    job's, output and errors appended to the run's log, its exit status returned; continued from ``last.ckpt``."""
    import sys

    from recipes.launchers import RecipeJob

    script = ("import os, sys; print(os.getcwd(), os.environ['ZOO_TEST'], 'PATH' in os.environ, sys.argv[1:], flush=True); "
              "print('to stderr', file=sys.stderr); sys.exit(3)")
    log, folder = tmp_path / "run.log", tmp_path / "run"
    log.write_text("earlier output\n")
    (tmp_path / "cwd").mkdir()
    job = RecipeJob([sys.executable, "-c", script], {"ZOO_TEST": "seven"}, log, folder, tmp_path / "cwd")
    assert job() == 3
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert job() == 3
    lines = log.read_text().splitlines()
    assert lines[0] == "earlier output" and lines.count("to stderr") == 2
    assert lines[1] == f"{tmp_path / 'cwd'} seven True []"
    assert lines[3] == f"{tmp_path / 'cwd'} seven True ['--ckpt_path', '{folder / 'checkpoints' / 'last.ckpt'}']"


def test_a_run_whose_recipe_was_edited_while_the_sweep_ran_does_not_start(tmp_path, monkeypatch, capsys):
    """A run that starts after an edit of its recipe (a later seed, its slot freed an hour in) would train the edited
    recipe and be tabulated as a seed of the first: it does not start, says why in its log and the sweep's error,
    and the recipe put back, a resume runs it."""
    family = echo_family(tmp_path, monkeypatch)
    recipe = family / "a.yaml"
    text = recipe.read_text()
    # the first run edits its recipe as it runs, as a researcher preparing the next experiment would
    (tmp_path / "stub.py").write_text(
        "import pathlib, sys\nprint(' '.join(sys.argv[1:]))\n"
        "pathlib.Path('runs/fake/a', sys.argv[sys.argv.index('--trainer.logger.init_args.version') + 1]).mkdir(parents=True)\n"
        "if sys.argv[sys.argv.index('--seed_everything') + 1] == '0':\n"
        "    path = pathlib.Path('family/a.yaml'); path.write_text(path.read_text().replace('max_steps: 4', 'max_steps: 9'))\n")
    with pytest.raises(SystemExit) as info:
        main([str(family), "--seeds", "2", "--progress", "0"])
    assert str(info.value.code) == ("error: 1 of 2 runs failed: a; a.yaml changed since the sweep began, so its runs "
                                    "left did not start: put it back as it was and --resume the sweep")
    logs = sorted((tmp_path / "runs" / "sweep-logs").iterdir())[-1]
    _, runs = read_manifest(logs)
    assert [run.returncode for run in runs] == [0, 75]
    assert runs[1].ending.startswith("NOT STARTED (its recipe changed since the sweep began")
    assert (logs / "a_seed1.log").read_text() == (
        "sweep: a.yaml changed since the sweep began (or is gone), so this run did not start: it would train another "
        f"recipe than the sweep's other runs did; put the recipe back as it was and resume the sweep (python -m "
        f"recipes.sweep --resume runs/sweep-logs/{logs.name}), or start a new sweep of the edited family\n")
    assert "NOT STARTED" in capsys.readouterr().out  # (in the table's notes)
    recipe.write_text(text)
    main(["--resume", str(logs), "--progress", "0"])
    _, runs = read_manifest(logs)
    assert [run.returncode for run in runs] == [0, 0]
    assert (logs / "a_seed1.log").read_text().splitlines()[-1].endswith("--seed_everything 1")


def test_a_sweeps_table_says_when_its_runs_ran_different_code(tmp_path, monkeypatch, capsys):
    """A run started after the code changed beneath the sweep (a ``git pull`` an hour in) is named under the table
    with the version it ran; runs that all ran one version get no note."""
    import sys

    import recipes.sweep.launch as sweep

    family = echo_family(tmp_path, monkeypatch)
    (tmp_path / "stub.py").write_text(
        "import json, pathlib, sys\n"
        "folder = pathlib.Path('runs/fake/a', sys.argv[sys.argv.index('--trainer.logger.init_args.version') + 1])\n"
        "folder.mkdir(parents=True)\n"
        "seed = sys.argv[sys.argv.index('--seed_everything') + 1]\n"
        "commit = ('a' if seed == '0' else sys.argv[1]) * 40  # (seed 1's code: the stub's first argument)\n"
        "data = ('d' if seed == '0' or sys.argv[1] == 'a' else 'e') * 16  # (and the corpus made again)\n"
        "(folder / 'code.json').write_text(json.dumps([{'step': 0, 'commit': commit, 'edits': None, 'torch': '2.13', "
        "'data': data}]))\n")
    for code in ("a", "b"):
        monkeypatch.setattr(sweep, "python_command", lambda: [sys.executable, str(tmp_path / "stub.py"), code])
        main([str(family), "--seeds", "2", "--progress", "0"])
        if code == "a":
            out = capsys.readouterr().out
            assert "- the runs come from" not in out and "other data" not in out
    out = capsys.readouterr().out
    assert ("- the runs come from 2 versions of the code (a commit, +edits: uncommitted changes by hash, the torch that "
            "ran them), which may not compute the same: aaaaaaa, torch 2.13: a seed 0; bbbbbbb, torch 2.13: a seed 1"
            ) in out
    assert "- runs of one recipe read other data (the data's content hash differs), so they are not seeds of one " \
           "experiment: a seed 0 read dddddddd, a seed 1 read eeeeeeee" in out


def test_a_slurm_job_whose_recipe_was_edited_since_the_launch_does_not_run(tmp_path):
    """A job array's task scheduled hours after the launch, or a job requeued after preemption, reads its recipe
    then: edited since, it does not run (exit 75, the reason in its log) and a requeue carries the launch's hash."""
    pytest.importorskip("submitit")
    import sys

    from recipes.launchers import RecipeJob, recipe_hash

    recipe, log = tmp_path / "a.yaml", tmp_path / "a.log"
    recipe.write_text("model: {}\n")
    job = RecipeJob([sys.executable, "-c", "print('trained')"], {}, log, tmp_path / "run", tmp_path,
                    ("a.yaml", recipe_hash(recipe)))
    assert job() == 0 and log.read_text() == "trained\n"
    recipe.write_text("model: {lr: 0.1}\n")
    again = job.checkpoint().function
    assert again.recipe == job.recipe
    assert again() == 75
    assert log.read_text().splitlines()[-1].startswith("sweep: a.yaml changed since the sweep began (or is gone), so "
                                                        "this run did not start")
    recipe.unlink()
    assert again() == 75


def test_starting_checkpoints_take_each_pairs_first_finished_run_and_name_every_gap_in_one_error(tmp_path):
    """Fine-tuning's sources, without training: (recipe name, seed) → the first finished run's ``last.ckpt`` over the
    earlier sweeps in the order given; a failed run is passed over; runs of another family, pairs no sweep finished
    and checkpoints gone are all named, each once, in one error."""
    from recipes.sweep.launch import starting_checkpoints
    from recipes.sweep.records import Run, write_manifest

    family = tmp_path / "english" / "transfer" / "pretrain"

    def sweep(name: str, runs: list[tuple[str, int | None, int]], where: Path = family) -> Path:
        logs = tmp_path / name
        logs.mkdir()
        made = []
        for recipe, seed, returncode in runs:
            folder = tmp_path / f"{name}_{recipe}_{seed}"
            (folder / "checkpoints").mkdir(parents=True)
            (folder / "checkpoints" / "last.ckpt").write_text("weights")
            made.append(Run(where / f"{recipe}.yaml", folder, returncode=returncode, seed=seed))
        write_manifest(logs, "pretrain", made)
        return logs

    last = lambda name: (tmp_path / name / "checkpoints" / "last.ckpt").resolve()  # noqa: E731
    first = sweep("first", [("a", 0, 0), ("a", 1, 1), ("b", 0, 0)])  # a seed 1 failed here
    second = sweep("second", [("a", 0, 0), ("a", 1, 0), ("b", None, 0)])
    configs = [Path("finetune/a.yaml"), Path("finetune/b.yaml")]
    for named in (None, "pretrain", "transfer/pretrain", "english/transfer/pretrain"):
        points = starting_checkpoints(configs[:1], [0, 1], [first, second], family=named)
        assert {key: value.resolve() for key, value in points.items()} == {
            ("a", 0): last("first_a_0"), ("a", 1): last("second_a_1")}
    assert starting_checkpoints(configs[1:], [None], [second])[("b", None)].resolve() == last("second_b_None")

    with pytest.raises(ValueError) as info:
        starting_checkpoints(configs[:1], [0, 1], [first, second], family="english/finetune")
    assert str(info.value) == "--init-from: " + "; ".join(
        f"{logs} ran {(family / f'{recipe}.yaml').resolve()}, not a recipe of english/finetune"
        for logs, recipe in ((first, "a"), (first, "b"), (second, "a"), (second, "b"))) + (
        f"; no finished run of a seed 0 in {first}, {second}; no finished run of a seed 1 in {first}, {second}")

    (tmp_path / "second_a_1" / "checkpoints" / "last.ckpt").unlink()
    with pytest.raises(ValueError) as info:
        starting_checkpoints(configs, [0, 1, 2], [first, second])
    assert str(info.value) == (
        f"--init-from: a seed 1: {tmp_path / 'second_a_1' / 'checkpoints' / 'last.ckpt'} is missing; "
        f"no finished run of a seed 2 in {first}, {second}; no finished run of b seed 1 in {first}, {second}; "
        f"no finished run of b seed 2 in {first}, {second}")


def test_init_from_fine_tunes_each_run_from_the_earlier_sweeps_run_of_its_name_and_seed(tmp_path, monkeypatch, capsys):
    import statistics

    from recipes.sweep.records import read_manifest, run_result
    from recipes.transfer import main as transfer_main

    monkeypatch.chdir(tmp_path)
    pre, fine, other = (tmp_path / name for name in ("pre", "fine", "other"))
    for folder in (pre, fine, other):
        folder.mkdir()
        (folder / "a.yaml").write_text(TINY.format(name=f"{folder.name}/a", width=16, mlp="components.MLP"))
    (fine / "_family.yaml").write_text("starts_from: pre\n")
    with pytest.raises(SystemExit, match="fine-tunes the runs of pre: run that family first"):
        main([str(fine), "--seeds", "2"])

    main([str(pre), "--seeds", "2", "--jobs", "2"])
    pre_logs = next((tmp_path / "runs" / "sweep-logs").iterdir())
    main([str(other), "--set", "trainer.max_steps=2"])
    other_logs = max((tmp_path / "runs" / "sweep-logs").iterdir(), key=lambda p: p.stat().st_mtime)
    with pytest.raises(SystemExit, match="no finished run of a seed 2 in"):  # checked before anything launches
        main([str(fine), "--seeds", "3", "--init-from", str(pre_logs)])
    with pytest.raises(SystemExit, match="ran .*other/a.yaml, not a recipe of pre"):
        main([str(fine), "--init-from", str(other_logs)])
    assert len(list((tmp_path / "runs" / "sweep-logs").iterdir())) == 2  # the refused sweeps started nothing

    capsys.readouterr()
    main([str(fine), "--seeds", "2", "--jobs", "2", "--init-from", str(pre_logs)])
    fine_logs = max((tmp_path / "runs" / "sweep-logs").iterdir(), key=lambda p: p.stat().st_mtime)
    _, pretrained = read_manifest(pre_logs)
    _, tuned = read_manifest(fine_logs)
    for run in tuned:
        source = next(r for r in pretrained if r.seed == run.seed)
        assert run.init_from == source.folder / "checkpoints" / "last.ckpt"
        assert "init_from: loaded" in run.log.read_text() and str(run.init_from) in run.log.read_text()
    assert "| a | 2 of 2 |" in capsys.readouterr().out

    main([str(fine), "--seeds", "2", "--jobs", "2", "--init-from", "none"])  # the control: said out loud, from scratch
    scratch = max((tmp_path / "runs" / "sweep-logs").iterdir(), key=lambda p: p.stat().st_mtime)
    _, controls = read_manifest(scratch)
    for run in controls:
        assert run.init_from is None and "init_from: loaded" not in run.log.read_text()

    # The three stages in one table, joined by seed: each cell is the runs' own final loss, the gain per seed.
    capsys.readouterr()
    transfer_main(["--pretrain", str(pre_logs), "--finetune", str(fine_logs), "--control", str(scratch / "record.json")])
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| a |")]
    loss = lambda runs: [run_result(run)["val_loss"] for run in sorted(runs, key=lambda r: r.seed)]  # noqa: E731
    gain = [c - f for c, f in zip(loss(controls), loss(tuned))]
    cells = [cell.strip() for cell in row.split("|")[1:-1]]
    assert cells[1] == "0, 1"
    for cell, values in zip((cells[2], cells[3], cells[5], cells[6]), (loss(pretrained), loss(tuned), loss(controls), gain)):
        assert cell == f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}"
    with pytest.raises(SystemExit, match="control a seed 0 started from .*a control trains from scratch"):
        transfer_main(["--pretrain", str(pre_logs), "--finetune", str(fine_logs), "--control", str(fine_logs)])


def test_a_record_tabulates_and_plots_the_sweep_without_its_run_folders(tmp_path, capsys):
    """The record keeps each finished run's figures, curves and hyper-parameters: the seed table, the curves and
    the metric-against-width lines from it equal those from the run folders, which are then deleted."""
    import shutil

    from recipes.sweep.report import metric_vs, seed_table, val_curves
    from recipes.sweep.records import read_manifest, write_manifest, write_record

    runs = fake_family(tmp_path)
    runs[1].returncode = 3  # a failed seed: kept as failed, named under the table
    logs = tmp_path / "logs"
    logs.mkdir()
    write_manifest(logs, "fake", runs)
    record = write_record(logs, "fake", runs)
    before = (seed_table(runs, "a", 0.1), val_curves(runs), metric_vs(runs, "d_model"))
    for name in ("a", "b"):
        shutil.rmtree(tmp_path / name)
    for source in (record, logs):  # the file, or the log folder whose run folders are gone
        family, stored = read_manifest(source)
        assert family == "fake" and [(r.config.stem, r.seed, r.returncode) for r in stored] == [
            (r.config.stem, r.seed, r.returncode) for r in runs]
        assert (seed_table(stored, "a", 0.1), val_curves(stored), metric_vs(stored, "d_model")) == before
    assert "a seed 1 FAILED (exit 3" in before[0]
    with pytest.raises(SystemExit, match="evaluate the runs' checkpoints; a sweep's record holds only"):
        main(["--from", str(record), "--suite", "length"])


@pytest.mark.parametrize("text, problem", [
    ("{not json", r"not a sweep record, nor a sweep's log folder: not JSON text \(Expecting property name"),
    (b"PK\x03\x04\xff", "not a sweep record, nor a sweep's log folder: not JSON text \\('utf-8' codec"),  # a checkpoint
    ('{"family": "fake", "runs": []}', "not a sweep record of format 1"),
    ('{"family": "fake", "format": 1, "runs": [{"config": "a.yaml", "folder": "x", "returncode": 0}]}', "'log'"),
    ('{"family": "fake", "format": 1}', "'runs'"),
    (None, "No such file"),
])
def test_a_file_that_is_not_a_sweep_record_is_refused_by_name(tmp_path, text, problem):
    path = tmp_path / "record.json"
    if text is not None:  # None: a record that is not there
        path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    with pytest.raises(SystemExit, match=f"error: {path}: .*{problem}"):
        main(["--from", str(path)])
    if isinstance(text, bytes):  # --resume reads what it is given as --from does
        with pytest.raises(SystemExit, match=f"error: {path}: .*{problem}"):
            main(["--resume", str(path)])


@pytest.fixture
def no_launch(tmp_path, monkeypatch):
    """For tests of refusals of the bundled families: a refusal that let the sweep through would otherwise train
    them for real (found when a planted bug did); here it fails at once, in a folder of the test's own."""
    import recipes.sweep.cli as cli

    def launched(*args, **kwargs):
        raise AssertionError("the sweep launched runs")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "launch", launched)
    monkeypatch.setattr(cli, "resume", launched)


@pytest.mark.parametrize("flags, message", [
    (["--jobs", "0"], "error: --jobs 0 must be >= 1"),  # it said "--seeds None and --jobs 0"
    (["--seeds", "0"], "error: --seeds 0 must be >= 1"),
    (["--seeds", "0", "--jobs", "-1"], "error: --seeds 0 and --jobs -1 must be >= 1"),
])
def test_a_count_below_one_is_named_alone(flags, message, no_launch):
    with pytest.raises(SystemExit) as info:
        main(["positions", *flags])
    assert info.value.code == message


def test_a_resume_with_no_jobs_and_a_margin_of_zero_are_refused(tmp_path, capsys, no_launch):
    with pytest.raises(SystemExit, match=r"^error: --jobs 0 must be >= 1$"):  # before the sweep's folder is read
        main(["--resume", str(tmp_path / "gone"), "--jobs", "0"])
    with pytest.raises(SystemExit) as info:
        main(["positions", "--seeds", "2", "--margin", "0"])  # an equivalence margin of 0 nats: nothing is equivalent
    assert info.value.code == 2 and "argument --margin: 0" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    ([], "error: name a folder of recipes (or --from a sweep's log folder)"),
    (["positions", "--suite", "length"], "error: --suite and --tasks evaluate a finished sweep: give its log folder"),
    (["positions", "--table-only", "--seeds", "2"], "error: --table-only reads one run per recipe; --seeds launches"),
    (["positions", "--table-only", "--init-from", "none"], "error: --init-from starts new runs; --table-only launches"),
    (["positions", "--first-seed", "-1", "--seeds", "2"], "error: --first-seed -1 must be >= 0, and goes with --seeds"),
])
def test_a_sweep_of_a_folder_refuses_what_it_cannot_do_before_reading_it(flags, message, tmp_path, monkeypatch,
                                                                         no_launch):
    with pytest.raises(SystemExit) as info:
        main(flags)
    assert info.value.code.startswith(message)
    assert not (tmp_path / "runs").exists()


def test_slurm_parameters_are_key_value_items_with_whole_numbers_as_ints(capsys):
    import argparse

    from recipes.sweep.cli import slurm_parameters

    parser = argparse.ArgumentParser(prog="python -m recipes.sweep")
    assert slurm_parameters(parser, ["slurm_partition=gpu", "timeout_min=600", "slurm_comment=a=b"]) == {
        "slurm_partition": "gpu", "timeout_min": 600, "slurm_comment": "a=b"}
    with pytest.raises(SystemExit) as info:
        slurm_parameters(parser, ["timeout_min=600", "gpu"])
    assert info.value.code == 2
    assert "--slurm takes KEY=VALUE items; got ['timeout_min=600', 'gpu']" in capsys.readouterr().err


def test_the_gpus_launcher_without_a_gpu_is_one_line_and_leaves_no_log_folder(tmp_path, monkeypatch):
    import recipes.sweep.launch as sweep

    def ran(*args, **kwargs):  # (a check that let the sweep through would train a bundled recipe for real)
        raise AssertionError("the sweep ran its runs")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(sweep, "run_here", ran)
    with pytest.raises(SystemExit) as info:
        main(["positions", "--only", "ssd_rope", "--launcher", "gpus"])
    assert info.value.code == "error: --launcher gpus: 0 visible GPU(s), fewer than --devices-per-run=1"  # a traceback
    assert not (tmp_path / "runs").exists()


STOPPABLE = """import os, signal, sys, time
print(' '.join(sys.argv[1:]), flush=True)
received = []
signal.signal(signal.SIGINT, lambda *_: received.append(time.time()))
if os.environ.get("STUB_STOP_PARENT") in ("1", "TERM"):  # the sweep's Ctrl+C (or a scheduler's SIGTERM), once this
    os.kill(os.getppid(), signal.SIGTERM if os.environ["STUB_STOP_PARENT"] == "TERM" else signal.SIGINT)  # run runs
end = time.time() + 20
while time.time() < end and not received:
    time.sleep(0.05)
time.sleep(0.5)  # (a second signal, had the sweep passed on more than one, would arrive in this time)
print(f"signals {len(received)}", flush=True)
sys.exit(130 if received else 0)
"""


def test_a_stopped_sweep_passes_one_signal_on_starts_nothing_more_and_resumes_where_it_stopped(tmp_path, monkeypatch,
                                                                                               capsys):
    """Ctrl+C: the running run gets exactly one SIGINT (its checkpoint-writing stop; a second stops it without
    writing), no other run starts, and the manifest says which ended how. ``--resume`` runs again exactly the runs
    that did not finish, with the arguments they were launched with, from their last.ckpt where they wrote one, and
    the sweep's table then covers them all. (It was a KeyboardInterrupt traceback, and the pool ran on.)"""
    import signal
    import sys

    import recipes.sweep.launch as sweep

    monkeypatch.chdir(tmp_path)
    stub = tmp_path / "stub.py"
    stub.write_text(STOPPABLE)
    monkeypatch.setattr(sweep, "python_command", lambda: [sys.executable, str(stub)])
    monkeypatch.setenv("STUB_STOP_PARENT", "1")
    family = tmp_path / "family"
    family.mkdir()
    for name in ("a", "b", "c"):
        (family / f"{name}.yaml").write_text(TINY.format(name=name, width=16, mlp="components.MLP"))
    # Python's own Ctrl+C handler, which a process started with SIGINT ignored (a background job of a script, as CI
    # may run the suite) does not get: the sweep's stop is what is under test, not how the process was started.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit, match="130"):
            main([str(family), "--jobs", "1", "--progress", "0", "--set", "trainer.max_steps=7"])
    finally:
        signal.signal(signal.SIGINT, previous)
    out, err = capsys.readouterr()
    [logs] = (tmp_path / "runs" / "sweep-logs").iterdir()
    assert "sweep: stopping; no run starts, and the 1 running write their last.ckpt and stop" in out
    assert f"a: stopped by the sweep (exit 130; log {logs.relative_to(tmp_path)}/a.log) in " in out
    assert "sweep stopped: 0 of 3 runs finished\n  stopped or failed: a\n  not started: b, c" in err
    assert f"python -m recipes.sweep --resume {logs.relative_to(tmp_path)}" in err
    assert (logs / "a.log").read_text().splitlines()[-1] == "signals 1" and not (logs / "b.log").exists()
    manifest = json.loads((logs / "sweep.json").read_text())
    assert [r["returncode"] for r in manifest["runs"]] == [130, None, None]
    assert manifest["runs"][0]["args"][-2:] == ["--trainer.max_steps", "7"]

    # a wrote a checkpoint before it stopped; b and c never started.
    (Path(manifest["runs"][0]["folder"]) / "checkpoints").mkdir(parents=True)
    (Path(manifest["runs"][0]["folder"]) / "checkpoints" / "last.ckpt").write_bytes(b"")
    monkeypatch.setenv("STUB_STOP_PARENT", "0")
    monkeypatch.setattr(sweep, "python_command", lambda: [sys.executable, "-c", "import sys; print(' '.join(sys.argv[1:]))"])
    with pytest.raises(SystemExit, match="--resume goes on with a sweep as it was launched"):
        main(["--resume", str(logs), "--set", "trainer.max_steps=9"])
    family_name, runs = sweep.resume(logs, progress_every=0)
    assert family_name == "family" and [run.returncode for run in runs] == [0, 0, 0]
    a_log = (logs / "a.log").read_text()
    assert "signals 1" in a_log  # the log grew
    assert a_log.rstrip().endswith(f"--trainer.max_steps 7 --ckpt_path {runs[0].folder}/checkpoints/last.ckpt")
    assert (logs / "b.log").read_text().rstrip().endswith("--trainer.max_steps 7")  # from the start
    before = (logs / "b.log").read_text()
    capsys.readouterr()
    sweep.resume(logs, progress_every=0)  # nothing left to run: nothing runs, nothing is said
    assert (logs / "b.log").read_text() == before and capsys.readouterr().out == ""
    capsys.readouterr()
    main(["--resume", str(logs), "--progress", "0"])  # the command (--jobs 1, its default), then the sweep's table
    assert (logs / "b.log").read_text() == before and "table and figures" in capsys.readouterr().out


def test_a_schedulers_sigterm_stops_a_sweep_as_ctrl_c_does_and_the_handler_before_it_comes_back(tmp_path,
                                                                                                   monkeypatch):
    import signal

    import recipes.sweep.launch as sweep

    family = echo_family(tmp_path, monkeypatch)
    (family / "b.yaml").write_text(TINY.format(name="b", width=16, mlp="components.MLP"))
    (tmp_path / "stub.py").write_text(STOPPABLE)
    monkeypatch.setenv("STUB_STOP_PARENT", "TERM")
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(sweep.SweepInterrupted) as info:
        sweep.launch(sorted(family.glob("*.yaml")), [], jobs=1, family="family", progress_every=0)
    assert [run.returncode for run in info.value.runs] == [130, None]  # a passed one SIGINT on; b never started
    assert info.value.runs[0].log.read_text().splitlines()[-1] == "signals 1"
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_run_whose_process_starts_while_the_sweep_stops_is_passed_its_one_signal(tmp_path, monkeypatch):
    """The race between a stop and a run's start: the sweep stops after the run's process exists but before the sweep
    knows it (the stop's SIGINT goes to the processes it knows). The run is then passed its one SIGINT as it is
    registered, not left to train on alone past the sweep's end."""
    import os
    import signal
    import threading
    import time

    import recipes.sweep.launch as sweep

    family = echo_family(tmp_path, monkeypatch)
    (family / "b.yaml").write_text(TINY.format(name="b", width=16, mlp="components.MLP"))
    ready = tmp_path / "ready"  # the run's SIGINT handler is in place (one sent before would stop its Python starting)
    marks_ready = f"open({str(ready)!r}, 'w').close()\nif os.environ"
    (tmp_path / "stub.py").write_text(STOPPABLE.replace("if os.environ", marks_ready, 1))
    monkeypatch.setenv("STUB_STOP_PARENT", "0")
    stopped, real_popen, real_print = threading.Event(), sweep.subprocess.Popen, print

    def told(*args, **kwargs):
        real_print(*args, **kwargs)
        if str(args[0]).startswith("\nsweep: stopping"):
            stopped.set()

    def popen(*args, **kwargs):  # the process is started, then the sweep is stopped before this call returns
        process = real_popen(*args, **kwargs)
        end = time.time() + 10
        while not ready.exists() and time.time() < end:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stopped.wait(10), "the sweep did not stop"
        return process

    monkeypatch.setattr(sweep, "print", told, raising=False)
    monkeypatch.setattr(sweep.subprocess, "Popen", popen)
    with pytest.raises(sweep.SweepInterrupted) as info:
        sweep.launch(sorted(family.glob("*.yaml")), [], jobs=1, family="family", progress_every=0)
    assert [run.returncode for run in info.value.runs] == [130, None]  # a stopped by its one SIGINT; b never started
    assert info.value.runs[0].log.read_text().splitlines()[-1] == "signals 1"


def test_a_sweep_says_what_it_runs_each_runs_ending_and_its_progress_while_they_run(tmp_path, monkeypatch, capsys):
    """The lines a sweep prints on this machine: what runs, how many at a time with how many threads; the progress
    table every ``progress_every`` seconds while runs go on; each run's ending. Each run has the threads it was
    given and a session of its own (so a terminal's Ctrl+C reaches the sweep alone)."""
    import re
    import signal

    import recipes.sweep.launch as sweep

    family = echo_family(tmp_path, monkeypatch)
    (family / "b.yaml").write_text(TINY.format(name="b", width=16, mlp="components.MLP"))
    (tmp_path / "stub.py").write_text("import os, sys, time\ntime.sleep(0.6)\n"
                                      "print('own session', os.getsid(0) == os.getpid(), 'threads', "
                                      "os.environ['OMP_NUM_THREADS'])\nsys.exit(3 if 'b.yaml' in sys.argv[2] else 0)\n")
    before = signal.getsignal(signal.SIGTERM)
    logs, runs = sweep.launch(sorted(family.glob("*.yaml")), [], jobs=1, threads=3, family="family",
                              progress_every=0.2)
    out = capsys.readouterr().out
    assert f"sweep: 2 runs, 1 at a time, 3 thread(s) each; logs in {logs}/" in out
    assert re.search(r"\[sweep [0-9:]{8}\] 0 done, 1 running, 0 failed, 1 waiting; logs in .*\n  a: starting \(", out)
    assert re.search(r"^a: ok in \d+ s$", out, re.MULTILINE), out
    assert re.search(rf"^b: FAILED \(exit 3; log {re.escape(str(logs))}/b.log\) in \d+ s$", out, re.MULTILINE), out
    assert [run.log.read_text() for run in runs] == ["own session True threads 3\n"] * 2
    assert signal.getsignal(signal.SIGTERM) is before


def test_each_run_is_given_its_share_of_the_cores_unless_told_how_many_threads(monkeypatch):
    from recipes.sweep.launch import share_of_cores

    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert [share_of_cores(None, jobs) for jobs in (1, 3, 8, 16)] == [8, 2, 1, 1]
    assert share_of_cores(5, 3) == 5
    monkeypatch.setattr("os.cpu_count", lambda: None)  # (unknown: one each)
    assert share_of_cores(None, 2) == 1


def test_a_sweep_killed_outright_leaves_its_running_run_holding_the_sweep_and_resume_waits_for_it(tmp_path,
                                                                                                   monkeypatch):
    """A sweep killed with SIGKILL (a closed terminal, an out-of-memory kill) cannot stop its runs, which live in
    sessions of their own: ``--resume`` then would start a second writer into a run folder still written. The runs
    share the sweep's lock, so resume is refused, naming the run and its process, until that run has ended."""
    import fcntl
    import os
    import signal
    import subprocess
    import sys
    import time

    import recipes.sweep.launch as sweep

    monkeypatch.chdir(tmp_path)
    (tmp_path / "family").mkdir()
    (tmp_path / "family" / "a.yaml").write_text(TINY.format(name="a", width=16, mlp="components.MLP"))
    stub = tmp_path / "stub.py"  # a run: says where it is, then trains for a minute
    stub.write_text("import os, time\nopen('started', 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    driver = tmp_path / "driver.py"
    driver.write_text("import sys\nimport recipes.sweep.launch as sweep\n"
                      f"sweep.python_command = lambda: [sys.executable, {str(stub)!r}]\n"
                      "from recipes.sweep.cli import main\nmain(['family', '--progress', '0'])\n")
    sweeper = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_pid = None
    try:
        for _ in range(600):
            if (tmp_path / "started").is_file() and (tmp_path / "started").read_text():
                run_pid = int((tmp_path / "started").read_text())
                break
            time.sleep(0.05)
        assert run_pid is not None, "the sweep's run never started"
        sweeper.kill()
        sweeper.wait()
        [logs] = (tmp_path / "runs" / "sweep-logs").iterdir()
        assert json.loads((logs / "sweep.json").read_text())["runs"][0]["pid"] == run_pid
        with pytest.raises(ValueError, match=rf"the sweep or a run it started still runs \(a \(process {run_pid}\)\)"):
            sweep.resume(logs, progress_every=0)
        os.kill(run_pid, signal.SIGKILL)
        for _ in range(200):  # (the run is not this process's child: wait until its exit has freed the lock)
            with open(logs / "sweep.lock") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    time.sleep(0.05)
        monkeypatch.setattr(sweep, "python_command", lambda: [sys.executable, "-c", "print('resumed')"])
        _, runs = sweep.resume(logs, progress_every=0)
        assert runs[0].returncode == 0 and (logs / "a.log").read_text().rstrip().endswith("resumed")
        assert json.loads((logs / "sweep.json").read_text())["runs"][0]["pid"] is None
    finally:
        if sweeper.poll() is None:
            sweeper.kill()
        if run_pid is not None:
            try:
                os.kill(run_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_sweep_on_a_file_system_without_locks_runs_and_says_it_is_unguarded(tmp_path, monkeypatch, capsys):
    """Clusters mount scratch file systems without flock (Lustre's default): the sweep's lock fails there with
    ENOLCK or EOPNOTSUPP, and the sweep must run all the same, saying what it cannot guard."""
    import errno
    import fcntl

    import recipes.sweep.launch as sweep

    family = echo_family(tmp_path, monkeypatch)

    def no_locks(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    logs, runs = sweep.launch(sorted(family.glob("*.yaml")), [], jobs=1, family="family", progress_every=0)
    assert [run.returncode for run in runs] == [0]
    assert "sweep.lock cannot be locked on this file system (No locks available)" in capsys.readouterr().err


def test_a_sweep_resumed_from_another_folder_goes_on_in_its_own(tmp_path, monkeypatch):
    """A sweep's runs name their recipes, logs and logger folders relative to where it was launched: resumed from
    another folder, a run would have written its curves under that folder's runs/ while the table read the old one.
    The runs go on in the sweep's own folder."""
    import os
    import sys

    import recipes.sweep.launch as sweep

    family = echo_family(tmp_path, monkeypatch)
    logs, runs = sweep.launch(sorted(family.glob("*.yaml")), [], jobs=1, family="family", progress_every=0)
    runs[0].folder.mkdir(parents=True)  # (as a run leaves it)
    ended(logs, 0, 130)
    monkeypatch.setattr(sweep, "python_command", lambda: [sys.executable, "-c", "import os; print('in', os.getcwd())"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    _, resumed = sweep.resume(tmp_path / logs, progress_every=0)
    assert resumed[0].returncode == 0 and os.getcwd() == str(elsewhere)  # (the caller's folder is its own again)
    assert (tmp_path / logs / "a.log").read_text().splitlines()[-1] == f"in {tmp_path}"
    assert not any(elsewhere.iterdir())


def test_two_sweeps_started_in_the_same_second_keep_their_own_logs_and_runs(tmp_path, monkeypatch):
    """The log folder is named for the second a sweep starts: two started together (a script launching families side
    by side) shared it, the second's manifest over the first's, and their runs one folder name. Now the second takes
    ``<time>-2``."""
    import recipes.sweep.launch as sweep

    family = echo_family(tmp_path, monkeypatch)
    monkeypatch.setattr(sweep.time, "strftime", lambda fmt: "20260101-000000")
    first, first_runs = sweep.launch(sorted(family.glob("*.yaml")), [], family="family", progress_every=0)
    second, second_runs = sweep.launch(sorted(family.glob("*.yaml")), [], family="family", progress_every=0)
    assert (first.name, second.name) == ("20260101-000000", "20260101-000000-2")
    assert first_runs[0].folder.name == "sweep_20260101-000000" != second_runs[0].folder.name
    assert json.loads((first / "sweep.json").read_text())["runs"][0]["folder"] == str(first_runs[0].folder.resolve())


@pytest.mark.parametrize("text, message", [
    ("baseline: aa\n", r"baseline 'aa' is not a recipe of the folder \(did you mean a\?\)"),
    ("baseline: zz\n", r"baseline 'zz' is not a recipe of the folder \(the recipes: a, b\)"),
    ("baseline: _family\n", r"baseline '_family' is not a recipe of the folder"),
    ("baseline: [a\n", r"is not valid YAML: while parsing a flow sequence"),
    ("- baseline\n", r"holds a list; write a mapping \(baseline: NAME, ...\)"),
    ("equivalence_margin: small\n", r"equivalence_margin 'small' must be a positive number of nats"),
    ("equivalence_margin: -0.01\n", r"equivalence_margin -0.01 must be a positive number of nats"),
    ("equivalence_margin: .nan\n", r"equivalence_margin nan must be a positive number of nats"),
    ("equivalence_margin: 0\n", r"equivalence_margin 0 must be a positive number of nats"),
    ("equivalence_margin: .inf\n", r"equivalence_margin inf must be a positive number of nats"),
    ("claims: [1, 2]\n", r"claims must be a list of sentences"),
    ("starts_from: [pre]\n", r"starts_from \['pre'\] must be a recipe folder's name"),
    ("claims: one claim\n", r"claims must be a list of sentences"),
])
def test_a_family_file_that_says_something_unusable_is_named(tmp_path, text, message):
    """A baseline misspelt in ``_family.yaml`` left the seeded table without its comparison, silently (the baseline
    was taken only when it named one of the recipes, so that ``--only`` may leave it out); a broken file was a
    traceback from inside PyYAML; a margin of text failed only after every run had finished."""
    from recipes.sweep.launch import family_settings

    for name in ("a", "b"):
        (tmp_path / f"{name}.yaml").write_text("")
    (tmp_path / "_family.yaml").write_text(text)
    with pytest.raises(ValueError, match=f"{re.escape(str(tmp_path / '_family.yaml'))}:? .*{message}"):
        family_settings(tmp_path)
    (tmp_path / "_family.yaml").write_text("baseline: b\nequivalence_margin: 1\nclaims: [x]\nstarts_from: pre\n")
    assert family_settings(tmp_path) == {"baseline": "b", "equivalence_margin": 1, "claims": ["x"], "starts_from": "pre"}
    (tmp_path / "_family.yaml").write_text("# nothing declared yet\n")
    assert family_settings(tmp_path) == {}


def test_a_family_file_with_an_unknown_key_and_a_sweep_whose_folder_is_gone_are_named(tmp_path):
    """A misspelt ``_family.yaml`` key (``baselne``) would leave the family without its baseline; a sweep resumed after
    the folder it was launched from is gone would look for its runs' relative paths elsewhere."""
    from recipes.sweep.launch import family_settings, resume

    (tmp_path / "_family.yaml").write_text("baselne: a\nequivalence_margin: 0.01\n")
    with pytest.raises(ValueError, match=r"_family.yaml: unknown keys \['baselne'\] \(known: baseline, "
                                         "equivalence_margin, claims, starts_from"):
        family_settings(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "launcher.json").write_text(json.dumps({"cwd": str(tmp_path / "moved"), "launcher": "local"}))
    with pytest.raises(FileNotFoundError, match=f"the sweep was launched from {tmp_path / 'moved'}, which is gone; its "
                                                "runs' paths are relative to it"):
        resume(logs, progress_every=0)
    from recipes.sweep.records import write_manifest

    runs = fake_family(tmp_path)
    runs[1].returncode, runs[4].returncode = None, 3  # stopped and failed, in a sweep too old to record arguments
    write_manifest(logs, "fake", runs)
    (logs / "launcher.json").unlink()
    with pytest.raises(ValueError, match="the runs a, b were launched before a sweep recorded its runs' arguments, so "
                                         "they cannot be resumed from here; run the family again"):
        resume(logs, progress_every=0)
    import shutil

    from recipes.sweep.records import write_record

    write_record(logs, "fake", runs)
    shutil.rmtree(tmp_path / "a")  # the run folders gone, the record kept: numbers, nothing to resume
    with pytest.raises(ValueError, match="a sweep's record holds its runs' numbers, not the runs; give the log folder "
                                         "of a sweep whose run folders are on this machine"):
        resume(logs, progress_every=0)


def test_a_resume_hands_its_launcher_settings_to_the_sweep_it_goes_on_with(tmp_path, monkeypatch):
    """``--resume``: the jobs, threads, progress interval and launcher settings reach ``resume`` — ``--slurm``'s
    items as submitit's keywords (digits as ints), none given as None (the sweep's own record decides)."""
    import recipes.sweep.cli as cli

    handed = []

    def resumed(*args, **kwargs):
        handed.append((args, kwargs))
        raise SystemExit("resumed")

    monkeypatch.setattr(cli, "resume", resumed)
    with pytest.raises(SystemExit, match="resumed"):
        main(["--resume", str(tmp_path), "--jobs", "3", "--threads", "2", "--progress", "5", "--launcher", "slurm",
              "--submitit-cluster", "local", "--devices-per-run", "2", "--slurm", "slurm_partition=gpu", "timeout_min=60"])
    with pytest.raises(SystemExit, match="resumed"):
        main(["--resume", str(tmp_path)])
    assert handed[0] == ((tmp_path, 3, 2, 5.0), dict(launcher="slurm", devices_per_run=2, submitit_cluster="local",
                                                      slurm={"slurm_partition": "gpu", "timeout_min": 60}))
    assert handed[1][1]["slurm"] is None and handed[1][1]["launcher"] is None


def test_the_pre_check_builds_a_recipes_model_at_its_datas_vocabulary(monkeypatch):
    """``model_build_error`` builds the model at the vocabulary the data's settings name (a padded one first), else
    bytes': the check sees the model the run would build."""
    import recipes
    from recipes.cli import parse_recipe
    from recipes.sweep.cli import model_build_error

    sizes = []
    monkeypatch.setattr(recipes, "LanguageModel", lambda **options: sizes.append(options["vocab_size"]))
    configs = Path(recipes.__file__).parent / "configs"
    for args, size in ((["--config", str(configs / "quickstart_bpe.yaml")], 2048),
                       (["--config", str(configs / "quickstart_bpe.yaml"), "--data.init_args.tokenizer", "t.json",
                         "--data.init_args.padded_vocab_size", "4096"], 4096),
                       (["--config", str(configs / "quickstart.yaml")], 256)):
        assert model_build_error(parse_recipe(args).config) is None
        assert sizes.pop() == size, args


def test_a_set_without_an_equals_sign_is_named_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.yaml").write_text(TINY.format(name="a", width=16, mlp="components.MLP"))
    monkeypatch.setattr("recipes.sweep.cli.check_recipes", lambda *args: pytest.fail("a recipe was parsed"))
    for item in ("model.d_model", "model.d_model 32"):
        with pytest.raises(SystemExit, match=f"error: --set takes KEY=VALUE; got '{item}'"):
            main([str(tmp_path), "--set", "model.lr=0.01", item])
    assert not (tmp_path / "runs").exists()


def test_a_sweep_with_one_unseeded_run_among_seeded_ones_gets_the_seed_table(tmp_path, capsys):
    """An unseeded sweep extended by seeds (or read together with a seeded one): any seed makes it the seed table,
    the unseeded run one of its recipe's runs."""
    from recipes.sweep.records import write_manifest

    runs = fake_family(tmp_path)
    runs[0].seed = None
    logs = tmp_path / "logs"
    logs.mkdir()
    write_manifest(logs, "fake", runs)
    main(["--from", str(logs)])
    assert "| a | 3 of 3 | 1,234 | 1,000 | 3.5000 ± 0.5000 |" in capsys.readouterr().out


def test_a_folder_without_recipes_is_named_and_a_family_file_is_not_a_recipe(tmp_path):
    from recipes.sweep.launch import recipe_files

    (tmp_path / "_family.yaml").write_text("baseline: a\n")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(FileNotFoundError, match=f"recipe folder {str(tmp_path)!r} holds no .yaml recipes"):
        recipe_files(str(tmp_path))
    (tmp_path / "b.yaml").write_text("")
    (tmp_path / "a.yaml").write_text("")
    assert recipe_files(str(tmp_path)) == [tmp_path / "a.yaml", tmp_path / "b.yaml"]


def test_a_job_array_is_waited_for_to_its_last_job_and_each_jobs_code_is_its_runs(tmp_path, monkeypatch, capsys):
    """``submit`` waits until every job is done (a result asked of an unfinished job would block, here fail), printing
    progress while some still run; a job that died is a failed run with the reason in its log."""
    import contextlib

    from recipes.sweep import launch
    from recipes.sweep.records import Run

    class Job:
        def __init__(self, polls: int, code):
            self.polls, self.code = polls, code

        def done(self) -> bool:
            self.polls -= 1
            return self.polls < 0

        def result(self):
            assert self.polls < 0, "a result asked before its job was done"
            if isinstance(self.code, Exception):
                raise self.code
            return self.code

    jobs = iter([Job(0, 0), Job(4, 1), Job(0, RuntimeError("Traceback …\nMemoryError: out of memory")),
                 Job(0, MemoryError())])

    class Executor:
        cluster = "local"
        batch = staticmethod(contextlib.nullcontext)

        def submit(self, job):
            return next(jobs)

    monkeypatch.setattr(launch, "submitit_executor", lambda *args, **kwargs: Executor())
    monkeypatch.setattr(launch.time, "sleep", lambda seconds: None)
    runs = [Run(tmp_path / f"{name}.yaml", tmp_path / name, returncode=None, log=tmp_path / f"{name}.log")
            for name in "abcd"]
    (tmp_path / "logs").mkdir()
    launch.submit(runs, lambda run: ["true"], tmp_path / "logs", "fam", 3, 1, 1, "local", {}, progress_every=1e-9)
    assert [run.returncode for run in runs] == [0, 1, -1, -1]
    # a message's last line, unquoted
    assert (tmp_path / "c.log").read_text() == "\nsubmitit: the job failed: MemoryError: out of memory\n"
    assert (tmp_path / "d.log").read_text() == "\nsubmitit: the job failed: MemoryError()\n"  # no message: its class
    assert any(line.startswith("[sweep ") and ", 1 running," in line for line in capsys.readouterr().out.splitlines())
