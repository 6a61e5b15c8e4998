import ast
import glob
import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from recipes.cli import main
from recipes.recipe_files import resolve_config
from recipes.cli_errors import near_misses

TINY_FIT = [
    "fit", "--config", "quickstart.yaml",
    "--model.d_model", "32", "--model.mixers.A.init_args.n_heads", "2",
    "--data.init_args.seq_len", "32", "--data.init_args.batch_size", "8",
    "--trainer.max_steps", "40", "--trainer.val_check_interval", "20", "--trainer.limit_val_batches", "4",
    "--trainer.log_every_n_steps", "5", "--trainer.enable_progress_bar", "false",
    "--trainer.enable_checkpointing", "false", "--model.lr", "3e-3",
]


def test_fit_through_the_cli_lowers_the_loss_and_writes_tensorboard(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(TINY_FIT)
    summary = capsys.readouterr().out
    assert "HybridLM  pattern='AM×4'" in summary and "total parameters:" in summary

    events = glob.glob(str(tmp_path / "runs" / "quickstart" / "version_0" / "events.out.tfevents.*"))
    assert len(events) == 1
    log = EventAccumulator(events[0])
    log.Reload()
    scalars = set(log.Tags()["scalars"])
    assert {"train/loss", "val/loss", "val/ppl", "train/tokens_per_sec", "train/lr", "train/tflops", "train/flops_per_token"} <= scalars
    assert "train/mfu" not in scalars  # a CPU has no known peak
    val = [e.value for e in log.Scalars("val/loss")]
    assert len(val) == 2
    train = [e.value for e in log.Scalars("train/loss")]
    assert train[-1] < train[0] - 1.0  # from ~ln(256)=5.5 the byte distribution alone is a big drop
    assert val[-1] < 4.5
    assert all(v > 0 for v in (e.value for e in log.Scalars("train/tokens_per_sec")))
    hparams = (tmp_path / "runs" / "quickstart" / "version_0" / "hparams.yaml").read_text()
    assert "pattern:" in hparams and "n_params:" in hparams


@pytest.mark.parametrize("steps, accumulate, logged_at", [(25, 1, [9, 19, 24]), (20, 1, [9, 19]), (7, 2, [4, 6])])
def test_a_run_validates_the_weights_it_ends_with(steps, accumulate, logged_at, tmp_path, monkeypatch, capsys):
    """An interval (10 batches) that does not divide max_steps left the last steps unvalidated, and the run's "final"
    val/loss was an older model's; a run whose last step is a validation step validates there once."""
    monkeypatch.chdir(tmp_path)
    main([*TINY_FIT[:-6], "--trainer.max_steps", str(steps), "--trainer.val_check_interval", "10",
          "--trainer.accumulate_grad_batches", str(accumulate)])
    out = capsys.readouterr().out
    assert f"(step {steps})   best" in out  # the summary's last validation is the last step's
    accuracy = out.split("val/acc    last ")[1].split(" (step")[0]
    [run] = (tmp_path / "runs" / "quickstart").iterdir()
    events = EventAccumulator(str(run))
    events.Reload()
    assert [e.step for e in events.Scalars("val/loss")] == logged_at  # (Lightning logs step k's at k - 1)
    assert f"{events.Scalars('val/acc')[-1].value:.4f}" == accuracy  # the summary's accuracy is the one logged


def test_missing_config_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", "no_such_recipe.yaml"])
    message = str(info.value.code)
    assert "config file 'no_such_recipe.yaml' not found" in message
    assert "quickstart.yaml" in message  # lists what is bundled
    assert "arch/" in message and "arch/llama.yaml" not in message  # the folders of the rest, not 130 names


@pytest.mark.parametrize("given, meant", [
    ("quickstart", "quickstart.yaml?"), ("quickstrat.yaml", "quickstart.yaml, quickstart_bpe.yaml?"),
    ("moe_placement/al.yaml", "moe_placement/all.yaml, "),
    ("arch/llama", "arch/llama.yaml?"),  # the exact name, not arch/tiny/llama.yaml beside it
])
def test_a_near_miss_of_a_bundled_config_is_suggested(given, meant, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", given])
    assert f"did you mean {meant}" in str(info.value.code)


@pytest.mark.parametrize("flags, meant", [
    (["--trainer.max_stepz", "2"], "(did you mean --trainer.max_steps?)"),             # a parser option
    (["--data.init_args.batch_sizee", "2"], "(did you mean batch_size?)"),             # the data class's argument
    (["--model.mixers.A.init_args.n_headz", "2"], "(did you mean n_heads?)"),         # a mixer class's argument
    # a class path whose module lacks the name: the module's class close to it (only jsonargparse's words before)
    (["--model.mixers.A.class_path", "components.QCAtention"], "no attribute 'QCAtention'. (for components.QCAtention) "
                                                                "(did you mean QCAttention?)"),
    (["--data.class_path", "recipes.data.TextCorpuss"], "'TextCorpuss' (did you mean TextCorpus?)"),
])
def test_a_mistyped_option_names_the_option_it_is_close_to(flags, meant, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", "quickstart.yaml", *flags])
    message = str(info.value.code)
    assert message.startswith("error: ") and message.count("\n") == 0 and meant in message


def test_a_mistyped_key_in_a_config_file_names_the_key_it_is_close_to(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "typo.yaml").write_text("checkpoint:\n  every_n_step: 8\n")
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", "quickstart.yaml", "--config", "typo.yaml"])
    # jsonargparse words it per section or per subcommand ("Group 'checkpoint' … 'every_n_step'" or
    # "Subcommand 'fit' … 'checkpoint.every_n_step'"); the suggestion follows the same form
    assert re.search(r"every_n_step' \(did you mean (checkpoint\.)?every_n_steps\?\)", str(info.value.code))


@pytest.mark.parametrize("mixers, meant", [
    ("A: {class_path: components.QCAttention, init_args: {n_head: 2}}",
     "(model.mixers.A, components.QCAttention: did you mean n_heads?)"),
    ("S: {class_path: components.SSD, init_args: {dstate: 16}}", "(model.mixers.S, components.SSD: did you mean d_state?)"),
    ("A: {class_path: components.QCAttention, init_args: {zzz: 2}}",  # nothing close: what it takes
     "(model.mixers.A, components.QCAttention: it takes n_heads, n_kv_heads, head_dim, rope, qk_norm, qk_norm_over, "
     "norm_eps, rope_fraction, sliding_window, qkv_bias, output_gate, backend)"),
])
def test_a_mistyped_mixer_argument_in_a_config_file_names_the_letter_the_class_and_the_near_miss(
        mixers, meant, tmp_path, monkeypatch):
    """In a file, jsonargparse's error names neither the letter nor the class (``Parser key "model.mixers": Option
    'n_head' is not accepted.``); the same flag on the command line had both and the near miss."""
    monkeypatch.chdir(tmp_path)
    right = "S: {class_path: components.SSD}" if mixers.startswith("A") else "A: {class_path: components.QCAttention}"
    (tmp_path / "typo.yaml").write_text(f"model:\n  pattern: 'SM AM'\n  mixers:\n    {mixers}\n    {right}\n")
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", "quickstart.yaml", "--config", "typo.yaml"])
    message = str(info.value.code)
    assert message.startswith("error: ") and message.count("\n") == 0 and meant in message, message
    assert message.count("model.mixers.") == 1  # (the letter whose arguments hold it, not its neighbour)


def test_a_mistyped_key_of_a_section_is_matched_within_that_section():
    # jsonargparse's other wording of an unknown config key: the section, then the key within it
    message = "Group 'trainer' does not accept option 'max_stepz'"
    assert near_misses(message, ["--trainer.max_steps", "--model.max_seq_len"]) == " (did you mean max_steps?)"
    assert near_misses("Group 'trainer' does not accept option 'zzz'", ["--trainer.max_steps"]) == ""


def test_an_abbreviated_option_is_refused_not_taken_for_the_option_it_begins(tmp_path, monkeypatch):
    # argparse's default would read --trainer.max_step as --trainer.max_steps: a typo silently taken
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", "quickstart.yaml", "--trainer.max_step", "2"])
    assert "unrecognized arguments: --trainer.max_step 2 (did you mean --trainer.max_steps?)" in str(info.value.code)


def test_bundled_names_resolve_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_config("quickstart.yaml").endswith("recipes/configs/quickstart.yaml")
    local = tmp_path / "mine.yaml"
    local.write_text("seed_everything: 1\n")
    assert resolve_config("mine.yaml") == "mine.yaml"


def test_unknown_mixer_class_in_a_config_is_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(TINY_FIT + ["--model.mixers.A", "components.NoSuchMixer"])
    message = str(info.value.code)
    assert message.startswith("error: ") and "NoSuchMixer" in message and len(message.splitlines()) <= 3


def test_fit_help_lists_the_zoos_mixers_not_every_module(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = capsys.readouterr().out
    assert "components.SSD" in text and "components.CDMoE" in text
    assert "torch.nn.Identity" not in text and len(text.splitlines()) < 800  # 1,112 lines when it listed them
    assert "One letter alone keeps the recipe's others: --model.mixers.T" in " ".join(text.split())


def test_a_run_is_comparable_in_tensorboard_and_ends_with_a_summary(tmp_path, monkeypatch, capsys):
    """HPARAMS tab (settings against final and best validation loss), samples and the config as text, and the
    summary printed at the end of fit."""
    monkeypatch.chdir(tmp_path)
    main([*TINY_FIT[:-6], "--trainer.max_steps", "20", "--trainer.val_check_interval", "10", "--model.lr", "3e-3"])
    out = capsys.readouterr().out
    assert "fit finished: 20 steps" in out and "tokens/s" in out and "wall time" in out
    summary = out[out.index("fit finished"):]
    last, best = summary.split("last ")[1].split(" (step")[0], summary.split("best ")[1].split(" (step")[0]
    [run] = (tmp_path / "runs" / "quickstart").iterdir()
    relative = run.relative_to(tmp_path)
    assert f"checkpoints {relative / 'checkpoints'}/ (last.ckpt, best.ckpt)" in out and f"--logdir {relative}" in out
    events = EventAccumulator(str(run), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    hparams = events.PluginTagToContent("hparams")
    assert {"_hparams_/experiment", "_hparams_/session_start_info"} <= set(hparams)
    session = hparams["_hparams_/session_start_info"].decode("latin1")
    for name in ("pattern", "mixers/A", "n_params", "n_active_params", "lr", "QCAttention(n_heads=2"):
        assert name in session, name
    finals = events.Scalars("hp/final_val_loss")
    assert [e.step for e in finals][-2:] == [9, 19] and f"{finals[-1].value:.4f}" == last
    assert f"{events.Scalars('hp/best_val_loss')[-1].value:.4f}" == best  # the minimum so far, at the last validation
    texts = set(events.PluginTagToContent("text"))
    assert {"samples/text_summary", "config/text_summary"} <= texts


def test_a_run_without_a_logger_never_overwrites_a_users_config_yaml(tmp_path, monkeypatch, capsys):
    """Without a logger the run folder is the working one: the resolved config.yaml goes there, replacing only
    one a run wrote — not the recipe being read, nor any other file of that name — and the summary points at no
    TensorBoard folder."""
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "config.yaml"
    recipe.write_text("# my notes\n" + open(resolve_config("quickstart.yaml")).read())
    short = [*TINY_FIT[3:-6], "--trainer.max_steps", "2", "--trainer.limit_val_batches", "2",
             "--trainer.enable_progress_bar", "false", "--trainer.logger", "false"]
    for config, why in (("config.yaml", "is this run's --config file"),  # read as the recipe, then merely present
                        (resolve_config("quickstart.yaml"), "is not a configuration a run wrote")):
        with pytest.raises(SystemExit) as info:
            main(["fit", "--config", config, *short])
        assert str(info.value.code).startswith(f"error: {recipe} {why}; ") and "will not overwrite" in info.value.code
        assert recipe.read_text().startswith("# my notes\n")

    recipe.unlink()
    with pytest.raises(SystemExit) as info:  # --ckpt_path last looks where such a run writes
        main(["fit", "--config", "quickstart.yaml", *short, "--ckpt_path", "last"])
    assert info.value.code == (f"error: --ckpt_path last: no last.ckpt in {Path('checkpoints')}/ (where a run without a "
                               "logger writes them); train first, or pass the path of a checkpoint file")
    main(["fit", "--config", "quickstart.yaml", *short])
    out = capsys.readouterr().out
    assert "fit finished: 2 steps" in out and "tensorboard" not in out.lower() and "\n  logs " not in out
    assert recipe.read_text().startswith("# lightning.pytorch==") and "max_steps: 2" in recipe.read_text()
    last = tmp_path / "checkpoints" / "last.ckpt"
    written, checkpoint = recipe.read_text(), last.read_bytes()
    with pytest.raises(SystemExit) as info:  # a new run here would replace that run's checkpoints and file
        main(["fit", "--config", "quickstart.yaml", *short])
    assert info.value.code == (f"error: {last.parent} holds last.ckpt, best.ckpt of an earlier run, whose files this "
                               f"run would overwrite; resume that run with --ckpt_path {last}, or give this one another "
                               "folder: --trainer.default_root_dir FOLDER, or let the run log (drop --trainer.logger false)")
    assert recipe.read_text() == written and last.read_bytes() == checkpoint
    main(["fit", "--config", "quickstart.yaml", *short[:-8], "--trainer.max_steps", "3", *short[-6:],
          "--ckpt_path", "last"])  # resumed, the run replaces its own file
    out = capsys.readouterr().out
    assert f"resuming from {Path('checkpoints/last.ckpt')}" in out and "fit finished: 3 steps (1 in this run" in out
    assert "max_steps: 3" in recipe.read_text()
    written = recipe.read_text()
    with pytest.raises(SystemExit) as info:  # a run's file read back as the recipe is the recipe: kept
        main(["fit", "--config", "config.yaml", *short, "--ckpt_path", str(last)])
    assert "is this run's --config file" in info.value.code and recipe.read_text() == written


def test_a_logger_version_given_twice_is_refused_before_the_second_run_writes_into_the_first(tmp_path, monkeypatch):
    """A fixed version (``--trainer.logger.init_args.version``) names the same folder for two runs: the second is
    refused before it writes anything there — checkpoints, config.yaml, or a TensorBoard events file — with
    checkpointing or without."""
    monkeypatch.chdir(tmp_path)
    run = [*TINY_FIT[:-6], "--trainer.max_steps", "2", "--trainer.limit_val_batches", "2",
           "--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.version", "mine"]
    main(run)
    folder = tmp_path / "runs" / "quickstart" / "mine"
    before = {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()}
    assert {path.name for path in before} >= {"last.ckpt", "best.ckpt", "config.yaml"}
    for again in (run, [*run, "--trainer.enable_checkpointing", "false"]):  # (which would replace its config.yaml)
        with pytest.raises(SystemExit) as info:
            main(again)
        assert info.value.code.startswith(f"error: {Path('runs/quickstart/mine/checkpoints')} holds last.ckpt, "
                                          "best.ckpt of an earlier run") and info.value.code.endswith("a logger version of its own")
        assert {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()} == before


def test_a_csv_logger_run_logs_its_metrics(tmp_path, monkeypatch, capsys):
    """Loggers other than TensorBoard take no ``metrics`` in ``log_hyperparams``; a run with one still logs."""
    monkeypatch.chdir(tmp_path)
    main([*TINY_FIT[:-6], "--trainer.max_steps", "6", "--trainer.val_check_interval", "3",
          "--trainer.logger", "lightning.pytorch.loggers.CSVLogger"])
    out = capsys.readouterr().out
    [metrics] = (tmp_path / "runs").rglob("metrics.csv")
    header, *rows = metrics.read_text().splitlines()
    assert {"train/loss", "val/loss", "hp/best_val_loss"} <= set(header.split(",")) and len(rows) >= 2
    assert f"logs       {metrics.parent.relative_to(tmp_path)}" in out and "tensorboard" not in out.lower()


def test_a_sample_longer_than_the_model_is_shortened_not_the_run_ended(tmp_path, monkeypatch, capsys):
    """The validation sample continues a 32-token prompt by 64 tokens: past a max_seq_len of 40 it takes the 9 that
    fit (it ended the run, after its training steps, with generate's too-long error)."""
    monkeypatch.chdir(tmp_path)
    main([*TINY_FIT[:-6], "--trainer.max_steps", "4", "--trainer.val_check_interval", "2", "--model.max_seq_len", "40"])
    assert "fit finished: 4 steps" in capsys.readouterr().out
    [run] = (tmp_path / "runs" / "quickstart").iterdir()
    events = EventAccumulator(str(run), size_guidance={"tensors": 0})
    events.Reload()
    text = events.Tensors("samples/text_summary")[-1].tensor_proto.string_val[0].decode()
    continuation = ast.literal_eval(text.split("**continuation (greedy):** ")[1])
    assert len(continuation.encode()) == 9  # bytes: 40 - 32 + 1 tokens


def test_the_summary_claims_only_the_checkpoints_written(tmp_path, monkeypatch, capsys):
    """``fast_dev_run`` writes no checkpoint (and no log): the summary says so instead of naming last.ckpt."""
    monkeypatch.chdir(tmp_path)
    main([*TINY_FIT[:-6], "--trainer.fast_dev_run", "true"])
    out = capsys.readouterr().out
    assert "fit finished: 1 step\n" in out and "checkpoints none written" in out and not list(tmp_path.rglob("*.ckpt"))
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"an earlier run's")  # where a run without a logger writes
    main([*TINY_FIT[:-6], "--trainer.fast_dev_run", "true", "--trainer.logger", "false"])
    assert "checkpoints none written" in capsys.readouterr().out


def test_the_fit_summary_says_when_no_validation_ran():
    import lightning as L

    from recipes.run_report import fit_summary

    trainer = SimpleNamespace(global_step=5, max_steps=5, limit_val_batches=2, val_check_interval=200, callbacks=[],
                              loggers=[], check_val_every_n_epoch=3)
    module = SimpleNamespace(history={"val": []})
    assert "val/loss   none: no validation ran in these steps (check_val_every_n_epoch 3 skips" in fit_summary(trainer, module)
    module.history["val"] = [(5, 3.25)]
    assert "val/loss   last 3.2500 (step 5)" in fit_summary(trainer, module)
    module.history["val_acc"] = [(3, 0.5), (5, 0.25)]  # the best accuracy is the highest
    assert "val/acc    last 0.2500 (step 5)   best 0.5000 (step 3)" in fit_summary(trainer, module)
    assert "none" not in fit_summary(SimpleNamespace(**{**vars(trainer), "limit_val_batches": 0}),
                                     SimpleNamespace(history={}))

    class TrainOnly(L.LightningDataModule):  # (the check above blamed the epoch setting for what the data lacks)
        pass

    text = fit_summary(SimpleNamespace(**vars(trainer), datamodule=TrainOnly()), SimpleNamespace(history={"val": []}))
    assert "val/loss   none: the data module TrainOnly has no val_dataloader\n" in text

    class WithValidation(TrainOnly):
        def val_dataloader(self):
            return []

    text = fit_summary(SimpleNamespace(**vars(trainer), datamodule=WithValidation()), SimpleNamespace(history={"val": []}))
    assert "val/loss   none: no validation ran in these steps (check_val_every_n_epoch 3" in text
    trainer.log_every_n_steps = 10  # a run shorter than a logging window: its speed is said to be unmeasured
    assert ("speed      tokens/s not measured: no logging window (--trainer.log_every_n_steps 10) closed in these "
            "5 steps") in fit_summary(trainer, module)
    one = SimpleNamespace(**{**vars(trainer), "global_step": 1})  # (Lightning's fast_dev_run: "in these 1 step")
    assert "closed in this one step" in fit_summary(one, SimpleNamespace(history={}))
    module.history["tokens_per_sec"] = [100.0, 300.0, 200.0]
    assert "speed      median 200 tokens/s" in fit_summary(trainer, module)
    none = fit_summary(SimpleNamespace(**{**vars(trainer), "global_step": 0}), SimpleNamespace(history={}))
    assert none == "\nfit finished: no step"  # no step: nothing to say of its validation or speed

    tensorboard, csv = (type(name, (), {})() for name in ("TensorBoardLogger", "CSVLogger"))
    for loggers, line in [([csv, tensorboard], "  TensorBoard tensorboard --logdir runs/x"), ([csv], "  logs       runs/x")]:
        said = fit_summary(SimpleNamespace(**{**vars(trainer), "loggers": loggers}), module, "runs/x")
        assert said.endswith("\n" + line), said


def test_a_strategy_trains_in_workers_when_its_launcher_is_a_multiprocessing_one(monkeypatch, capsys):
    """Then the summary comes from the worker of rank 0 (it holds the run); elsewhere the command prints it."""
    import recipes.run_report as run_report
    from recipes.run_report import FitSummaryInWorker, trains_in_workers

    spawned = type("_MultiProcessingLauncher", (), {})
    for launcher, in_workers in [(None, False), (type("_SubprocessScriptLauncher", (), {})(), False), (spawned(), True),
                                 (type("Mine", (spawned,), {})(), True)]:
        assert trains_in_workers(SimpleNamespace(strategy=SimpleNamespace(launcher=launcher))) == in_workers, launcher
    assert not trains_in_workers(SimpleNamespace(strategy=SimpleNamespace()))  # (a strategy with no launcher at all)
    monkeypatch.setattr(run_report, "fit_summary", lambda trainer, module, log_dir: f"summary of {log_dir}")
    for run, (launcher, rank_zero) in enumerate([(None, True), (spawned(), False), (spawned(), True)]):
        trainer = SimpleNamespace(strategy=SimpleNamespace(launcher=launcher), is_global_zero=rank_zero, log_dir=run)
        FitSummaryInWorker().on_fit_end(trainer, None)
    assert capsys.readouterr().out == "summary of 2\n"  # the spawned worker of rank 0 alone


def test_a_run_that_fails_before_its_first_step_leaves_no_empty_version_folder(tmp_path, monkeypatch, capsys):
    """Lightning creates ``version_N`` with an events file before the data is set up: a failure there left an empty
    run in TensorBoard. It is removed — but never a folder with anything else in it, such as a resumed run's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one.txt").write_text("one short document")
    short = [*TINY_FIT[:-6], "--trainer.max_steps", "2", "--trainer.enable_progress_bar", "false"]
    too_short = ["--data", "recipes.data.TokenizedCorpus", "--data.paths", "one.txt", "--data.cache_dir", "cache"]
    main(short)
    with pytest.raises(SystemExit, match="the train split has 4 tokens"):
        main([*short, *too_short])
    runs = tmp_path / "runs" / "quickstart"
    assert sorted(p.name for p in runs.iterdir()) == ["version_0"]
    with pytest.raises(SystemExit, match="the train split has 4 tokens"):
        main([*short, *too_short, "--ckpt_path", "last"])  # into version_0, which holds the first run's files
    assert (runs / "version_0" / "checkpoints" / "last.ckpt").is_file() and (runs / "version_0" / "config.yaml").is_file()


def test_only_a_folder_of_this_process_own_start_up_files_counts_as_empty(tmp_path):
    from recipes.training import written_by_this_process_only

    ours, theirs = f"events.out.tfevents.1795834267.host.{os.getpid()}.0", "events.out.tfevents.1795834267.host.1.0"
    for files, empty in (([ours, "hparams.yaml", "config.yaml", "code.json"], True), ([ours], True), (["hparams.yaml"], False),
                         ([ours, theirs], False), ([ours, "checkpoints/last.ckpt"], False), ([ours, "notes.txt"], False)):
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        for name in files:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text("")
        assert written_by_this_process_only(folder) is empty, files


def test_validate_without_a_checkpoint_says_it_scores_an_untrained_model(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    short = ["--config", "quickstart.yaml", "--model.d_model", "32", "--model.mixers.A.init_args.n_heads", "2",
             "--data.init_args.seq_len", "32", "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2",
             "--trainer.enable_progress_bar", "false"]
    main(["fit", *short, "--trainer.max_steps", "1"])
    capsys.readouterr()
    for command in ("validate", "test"):
        main([command, *short])
        assert f"note: no --ckpt_path: {command} scores the recipe's freshly initialised, untrained model" in \
            capsys.readouterr().err
        main([command, *short, "--ckpt_path", "last"])
        assert "untrained" not in capsys.readouterr().err


def test_a_corpus_shorter_than_the_validation_interval_gets_the_flags_that_fix_it(tmp_path, monkeypatch, capsys):
    """Lightning refuses a val_check_interval past an epoch and suggests ``check_val_every_n_epoch=None``: the
    error says how the command line spells that, and the run it names trains and validates across epochs."""
    import json

    monkeypatch.chdir(tmp_path)
    words = "the cat sat on a mat while dogs ran far away".split()
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": " ".join(words[(i + j) % 11] for j in range(60))})
                                              + "\n" for i in range(60)))
    args = [*TINY_FIT[:-6], "--data", "recipes.data.TokenizedCorpus", "--data.paths", "a.jsonl", "--data.vocab_size",
            "300", "--data.cache_dir", "cache", "--data.seq_len", "32", "--data.batch_size", "8",
            "--trainer.max_steps", "60", "--trainer.val_check_interval", "60", "--trainer.logger", "false"]
    with pytest.raises(SystemExit) as info:
        main(args)
    message = str(info.value.code)
    batches = int(message.split("gives ")[1].split(" ")[0])
    assert batches < 60 and message.startswith(f"error: the data gives {batches} training batches per epoch, fewer than "
                                              "val_check_interval 60: --trainer.check_val_every_n_epoch null")
    main([*args, "--trainer.check_val_every_n_epoch", "null"])
    out = capsys.readouterr().out
    assert "fit finished: 60 steps" in out and "val/loss   last" in out and "(step 60)" in out  # across epochs
    # its documents are split into training and validation alone: `test` says so and what scores instead (it was
    # Lightning's "`test_dataloader` must be implemented to be used with the Lightning Trainer")
    with pytest.raises(SystemExit, match=r"^error: TokenizedCorpus has no test split .*python -m recipes validate "):
        main(["test", *args[1:]])


def test_resuming_another_recipes_run_says_it_continues_that_model(tmp_path, monkeypatch, capsys):
    """``fit --ckpt_path`` resumes the checkpoint's model whatever the recipe says; from outside the recipe's own
    runs, with another pattern or width, that is likely a mistake for ``init_from``: a note says so. Resuming the
    recipe's own run (a width given by flag when it started) is not called another recipe's, but ``last`` says that
    no run in the folder has the model the recipe states and which it took."""
    monkeypatch.chdir(tmp_path)
    quiet = ["--trainer.enable_progress_bar", "false", "--data.init_args.seq_len", "32"]
    main(["fit", "--config", "quickstart.yaml", "--model.d_model", "32", "--model.mixers.A.init_args.n_heads", "2",
          "--trainer.max_steps", "2", *quiet])
    capsys.readouterr()
    main(["fit", "--config", "quickstart.yaml", "--trainer.max_steps", "3", "--ckpt_path", "last", *quiet])
    quiet_resume = capsys.readouterr().err
    assert "another recipe's run (" not in quiet_resume
    assert ("note: --ckpt_path last: no last.ckpt there is of the model this recipe states; the newest, "
            f"{Path('runs/quickstart/version_0/checkpoints/last.ckpt')}, is taken, with the model it records (d_model "
            "128 here, 32 there; A.n_heads 4 here, 2 there: a width given by flag" in quiet_resume)
    assert "learning-rate schedule" not in quiet_resume  # 2 steps resumed for 3: both plans end at the final rate
    ckpt = "runs/quickstart/version_0/checkpoints/last.ckpt"
    main(["fit", "--config", "quickstart.yaml", "--trainer.logger.init_args.name", "elsewhere", "--trainer.max_steps", "4",
          "--ckpt_path", ckpt, *quiet])
    assert (f"note: --ckpt_path {ckpt} is another recipe's run (d_model 128 here, 32 there; A.n_heads 4 here, 2 there): "
            "fit resumes that model"
            in capsys.readouterr().err)
    main(["validate", "--config", "quickstart.yaml", "--trainer.logger.init_args.name", "elsewhere",
          "--trainer.limit_val_batches", "2", "--ckpt_path", ckpt, *quiet])
    assert (f"note: --ckpt_path {ckpt} is another recipe's run (d_model 128 here, 32 there; A.n_heads 4 here, 2 there): "
            "validate scores that model, on this recipe's data" in capsys.readouterr().err)
    main(["validate", "--config", "quickstart.yaml", "--trainer.limit_val_batches", "2", "--ckpt_path", "last", *quiet])
    assert "another recipe's run (" not in capsys.readouterr().err  # its own run


def test_resuming_after_the_recipe_was_edited_names_the_training_settings_it_sets_aside(tmp_path, monkeypatch, capsys):
    """A resumed run goes on with the checkpoint's learning rate and weight decay: a recipe file edited since the run
    began (the flags that would are refused) was set aside without a word. A note names each training setting set
    aside; a width the run began with by flag and the resume does not repeat is the run's, and no news."""
    from recipes.recipe_files import CONFIG_DIR

    monkeypatch.chdir(tmp_path)
    text = (CONFIG_DIR / "quickstart.yaml").read_text().replace("name: quickstart", "name: mine")
    (tmp_path / "mine.yaml").write_text(text)
    quiet = ["--config", "mine.yaml", "--trainer.enable_progress_bar", "false", "--data.init_args.seq_len", "32"]
    main(["fit", *quiet, "--model.d_model", "32", "--model.mixers.A.init_args.n_heads", "2", "--trainer.max_steps", "2"])
    main(["fit", *quiet, "--trainer.max_steps", "3", "--ckpt_path", "last"])
    assert "the recipe says" not in capsys.readouterr().err
    (tmp_path / "mine.yaml").write_text(text.replace("lr: 2.0e-3", "lr: 0.05").replace("weight_decay: 0.1",
                                                                                         "weight_decay: 0.2"))
    main(["fit", *quiet, "--trainer.max_steps", "4", "--ckpt_path", "last"])
    checkpoint = "runs/mine/version_0/checkpoints/last.ckpt"
    assert ("note: the recipe says model.lr 0.05 (the checkpoint's 0.002); model.weight_decay 0.2 (the checkpoint's "
            f"0.1): fit resumes {checkpoint} with the checkpoint's" in capsys.readouterr().err)
    trained = torch.load(checkpoint, weights_only=True)
    assert trained["hyper_parameters"]["lr"] == 0.002 and trained["global_step"] == 4  # (as the note says)
    assert {group["weight_decay"] for group in trained["optimizer_states"][0]["param_groups"]} <= {0.0, 0.1}


def test_predict_is_refused_with_the_commands_that_predict(capsys):
    """Lightning's ``predict`` needs a forward that yields predictions (a traceback before): named instead."""
    with pytest.raises(SystemExit) as info:
        main(["predict", "--config", "quickstart.yaml"])
    assert "predict is not a subcommand" in info.value.code and "recipes generate" in info.value.code
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: python -m recipes ") and "{fit,validate,test}" in text and "generate" in text


def test_parse_only_checks_the_command_line_and_builds_nothing(tmp_path, monkeypatch):
    """What ``recipes.sweep`` checks each recipe's ``--set`` with: parsed as ``fit`` parses it, no model, data or
    trainer built (a d_model of 10⁶ would need terabytes), no seed set."""
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(123)
    cli = main(["--config", "quickstart.yaml", "--model.d_model", "1000000"], run=False, parse_only=True)
    assert cli.config.model.d_model == 1_000_000 and not hasattr(cli, "model") and not hasattr(cli, "trainer")
    assert torch.initial_seed() == 123
    with pytest.raises(SystemExit, match=r"unrecognized arguments: --model.d_modle 3 \(did you mean --model.d_model\?\)"):
        main(["--config", "quickstart.yaml", "--model.d_modle", "3"], run=False, parse_only=True)


@pytest.mark.parametrize("args, message", [
    ([], "error: name a command: python -m recipes {fit,validate,test,generate,eval} …; python -m recipes fit --help"),
    (["fitt", "--config", "quickstart.yaml"], "error: 'fitt' is not a command: python -m recipes "
                                              "{fit,validate,test,generate,eval} … (did you mean fit?)"),
    (["evl"], "(did you mean eval?)"),
    (["banana"], "'banana' is not a command: python -m recipes {fit,validate,test,generate,eval} …; python"),
])
def test_a_missing_or_misspelt_command_names_all_five(args, message):
    """Lightning's message named fit, validate and test only, and sent ``fitt`` to ``python -m recipes fitt --help``."""
    with pytest.raises(SystemExit) as info:
        main(args)
    assert message in info.value.code


def test_a_resumed_run_says_how_many_steps_it_trained(tmp_path, monkeypatch, capsys):
    """The summary counts this run's steps apart from the checkpoint's, and says so when max_steps left none."""
    monkeypatch.chdir(tmp_path)
    short = [*TINY_FIT[:-6], "--trainer.enable_progress_bar", "false", "--trainer.val_check_interval", "2"]
    main([*short, "--trainer.max_steps", "4"])
    assert "fit finished: 4 steps\n" in capsys.readouterr().out
    main([*short, "--trainer.max_steps", "4", "--ckpt_path", "last"])
    assert "fit finished: 4 steps, all before this run (max_steps 4 was reached already" in capsys.readouterr().out
    main([*short, "--trainer.max_steps", "6", "--ckpt_path", "last"])
    assert "fit finished: 6 steps (2 in this run, resumed at step 4)\n" in capsys.readouterr().out


def test_ctrl_c_before_training_is_a_line_and_status_130_not_a_traceback(tmp_path, monkeypatch, capsys):
    from recipes.cli import HybridCLI

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # as while a corpus is tokenized or the model is built

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(HybridCLI, "instantiate_trainer", interrupted)
    with pytest.raises(SystemExit) as stopped:
        main(TINY_FIT)
    assert stopped.value.code == 130
    assert "interrupted (Ctrl+C) outside training" in capsys.readouterr().err


def test_a_grown_model_starts_from_the_tensors_of_a_smaller_one_that_fit(tmp_path, monkeypatch, capsys):
    """``init_from`` is strict: a model one block deeper than the checkpoint is refused, naming what does not fit and
    how to load the rest. With ``init_from_strict false`` (a flag like any other) the tensors whose names and shapes
    match are the checkpoint's, exactly; the new block keeps its initialisation; the message lists both."""
    from recipes import LanguageModel
    from recipes.checkpoints import load_weights

    monkeypatch.chdir(tmp_path)
    small = ["fit", "--config", "quickstart.yaml", "--model.d_model", "32", "--model.mixers.A.init_args.n_heads", "2",
             "--model.pattern", "AM SM", "--trainer.max_steps", "2", "--trainer.enable_progress_bar", "false",
             "--data.init_args.seq_len", "32"]
    main(small)
    checkpoint = "runs/quickstart/version_0/checkpoints/last.ckpt"
    grown = dict(d_model=32, pattern="AM SM AM", mixers={"A": {"class_path": "components.QCAttention",
                                                               "init_args": {"n_heads": 2}}})
    with pytest.raises(ValueError, match=r"does not fit this model: shapes \[\], missing \['blocks.2.sequence_mixer.*"
                                         r"init_from_strict=False loads the tensors that fit"):
        LanguageModel(**grown, init_from=checkpoint)
    capsys.readouterr()
    torch.manual_seed(0)
    model = LanguageModel(**grown, init_from=checkpoint, init_from_strict=False)
    trained = {k.removeprefix("model."): v for k, v in load_weights(checkpoint).items()}
    mine = model.model.state_dict()
    torch.manual_seed(0)
    fresh = LanguageModel(**grown).model.state_dict()  # the same seed's initialisation, for the block it has not
    for name, value in mine.items():
        assert torch.equal(value, trained[name] if name in trained else fresh[name]), name
    assert any(name.startswith("blocks.2.") for name in mine) and not any(n.startswith("blocks.2.") for n in trained)
    out = capsys.readouterr().out
    assert (f"init_from: loaded {len(trained)} of the model's {len(mine)} tensors from {checkpoint}; initialised "
            "afresh: blocks.2.sequence_mixer.* (3), blocks.2.sequence_norm.weight, blocks.2.state_mixer.* (2), "
            "blocks.2.state_norm.weight; in the checkpoint but not loaded: none") in out
    # a larger vocabulary: the embedding and head (other shapes) keep their initialisation, named
    wider = LanguageModel(**grown, vocab_size=300, init_from=checkpoint, init_from_strict=False)
    assert torch.equal(wider.model.norm.weight, trained["norm.weight"])
    assert "in the checkpoint but not loaded: embedding.weight, lm_head.weight" in capsys.readouterr().out
    # a width that changes every tensor: nothing fits, named
    with pytest.raises(ValueError, match="no tensor of the checkpoint fits this model"):
        LanguageModel(**{**grown, "d_model": 48, "pattern": "AM"}, init_from=checkpoint, init_from_strict=False)
    # through the command line, as a recipe would say it
    cli = main(["--config", "quickstart.yaml", "--model.d_model", "32", "--model.mixers.A.init_args.n_heads",
                "2", "--model.pattern", "AM SM AM", "--model.init_from", checkpoint, "--model.init_from_strict",
                "false", "--data.init_args.seq_len", "32"], run=False)
    assert torch.equal(cli.model.model.embedding.weight, trained["embedding.weight"])
    assert "init_from_strict" not in cli.model.hparams  # (the run's checkpoints hold the weights themselves)


def fake_module(monkeypatch, name: str, **attributes):
    """A module ``name`` with ``attributes`` in ``sys.modules`` for the test: what ``python -m recipes`` imports."""
    import types

    fake = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(fake, key, value)
    monkeypatch.setitem(sys.modules, name, fake)


@pytest.fixture
def pythons_sigint_handler():
    """Python's own SIGINT handler while the test runs, as in a terminal (a background job, such as CI launched with
    ``&``, inherits SIGINT ignored); whatever was there is put back after."""
    import signal

    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, outer)


def test_a_ctrl_c_that_an_import_swallows_still_stops_the_command(monkeypatch, capsys, pythons_sigint_handler):
    # A library's bare `except:` around an optional import caught the KeyboardInterrupt: the command then ran (the
    # quickstart trained on for minutes after the user's Ctrl+C).
    import os
    import signal

    from recipes.__main__ import run

    ran = []

    def swallowing_getattr(name):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # (the handler runs between bytecodes)
                pass
        except KeyboardInterrupt:
            pass
        return lambda argv: ran.append(argv)

    fake_module(monkeypatch, "recipes.generate", __getattr__=swallowing_getattr)
    with pytest.raises(SystemExit) as stopped:
        run(["generate", "--prompt", "x"])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    assert stopped.value.code == 130 and ran == []
    assert "interrupted (Ctrl+C) while starting: nothing was run" in capsys.readouterr().err


@pytest.mark.parametrize("argv, module, expected", [
    (["generate", "--prompt", "x"], "recipes.generate", ["--prompt", "x"]),
    (["eval", "--tasks", "lambada"], "recipes.evaluation.cli", ["--tasks", "lambada"]),
    (["fit", "--config", "q.yaml"], "recipes.cli", []),  # it reads sys.argv itself, as Lightning's CLI does
    (["generat"], "recipes.cli", []),  # (recipes.cli names the misspelt command)
])
def test_python_m_recipes_hands_each_command_its_own_arguments(argv, module, expected, monkeypatch,
                                                               pythons_sigint_handler):
    """``generate`` and ``eval`` go to their own parsers without the command's name; everything else to the Lightning
    CLI, which reads ``fit``/``validate``/``test`` itself. The SIGINT handler is put back either way."""
    import signal

    from recipes.__main__ import run

    calls = []
    for name in ("recipes.generate", "recipes.evaluation.cli", "recipes.cli"):
        fake_module(monkeypatch, name, main=lambda *args, _name=name: calls.append((_name, *args)))
    run(argv)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert calls == ([(module, expected)] if expected else [(module,)])


@pytest.mark.parametrize("command, module", [("generate", "recipes.generate"), ("eval", "recipes.evaluation.cli")])
def test_a_ctrl_c_while_generate_or_eval_runs_is_one_line_and_status_130(command, module, monkeypatch, capsys,
                                                                        pythons_sigint_handler):
    """A Ctrl+C in the middle of a long evaluation printed torch's traceback and exited with status 1."""
    from recipes.__main__ import run

    def interrupted(argv):
        raise KeyboardInterrupt

    fake_module(monkeypatch, module, main=interrupted)
    with pytest.raises(SystemExit) as stopped:
        run([command, "--prompt", "x"])
    assert stopped.value.code == 130
    assert capsys.readouterr().err == f"interrupted (Ctrl+C): {command} stopped; what it wrote before, it said above\n"
    monkeypatch.setenv("HYBRID_ZOO_DEBUG", "1")  # the traceback, on request
    with pytest.raises(KeyboardInterrupt):
        run([command, "--prompt", "x"])


def test_a_failing_import_without_a_ctrl_c_is_its_own_error(monkeypatch):
    """Only a Ctrl+C makes a failed start "interrupted … nothing was run" (status 130): any other error is raised."""
    from recipes.__main__ import run

    def broken(name):
        raise RuntimeError("a broken optional dependency")

    fake_module(monkeypatch, "recipes.generate", __getattr__=broken)
    with pytest.raises(RuntimeError, match="a broken optional dependency"):
        run(["generate", "--prompt", "x"])


def test_ctrl_c_while_python_m_recipes_imports_is_a_line_and_status_130(tmp_path):
    """A Ctrl+C in the seconds ``python -m recipes`` spends importing torch and Lightning (a sweep stopped as a run
    starts) was a traceback and status 1: the package imports nothing heavy until the command is chosen."""
    import signal
    import subprocess
    import sys
    import time

    code = ("import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\nprint('ready', flush=True)\n"
            "import runpy\nsys.argv = ['recipes', 'fit', '--config', 'quickstart.yaml']\n"
            "runpy.run_module('recipes', run_name='__main__', alter_sys=True)\n")
    started = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert started.stdout.readline() == "ready\n"  # (on a loaded machine Python's own start can take a while)
    time.sleep(0.3)  # into the imports: torch's alone takes longer
    started.send_signal(signal.SIGINT)
    out, err = started.communicate(timeout=120)
    assert started.returncode == 130 and "interrupted (Ctrl+C)" in err and "Traceback" not in err, err
    import recipes

    assert recipes.LanguageModel.__name__ == "LanguageModel"  # (imported on first use)
    with pytest.raises(AttributeError, match="module 'recipes' has no attribute 'LanguageModle'"):
        recipes.LanguageModle


@pytest.mark.parametrize("raised", ["signal.raise_signal(signal.SIGINT)", "1 / 0"], ids=["Ctrl+C", "another error"])
def test_a_ctrl_c_that_lands_in_a_callback_during_the_imports_is_the_line_alone(raised):
    """A Ctrl+C that arrives while importlib runs a weakref callback (its cleanup of a module lock) is raised there,
    and Python ignores it with a printed traceback ("Exception ignored in", a CI run's flake): the command still stops
    on it, so the traceback is not printed; any other error in such a callback still is."""
    import subprocess
    import sys

    code = f"""import signal, sys, types, weakref
signal.signal(signal.SIGINT, signal.default_int_handler)
class Importing(types.ModuleType):
    def __getattr__(self, name):
        class Held:
            pass
        held = Held()
        ref = weakref.ref(held, lambda _: {raised})
        del held  # the callback runs here
        return lambda: print("ran", flush=True)
sys.modules["recipes.cli"] = Importing("recipes.cli")
from recipes.__main__ import run
run(["fit"])
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if raised.startswith("signal"):
        assert (done.returncode, done.stdout) == (130, "") and done.stderr == "interrupted (Ctrl+C) while starting: " \
            "nothing was run\n", done.stderr
    else:
        assert done.returncode == 0 and done.stdout == "ran\n" and "Exception ignored in" in done.stderr
        assert "ZeroDivisionError" in done.stderr


def test_lightnings_barebones_mode_is_refused_at_once_with_what_measures_speed(tmp_path, monkeypatch):
    """Lightning's bare mode refuses a recipe's logger, then its logging interval, then its callbacks — one error a
    try, none saying that a recipe's run is those things."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"--trainer.barebones true turns off what a recipe's run is made of.*"
                                         r"python -m recipes.benchmarks.models times a training step"):
        main([*TINY_FIT, "--trainer.barebones", "true", "--trainer.logger", "false"])
    assert not (tmp_path / "runs").exists()


# ---- the command line's helpers, one at a time -------------------------------------------------------------------


def test_a_config_is_a_path_or_a_bundled_name_and_a_missing_one_names_what_it_may_have_meant(tmp_path, monkeypatch):
    from recipes.recipe_files import CONFIG_DIR, bundled_hint

    monkeypatch.chdir(tmp_path)
    (tmp_path / "quickstart.yaml").write_text("model: {}\n")
    assert resolve_config("quickstart.yaml") == "quickstart.yaml"  # a path wins over the bundled recipe of its name
    assert resolve_config("mqar/ssd.yaml") == str(CONFIG_DIR / "mqar" / "ssd.yaml")
    assert bundled_hint("quickstart") == "did you mean quickstart.yaml?"
    assert bundled_hint("ifa_mask_d32.yaml") == "did you mean mqar_hard/ifa_mask_d32.yaml?"  # (the file name in a folder)
    assert bundled_hint("ssd.yaml") == ("did you mean english/delta_rule/ssd.yaml, mqar/ssd.yaml, "
                                        "state_tracking/ssd.yaml?")  # (in several)
    assert bundled_hint("moe_placement/al").startswith("did you mean moe_placement/all.yaml, ")  # (close: up to 3)
    hint = bundled_hint("zzzz")
    assert hint.startswith("bundled: ablate_moe.yaml, quickstart.yaml, quickstart_bpe.yaml, and ") and "mqar/, " in hint
    assert hint.endswith(f": ls {CONFIG_DIR}") and "mqar/ssd.yaml" not in hint
    with pytest.raises(FileNotFoundError, match=r"config file 'quickstart' not found: it is not a path to a file, nor "
                                                r"a bundled config \(did you mean quickstart.yaml\?\)"):
        resolve_config("quickstart")


@pytest.mark.parametrize("text, problem", [
    ("model: [unclosed", "is not valid YAML: "),
    ("", "is empty; a recipe is a mapping of sections"),
    ("- a\n- b\n", "holds a list; a recipe is a mapping of sections"),
])
def test_a_recipe_file_that_is_not_a_mapping_of_sections_is_named(tmp_path, text, problem):
    from recipes.recipe_files import read_config

    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"config file {re.escape(str(path))} {problem}"):
        read_config(str(path))


def test_every_config_argument_is_resolved_and_a_letter_is_bound_in_its_file_or_an_earlier_one(tmp_path):
    from recipes.cli import resolve_config_args
    from recipes.recipe_files import CONFIG_DIR

    base, tweak = tmp_path / "base.yaml", tmp_path / "tweak.yaml"
    base.write_text("model:\n  mixers:\n    A: {class_path: components.QCAttention}\n    S: components.SSD\n")
    tweak.write_text("model:\n  mixers:\n    A: {init_args: {n_heads: 2}}\n    S: {init_args: {d_state: 8}}\n")
    quick = str(CONFIG_DIR / "quickstart.yaml")
    assert resolve_config_args(["fit", "-c", "quickstart.yaml", f"--config={base}", "--config", str(tweak),
                                "--trainer.max_steps", "2", "--config"]) == [
        "fit", "-c", quick, f"--config={base}", "--config", str(tweak), "--trainer.max_steps", "2", "--config"]
    with pytest.raises(ValueError, match=rf"config file {re.escape(str(tweak))}: model.mixers.A has no class_path, and "
                                         r"no earlier config binds 'A'"):
        resolve_config_args(["fit", "--config", str(tweak), "--config", str(base)])  # (bound only later)


def test_a_run_loggers_folder_is_its_save_dir_and_name_and_loggers_without_version_folders_have_none():
    from types import SimpleNamespace as NS

    from recipes.ckpt_path import run_logger

    tensorboard = NS(class_path="lightning.pytorch.loggers.TensorBoardLogger", init_args=NS(save_dir="runs", name="a"))
    assert run_logger({"logger": tensorboard}) == (tensorboard, Path("runs/a"))
    assert run_logger({"logger": [tensorboard, NS(class_path="x.CSVLogger")]}) == (tensorboard, Path("runs/a"))
    unnamed = NS(class_path="lightning.pytorch.loggers.CSVLogger", init_args=NS(save_dir=None, name=None))
    assert run_logger({"logger": unnamed, "default_root_dir": "out"}) == (unnamed, Path("out"))
    assert run_logger({"logger": None, "default_root_dir": "out"}) == (None, Path("out/lightning_logs"))
    assert run_logger({"logger": True}) == (None, Path("lightning_logs"))
    for none in (False, [], NS(class_path="lightning.pytorch.loggers.WandbLogger", init_args=NS()), "a string"):
        assert run_logger({"logger": none}) == (None, None)


def test_what_the_command_line_sets_and_whether_a_setting_contradicts_a_recorded_one():
    from types import SimpleNamespace as NS

    from recipes.ckpt_path import differs, dotted_get, explicit_model_flags, plain

    assert explicit_model_flags(["fit", "--model.d_model", "64", "--model.mixers.A.init_args.n_heads=2",
                                 "--trainer.max_steps", "3", "--modelx"]) == ["d_model", "mixers.A.init_args.n_heads"]
    tree = {"model": NS(mixers={"A": {"init_args": {"n_heads": 2}}})}
    assert dotted_get(tree, "model.mixers.A.init_args.n_heads") == 2
    for absent in ("model.mixers.B", "model.mixers.A.init_args.n_heads.x", "data"):
        with pytest.raises(KeyError):
            dotted_get(tree, absent)
    assert plain((1, 2)) == [1, 2] and plain(NS(as_dict=lambda: {"a": 1})) == {"a": 1} and plain("x") == "x"
    assert not differs("AM×2", "AMx2") and differs("AM×2", "AMx3")
    assert not differs((0.9, 0.98), [0.9, 0.98]) and differs([0.9, 0.98], [0.9]) and differs([0.9, 0.98], [0.9, 0.9])
    assert not differs({"n_heads": 2, "d_state": 8}, {"n_heads": 2, "bias": False})  # (each side's defaults left out)
    assert differs({"n_heads": 2}, {"n_heads": 4}) and differs({"a": {"b": 1}}, {"a": {"b": 2}})
    assert differs(64, 32) and not differs(64, 64)
    assert differs({"a": 1, "b": 2}, {"a": 1, "b": 3}) and not differs([{"a": 1}], [{"a": 1, "b": 2}])
    assert differs("AM", 5) and differs({"n_heads": 2}, None) and differs([1], 5)  # (unlike kinds: no comparison)


def test_a_run_folders_version_is_its_number_a_limit_of_one_batch_is_refused_and_a_run_name_stays_inside():
    from types import SimpleNamespace as NS

    from recipes.ckpt_path import run_version
    from recipes.cli import check_limit_flags, check_run_name, names_a_learning_rate_finder

    assert run_version("version_3") == 3 and run_version("sweep_20260101") == "sweep_20260101"
    assert run_version("version_3a") == "version_3a"
    for args in (["--trainer.limit_val_batches", "1"], ["--trainer.limit_train_batches=1"],
                 ["--trainer.limit_test_batches", " 1 "]):
        with pytest.raises(ValueError, match=f"{args[0].split('=')[0]} 1 is read as the fraction 1.0"):
            check_limit_flags(["fit", *args])
    for args in (["--trainer.limit_val_batches", "1.0"], ["--trainer.limit_val_batches=2"],
                 ["--trainer.limit_val_batches"], ["--trainer.max_steps", "1"], ["--trainer.limit_val", "1"]):
        check_limit_flags(args)
    for field, value in (("name", "../elsewhere"), ("version", "/tmp/run"), ("sub_dir", "a/../../b"), ("name", "~me")):
        with pytest.raises(ValueError, match=f"logger {field}={value!r} would write outside the logger's save_dir"):
            check_run_name(NS(init_args=NS(**{field: value})))
    check_run_name(NS(init_args=NS(name="family/recipe", version="version_0", sub_dir=None)))
    check_run_name(None)
    finder = NS(class_path="lightning.pytorch.callbacks.LearningRateFinder")
    assert names_a_learning_rate_finder({"callbacks": [NS(class_path="x.ModelCheckpoint"), finder]})
    assert names_a_learning_rate_finder({"callbacks": finder})
    assert not names_a_learning_rate_finder({"callbacks": None}) and not names_a_learning_rate_finder({})


def test_resuming_another_recipes_run_is_said_only_where_its_pattern_or_width_differ(capsys):
    from recipes.ckpt_path import say_if_another_model

    say_if_another_model("x.ckpt", {"pattern": "AM×2", "d_model": 64}, {"pattern": "AMx2", "d_model": 64, "lr": 1})
    assert capsys.readouterr().err == ""
    say_if_another_model("x.ckpt", {"pattern": "AM×2", "d_model": 64}, {"pattern": "SM", "d_model": 32})
    assert capsys.readouterr().err == (
        "note: --ckpt_path x.ckpt is another recipe's run (pattern 'AM×2' here, 'SM' there; d_model 64 here, 32 there): "
        "fit resumes that model, not this recipe's: drop --ckpt_path to train this recipe's model (--model.init_from "
        "FILE starts it from a checkpoint's weights where the shapes agree)\n")
    # validate and test score the checkpoint's model too: a checkpoint of another recipe said nothing there
    say_if_another_model("x.ckpt", {"pattern": "AM×2", "d_model": 64}, {"pattern": "SM", "d_model": 64}, "validate")
    assert capsys.readouterr().err == ("note: --ckpt_path x.ckpt is another recipe's run (pattern 'AM×2' here, 'SM' "
                                       "there): validate scores that model, on this recipe's data\n")


def test_a_relative_init_from_in_a_recipe_file_is_relative_to_that_file(tmp_path, monkeypatch):
    """So a recipe works from any folder; the last file that gives the value decides, in any of the ways a file is
    named; an absolute path and a value given on the command line (relative to the working folder) stay as given."""
    monkeypatch.chdir(tmp_path)
    for folder, init_from in (("a", "w.ckpt"), ("b", "w.ckpt"), ("c", "/abs/w.ckpt"), ("d", "other.ckpt")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "r.yaml").write_text(f"model:\n  init_from: {init_from}\n")

    def init_from(*args):
        return main(["--config", "quickstart.yaml", *args], run=False, parse_only=True).config.model.init_from

    assert init_from("--config", "a/r.yaml") == "a/w.ckpt"
    assert init_from("-c", "a/r.yaml", "--config=b/r.yaml") == "b/w.ckpt"
    assert init_from("--config=b/r.yaml", "-c", "a/r.yaml") == "a/w.ckpt"
    assert init_from("--config", "a/r.yaml", "--config", "c/r.yaml") == "/abs/w.ckpt"
    assert init_from("--config", "a/r.yaml", "--model.init_from", "mine.ckpt") == "mine.ckpt"
    assert init_from("--config", "a/r.yaml", "--model.init_from=mine.ckpt") == "mine.ckpt"
    assert init_from("--model.init_from", "mine.ckpt", "--config", "d/r.yaml") == "d/other.ckpt"
    assert init_from("--config", "d/r.yaml", "--model.init_from", "w.ckpt") == "w.ckpt"
    assert init_from("--config", "a/r.yaml", "--model.init_from", "w.ckpt") == "w.ckpt"  # the same text: the flag gave it
    assert init_from() is None


def test_a_checkpoint_whose_hyper_parameters_are_not_language_models_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.save({"pytorch-lightning_version": "2.6.0", "hyper_parameters": {"d_model": 8, "colour": "red", "age": 3},
                "state_dict": {}}, tmp_path / "other.ckpt")
    with pytest.raises(SystemExit, match=r"other.ckpt: hyper-parameters \['age', 'colour'\] are not LanguageModel's: "
                                         "not a checkpoint of this zoo"):
        main(["validate", "--config", "quickstart.yaml", "--ckpt_path", str(tmp_path / "other.ckpt")])


def test_a_resumed_runs_model_flags_are_checked_against_its_checkpoint_one_by_one(capsys):
    """``_check_flags_agree`` on its own: a flag that agrees passes silently, one that changes no weight is taken with
    a note, the rate a learning-rate finder replaced gives way to the checkpoint's, any other difference is refused,
    every one named in one error; the settings of how (not what) to run are not compared."""
    import copy

    from recipes.cli import HybridCLI

    def check(args, given, recorded, lr_found=False):
        cli = SimpleNamespace(_command_line=["fit", *args])
        HybridCLI._check_flags_agree(cli, "run.ckpt", given, recorded, lr_found=lr_found)
        return recorded

    hparams = {"d_model": 64, "lr": 0.01, "max_seq_len": 128, "compile": False, "mixers": {"A": {"n_heads": 2}}}
    assert check(["--model.d_model", "64"], {"d_model": 64}, dict(hparams)) == hparams
    assert capsys.readouterr().err == ""
    assert check(["--model.max_seq_len=512"], {"max_seq_len": 512}, dict(hparams))["max_seq_len"] == 512
    assert capsys.readouterr().err == "note: --model.max_seq_len 512 over the checkpoint's 128 (it changes no weight)\n"
    assert check(["--model.lr", "0.5"], {"lr": 0.5}, dict(hparams), lr_found=True)["lr"] == 0.01
    assert capsys.readouterr().err == ("note: --model.lr 0.5 is the rate the learning-rate finder replaced: the run goes "
                                       "on at the checkpoint's 0.01, the finder's\n")
    assert check(["--model.compile", "true"], {"compile": True}, dict(hparams))["compile"] is False
    assert check(["--model.unknown", "1"], {}, dict(hparams)) == hparams  # (not in both: jsonargparse's to refuse)
    with pytest.raises(ValueError, match=r"--ckpt_path run.ckpt: --model.lr 0.5 \(the checkpoint has 0.01\); "
                                         r"--model.mixers.A.n_heads 4 \(the checkpoint has 2\)\. A checkpoint's model "
                                         "is the one it was trained as"):
        check(["--model.lr", "0.5", "--model.d_model", "64", "--model.mixers.A.n_heads", "4"],
              {"lr": 0.5, "d_model": 64, "mixers": {"A": {"n_heads": 4}}}, dict(hparams))
    with pytest.raises(ValueError, match=r"--model.d_model 32 \(the checkpoint has 64\)"):
        check(["--model.d_model", "32"], {"d_model": 32}, dict(hparams), lr_found=True)
    # a mixer's kernel and the SSD's chunk length change how, not what: taken (a GPU run checked on the reference)
    mixers = {"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "backend": "triton"}},
              "S": {"class_path": "components.SSD", "init_args": {"chunk_size": 64, "backend": "auto"}}}
    taken = check(["--model.mixers.A.init_args.backend", "reference", "--model.mixers.S.init_args.chunk_size=16"],
                  {"mixers": {"A": {"init_args": {"backend": "reference"}}, "S": {"init_args": {"chunk_size": 16}}}},
                  {**hparams, "mixers": copy.deepcopy(mixers)})["mixers"]
    assert taken["A"]["init_args"] == {"n_heads": 2, "backend": "reference"}
    assert taken["S"]["init_args"] == {"chunk_size": 16, "backend": "auto"}
    assert capsys.readouterr().err == (
        "note: --model.mixers.A.init_args.backend 'reference' over the checkpoint's 'triton' (it changes no weight)\n"
        "note: --model.mixers.S.init_args.chunk_size 16 over the checkpoint's 64 (it changes no weight)\n")
    with pytest.raises(ValueError, match=r"--model.mixers.A.init_args.n_heads 4 \(the checkpoint has 2\)"):
        check(["--model.mixers.A.init_args.n_heads", "4"], {"mixers": {"A": {"init_args": {"n_heads": 4}}}},
              {**hparams, "mixers": copy.deepcopy(mixers)})


def test_a_named_checkpoint_is_found_and_a_run_s_own_is_logged_into_that_run(tmp_path, monkeypatch, capsys):
    """``_resolve_checkpoint`` on its own, over the quickstart recipe's parsed configuration: ``last``/``best`` are the
    newest of the recipe's runs; a fit from a run's checkpoint logs on in that run (TensorBoard purged from the first
    step the checkpoint did not see logged), a validate or test into its own sub-folder of it; a file elsewhere is
    not the run's; what is no checkpoint is named."""
    import copy

    from recipes.checkpoints import SHARDED_META
    from recipes.cli import HybridCLI

    monkeypatch.chdir(tmp_path)
    parsed = main(["--config", "quickstart.yaml"], run=False, parse_only=True).config
    run = tmp_path / "runs" / "quickstart" / "version_2" / "checkpoints"
    run.mkdir(parents=True)
    torch.save({"global_step": 40, "pending_log": {"step": 41, "metrics": {}}, "state_dict": {}}, run / "last.ckpt")
    torch.save({"global_step": 30, "state_dict": {}}, run / "best.ckpt")
    (tmp_path / "elsewhere").mkdir()
    torch.save({"global_step": 30, "state_dict": {}}, tmp_path / "elsewhere" / "w.ckpt")

    def resolve(subcommand, ckpt_path, logger="TensorBoardLogger"):
        config, cli = copy.deepcopy(parsed), SimpleNamespace()
        config.ckpt_path = ckpt_path
        config.trainer.logger.class_path = f"lightning.pytorch.loggers.{logger}"
        HybridCLI._resolve_checkpoint(cli, subcommand, config)
        return config, cli._ckpt_in_run, getattr(config.trainer.logger, "dict_kwargs", None)

    config, in_run, kwargs = resolve("fit", "last")
    assert config.ckpt_path == str(Path("runs/quickstart/version_2/checkpoints/last.ckpt")) and in_run
    assert config.trainer.logger.init_args.version == 2 and kwargs == {"purge_step": 41}
    assert capsys.readouterr().out == f"resuming from {config.ckpt_path}\n"
    config, in_run, kwargs = resolve("fit", str(run / "best.ckpt"))
    assert in_run and kwargs == {"purge_step": 30}  # (no pending log: its own step)
    config, in_run, kwargs = resolve("validate", "best")
    assert config.trainer.logger.init_args.version == 2 and kwargs == {"sub_dir": "validate"}
    assert capsys.readouterr().out == f"checkpoint: {config.ckpt_path}\n"
    config, in_run, kwargs = resolve("fit", "last", logger="CSVLogger")
    assert config.trainer.logger.init_args.version == 2 and kwargs is None
    config, in_run, kwargs = resolve("test", "last", logger="CSVLogger")
    assert config.trainer.logger.init_args.version is None and kwargs is None
    config, in_run, kwargs = resolve("fit", str(tmp_path / "elsewhere" / "w.ckpt"))
    assert not in_run and config.trainer.logger.init_args.version is None and kwargs is None

    with pytest.raises(SystemExit, match=r"error: --ckpt_path swa: no swa.ckpt under runs/quickstart/\*/checkpoints/; "
                                         "train first"):
        resolve("validate", "swa")
    with pytest.raises(SystemExit, match="error: --ckpt_path missing.ckpt: no such checkpoint file"):
        resolve("fit", "missing.ckpt")
    with pytest.raises(SystemExit, match=r"error: --ckpt_path .*elsewhere"):
        resolve("fit", str(tmp_path / "elsewhere"))
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / SHARDED_META).write_bytes(b""), (shards / ".metadata").write_bytes(b"")
    with pytest.raises(SystemExit, match=f"error: --ckpt_path {shards}: "):
        resolve("validate", str(shards))


