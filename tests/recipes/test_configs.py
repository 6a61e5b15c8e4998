"""Every bundled recipe parses, builds its model and data, and records hyper-parameters that rebuild it
through the CLI; one recipe of each family trains a step, checkpoints, and reloads from the checkpoint
(``validate --ckpt_path last`` and ``load_from_checkpoint``)."""

import copy
import math

import pytest
import torch

from recipes import LanguageModel
from recipes.cli import main
from recipes.recipe_files import CONFIG_DIR, bundled_configs
from recipes.corpora import write_sample

QUICK = ["--trainer.enable_progress_bar", "false", "--data.init_args.batch_size", "2",
         "--data.init_args.num_workers", "0", "--trainer.limit_val_batches", "2",  # ("1" would parse as 1.0: all)
         "--trainer.num_sanity_val_steps", "0"]
# One recipe per family (folder), the cheapest that still has the family's mixers.
REPRESENTATIVES = ["quickstart.yaml", "quickstart_bpe.yaml", "ablate_moe.yaml", "positions/hybrid_conv.yaml", "attention/ssd_ifa_mask.yaml",
                   "moe_placement/alternate.yaml", "moe_shared/cdmoe.yaml", "mqar/ifa_mask.yaml",
                   "mqar/paper/ssd_T256.yaml", "arch/tiny/otce.yaml",
                   "expresser/otce_expresser.yaml", "mqar_grid/ssd_T64_d16.yaml", "english/positions/hybrid_rope.yaml",
                   "mqar_puzzle/shift.yaml", "english/transfer/finetune/otce_expresser.yaml",
                   "mqar_hard/ifa_mask_d32.yaml", "moe_balance/sigmoid_loss_free.yaml", "english/hybrid_layout/parallel_one.yaml",
                   "english/delta_rule/hybrid_gdn.yaml", "state_tracking/gdn_neg.yaml",
                   "english/gated_attention/gated_high_lr.yaml", "english/gated_attention_long/gated.yaml",
                   "english/norm_placement/olmo2.yaml", "english/delta_rule_lr/gdn_lr4x.yaml",
                   "english/moe_placement_lr/all_lr8x.yaml", "english/moe_shared_lr/cdmoe_lr4x.yaml",
                   "english/expresser_lr/otce_expresser_lr4x.yaml"]


def test_every_family_has_a_representative():
    families = {name.rsplit("/", 1)[0] if "/" in name else name for name in bundled_configs()}
    covered = {name.rsplit("/", 1)[0] if "/" in name else name for name in REPRESENTATIVES}
    # an English family is its byte-level family on TokenizedCorpus: one English representative stands for the
    # data module, the byte-level one for the mixers
    covered |= {f"english/{name}" for name in covered if any(r.startswith("english/") for r in REPRESENTATIVES)}
    covered.add("english/transfer/pretrain")  # its recipes are stage 2's but for what the pairing test below checks
    # The paper-size architectures are for GPUs; their tiny twins stand for them (tests/recipes/test_architectures.py).
    assert families - {"quickstart.yaml", "quickstart_bpe.yaml", "ablate_moe.yaml", "arch"} <= covered


@pytest.fixture(scope="module")
def recipes_folder(tmp_path_factory):
    """The working folder the recipes are built in, with what the English families read (data/english/), made small."""
    folder = tmp_path_factory.mktemp("recipes")
    write_sample(folder / "data" / "english")
    return folder


class Built(dict):
    """Bundled recipe name → its unrun LightningCLI, parsed and built on the ``meta`` device (no memory, no
    initialisation, even for the 1B recipes) in ``folder`` when first asked for, then kept: each test worker builds
    the recipes its own tests read (all of them at once took each worker 70-90 s)."""

    def __init__(self, folder):
        super().__init__()
        self.folder = folder

    def __missing__(self, name: str):
        if name not in bundled_configs():
            raise KeyError(name)
        with pytest.MonkeyPatch.context() as patch, torch.device("meta"):
            patch.chdir(self.folder)
            self[name] = main(["--config", name, *QUICK], run=False)
        return self[name]

    def __contains__(self, name) -> bool:
        return name in bundled_configs()


@pytest.fixture(scope="module")
def built(recipes_folder) -> Built:
    return Built(recipes_folder)


