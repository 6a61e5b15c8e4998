"""``python -m recipes.sweep.grid``: one recipe over a grid of settings, written as a family the sweep runs."""

import re
from pathlib import Path

import pytest
import yaml

from recipes.sweep.grid import main
from recipes.sweep.launch import recipe_files


def grid(tmp_path, *args):
    main(["quickstart.yaml", *args, "--out", str(tmp_path / "grid")])
    return {path.stem: yaml.safe_load(path.read_text()) for path in recipe_files(str(tmp_path / "grid"))}


def test_every_combination_is_a_recipe_named_by_its_values_each_logging_apart(tmp_path):
    sgd_spec = "{class_path: torch.optim.SGD, init_args: {momentum: 0.9}}"
    recipes = grid(tmp_path, "--vary", f"model.optimizer=[AdamW, {sgd_spec}]", "model.lr=[0.002, 1.0e-2]",
                   "--set", "trainer.max_steps=300", "model.mixers.A.init_args.n_heads=2")
    assert sorted(recipes) == ["optimizer-AdamW_lr0.002", "optimizer-AdamW_lr0.01", "optimizer-SGD_lr0.002",
                               "optimizer-SGD_lr0.01"]
    sgd = recipes["optimizer-SGD_lr0.01"]
    assert sgd["model"]["optimizer"] == {"class_path": "torch.optim.SGD", "init_args": {"momentum": 0.9}}
    assert sgd["model"]["lr"] == 0.01 and sgd["trainer"]["max_steps"] == 300
    assert sgd["model"]["mixers"]["A"] == {"class_path": "components.QCAttention", "init_args": {"n_heads": 2}}
    assert sgd["model"]["pattern"] == "AM×4" and sgd["model"]["d_model"] == 128  # the rest as the recipe has it
    names = {r["trainer"]["logger"]["init_args"]["name"] for r in recipes.values()}
    assert names == {f"grid/{name}" for name in recipes}  # one TensorBoard name each: their runs never mix
    text = (tmp_path / "grid" / "optimizer-SGD_lr0.01.yaml").read_text()
    assert text.splitlines()[1].startswith("# written by: python -m recipes.sweep.grid quickstart.yaml --vary "
                                           "'model.optimizer=[AdamW, {class_path")
    # the sweep's --vs lr draws one line per recipe name less its last part: one per optimiser
    assert {name.rsplit("_", 1)[0] for name in recipes} == {"optimizer-AdamW", "optimizer-SGD"}


def test_the_printed_sweep_command_plots_a_numeric_last_axis_only(tmp_path, capsys):
    recipes = grid(tmp_path, "--vary", "model.lr=[2e-3, 0.006]")  # (2e-3: a string to YAML 1.1, a number here)
    assert sorted(r["model"]["lr"] for r in recipes.values()) == [0.002, 0.006] and "lr0.002" in recipes
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"python -m recipes.sweep {tmp_path / 'grid'} --seeds 3 "
                                                             "--jobs 2 --vs lr")
    main(["quickstart.yaml", "--vary", "model.optimizer=[AdamW, Muon]", "--out", str(tmp_path / "other")])
    assert capsys.readouterr().out.splitlines()[-1].endswith("--jobs 2")
    main(["quickstart.yaml", "--vary", "model.init_std=[0.02, null]", "--out", str(tmp_path / "mixed")])
    assert capsys.readouterr().out.splitlines()[-1].endswith("--jobs 2")  # one value not a number: no axis to plot on
    main(["quickstart.yaml", "--vary", "data.init_args.seq_len=[64, 128]", "--out", str(tmp_path / "lengths")])
    assert capsys.readouterr().out.splitlines()[-1].endswith("--jobs 2 --vs data.init_args.seq_len")  # (its config.yaml)


def test_a_relative_init_from_stays_the_source_recipes(tmp_path):
    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "tune.yaml"
    recipe = yaml.safe_load((Path(__file__).parents[2] / "recipes/configs/quickstart.yaml").read_text())
    recipe["model"]["init_from"] = "weights/pre.ckpt"
    source.write_text(yaml.safe_dump(recipe))
    from recipes.sweep.grid import grid_recipes

    (only,) = grid_recipes(str(source), [("model.lr", [0.001])], [], "g").values()
    assert only["model"]["init_from"] == str(tmp_path / "src" / "weights" / "pre.ckpt")


