import inspect
import math
import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from components import MLP, HybridLM
from recipes import LanguageModel
from recipes.module import warmup_cosine, warmup_stable_decay


def test_every_hybridlm_option_reaches_the_cli_and_the_checkpoint_without_being_declared_again():
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(LanguageModel, "model")
    cli_options = set(vars(parser.get_defaults().model))
    hybrid = inspect.signature(HybridLM).parameters
    assert set(hybrid) <= cli_options  # read from HybridLM's own signature (the **model_options it is passed)
    assert parser.get_defaults().model.max_seq_len == hybrid["max_seq_len"].default
    lm = LanguageModel(16, "AM", vocab_size=20, max_seq_len=48, residual_scale=True)
    assert lm.model.max_seq_len == 48 and lm.model.blocks[0].state_residual is not None
    assert lm.hparams.max_seq_len == 48 and lm.hparams.residual_scale is True  # recorded for the checkpoint


def test_an_option_neither_languagemodels_nor_hybridlms_is_refused_by_name():
    with pytest.raises(TypeError, match="unknown argument.*'max_seq'.*max_seq_len"):
        LanguageModel(16, "AM", vocab_size=20, max_seq=48)


def test_warmup_then_cosine_to_the_final_fraction():
    total = 100
    values = [warmup_cosine(s, total, 0.1, 0.1) for s in range(total)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in zip(values[:10], values[1:10]))
    assert all(a >= b for a, b in zip(values[10:], values[11:]))
    assert warmup_cosine(total, total, 0.1, 0.1) == pytest.approx(0.1)
    assert warmup_cosine(55, total, 0.1, 0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def test_warmup_stable_decay_holds_the_peak_then_decays_linearly_to_the_final_fraction():
    total = 100  # warm-up 10 steps, peak to step 79, then 20 steps down to 0.1
    values = [warmup_stable_decay(s, total, 0.1, 0.1, 0.2) for s in range(total + 1)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert values[10:81] == [1.0] * 71
    assert values[90] == pytest.approx(1 - 0.9 * 10 / 20) and values[100] == pytest.approx(0.1)
    assert all(a > b for a, b in zip(values[80:], values[81:]))
    assert [warmup_stable_decay(s, total, 0.0, 0.1, 0.0) for s in (0, 50, 100)] == [1.0] * 3  # no decay: constant
    # planned for 100 or for 300 steps, the rate is the same through 100's stable phase past 300's warm-up: a run
    # stopped there and resumed with a larger max_steps continues without a jump
    assert all(warmup_stable_decay(s, 100, 0.1, 0.1, 0.2) == warmup_stable_decay(s, 300, 0.1, 0.1, 0.2) for s in range(30, 80))


@pytest.mark.parametrize("options, expected", [
    ({"schedule": "linear"}, "schedule='linear' is not one of \\('cosine', 'wsd'\\)"),
    ({"decay_fraction": 0.3}, "decay_fraction=0.3 is the wsd schedule's"),
    ({"schedule": "wsd", "decay_fraction": 0.95}, "the warm-up \\(0.1\\) and the decay together cover at most"),
    ({"schedule": "wsd", "decay_fraction": -0.1}, "decay_fraction=-0.1 must lie in \\[0, 1\\]"),
])
def test_a_schedule_the_run_cannot_follow_is_refused_by_name(options, expected):
    with pytest.raises(ValueError, match=expected):
        LanguageModel(16, "AM", vocab_size=20, **options)


def test_the_wsd_schedule_steps_the_optimizer_at_chosen_steps():
    lm = LanguageModel(16, "AM", vocab_size=20, lr=2e-3, warmup_fraction=0.2, final_lr_fraction=0.05, schedule="wsd",
                       decay_fraction=0.4)
    assert lm.hparams.schedule == "wsd" and lm.hparams.decay_fraction == 0.4
    assert LanguageModel(16, "AM", vocab_size=20, schedule="wsd").hparams.decay_fraction == 0.2  # its default
    optimizer, schedule = (lambda c: (c["optimizer"], c["lr_scheduler"]["scheduler"]))(configured(lm, 50))
    lrs = []
    for _ in range(51):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    # warm-up over 10 steps, the peak over steps 10-29, then 20 steps down to 5%
    assert lrs[4] == pytest.approx(2e-3 * 5 / 10) and lrs[10:30] == pytest.approx([2e-3] * 20)
    assert lrs[40] == pytest.approx(2e-3 * (1 - 0.95 * 10 / 20)) and lrs[50] == pytest.approx(2e-3 * 0.05)


class SquareAux(MLP):
    def forward(self, x):
        y = super().forward(x)
        self.aux_loss = y.pow(2).mean()
        return y


def test_training_loss_adds_the_auxiliary_losses_with_their_coefficient():
    lm = LanguageModel(16, "AW -W", {"W": SquareAux}, vocab_size=20, aux_loss_coef=0.5)
    batch = {"input_ids": torch.randint(0, 20, (2, 6)), "labels": torch.randint(0, 20, (2, 6))}
    loss = lm.training_step(batch, 0)
    logits = lm.model(batch["input_ids"])
    ce = F.cross_entropy(logits.reshape(-1, 20), batch["labels"].reshape(-1))
    aux = sum(lm.model.auxiliary_losses().values())
    torch.testing.assert_close(loss, ce + 0.5 * aux)


def test_the_router_z_loss_joins_the_objective_with_its_coefficient_and_is_logged(monkeypatch):
    """A training step adds ``router_z_loss`` times the sum of the routed MoEs' router z-losses to the cross-entropy
    and the balancing losses, and logs that sum as ``train/router_z_loss``; at 0 (the default) it adds and logs
    nothing. A negative coefficient is refused by name."""
    moe = {"R": {"class_path": "components.RoutedMoE", "init_args": {"n_experts": 4, "top_k": 2, "d_ff": 8}}}
    logged = {}
    monkeypatch.setattr(LanguageModel, "log", lambda self, name, value, **kw: logged.setdefault(id(self), {}).update(
        {name: value}))
    batch = {"input_ids": torch.randint(0, 20, (2, 6)), "labels": torch.randint(0, 20, (2, 6))}
    for coefficient in (0.0, 0.3):
        torch.manual_seed(0)
        lm = LanguageModel(16, "AR AR", moe, vocab_size=20, aux_loss_coef=0.5, router_z_loss=coefficient)
        loss = lm.training_step(batch, 0)
        logits = lm.model(batch["input_ids"])
        ce = F.cross_entropy(logits.reshape(-1, 20), batch["labels"].reshape(-1))
        aux, router_z = (sum(losses.values()) for losses in (lm.model.auxiliary_losses(), lm.model.router_z_losses()))
        assert len(lm.model.router_z_losses()) == 2 and router_z > 0
        torch.testing.assert_close(loss, ce + 0.5 * aux + coefficient * router_z)
        assert ("train/router_z_loss" in logged[id(lm)]) == bool(coefficient)
    torch.testing.assert_close(logged[id(lm)]["train/router_z_loss"], router_z.detach())
    with pytest.raises(ValueError, match=r"LanguageModel: router_z_loss=-0.1 must be a finite number >= 0 \(ST-MoE's"):
        LanguageModel(16, "AM", vocab_size=23, router_z_loss=-0.1)


def test_loss_only_at_labelled_positions():
    lm = LanguageModel(16, "AM", vocab_size=20)
    ids = torch.randint(0, 20, (2, 6))
    labels = torch.full((2, 6), -100)
    labels[0, 3], labels[1, 5] = 7, 2
    ce, logits, targets = lm.forward_loss({"input_ids": ids, "labels": labels})
    assert logits.shape == (2, 20) and targets.tolist() == [7, 2]
    full = lm.model(ids)
    torch.testing.assert_close(ce, F.cross_entropy(full[[0, 1], [3, 5]], torch.tensor([7, 2])))


@pytest.mark.parametrize("positions, z_loss", [("all", 0.0), ("labelled", 0.0), ("all", 0.05), ("labelled", 0.05)])
@pytest.mark.parametrize("tied", [False, True])
def test_the_training_loss_without_logits_equals_the_plain_head_and_cross_entropy(positions, tied, z_loss):
    """... and with PaLM's z-loss, its mean ``logsumexp²`` over the labelled positions written out."""
    torch.manual_seed(0)
    lm = LanguageModel(16, "AM SM", vocab_size=37, loss_positions=positions, tie_embeddings=tied, z_loss=z_loss).double()
    ids = torch.randint(0, 37, (3, 11))
    labels = torch.randint(0, 37, (3, 11))
    labels[:, :4] = -100
    labels[1, 7] = -100
    batch = {"input_ids": ids, "labels": labels}
    params = [p for p in lm.parameters() if p.requires_grad]
    got = lm.training_loss(batch)
    got_grads = torch.autograd.grad(got, params)
    logits, kept = lm.model(ids), labels != -100
    want = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    want = want + z_loss * torch.logsumexp(logits[kept], dim=-1).square().mean()
    want_grads = torch.autograd.grad(want, params)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("z_loss", [0.0, 0.05])
def test_a_head_that_is_not_a_plain_linear_takes_the_written_out_logits(z_loss):
    torch.manual_seed(0)
    lm = LanguageModel(16, "AM", vocab_size=23, z_loss=z_loss)
    head = lm.model.lm_head
    lm.model.lm_head = torch.nn.Sequential(head, torch.nn.Tanh())  # e.g. a wrapped or soft-capped head
    ids, labels = torch.randint(0, 23, (2, 9)), torch.randint(0, 23, (2, 9))
    labels[0, :3] = -100
    got = lm.training_loss({"input_ids": ids, "labels": labels})
    logits = lm.model(ids)
    want = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    torch.testing.assert_close(got, want + z_loss * torch.logsumexp(logits[labels != -100], -1).square().mean())


def test_the_z_loss_joins_the_objective_and_train_loss_stays_the_cross_entropy(monkeypatch):
    """A training step returns the cross-entropy plus ``z_loss`` times the mean ``logsumexp²``; it logs the
    cross-entropy alone as ``train/loss`` (comparable with ``val/loss`` and with a run without it) and the mean
    ``logsumexp²`` as ``train/z_loss``."""
    torch.manual_seed(0)
    plain, with_z = LanguageModel(16, "AM", vocab_size=23), LanguageModel(16, "AM", vocab_size=23, z_loss=0.5)
    with_z.load_state_dict(plain.state_dict())
    batch = {"input_ids": torch.randint(0, 23, (2, 9)), "labels": torch.randint(0, 23, (2, 9))}
    logged = {}
    for lm in (plain, with_z):
        monkeypatch.setattr(lm, "log", lambda name, value, key=id(lm), **_: logged.setdefault(key, {}).update({name: value}))
    ce = plain.training_step(batch, 0)
    objective = with_z.training_step(batch, 0)
    squares = torch.logsumexp(plain.model(batch["input_ids"]), dim=-1).square().mean()
    torch.testing.assert_close(objective, ce + 0.5 * squares)
    torch.testing.assert_close(logged[id(with_z)]["train/loss"], ce.detach())
    torch.testing.assert_close(logged[id(with_z)]["train/z_loss"], squares.detach())
    assert "train/z_loss" not in logged[id(plain)]
    with pytest.raises(ValueError, match=r"LanguageModel: z_loss=-1 must be a finite number >= 0 \(PaLM's: 1e-4\)"):
        LanguageModel(16, "AM", vocab_size=23, z_loss=-1)


@pytest.mark.parametrize("setting, message", [
    ({"warmup_fraction": 1.5}, "warmup_fraction=1.5 must lie in"),
    ({"lr": -1.0}, "lr=-1.0 must be a positive number"),  # torch's "Invalid learning rate", after the data, before
    ({"lr": float("nan")}, "lr=nan must be a positive number"),
    ({"betas": (0.9, 1.0)}, r"betas=\(0.9, 1.0\) must be two numbers in \[0, 1\)"),
    ({"weight_decay": -0.1}, "weight_decay=-0.1 and aux_loss_coef=0.01 >= 0"),
    ({"eps": 0.0}, "eps=0.0 must be > 0"),
    ({"lr": 0.0}, "lr=0.0 must be a positive number"),  # (a run that never moves)
    ({"warmup_fraction": 1.0}, r"warmup_fraction=1.0 must lie in \[0, 1\)"),  # (no step left after the warm-up)
    ({"warmup_fraction": -0.1}, "warmup_fraction=-0.1 must lie in"),
    ({"final_lr_fraction": 1.5}, r"final_lr_fraction=1.5 must lie in \[0, 1\]"),
    ({"final_lr_fraction": -0.1}, "final_lr_fraction=-0.1 must lie in"),
    ({"aux_loss_coef": -0.01}, "aux_loss_coef=-0.01 >= 0"),
    ({"loss_positions": "labeled"}, "loss_positions='labeled' is not one of \\('all', 'labelled'\\)"),
    ({"peak_flops": 0.0}, "peak_flops=0.0 must be a positive FLOP/s figure"),
    ({"optimizer": "SGD", "betas": (0.8, 0.9)}, "optimizer SGD: --model.betas and --model.eps are the default AdamW's"),
    ({"optimizer": "SGD", "eps": 1e-8}, "optimizer SGD: --model.betas and --model.eps are the default AdamW's"),
])
def test_bad_optimizer_and_schedule_values_are_refused_when_the_module_is_built(setting, message):
    with pytest.raises(ValueError, match=message):
        LanguageModel(16, "AM", **setting)


@pytest.mark.parametrize("setting", [
    {"betas": (0.0, 0.0)}, {"warmup_fraction": 0.0}, {"final_lr_fraction": 0.0}, {"final_lr_fraction": 1.0},
    {"weight_decay": 0.0, "aux_loss_coef": 0.0}, {"sample_tokens": 0}, {"optimizer": "SGD", "weight_decay": 0.0},
])
def test_the_edges_of_each_settings_range_are_accepted_and_recorded(setting):
    hparams = LanguageModel(16, "AM", **setting).hparams
    for key, value in setting.items():
        assert hparams[key] == (list(value) if key == "betas" else value if key != "optimizer" else
                                {"class_path": "torch.optim.SGD", "init_args": {}})


def test_expert_load_is_logged_per_moe_layer():
    from functools import partial

    from components import RoutedMoE

    lm = LanguageModel(16, "AR AM", {"R": partial(RoutedMoE, n_experts=4, top_k=1, d_ff=8)}, vocab_size=20)
    logged = {}
    lm.log = lambda name, value, **kwargs: logged.__setitem__(name, value)
    lm.training_step({"input_ids": torch.randint(0, 20, (2, 6)), "labels": torch.randint(0, 20, (2, 6))}, 0)
    load = lm.model.expert_loads()["blocks.0.state_mixer"]
    entropy = -(load[load > 0] * load[load > 0].log()).sum() / math.log(4)
    torch.testing.assert_close(logged["moe/block0/load_entropy"], entropy)
    torch.testing.assert_close(logged["moe/block0/max_over_mean_load"], load.max() * 4)
    assert "train/aux_loss" in logged
    assert not any(name.endswith("balance_bias_spread") for name in logged)  # (a softmax router has no bias)
    sigmoid = {"class_path": "components.ComposedMoE", "init_args": {
        "router": {"class_path": "components.SigmoidRouter", "init_args": {"n_experts": 4, "top_k": 1}},
        "experts": {"class_path": "components.state.MLPExperts", "init_args": {"n_experts": 4, "d_ff": 8}}}}
    lm = LanguageModel(16, "AM -E", {"E": sigmoid}, vocab_size=20)
    with torch.no_grad():
        lm.model.blocks[1].state_mixer.router.balance_bias.copy_(torch.tensor([0.1, -0.2, 0.05, 0.0]))
    logged.clear()
    lm.log = lambda name, value, **kwargs: logged.__setitem__(name, value)
    lm.training_step({"input_ids": torch.randint(0, 20, (2, 6)), "labels": torch.randint(0, 20, (2, 6))}, 0)
    torch.testing.assert_close(logged["moe/block1/balance_bias_spread"], torch.tensor(0.3))


def test_size_to_sizes_the_model_and_records_the_width():
    from components.sizing import SizeTarget

    lm = LanguageModel(32, "AM AM", vocab_size=64, size_to=SizeTarget(100_000, ["M"], multiple_of=2))
    assert abs(lm.sizes["n_params"] - 100_000) < 200
    assert lm.sizes["sized_width"] == lm.model.blocks[0].state_mixer.d_ff
    assert "sized: d_ff=" in lm.size_note
    # Rebuilt from its own hyper-parameters (as load_from_checkpoint does), it is the same model.
    again = LanguageModel(**lm.hparams)
    assert again.sizes == lm.sizes and again.hparams == lm.hparams


def test_a_size_to_width_the_recipes_mixer_does_not_take_is_named_from_the_command_line(tmp_path, monkeypatch):
    # A recipe's binding reaches the model as jsonargparse's callable, whose signature is (*args, **kwargs): the check
    # read that and let d_ff through to QCAttention, which failed inside the solver with Python's TypeError.
    from recipes.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"size_to: arg='d_ff' is not an argument of the mixer of letter 'A', "
                                         r"QCAttention \(it takes: n_heads, "):
        main(["fit", "--config", "quickstart.yaml", "--model.d_model", "32", "--model.size_to",
              "{params: 100000, letters: [A], arg: d_ff}"])


def test_size_to_letters_as_one_string_pass_the_command_lines_parser(tmp_path, monkeypatch):
    """``letters: MR`` (the form SizeTarget reads as its characters) was refused by the parser before SizeTarget saw
    it: "Expected a <class 'list'>. Got value: MR"."""
    from recipes.cli import main

    monkeypatch.chdir(tmp_path)
    cli = main(["--config", "quickstart.yaml", "--model.d_model", "32", "--model.mixers.A.init_args.n_heads", "2",
                "--model.pattern", "AM AR", "--model.size_to", "{params: 100000, letters: MR, multiple_of: 2}"], run=False)
    assert cli.model.hparams["size_to"]["letters"] == ["M", "R"]
    assert abs(cli.model.sizes["n_params"] - 100_000) < 2_000


@pytest.mark.parametrize("positions", ["all", "labelled"])
def test_a_batch_with_every_label_ignored_has_loss_zero_not_nan(positions):
    lm = LanguageModel(16, "AM", vocab_size=20, loss_positions=positions)
    batch = {"input_ids": torch.randint(0, 20, (2, 6)), "labels": torch.full((2, 6), -100)}
    loss = lm.training_step(batch, 0)
    assert loss.item() == 0.0
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in lm.parameters())


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    import random

    import numpy as np

    from recipes.training import rng_states, set_rng_states

    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    torch.save({"rng": rng_states()}, tmp_path / "c.ckpt")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    set_rng_states(torch.load(tmp_path / "c.ckpt", weights_only=True)["rng"])
    got = (torch.rand(3), np.random.rand(3), random.random())
    torch.testing.assert_close(got[0], expected[0])
    assert np.array_equal(got[1], expected[1]) and got[2] == expected[2]


