"""The optimiser a recipe names (``--model.optimizer``, recipes/optimizer.py): the run trains with that class, keeps the
zoo's two parameter groups and its warm-up-cosine schedule, records the spec, resumes and reloads; Lightning's own
``--optimizer`` (which would replace both) and arguments the zoo owns are refused by name."""

import math
import re

import pytest
import torch

from recipes import LanguageModel
from recipes.cli import main
from recipes.module import warmup_cosine

TINY = ["fit", "--config", "quickstart.yaml", "--model.d_model", "16", "--model.pattern", "AM", "--model.mixers.A.init_args.n_heads",
        "2", "--data.init_args.seq_len", "16", "--data.init_args.batch_size", "2", "--trainer.limit_val_batches", "2",
        "--trainer.val_check_interval", "2", "--trainer.enable_progress_bar", "false", "--model.lr", "0.05"]
SGD = "{class_path: torch.optim.SGD, init_args: {momentum: 0.9, nesterov: true}}"


def last_checkpoint(tmp_path):
    (path,) = sorted(tmp_path.glob("runs/quickstart/version_0/checkpoints/last.ckpt"))
    return path, torch.load(path, weights_only=True)


def test_a_recipe_trains_with_the_optimiser_it_names_keeping_the_groups_and_the_schedule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main([*TINY, "--model.optimizer", SGD, "--trainer.max_steps", "4"])
    path, checkpoint = last_checkpoint(tmp_path)
    assert checkpoint["hyper_parameters"]["optimizer"] == {"class_path": "torch.optim.SGD",
                                                           "init_args": {"momentum": 0.9, "nesterov": True}}
    (state,) = checkpoint["optimizer_states"]
    groups = state["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]  # matrices decayed, vectors not
    assert all(g["momentum"] == 0.9 and g["nesterov"] for g in groups)
    assert all(set(s) == {"momentum_buffer"} for s in state["state"].values())  # SGD's state, not AdamW's
    rate = 0.05 * warmup_cosine(4, 4, 0.1, 0.1)  # the schedule after 4 of 4 steps
    assert all(math.isclose(g["lr"], rate, rel_tol=1e-6) for g in groups)

    main([*TINY, "--trainer.max_steps", "6", "--ckpt_path", "last"])  # resumes with the recorded SGD
    _, resumed = last_checkpoint(tmp_path)
    assert resumed["global_step"] == 6 and all(g["momentum"] == 0.9 for g in resumed["optimizer_states"][0]["param_groups"])
    model = LanguageModel.load_from_checkpoint(path)  # torch.optim is trusted: no allow_classes needed
    assert model.hparams.optimizer["class_path"] == "torch.optim.SGD"


def test_without_an_optimiser_the_run_trains_with_adamw_and_its_betas(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main([*TINY, "--trainer.max_steps", "2", "--model.betas", "[0.8, 0.9]"])
    _, checkpoint = last_checkpoint(tmp_path)
    assert checkpoint["hyper_parameters"]["optimizer"] is None
    (state,) = checkpoint["optimizer_states"]
    assert [tuple(g["betas"]) for g in state["param_groups"]] == [(0.8, 0.9)] * 2
    assert all({"exp_avg", "exp_avg_sq"} <= set(s) for s in state["state"].values())


@pytest.mark.parametrize("args, expected", [
    (["--optimizer", "SGD"], "--optimizer is Lightning's, which would drop the zoo's parameter groups"),
    (["--lr_scheduler=StepLR"], "--lr_scheduler is Lightning's"),
    (["--model.optimizer", "Sgd"], "'Sgd' is not an optimiser of torch.optim .*did you mean SGD"),
    (["--model.optimizer", "{class_path: torch.optim.SGD, init_args: {lr: 0.1}}"],
     "init_args.lr is set by the zoo from --model.lr"),
    (["--model.optimizer", "{class_path: torch.optim.SGD, init_args: {momentun: 0.9}}"],
     "SGD takes no argument 'momentun' \\(did you mean momentum"),
    (["--model.optimizer", "Rprop"], "Rprop takes no weight_decay, and --model.weight_decay is 0.1"),
    (["--model.optimizer", "SGD", "--model.eps", "1e-8"], "--model.betas and --model.eps are the default AdamW's"),
    (["--model.optimizer", "Muon"], "Muon takes 2-D weight matrices only"),
    (["--model.optimizer", "torch.nn.Linear"], "'torch.nn.Linear' is not a torch.optim.Optimizer"),
])
def test_an_optimiser_the_zoo_cannot_honour_is_refused_by_name(tmp_path, monkeypatch, args, expected):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main([*TINY, "--trainer.max_steps", "1", *args])
    message = str(info.value.code)
    assert message.startswith("error: ") and len(message.splitlines()) == 1, message
    assert re.search(expected, message), message
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.ckpt"))


def test_lightnings_optimizer_key_in_a_config_file_is_refused_with_the_way_to_name_one(tmp_path, monkeypatch):
    (tmp_path / "opt.yaml").write_text("optimizer:\n  class_path: torch.optim.SGD\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="a config's `optimizer:` is Lightning's.*--model.optimizer"):
        main([*TINY, "--config", "opt.yaml", "--trainer.max_steps", "1"])


def test_a_resumed_run_refuses_another_optimiser(tmp_path, monkeypatch):
    """The checkpoint's optimiser state is SGD's: an AdamW (or any other) resume cannot take it over."""
    monkeypatch.chdir(tmp_path)
    main([*TINY, "--model.optimizer", "SGD", "--trainer.max_steps", "2"])
    with pytest.raises(SystemExit, match="--model.optimizer 'Adam' \\(the checkpoint has"):
        main([*TINY, "--model.optimizer", "Adam", "--trainer.max_steps", "4", "--ckpt_path", "last"])
