"""Training that can be trusted (docs/training.md): checkpoints reload, a killed run resumes exactly, a diverged
run stops without spoiling its checkpoint, signals save before exiting, DDP equals one process."""

import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from recipes import LanguageModel
from recipes.cli import main
from recipes.data.order import ResumableLoader, ResumableSampler
from lightning.pytorch.callbacks import TQDMProgressBar

from recipes.training import AtomicCheckpointIO, CheckpointPolicy, StepProgressBar, default_progress_bar

ROOT = Path(__file__).resolve().parents[2]

TEXT = ["--config", "quickstart.yaml", "--model.d_model", "32", "--model.mixers.A.init_args.n_heads", "2",
        "--data.init_args.seq_len", "32", "--data.init_args.batch_size", "8"]
MQAR = ["--config", "mqar/qcattn.yaml", "--model.d_model", "32", "--data.init_args.seq_len", "64",
        "--data.init_args.num_pairs", "8", "--data.init_args.batch_size", "8"]
SHORT = ["--trainer.max_steps", "14", "--trainer.val_check_interval", "7", "--trainer.limit_val_batches", "2",
         "--trainer.log_every_n_steps", "1", "--trainer.enable_progress_bar", "false", "--checkpoint.every_n_steps", "5"]

INTERRUPT = '''
import os
import lightning as L

class SignalAtStep(L.Callback):
    """Sends ``signum`` to this process when step ``step`` is about to start."""
    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)
'''


def fit(cwd: Path, *args: str, signal_at: tuple[int, int] | None = None, fault: str | None = None) -> subprocess.CompletedProcess:
    """``python -m recipes fit ARGS`` in ``cwd`` as its own process; with ``signal_at=(step, signum)`` the
    process signals itself when that step starts (SIGKILL: a crash at an arbitrary moment)."""
    extra = []
    if signal_at is not None:
        (cwd / "interrupt.py").write_text(INTERRUPT)
        (cwd / "interrupt.yaml").write_text(
            f"trainer:\n  callbacks: [{{class_path: interrupt.SignalAtStep, init_args: {{step: {signal_at[0]}, "
            f"signum: {int(signal_at[1])}}}}}]\n")
        extra = ["--config", "interrupt.yaml"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if fault is not None:
        env["HYBRID_ZOO_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "recipes", "fit", *args, *extra], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def scalars(run: Path, tag: str) -> dict[int, float]:
    events = EventAccumulator(str(run))
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


def checkpoint_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=True)["global_step"]


def fit_here(cwd: Path, *args: str) -> None:
    """``python -m recipes fit ARGS`` in this process (no interpreter start-up), from folder ``cwd``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        main(["fit", *args])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, dict[int, float]]:
    """The per-step training losses of each recipe run without interruption."""
    cwd = tmp_path_factory.mktemp("uninterrupted")
    losses = {}
    for name, recipe, logs in (("text", TEXT, "quickstart"), ("mqar", MQAR, "mqar/qcattn")):
        fit_here(cwd, *recipe, *SHORT, "--trainer.logger.init_args.version", name)
        losses[name] = scalars(cwd / "runs" / logs / name, "train/loss")
    return losses


@pytest.mark.parametrize("data, signum, code", [
    ("text", signal.SIGKILL, -signal.SIGKILL),
    ("mqar", signal.SIGKILL, -signal.SIGKILL),
    ("text", signal.SIGTERM, 128 + signal.SIGTERM),
    ("mqar", signal.SIGINT, 128 + signal.SIGINT),
], ids=["text-kill9", "mqar-kill9", "text-sigterm", "mqar-sigint"])
def test_interrupted_run_resumes_with_the_same_losses(uninterrupted, tmp_path, capsys, data, signum, code):
    recipe = TEXT if data == "text" else MQAR
    cut = fit(tmp_path, *recipe, *SHORT, signal_at=(12, signum))
    assert cut.returncode == code, cut.stderr[-3000:]
    [last] = tmp_path.glob("runs/**/checkpoints/last.ckpt")
    # kill -9 at the start of step 13 leaves the step-10 checkpoint; a signal lets step 13 finish and saves it.
    assert checkpoint_step(last) == (10 if signum == signal.SIGKILL else 13)
    if signum != signal.SIGKILL:
        assert "resume with --ckpt_path last" in cut.stderr

    fit_here(tmp_path, *recipe, *SHORT, "--ckpt_path", "last")
    assert f"resuming from {last.relative_to(tmp_path)}" in capsys.readouterr().out
    assert len(list(tmp_path.glob("runs/**/events.out.tfevents.*"))) == 2  # both in the same run folder

    expected, got = uninterrupted[data], scalars(last.parent.parent, "train/loss")
    assert sorted(got) == sorted(expected) == list(range(14))
    assert max(abs(got[s] - expected[s]) for s in expected) <= 1e-6


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_ddp_on_two_processes_matches_one_process_on_the_combined_batch(tmp_path, strategy):
    common = [*TEXT, "--trainer.max_steps", "6", "--trainer.limit_val_batches", "0", "--trainer.log_every_n_steps",
              "1", "--trainer.enable_progress_bar", "false"]
    ddp = fit(tmp_path, *common, "--data.init_args.batch_size", "4", "--trainer.strategy", strategy,
              "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.logger.init_args.version", "ddp")
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    # ddp_spawn pickles the trainer and model into its workers, and its rank 0 hands the weights back to this
    # process in a file of tensors alone; the run's summary comes from that worker, which holds the run.
    assert "fit finished: 6 steps" in ddp.stdout, ddp.stdout[-2000:]
    assert "checkpoints runs/quickstart/ddp/checkpoints/ (last.ckpt)" in ddp.stdout
    fit_here(tmp_path, *common, "--data.init_args.batch_size", "8", "--trainer.logger.init_args.version", "one")
    got, expected = (scalars(tmp_path / "runs" / "quickstart" / v, "train/loss") for v in ("ddp", "one"))
    assert sorted(got) == sorted(expected) == list(range(6))
    # Same samples, same mean gradient; only the order of floating-point sums differs.
    assert max(abs(got[s] - expected[s]) / expected[s] for s in expected) <= 1e-5


def test_overfit_batches_trains_on_the_same_first_batch_every_step(tmp_path):
    # The sanity check of a new model: can it learn one batch by heart? Lightning rebuilds the training loader with a
    # sequential sampler for it, which the resumable loader's signature refused ("Trying to inject parameters").
    fit_here(tmp_path, *TEXT, "--trainer.overfit_batches", "1", "--trainer.max_steps", "40",
             "--trainer.log_every_n_steps", "1", "--trainer.limit_val_batches", "0",
             "--trainer.check_val_every_n_epoch", "null", "--trainer.enable_progress_bar", "false", "--model.lr", "0.01",
             "--trainer.logger.init_args.version", "overfit")
    losses = scalars(tmp_path / "runs" / "quickstart" / "overfit", "train/loss")
    assert sorted(losses) == list(range(40))
    assert losses[0] > 5 and losses[39] < 0.5  # one batch of 8 × 32 bytes learnt by heart (fresh batches: about 3)


def test_each_process_takes_its_own_share_of_the_combined_order():
    data = list(range(40))
    one = list(ResumableSampler(data, seed=3))
    shards = [list(ResumableSampler(data, seed=3, num_replicas=2, rank=r)) for r in (0, 1)]
    assert not set(shards[0]) & set(shards[1])
    # Step s of two processes with batch b covers exactly step s of one process with batch 2b.
    b = 4
    for s in range(len(shards[0]) // b):
        assert sorted(shards[0][s * b:(s + 1) * b] + shards[1][s * b:(s + 1) * b]) == sorted(one[2 * s * b:2 * (s + 1) * b])


def test_loader_resumes_mid_epoch_and_after_the_last_batch():
    data = list(range(30))
    reference = ResumableLoader(data, batch_size=4, seed=1)
    reference.order.set_epoch(2)
    batches = [b.tolist() for b in reference]
    resumed = ResumableLoader(data, batch_size=4, seed=99)  # the seed comes back from the state
    resumed.load_state_dict({"epoch": 2, "batches": 3, "seed": 1})
    assert [b.tolist() for b in resumed] == batches[3:]
    at_end = ResumableLoader(data, batch_size=4, seed=1)
    at_end.load_state_dict({"epoch": 2, "batches": len(batches), "seed": 1})
    assert at_end.order.epoch == 3 and len(list(at_end)) == len(batches)


def test_a_resume_with_another_batch_size_or_world_continues_at_the_same_sample(capsys):
    """The position is kept in samples of all processes: after 3 batches of 4 on each of 2 processes, one process
    with batches of 3 continues at sample 24 of the epoch's order — nothing seen twice, nothing skipped — and says so."""
    data = list(range(60))
    whole = list(ResumableSampler(data, seed=1))  # one process's epoch 0
    two = [ResumableLoader(data, batch_size=4, seed=1, num_replicas=2, rank=r) for r in (0, 1)]
    seen = sorted(i for loader in two for b in itertools.islice(iter(loader), 3) for i in b.tolist())
    for loader in two:
        for _ in range(3):
            loader.took_batch(0)
    assert seen == sorted(whole[:24])
    resumed = ResumableLoader(data, batch_size=3, seed=99)
    resumed.load_state_dict(two[0].state_dict())
    assert [i for b in resumed for i in b.tolist()] == whole[24:]
    assert ("note: resuming with batch_size 3 on 1 process(es) where the run had 4 on 2: epoch 0 continues at its "
            "sample 24\n") == capsys.readouterr().err
    # two batches of 3 later, saved and resumed with batches of 4: the 24 before them stay counted
    for _ in range(2):
        resumed.took_batch(0)
    again = ResumableLoader(data, batch_size=4, seed=99)
    again.load_state_dict(resumed.state_dict())
    assert [i for b in again for i in b.tolist()] == whole[30:58]  # 7 whole batches of 4
    # another training set (a seq_len or corpus changed): the position means nothing there, and that is said
    ResumableLoader(list(range(50)), batch_size=4, seed=1).load_state_dict(again.state_dict())
    assert "note: resuming on a training set of 50 examples where the run had 60" in capsys.readouterr().err
    # 6 samples over 4 processes: each skips 1 of its share, and the 2 left over are said to be seen again
    four = ResumableLoader(data, batch_size=2, seed=1, num_replicas=4, rank=0)
    four.load_state_dict({"epoch": 0, "batches": 1, "seed": 1, "batch_size": 3, "num_replicas": 2})
    assert four.skipped == 1 and "sample 6 (2 seen again: 6 is not a multiple" in capsys.readouterr().err


def test_checkpoints_reload_through_the_cli_and_load_from_checkpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    main(["fit", *TEXT, "--trainer.max_steps", "4", "--trainer.val_check_interval", "2",
          "--trainer.limit_val_batches", "2", "--trainer.enable_progress_bar", "false", "--checkpoint.every_n_steps", "3"])
    checkpoints = tmp_path / "runs" / "quickstart" / "version_0" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best.ckpt", "last.ckpt"]
    assert checkpoint_step(checkpoints / "last.ckpt") == 4  # written at step 3 and again at the end

    model = LanguageModel.load_from_checkpoint(checkpoints / "last.ckpt")
    saved = torch.load(checkpoints / "last.ckpt", weights_only=True)["state_dict"]
    assert model.hparams.d_model == 32 and model.hparams.mixers["A"]["init_args"]["n_heads"] == 2
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, saved[name], rtol=0, atol=0)

    # The recipe says d_model 128; the checkpoint's own hyper-parameters win, so its weights fit.
    cli = main(["validate", "--config", "quickstart.yaml", "--ckpt_path", "last", "--trainer.limit_val_batches", "2",
                "--trainer.enable_progress_bar", "false"])
    assert cli.model.model.d_model == 32
    assert f"checkpoint: {Path('runs/quickstart/version_0/checkpoints/last.ckpt')}" in capsys.readouterr().out