@pytest.mark.parametrize("vary, expected", [
    ("model.lrr=[0.002]", r"lrr0.002.yaml: Group 'model' does not accept option 'lrr' \(did you mean lr\?\)"),
    ("model.lr=0.002", r"the values are a YAML list of one or more"),
    ("model.lr=[]", r"the values are a YAML list of one or more"),
    ("model lr=[1]", r"write KEY=\[V1, V2, ...\] with a dotted key"),
    ("model.lr=[0.1, 0.10]", r"two combinations are both named 'lr0.1'"),
    ("model.lr=[0.002,", r"--vary 'model.lr=\[0.002,': not YAML at column 8 of '\[0.002,': expected the node content"),
    ("model.lr=[a: b", r"not YAML at column 6 of '\[a: b'"),  # (was a traceback from inside PyYAML)
    ("model.d_model.width=[1]", r"model.d_model.width: 'd_model' holds 128 in the recipe, not a mapping"),
    ("data.init_args.batch_size=[two]", r"batch_size"),
    ("model.d_model=[32, 30]", r"dmodel30.yaml: its model does not build: ValueError: QCAttention: d_model=30 is not "
                               r"divisible by n_heads=4"),
])
def test_a_grid_that_cannot_be_written_is_refused_by_name_and_leaves_nothing(tmp_path, vary, expected):
    with pytest.raises(SystemExit) as stop:
        main(["quickstart.yaml", "--vary", vary, "--out", str(tmp_path / "grid")])
    assert str(stop.value.code).startswith("error: ")
    assert re.search(expected, str(stop.value.code)), stop.value.code
    assert not (tmp_path / "grid").exists()


def test_a_key_set_twice_and_a_recipe_already_there_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit, match="model.lr: set twice"):
        main(["quickstart.yaml", "--vary", "model.lr=[1]", "--set", "model.lr=2", "--out", str(tmp_path / "g")])
    main(["quickstart.yaml", "--vary", "model.lr=[0.002]", "--out", str(tmp_path / "g")])
    assert "note:" not in capsys.readouterr().err  # a new grid: nothing else in its folder
    before = (tmp_path / "g" / "lr0.002.yaml").read_text()
    with pytest.raises(SystemExit, match=r"already holds lr0.002.yaml: choose another --out"):
        main(["quickstart.yaml", "--vary", "model.lr=[0.002, 0.02]", "--out", str(tmp_path / "g")])
    assert (tmp_path / "g" / "lr0.002.yaml").read_text() == before and not (tmp_path / "g" / "lr0.02.yaml").exists()
    capsys.readouterr()
    main(["quickstart.yaml", "--vary", "model.lr=[0.05]", "--out", str(tmp_path / "g")])  # a point added to the grid
    assert f"note: {tmp_path / 'g'} also holds lr0.002: python -m recipes.sweep" in capsys.readouterr().err


def test_a_value_reads_as_a_file_name_part():
    from recipes.sweep.grid import value_label, variant_name

    assert variant_name([("model.mixers.S", {"class_path": "components.SSD"}), ("model.lr", 0.02),
                         ("model.init_std", -1e-3)]) == "S-SSD_lr0.02_initstd-0.001"

    assert [value_label(v) for v in (0.002, 1.0e-5, 3, None, True, "Muon", "torch.optim.SGD", "data/en/train.jsonl",
                                     "AM×4", "SM AM", {"class_path": "components.SSD", "init_args": {}}, "1.5")] == [
        "0.002", "1e-05", "3", "none", "true", "Muon", "SGD", "train", "AM-4", "SM-AM", "SSD", "1.5"]


def test_a_sweeps_set_that_erases_the_grid_is_said(tmp_path, capsys):
    """``python -m recipes.sweep FAMILY --set model.lr=0.01`` over a grid of rates ran every recipe at 0.01: the
    table then compares nothing, without a word."""
    from recipes.sweep.cli import note_erased_differences

    grid(tmp_path, "--vary", "model.lr=[0.002, 0.02]", "--set", "trainer.max_steps=300")
    recipes = recipe_files(str(tmp_path / "grid"))
    capsys.readouterr()
    note_erased_differences(recipes, ["trainer.max_steps=50", "model.init_std=0.02"])  # the same in all: quiet
    assert capsys.readouterr().err == ""
    note_erased_differences(recipes, ["model.lr=0.01"])
    assert capsys.readouterr().err == ("note: --set model.lr=0.01 replaces a setting the recipes differ in (lr0.002: "
                                       "0.002, lr0.02: 0.02): every run takes 0.01, so the runs no longer differ in it\n")


