"""The optimiser a recipe names (``--model.optimizer``, recipes/optimizer.py): the run trains with that class, keeps the
zoo's two parameter groups and its warm-up-cosine schedule, records the spec, resumes and reloads; Lightning's own
``--optimizer`` (which would replace both) and arguments the zoo owns are refused by name."""

import copy
import io
import math
import re
import sys
import types

import pytest
import torch
import yaml

from components import MLP, SSD, GatedDeltaNet, QCAttention, ShortConv
from recipes import LanguageModel
from recipes.cli import main
from recipes.module import warmup_cosine
from recipes.optimizer import MuonWithAdamW, fused_row_blocks

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
    main([*TINY, "--model.optimizer", SGD, "--trainer.max_steps", "7", "--ckpt_path", "last"])  # named again: the same
    _, resumed = last_checkpoint(tmp_path)
    assert resumed["global_step"] == 7 and all(g["momentum"] == 0.9 for g in resumed["optimizer_states"][0]["param_groups"])
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


def test_adamw_named_is_the_default_adamw_with_the_zoos_betas_and_eps(tmp_path, monkeypatch):
    """``--model.optimizer AdamW`` (comparing optimisers, say) trained with torch's defaults, betas (0.9, 0.999) and
    eps 1e-8, where the default AdamW has (0.9, 0.98) and 1e-6: naming it changed it."""
    from recipes.optimizer import build_optimizer, optimizer_spec

    def groups(optimizer, betas_or_eps_set=False, betas=(0.9, 0.98), eps=1e-6):
        spec = optimizer_spec(optimizer, weight_decay=0.1, betas_or_eps_set=betas_or_eps_set)
        built = build_optimizer(spec, torch.nn.Linear(3, 2).parameters(), [], lr=0.01, weight_decay=0.1,
                                betas=betas, eps=eps)
        return [(tuple(g["betas"]), g["eps"], g["weight_decay"]) for g in built.param_groups]

    assert groups("AdamW") == groups(None) == [((0.9, 0.98), 1e-6, 0.1), ((0.9, 0.98), 1e-6, 0.0)]
    assert groups("AdamW", True, (0.8, 0.9), 1e-8)[0] == ((0.8, 0.9), 1e-8, 0.1)  # --model.betas/eps taken
    assert groups({"class_path": "AdamW", "init_args": {"betas": [0.8, 0.95]}})[0] == ((0.8, 0.95), 1e-6, 0.1)
    with pytest.raises(ValueError, match="AdamW: betas and eps given twice"):
        groups({"class_path": "AdamW", "init_args": {"eps": 1e-8}}, True, (0.8, 0.9))
    monkeypatch.chdir(tmp_path)  # the same run, bit for bit, through the command line
    main([*TINY, "--trainer.max_steps", "2", "--trainer.logger.init_args.name", "default"])
    main([*TINY, "--trainer.max_steps", "2", "--trainer.logger.init_args.name", "named", "--model.optimizer", "AdamW"])
    default, named = (torch.load(next(tmp_path.glob(f"runs/{n}/version_0/checkpoints/last.ckpt")), weights_only=True)
                      for n in ("default", "named"))
    for key, value in default["state_dict"].items():
        assert torch.equal(value, named["state_dict"][key]), key


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
    with pytest.raises(SystemExit, match="--model.optimizer .*'torch.optim.Adam'.* \\(the checkpoint has .*torch.optim.SGD"):
        main([*TINY, "--model.optimizer", "Adam", "--trainer.max_steps", "4", "--ckpt_path", "last"])