def test_a_named_checkpoint_is_of_the_recipes_model_when_another_recipe_logs_into_the_same_folder(
        tmp_path, monkeypatch, capsys):
    """``fit --config quickstart.yaml --config mine.yaml`` logs under quickstart's logger name: ``last`` of
    quickstart alone used to be whichever of the two ran last, and a fit resumed, a validate scored or a generate
    continued the other model without a word. It is the newest of this recipe's model, and the newer one passed over
    is named; where none is, the newest, and how it differs."""
    import copy
    import os

    from recipes.cli import HybridCLI

    monkeypatch.chdir(tmp_path)
    parsed = main(["--config", "quickstart.yaml"], run=False, parse_only=True).config
    hparams = {"pattern": "AMx4", "d_model": 128, "mixers": {"A": {"class_path": "components.QCAttention",
                                                                   "init_args": {"n_heads": 4}}}}

    def run(version, mtime, **changes):
        folder = tmp_path / "runs" / "quickstart" / f"version_{version}" / "checkpoints"
        folder.mkdir(parents=True)
        torch.save({"state_dict": {}, "hyper_parameters": {**hparams, **changes}}, folder / "last.ckpt")
        os.utime(folder / "last.ckpt", (mtime, mtime))
        return str(Path("runs/quickstart") / f"version_{version}" / "checkpoints" / "last.ckpt")

    def resolve(subcommand="fit"):
        config = copy.deepcopy(parsed)
        config.ckpt_path = "last"
        HybridCLI._resolve_checkpoint(SimpleNamespace(), subcommand, config)
        return config.ckpt_path, capsys.readouterr().err

    own = run(0, 1_000)
    assert resolve() == (own, "")
    layered = run(1, 2_000, d_model=64)
    assert resolve() == (own, f"note: --ckpt_path last is {own}, the newest last.ckpt of this recipe's model: a newer "
                              f"last.ckpt in the same folder is another model's, {layered} (d_model 128 here, 64 there); "
                              "pass its path to use it\n")
    run(2, 3_000, mixers={"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 8}}})
    path, note = resolve("validate")
    assert path == own and "2 newer last.ckpt" in note and "(A.n_heads 4 here, 8 there)" in note
    run(3, 4_000)
    assert resolve() == (str(Path("runs/quickstart/version_3/checkpoints/last.ckpt")), "")
    monkeypatch.setattr(parsed.model, "d_model", 32)  # (a width no run has: the newest, and how it differs)
    path, note = resolve()
    assert path.endswith("version_3/checkpoints/last.ckpt") and note == (
        f"note: --ckpt_path last: no last.ckpt there is of the model this recipe states; the newest, {path}, is taken, "
        "with the model it records (d_model 32 here, 128 there: a width given by flag when the run began, or another "
        "recipe's run in the same folder)\n")


def test_a_models_differences_are_in_what_the_recipe_states():
    """The pattern in either spelling, the width, the size target, each mixer's class by name (a re-export's module
    path is the same class) and each argument the recipe states; not one it leaves None, nor the width size_to
    solves, nor a kernel setting, nor a letter the checkpoint's pattern does not use."""
    from recipes.ckpt_path import model_differences

    qc = {"class_path": "components.QCAttention", "init_args": {"n_heads": 4, "n_kv_heads": None}}
    mlp = {"class_path": "components.MLP", "init_args": {"d_ff": None, "activation": "swiglu"}}
    recorded = {"pattern": "AMx2", "d_model": 64, "size_to": {"params": 9000, "letters": ["M"], "arg": "d_ff"},
                "mixers": {"A": {"class_path": "components.attention.QCAttention",
                                 "init_args": {"n_heads": 4, "n_kv_heads": 2}},
                           "M": {"class_path": "components.MLP", "init_args": {"d_ff": 344, "activation": "swiglu"}}}}
    recipe = {"pattern": "AM×2", "d_model": 64, "size_to": {"params": 9000, "letters": "M"},
              "mixers": {"A": qc, "M": {**mlp, "init_args": {"d_ff": 128, "activation": "swiglu"}},
                         "S": {"class_path": "components.SSD"}}}
    assert model_differences(recipe, recorded) == []
    assert model_differences({**recipe, "size_to": {"params": 8000}}, recorded) == [
        "size_to.params 8000 here, 9000 there"]
    assert model_differences({**recipe, "size_to": None}, recorded) == ["size_to.params None here, 9000 there"]
    assert model_differences({**recipe, "pattern": "SM"}, recorded) == ["pattern 'SM' here, 'AMx2' there"]
    assert model_differences({**recipe, "d_model": 32}, recorded) == ["d_model 32 here, 64 there"]
    assert model_differences({**recipe, "size_to": None}, {**recorded, "size_to": None}) == [
        "M.d_ff 128 here, 344 there"]  # (a width no size target solved)
    assert model_differences({**recipe, "mixers": {"A": {**qc, "init_args": {"n_heads": 2}}}}, recorded) == [
        "A.n_heads 2 here, 4 there"]
    kernels = {"A": {**qc, "init_args": {"n_heads": 4, "backend": "reference"}},
               "M": {**mlp, "init_args": {"chunk_size": 16}}}  # (how, not what: MIXER_HOW)
    assert model_differences({**recipe, "mixers": kernels}, {**recorded, "mixers": {
        "A": {**recorded["mixers"]["A"], "init_args": {"n_heads": 4, "backend": "auto"}},
        "M": {**recorded["mixers"]["M"], "init_args": {"chunk_size": 64}}}}) == []
    # a crafted checkpoint's record of any shape is compared, not crashed on (its trust check refuses it by name)
    assert model_differences(recipe, {"mixers": "x", "size_to": "y"}) == ["size_to.params 9000 here, None there"]
    assert model_differences(recipe, {**recorded, "size_to": {"params": 9000, "letters": 3}, "mixers": {
        "A": "components.QCAttention", "M": {"class_path": "components.MLP", "init_args": [1]}}}) == []
    assert model_differences({**recipe, "mixers": {"A": "components.SlidingWindowAttention"}}, recorded) == [
        "A SlidingWindowAttention here, QCAttention there"]


def test_lightnings_cloud_logger_advert_is_dropped_once_however_many_commands_run():
    import logging

    from recipes.cli import DropAdvert, quiet_lightning

    quiet_lightning(), quiet_lightning()
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        assert sum(isinstance(f, DropAdvert) for f in logger.filters) == 1

        def record(message):
            return logging.LogRecord(name, logging.INFO, __file__, 1, message, None, None)

        assert not logger.filter(record("💡 Tip: For seamless cloud logging and experiment tracking, try installing "
                                        "[litlogger]"))
        assert logger.filter(record("GPU available: False, used: False"))


def test_without_arguments_main_reads_the_command_line_as_python_m_recipes_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["recipes", "--config", "quickstart.yaml", "--model.d_model", "24"])
    cli = main(run=False, parse_only=True)
    assert cli.config.model.d_model == 24 and sys.argv[2].endswith(os.path.join("recipes", "configs", "quickstart.yaml"))
    monkeypatch.setattr(sys, "argv", ["recipes", "fit", "--config", "quickstart.yaml", "--optimizer", "SGD"])
    with pytest.raises(SystemExit, match="error: --optimizer is Lightning's"):
        main()
    monkeypatch.setattr(sys, "argv", ["recipes", "test", "--config", "quickstart.yaml", "--model.d_modle", "3"])
    with pytest.raises(SystemExit, match=r"\(python -m recipes test --help lists the options\)"):
        main()


def test_the_trainer_a_recipe_gets_writes_atomically_with_the_zoos_callbacks_and_no_lightning_summary(tmp_path,
                                                                                                    monkeypatch):
    from lightning.pytorch.callbacks import ModelSummary

    from recipes.run_report import FitSummaryInWorker
    from recipes.training import AtomicCheckpointIO, CheckpointPolicy, StepProgressBar, ValidateFinalStep

    monkeypatch.chdir(tmp_path)
    trainer = main(["--config", "quickstart.yaml"], run=False).trainer
    assert type(trainer.strategy.checkpoint_io) is AtomicCheckpointIO and trainer.gradient_clip_val == 1.0
    kinds = [type(c) for c in trainer.callbacks]
    assert {ValidateFinalStep, FitSummaryInWorker, CheckpointPolicy, StepProgressBar} <= set(kinds)
    assert kinds.index(ValidateFinalStep) < kinds.index(CheckpointPolicy)  # (it asks what follows the step)
    assert not any(isinstance(c, ModelSummary) for c in trainer.callbacks)  # the zoo's own per-block summary instead


def test_the_cli_hooks_say_the_threads_store_the_whole_config_and_leave_a_workers_summary_to_it(tmp_path, monkeypatch,
                                                                                                capsys):
    from jsonargparse import Namespace

    import recipes.cli as cli_module
    from recipes.cli import HybridCLI

    said = iter(["threads: 2 of 2 cores (OMP_NUM_THREADS)", None])
    monkeypatch.setattr(cli_module, "choose_threads", lambda threads: next(said))
    for _ in range(2):
        HybridCLI.before_instantiate_classes(SimpleNamespace(
            config=Namespace(subcommand="fit", fit=Namespace(threads=2, model=Namespace(mixers=None, pattern="AM"))),
            _command_line=["--config", "quickstart.yaml"]))
    assert capsys.readouterr().out == "threads: 2 of 2 cores (OMP_NUM_THREADS)\n"

    monkeypatch.chdir(tmp_path)
    parsed = main(["--config", "quickstart.yaml"], run=False, parse_only=True)
    texts = []
    logger = SimpleNamespace(experiment=SimpleNamespace(add_text=lambda tag, text, step: texts.append((tag, step, text))))
    HybridCLI.before_fit(SimpleNamespace(_parser=lambda name: parsed.parser, config={"fit": parsed.config},
                                         trainer=SimpleNamespace(loggers=[logger, SimpleNamespace(experiment=None)],
                                                                 global_step=5, fast_dev_run=False, is_global_zero=False,
                                                                 log_dir=str(tmp_path))))
    [(tag, step, text)] = texts
    assert (tag, step) == ("config", 5) and text.startswith("```yaml\n") and text.endswith("\n```")
    assert "  init_from: null\n" in text and "  d_model: " in text  # every setting, the unset ones too
    # rank zero holds its run folder (recipes.training.RunFolderLock), but not a remote one: no local "s3:" folder
    for log_dir, held in ((f"s3://bucket/{tmp_path.name}", False), (str(tmp_path / "local"), True)):
        HybridCLI.before_fit(SimpleNamespace(_parser=lambda name: parsed.parser, config={"fit": parsed.config},
                                             trainer=SimpleNamespace(loggers=[], global_step=0, fast_dev_run=False,
                                                                     is_global_zero=True, log_dir=log_dir)))
        assert len(cli_module.RUN_LOCKS) == held and not (tmp_path / "s3:").exists()
        while cli_module.RUN_LOCKS:
            cli_module.RUN_LOCKS.pop().release()

    summaries = []
    monkeypatch.setattr(cli_module, "fit_summary", lambda trainer, model, log_dir: summaries.append(log_dir) or "done")
    for in_workers, is_global_zero in ((True, True), (False, False), (False, True)):
        monkeypatch.setattr(cli_module, "trains_in_workers", lambda trainer: in_workers)
        HybridCLI.after_fit(SimpleNamespace(trainer=SimpleNamespace(log_dir="runs/x", is_global_zero=is_global_zero),
                                            model=None))
    assert summaries == ["runs/x"] and capsys.readouterr().out == "done\n"


def test_the_threads_are_the_requested_ones_else_the_cores_other_processes_leave(monkeypatch):
    """``--threads N``; else OMP_NUM_THREADS (torch's own); else the cores no other process is busy with (measured
    now; the load average only where there is nothing to measure): one thread per core on a shared CPU
    oversubscribes it. Fewer threads only: never more than torch would take."""
    import torch

    import recipes.run_report as run_report
    from recipes.run_report import choose_threads

    before = torch.get_num_threads()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 3.0, 3.0))  # not read while there is a measurement
    try:
        with pytest.raises(ValueError, match="--threads 0 must be >= 1"):
            choose_threads(0)
        assert choose_threads(1) == "torch threads: 1 (--threads)" and torch.get_num_threads() == 1
        for busy, threads in [(0.4, None), (1.4, 3), (2.6, 1), (9.0, 1)]:  # round(busy), at most 3 of 4 cores
            torch.set_num_threads(4)
            monkeypatch.setattr(run_report, "busy_cores", lambda cpus: busy if cpus == {0, 1, 2, 3} else None)
            said = choose_threads(None)
            if threads is None:  # all four free: torch's own four stay
                assert said is None and torch.get_num_threads() == 4
            else:
                assert said == (f"torch threads: {threads} of 4 cores (about {min(round(busy), 3)} busy with other "
                                "processes); --threads N or OMP_NUM_THREADS=N chooses"), busy
                assert torch.get_num_threads() == threads
        monkeypatch.setattr(run_report, "busy_cores", lambda cpus: None)  # no counters: the load average
        torch.set_num_threads(4)
        assert choose_threads(None).startswith("torch threads: 1 of 4 cores (about 3 busy")
        monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # (macOS, Windows): the CPU count, else one core
        for count, said in [(6, "torch threads: 3 of 6 cores (about 3 busy"), (None, "torch threads: 1 of 1 cores (about 0")]:
            torch.set_num_threads(8)
            monkeypatch.setattr(os, "cpu_count", lambda: count)
            assert choose_threads(None).startswith(said)
        monkeypatch.setenv("OMP_NUM_THREADS", "8")  # torch took it at its start: left as it is
        torch.set_num_threads(8)
        assert choose_threads(None) is None and torch.get_num_threads() == 8
    finally:
        torch.set_num_threads(before)


