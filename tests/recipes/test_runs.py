"""What ``generate``, ``eval`` and ``hf export`` share about a trained run (``recipes.runs``): its recipe, which
checkpoint ``last``/``best``/``swa`` names, its run folder and the data section it trained with, its data module."""

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

import recipes.data.corpus as corpus_module
from recipes.runs import (check_tokenizer, checkpoint_path, data_module, load_recipe, load_run, run_folder, sweep_root,
                          trusted_classes, with_run_data)

TENSORBOARD = "lightning.pytorch.loggers.TensorBoardLogger"


def written(path: Path, mtime: float) -> Path:
    """An (empty) checkpoint file at ``path`` whose modification time is ``mtime``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    os.utime(path, (mtime, mtime))
    return path


def test_a_recipe_is_read_from_a_path_or_the_bundled_configs_and_a_sweep_root_is_folder_then_name(tmp_path):
    (tmp_path / "mine.yaml").write_text("model:\n  d_model: 8\n")
    assert load_recipe(str(tmp_path / "mine.yaml")) == {"model": {"d_model": 8}}
    assert "model" in load_recipe("ablate_moe.yaml")  # a bundled recipe, by name
    assert sweep_root(Path("recipes/configs/english/moe/topk.yaml")) == Path("runs/moe/topk")


def test_a_named_checkpoint_is_the_newest_under_the_loggers_folder_and_a_file_is_taken_as_it_is(tmp_path):
    assert checkpoint_path({}, "some/file.ckpt") == "some/file.ckpt"
    logs = tmp_path / "logs"
    recipe = {"trainer": {"logger": {"class_path": TENSORBOARD, "init_args": {"save_dir": str(logs), "name": "x"}}}}
    written(logs / "x" / "version_0" / "checkpoints" / "last.ckpt", 1_000)
    newer = written(logs / "x" / "version_1" / "checkpoints" / "last.ckpt", 2_000)
    best = written(logs / "x" / "version_0" / "checkpoints" / "best.ckpt", 500)
    assert checkpoint_path(recipe, "last") == str(newer)
    assert checkpoint_path(recipe, "best") == str(best)
    with pytest.raises(FileNotFoundError, match=rf"--ckpt_path swa: no swa.ckpt under {logs / 'x'}/\*/checkpoints/"):
        checkpoint_path(recipe, "swa")


def test_a_named_checkpoint_is_of_the_recipes_model_and_a_newer_one_of_another_is_named(tmp_path, capsys):
    """``generate``/``eval``/``hf export`` of ``quickstart.yaml`` after a ``--config quickstart.yaml --config
    mine.yaml`` run (same logger folder, another width) used that run's model without a word."""
    logs = tmp_path / "logs"
    recipe = {"model": {"d_model": 128},
              "trainer": {"logger": {"class_path": TENSORBOARD, "init_args": {"save_dir": str(logs), "name": "x"}}}}
    own, other = (logs / "x" / f"version_{v}" / "checkpoints" / "last.ckpt" for v in (0, 1))
    for path, width, mtime in ((own, 128, 1_000), (other, 64, 2_000)):
        path.parent.mkdir(parents=True)
        torch.save({"state_dict": {}, "hyper_parameters": {"d_model": width}}, path)
        os.utime(path, (mtime, mtime))
    assert checkpoint_path(recipe, "last") == str(own)
    assert capsys.readouterr().err == (f"note: --ckpt_path last is {own}, the newest last.ckpt of this recipe's model: a "
                                       f"newer last.ckpt in the same folder is another model's, {other} (d_model 128 "
                                       "here, 64 there); pass its path to use it\n")
    assert checkpoint_path({**recipe, "model": {"d_model": 64}}, "last") == str(other)
    assert capsys.readouterr().err == ""