def two_models(seed: int = 0):
    """Two copies of a small model with matrices and vectors, and a fixed gradient for each of three steps."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 4))
    twin = copy.deepcopy(model)
    grads = [[torch.randn_like(p) for p in model.parameters()] for _ in range(3)]
    return model, twin, grads


def stepped(optimizers, models, grads):
    for step in grads:
        for model in models:
            for p, g in zip(model.parameters(), step):
                p.grad = g.clone()
        for optimizer in optimizers:
            optimizer.step()


def test_muon_with_adamw_is_muon_on_its_matrices_and_adamw_on_the_rest():
    model, twin, grads = two_models()
    first, norm_w, norm_b, last = model[0].weight, model[1].weight, model[1].bias, model[2].weight
    rest = [model[0].bias, norm_w, norm_b, model[2].bias]
    joined = MuonWithAdamW([{"params": [first, last], "weight_decay": 0.1}],
                           [{"params": rest, "weight_decay": 0.0}], lr=0.02, betas=(0.9, 0.95), eps=1e-8,
                           muon_args={"momentum": 0.9})
    t = list(twin.parameters())  # the same order: 0.weight, 0.bias, 1.weight, 1.bias, 2.weight, 2.bias
    alone = [torch.optim.Muon([{"params": [t[0], t[4]], "weight_decay": 0.1}], lr=0.02, momentum=0.9,
                              adjust_lr_fn="match_rms_adamw"),
             torch.optim.AdamW([{"params": [t[1], t[2], t[3], t[5]], "weight_decay": 0.0}], lr=0.02, betas=(0.9, 0.95),
                               eps=1e-8)]
    stepped([joined], [model], grads)
    stepped(alone, [twin], grads)
    for ours, theirs in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert len(joined.state) == 6 and set(joined.state[first]) == {"momentum_buffer"}
    assert {"exp_avg", "exp_avg_sq"} <= set(joined.state[norm_w])
    joined.state[norm_w] = {k: v.clone() for k, v in joined.state[norm_w].items()}  # as Lightning moves it to a device
    assert norm_w in joined.adamw.state and norm_w not in joined.muon.state and len(joined.state) == 6


def test_muon_with_adamw_resumes_from_its_state_dict_as_if_never_stopped():
    model, twin, grads = two_models(1)

    def build(m):
        return MuonWithAdamW([{"params": [m[0].weight, m[2].weight], "weight_decay": 0.1}],
                             [{"params": [m[0].bias, m[1].weight, m[1].bias, m[2].bias], "weight_decay": 0.0}], lr=0.01)

    straight = build(model)
    stepped([straight], [model], grads)
    stopped = build(twin)
    stepped([stopped], [twin], grads[:2])
    saved = io.BytesIO()
    torch.save(stopped.state_dict(), saved)  # as a checkpoint holds it, read back as data only
    resumed = build(twin)
    resumed.load_state_dict(torch.load(io.BytesIO(saved.getvalue()), weights_only=True))
    schedule = torch.optim.lr_scheduler.LambdaLR(resumed, lambda step: 1.0)  # a schedule drives both halves
    stepped([resumed], [twin], grads[2:])
    for ours, theirs in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    schedule.base_lrs = [0.5 * lr for lr in schedule.base_lrs]
    schedule.step()
    assert [g["lr"] for g in resumed.muon.param_groups + resumed.adamw.param_groups] == [0.005, 0.005]
    with pytest.raises(ValueError, match="not Muon-with-AdamW's"):
        resumed.load_state_dict(torch.optim.SGD(model.parameters(), lr=0.1).state_dict())


def test_a_recipe_trains_with_muon_on_the_blocks_linear_weights_and_adamw_on_the_rest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    common = ["fit", "--config", "arch/tiny/jamba.yaml", "--model.d_model", "32", "--data.init_args.seq_len", "16",
              "--data.init_args.batch_size", "2", "--trainer.limit_val_batches", "2", "--trainer.val_check_interval",
              "2", "--trainer.enable_progress_bar", "false", "--model.optimizer", "Muon"]
    cli = main([*common, "--trainer.max_steps", "3"])
    (path,) = tmp_path.glob("runs/**/last.ckpt")
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["hyper_parameters"]["optimizer"] == {"class_path": "torch.optim.Muon", "init_args": {}}
    (state,) = checkpoint["optimizer_states"]
    linears = [m for m in cli.model.model.blocks.modules() if isinstance(m, torch.nn.Linear)]
    assert len(state["muon"]["state"]) == len(linears) > 0  # every block's linear weight, and nothing else
    assert all(set(s) == {"momentum_buffer"} for s in state["muon"]["state"].values())
    adamw = sum(p.requires_grad for p in cli.model.parameters()) - len(linears)
    assert len(state["adamw"]["state"]) == adamw  # embeddings, head, vectors, expert banks, the convolution
    assert state["muon"]["param_groups"][0]["adjust_lr_fn"] == "match_rms_adamw"
    fused = {id(weight): rows for weight, rows in fused_row_blocks(cli.model.model.blocks)}
    assert cli.trainer.optimizers[0].row_blocks == fused  # fused projections stepped as such
    assert {len(rows) for rows in fused.values()} >= {2, 4}  # the MLP's [W | V], the SSD's [X | B | C | Δ] among them
    rates = [g["lr"] for half in ("muon", "adamw") for g in state[half]["param_groups"]]
    assert len(set(rates)) == 1 and rates[0] == pytest.approx(cli.model.hparams.lr * warmup_cosine(3, 3, 0.1, 0.1))
    main([*common, "--trainer.max_steps", "5", "--ckpt_path", "last"])
    assert torch.load(path, weights_only=True)["global_step"] == 5


def test_muon_is_refused_under_sharded_training():
    lm = LanguageModel(16, "AM", vocab_size=20, optimizer="Muon")
    lm._sharded = True  # as configure_model leaves it under FSDP2
    with pytest.raises(ValueError, match="Muon orthogonalises whole weight matrices, and sharded training"):
        lm.configure_optimizers()


def test_a_learning_rate_finder_sets_the_peak_of_the_schedule_and_its_steps_stay_out_of_the_run(tmp_path, monkeypatch,
                                                                                                  capsys):
    """Lightning's LearningRateFinder writes its suggestion into ``hparams.lr`` and the groups' current rate; the
    schedule's next step put the old peak back, so the run trained at the recipe's rate while its checkpoints and
    hparams.yaml said the finder's. Its hundred steps' validations also entered the end-of-fit summary."""
    monkeypatch.chdir(tmp_path)
    finder = ["--trainer.callbacks+=LearningRateFinder", "--trainer.callbacks.num_training_steps=20"]
    cli = main([*TINY, *finder, "--trainer.max_steps", "4"])
    found = cli.model.hparams.lr
    assert found != 0.05 and f"note: lr {found:.3g} (the learning-rate finder's)" in capsys.readouterr().err
    path, checkpoint = last_checkpoint(tmp_path)
    assert checkpoint["hyper_parameters"]["lr"] == found
    assert checkpoint["lr_schedulers"][0]["base_lrs"] == [found, found]
    rate = found * warmup_cosine(4, 4, 0.1, 0.1)  # the schedule after 4 of 4 steps, peaking at the finder's rate
    assert all(math.isclose(g["lr"], rate, rel_tol=1e-6) for g in checkpoint["optimizer_states"][0]["param_groups"])
    assert yaml.safe_load((path.parents[1] / "hparams.yaml").read_text())["lr"] == found
    assert [step for step, _ in cli.model.history["val"]] == [2, 4]  # the run's validations, not the finder's

    main([*TINY, *finder, "--trainer.max_steps", "6", "--ckpt_path", "last"])  # the same command, resumed
    err = capsys.readouterr().err
    assert "LearningRateFinder not run again: the run goes on with the learning rate" in err
    assert "--model.lr 0.05 is the rate the learning-rate finder replaced" in err  # (not refused as a contradiction)
    assert "the recipe says" not in err  # (nor named as a recipe's edit set aside)
    _, resumed = last_checkpoint(tmp_path)
    assert resumed["global_step"] == 6 and resumed["hyper_parameters"]["lr"] == found
    assert resumed["lr_schedulers"][0]["base_lrs"] == [found, found]


def test_a_batch_size_finder_is_refused_on_a_cpu(tmp_path, monkeypatch):
    """It doubles the batch until a step fails for memory: on a CPU the process is swapped or killed first."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="BatchSizeFinder doubles the batch .* on a CPU .*--data.init_args.batch_size"):
        main([*TINY, "--trainer.callbacks+=BatchSizeFinder", "--trainer.max_steps", "2"])


