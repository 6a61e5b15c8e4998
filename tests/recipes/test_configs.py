"""Every bundled recipe parses, builds its model and data, and runs one training and one validation step."""

import pytest

from recipes.cli import CONFIG_DIR, bundled_configs, main


@pytest.mark.parametrize("name", bundled_configs())
def test_bundled_recipe_runs_a_step(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = main(["fit", "--config", name, "--trainer.fast_dev_run", "true", "--trainer.enable_progress_bar", "false",
                "--data.init_args.batch_size", "2", "--data.init_args.num_workers", "0"])
    assert cli.trainer.state.finished
    assert cli.trainer.global_step == 1
    assert (CONFIG_DIR / name).is_file()
