"""``python -m recipes.sweep`` tabulates exactly the runs it launched and reports the ones that failed."""

from functools import partial

import pytest
from torch.utils.tensorboard import SummaryWriter

from components import HybridLM, QCAttention, count_parameters
from recipes.sweep import main

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
                             ("c_broken", 16, "components.NoSuchMixer")):
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


def write_run(folder, losses: dict[int, float], speeds: list[float], pattern: str = "AM") -> None:
    folder.mkdir(parents=True)
    (folder / "hparams.yaml").write_text(f"pattern: {pattern}\nn_params: 1234\nn_active_params: 1000\n")
    with SummaryWriter(str(folder)) as writer:
        for step, loss in losses.items():
            writer.add_scalar("val/loss", loss, step)
        for step, speed in enumerate(speeds):
            writer.add_scalar("train/tokens_per_sec", speed, step)


def test_a_run_is_read_at_its_last_validation_and_median_speed(tmp_path):
    from recipes.sweep import read_run

    write_run(tmp_path / "run", {9: 4.0, 19: 3.0, 29: 2.5}, [100.0, 900.0, 300.0, 200.0, 250.0])
    result = read_run(tmp_path / "run")
    assert result["val_loss"] == 2.5 and result["steps"] == 30  # the last validation, not the first or the best
    assert result["tok_s"] == 250.0 and result["params"] == 1234 and result["active"] == 1000


def test_table_only_takes_the_most_recently_written_run(tmp_path, monkeypatch):
    import os

    from recipes.sweep import newest_run

    monkeypatch.chdir(tmp_path)
    config = tmp_path / "a.yaml"
    config.write_text(TINY.format(name="a", width=16, mlp="components.MLP"))
    root = tmp_path / "runs" / "fake" / "a"
    for i, (version, written) in enumerate((("version_9", 1_000), ("version_2", 1_500), ("version_10", 2_000))):
        write_run(root / version, {1: 5.0 - i}, [1.0])
        os.utime(root / version, (1_000_000 + written, 1_000_000 + written))
    # version_10 was written last, but sorts before version_9 (and version_2) by name.
    assert newest_run(config).resolve() == root / "version_10"