def test_a_resume_drops_both_tuners_and_says_what_the_run_goes_on_with(capsys):
    """On a resume Lightning runs its tuners before it restores the run; the GPU-only BatchSizeFinder is dropped like
    the learning-rate finder (a CPU refuses it before this point, so only this unit test reaches it there)."""
    from lightning.pytorch.callbacks import BatchSizeFinder, EarlyStopping, LearningRateFinder

    from recipes.cli import without_tuners

    keep = EarlyStopping(monitor="val/loss")
    assert without_tuners([BatchSizeFinder(), keep, LearningRateFinder()]) == [keep]
    note = capsys.readouterr().err
    assert ("note: resuming: BatchSizeFinder, LearningRateFinder not run again: the run goes on with the batch size its "
            "configuration gives (--data.init_args.batch_size N keeps the one the finder chose) and the learning rate "
            "its checkpoint records") in note
    assert without_tuners([keep]) == [keep] and capsys.readouterr().err == ""


@pytest.mark.parametrize("nesterov, adjust_lr_fn", [(True, "match_rms_adamw"), (False, "original")])
def test_a_fused_weight_steps_as_the_projections_it_fuses(nesterov, adjust_lr_fn):
    """Muon on a weight declared as three projections (rows 3, 9 and 2 of 14, the middle one taller than wide) equals
    torch's Muon on the three matrices held apart: each orthogonalised and scaled as the matrix it is."""
    torch.manual_seed(0)
    fused = torch.nn.Parameter(torch.randn(14, 6))
    apart = [torch.nn.Parameter(block.clone()) for block in fused.detach().split([3, 9, 2])]
    grads = [torch.randn(14, 6) for _ in range(3)]
    args = {"momentum": 0.9, "nesterov": nesterov, "adjust_lr_fn": adjust_lr_fn}
    unused = [{"params": [torch.nn.Parameter(torch.zeros(6))]}]  # (AdamW's half, with no gradient: not stepped)
    ours = MuonWithAdamW([{"params": [fused], "weight_decay": 0.1}], unused, lr=0.02, muon_args=args,
                         row_blocks=[(fused, (3, 9, 2))])
    theirs = torch.optim.Muon([{"params": apart, "weight_decay": 0.1}], lr=0.02, **args)
    for grad in grads:
        fused.grad = grad.clone()
        for block, part in zip(apart, grad.split([3, 9, 2])):
            block.grad = part.clone()
        ours.step()
        theirs.step()
    torch.testing.assert_close(fused.detach(), torch.cat([block.detach() for block in apart]), rtol=0, atol=0)