def test_a_recipe_without_a_logger_finds_its_checkpoints_where_fit_writes_them_and_a_loose_one_is_named(
        tmp_path, monkeypatch):
    """A recipe with ``logger: false`` trains into ``<default_root_dir or .>/checkpoints/``, and ``generate``/``eval``
    look there as ``fit --ckpt_path last`` does; a recipe that logs is not handed such a loose checkpoint (it may be
    another recipe's), but the error names it."""
    monkeypatch.chdir(tmp_path)
    quiet = {"trainer": {"logger": False}}
    with pytest.raises(FileNotFoundError, match=r"^--ckpt_path last: no last.ckpt in checkpoints/ \(where a run "
                                                r"without a logger writes them\); train first$"):
        checkpoint_path(quiet, "last")
    loose = written(tmp_path / "checkpoints" / "last.ckpt", 1_000)
    assert Path(checkpoint_path(quiet, "last")).resolve() == loose
    written(tmp_path / "elsewhere" / "checkpoints" / "best.ckpt", 1_000)
    assert checkpoint_path({"trainer": {"logger": False, "default_root_dir": "elsewhere"}}, "best") == str(
        Path("elsewhere/checkpoints/best.ckpt"))
    with pytest.raises(FileNotFoundError, match=r"no last.ckpt in elsewhere/checkpoints/"):
        checkpoint_path({"trainer": {"logger": False, "default_root_dir": "elsewhere"}}, "last")

    named = {"trainer": {"logger": {"class_path": TENSORBOARD, "init_args": {"save_dir": "tb", "name": "n"}}}}
    with pytest.raises(FileNotFoundError, match=r"^--ckpt_path last: no last.ckpt under tb/n/\*/checkpoints/; "
                                                r"checkpoints/last.ckpt, of a run without a logger, is here: pass its "
                                                r"path, --ckpt_path checkpoints/last.ckpt$"):
        checkpoint_path(named, "last")
    with pytest.raises(FileNotFoundError, match=r"no best.ckpt under tb/n/\*/checkpoints/; train first$"):
        checkpoint_path(named, "best")


