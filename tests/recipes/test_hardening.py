"""Bad input a new user (or a damaged disk) gives the recipes: each gets an error that names the problem, as
the last line, without a traceback — where it used to be accepted silently, or end in a deep error."""

import importlib.util
import json

import pytest
import torch

from components import HybridLM
from recipes import LanguageModel
from recipes.cli import main
from recipes.training import AtomicCheckpointIO

TINY = ["--config", "quickstart.yaml", "--model.d_model", "16", "--model.pattern", "AM", "--model.mixers.A.init_args.n_heads",
        "2", "--data.init_args.seq_len", "16", "--data.init_args.batch_size", "2", "--trainer.max_steps", "2",
        "--trainer.limit_val_batches", "2", "--trainer.val_check_interval", "2", "--trainer.enable_progress_bar", "false"]


def refused(tmp_path, monkeypatch, *args: str) -> str:
    """The message ``python -m recipes ARGS`` exits with (it must exit, with one short message)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(list(args))
    message = str(info.value.code)
    assert message.startswith("error: ") and len(message.splitlines()) <= 2, message
    return message


@pytest.mark.parametrize("content, expected", [
    ("", "is empty; a recipe is a mapping of sections"),
    ("- model\n- data\n", "holds a list; a recipe is a mapping"),
    ("model: [unclosed\n", "is not valid YAML"),
    ("model:\n  mixers:\n    Q: {init_args: {n_heads: 2}}\n", "model.mixers.Q has no class_path, and no earlier config binds 'Q'"),
    ("model:\n  mixers:\n    AB: {class_path: components.MLP}\n", "mixers key 'AB' is not a pattern letter"),
    ("model:\n  mixers:\n    I: {class_path: components.InnerFuncAttention, init_args: {inner: retrieval, n_values: 6}}\n",
     "model.mixers.I: n_values moved into the parts of InnerFuncAttention; write init_args: {inner: {retrieval: {n_values: 6}}}"),
], ids=["empty", "list", "not-yaml", "no-class-path", "two-letters", "moved-argument"])
def test_a_bad_recipe_file_is_named(tmp_path, monkeypatch, content, expected):
    (tmp_path / "bad.yaml").write_text(content)
    assert expected in refused(tmp_path, monkeypatch, "fit", *TINY, "--config", "bad.yaml")


def test_a_later_file_may_change_only_the_arguments_of_a_bound_letter(tmp_path, monkeypatch):
    (tmp_path / "heads.yaml").write_text("model:\n  mixers:\n    A: {init_args: {n_heads: 4}}\n")
    monkeypatch.chdir(tmp_path)
    cli = main(["--config", "quickstart.yaml", "--config", "heads.yaml", "--model.d_model", "16"], run=False)
    assert cli.model.model.blocks[0].sequence_mixer.n_heads == 4


@pytest.mark.parametrize("flags, expected", [
    (["--trainer.accumulate_grad_batches", "0"], "accumulate_grad_batches=0 must be an integer >= 1"),
    (["--trainer.gradient_clip_val", "-1"], "gradient_clip_val=-1"),
    (["--trainer.enable_checkpointing", "false", "--checkpoint.every_n_steps", "5"],
     "checkpoint options {'every_n_steps': 5} have no effect with trainer.enable_checkpointing false"),
    (["--model.d_modle", "3"], "unrecognized arguments: --model.d_modle 3 (did you mean --model.d_model?) (python -m recipes fit --help"),
    (["--model.mixers", "{Q: {init_args: {n_heads: 2}}}"], "model.mixers"),
    (["--model.mixers.A.init_args.n_heads", "x"],
     'Parser key "model.mixers": Parser key "n_heads": Expected a <class \'int\'>. Got value: x. (for components.QCAttention)'),
    (["--model.mixers.A.init_args.bogus", "1"], "Option 'bogus' is not accepted. (for components.QCAttention)"),
    (["--trainer.logger", "nonsense.Logger"],
     "\"trainer.logger\": Problem with given class_path 'nonsense.Logger': No module named 'nonsense' (python -m"),
    (["--seed_everything", "-3"], "--seed_everything -3: a seed lies in [0, 2**32 - 1]"),
    (["--seed_everything", str(2**32)], f"--seed_everything {2**32}: a seed lies in [0, 2**32 - 1]"),
    (["--trainer.max_steps", "-1", "--trainer.max_epochs", "-1", "--trainer.max_time", "00:00:00:05"],  # an OverflowError
     "this run sets no limit on them (max_steps -1 and max_epochs -1; max_time does not say how many)"),
    (["--trainer.limit_val_batches", "1"], "--trainer.limit_val_batches 1 is read as the fraction 1.0 (every batch), "
                                           "not one batch; write 1.0 for every batch, or a count of 2 or more"),
    (["--trainer.limit_train_batches=1"], "--trainer.limit_train_batches 1 is read as the fraction 1.0"),
], ids=["accumulate-0", "negative-clip", "checkpointing-off", "typo", "binding-without-class", "bad-value",
        "unknown-argument", "unknown-logger", "negative-seed", "seed-past-numpy", "time-only", "limit-one", "limit-one-equals"])
def test_a_bad_option_is_named_in_a_line_or_two(tmp_path, monkeypatch, flags, expected):
    assert expected in refused(tmp_path, monkeypatch, "fit", *TINY, *flags)


def test_resuming_with_a_contradicting_model_flag_is_named(trained, tmp_path, monkeypatch):
    message = refused(tmp_path, monkeypatch, "fit", *TINY, "--model.d_model", "32", "--ckpt_path", str(trained))
    assert "--model.d_model 32 (the checkpoint has 16)" in message and "start a new run" in message


def test_how_a_checkpoint_is_run_is_the_command_lines_not_the_checkpoints(trained, tmp_path, monkeypatch):
    """``compile``, ``loss_positions`` and ``sample_tokens`` say how to run a model, not what it is: a validation of a
    checkpoint takes them from the command line and the recipe, whatever the run recorded."""
    monkeypatch.chdir(tmp_path)
    cli = main(["validate", *TINY, "--ckpt_path", str(trained), "--model.sample_tokens", "7",
                "--model.loss_positions", "labelled"])
    assert cli.model.hparams.sample_tokens == 7 and cli.model.hparams.loss_positions == "labelled"
    assert torch.load(trained, weights_only=True)["hyper_parameters"]["sample_tokens"] != 7


def test_a_checkpoint_is_validated_on_another_kernel_and_chunk_length_by_flag(trained, tmp_path, monkeypatch, capsys):
    """A GPU run's checkpoint checked on the plain-torch reference: ``--model.mixers.A.init_args.backend reference``
    was refused as contradicting the checkpoint ("a checkpoint's model is the one it was trained as"), though a
    kernel changes no weight. It is taken, with a note, and the model validated is built with it."""
    monkeypatch.chdir(tmp_path)
    cli = main(["validate", *TINY, "--ckpt_path", str(trained), "--model.mixers.A.init_args.backend", "reference"])
    assert "note: --model.mixers.A.init_args.backend 'reference' over the checkpoint's 'auto'" in capsys.readouterr().err
    attention = cli.model.model.blocks[0].sequence_mixer
    assert type(attention).__name__ == "QCAttention" and attention.backend == "reference"
    assert cli.model.hparams.mixers["A"]["init_args"]["backend"] == "reference"


def test_a_checkpoint_is_validated_past_its_length_with_a_flag_that_changes_no_weight(trained, tmp_path, monkeypatch,
                                                                                     capsys):
    # "exceeds max_seq_len=… build the model with a larger max_seq_len, or with extrapolate=True" — and both flags
    # were refused as contradicting the checkpoint, so a run could not be validated past its trained length.
    monkeypatch.chdir(tmp_path)
    longer = [*TINY, "--ckpt_path", str(trained), "--data.init_args.seq_len", "600", "--data.init_args.batch_size", "1",
              "--trainer.limit_val_batches", "2"]
    with pytest.raises(SystemExit, match="sequence length 600 exceeds max_seq_len=512"):
        main(["validate", *longer])
    capsys.readouterr()
    main(["validate", *longer, "--model.extrapolate", "true"])
    assert "note: --model.extrapolate True over the checkpoint's False (it changes no weight)" in capsys.readouterr().err
    main(["validate", *longer, "--model.max_seq_len", "600"])
    printed = capsys.readouterr()
    assert "note: --model.max_seq_len 600 over the checkpoint's 512" in printed.err and "val/loss" in printed.out
    main(["validate", *TINY, "--ckpt_path", str(trained)])  # no flag: the checkpoint's
    assert "over the checkpoint's" not in capsys.readouterr().err


def test_a_consolidated_checkpoint_is_no_resume_and_says_where_the_run_and_its_weights_go(trained, tmp_path,
                                                                                          monkeypatch):
    """``python -m recipes.consolidate`` keeps a sharded run's weights, not its optimizer state: ``fit --ckpt_path``
    of it is refused (resuming would restart the optimizer without a word), naming the folder and ``init_from``."""
    checkpoint = torch.load(trained, weights_only=True)
    checkpoint["consolidated_from"] = str(tmp_path / "last.ckpt")  # (what consolidate records)
    torch.save(checkpoint, tmp_path / "one.ckpt")
    message = refused(tmp_path, monkeypatch, "fit", *TINY, "--ckpt_path", str(tmp_path / "one.ckpt"))
    assert (f"one.ckpt was consolidated from the sharded checkpoint {tmp_path / 'last.ckpt'} and holds no optimizer "
            f"state: resume the sharded run from that folder, or start a new run from these weights with "
            f"--model.init_from {tmp_path / 'one.ckpt'}") in message


def test_an_hf_converted_checkpoint_given_to_ckpt_path_points_to_init_from(tmp_path, monkeypatch):
    lm = LanguageModel(16, "AM", vocab_size=256)
    torch.save({"state_dict": lm.state_dict(), "hyper_parameters": dict(lm.hparams)}, tmp_path / "weights.ckpt")
    message = refused(tmp_path, monkeypatch, "validate", *TINY, "--ckpt_path", str(tmp_path / "weights.ckpt"))
    assert "holds weights only" in message and "--model.init_from" in message


def test_a_checkpoint_whose_shapes_do_not_fit_is_named(trained, tmp_path, monkeypatch):
    checkpoint = torch.load(trained, weights_only=True)
    checkpoint["state_dict"]["model.embedding.weight"] = torch.zeros(300, 16)
    torch.save(checkpoint, tmp_path / "wrong.ckpt")
    message = refused(tmp_path, monkeypatch, "validate", *TINY, "--ckpt_path", str(tmp_path / "wrong.ckpt"))
    assert "the checkpoint does not fit this model: model.embedding.weight: checkpoint (300, 16), model (256, 16)" in message


def test_a_full_disk_during_a_checkpoint_write_is_named_and_keeps_the_previous_file(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    io.save_checkpoint({"global_step": 1, "w": torch.ones(2)}, tmp_path / "last.ckpt")

    def full(obj, f, *args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file data/0")
    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError, match=r"writing the checkpoint .*last.ckpt failed: \[enforce fail .* MiB are free on that "
                                      r"disk \(a full disk\?\); the previous last.ckpt, if any, is unchanged"):
        io.save_checkpoint({"global_step": 2, "w": torch.zeros(2)}, tmp_path / "last.ckpt")
    monkeypatch.undo()
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_corpus_files_that_are_not_text_or_tokenizers_are_named(tmp_path):
    from recipes.data import TokenizedCorpus

    (tmp_path / "latin1.jsonl").write_bytes(json.dumps({"text": "caf"}).encode()[:-2] + b"\xe9\"}\n")
    with pytest.raises(ValueError, match=r"latin1.jsonl is not UTF-8 text \(near "):
        TokenizedCorpus(str(tmp_path / "latin1.jsonl"), vocab_size=300, cache_dir=str(tmp_path / "c")).setup()
    (tmp_path / "garbage.json").write_text("{not a tokenizer")
    with pytest.raises(ValueError, match=r"garbage.json is not a tokenizers JSON file"):
        TokenizedCorpus(tokenizer=str(tmp_path / "garbage.json"))


def test_an_hf_config_missing_a_required_key_names_the_file_and_the_key(tmp_path):
    from recipes.hf import hf_recipe

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 10,
                                                      "num_hidden_layers": 2, "num_attention_heads": 4}))
    with pytest.raises(ValueError, match=r"config.json: the required key 'hidden_size' is missing \(LlamaForCausalLM"):
        hf_recipe(tmp_path)
    (tmp_path / "config.json").write_text("{broken")
    with pytest.raises(ValueError, match=r"config.json is not valid JSON"):
        hf_recipe(tmp_path)


def test_model_inputs_out_of_their_range_are_named():
    model = HybridLM(20, 16, "AM", max_seq_len=8).eval()
    ids = torch.randint(0, 20, (2, 5))
    with pytest.raises(ValueError, match=r"position_ids must be >= 0 and below max_seq_len=8 .*got values in \[-1, 3\]"):
        model(ids, position_ids=torch.tensor([[0, 1, 2, 3, -1]] * 2))
    with pytest.raises(ValueError, match=r"got values in \[5, 9\]"):
        model(ids, position_ids=torch.arange(5, 10).expand(2, 5))
    HybridLM(20, 16, "AM", max_seq_len=8, extrapolate=True).eval()(ids, position_ids=torch.arange(5, 10).expand(2, 5))
    with pytest.raises(ValueError, match=r"document_ids must have the shape of input_ids \(2, 5\); got \(2, 4\)"):
        model(ids, document_ids=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"padding_mask must have the shape of input_ids \(2, 5\); got \(5,\)"):
        model(ids, padding_mask=torch.zeros(5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"stop_token=20 is not a token of the vocabulary \[0, 20\)"):
        model.generate(ids, 3, stop_token=20)
    with pytest.raises(ValueError, match=r"temperature=nan must be a finite number >= 0"):
        model.generate(ids, 3, temperature=float("nan"))


def test_labels_outside_the_vocabulary_are_named_in_evaluation_and_stop_training():
    lm = LanguageModel(16, "AM", vocab_size=20)
    batch = {"input_ids": torch.randint(0, 20, (2, 6)), "labels": torch.full((2, 6), 25)}
    lm.eval()
    with pytest.raises(ValueError, match=r"labels must be token ids in \[0, vocab_size=20\) or -100 .*got values in \[25, 25\]"):
        lm.forward_loss(batch)
    lm.train()
    with pytest.raises(RuntimeError, match=r"labels must be token ids in \[0, vocab_size=20\)"):
        lm.training_loss(batch)


def test_a_checkpoint_from_before_inner_func_attention_took_parts_validates_and_reloads(tmp_path, monkeypatch, capsys):
    """Its letter spec gave n_values / top_k / max_position beside inner and mask, and its mask parameters sat on
    the attention (A, delta_proj, position_bias): the CLI and load_from_checkpoint read it as today's model."""
    import lightning

    old_spec = {"class_path": "components.InnerFuncAttention",
                "init_args": {"n_heads": 2, "inner": "retrieval", "n_values": 5, "top_k": 3, "mask": "position",
                              "max_position": 64}}
    lm = LanguageModel(16, "IM", {"I": old_spec}, vocab_size=256)
    with torch.no_grad():
        lm.model.blocks[0].sequence_mixer.key_bias.table.normal_()
    old_state = {k.replace("sequence_mixer.key_bias.table", "sequence_mixer.position_bias"): v for k, v in lm.state_dict().items()}
    hparams = {**dict(lm.hparams), "mixers": {**lm.hparams["mixers"], "I": old_spec}}
    torch.save({"state_dict": old_state, "hyper_parameters": hparams, "pytorch-lightning_version": lightning.__version__},
               tmp_path / "old.ckpt")
    again = LanguageModel.load_from_checkpoint(tmp_path / "old.ckpt")
    assert again.model.blocks[0].sequence_mixer.value.top_k == 3
    torch.testing.assert_close(again.model.blocks[0].sequence_mixer.key_bias.table, lm.model.blocks[0].sequence_mixer.key_bias.table)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    main(["validate", *TINY, "--model.pattern", "IM", "--ckpt_path", str(tmp_path / "old.ckpt")])
    assert "val/loss" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="needs wandb absent")
def test_a_logger_whose_package_is_missing_is_named_with_the_install_hint(tmp_path, monkeypatch):
    """Lightning refuses the logger when it is built (not parsed): its hint, not a union's twelve lines."""
    message = refused(tmp_path, monkeypatch, "fit", *TINY, "--trainer.logger", "lightning.pytorch.loggers.WandbLogger")
    assert "'lightning.pytorch.loggers.WandbLogger': Requirement 'wandb" in message and "pip install" in message
    assert "NoneType" not in message and "Given value" not in message


def test_a_gpu_asked_for_on_a_machine_without_one_is_one_line():
    """Lightning's MisconfigurationException was a traceback: one ``error:`` line with the flag to change."""
    import torch

    from recipes.cli import main

    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", "quickstart.yaml", "--trainer.accelerator", "gpu", "--trainer.logger", "false"])
    assert str(info.value.code).startswith("error: No supported gpu backend found!: --trainer.accelerator gpu needs a "
                                           "CUDA (or Apple MPS) device")