def mixers_with_fused_weights():

    # (mixer, its declared layout, the blocks whose zeroed rows make its output zero)
    return [(MLP(32, d_ff=24), {"in_proj.weight": (24, 24)}, {0, 1}),  # act(x W) ⊙ x V
            (MLP(32, activation="swisig", d_ff=20), {"in_proj.weight": (20, 20)}, {0}),  # act(x W) ⊙ σ(x V)
            (MLP(32, activation="gelu"), {}, set()),
            (QCAttention(32, n_heads=4, n_kv_heads=2), {"kv_proj.weight": (16, 16)}, {1}),  # keys, then values
            # [X | B | C | Δ]: no X, B or C, no output; Δ = softplus(0 + dt_bias) still moves
            (SSD(32, head_dim=8, d_state=8, n_groups=2, chunk_size=4), {"in_proj.weight": (32, 16, 16, 4)}, {0, 1, 2}),
            (SSD(32, head_dim=8, d_state=8, chunk_size=4, gate=True), {"in_proj.weight": (32, 8, 8, 4, 32)},
             {0, 1, 2, 4}),  # [X | B | C | Δ | z]: ... or no gate z
            # through a convolution with a bias (and D·x), only the gate's zero silences
            (SSD(32, head_dim=8, d_state=8, chunk_size=4, conv=True, gate=True), {"in_proj.weight": (32, 8, 8, 4, 32)},
             {4}),
            # Falcon-H1's gate forms: without a norm, and after one — z still fused, still the gate
            (SSD(32, head_dim=8, d_state=8, chunk_size=4, conv=True, gate=True, gate_rms_norm=False),
             {"in_proj.weight": (32, 8, 8, 4, 32)}, {4}),
            (SSD(32, head_dim=8, d_state=8, chunk_size=4, conv=True, gate=True, norm_before_gate=True),
             {"in_proj.weight": (32, 8, 8, 4, 32)}, {4}),
            (ShortConv(32), {"in_proj.weight": (32, 32, 32)}, {0, 1, 2}),  # (c ⊙ conv(b ⊙ h)): any of the three
            # [q | k | v | z | β | a]: no query, key, value or gate, no output; β = σ(0) and the decay still move
            (GatedDeltaNet(32, head_dim=8), {"in_proj.weight": (32, 32, 32, 32, 4, 4)}, {0, 1, 2, 3}),
            (GatedDeltaNet(32, head_dim=8, gate=False, allow_neg_eigval=True), {"in_proj.weight": (32, 32, 32, 4, 4)},
             {0, 1, 2})]