def configured(lm: LanguageModel, total_steps: int):
    """configure_optimizers as a trainer of ``total_steps`` optimizer steps would call it."""
    lm.trainer = SimpleNamespace(estimated_stepping_batches=total_steps)
    return lm.configure_optimizers()


def test_learning_rate_at_chosen_steps_and_stepped_per_optimizer_step():
    lm = LanguageModel(16, "AM", vocab_size=20, lr=2e-3, warmup_fraction=0.2, final_lr_fraction=0.05)
    config = configured(lm, 50)
    assert config["lr_scheduler"]["interval"] == "step"  # per optimizer step, not per epoch
    optimizer, schedule = config["optimizer"], config["lr_scheduler"]["scheduler"]
    lrs = []
    for _ in range(51):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    # Warm-up over int(0.2·50) = 10 steps: (s+1)/10 of the peak; then a cosine down to 5% at step 50.
    assert lrs[0] == pytest.approx(2e-3 / 10) and lrs[4] == pytest.approx(2e-3 * 5 / 10)
    assert lrs[9] == pytest.approx(2e-3) and lrs[10] == pytest.approx(2e-3)
    assert lrs[30] == pytest.approx(2e-3 * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * 20 / 40))))
    assert lrs[50] == pytest.approx(2e-3 * 0.05)
    assert all(g["lr"] == optimizer.param_groups[0]["lr"] for g in optimizer.param_groups)