def test_the_busy_cores_are_the_not_idle_share_of_this_processes_cpus_over_the_window(tmp_path, monkeypatch):
    """Counted from the per-CPU lines of /proc/stat over the window, on this process's CPUs only (the machine-wide
    line and other CPUs left out), idle and iowait as idle; and measured for real, a spinning process is seen."""
    import subprocess
    import time

    from recipes.run_report import busy_cores

    stat = tmp_path / "stat"
    line = "cpu{} {} 0 {} {} {} 0 0 0 0 0\n"  # user nice system idle iowait ...
    first = "cpu  999 0 0 0 0 0 0 0 0 0\n" + line.format(0, 100, 10, 500, 5) + line.format(1, 50, 0, 900, 0)
    # over the window: cpu0 60 not idle of 100 ticks, cpu1 10 of 100; cpu2 (not ours) all busy
    after = ("cpu  0 0 0 0 0 0 0 0 0 0\n" + line.format(0, 150, 20, 535, 10) + line.format(1, 60, 0, 990, 0)
             + line.format(2, 10**6, 0, 0, 0))
    stat.write_text(first)
    monkeypatch.setattr(time, "sleep", lambda seconds: stat.write_text(after))
    assert busy_cores({0, 1}, stat=str(stat)) == pytest.approx(2 * 70 / 200, abs=0.01)
    stat.write_text(first)
    assert busy_cores({1}, stat=str(stat)) == pytest.approx(0.1, abs=0.01)
    stat.write_text(first)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # no tick passed: nothing to say
    assert busy_cores({0, 1}, stat=str(stat)) is None
    assert busy_cores({0}, stat=str(tmp_path / "absent")) is None
    monkeypatch.undo()

    if not Path("/proc/stat").exists():
        return
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 30\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.5)
        # (it shares the cores with the suite's other worker, so it gets at least half of one)
        assert busy_cores(os.sched_getaffinity(0), window=0.5) >= 0.4
    finally:
        spinner.kill()
        spinner.wait()