@pytest.mark.parametrize("name", bundled_configs())
def test_bundled_recipe_builds_and_its_hyperparameters_rebuild_it(name, built, recipes_folder, monkeypatch):
    monkeypatch.chdir(recipes_folder)  # the recipes' relative paths (data/english/) are read again
    cli = built[name]
    assert cli.trainer.gradient_clip_val == 1.0
    hparams = dict(cli.model.hparams)
    with torch.device("meta"):
        # What `--ckpt_path` does with a checkpoint's hyper-parameters: parse them into the recipe's config.
        config = cli.parser.parse_object({"model": copy.deepcopy(hparams)}, cli.config)  # (it converts in place)
        rebuilt = cli.parser.instantiate_classes(config).model
        for model in (rebuilt, LanguageModel(**hparams)):  # and what load_from_checkpoint does
            shapes = {k: v.shape for k, v in model.state_dict().items()}
            assert shapes == {k: v.shape for k, v in cli.model.state_dict().items()}
            assert str(model.model) == str(cli.model.model)


def family(built: dict, folder: str) -> dict:
    return {name.removeprefix(folder + "/").removesuffix(".yaml"): built[name] for name in bundled_configs()
            if name.startswith(folder + "/") and name.count("/") == folder.count("/") + 1}


def recipe_without(cli, *paths: str) -> dict:
    """The recipe's model and data settings with the named dotted paths removed: what must be equal."""
    config = {part: copy.deepcopy(cli.config[part].as_dict()) for part in ("model", "data", "trainer")}
    config["trainer"].pop("logger", None)
    for path in paths:
        *parents, leaf = path.split(".")
        node = config
        for key in parents:
            node = node.get(key, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(leaf, None)
    return config


@pytest.mark.parametrize("folder", ["moe_placement", "moe_shared", "expresser",
                                    "english/moe_placement", "english/moe_shared", "english/expresser",
                                    "english/hybrid_layout", "english/delta_rule",
                                    "english/gated_attention"])
def test_equal_parameter_families_land_on_their_total(built, folder):
    recipes = family(built, folder)
    assert len(recipes) >= 3
    # on the English corpus the target adds the embedding and head of its 4,096-token vocabulary
    target = 1_091_520 if folder.startswith("english/") else 600_000
    for name, cli in recipes.items():
        assert abs(cli.model.sizes["n_params"] - target) / target < 0.01, (name, cli.model.sizes)
    if folder.endswith("moe_shared"):  # active parameters close to the routed MoE's (docs/moe.md: within 7%)
        routed = recipes["routed"].model.sizes["n_active_params"]
        for name, cli in recipes.items():
            assert abs(cli.model.sizes["n_active_params"] - routed) / routed < 0.08, (name, cli.model.sizes)
            # The variants differ in how parameters are shared, not in their gated activation (SwiGLU),
            # except the one recipe that measures the activation alone.
            gates = {m.activation for m in cli.model.model.modules() if isinstance(getattr(m, "activation", None), str)}
            assert gates == ({"switanh", "swiglu"} if name == "routed_switanh" else {"swiglu"}), (name, gates)
    if folder.endswith("moe_placement"):  # more MoE blocks: narrower experts, fewer active parameters
        active = {name: cli.model.sizes["n_active_params"] for name, cli in recipes.items()}
        assert active["dense"] == max(active.values()) and active["all"] == min(active.values())


def test_the_balancing_family_differs_only_in_its_router_and_how_it_is_balanced(built):
    """Six recipes on ablate_moe's backbone and widths: a softmax router with Switch's loss over the batch, over each
    sequence, and without it; DeepSeek-V3's sigmoid router with its bias stepped (alone, and with its sequence-wise
    loss at α = 1e-4) and fixed; everything else, parameters and active ones included, equal."""
    recipes = family(built, "moe_balance")
    assert set(recipes) == {"softmax_aux", "softmax_sequence", "softmax_none", "sigmoid_loss_free", "sigmoid_sequence",
                            "sigmoid_none"}
    assert len({(cli.model.sizes["n_params"], cli.model.sizes["n_active_params"]) for cli in recipes.values()}) == 1
    assert abs(recipes["softmax_aux"].model.sizes["n_params"] - 600_000) / 600_000 < 0.01
    balancing = {}
    for name, cli in recipes.items():
        routers = {(type(m.router).__name__, getattr(m.router, "balance_rate", None), m.balance)
                   for m in cli.model.model.modules() if hasattr(m, "router")}
        (balancing[name],) = routers  # (one router configuration a recipe)
        balancing[name] += (cli.model.hparams.aux_loss_coef,)
    assert balancing == {"softmax_aux": ("TopKRouter", None, "batch", 0.01),
                         "softmax_sequence": ("TopKRouter", None, "sequence", 0.01),
                         "softmax_none": ("TopKRouter", None, "batch", 0.0),
                         "sigmoid_loss_free": ("SigmoidRouter", 1e-3, "batch", 0.0),
                         "sigmoid_sequence": ("SigmoidRouter", 1e-3, "sequence", 1e-4),
                         "sigmoid_none": ("SigmoidRouter", 0.0, "batch", 0.0)}
    keys = ("model.mixers.R", "model.aux_loss_coef")
    assert len({str(recipe_without(cli, *keys)) for cli in recipes.values()}) == 1


def test_the_transfer_stages_share_each_model_and_split_the_domains(built):
    """Stage 2 fine-tunes stage 1's model of the same name: the same model and batches, the held-out domain, a lower
    learning rate; each model is its English family's (the Expresser family's and the shared-MoE family's)."""
    from recipes.sweep.launch import family_settings

    pretrain, finetune = family(built, "english/transfer/pretrain"), family(built, "english/transfer/finetune")
    assert set(pretrain) == set(finetune) and len(pretrain) == 9
    assert family_settings(CONFIG_DIR / "english/transfer/finetune")["starts_from"] == "english/transfer/pretrain"
    stage_keys = ("model.lr", "data.init_args.domains", "trainer.max_steps", "trainer.val_check_interval")
    for name in pretrain:
        first, second = pretrain[name], finetune[name]
        assert recipe_without(first, *stage_keys) == recipe_without(second, *stage_keys), name
        held_out = set(second.config.data.init_args.domains)
        assert held_out == {"literature"} and not held_out & set(first.config.data.init_args.domains), name
        assert second.config.model.lr < first.config.model.lr, name
        source = next(built[f"english/{f}/{name}.yaml"] for f in ("expresser", "moe_shared")
                      if f"english/{f}/{name}.yaml" in built)
        assert recipe_without(source, "data.init_args.domains") == recipe_without(first, "data.init_args.domains"), name


@pytest.mark.parametrize("folder, varies", [
    ("positions", ["model.pattern", "model.mixers.S.init_args.conv", "model.mixers.S.init_args.rope", "model.mixers.A"]),
    ("english/positions", ["model.pattern", "model.mixers.S.init_args.conv", "model.mixers.S.init_args.rope",
                           "model.mixers.A"]),
    ("english/attention", ["model.pattern", "model.mixers.A", "model.mixers.I"]),
    ("mqar_puzzle", ["model.mixers.S", "model.lr", "trainer.max_steps", "trainer.val_check_interval",
                     "trainer.check_val_every_n_epoch"]),
    ("english/expresser", ["model.pattern", "model.mixers.O", "model.size_to.letters"]),
    ("english/hybrid_layout", ["model.pattern", "model.mixers.A", "model.mixers.P", "model.mixers.S"]),
    ("english/delta_rule", ["model.pattern", "model.mixers.A", "model.mixers.G", "model.mixers.S"]),
    ("english/gated_attention", ["model.mixers.A.init_args.output_gate", "model.lr"]),
    ("english/transfer/finetune", ["model.pattern", "model.mixers", "model.size_to.letters", "model.aux_loss_coef"]),
    ("attention", ["model.pattern", "model.mixers.A", "model.mixers.I"]),
    ("state_tracking", ["model.mixers.X"]),
    ("mqar", ["model.pattern", "model.mixers"]),
    ("mqar_hard", ["model.pattern", "model.mixers", "model.d_model"]),
    ("expresser", ["model.pattern", "model.mixers.O", "model.size_to.letters"]),
    ("mqar_grid", ["model.pattern", "model.mixers", "model.d_model", "data.init_args.seq_len", "data.init_args.num_pairs"]),
])
def test_ablation_families_differ_only_in_what_they_ablate(built, folder, varies):
    recipes = family(built, folder)
    assert len(recipes) >= 3
    settings = {name: recipe_without(cli, *varies) for name, cli in recipes.items()}
    first = next(iter(settings.values()))
    for name, config in settings.items():
        assert config == first, f"{folder}/{name} differs from the family in more than {varies}"
    if folder == "mqar":  # same task and width for every mixer
        assert len({cli.model.hparams.d_model for cli in recipes.values()}) == 1
    if folder == "mqar_grid":  # the full grid, each cell named for what it is
        cells = {(name.split("_")[0], cli.config.data.init_args.seq_len, cli.model.hparams.d_model)
                 for name, cli in recipes.items()}
        assert cells == {(m, T, d) for m in ("qcattn", "ssd") for T in (64, 128) for d in (16, 32, 64)}
        for name, cli in recipes.items():
            m, T, d = name.split("_")
            assert (int(T[1:]), int(d[1:])) == (cli.config.data.init_args.seq_len, cli.model.hparams.d_model), name
            assert cli.config.data.init_args.num_pairs == int(T[1:]) // 4, name


@pytest.mark.parametrize("length", [256, 512, 1024, 2048])
def test_paper_mqar_recipes_share_the_task_at_each_length(built, length):
    recipes = {name: cli for name, cli in family(built, "mqar/paper").items() if name.endswith(f"_T{length}")}
    assert sorted(recipes) == [f"{m}_T{length}" for m in ("ifa", "ifa_mask", "qcattn", "ssd")]
    tasks = {name: recipe_without(cli, "model.pattern", "model.mixers") for name, cli in recipes.items()}
    assert len({repr(t) for t in tasks.values()}) == 1
    assert next(iter(recipes.values())).datamodule.train.task["seq_len"] == length


def test_a_recipe_on_the_bundled_text_validates_within_an_epoch_or_counts_steps_across_them():
    """Lightning refuses a ``val_check_interval`` longer than an epoch unless ``check_val_every_n_epoch`` is null. The
    other tests here run the recipes at batch 2, whose epochs are 8× longer: ``quickstart_bpe.yaml`` (61 batches of 16
    on Python 3.11's pydoc topics, validating every 100) failed at its first command, the README's."""
    from recipes import data as modules
    from recipes.recipe_files import read_config

    batches, checked = {}, 0
    for name in bundled_configs():
        recipe = read_config(CONFIG_DIR / name)
        data, trainer = recipe.get("data") or {}, recipe.get("trainer") or {}
        args, cls = data.get("init_args") or {}, str(data.get("class_path", "")).rsplit(".", 1)[-1]
        if cls not in ("TextCorpus", "TokenizedCorpus") or {"path", "paths", "dataset"} & args.keys():
            continue  # (a corpus of the user's, such as data/english/: its length is not known here)
        interval = trainer.get("val_check_interval")
        if not isinstance(interval, int) or trainer.get("check_val_every_n_epoch", 1) is None:
            continue
        key = (cls, repr(sorted(args.items())))
        if key not in batches:
            module = getattr(modules, cls)(**args)
            module.prepare_data()
            module.setup("fit")
            batches[key] = len(module.train_dataloader())
        assert interval <= batches[key], f"{name}: val_check_interval {interval} > {batches[key]} batches an epoch"
        checked += 1
    assert checked >= 40


@pytest.mark.parametrize("name", REPRESENTATIVES)
def test_recipe_trains_checkpoints_and_reloads(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if name.startswith("english/"):
        write_sample(tmp_path / "data" / "english")
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


@pytest.mark.parametrize("name", [n for n in bundled_configs() if not n.startswith(("mqar/paper/", "arch/"))
                                  or n.startswith("arch/tiny/")])
def test_a_fresh_model_starts_near_the_uniform_loss(name, built):
    """Initialised as its reference does (the named systems: Hugging Face's initializer_range), a new model
    predicts about uniformly: its loss on uniform random tokens is within 0.5 nats of ln V. (Tied embeddings
    left at torch's N(0, 1) started the Mamba-2 and Doge twins at 40–60 nats.) The paper-size recipes are
    represented by their tiny twins, which share their initialisation."""
    torch.manual_seed(0)
    lm = LanguageModel(**dict(built[name].model.hparams)).eval()
    vocab = lm.model.vocab_size
    ids = torch.randint(0, vocab, (2, 65))
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(lm.model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    assert abs(float(loss) - math.log(vocab)) <= 0.5, (name, float(loss), math.log(vocab))