@pytest.mark.parametrize("index", range(12))
def test_each_fused_projection_is_declared_as_the_forward_splits_it(index):
    """The layout each mixer declares (``fused_row_blocks``) is the one its forward reads: zeroing one declared
    block's rows silences the output exactly for the blocks the mixer's formula says."""
    from components.context import Context
    from components.rotary import RotaryEmbedding

    mixer, expected, silencing = mixers_with_fused_weights()[index]
    assert mixer.fused_row_blocks() == expected
    assert [(w.shape, rows) for w, rows in fused_row_blocks(mixer)] == [
        (mixer.get_parameter(name).shape, rows) for name, rows in expected.items()]
    if not expected:
        return
    ((name, rows),) = expected.items()
    x = torch.randn(2, 7, 32)
    context = Context(position_ids=torch.arange(7).expand(2, 7), rotary=RotaryEmbedding(16))
    weight = mixer.get_parameter(name)
    starts = [sum(rows[:i]) for i in range(len(rows))]
    for block, (start, count) in enumerate(zip(starts, rows)):
        with torch.no_grad():
            saved = weight[start:start + count].clone()
            weight[start:start + count] = 0
            y = mixer(x) if isinstance(mixer, MLP) else mixer(x, context)
            weight[start:start + count] = saved
        assert bool(y.abs().max() == 0) == (block in silencing), (block, y.abs().max())


def test_a_fused_layout_that_does_not_fit_its_weight_is_refused_by_name():
    class Mine(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 10, bias=False)

        def fused_row_blocks(self):
            return {"proj.weight": (4, 4)}

    with pytest.raises(ValueError, match=r"Mine.fused_row_blocks\(\): proj.weight \(10, 4\) does not split along its "
                                         r"rows into \(4, 4\)"):
        fused_row_blocks(torch.nn.Sequential(Mine()))
    for rows in ((10, 0), (11, -1), ()):  # the counts sum to its rows, but one is empty or negative, or there are none
        Mine.fused_row_blocks = lambda self, rows=rows: {"proj.weight": rows}
        with pytest.raises(ValueError, match="does not split along its rows"):
            fused_row_blocks(Mine())
    Mine.fused_row_blocks = lambda self: {"proj.weight": (1, 9)}  # a projection of one row is one
    mine = Mine()
    [(weight, rows)] = fused_row_blocks(mine)
    assert weight is mine.proj.weight and rows == (1, 9)

    class Bank(torch.nn.Module):  # a [E, d, f] tensor is not one matrix of rows
        def __init__(self):
            super().__init__()
            self.experts = torch.nn.Parameter(torch.zeros(2, 4, 3))

        def fused_row_blocks(self):
            return {"experts": (1, 1)}

    with pytest.raises(ValueError, match=r"Bank.fused_row_blocks\(\): experts \(2, 4, 3\) does not split"):
        fused_row_blocks(Bank())