def test_weight_decay_applies_to_matrices_only():
    lm = LanguageModel(16, "SM AM", vocab_size=20, weight_decay=0.1, residual_scale=True)
    optimizer = configured(lm, 10)["optimizer"]
    decay = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    names = dict(lm.named_parameters())
    assert set(decay) == {id(p) for p in names.values()}  # every parameter, once
    for name, p in names.items():
        expected = 0.1 if p.dim() >= 2 else 0.0
        assert decay[id(p)] == expected, f"{name} {tuple(p.shape)}: weight decay {decay[id(p)]}, expected {expected}"
    assert decay[id(names["model.norm.weight"])] == 0.0 and decay[id(names["model.blocks.0.sequence_mixer.A_log"])] == 0.0
    assert decay[id(names["model.embedding.weight"])] == 0.1


def test_flops_and_mfu_are_logged_from_the_analytic_count():
    """train/flops_per_token is the model's forward count at the batches' length; train/tflops is three forwards
    per token at the measured speed; train/mfu divides by the given peak, and is absent where none is known (CPU)."""
    from components.flops import forward_flops_per_token

    for peak in (2e12, None):
        lm = LanguageModel(16, "AM SM", vocab_size=20, peak_flops=peak)
        lm.trainer = SimpleNamespace(precision="32-true")
        logged = {}
        lm.log = lambda name, value, **kwargs: logged.__setitem__(name, value)  # noqa: B023
        lm._window_length = 24
        lm._log_flops(1000.0)
        flops = forward_flops_per_token(lm.model, 24)
        assert logged["train/flops_per_token"] == flops
        assert logged["train/tflops"] == pytest.approx(3 * flops * 1000.0 / 1e12)
        assert ("train/mfu" in logged) == (peak is not None)
        if peak:
            assert logged["train/mfu"] == pytest.approx(3 * flops * 1000.0 / peak)