def test_ckpt_path_last_without_a_checkpoint_is_a_named_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["fit", *TEXT, "--ckpt_path", "last"])
    assert "--ckpt_path last: no last.ckpt under runs/quickstart/*/checkpoints/" in str(info.value.code)
    with pytest.raises(SystemExit, match="no such checkpoint file"):
        main(["validate", *TEXT, "--ckpt_path", "missing.ckpt"])
    (tmp_path / "shards").mkdir()  # a folder is named as one, not as a file that is missing
    with pytest.raises(SystemExit, match="--ckpt_path shards is a folder, not a checkpoint file, nor a sharded"):
        main(["validate", *TEXT, "--ckpt_path", "shards"])


def test_divergence_stops_the_run_and_keeps_the_last_finite_checkpoint(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["fit", *TEXT, "--model.lr", "1e6", "--model.warmup_fraction", "0", "--trainer.max_steps", "30",
              "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
              "--checkpoint.every_n_steps", "1"])
    message = str(info.value.code)
    assert message.startswith("error: training diverged at step ") and "was not applied" in message
    step = int(message.split("step ")[1].split(":")[0])
    last = tmp_path / "runs" / "quickstart" / "version_0" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["global_step"] == step - 1
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values())
    assert f"last finite checkpoint: {Path('runs/quickstart/version_0/checkpoints/last.ckpt')} (step {step - 1})" in caplog.text


def test_fully_fp16_training_on_cpu_is_refused_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="error: precision='16-true' on CPU: .* overflows"):
        main(["fit", *TEXT, "--trainer.precision", "16-true", "--trainer.max_steps", "1"])