def test_newton_schulz_leaves_its_input_alone_and_muon_skips_a_matrix_without_a_gradient():
    """A bf16 momentum buffer is not divided in place by the iteration's normalisation; a hidden matrix that took no
    gradient this step (an unused block) is not stepped, its state not made; ``step(closure)`` returns the loss."""
    from recipes.optimizer import newton_schulz

    buffer = torch.randn(4, 6, dtype=torch.bfloat16)
    before = buffer.clone()
    out = newton_schulz(buffer, (3.4445, -4.775, 2.0315), 5, 1e-7)
    assert torch.equal(buffer, before) and out.shape == (4, 6)
    used, idle = torch.nn.Parameter(torch.randn(4, 6)), torch.nn.Parameter(torch.randn(4, 6))
    idle_before = idle.detach().clone()
    joined = MuonWithAdamW([{"params": [used, idle], "weight_decay": 0.1}], [{"params": []}], lr=0.02)
    used.grad = torch.randn(4, 6)
    assert joined.step(lambda: torch.tensor(2.5)) == 2.5
    assert torch.equal(idle.detach(), idle_before) and idle not in joined.state and used in joined.state


def test_an_optimiser_spec_takes_what_the_class_accepts_and_describes_itself(monkeypatch):
    from recipes.optimizer import describe, optimizer_spec, recorded_form

    class Keywords(torch.optim.SGD):  # **kwargs: any argument may be meant for it
        def __init__(self, params, lr=0.1, **kwargs):
            super().__init__(params, lr=lr, momentum=kwargs.pop("momentum", 0.0))

    class NoDecay(torch.optim.Optimizer):
        def __init__(self, params, lr=0.1):
            super().__init__(params, {"lr": lr})

    module = types.ModuleType("my_optimizers")  # (a user's package, importable by the dotted path a spec records)
    for cls in (Keywords, NoDecay):
        cls.__module__, cls.__qualname__ = module.__name__, cls.__name__
        setattr(module, cls.__name__, cls)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    path = "my_optimizers.{}"
    spec = optimizer_spec({"class_path": path.format("Keywords"), "init_args": {"momentum": 0.5, "dampening": 0}},
                          weight_decay=0.1, betas_or_eps_set=False)
    assert spec["init_args"] == {"momentum": 0.5, "dampening": 0}
    assert optimizer_spec(path.format("NoDecay"), weight_decay=0.0, betas_or_eps_set=False)["init_args"] == {}
    with pytest.raises(ValueError, match="NoDecay takes no weight_decay, and --model.weight_decay is 0.1"):
        optimizer_spec(path.format("NoDecay"), weight_decay=0.1, betas_or_eps_set=False)
    for bad in ({"init_args": {"momentum": 0.9}}, {"class_path": "SGD", "lr": 0.1}):
        with pytest.raises(ValueError, match=r"must be a class name \(SGD\), a dotted path, or"):
            recorded_form(bad)
    assert describe(None) == "AdamW"
    assert describe(recorded_form({"class_path": "SGD", "init_args": {"momentum": 0.9}})) == "SGD(momentum=0.9)"
    assert describe({"class_path": "torch.optim.Muon", "init_args": {"nesterov": False}}) == \
        "Muon with AdamW(nesterov=False)"