def test_a_parse_error_keeps_its_first_lines_and_a_class_offers_its_own_keywords_only_once_imported():
    from recipes.cli_errors import class_options, parse_error_message

    lines = [f"line {i}" for i in range(8)]
    assert parse_error_message(ValueError("\n".join(lines))) == "\n".join(lines[:6])  # (no union: its own lines)
    assert class_options("lightning.pytorch.loggers.CSVLogger")[:3] == ["save_dir", "name", "version"]
    assert class_options("os.path") == []  # a module, not a class
    assert class_options("not_imported_anywhere.Model") == []  # nothing is imported to find out


def test_a_mapping_of_mixers_given_whole_names_the_letters_it_dropped(tmp_path, monkeypatch, capsys):
    """jsonargparse replaces a mapping given whole: ``--model.mixers '{T: …}'`` beside quickstart.yaml (the
    architecture walkthrough's own command) dropped its ``A: {n_heads: 4}``, and the run built 8 heads without a
    word. The run keeps jsonargparse's rule and says which of the pattern's letters lost their binding, and how."""
    from recipes.cli import dropped_bindings
    from recipes.recipe_files import resolve_config

    monkeypatch.chdir(tmp_path)
    quick = resolve_config("quickstart.yaml")  # mixers A (QCAttention, 4 heads) and M (MLP, swiglu)
    (tmp_path / "mine.yaml").write_text("model:\n  mixers:\n    A: {class_path: components.QCAttention}\n")
    whole = ["--config", quick, "--model.mixers", "{T: {class_path: components.TokenShift}}"]
    note = dropped_bindings(whole, {"T": {}}, "TM AM")
    assert note.startswith("note: model.mixers given whole replaces the mapping before it")
    assert ("A, bound by quickstart.yaml, dropped by --model.mixers: now the default QCAttention with default "
            "arguments; M, bound by quickstart.yaml, dropped by --model.mixers: now the default MLP") in note
    alone = dropped_bindings(whole, {"T": {}}, "T- A-")
    assert "A, bound" in alone and "M, bound" not in alone  # (a dropped letter the pattern does not use changed nothing)
    assert dropped_bindings(["--config", quick, "--config", "mine.yaml"], {"A": {}}, "AM") == dropped_bindings(
        [f"-c={quick}", "-c", "mine.yaml"], {"A": {}}, "AM")
    assert "M, bound by quickstart.yaml, dropped by mine.yaml" in dropped_bindings(["-c", quick, "-c=mine.yaml"],
                                                                                   {"A": {}}, "AM")
    assert "M, bound by quickstart.yaml, dropped by mine.yaml:" in dropped_bindings(  # (by the first that dropped it)
        ["-c", quick, "-c", "mine.yaml", "--model.mixers", "{A: {}, T: {}}"], {"A": {}, "T": {}}, "AM TM")
    for kept in ([*whole, "--model.mixers.A", "{class_path: components.QCAttention}", "--model.mixers.M={}"],  # bound again
                 ["--config", quick, "--model.mixers.T", "{class_path: components.TokenShift}"],  # one letter alone
                 ["--config", quick, "--model.mixers", "{A: {}, M: {}, T: {}}"]):  # the letters repeated
        assert dropped_bindings(kept, {"A": {}, "M": {}, "T": {}}, "TM AM") is None, kept
    assert dropped_bindings(whole, {"T": {}}, "TM A(") is None  # (a bad pattern is the model's to name)
    assert dropped_bindings(["--model.mixers.Q", "{}", "--model.mixers", "{T: {}}"], {"T": {}}, "QM") == (
        "note: model.mixers given whole replaces the mapping before it, and the pattern's letters lost their bindings: "
        "Q, bound by --model.mixers.Q, dropped by --model.mixers: now unbound. To add or change one letter and keep "
        "the others, give it alone (--model.mixers.T '{class_path: components.TokenShift}'), or repeat in the later "
        "mapping the letters to keep")

    cli = main(["--config", "quickstart.yaml", "--model.d_model", "32", "--model.pattern", "TM AM",
                "--model.mixers", "{T: {class_path: components.TokenShift}}"], run=False)
    assert "A, bound by quickstart.yaml, dropped by --model.mixers" in capsys.readouterr().err
    assert cli.model.model.blocks[1].sequence_mixer.n_heads == 8  # jsonargparse's rule stands: the default's heads
    main(["--config", "quickstart.yaml", "--model.d_model", "32", "--model.pattern", "TM AM",
          "--model.mixers.T", "{class_path: components.TokenShift}"], run=False)
    assert "note: model.mixers" not in capsys.readouterr().err