def test_a_recipe_on_lightnings_default_logger_finds_its_runs_in_lightning_logs_and_its_sweeps_folder(
        tmp_path, monkeypatch):
    """With no logger named, ``fit`` writes ``lightning_logs/`` and a sweep ``runs/<folder>/<name>/``: the newest of
    both; without the recipe's file only the first; a recipe that names its logger only that logger's folder."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "family" / "a.yaml"
    config.parent.mkdir()
    config.write_text("model: {}\n")
    fit = written(tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt", 1_000)
    written(tmp_path / "runs" / "family" / "a" / "seed0" / "checkpoints" / "last.ckpt", 2_000)
    assert checkpoint_path({}, "last", str(config)) == str(Path("runs/family/a/seed0/checkpoints/last.ckpt"))
    # the tools' --config, repeatable: one file is that file; several have no sweep folder (a sweep runs one file)
    assert checkpoint_path({}, "last", [str(config)]) == str(Path("runs/family/a/seed0/checkpoints/last.ckpt"))
    assert checkpoint_path({}, "last", [str(config)] * 2) == str(Path("lightning_logs/version_0/checkpoints/last.ckpt"))
    os.utime(fit, (3_000, 3_000))
    assert checkpoint_path({}, "last", str(config)) == str(Path("lightning_logs/version_0/checkpoints/last.ckpt"))
    os.utime(fit, (1_000, 1_000))
    assert checkpoint_path({}, "last") == str(Path("lightning_logs/version_0/checkpoints/last.ckpt"))
    named = {"trainer": {"logger": {"class_path": TENSORBOARD, "init_args": {"save_dir": "tb", "name": "n"}}}}
    with pytest.raises(FileNotFoundError, match=r"no last.ckpt under tb/n/\*/checkpoints/; train first"):
        checkpoint_path(named, "last", str(config))


def test_the_classes_a_checkpoint_may_name_are_the_recipes_model_bindings_and_the_allowed_ones():
    recipe = {"model": {"mixers": {"A": {"class_path": "components.QCAttention"}, "M": {"class_path": "my.MLP"}}}}
    assert trusted_classes(recipe, ["extra.Thing"]) == ["extra.Thing", "components.QCAttention", "my.MLP"]
    assert trusted_classes({"model": None}, ["extra.Thing"]) == ["extra.Thing"]
    assert trusted_classes(recipe) == ["components.QCAttention", "my.MLP"]


def test_a_checkpoint_of_another_tokenizer_is_refused_by_name(tmp_path):
    checkpoint = tmp_path / "run.ckpt"
    torch.save({"state_dict": {}, "tokenizer": "a" * 64}, checkpoint)
    same = SimpleNamespace(tokenizer_fingerprint=lambda: "a" * 64, tokenizer_path="tok.json")
    other = SimpleNamespace(tokenizer_fingerprint=lambda: "b" * 64, tokenizer_path="tok.json")
    check_tokenizer(same, checkpoint)
    with pytest.raises(ValueError, match=rf"{checkpoint}: the checkpoint was trained on text tokenized by another "
                                         r"tokenizer \(hash aaaaaaaaaaaa\).*bbbbbbbbbbbb, from the tokenizer file tok"):
        check_tokenizer(other, checkpoint)


def test_a_run_folder_holds_its_checkpoints_folder_and_lends_its_data_section_to_the_recipe(tmp_path):
    run = tmp_path / "version_3"
    checkpoint = run / "checkpoints" / "last.ckpt"
    assert run_folder(checkpoint) == run
    assert run_folder(tmp_path / "loose.ckpt") is None
    recipe = {"model": {"d_model": 8}, "data": {"class_path": "recipes.data.TextCorpus", "init_args": {"seq_len": 8}}}
    assert with_run_data(recipe, checkpoint) is recipe  # the run kept no config.yaml
    assert with_run_data(recipe, tmp_path / "loose.ckpt") is recipe
    run.mkdir()
    trained = {"class_path": "recipes.data.TextCorpus", "init_args": {"seq_len": 64}}
    (run / "config.yaml").write_text(yaml.safe_dump({"model": {"d_model": 99}, "data": trained}))
    assert with_run_data(recipe, checkpoint) == {"model": {"d_model": 8}, "data": trained}  # the run's data only
    for kept in ({"data": None}, {"data": {"init_args": {"seq_len": 64}}}, {}):
        (run / "config.yaml").write_text(yaml.safe_dump(kept))
        assert with_run_data(recipe, checkpoint) is recipe
    (run / "config.yaml").write_text("")
    assert with_run_data(recipe, checkpoint) is recipe


def test_a_data_module_is_built_from_the_recipe_and_for_text_only_without_its_corpus(monkeypatch):
    """``text_only`` drops the corpus arguments of a ``TokenizedCorpus`` that has a tokenizer file (it need not be on
    this machine), and only then."""

    class Recording(corpus_module.TokenizedCorpus):
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    monkeypatch.setattr(corpus_module, "Recording", Recording, raising=False)
    section = {"class_path": "recipes.data.corpus.Recording",
               "init_args": {"paths": ["a.txt"], "dataset": "d", "domains": {"x": 1}, "tokenizer": "t.json",
                             "seq_len": 8}}
    assert data_module({"data": section}).kwargs == section["init_args"]
    assert data_module({"data": section}, text_only=True).kwargs == {"tokenizer": "t.json", "seq_len": 8}
    untokenized = {**section, "init_args": {k: v for k, v in section["init_args"].items() if k != "tokenizer"}}
    assert data_module({"data": untokenized}, text_only=True).kwargs == untokenized["init_args"]
    assert data_module({"data": {"class_path": "recipes.data.corpus.Recording"}}).kwargs == {}
    plain = data_module({"data": {"class_path": "recipes.data.MQAR", "init_args": {"seq_len": 24}}}, text_only=True)
    assert type(plain).__name__ == "MQAR" and plain.train.task["seq_len"] == 24
    for data in (None, {}, {"class_path": "recipes.data.corpus.tokenizer_problem"}):
        with pytest.raises(ValueError, match="the recipe's data section names no data module class"):
            data_module({"data": data})


def test_load_run_reads_a_recipes_checkpoint_with_the_data_its_run_trained_with(tmp_path, monkeypatch, capsys):
    """The Python form of what ``generate`` and ``eval`` read: the newest ``last.ckpt`` of the recipe's runs, in eval
    mode, and the data section of the run's config.yaml (here a training length the recipe file does not have)."""
    from recipes.cli import main as cli
    from recipes.data import TextCorpus

    monkeypatch.chdir(tmp_path)
    cli(["fit", "--config", "quickstart.yaml", "--model.d_model", "32", "--model.mixers.A.init_args.n_heads", "2",
         "--data.init_args.seq_len", "24", "--data.init_args.batch_size", "4", "--trainer.max_steps", "2",
         "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false"])
    run = load_run("quickstart.yaml")
    assert run.checkpoint == Path("runs/quickstart/version_0/checkpoints/last.ckpt")  # (as fit resolves last)
    assert not run.lm.training and run.lm.model.d_model == 32
    assert isinstance(run.data, TextCorpus) and run.data.seq_len == 24 and run.recipe["data"]["init_args"]["seq_len"] == 24
    saved = torch.load(run.checkpoint, weights_only=True)["state_dict"]
    for name, tensor in run.lm.state_dict().items():
        assert torch.equal(tensor, saved[name]), name
    ids = run.lm.model.generate(torch.tensor([run.data.encode("ab")]), 3)
    assert run.data.decode(ids[0].tolist()).startswith("ab") and ids.shape == (1, 5)
    with pytest.raises(FileNotFoundError, match="--ckpt_path best: no best.ckpt under runs/quickstart"):
        load_run("quickstart.yaml", "best")  # (no validation: no best)

    # a GPU run that chose the Triton kernel by name: generate and eval on a CPU failed in the kernel's words
    checkpoint = torch.load(run.checkpoint, weights_only=True)
    checkpoint["hyper_parameters"]["mixers"]["A"]["init_args"]["backend"] = "triton"
    torch.save(checkpoint, tmp_path / "gpu.ckpt")
    capsys.readouterr()
    moved = load_run("quickstart.yaml", str(tmp_path / "gpu.ckpt"))
    assert capsys.readouterr().err == ("note: the checkpoint's A was built with backend='triton', which needs CUDA: on "
                                       "cpu it runs the plain-torch reference (backend='auto'; the same math)\n")
    assert moved.lm.model.blocks[0].sequence_mixer.backend == "auto"
    assert torch.equal(moved.lm.model.generate(torch.tensor([run.data.encode("ab")]), 3), ids)


def test_a_checkpoints_triton_kernels_give_way_to_the_reference_off_cuda_only():
    from recipes.runs import kernels_for

    mixers = {"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "backend": "triton"}},
              "S": {"class_path": "components.SSD", "init_args": {"backend": "triton"}},
              "M": {"class_path": "components.MLP", "init_args": {}}}
    assert kernels_for("cuda:1", {"mixers": mixers}) == ({}, None)
    overrides, note = kernels_for("mps", {"mixers": mixers})
    assert overrides["mixers"]["A"] == {"class_path": "components.QCAttention",
                                        "init_args": {"n_heads": 2, "backend": "auto"}}
    assert overrides["mixers"]["S"]["init_args"] == {"backend": "auto"} and overrides["mixers"]["M"] == mixers["M"]
    assert mixers["A"]["init_args"]["backend"] == "triton"  # (the checkpoint's own record is left as it is)
    assert note == ("note: the checkpoint's A, S were built with backend='triton', which needs CUDA: on mps they run "
                    "the plain-torch reference (backend='auto'; the same math)")
    assert kernels_for("cpu", {"mixers": {"A": {**mixers["A"], "init_args": {"backend": "auto"}}}}) == ({}, None)
    assert kernels_for("cpu", {}) == ({}, None)