def test_a_checkpoint_write_that_fails_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"step": 1, "w": torch.ones(3)}, path)

    def crash(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left behind


def test_no_checkpoint_is_written_from_non_finite_weights(tmp_path):
    class Trainer:
        global_step, world_size = 7, 1

        def __init__(self, module):
            self.lightning_module = module

        def save_checkpoint(self, path, weights_only=False):
            raise AssertionError("must not be called")

    module = torch.nn.Linear(2, 2)
    with torch.no_grad():
        module.weight[0, 0] = float("nan")
    policy = CheckpointPolicy()
    policy.dirpath = tmp_path
    assert policy._save(Trainer(module), "last.ckpt") is None


def test_best_checkpoint_follows_the_minimum_of_the_validation_loss(tmp_path):
    from types import SimpleNamespace

    saved = []

    class Trainer:
        global_step, world_size, fast_dev_run, sanity_checking = 0, 1, False, False
        state = SimpleNamespace(fn="fit")
        lightning_module = torch.nn.Linear(2, 2)

        def __init__(self):
            self.callback_metrics = {}

        def save_checkpoint(self, path, weights_only=False):
            saved.append((self.global_step, Path(path).name))

    policy, trainer = CheckpointPolicy(), Trainer()
    policy.dirpath = tmp_path
    for step, loss in ((10, 3.0), (20, 2.0), (30, 2.5), (40, float("nan")), (50, 1.5), (60, 1.5)):
        trainer.global_step, trainer.callback_metrics = step, {"val/loss": torch.tensor(loss)}
        policy.on_validation_end(trainer, trainer.lightning_module)
    assert saved == [(10, "best.ckpt"), (20, "best.ckpt"), (50, "best.ckpt")]  # improvements only
    assert policy.best_score == 1.5 and policy.best_path == str(tmp_path / "best.ckpt")


def test_best_checkpoint_follows_the_maximum_of_an_accuracy_and_names_a_monitor_never_logged(tmp_path, caplog):
    """``--checkpoint.monitor val/acc`` kept the lowest accuracy (it minimised everything); a monitor that validation
    never logs wrote no best.ckpt without a word."""
    from types import SimpleNamespace

    saved = []

    class Trainer:
        global_step, world_size, fast_dev_run, sanity_checking, is_global_zero = 0, 1, False, False, True
        state = SimpleNamespace(fn="fit")
        lightning_module = torch.nn.Linear(2, 2)
        callback_metrics: dict = {}

        def save_checkpoint(self, path, weights_only=False):
            saved.append((self.global_step, Path(path).name))

    assert CheckpointPolicy(monitor="val/acc").mode == "max" and CheckpointPolicy().mode == "min"
    assert CheckpointPolicy(monitor="val/acc", mode="min").mode == "min"
    with pytest.raises(ValueError, match="mode='maximum' is not one of 'min', 'max'"):
        CheckpointPolicy(mode="maximum")
    policy, trainer = CheckpointPolicy(monitor="val/acc"), Trainer()
    policy.dirpath = tmp_path
    for step, acc in ((10, 0.2), (20, 0.5), (30, 0.4), (40, 0.6), (50, 0.6)):
        trainer.global_step, trainer.callback_metrics = step, {"val/acc": torch.tensor(acc), "val/loss": torch.tensor(1.0)}
        policy.on_validation_end(trainer, trainer.lightning_module)
    assert saved == [(10, "best.ckpt"), (20, "best.ckpt"), (40, "best.ckpt")] and policy.best_score == pytest.approx(0.6)
    saved.clear()
    policy = CheckpointPolicy(monitor="val/accuracy", mode="max")
    policy.dirpath = tmp_path
    with caplog.at_level("WARNING", logger="recipes.training"):
        for _ in range(2):
            policy.on_validation_end(trainer, trainer.lightning_module)
    warnings = [r.getMessage() for r in caplog.records if "not a validation metric" in r.getMessage()]
    assert warnings == ["CheckpointPolicy: monitor 'val/accuracy' is not a validation metric (logged: val/acc, "
                        "val/loss); no best.ckpt is written"] and saved == []  # once, naming what there is


KILL = ["--trainer.max_steps", "14", "--trainer.val_check_interval", "7", "--trainer.limit_val_batches", "2",
        "--trainer.log_every_n_steps", "1", "--trainer.enable_progress_bar", "false"]


@pytest.mark.parametrize("fault, every", [
    ("after_last_write@10", 5),  # last.ckpt of step 10 on disk, that step's metrics not yet logged
    ("validation@14", 7),  # during the validation that follows the step-14 checkpoint
    ("best_write@14", 7),  # while best.ckpt is written at the final validation
], ids=["after-checkpoint-before-log", "during-validation", "during-best-write"])
def test_a_run_killed_at_any_moment_ends_like_the_uninterrupted_one(tmp_path, fault, every):
    """Same logged steps, same validations, same best.ckpt, and no temporary file left, after kill -9 at
    the three moments where a checkpoint and what follows it used to part ways."""
    flags = [*TEXT, *KILL, "--checkpoint.every_n_steps", str(every)]
    fit_here(tmp_path, *flags, "--trainer.logger.init_args.version", "whole")
    cut = fit(tmp_path, *flags, "--trainer.logger.init_args.version", "cut", fault=fault)
    assert cut.returncode == -signal.SIGKILL, cut.stderr[-3000:]
    fit_here(tmp_path, *flags, "--trainer.logger.init_args.version", "cut", "--ckpt_path",
             str(tmp_path / "runs" / "quickstart" / "cut" / "checkpoints" / "last.ckpt"))
    runs = tmp_path / "runs" / "quickstart"
    for tag in ("train/loss", "val/loss", "train/lr"):
        whole, resumed = scalars(runs / "whole", tag), scalars(runs / "cut", tag)
        assert sorted(resumed) == sorted(whole), (tag, sorted(whole), sorted(resumed))
        assert max(abs(resumed[s] - whole[s]) for s in whole) <= 1e-6, tag
    best = {v: torch.load(runs / v / "checkpoints" / "best.ckpt", weights_only=True) for v in ("whole", "cut")}
    assert best["cut"]["global_step"] == best["whole"]["global_step"] == 14
    for name, tensor in best["whole"]["state_dict"].items():
        torch.testing.assert_close(best["cut"]["state_dict"][name], tensor, rtol=0, atol=1e-6)
    assert sorted(p.name for p in (runs / "cut" / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]


def test_orphaned_temporary_files_are_removed_and_live_ones_kept(tmp_path):
    from recipes.training import remove_orphans

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    (tmp_path / f".last.ckpt.tmp-{dead_pid}").write_bytes(b"partial")
    (tmp_path / f".best.ckpt.tmp-{os.getppid()}").write_bytes(b"someone else's, still writing")
    (tmp_path / f"cache.building-{dead_pid}").mkdir()
    assert remove_orphans(tmp_path, ".*.ckpt.tmp-*") == [tmp_path / f".last.ckpt.tmp-{dead_pid}"]
    assert remove_orphans(tmp_path, "*.building-*") == [tmp_path / f"cache.building-{dead_pid}"]
    assert [p.name for p in tmp_path.iterdir()] == [f".best.ckpt.tmp-{os.getppid()}"]


FSDP2 = ["--trainer.accelerator", "cpu", "--trainer.devices", "2",
         "--trainer.strategy", "lightning.pytorch.strategies.ModelParallelStrategy",
         "--trainer.strategy.init_args.data_parallel_size", "2", "--trainer.strategy.init_args.tensor_parallel_size", "1"]


def test_fsdp2_on_two_cpu_processes_matches_one_process_resumes_exactly_and_consolidates(tmp_path):
    """FSDP2 (fully_shard per block, gloo): the losses of one process on the combined batch; a run killed after
    writing its step-4 checkpoint resumes from its folder of shards to the same losses; the folder becomes one file that
    loads with the weights of the single-process run, and exports to Hugging Face."""
    from recipes.checkpoints import CheckpointError, consolidated_from, is_sharded_checkpoint
    from recipes.consolidate import main as consolidate

    common = [*TEXT, "--trainer.max_steps", "8", "--trainer.limit_val_batches", "0", "--trainer.log_every_n_steps",
              "1", "--trainer.enable_progress_bar", "false"]
    half = [*common[:common.index("--data.init_args.batch_size")], "--data.init_args.batch_size", "4",
            *common[common.index("--data.init_args.batch_size") + 2:]]
    cut = fit(tmp_path, *half, *FSDP2, "--checkpoint.every_n_steps", "4", "--trainer.logger.init_args.version", "fsdp",
              fault="after_last_write@4")  # both processes killed (-9) once step 4's shards are written
    assert cut.returncode == -signal.SIGKILL, cut.stderr[-3000:]
    shards = tmp_path / "runs" / "quickstart" / "fsdp" / "checkpoints" / "last.ckpt"
    assert is_sharded_checkpoint(shards) and len(list(shards.glob("*.distcp"))) == 2
    done = fit(tmp_path, *half, *FSDP2, "--ckpt_path", str(shards.relative_to(tmp_path)))
    assert done.returncode == 0, done.stderr[-3000:]
    fit_here(tmp_path, *common, "--trainer.logger.init_args.version", "one")
    got, expected = (scalars(tmp_path / "runs" / "quickstart" / v, "train/loss") for v in ("fsdp", "one"))
    assert sorted(got) == sorted(expected) == list(range(8))
    assert max(abs(got[s] - expected[s]) / expected[s] for s in expected) <= 1e-5

    with pytest.raises(CheckpointError, match="recipes.consolidate"):
        LanguageModel.load_from_checkpoint(shards)
    consolidate([str(shards)])
    sharded = LanguageModel.load_from_checkpoint(shards.with_name("last.ckpt.consolidated"))
    single = LanguageModel.load_from_checkpoint(tmp_path / "runs" / "quickstart" / "one" / "checkpoints" / "last.ckpt")
    for (name, a), (_, b) in zip(sharded.state_dict().items(), single.state_dict().items()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)
    from recipes.hf import export

    assert (export(shards.with_name("last.ckpt.consolidated"), tmp_path / "hf") / "model.safetensors").is_file()

    consolidate([str(shards)])  # again, as after training on: the folder's own consolidation is replaced
    other = tmp_path / "runs" / "quickstart" / "one" / "checkpoints" / "last.ckpt"  # another run's checkpoint
    with pytest.raises(SystemExit, match=r"last.ckpt already exists: choose another --out, or --force to replace it "
                                         r"\(it is not a consolidation of this folder\)"):
        consolidate([str(shards), "--out", str(other)])
    with pytest.raises(SystemExit, match="hf is a folder: name the file to write"):
        consolidate([str(shards), "--out", str(tmp_path / "hf")])
    consolidate([str(shards), "--out", str(other), "--force"])
    assert consolidated_from(other) == shards.resolve()


@pytest.mark.parametrize("max_epochs, description", [(-1, "Epoch 3"), (5, "Epoch 3/4")])
def test_the_progress_bar_names_no_negative_epoch_total_when_steps_end_training(max_epochs, description):
    bar = StepProgressBar()
    bar._trainer = SimpleNamespace(max_epochs=max_epochs)  # (only what the description reads)
    assert bar._get_train_description(3).strip() == description


def test_the_progress_bar_shows_the_runs_version_as_a_number_not_a_float():
    from lightning.pytorch.callbacks.progress.rich_progress import MetricsTextColumn

    for version, shown in ((3, "3"), ("sweep_x", "ep_x")):  # (Lightning shows a name's last four characters)
        trainer = SimpleNamespace(loggers=[SimpleNamespace(version=version)], progress_bar_metrics={"train/loss": 1.5})
        metrics = StepProgressBar().get_metrics(trainer, None)
        assert metrics == {"v_num": shown, "train/loss": 1.5}
        column = MetricsTextColumn(trainer, style="", text_delimiter=" ", metrics_format=".3f")
        column._metrics = metrics
        assert list(column._generate_metrics_texts()) == [f"v_num: {shown}", "train/loss: 1.500"]


def test_a_run_gets_the_step_progress_bar_unless_it_names_one_or_turns_the_bar_off(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert isinstance(main(["--config", "quickstart.yaml"], run=False).trainer.progress_bar_callback, StepProgressBar)
    assert isinstance(default_progress_bar([], None), StepProgressBar)
    assert isinstance(default_progress_bar([CheckpointPolicy()], True), StepProgressBar)
    assert default_progress_bar([], False) is None
    assert default_progress_bar([TQDMProgressBar()], None) is None


def test_with_gradient_accumulation_a_step_logs_its_whole_batchs_loss_and_speed(tmp_path, monkeypatch, capsys):
    """Three micro-batches a step: ``train/loss`` is their mean (Lightning logs a step's last value, which was the
    last micro-batch's alone), tokens/s is measured over whole steps (it was over single micro-batches), and the
    validation interval, which Lightning counts in batches, is said in steps."""
    monkeypatch.chdir(tmp_path)
    clock = itertools.count()  # one "second" per reading: tokens/s is then tokens per window
    monkeypatch.setattr("recipes.module.time.perf_counter", lambda: float(next(clock)))
    cli = main([*TEXT, "--trainer.max_steps", "4", "--trainer.accumulate_grad_batches", "3",
                "--trainer.log_every_n_steps", "1", "--trainer.enable_progress_bar", "false",
                "--trainer.limit_val_batches", "0", "--trainer.logger.init_args.version", "acc"], run=False)

    class MicroBatchLosses(L.Callback):
        """Each micro-batch's loss under the weights its training step sees (no update within a step)."""
        losses: dict[int, list[float]] = {}

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            with torch.no_grad():
                self.losses.setdefault(trainer.global_step, []).append(float(pl_module.training_loss(batch)))

    probe = MicroBatchLosses()
    cli.trainer.callbacks.append(probe)
    cli.trainer.fit(cli.model, cli.datamodule)

    logged = scalars(tmp_path / "runs" / "quickstart" / "acc", "train/loss")
    assert sorted(logged) == [0, 1, 2, 3] and all(len(probe.losses[s]) == 3 for s in logged)
    for step, value in logged.items():
        micro = probe.losses[step]
        assert value == pytest.approx(sum(micro) / 3, abs=1e-5)
        assert abs(value - micro[-1]) > 1e-4  # the mean, not the last micro-batch's loss
    tokens_per_step = 3 * 8 * 32  # micro-batches × batch_size × seq_len
    assert cli.model.history["tokens_per_sec"] == [tokens_per_step] * 3  # steps 1-3, each over the step before
    # Lightning's val_check_interval counts batches (the recipe's 200: every 66.7 steps here), said at the start
    assert ("note: val_check_interval=200 counts batches, not optimizer steps: with accumulate_grad_batches=3 "
            "validation runs every 66.6667 steps; --trainer.val_check_interval 600 validates every 200 steps"
            ) in capsys.readouterr().err


def test_a_run_resumed_for_more_steps_says_its_learning_rate_schedule_is_re_planned(tmp_path, capsys):
    """The cosine is planned over max_steps: resuming with more re-plans it and the rate jumps back up (silently,
    before). The note's two rates are the ones the run logs on either side of the jump, and the resumed steps are
    logged at their own step numbers."""
    quiet = ["--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "2", "--trainer.log_every_n_steps",
             "1", "--trainer.val_check_interval", "3"]  # (a validation at the last step: Lightning's off-by-one below)
    fit_here(tmp_path, *TEXT, *quiet, "--trainer.max_steps", "6")
    fit_here(tmp_path, *TEXT, *quiet, "--trainer.max_steps", "6", "--ckpt_path", "last")  # nothing changed: no note
    assert "note: this run's learning-rate schedule" not in capsys.readouterr().err
    fit_here(tmp_path, *TEXT, *quiet, "--trainer.max_steps", "12", "--ckpt_path", "last")
    note = capsys.readouterr().err
    assert "spanned 6 steps; resumed for 12, it is re-planned over 12: the rate jumps from" in note
    before, after = (float(x) for x in note.split("jumps from ")[1].split(" after")[0].split(" to "))
    rates = scalars(tmp_path / "runs" / "quickstart" / "version_0", "train/lr")
    assert sorted(rates) == list(range(12))  # Lightning's restart had logged steps 6-11 at 7-12, skipping 6
    logged = [rate for _, rate in sorted(rates.items())]
    jump = max(range(1, len(logged)), key=lambda i: logged[i] - logged[i - 1])  # (a 6-step run has no warm-up)
    assert (before, after) == (float(f"{logged[jump - 1]:.3g}"), float(f"{logged[jump]:.3g}")) and after > 2 * before


def test_weight_averaging_leaves_the_trained_weights_to_resume_from_and_a_resume_without_it_is_refused(tmp_path, capsys):
    """Lightning's EMAWeightAveraging validates and saves its average as a checkpoint's weights and keeps the trained
    ones beside them (``current_model_state``) to resume from. At the end of training it copies the average over the
    trained weights, before the checkpoint policy wrote its final last.ckpt (Lightning calls a checkpoint callback
    last): a run resumed to train longer went on from the average. Resuming without the callback took the average
    for the trained weights, silently."""
    quiet = ["--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "2", "--trainer.max_steps", "5",
             "--trainer.val_check_interval", "5"]  # (no last.ckpt written before the end: every_n_steps is 100)
    ema = ["--trainer.callbacks+=EMAWeightAveraging", "--trainer.callbacks.decay", "0.5"]
    fit_here(tmp_path, *TEXT, *quiet, *ema, "--trainer.logger.init_args.version", "ema")
    assert "weights    EMAWeightAveraging's average: validated above and saved as each checkpoint's weights" in \
        capsys.readouterr().out
    events = EventAccumulator(str(tmp_path / "runs" / "quickstart" / "ema"), size_guidance={"tensors": 0})
    events.Reload()  # TensorBoard's HPARAMS tab tells the run from one that validated its trained weights
    assert "EMAWeightAveraging" in events.PluginTagToContent("hparams")["_hparams_/session_start_info"].decode("latin1")
    fit_here(tmp_path, *TEXT, *quiet, "--trainer.logger.init_args.version", "plain")
    averaged, plain = (torch.load(tmp_path / "runs" / "quickstart" / v / "checkpoints" / "last.ckpt", weights_only=True)
                       for v in ("ema", "plain"))
    assert averaged["global_step"] == plain["global_step"] == 5
    for name, trained in plain["state_dict"].items():  # the average changes nothing of the training itself
        assert torch.equal(averaged["current_model_state"][name], trained), name
    assert not torch.equal(averaged["state_dict"]["model.embedding.weight"], plain["state_dict"]["model.embedding.weight"])

    last = str(tmp_path / "runs" / "quickstart" / "ema" / "checkpoints" / "last.ckpt")
    with pytest.raises(SystemExit, match=r"written by a run with EMAWeightAveraging: its weights are that callback's "
                                         r"average.*--trainer.callbacks\+=EMAWeightAveraging"):
        fit_here(tmp_path, *TEXT, *quiet, "--trainer.max_steps", "7", "--ckpt_path", last)
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch:  # validate scores the average, and says so (not so a trained one)
        patch.chdir(tmp_path)
        main(["validate", *TEXT, "--trainer.limit_val_batches", "2", "--ckpt_path", last])
        assert f"note: {last} holds its run's EMAWeightAveraging average as its weights" in capsys.readouterr().err
        main(["validate", *TEXT, "--trainer.limit_val_batches", "2", "--ckpt_path", last.replace("ema", "plain")])
        assert "average as its weights" not in capsys.readouterr().err
        from recipes.evaluation.cli import main as evaluate

        suite = ["--config", "quickstart.yaml", "--suite", "length", "--multiples", "1", "--windows", "1"]
        assert evaluate([*suite, "--ckpt_path", last])["weights"] == "EMAWeightAveraging average"  # in its JSON too
        assert "average as its weights" in capsys.readouterr().err
        assert "weights" not in evaluate([*suite, "--ckpt_path", last.replace("ema", "plain")])


def test_stochastic_weight_averaging_leaves_last_ckpt_the_trained_weights_and_writes_its_average_to_swa_ckpt(
        tmp_path, capsys):
    """StochasticWeightAveraging copies its average over the trained weights at the end of training (a step-limited
    run); the final last.ckpt, written after, held the average as the weights to resume from. The average, kept
    nowhere else but in the callback's state, is written to swa.ckpt: weights alone, marked, scored by validate and
    eval with a note, refused as a resume, taken by --model.init_from."""
    fit_here(tmp_path, *TEXT, "--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "2",
             "--trainer.max_steps", "6", "--trainer.limit_train_batches", "2", "--trainer.val_check_interval", "2",
             "--trainer.callbacks+=StochasticWeightAveraging", "--trainer.callbacks.swa_lrs", "0.001",
             "--trainer.callbacks.swa_epoch_start", "1")
    out = capsys.readouterr().out
    assert "StochasticWeightAveraging's average, put in at the end: no validation above saw it; swa.ckpt holds" in out
    folder = tmp_path / "runs" / "quickstart" / "version_0" / "checkpoints"
    assert "checkpoints runs/quickstart/version_0/checkpoints/ (last.ckpt, best.ckpt, swa.ckpt)" in out
    last = torch.load(folder / "last.ckpt", weights_only=True)
    (state,) = [s for key, s in last["callbacks"].items() if key.startswith("StochasticWeightAveraging")]
    assert state["n_averaged"] >= 2
    name = "model.embedding.weight"
    assert not torch.equal(last["state_dict"][name], state["average_model_state"][name])
    swa = torch.load(folder / "swa.ckpt", weights_only=True)
    assert swa["weights_average"] == "StochasticWeightAveraging"
    assert swa["state_dict"].keys() == last["state_dict"].keys() and swa["global_step"] == 6
    assert all(torch.equal(swa["state_dict"][k], v) for k, v in state["average_model_state"].items())
    assert set(swa) == set(last) - {"callbacks", "optimizer_states", "lr_schedulers"} | {"weights_average"}
    assert swa["code"] == last["code"] == json.loads((tmp_path / "runs/quickstart/version_0/code.json").read_text())

    average = str(folder / "swa.ckpt")
    with pytest.raises(SystemExit, match=r"holds StochasticWeightAveraging's average alone, written at the end of its "
                                         r"run, without the optimizer's state: resume from last.ckpt beside it"):
        fit_here(tmp_path, *TEXT, "--trainer.max_steps", "8", "--ckpt_path", "swa")  # (the newest swa.ckpt)
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        main(["validate", *TEXT, "--trainer.limit_val_batches", "2", "--ckpt_path", "swa"])
        assert ("note: runs/quickstart/version_0/checkpoints/swa.ckpt holds its run's StochasticWeightAveraging "
                "average, put in at the end of training (no validation of the run scored it)") in capsys.readouterr().err
        from recipes.evaluation.cli import main as evaluate

        suite = ["--config", "quickstart.yaml", "--suite", "length", "--multiples", "1", "--windows", "1"]
        scored = evaluate([*suite, "--ckpt_path", "swa"])
        assert scored["weights"] == "StochasticWeightAveraging average" and scored["checkpoint"].endswith("swa.ckpt")
    fit_here(tmp_path, *TEXT, "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0",
             "--trainer.enable_progress_bar", "false", "--model.lr", "1e-9", "--model.init_from", average)
    started = torch.load(tmp_path / "runs" / "quickstart" / "version_1" / "checkpoints" / "last.ckpt",
                         weights_only=True)
    out = capsys.readouterr().out  # no averaging: no swa.ckpt
    assert "checkpoints runs/quickstart/version_1/checkpoints/ (last.ckpt)\n" in out
    assert not (folder.parent.parent / "version_1" / "checkpoints" / "swa.ckpt").exists()
    distance = lambda a, b: sum(float((a[k] - b[k]).abs().sum()) for k in a)  # noqa: E731
    assert distance(started["state_dict"], swa["state_dict"]) < distance(started["state_dict"], last["state_dict"]) / 100

    fit_here(tmp_path, *TEXT, "--trainer.enable_progress_bar", "false", "--trainer.limit_val_batches", "0",
             "--trainer.max_steps", "2", "--trainer.callbacks+=StochasticWeightAveraging", "--trainer.callbacks.swa_lrs",
             "0.001", "--trainer.callbacks.swa_epoch_start", "5")  # stopped before averaging began: no average to write
    assert "swa.ckpt" not in capsys.readouterr().out
    assert not (folder.parent.parent / "version_2" / "checkpoints" / "swa.ckpt").exists()


def test_weight_averaging_under_a_sharding_strategy_is_refused_before_any_process_starts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="EMAWeightAveraging keeps a whole copy of the model, made by copying the "
                                         "module, and FSDP cannot copy the module ModelParallelStrategy shards"):
        main(["fit", *TEXT, *FSDP2, "--trainer.callbacks+=EMAWeightAveraging"])
    with pytest.raises(SystemExit, match="StochasticWeightAveraging averages into a whole copy of the model, which the "
                                         "parameters ModelParallelStrategy shards cannot be averaged into"):
        main(["fit", *TEXT, *FSDP2, "--trainer.callbacks+=StochasticWeightAveraging", "--trainer.callbacks.swa_lrs",
              "0.001"])
    assert not (tmp_path / "runs").exists()


def test_a_command_releases_the_process_group_it_made(tmp_path):
    """The end of ``python -m recipes …`` destroys a DDP/FSDP rank's process group rather than leaving it to the
    interpreter's exit (where a finished FSDP run once aborted with exit -6); without one, nothing happens."""
    import torch.distributed as dist

    from recipes.cli import release_process_group

    release_process_group()  # none made: a no-op
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert dist.is_initialized()
        release_process_group()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_ddp_spawn_worker_releases_its_process_group_at_its_exit(tmp_path, monkeypatch):
    """A ``ddp_spawn`` worker never returns to the command's end: the model's setup, which runs in every rank,
    registers the release for the worker's exit (once a finished worker aborted in the interpreter's teardown, exit
    -6, failing a full test run); a process without a group registers nothing."""
    import atexit

    import torch.distributed as dist

    from recipes.cli import main
    from recipes.training import release_process_group

    registered = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.chdir(tmp_path)
    cli = main(["--config", "quickstart.yaml"], run=False)
    cli.model.trainer = cli.trainer
    cli.model.setup("validate")
    assert registered == []
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        cli.model.setup("validate")
        assert registered == [release_process_group]
    finally:
        atexit.unregister(release_process_group)
        release_process_group()


# ---- the checkpoint policy's decisions between two steps, with a stand-in trainer --------------------------------

class StepTrainer:
    """Only what :class:`CheckpointPolicy` reads between two steps. The other process (``world_size`` 2) answers a
    collective yes/no (``reduce_boolean_decision``): ``stop_elsewhere`` whether it got a signal (any process's yes
    stops all), ``finite_elsewhere`` whether its weights are finite (every process's yes is needed to write)."""

    def __init__(self, world_size: int = 1, stop_elsewhere: bool = False, finite_elsewhere: bool = True,
                 is_global_zero: bool = True):
        self.global_step, self.world_size, self.accumulate_grad_batches = 3, world_size, 1
        self.fast_dev_run = self.sanity_checking = False
        self.is_global_zero, self.callbacks, self.loggers, self._logger_connector = is_global_zero, [], [], None
        self.lightning_module = torch.nn.Linear(2, 2)
        self.saved: list[str] = []
        self.strategy = SimpleNamespace(reduce_boolean_decision=lambda mine, all: (
            mine and finite_elsewhere) if all else (mine or stop_elsewhere))
        epoch_loop = SimpleNamespace(_should_check_val_fx=lambda fetcher: False, _batches_that_stepped=3)
        self.fit_loop = SimpleNamespace(epoch_loop=epoch_loop, _data_fetcher=None)

    def save_checkpoint(self, path, weights_only=False):
        self.saved.append(Path(path).name)


def test_checkpoint_every_n_steps_is_a_whole_number_of_steps():
    for value in (-1, 2.5, "3", None):
        with pytest.raises(ValueError, match=rf"CheckpointPolicy: every_n_steps={value!r} must be an integer >= 0"):
            CheckpointPolicy(every_n_steps=value)
    assert CheckpointPolicy(every_n_steps=0).every_n_steps == 0


def test_a_signal_stops_the_run_after_its_step_with_last_ckpt_and_a_second_ctrl_c_stops_at_once(tmp_path, monkeypatch,
                                                                                                   caplog):
    from recipes.training import TrainingInterrupted

    policy, trainer = CheckpointPolicy(every_n_steps=0), StepTrainer()
    policy.dirpath = tmp_path
    writes = []
    monkeypatch.setattr(policy, "_save_last", lambda trainer, before_log=False: writes.append(before_log))
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    policy.on_train_start(trainer, None)
    try:
        assert signal.getsignal(signal.SIGINT) == policy._on_signal == signal.getsignal(signal.SIGTERM)
        policy.on_train_batch_end(trainer, None, None, None, 0)
        policy.on_train_batch_start(trainer, None, None, 1)  # no signal, nothing due: on it goes
        assert writes == []
        with caplog.at_level("WARNING", logger="recipes.training"):
            policy._on_signal(signal.SIGINT, None)  # the first Ctrl+C: finish the step
        assert "SIGINT received: stopping after this step and writing last.ckpt" in caplog.text
        policy.on_train_batch_end(trainer, None, None, None, 1)
        assert writes == [True]  # last.ckpt, before Lightning logs the step (its metrics travel with it)
        policy.on_train_batch_end(trainer, None, None, None, 2)
        assert writes == [True]  # once
        policy.last_path = "runs/x/version_0/checkpoints/last.ckpt"
        with pytest.raises(TrainingInterrupted, match="SIGINT received: stopped after step 3; last checkpoint: "
                                                      "runs/x/version_0/checkpoints/last.ckpt") as stopped:
            policy.on_train_batch_start(trainer, None, None, 2)
        assert (stopped.value.signum, stopped.value.step) == (signal.SIGINT, 3)
        with pytest.raises(KeyboardInterrupt):
            policy._on_signal(signal.SIGINT, None)  # the second: now, without writing
    finally:
        policy.teardown(trainer, None, "fit")
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before

    policy = CheckpointPolicy()
    policy._on_signal(signal.SIGTERM, None)
    policy._on_signal(signal.SIGTERM, None)  # a second SIGTERM changes nothing
    assert policy._signal == signal.SIGTERM
    with pytest.raises(KeyboardInterrupt):
        policy._on_signal(signal.SIGINT, None)  # Ctrl+C after a SIGTERM stops at once
    policy = CheckpointPolicy()
    policy._stop_pending = True  # a stop without a signal of its own is a SIGTERM's
    with pytest.raises(TrainingInterrupted, match="SIGTERM received: stopped after step 3$"):
        policy.on_train_batch_start(trainer, None, None, 0)


def test_each_process_takes_the_same_stop_and_save_decisions(tmp_path):
    """Saving is collective: a process with no signal of its own stops with one that got it, and no process writes
    when another's shard of the weights is not finite. Lightning's own SIGTERM handler (which tells the other DDP
    processes) still runs where there are others."""
    called = []
    policy = CheckpointPolicy(every_n_steps=0)
    policy._previous_handlers = {s: lambda signum, frame: called.append(signum) for s in (signal.SIGINT, signal.SIGTERM)}
    policy._on_signal(signal.SIGTERM, None)
    policy._world_size = 2
    policy._on_signal(signal.SIGTERM, None)
    policy._signal = None
    policy._on_signal(signal.SIGINT, None)
    assert called == [signal.SIGTERM]  # a SIGTERM, among several processes

    for elsewhere, mine, stops in ((True, None, True), (False, signal.SIGINT, True), (False, None, False)):
        policy, trainer = CheckpointPolicy(every_n_steps=0), StepTrainer(world_size=2, stop_elsewhere=elsewhere)
        policy.dirpath, policy._signal = tmp_path, mine
        policy.on_train_batch_end(trainer, None, None, None, 0)
        assert (trainer.saved == ["last.ckpt"]) is stops and policy._stop_pending is stops
    for finite, written in ((False, None), (True, str(tmp_path / "last.ckpt"))):
        policy, trainer = CheckpointPolicy(), StepTrainer(world_size=2, finite_elsewhere=finite)
        policy.dirpath = tmp_path
        assert policy._save(trainer, "last.ckpt") == written and trainer.saved == ([] if written is None else
                                                                                    ["last.ckpt"])


def test_lightnings_sigterm_stop_writes_last_ckpt_and_the_first_process_says_where(tmp_path, caplog):
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    for is_global_zero in (True, False):
        caplog.clear()
        policy, trainer = CheckpointPolicy(), StepTrainer(is_global_zero=is_global_zero)
        policy.dirpath = tmp_path
        with caplog.at_level("WARNING", logger="recipes.training"):
            policy.on_exception(trainer, None, SIGTERMException())
        assert trainer.saved == ["last.ckpt"] and policy.last_step == 3
        said = f"wrote {tmp_path / 'last.ckpt'} (step 3); resume with --ckpt_path last"
        assert (said in caplog.text) is is_global_zero
    policy, trainer = CheckpointPolicy(), StepTrainer()
    policy.on_exception(trainer, None, SIGTERMException())  # nowhere to write (no fit set it up): nothing said
    assert trainer.saved == [] and "wrote" not in caplog.text


def test_a_remote_checkpoint_is_read_as_data_only(tmp_path):
    import argparse

    import fsspec

    with fsspec.open("memory://zoo/last.ckpt", "wb") as f:
        torch.save({"global_step": 3, "state_dict": {"w": torch.ones(2)}}, f)
    loaded = AtomicCheckpointIO().load_checkpoint("memory://zoo/last.ckpt")
    assert loaded["global_step"] == 3 and torch.equal(loaded["state_dict"]["w"], torch.ones(2))
    with fsspec.open("memory://zoo/pickled.ckpt", "wb") as f:
        torch.save({"global_step": 3, "args": argparse.Namespace(lr=1.0)}, f)
    with pytest.raises(Exception, match="Weights only load failed"):
        AtomicCheckpointIO().load_checkpoint("memory://zoo/pickled.ckpt", weights_only=False)


def test_a_process_of_another_user_counts_as_running(monkeypatch):
    """Its temporary files are not orphans: ``os.kill(pid, 0)`` refuses with PermissionError when the process runs
    under another user, and only a ProcessLookupError means it is gone."""
    from recipes.training import process_alive

    def kill(pid, sig):
        raise {1: PermissionError, 2: ProcessLookupError}[pid]()

    monkeypatch.setattr(os, "kill", kill)
    assert process_alive(1) and not process_alive(2)


# ---- the module's helpers, one at a time -------------------------------------------------------------------------

def test_a_divergence_names_its_step_loss_and_gradient_norm_when_there_is_one():
    from recipes.training import DivergenceError

    assert str(DivergenceError(7, float("nan"), 3.5)).startswith("training diverged at step 7: loss nan, gradient "
                                                                 "norm 3.5. This step's update was not applied")
    assert str(DivergenceError(7, float("inf"), None)).startswith("training diverged at step 7: loss inf. This")


def test_a_step_ends_on_its_last_micro_batch_and_the_final_step_is_validated():
    from recipes.training import ValidateFinalStep, step_ended

    assert [step_ended(SimpleNamespace(accumulate_grad_batches=3), i) for i in range(6)] == [False, False, True] * 2
    assert all(step_ended(SimpleNamespace(accumulate_grad_batches=1), i) for i in range(3))
    for max_steps, global_step, batch_idx, stops in ((5, 5, 1, True), (5, 6, 1, True), (5, 4, 1, False),
                                                     (5, 5, 0, False), (-1, 9, 1, False), (0, 0, 1, False),
                                                     (None, 9, 1, False)):
        trainer = SimpleNamespace(max_steps=max_steps, global_step=global_step, accumulate_grad_batches=2,
                                  should_stop=False)
        ValidateFinalStep().on_train_batch_end(trainer, None, None, None, batch_idx)
        assert trainer.should_stop is stops, (max_steps, global_step, batch_idx)


def test_a_fault_point_kills_the_process_only_at_its_named_point_and_step(monkeypatch):
    from recipes import training

    killed = []
    monkeypatch.setattr(training.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    monkeypatch.setenv(training.FAULT, "validation@3")
    for point, step in (("validation", 2), ("best_write", 3), ("validation", 3)):
        training.fault_point(point, step)
    assert killed == [(os.getpid(), signal.SIGKILL)]
    monkeypatch.delenv(training.FAULT)
    training.fault_point("validation", 3)
    assert len(killed) == 1


def test_a_checkpoint_write_makes_its_folders_and_only_best_ckpt_passes_the_best_write_fault_point(tmp_path,
                                                                                                  monkeypatch):
    from recipes import training

    points, fired = [], {}
    monkeypatch.setattr(training, "fault_point", lambda point, step: points.append((point, step)))
    for name in ("last.ckpt", "best.ckpt"):
        AtomicCheckpointIO().save_checkpoint({"global_step": 4}, tmp_path / "a" / "b" / name)
        assert torch.load(tmp_path / "a" / "b" / name)["global_step"] == 4
        fired[name], points = points, []
    assert fired == {"last.ckpt": [], "best.ckpt": [("best_write", 4)]}
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["best.ckpt", "last.ckpt"]  # (no temporary file)


def test_a_run_that_fails_before_its_first_step_removes_only_its_own_empty_folder(tmp_path, caplog):
    from recipes.training import RunConfigCallback

    def failed(fn="fit", global_step=0, is_global_zero=True, loggers=("tb",), events=True):
        folder = tmp_path / f"v{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        if events:
            (folder / f"events.out.tfevents.1.host.{os.getpid()}.0").write_bytes(b"")
        trainer = SimpleNamespace(is_global_zero=is_global_zero, loggers=list(loggers), global_step=global_step,
                                  state=SimpleNamespace(fn=fn), log_dir=str(folder))
        with caplog.at_level("WARNING", logger="recipes.training"):
            RunConfigCallback.on_exception(None, trainer, None, RuntimeError("no data"))
        return folder.exists()

    assert not failed() and "the run failed before its first step and it held nothing else" in caplog.text
    assert not failed(fn="validate", global_step=5)  # (a validation writes no step of its own)
    assert failed(global_step=5) and failed(is_global_zero=False) and failed(loggers=())
    assert failed(events=False)  # not this process's run


def test_only_a_folder_of_this_processs_own_start_files_counts_as_written_by_it(tmp_path):
    from recipes.training import written_by_this_process_only

    def folder(*names):
        path = tmp_path / str(len(list(tmp_path.iterdir())))
        path.mkdir()
        for name in names:
            (path / name).mkdir() if name.endswith("/") else (path / name).write_text("")
        return written_by_this_process_only(path)

    ours = f"events.out.tfevents.1.host.{os.getpid()}.0"
    assert folder(ours) and folder(ours, "hparams.yaml", "config.yaml")
    assert not folder("hparams.yaml", "config.yaml")  # none of its events: someone else's (a resumed run's) folder
    assert not folder(ours, f"events.out.tfevents.1.host.{os.getpid() + 1}.0")
    assert not folder(ours, "checkpoints/", "checkpoints/last.ckpt") and not folder(ours, "last.ckpt")
    assert not folder(ours, "hparams.yaml/")
    assert folder(ours, "checkpoints/", "checkpoints/.fit.lock")  # the fit's own lock, which it held while it ran


def test_a_new_fit_never_writes_over_another_runs_checkpoints(tmp_path, monkeypatch):
    """A run's checkpoints are replaced only by a fit that resumes from one of them (``--ckpt_path``, absolute or
    relative, a sharded folder too); any other fit into that folder is refused, with advice for the run's case."""
    from recipes.training import checkpoints_problem

    folder = tmp_path / "checkpoints"
    assert checkpoints_problem(folder, None) is None  # no folder yet
    folder.mkdir()
    (folder / "other.ckpt").write_text("")  # a file of the user's: this run writes no such name
    assert checkpoints_problem(folder, None) is None
    (folder / "swa.ckpt").write_text("")
    assert checkpoints_problem(folder, None, logged=False) == (
        f"{folder} holds swa.ckpt of an earlier run, whose files this run would overwrite; give this one another folder: "
        "--trainer.default_root_dir FOLDER, or let the run log (drop --trainer.logger false)")  # (no last.ckpt to resume)
    (folder / "last.ckpt").mkdir()  # a sharded checkpoint is a folder
    (folder / "best.ckpt").write_text("")
    assert checkpoints_problem(folder, None).endswith(f"--ckpt_path {folder / 'last.ckpt'}, or give this one another "
                                                      "folder: a logger version of its own")
    assert "holds last.ckpt, best.ckpt, swa.ckpt of an earlier run" in checkpoints_problem(folder, None)
    elsewhere = tmp_path / "runs" / "version_0" / "checkpoints" / "last.ckpt"
    assert checkpoints_problem(folder, str(elsewhere)) is not None  # resumes another run: this one's would be lost
    assert checkpoints_problem(folder, folder / "last.ckpt") is None
    monkeypatch.chdir(tmp_path)
    assert checkpoints_problem(folder, "checkpoints/best.ckpt") is None


def test_the_run_writes_its_config_over_an_earlier_runs_only(tmp_path):
    from recipes.training import RUN_CONFIG_HEADER, _resolved, own_file_problem

    path = tmp_path / "config.yaml"
    assert own_file_problem(path, []) is None  # nothing there yet
    path.write_text(f"{RUN_CONFIG_HEADER}2.6.0\nmodel: {{}}\n")
    assert own_file_problem(path, [tmp_path / "recipe.yaml"]) is None  # an earlier run's
    problem = own_file_problem(path, [tmp_path / "recipe.yaml", str(path)])
    assert problem.startswith(f"{path} is this run's --config file; the run saves its resolved configuration in its "
                              f"folder ({tmp_path}: the working folder")
    path.write_text("# my recipe\nmodel: {}\n")
    assert own_file_problem(path, []).startswith(f"{path} is not a configuration a run wrote;")

    class Given:  # how jsonargparse keeps a --config: its absolute path, as an attribute or a method
        def __init__(self, absolute):
            self.absolute = absolute

    assert _resolved(Given(str(path))) == _resolved(Given(lambda: str(path))) == _resolved(str(path)) == path.resolve()


def test_what_lightning_logs_after_the_step_travels_with_a_checkpoint_written_before_it():
    from recipes.training import pending_step_log, validation_follows

    def trainer(update=True, fast_dev_run=False, loggers=("tb",)):
        loop = SimpleNamespace(_batches_that_stepped=12, _should_check_val_fx=lambda fetcher: fetcher == "fetcher")
        return SimpleNamespace(
            loggers=list(loggers), fast_dev_run=fast_dev_run, current_epoch=2,
            _logger_connector=SimpleNamespace(should_update_logs=update, metrics={"log": {"loss": torch.tensor(2.5)}}),
            fit_loop=SimpleNamespace(epoch_loop=loop, _data_fetcher="fetcher"))

    assert pending_step_log(trainer()) == {"step": 12, "metrics": {"loss": 2.5, "epoch": 2}}
    assert pending_step_log(trainer(update=False, fast_dev_run=True))["step"] == 12
    assert pending_step_log(trainer(update=False)) is None and pending_step_log(trainer(loggers=())) is None
    assert validation_follows(trainer()) is True
    no_validation = trainer()
    no_validation.fit_loop._data_fetcher = None
    assert validation_follows(no_validation) is False


def test_only_floating_point_tensors_are_checked_for_finite_values():
    from recipes.training import parameters_finite, tensors_finite

    assert tensors_finite([torch.ones(2), torch.tensor([1, 2]), "nan", None])
    assert not tensors_finite([torch.ones(2), torch.tensor([1.0, float("inf")])])
    assert not tensors_finite([torch.tensor(float("nan"), dtype=torch.bfloat16)])
    module = torch.nn.Linear(2, 2)
    assert parameters_finite(module)
    with torch.no_grad():
        module.bias[1] = float("-inf")
    assert not parameters_finite(module)


def test_a_checkpoint_says_whose_average_its_weights_are_and_a_resume_needs_the_same_callback():
    from lightning.pytorch.callbacks import StochasticWeightAveraging

    from recipes.training import (AVERAGE_ONLY, averaged_weights, averaged_weights_note, check_averaging_resumed,
                                  check_averaging_unsharded, stochastic_average_taken, weight_averaging)

    class WeightAveraging(L.Callback):  # recognised by name, as Lightning's (2.6 and later) are
        pass

    class EMAWeightAveraging(WeightAveraging):
        pass

    swa = StochasticWeightAveraging(swa_lrs=0.1)
    assert not stochastic_average_taken(swa)  # nothing averaged yet
    swa.n_averaged = torch.tensor(2)
    assert stochastic_average_taken(swa) and not stochastic_average_taken(EMAWeightAveraging())
    swa.n_averaged = torch.tensor(0)
    assert not stochastic_average_taken(swa)
    assert weight_averaging([EMAWeightAveraging(), swa, L.Callback()]) == "EMAWeightAveraging, StochasticWeightAveraging"
    assert weight_averaging([L.Callback()]) is None

    trained, swa_ckpt = {"state_dict": {}}, {AVERAGE_ONLY: "StochasticWeightAveraging"}
    ema = {"current_model_state": {}, "callbacks": {"EMAWeightAveraging{'decay': 0.9}": {}, "Other": {}}}
    assert averaged_weights(trained) is None and averaged_weights(swa_ckpt) == "StochasticWeightAveraging"
    assert averaged_weights(ema) == "EMAWeightAveraging"
    assert averaged_weights({"current_model_state": {}, "callbacks": {"Other": {}}}) == "WeightAveraging"
    assert averaged_weights_note(trained, "x.ckpt") is None
    assert averaged_weights_note(swa_ckpt, "swa.ckpt") == (
        "note: swa.ckpt holds its run's StochasticWeightAveraging average, put in at the end of training (no validation "
        "of the run scored it); the trained weights are in last.ckpt beside it")
    assert averaged_weights_note(ema, "last.ckpt") == (
        "note: last.ckpt holds its run's EMAWeightAveraging average as its weights (what its validations scored); the "
        "trained weights beside them serve only a resume")

    check_averaging_resumed(trained, [])
    check_averaging_resumed(ema, [L.Callback(), EMAWeightAveraging()])
    with pytest.raises(ValueError, match="this checkpoint was written by a run with EMAWeightAveraging: its weights are "
                                         r"that callback's average.*--trainer.callbacks\+=EMAWeightAveraging"):
        check_averaging_resumed(ema, [L.Callback()])
    with pytest.raises(ValueError, match="this checkpoint holds StochasticWeightAveraging's average alone"):
        check_averaging_resumed(swa_ckpt, [swa])

    ModelParallelStrategy, FSDPStrategy, DDPStrategy = (type(n, (), {}) for n in ("ModelParallelStrategy",
                                                                                   "FSDPStrategy", "DDPStrategy"))
    check_averaging_unsharded([EMAWeightAveraging(), swa], DDPStrategy())
    check_averaging_unsharded([L.Callback()], FSDPStrategy())
    for strategy in (ModelParallelStrategy(), FSDPStrategy()):
        with pytest.raises(ValueError, match=f"EMAWeightAveraging keeps a whole copy of the model.*module "
                                             f"{type(strategy).__name__} shards"):
            check_averaging_unsharded([L.Callback(), EMAWeightAveraging()], strategy)
        with pytest.raises(ValueError, match=f"StochasticWeightAveraging averages into a whole copy of the model, "
                                             f"which the parameters {type(strategy).__name__} shards"):
            check_averaging_unsharded([swa], strategy)


def test_the_checkpoints_of_a_name_come_newest_first_across_roots(tmp_path):
    from recipes.training import run_checkpoints

    first, second = tmp_path / "a", tmp_path / "b"
    assert run_checkpoints([first, second]) == []
    for root, version, mtime in ((first, "version_0", 300), (first, "version_1", 100), (second, "version_0", 200)):
        (root / version / "checkpoints").mkdir(parents=True)
        (root / version / "checkpoints" / "last.ckpt").write_bytes(b"")
        os.utime(root / version / "checkpoints" / "last.ckpt", (mtime, mtime))
    (first / "version_1" / "checkpoints" / "best.ckpt").write_bytes(b"")
    (first / "version_3" / "checkpoints" / "last.ckpt").mkdir(parents=True)  # a folder that is no checkpoint
    assert run_checkpoints([first, second]) == [first / "version_0" / "checkpoints" / "last.ckpt",
                                                second / "version_0" / "checkpoints" / "last.ckpt",
                                                first / "version_1" / "checkpoints" / "last.ckpt"]
    assert run_checkpoints([first, second], "best.ckpt") == [first / "version_1" / "checkpoints" / "best.ckpt"]
    assert run_checkpoints([first, second], "swa.ckpt") == []


def test_every_random_number_generator_is_restored():
    import random

    import numpy as np

    from recipes.training import rng_states, set_rng_states

    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.standard_normal()  # (numpy's cached Gaussian: part of its state)
    states = rng_states()
    first = torch.rand(3), np.random.rand(3), random.random(), np.random.standard_normal()
    set_rng_states(states)
    again = torch.rand(3), np.random.rand(3), random.random(), np.random.standard_normal()
    assert torch.equal(first[0], again[0]) and (first[1] == again[1]).all() and first[2:] == again[2:]


def test_a_last_ckpt_due_at_a_validation_step_is_written_after_that_validation_only(tmp_path):
    policy, trainer = CheckpointPolicy(every_n_steps=10, keep_best=False), StepTrainer()
    trainer.state, trainer.callback_metrics = SimpleNamespace(fn="fit"), {}
    trainer.fit_loop.epoch_loop._should_check_val_fx = lambda fetcher: True
    policy.dirpath, trainer.global_step = tmp_path, 10
    policy.on_train_batch_end(trainer, None, None, None, 0)
    assert trainer.saved == [] and policy._after_validation  # due, but validation comes first
    policy.on_validation_end(trainer, None)
    assert trainer.saved == ["last.ckpt"] and policy.last_step == 10
    trainer.global_step = 15  # a validation at a step where no last.ckpt is due
    policy.on_validation_end(trainer, None)
    assert trainer.saved == ["last.ckpt"]


def test_a_stochastic_weight_average_that_is_not_finite_is_not_written(tmp_path, caplog):
    from lightning.pytorch.callbacks import StochasticWeightAveraging

    swa = StochasticWeightAveraging(swa_lrs=0.1)
    swa.n_averaged = torch.tensor(3)
    swa.state_dict = lambda: {"average_model_state": {"w": torch.tensor([1.0, float("nan")])}}
    policy, trainer = CheckpointPolicy(), StepTrainer()
    policy.dirpath, trainer.callbacks = tmp_path, [swa]
    with caplog.at_level("ERROR", logger="recipes.training"):
        policy._save_averages(trainer)
    assert policy.average_path is None and not (tmp_path / "swa.ckpt").exists()
    assert "the StochasticWeightAveraging average is not finite; swa.ckpt not written" in caplog.text


def test_the_run_refuses_to_overwrite_a_config_it_did_not_write_before_it_writes_anything(tmp_path, monkeypatch):
    from lightning.pytorch.cli import SaveConfigCallback

    from recipes.training import RUN_CONFIG_HEADER, RunConfigCallback

    saved = []
    monkeypatch.setattr(SaveConfigCallback, "setup", lambda self, trainer, module, stage: saved.append(stage))

    def setup(config, already_saved=False, is_global_zero=True, rank0_says=None):
        callback = RunConfigCallback.__new__(RunConfigCallback)  # (what Lightning's constructor would set)
        callback.already_saved, callback.config_filename, callback.config = already_saved, "config.yaml", config
        broadcast = (lambda problem: problem) if is_global_zero else (lambda problem: rank0_says)
        trainer = SimpleNamespace(log_dir=str(tmp_path), is_global_zero=is_global_zero,
                                  strategy=SimpleNamespace(broadcast=broadcast))
        callback.setup(trainer, None, "fit")

    (tmp_path / "config.yaml").write_text(f"{RUN_CONFIG_HEADER}2.6.0\n")
    setup({})  # an earlier run's file, and no --config at all
    setup({"config": [str(tmp_path / "recipe.yaml")]})
    assert saved == ["fit", "fit"]
    (tmp_path / "config.yaml").write_text("# my own recipe\n")
    with pytest.raises(ValueError, match=f"{tmp_path / 'config.yaml'} is not a configuration a run wrote"):
        setup({"config": []})
    setup({"config": []}, already_saved=True)  # saved by this run already (a later stage): not checked again
    with pytest.raises(ValueError, match="the first process's reason"):
        setup({"config": []}, is_global_zero=False, rank0_says="the first process's reason")
    assert saved == ["fit", "fit", "fit"]


def test_the_policy_sets_up_for_a_fit_only_clears_orphans_and_goes_first_at_the_end_once(tmp_path, caplog):
    from recipes.training import WriteLastBeforeTrainEnd

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    orphan = folder / ".last.ckpt.tmp-999999999"  # (no such process)
    orphan.write_bytes(b"")
    other = L.Callback()
    trainer = SimpleNamespace(log_dir=str(tmp_path), default_root_dir="unused", is_global_zero=False,
                              strategy=SimpleNamespace(broadcast=lambda value: value), callbacks=[other])
    policy = CheckpointPolicy()
    policy.setup(trainer, None, "validate")
    assert policy.dirpath is None and trainer.callbacks == [other]
    policy.setup(trainer, None, "fit")
    assert policy.dirpath == folder and orphan.exists()  # only the first process removes them
    trainer.is_global_zero = True
    with caplog.at_level("INFO", logger="recipes.training"):
        policy.setup(trainer, None, "fit")
    assert not orphan.exists() and f"removed {orphan}, left by an interrupted checkpoint write" in caplog.text
    first, *rest = trainer.callbacks
    assert isinstance(first, WriteLastBeforeTrainEnd) and first.policy is policy and rest == [other]
    trainer.callbacks = [*trainer.callbacks, WriteLastBeforeTrainEnd(CheckpointPolicy())]
    policy.setup(trainer, None, "fit")
    assert len(trainer.callbacks) == 3  # its own is there already; another policy's does not count
    trainer.callbacks = [other, WriteLastBeforeTrainEnd(CheckpointPolicy())]
    policy.setup(trainer, None, "fit")
    assert len(trainer.callbacks) == 3 and trainer.callbacks[0].policy is policy


def test_the_logging_step_follows_the_global_step_and_a_fault_point_fires_at_a_fits_first_validation_batch(
        monkeypatch):
    from recipes import training

    policy, trainer = CheckpointPolicy(), StepTrainer()
    trainer.fit_loop.epoch_loop._batches_that_stepped = 4  # one ahead, as Lightning's restart left it
    policy.on_train_batch_start(trainer, None, None, 0)
    assert trainer.fit_loop.epoch_loop._batches_that_stepped == 3
    points = []
    monkeypatch.setattr(training, "fault_point", lambda point, step: points.append((point, step)))
    fired = []
    for fn, sanity, batch in (("fit", False, 1), ("fit", True, 0), ("validate", False, 0), ("fit", False, 0)):
        trainer.state, trainer.sanity_checking = SimpleNamespace(fn=fn), sanity
        policy.on_validation_batch_start(trainer, None, None, batch)
        fired.append(points.pop() if points else None)
    assert fired == [None, None, None, ("validation", 3)]


def test_a_checkpoint_carries_the_pending_log_and_a_resume_writes_it_first(monkeypatch):
    policy, trainer = CheckpointPolicy(), StepTrainer()
    checkpoint = {}
    policy.on_save_checkpoint(trainer, None, checkpoint)
    assert checkpoint == {}
    policy._pending_log = {"step": 7, "metrics": {"train/loss": 2.0}}
    policy.on_save_checkpoint(trainer, None, checkpoint)
    assert checkpoint == {"pending_log": {"step": 7, "metrics": {"train/loss": 2.0}}}
    resumed = CheckpointPolicy()
    resumed.on_load_checkpoint(trainer, None, checkpoint)
    logged = []
    trainer.loggers = [SimpleNamespace(log_metrics=lambda metrics, step: logged.append((step, metrics)),
                                       save=lambda: logged.append("saved"))]
    monkeypatch.setattr(signal, "signal", lambda signum, handler: None)  # (the handlers are another test's)
    resumed.on_train_start(trainer, None)
    resumed.on_train_start(trainer, None)
    assert logged == [(7, {"train/loss": 2.0}), "saved"]  # once


def test_signal_handlers_are_installed_from_the_main_thread_only():
    import threading

    policy, trainer, errors = CheckpointPolicy(), StepTrainer(), []

    def start():
        try:
            policy.on_train_start(trainer, None)  # (signal.signal raises ValueError outside the main thread)
        except Exception as error:
            errors.append(error)

    thread = threading.Thread(target=start)
    thread.start(), thread.join()
    assert errors == [] and policy._previous_handlers == {}


def test_a_divergence_names_the_last_finite_checkpoint_from_the_first_process(caplog):
    from recipes.training import DivergenceError

    said = []
    for is_global_zero, error, last in ((False, DivergenceError(5, float("nan"), None), None),
                                        (True, RuntimeError("other"), None),
                                        (True, DivergenceError(5, float("nan"), None), None),
                                        (True, DivergenceError(9, float("nan"), None), "c/last.ckpt")):
        caplog.clear()
        policy = CheckpointPolicy()
        policy.last_path, policy.last_step = last, 4
        with caplog.at_level("ERROR", logger="recipes.training"):
            policy.on_exception(StepTrainer(is_global_zero=is_global_zero), None, error)
        said.append([record.getMessage() for record in caplog.records])
    assert said == [[], [], ["last finite checkpoint: none was written in this run"],
                    ["last finite checkpoint: c/last.ckpt (step 4), not overwritten"]]


def test_a_run_folder_is_held_by_one_fit_at_a_time_and_left_as_found(tmp_path):
    """``RunFolderLock``: a second holder of the same folder (another fit, or this process again) is refused, naming
    the first; released, the lock file goes, and so do the folders it made where nothing else was written."""
    import fcntl

    from recipes.training import RUN_LOCK, RunFolderLock

    folder = tmp_path / "version_0" / "checkpoints"
    first = RunFolderLock(folder).hold()
    assert f"process {os.getpid()}: python -m recipes" in (folder / RUN_LOCK).read_text()
    with pytest.raises(ValueError, match=rf"{folder}: a fit is writing this run now \(process {os.getpid()}: python -m "
                                         r"recipes.*\); a second would write the same checkpoints and curves"):
        RunFolderLock(folder).hold()
    with open(folder / RUN_LOCK) as probe, pytest.raises(BlockingIOError):  # (held for real, not only said)
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    first.release()
    assert not (tmp_path / "version_0").exists()  # nothing written: the folders it made are gone too
    first.release()  # (twice is once)

    (tmp_path / "version_1").mkdir()
    second = RunFolderLock(tmp_path / "version_1" / "checkpoints").hold()
    (tmp_path / "version_1" / "checkpoints" / "last.ckpt").write_text("")
    second.release()
    assert sorted(p.name for p in (tmp_path / "version_1" / "checkpoints").iterdir()) == ["last.ckpt"]
    third = RunFolderLock(tmp_path / "version_1" / "checkpoints").hold()  # (free again)
    third.release()
    assert (tmp_path / "version_1").is_dir()  # (it was there before: never removed)
    (tmp_path / "version_2" / "checkpoints").mkdir(parents=True)  # empty, and not the lock's to remove
    RunFolderLock(tmp_path / "version_2" / "checkpoints").hold().release()
    assert (tmp_path / "version_2" / "checkpoints").is_dir()



def test_a_run_folder_on_a_file_system_without_locks_is_written_unguarded_with_a_note(tmp_path, monkeypatch, capsys):
    import errno
    import fcntl

    from recipes.training import RUN_LOCK, RunFolderLock

    def no_locks(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    held = RunFolderLock(tmp_path / "checkpoints").hold()  # (a run must not fail for want of a lock)
    assert held.file is None and f"{tmp_path / 'checkpoints' / RUN_LOCK} cannot be locked on this file system (No " \
        "locks available): nothing stops a second fit" in capsys.readouterr().err
    held.release()


def test_a_fit_into_a_run_another_fit_is_writing_is_refused_before_it_writes(tmp_path, monkeypatch):
    """``fit --ckpt_path last`` of a run still going (in another terminal) wrote the same checkpoints and a second
    events file beside the first: two curves in one run, and whichever process wrote last.ckpt last won."""
    from recipes.cli import main
    from recipes.training import RUN_LOCK, RunFolderLock

    monkeypatch.chdir(tmp_path)
    tiny = ["fit", "--config", "quickstart.yaml", "--model.d_model", "16", "--model.mixers.A.init_args.n_heads", "2",
            "--data.init_args.seq_len", "16", "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar",
            "false"]
    main([*tiny, "--trainer.max_steps", "2"])
    run = tmp_path / "runs" / "quickstart" / "version_0"
    assert not (run / "checkpoints" / RUN_LOCK).exists()  # released when the command ended
    before = sorted(p.name for p in run.iterdir())
    going = RunFolderLock(run / "checkpoints").hold()  # the run, still training elsewhere
    try:
        with pytest.raises(SystemExit, match=r"version_0/checkpoints: a fit is writing this run now \(process \d+: "):
            main([*tiny, "--trainer.max_steps", "4", "--ckpt_path", "last"])
        assert sorted(p.name for p in run.iterdir()) == before  # (no events file of its own)
    finally:
        going.release()
    main([*tiny, "--trainer.max_steps", "4", "--ckpt_path", "last"])  # once it has ended, the resume goes on
    assert len(list(run.glob("events.out.tfevents.*"))) == 2 and not (run / "checkpoints" / RUN_LOCK).exists()


BALANCED_MOE = """
model:
  d_model: 32
  pattern: "AM -E"
  mixers:
    A: {class_path: components.QCAttention, init_args: {n_heads: 2}}
    M: {class_path: components.MLP, init_args: {d_ff: 64}}
    E:
      class_path: components.ComposedMoE
      init_args:
        router: {class_path: components.SigmoidRouter, init_args: {n_experts: 4, top_k: 1, balance_rate: 0.05}}
        experts: {class_path: components.state.MLPExperts, init_args: {n_experts: 4, d_ff: 32}}
  aux_loss_coef: 0.0
data:
  class_path: recipes.data.TextCorpus
  init_args: {seq_len: 16}
trainer:
  max_steps: 10
  accumulate_grad_batches: 2
  limit_val_batches: 0
  enable_progress_bar: false
  logger: {class_path: lightning.pytorch.loggers.TensorBoardLogger, init_args: {save_dir: runs, name: moe}}
"""


def test_under_ddp_the_balancing_bias_steps_as_one_process_on_the_combined_batch(tmp_path):
    """Two processes with two micro-batches a step: the bias takes the step one process takes on the combined batch —
    the tallies of a step's micro-batches summed over the processes. (The tally is a buffer, and DDP broadcasts
    buffers from rank 0 before a forward that follows a synchronised one: at a step's first micro-batch, when every
    tally is zero; under Lightning's accumulation the others run without.) No balancing loss: the loads come from
    the routing alone."""
    (tmp_path / "moe.yaml").write_text(BALANCED_MOE)
    ddp = fit(tmp_path, "--config", "moe.yaml", "--data.init_args.batch_size", "2", "--trainer.strategy", "ddp",
              "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.logger.init_args.version", "ddp")
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    fit_here(tmp_path, "--config", "moe.yaml", "--data.init_args.batch_size", "4", "--trainer.logger.init_args.version",
             "one")
    bias = {version: torch.load(tmp_path / "runs" / "moe" / version / "checkpoints" / "last.ckpt", weights_only=True)
            ["state_dict"]["model.blocks.1.state_mixer.router.balance_bias"] for version in ("ddp", "one")}
    assert bias["one"].abs().sum() > 0 and torch.equal(bias["ddp"], bias["one"]), bias