@pytest.mark.parametrize("peak", [0, -1e12, float("nan")])
def test_a_bad_peak_is_named(peak):
    with pytest.raises(ValueError, match="peak_flops"):
        LanguageModel(16, "AM", vocab_size=20, peak_flops=peak)


@pytest.mark.parametrize("tokens", [-1, 2.5, True])
def test_a_bad_sample_length_is_named(tokens):
    with pytest.raises(ValueError, match=rf"sample_tokens={tokens!r} must be an integer >= 0"):
        LanguageModel(16, "AM", vocab_size=20, sample_tokens=tokens)


def test_tensor_parallelism_is_refused_by_name_before_anything_is_sharded():
    """``ModelParallelStrategy(tensor_parallel_size=2)``: the zoo shards over the data-parallel axis alone and has no
    tensor-parallel plan, so the setting is refused before any sharding, naming the one that works."""
    lm = LanguageModel(16, "AM", {"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2}}},
                       vocab_size=64)
    lm._device_mesh = {"tensor_parallel": SimpleNamespace(size=lambda: 2)}  # (what configure_model reads of the mesh)
    lm._trainer = SimpleNamespace(callbacks=[], strategy=None)
    with pytest.raises(ValueError, match=r"tensor parallelism is not implemented \(tensor_parallel_size=2\); use "
                                         r"ModelParallelStrategy\(data_parallel_size=N, tensor_parallel_size=1\)"):
        lm.configure_model()
    assert not lm._sharded


def test_load_from_checkpoint_refuses_lightnings_hparams_file_before_reading_anything(tmp_path):
    """Lightning's ``hparams_file`` would replace the hyper-parameters the checkpoint records (and is a YAML file that
    names classes): refused by name, pointing at the keyword arguments that override them."""
    with pytest.raises(ValueError, match="hparams_file is not supported; the checkpoint records the hyper-parameters, "
                                         "and keyword arguments override them"):
        LanguageModel.load_from_checkpoint(tmp_path / "never-read.ckpt", hparams_file=tmp_path / "hparams.yaml")


def test_the_arguments_a_language_model_takes_are_its_own_and_hybridlms_options_and_its_records_add_the_sizes():
    """What a recipe's ``model:`` may set (the CLI refuses anything else by name) and what a run's ``hparams.yaml``
    may hold (the sweep's ``--vs`` keys)."""
    from recipes.module import SIZE_KEYS, hyperparameter_keys, language_model_arguments, model_options

    arguments = language_model_arguments()
    assert {"d_model", "pattern", "mixers", "vocab_size", "lr", "size_to", "init_from", "init_from_strict"} <= arguments
    assert {"max_seq_len", "tie_embeddings", "checkpoint_blocks"} <= arguments and "max_seq_len" in model_options()
    assert not {"self", "model_options"} & arguments
    assert set(LanguageModel(16, "AM", vocab_size=20, max_seq_len=64).hparams) <= arguments
    assert hyperparameter_keys() - arguments == set(SIZE_KEYS) == {"n_blocks", "n_params", "n_active_params",
                                                                   "sized_width"}


def test_labels_are_token_ids_in_the_vocabulary_or_the_ignore_index_at_both_edges():
    lm = LanguageModel(16, "AM", vocab_size=20).eval()
    for fine in ([[0, 19, -100]], [[-100, -100]], [[0]]):
        lm._check_labels(torch.tensor(fine))
    lm._check_labels(torch.zeros(2, 0, dtype=torch.long))  # (an empty batch: nothing to check, no min of nothing)
    for bad, seen in (([[0, 20]], "[0, 20]"), ([[-1, 5]], "[-1, 5]"), ([[19, -101]], "[-101, 19]")):
        with pytest.raises(ValueError, match=rf"vocab_size=20\) or -100 \(no loss\); got values in \{seen}"):
            lm._check_labels(torch.tensor(bad))
    with pytest.raises(RuntimeError, match=r"labels must be token ids in \[0, vocab_size=20\) or -100 \(no loss\)$"):
        lm.train()._check_labels(torch.tensor([[20]]))  # (training: the device's assert, no values read back)


@pytest.mark.parametrize("positions, rows", [("all", 2 * 9), ("labelled", 5)])
def test_the_head_runs_on_every_position_or_only_the_labelled_ones_as_loss_positions_says(positions, rows, monkeypatch):
    import recipes.module

    seen, fused = [], recipes.module.linear_cross_entropy_parts

    def recording(hidden, weight, labels, **kwargs):
        seen.append(tuple(hidden.shape))
        return fused(hidden, weight, labels, **kwargs)

    monkeypatch.setattr(recipes.module, "linear_cross_entropy_parts", recording)
    lm = LanguageModel(16, "AM", vocab_size=20, loss_positions=positions)
    labels = torch.full((2, 9), -100)
    labels[0, :3], labels[1, 7:] = 4, 5  # five labelled positions
    lm.training_loss({"input_ids": torch.randint(0, 20, (2, 9)), "labels": labels})
    assert seen == [(rows, 16)]


def test_with_accumulation_the_logged_loss_is_the_mean_over_the_steps_micro_batches_so_far():
    """Lightning logs a step's last value: under ``accumulate_grad_batches`` the module logs the mean of the step's
    micro-batches so far, restarting with each step's first (the auxiliary loss likewise)."""
    from functools import partial

    from components import RoutedMoE

    torch.manual_seed(0)
    lm = LanguageModel(16, "AR", {"R": partial(RoutedMoE, n_experts=4, top_k=1, d_ff=8)}, vocab_size=20)
    lm._trainer = SimpleNamespace(accumulate_grad_batches=2)
    logged = []
    lm.log = lambda name, value, **kwargs: logged.append((name, float(value)))
    batches = [{"input_ids": torch.randint(0, 20, (2, 6)), "labels": torch.randint(0, 20, (2, 6))} for _ in range(3)]
    ce, aux = [], []
    for index, batch in enumerate(batches):
        logged.clear()
        loss = lm.training_step(batch, index)
        with torch.no_grad():
            ce.append(float(lm.training_loss(batch)))
        aux.append(float(sum(lm.model.auxiliary_losses().values())))
        assert float(loss.detach()) == pytest.approx(ce[-1] + 0.01 * aux[-1], rel=1e-5)
        first = index - index % 2  # the step's first micro-batch
        values = dict(logged)
        assert values["train/loss"] == pytest.approx(sum(ce[first:]) / len(ce[first:]), rel=1e-5)
        assert values["train/aux_loss"] == pytest.approx(sum(aux[first:]) / len(aux[first:]), rel=1e-5)
        assert values["train/ppl"] == pytest.approx(math.exp(values["train/loss"]), rel=1e-5)


@pytest.mark.parametrize("precision, loss, grad, stops, norm", [
    ("32-true", 1.0, 1.0, False, None),
    ("32-true", float("nan"), 1.0, True, "5.0"),
    ("32-true", 1.0, float("inf"), True, "inf"),
    ("16-mixed", 1.0, float("inf"), False, None),  # (the loss scaler skips such a step itself)
    ("16-mixed", float("inf"), 1.0, True, None),
])
def test_a_step_whose_loss_or_gradient_norm_is_not_finite_stops_before_the_update(precision, loss, grad, stops, norm):
    from recipes.training import DivergenceError

    lm = LanguageModel(16, "AM", vocab_size=20)
    decisions = []
    lm._trainer = SimpleNamespace(precision=precision, world_size=1, global_step=6,
                                  strategy=SimpleNamespace(reduce_boolean_decision=lambda *a, **k: decisions.append(a)))
    logged, clipped = {}, []
    lm.log = lambda name, value, **kwargs: logged.__setitem__(name, float(value))
    lm.clip_gradients = lambda optimizer, **kwargs: clipped.append(kwargs)
    for p in lm.parameters():
        p.grad = torch.zeros_like(p)
    next(lm.parameters()).grad.view(-1)[:2] = torch.tensor([3.0, 4.0 * grad])
    lm._last_loss = torch.tensor(loss)
    if not stops:
        lm.configure_gradient_clipping(None, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
        assert clipped == [{"gradient_clip_val": 1.0, "gradient_clip_algorithm": "norm"}] and not decisions
        if grad == 1.0:
            assert logged["train/grad_norm"] == pytest.approx(5.0)  # (over every parameter's gradient)
        return
    with pytest.raises(DivergenceError) as info:
        lm.configure_gradient_clipping(None, gradient_clip_val=1.0)
    assert info.value.step == 7 and str(info.value.loss) == str(loss) and not clipped
    assert (info.value.grad_norm is None) == (norm is None) and str(info.value.grad_norm) == str(norm or None)


def test_under_several_processes_every_one_stops_if_any_step_diverged():
    from recipes.training import DivergenceError

    lm = LanguageModel(16, "AM", vocab_size=20)
    asked = []

    def reduce(decision, all):  # the other process saw a non-finite loss
        asked.append((decision, all))
        return False

    lm._trainer = SimpleNamespace(precision="32-true", world_size=2, global_step=0,
                                  strategy=SimpleNamespace(reduce_boolean_decision=reduce))
    lm.log = lambda *args, **kwargs: None
    lm.clip_gradients = lambda *args, **kwargs: None
    lm._last_loss = torch.tensor(2.0)
    with pytest.raises(DivergenceError):
        lm.configure_gradient_clipping(None)  # (no gradient at all: a norm of 0)
    assert asked == [(True, True)]


def sample_trainer(**changes):
    """A stand-in trainer for the sample hooks: a data module that decodes, one logger that takes text."""
    texts = []
    experiment = SimpleNamespace(add_text=lambda tag, text, step: texts.append((tag, text, step)))
    trainer = SimpleNamespace(datamodule=SimpleNamespace(decode=lambda ids: " ".join(map(str, ids))),
                              is_global_zero=True, loggers=[SimpleNamespace(experiment=experiment)], global_step=3)
    vars(trainer).update(changes)
    return trainer, texts


@pytest.mark.parametrize("max_seq_len, extrapolate, prompt, length", [
    (48, False, 32, 17),  # the model's length ends first: prompt + sample = max_seq_len + 1 (the last is predicted)
    (32, False, 32, 1),
    (31, False, 32, 0),  # no room at all: no sample, and no error
    (48, True, 32, 20),  # a model that extrapolates samples the tokens asked for
])
def test_a_validation_sample_continues_the_prompt_greedily_for_as_many_tokens_as_the_model_allows(
        max_seq_len, extrapolate, prompt, length):
    torch.manual_seed(0)
    lm = LanguageModel(16, "AM", vocab_size=20, max_seq_len=max_seq_len, extrapolate=extrapolate, sample_tokens=20)
    lm._trainer, texts = sample_trainer()
    lm._sample_prompt = torch.randint(0, 20, (1, prompt))
    lm._log_sample()
    if not length:
        assert texts == []
        return
    want = lm.model.generate(lm._sample_prompt, length)[0].tolist()
    assert texts == [("samples", f"**prompt:** {' '.join(map(str, want[:prompt]))!r}\n\n"
                                 f"**continuation (greedy):** {' '.join(map(str, want[prompt:]))!r}", 3)]
    assert len(want) == prompt + length


@pytest.mark.parametrize("case", ["no-tokens", "no-prompt", "not-global-zero", "no-decode", "no-text-logger"])
def test_no_validation_sample_is_written_where_one_cannot_or_should_not_be(case):
    lm = LanguageModel(16, "AM", vocab_size=20, sample_tokens=0 if case == "no-tokens" else 8)
    lm._trainer, texts = sample_trainer(**{
        "not-global-zero": {"is_global_zero": False},
        "no-decode": {"datamodule": SimpleNamespace()},
        "no-text-logger": {"loggers": [SimpleNamespace(experiment=SimpleNamespace())]}}.get(case, {}))
    lm._sample_prompt = None if case == "no-prompt" else torch.randint(0, 20, (1, 8))
    lm.model.generate = lambda *args, **kwargs: pytest.fail("sampled")
    lm._log_sample()
    assert texts == []


def test_the_sample_prompt_is_the_first_validation_batchs_first_row_taken_once():
    lm = LanguageModel(16, "AM", vocab_size=20)
    lm._evaluate = lambda batch, stage: None
    first, second = torch.randint(0, 20, (2, 40)), torch.randint(0, 20, (2, 40))
    lm.validation_step({"input_ids": second}, 1)  # (not the first batch)
    assert lm._sample_prompt is None
    lm.validation_step({"input_ids": first}, 0)
    lm.validation_step({"input_ids": second}, 0)  # (the next validation's first batch: the same prompt is kept)
    assert torch.equal(lm._sample_prompt, first[:1, :32])


def test_a_fits_validation_records_its_loss_and_logs_the_final_and_best_while_other_validations_record_nothing():
    lm = LanguageModel(16, "AM", vocab_size=20)
    logged, sampled = [], []
    lm.log = lambda name, value, **kwargs: logged.append((name, value))
    lm._log_sample = lambda: sampled.append(True)
    state = SimpleNamespace(fn="fit")
    lm._trainer = SimpleNamespace(sanity_checking=False, state=state, global_step=5)
    lm.on_validation_epoch_end()  # nothing validated yet (limit_val_batches 0): nothing to record
    for step, loss in ((5, 2.5), (9, 3.5)):
        lm.val_loss.reset()
        lm.val_loss.update(torch.tensor(loss))
        lm.val_acc.update(torch.eye(20)[:4], torch.tensor([0, 1, 2, 9]))
        lm._trainer.global_step = step
        lm.on_validation_epoch_end()
    assert lm.history["val"] == [(5, 2.5), (9, 3.5)] and lm.history["val_acc"] == [(5, 0.75), (9, 0.75)]
    assert logged == [("hp/final_val_loss", 2.5), ("hp/best_val_loss", 2.5), ("hp/final_val_loss", 3.5),
                      ("hp/best_val_loss", 2.5)] and len(sampled) == 2
    for trainer in (SimpleNamespace(sanity_checking=True, state=state, global_step=9),
                    SimpleNamespace(sanity_checking=False, state=SimpleNamespace(fn="validate"), global_step=9)):
        lm._trainer = trainer
        lm.on_validation_epoch_end()
    assert len(lm.history["val"]) == 2 and len(logged) == 4 and len(sampled) == 2


def test_tensor_names_in_a_message_gather_each_blocks_mixer_and_stop_at_the_limit():
    from recipes.module import _names

    assert _names([]) == "none"
    assert _names(["blocks.3.sequence_mixer.q.weight", "blocks.3.sequence_mixer.k.weight", "embedding.weight",
                   "blocks.1.norm", "blocks.0.state_mixer.w1.weight"]) == (
        "blocks.3.sequence_mixer.* (2), embedding.weight, blocks.1.norm, blocks.0.state_mixer.w1.weight")
    assert _names(["blocks.1.norm", "blocks.1.norm.weight", "embedding.x.y.z", "embedding.x.y.w"]) == (
        "blocks.1.norm, blocks.1.norm.weight, embedding.x.y.z, embedding.x.y.w")  # (only a block's parts gather)
    names = [f"head{i}.weight" for i in range(10)]
    assert _names(names) == ", ".join(names[:8]) + " and 2 more"
    assert _names(names, limit=10) == ", ".join(names)


def test_the_hyperparameters_tensorboard_compares_are_plain_values_one_per_binding():
    from recipes.module import comparable_hparams
    from recipes.optimizer import describe

    optimizer = {"class_path": "torch.optim.SGD", "init_args": {"momentum": 0.9}}
    assert comparable_hparams({
        "optimizer": optimizer, "d_model": 16, "lr": 1e-3, "compile": False, "pattern": "AM", "size_to": None,
        "mixers": {"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2, "positions": "rope"}},
                   "M": {"class_path": "components.MLP"}},
        "betas": [0.9, 0.98], "schedule_note": {"a": 1},
    }) == {"optimizer": describe(optimizer), "d_model": 16, "lr": 1e-3, "compile": False, "pattern": "AM",
           "mixers/A": "QCAttention(n_heads=2, positions='rope')", "mixers/M": "MLP()", "betas": "[0.9, 0.98]",
           "schedule_note": "{'a': 1}"}
    assert describe(optimizer) != str(optimizer)


@pytest.mark.parametrize("compile, backend", [(True, "inductor"), ("aot_eager", "aot_eager"), (False, None)])
def test_compile_wraps_the_models_hidden_states_whole_at_static_shapes_with_the_backend_named(compile, backend,
                                                                                               monkeypatch):
    asked = []

    def compiled(function, **kwargs):
        asked.append((function, kwargs))
        return lambda *args, **kw: function(*args, **kw)

    monkeypatch.setattr(torch, "compile", compiled)
    lm = LanguageModel(16, "AM", vocab_size=20, compile=compile)
    if backend is None:
        assert asked == [] and lm._hidden_states == lm.model.hidden_states
        return
    assert asked == [(lm.model.hidden_states, {"fullgraph": True, "dynamic": False, "backend": backend})]
    assert lm._hidden_states is not lm.model.hidden_states


def test_a_batch_with_nothing_labelled_leaves_the_evaluation_metrics_untouched():
    lm = LanguageModel(16, "AM", vocab_size=20).eval()
    lm.log = lambda *args, **kwargs: pytest.fail("logged")
    lm._evaluate({"input_ids": torch.randint(0, 20, (2, 5)), "labels": torch.full((2, 5), -100)}, "val")
    assert not lm.val_loss.update_called and not lm.val_ppl.update_called and not lm.val_acc.update_called


def test_one_expert_has_a_load_entropy_of_one_not_a_division_by_log_one():
    lm = LanguageModel(16, "AM", vocab_size=20)
    logged = {}
    lm.log = lambda name, value, **kwargs: logged.__setitem__(name, float(value))
    lm.model.expert_loads = lambda: {"blocks.2.state_mixer": torch.tensor([1.0]),
                                     "blocks.0.sequence_mixer": torch.tensor([0.5, 0.5])}
    lm._log_expert_loads()
    assert logged == {"moe/block2/load_entropy": 1.0, "moe/block2/max_over_mean_load": 1.0,
                      "moe/block0-seq/load_entropy": pytest.approx(1.0), "moe/block0-seq/max_over_mean_load": 1.0}


def test_the_busiest_experts_load_within_each_sequence_is_logged_averaged_over_the_sequences_with_tokens():
    """Where a MoE keeps each sequence's load: the busiest expert's share over the mean within each sequence, averaged
    over the sequences that have tokens (a row of zeros, padding alone, left out); and from a training step."""
    from functools import partial

    from components import RoutedMoE

    lm = LanguageModel(16, "AM", vocab_size=20)
    logged = {}
    lm.log = lambda name, value, **kwargs: logged.__setitem__(name, float(value))
    lm.model.expert_loads = lambda: {}
    lm.model.sequence_loads = lambda: {"blocks.1.state_mixer": torch.tensor([[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0],
                                                                             [0.0, 0.0, 0.0, 0.0]])}
    lm._log_expert_loads()
    assert logged == {"moe/block1/max_over_mean_load_per_sequence": 3.0}  # (2 and 4)
    lm = LanguageModel(16, "AR", {"R": partial(RoutedMoE, n_experts=4, top_k=1, d_ff=8)}, vocab_size=20)
    logged.clear()
    lm.log = lambda name, value, **kwargs: logged.__setitem__(name, float(value))
    lm.training_step({"input_ids": torch.randint(0, 20, (2, 6)), "labels": torch.randint(0, 20, (2, 6))}, 0)
    loads = lm.model.sequence_loads()["blocks.0.state_mixer"]
    assert logged["moe/block0/max_over_mean_load_per_sequence"] == pytest.approx(float(loads.max(dim=1).values.mean() * 4))
    assert logged["moe/block0/max_over_mean_load_per_sequence"] >= logged["moe/block0/max_over_mean_load"] - 1e-6


def fit_trainer(**changes):
    """A stand-in trainer for ``setup``: what it reads, at values that pass."""
    from lightning.pytorch.accelerators import CPUAccelerator

    trainer = SimpleNamespace(datamodule=None, gradient_clip_val=None, accumulate_grad_batches=1,
                              val_check_interval=200, is_global_zero=True, callbacks=[], accelerator=CPUAccelerator(),
                              precision="32-true")
    vars(trainer).update(changes)
    return trainer


def test_setup_takes_a_clip_of_zero_and_notes_an_interval_counted_in_batches_only_when_fitting_with_accumulation(
        capsys):
    lm = LanguageModel(16, "AM", vocab_size=20)
    for changes in ({"gradient_clip_val": 0}, {"gradient_clip_val": 1.0}, {"accumulate_grad_batches": 1},
                    {"accumulate_grad_batches": 3, "val_check_interval": 0.5},
                    {"accumulate_grad_batches": 3, "is_global_zero": False}):
        lm._trainer = fit_trainer(**changes)
        lm.setup("fit")
    lm._trainer = fit_trainer(accumulate_grad_batches=3)
    lm.setup("validate")
    assert capsys.readouterr().err == ""
    lm.setup("fit")
    assert capsys.readouterr().err == (
        "note: val_check_interval=200 counts batches, not optimizer steps: with accumulate_grad_batches=3 validation "
        "runs every 66.6667 steps; --trainer.val_check_interval 600 validates every 200 steps\n")
    lm._trainer = fit_trainer(gradient_clip_val=-0.5)
    with pytest.raises(ValueError, match=r"gradient_clip_val=-0.5 must be >= 0 \(0 or null: no clipping\)"):
        lm.setup("fit")


def test_a_resumed_fit_takes_back_the_checkpoints_random_states_and_step_and_other_loads_leave_them():
    from recipes.training import rng_states

    lm = LanguageModel(16, "AM", vocab_size=20)
    torch.manual_seed(5)
    states = rng_states()
    expected = torch.rand(3)
    for fn in ("validate", "fit"):
        torch.manual_seed(123)
        lm._trainer = SimpleNamespace(state=SimpleNamespace(fn=fn), datamodule=None, callbacks=[])
        lm.on_load_checkpoint({"state_dict": lm.state_dict(), "rng_states": states, "global_step": 7,
                               "schedule_steps": 40})
        drawn = torch.rand(3)
        assert torch.equal(drawn, expected) == (fn == "fit")  # (loading weights to score them draws on)
    assert lm.history["first_step"] == 7 and lm._resumed_schedule_steps == 40


def test_tokens_per_second_are_measured_over_each_logging_window_of_whole_steps(monkeypatch):
    import recipes.module

    clock = [0.0]
    monkeypatch.setattr(recipes.module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    lm = LanguageModel(16, "AM", vocab_size=20)
    lm._trainer = SimpleNamespace(accumulate_grad_batches=1, global_step=0, log_every_n_steps=2)
    lm.optimizers = lambda: SimpleNamespace(param_groups=[{"lr": 0.5}])
    logged, flops = [], []
    lm.log = lambda name, value, **kwargs: logged.append((name, value))
    lm._log_flops = flops.append
    batch = {"input_ids": torch.zeros(2, 8, dtype=torch.long)}
    for step in range(5):  # (the window opens at step 0; steps 2 and 4 close one, at 16 tokens a step)
        clock[0] = float(step)
        lm._trainer.global_step = step
        lm.on_train_batch_start(batch, step)
        lm.on_train_batch_end(None, batch, step)
    assert [value for name, value in logged if name == "train/tokens_per_sec"] == [16.0, 16.0] == flops
    assert lm.history["tokens_per_sec"] == [16.0, 16.0] and lm._window_length == 8
    assert [value for name, value in logged if name == "train/lr"] == [0.5] * 5


def test_muon_under_sharded_training_is_refused_before_the_optimizer_is_built():
    lm = LanguageModel(16, "AM", vocab_size=20, optimizer="Muon")
    lm._sharded = True
    with pytest.raises(ValueError, match="--model.optimizer Muon orthogonalises whole weight matrices, and sharded"):
        lm.configure_optimizers()


def test_wsd_takes_a_decay_phase_of_zero_which_holds_the_peak_to_the_end():
    from recipes.module import check_schedule

    assert check_schedule("wsd", 0.1, 0.0) == 0.0 and check_schedule("wsd", 0.1, None) == 0.2
    assert [warmup_stable_decay(step, 10, 0.2, 0.1, 0.0) for step in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, 1.0]


def test_init_from_a_checkpoint_that_fits_loads_every_tensor_and_says_so_in_a_line(tmp_path, capsys):
    torch.manual_seed(0)
    source = LanguageModel(16, "AM", vocab_size=20)
    path = tmp_path / "source.ckpt"
    torch.save({"state_dict": source.state_dict()}, path)
    model = LanguageModel(16, "AM", vocab_size=20, init_from=str(path))
    n = len(model.model.state_dict())
    assert capsys.readouterr().out == f"init_from: loaded {n} tensors from {path}\n"
    for name, value in model.model.state_dict().items():
        assert torch.equal(value, source.model.state_dict()[name])
    torch.save({"state_dict": {**source.state_dict(), "model.extra.weight": torch.ones(2)}}, path)
    with pytest.raises(ValueError, match=r"does not fit this model: shapes \[\], missing \[\], unexpected "
                                         r"\['extra.weight'\]"):
        LanguageModel(16, "AM", vocab_size=20, init_from=str(path))
    LanguageModel(16, "AM", vocab_size=20, init_from=str(path), init_from_strict=False)
    assert capsys.readouterr().out == (f"init_from: loaded {n} of the model's {n} tensors from {path}; initialised "
                                       "afresh: none; in the checkpoint but not loaded: extra.weight\n")


def test_init_from_an_untied_checkpoint_into_a_tied_model_is_refused_or_takes_the_embedding(tmp_path, capsys):
    # Both names held one tensor in the tied model: the untied checkpoint's head, copied last, became its embedding.
    torch.manual_seed(0)
    source = LanguageModel(16, "AM", vocab_size=20)
    path = tmp_path / "untied.ckpt"
    torch.save({"state_dict": source.state_dict()}, path)
    with pytest.raises(ValueError, match=r"has an embedding and a head of their own, and this model ties them "
                                         r"\(tie_embeddings=True\), so one of the two would be lost"):
        LanguageModel(16, "AM", vocab_size=20, tie_embeddings=True, init_from=str(path))
    capsys.readouterr()
    tied = LanguageModel(16, "AM", vocab_size=20, tie_embeddings=True, init_from=str(path), init_from_strict=False)
    assert tied.model.lm_head.weight is tied.model.embedding.weight
    assert torch.equal(tied.model.embedding.weight, source.model.embedding.weight)
    n = len(tied.model.state_dict())
    assert capsys.readouterr().out == (
        f"init_from: loaded {n - 1} of the model's {n} tensors from {path}; initialised afresh: none; in the checkpoint "
        "but not loaded: lm_head.weight (this model ties its head to its embedding: the head is the checkpoint's "
        "embedding)\n")
    torch.save({"state_dict": tied.state_dict()}, path)  # a tied checkpoint into a tied model, or an untied one: as is
    for tie in (True, False):
        again = LanguageModel(16, "AM", vocab_size=20, tie_embeddings=tie, init_from=str(path))
        assert torch.equal(again.model.lm_head.weight, source.model.embedding.weight)


def test_a_sharded_checkpoint_given_to_load_from_checkpoint_says_how_to_make_one_file_of_it(tmp_path):
    from recipes.checkpoints import CheckpointError

    folder = tmp_path / "last.ckpt"
    folder.mkdir()
    (folder / "meta.pt").write_bytes(b"")
    (folder / ".metadata").write_bytes(b"")  # (refused before either is read)
    with pytest.raises(CheckpointError, match=f"{re.escape(str(folder))} is a sharded checkpoint .* python -m "
                                              "recipes.consolidate"):
        LanguageModel.load_from_checkpoint(folder)


class HyperparameterLogger:
    """A logger as TensorBoard's takes the run's settings, with the metrics of its HPARAMS tab."""

    def __init__(self):
        self.got = []

    def log_hyperparams(self, params, metrics=None):
        self.got.append((params, metrics))


class SettingsOnlyLogger(HyperparameterLogger):
    """A logger as CSV's takes the run's settings: no metrics argument."""

    def log_hyperparams(self, params):
        self.got.append((params, None))


@pytest.mark.parametrize("compile, backend", [(True, "inductor"), ("aot_eager", "aot_eager")])
def test_the_start_of_a_fit_logs_the_settings_and_sizes_and_prints_the_summary_and_notes(compile, backend, capsys):
    from lightning.pytorch.callbacks import StochasticWeightAveraging

    lm = LanguageModel(16, "AM", vocab_size=20, compile=compile)
    lm.size_note = "sized to 10,000 parameters: d_ff 24"
    tensorboard, csv = HyperparameterLogger(), SettingsOnlyLogger()
    lm._trainer = SimpleNamespace(callbacks=[StochasticWeightAveraging(swa_lrs=0.1)], loggers=[tensorboard, csv],
                                  is_global_zero=True)
    lm.on_fit_start()
    (params, metrics), = tensorboard.got
    assert params["weight_averaging"] == "StochasticWeightAveraging" and params["n_params"] == lm.sizes["n_params"]
    assert params["mixers/A"].startswith("QCAttention(") and "sized_width" not in params  # (None: not sized)
    assert set(metrics) == {"hp/final_val_loss", "hp/best_val_loss"} and all(math.isnan(v) for v in metrics.values())
    assert csv.got == [(params, None)]
    out = capsys.readouterr().out
    assert out.startswith(lm.model.summary()) and "sized to 10,000 parameters: d_ff 24\n" in out
    assert f"compiling the model (torch.compile, fullgraph, backend {backend}): the first training step" in out
    lm._trainer = SimpleNamespace(callbacks=[], loggers=[tensorboard], is_global_zero=False)
    lm.on_fit_start()  # (another process: logs the same, prints nothing)
    assert "weight_averaging" not in tensorboard.got[-1][0] and capsys.readouterr().out == ""


def test_fsdp2_makes_a_unit_of_each_block_and_one_of_tied_embedding_and_head(tmp_path):
    """``configure_model`` under a (one-process) data-parallel mesh: the tied embedding and head share one unit (two
    would each own the one weight), untied ones are two; a second call shards nothing again."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))
        for tie in (True, False):
            lm = LanguageModel(16, "AM SM", vocab_size=20, max_seq_len=48, tie_embeddings=tie)
            lm._device_mesh, lm._trainer = mesh, SimpleNamespace(callbacks=[], strategy=SimpleNamespace())
            assert not lm._sharded
            lm.configure_model()
            model, unit = lm.model, (lambda module: module._get_fsdp_state())
            assert lm._sharded and len({unit(b) for b in model.blocks}) == len(model.blocks) == 2
            assert (unit(model.embedding) is unit(model.lm_head)) is tie
            assert unit(model.norm) not in {unit(model.embedding), unit(model.lm_head), *map(unit, model.blocks)}
            units = [unit(m) for m in (model.embedding, model.norm, model.lm_head, *model.blocks)]
            lm.configure_model()
            assert units == [unit(m) for m in (model.embedding, model.norm, model.lm_head, *model.blocks)]
    finally:
        dist.destroy_process_group()


def test_the_peak_is_the_datasheets_for_the_cuda_device_name_and_the_runs_precision(monkeypatch):
    from recipes.mfu import device_peak_flops

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_peak_flops("cuda:0", "bf16-mixed") is None  # no CUDA here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device_peak_flops("cpu", "bf16-mixed") is None  # a CPU has no entry
    name = "NVIDIA H100 PCIe"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: name)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for name, precision, allow_tf32, peak in (
                ("NVIDIA H100 PCIe", "bf16-mixed", False, 756e12),  # not the SXM figure "H100" also matches
                ("NVIDIA H100 80GB HBM3", "16-mixed", False, 989e12),
                ("NVIDIA L40S", "32-true", True, 183e12),  # fp32 through TF32
                ("NVIDIA L40S", "32-true", False, 91.6e12),
                ("NVIDIA L4", "bf16-true", False, 121e12),
                ("Tesla T4", "bf16-mixed", False, None)):
            torch.backends.cuda.matmul.allow_tf32 = allow_tf32
            assert device_peak_flops(torch.device("cuda", 0), precision) == peak, (name, precision)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def test_a_fit_steps_the_balancing_bias_once_per_optimizer_step_after_the_steps_forwards(monkeypatch, tmp_path):
    """DeepSeek-V3's auxiliary-loss-free balancing under Lightning: with two micro-batches a step, three steps call
    the model's balance step three times, each after both micro-batches' forwards were tallied."""
    import lightning as L
    from torch.utils.data import DataLoader

    moe = {"class_path": "components.ComposedMoE", "init_args": {
        "router": {"class_path": "components.SigmoidRouter", "init_args": {"n_experts": 4, "top_k": 1, "balance_rate": 0.1}},
        "experts": {"class_path": "components.state.MLPExperts", "init_args": {"n_experts": 4, "d_ff": 8}}}}
    lm = LanguageModel(16, "AM -E", {"E": moe}, vocab_size=20)
    router = lm.model.blocks[1].state_mixer.router
    tallies = []
    original = HybridLM.update_routing_balance

    def counted(self):
        tallies.append(router.load_tally.sum().item())  # each forward's load sums to 1
        original(self)

    monkeypatch.setattr(HybridLM, "update_routing_balance", counted)
    torch.manual_seed(0)
    batches = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 20, (6, 2, 9))]
    trainer = L.Trainer(max_steps=3, accumulate_grad_batches=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
                        default_root_dir=tmp_path)
    trainer.fit(lm, DataLoader(batches, batch_size=None))
    assert tallies == [pytest.approx(2.0)] * 3
    steps = router.balance_bias / 0.1  # whole steps of the rate, at most three of them, not all zero
    torch.testing.assert_close(steps, steps.round())
    assert steps.abs().max() <= 3 and steps.abs().sum() > 0
