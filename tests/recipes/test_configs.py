"""Every bundled recipe parses, builds its model and data, and records hyper-parameters that rebuild it
through the CLI; one recipe of each family trains a step, checkpoints, and reloads from the checkpoint
(``validate --ckpt_path last`` and ``load_from_checkpoint``)."""

import copy

import pytest
import torch

from recipes import LanguageModel
from recipes.cli import CONFIG_DIR, bundled_configs, main

QUICK = ["--trainer.enable_progress_bar", "false", "--data.init_args.batch_size", "2",
         "--data.init_args.num_workers", "0", "--trainer.limit_val_batches", "2",  # ("1" would parse as 1.0: all)
         "--trainer.num_sanity_val_steps", "0"]
# One recipe per family (folder), the cheapest that still has the family's mixers.
REPRESENTATIVES = ["quickstart.yaml", "ablate_moe.yaml", "positions/hybrid_conv.yaml", "attention/ssd_ifa_mask.yaml",
                   "moe_placement/alternate.yaml", "moe_shared/cdmoe.yaml", "mqar/ifa_mask.yaml",
                   "mqar/paper/ssd_T256.yaml", "arch/tiny/otce.yaml"]


def test_every_family_has_a_representative():
    families = {name.rsplit("/", 1)[0] if "/" in name else name for name in bundled_configs()}
    covered = {name.rsplit("/", 1)[0] if "/" in name else name for name in REPRESENTATIVES}
    # The paper-size architectures are for GPUs; their tiny twins stand for them (tests/recipes/test_architectures.py).
    assert families - {"quickstart.yaml", "ablate_moe.yaml", "arch"} <= covered


@pytest.mark.parametrize("name", bundled_configs())
def test_bundled_recipe_builds_and_its_hyperparameters_rebuild_it(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with torch.device("meta"):  # no memory and no initialisation, even for the 1B recipes
        cli = main(["--config", name, *QUICK], run=False)
        assert cli.trainer.gradient_clip_val == 1.0
        hparams = dict(cli.model.hparams)
        # What `--ckpt_path` does with a checkpoint's hyper-parameters: parse them into the recipe's config.
        config = cli.parser.parse_object({"model": copy.deepcopy(hparams)}, cli.config)  # (it converts in place)
        rebuilt = cli.parser.instantiate_classes(config).model
        for model in (rebuilt, LanguageModel(**hparams)):  # and what load_from_checkpoint does
            shapes = {k: v.shape for k, v in model.state_dict().items()}
            assert shapes == {k: v.shape for k, v in cli.model.state_dict().items()}
            assert str(model.model) == str(cli.model.model)


@pytest.mark.parametrize("name", REPRESENTATIVES)
def test_recipe_trains_checkpoints_and_reloads(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (CONFIG_DIR / name).is_file()
    cli = main(["fit", "--config", name, *QUICK, "--trainer.max_steps", "1", "--trainer.val_check_interval", "1",
                "--checkpoint.every_n_steps", "1"])
    assert cli.trainer.state.finished and cli.trainer.global_step == 1
    [last] = tmp_path.glob("runs/**/checkpoints/last.ckpt")
    trained = cli.model.state_dict()

    reloaded = LanguageModel.load_from_checkpoint(last)
    torch.testing.assert_close(reloaded.state_dict(), trained, rtol=0, atol=0)
    again = main(["validate", "--config", name, *QUICK, "--ckpt_path", "last"])
    assert again.trainer.state.finished
    torch.testing.assert_close(again.model.state_dict(), trained, rtol=0, atol=0)