def test_the_note_names_four_recipes_and_those_without_the_setting(tmp_path, capsys):
    from recipes.sweep.cli import note_erased_differences

    recipes = []
    for i in range(5):
        recipes.append(tmp_path / f"r{i}.yaml")
        recipes[-1].write_text(f"model:\n  d_model: {16 * (i + 1)}\n" + ("  lr: 0.1\n" if i == 0 else ""))
    note_erased_differences(recipes, ["model.d_model=64", "model.lr=0.01"])
    assert capsys.readouterr().err.splitlines() == [
        "note: --set model.d_model=64 replaces a setting the recipes differ in (r0: 16, r1: 32, r2: 48, r3: 64 …): "
        "every run takes 64, so the runs no longer differ in it",
        "note: --set model.lr=0.01 replaces a setting the recipes differ in (r0: 0.1, r1: (not set), r2: (not set), "
        "r3: (not set) …): every run takes 0.01, so the runs no longer differ in it"]
    note_erased_differences(recipes[:4], ["model.d_model=64"])  # four: every one named, so no "…"
    assert "(r0: 16, r1: 32, r2: 48, r3: 64): every run takes 64" in capsys.readouterr().err


def test_a_sweeps_set_that_breaks_the_model_stops_the_sweep_before_any_run(tmp_path):
    """A width the heads do not divide parses, then failed every run of the sweep, each named only in its log: the
    model is built on the ``meta`` device first. A recipe that does not build there even alone is left to its runs."""
    from recipes.sweep.cli import check_recipes

    grid(tmp_path, "--vary", "model.lr=[0.002]")
    (recipe,) = recipe_files(str(tmp_path / "grid"))
    with pytest.raises(SystemExit, match=r"--set model.d_model=30, for recipe lr0.002: its model does not build: "
                                         r"ValueError: QCAttention: d_model=30 is not divisible by n_heads=4"):
        check_recipes([recipe], ["--model.d_model", "30"], ["model.d_model=30"])
    check_recipes([recipe], ["--model.d_model", "64"], ["model.d_model=64"])  # builds: no word
    unbound = tmp_path / "unbound.yaml"  # fails alone too (an unbound letter): not the overrides' fault
    unbound.write_text(recipe.read_text().replace("AM×4", "QM"))
    check_recipes([unbound], ["--model.d_model", "30"], ["model.d_model=30"])


@pytest.mark.parametrize("text, expected", [
    ("model.lr", r"--vary 'model.lr': write KEY=\[V1, V2, ...\] with a dotted key"),
    ("=[1]", r"--vary '=\[1\]': write KEY=\[V1, V2, ...\]"),
    ("model.=[1]", r"with a dotted key of the recipe"),
])
def test_an_axis_without_a_key_or_an_equals_sign_is_named(text, expected):
    from recipes.sweep.grid import parse_axis

    with pytest.raises(ValueError, match=expected):
        parse_axis(text)


@pytest.mark.parametrize("text", ["model.lr", "=0.1"])
def test_a_setting_without_a_key_or_an_equals_sign_is_named(text):
    from recipes.sweep.grid import parse_setting

    with pytest.raises(ValueError, match=rf"--set '{re.escape(text)}': write KEY=VALUE"):
        parse_setting(text)
    assert parse_setting("model.lr=1e-3") == ("model.lr", 0.001) and parse_setting("a=") == ("a", None)
    with pytest.raises(ValueError, match=r"--set 'model.mixers=\{A: 1': not YAML at column 6"):
        parse_setting("model.mixers={A: 1")


def test_a_dotted_key_makes_its_mappings_and_a_grid_goes_where_it_is_told(tmp_path):
    from recipes.sweep.grid import set_dotted

    tree = {"model": {"lr": 1}}
    set_dotted(tree, "model.optimizer.betas", [0.9, 0.95])
    assert tree == {"model": {"lr": 1, "optimizer": {"betas": [0.9, 0.95]}}}
    deep = tmp_path / "two" / "levels"  # folders made on the way
    main(["quickstart.yaml", "--vary", "model.lr=[0.002]", "--set", "trainer.logger=false", "--out", str(deep)])
    assert yaml.safe_load((deep / "lr0.002.yaml").read_text())["trainer"]["logger"] is False  # no logger: no name