def test_a_data_module_of_ones_own_without_a_vocabulary_is_refused_by_name(tmp_path, monkeypatch):
    """jsonargparse skips a link whose source lacks the attribute without a word: a data module with no
    ``vocab_size`` built the model at the default 256, which a recipe cannot change (``model.vocab_size`` is the
    link's target), and ids past it were refused at the first batch with no word of why."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "mydata.py").write_text(
        "import lightning as L\n\n\nclass NoVocabulary(L.LightningDataModule):\n    pass\n\n\n"
        "class WithVocabulary(L.LightningDataModule):\n    vocab_size = 1000\n")
    base = ["--config", "quickstart.yaml", "--model.d_model", "16", "--model.mixers.A.init_args.n_heads", "2"]
    with pytest.raises(SystemExit, match="error: the data module NoVocabulary has no vocab_size: the model's vocabulary is "
                                         r"taken from it .* give NoVocabulary a vocab_size attribute or property"):
        main([*base, "--data", "mydata.NoVocabulary"], run=False)
    assert main([*base, "--data", "mydata.WithVocabulary"], run=False).model.model.vocab_size == 1000
    # without a validation split, validate names what is missing (it was Lightning's "`val_dataloader` must be
    # implemented to be used with the Lightning Trainer")
    with pytest.raises(SystemExit, match=r"^error: WithVocabulary has no val_dataloader, the split validate scores"):
        main(["validate", *base, "--data", "mydata.WithVocabulary", "--trainer.logger", "false"])