def test_the_module_runs_as_a_command_and_names_its_required_flags():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "recipes.sweep.grid", "quickstart.yaml"], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 2 and "the following arguments are required: --vary, --out" in done.stderr


def test_a_familys_folder_varies_every_recipe_named_for_it_with_its_family_file(tmp_path, capsys):
    """Is a family's verdict the learning rate's? The whole folder at other rates in one command: each recipe named
    ``<recipe>_<values>`` (so the sweep's ``--vs lr`` draws one line a recipe, joined by the family's own runs), the
    family's baseline carried over at the first combination, its margin kept."""
    from recipes.sweep.launch import family_settings
    from recipes.sweep.report import less_value

    main(["english/expresser", "--vary", "model.lr=[0.006, 0.012]", "--out", str(tmp_path / "g")])
    recipes = {path.stem: yaml.safe_load(path.read_text()) for path in recipe_files(str(tmp_path / "g"))}
    assert sorted(recipes) == [f"{name}_lr{lr}" for name in ("jamba", "otce_attention", "otce_expresser")
                               for lr in ("0.006", "0.012")]
    assert recipes["otce_expresser_lr0.012"]["model"]["lr"] == 0.012
    assert recipes["otce_expresser_lr0.012"]["model"]["pattern"].endswith("O-")  # (each from its own recipe)
    assert recipes["jamba_lr0.006"]["trainer"]["logger"]["init_args"]["name"] == "g/jamba_lr0.006"
    assert family_settings(tmp_path / "g") == {"baseline": "jamba_lr0.006", "equivalence_margin": 0.01}
    assert {less_value(name, "lr") for name in recipes} == {"jamba", "otce_attention", "otce_expresser"}
    assert capsys.readouterr().out.splitlines()[-1].endswith("--seeds 3 --jobs 2 --vs lr")


def test_several_recipes_are_each_named_for_themselves_and_a_name_twice_is_refused(tmp_path):
    main(["quickstart.yaml", "ablate_moe.yaml", "--vary", "model.lr=[0.01]", "--out", str(tmp_path / "g")])
    assert sorted(path.name for path in (tmp_path / "g").iterdir()) == ["ablate_moe_lr0.01.yaml",
                                                                          "quickstart_lr0.01.yaml"]  # no family file
    with pytest.raises(SystemExit, match=r"^error: jamba: two recipes of the grid share the name"):
        main(["expresser", "english/expresser/jamba.yaml", "--vary", "model.lr=[0.01]", "--out", str(tmp_path / "h")])
    with pytest.raises(SystemExit, match=r"recipe folder 'english/expreser' not found \(did you mean english/expresser"):
        main(["english/expreser", "--vary", "model.lr=[0.01]", "--out", str(tmp_path / "h")])
    assert not (tmp_path / "h").exists()
    (tmp_path / "one").mkdir()  # a folder of one recipe: still a family, named for it
    (tmp_path / "one" / "dense.yaml").write_text((tmp_path / "g" / "quickstart_lr0.01.yaml").read_text())
    main([str(tmp_path / "one"), "--vary", "model.lr=[0.02]", "--out", str(tmp_path / "k")])
    assert [path.name for path in (tmp_path / "k").iterdir()] == ["dense_lr0.02.yaml"]


def test_one_recipe_is_named_for_itself_when_told(tmp_path):
    """One recipe of a family at lower rates, to pool with the family's runs: ``--named`` keeps its name, so
    ``--vs lr`` joins the variants to the recipe's own line."""
    from recipes.sweep.report import less_value

    main(["english/expresser/otce_expresser.yaml", "--vary", "model.lr=[0.0015]", "--out", str(tmp_path / "bare")])
    main(["english/expresser/otce_expresser.yaml", "--vary", "model.lr=[0.0015]", "--named",
          "--out", str(tmp_path / "named")])
    assert [path.name for path in (tmp_path / "bare").iterdir()] == ["lr0.0015.yaml"]
    [named] = (tmp_path / "named").iterdir()
    assert named.name == "otce_expresser_lr0.0015.yaml"
    assert less_value(named.stem, "lr") == "otce_expresser"
    assert yaml.safe_load(named.read_text())["trainer"]["logger"]["init_args"]["name"] == "named/otce_expresser_lr0.0015"
