"""A checkpoint is data: no load path imports a module the file names unless the user trusts it, no pickled
object is ever read, and a file that is not a checkpoint gets an error that names it (and never advises
loading it unsafely). The module planted here writes a marker file when imported, so "no code ran" is
checked, not assumed."""

import sys
from pathlib import Path

import pytest
import torch

from recipes import LanguageModel
from recipes.checkpoints import CheckpointError, check_hyperparameters, load_checkpoint, untrusted_references
from recipes.cli import main
from recipes.generate import main as generate
from recipes.training import AtomicCheckpointIO

TINY = ["--config", "quickstart.yaml", "--model.d_model", "16", "--model.pattern", "AM", "--model.mixers.A.init_args.n_heads",
        "2", "--data.init_args.seq_len", "16", "--data.init_args.batch_size", "2", "--trainer.max_steps", "2",
        "--trainer.limit_val_batches", "2", "--trainer.val_check_interval", "2", "--trainer.enable_progress_bar", "false"]

EVIL = """
from pathlib import Path
Path(__file__).with_name("IMPORTED").write_text("evilmod ran")
import torch
class Evil(torch.nn.Module):
    def __init__(self, d_model, **kwargs):
        super().__init__()
        self.proj = torch.nn.Linear(d_model, d_model, bias=False)
    def forward(self, x, context=None):
        return self.proj(x)
"""


def crafted(trained, folder, mutate) -> str:
    """``trained`` with its hyper-parameters changed by ``mutate``, saved in ``folder`` beside ``evilmod.py``."""
    checkpoint = torch.load(trained, weights_only=True)
    mutate(checkpoint["hyper_parameters"])
    (folder / "evilmod.py").write_text(EVIL)
    path = folder / "crafted.ckpt"
    torch.save(checkpoint, path)
    return str(path)


def as_class_path(hp):
    hp["mixers"]["A"]["class_path"] = "evilmod.Evil"


def as_string(hp):  # jsonargparse reads a bare string as a class path
    hp["mixers"]["A"] = "evilmod.Evil"


def nested(hp):  # a class path deep inside a binding's arguments
    hp["mixers"]["A"]["init_args"]["value"] = {"class_path": "evilmod.Evil", "init_args": {}}


def as_yaml_path(hp):  # jsonargparse reads a path string as a config file to load
    hp["mixers"]["M"]["init_args"]["activation"] = "./binding.yaml"


def as_part_name(hp):  # an InnerFuncAttention part is named by a mapping key, which may be a dotted path
    hp["mixers"]["A"] = {"class_path": "components.InnerFuncAttention",
                         "init_args": {"n_heads": 2, "inner": {"evilmod.Evil": {}}}}


def as_optimizer(hp):  # the run's optimiser: torch.optim is trusted, nothing else
    hp["optimizer"] = {"class_path": "evilmod.Evil", "init_args": {}}


def as_optimizer_name(hp):
    hp["optimizer"] = "evilmod.Evil"


ATTACKS = [as_class_path, as_string, nested, as_yaml_path, as_part_name, as_optimizer, as_optimizer_name]
LOADERS = ["load_from_checkpoint", "validate", "test", "fit", "generate"]


def load(loader: str, path: str, cwd) -> None:
    if loader == "load_from_checkpoint":
        LanguageModel.load_from_checkpoint(path)
    elif loader == "generate":
        generate(["--config", "quickstart.yaml", "--ckpt_path", path, "--prompt", "a", "--max_new_tokens", "2"])
    else:
        main([loader, *TINY, "--ckpt_path", path])


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.__name__ for a in ATTACKS])
@pytest.mark.parametrize("loader", LOADERS)
def test_a_crafted_checkpoint_imports_nothing_by_any_load_path(trained, tmp_path, monkeypatch, capsys, attack, loader):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # evilmod is importable, as a module in the working folder is
    (tmp_path / "binding.yaml").write_text("class_path: evilmod.Evil\n")
    path = crafted(trained, tmp_path, attack)
    with pytest.raises((CheckpointError, SystemExit)) as caught:
        load(loader, path, tmp_path)
    message = str(caught.value)
    assert "refused before importing anything" in message and "crafted.ckpt" in message
    assert not (tmp_path / "IMPORTED").exists(), "the checkpoint's module was imported"
    assert "evilmod" not in sys.modules


RUN_DATA_ATTACKS = {  # what a shared run folder's config.yaml may say under data:
    "module": {"class_path": "evilmod.Evil", "init_args": {}},  # importing it runs its code
    "shell": {"class_path": "subprocess.Popen", "init_args": {"args": "touch POPEN_RAN", "shell": True}},  # a class
    "nested": {"class_path": "recipes.data.TextCorpus", "init_args": {"path": {"class_path": "evilmod.Evil"}}},
    "not-a-string": {"class_path": ["evilmod", "Evil"]},
}
RUN_LOADERS = ["generate", "eval", "hf export", "load_run"]


def shared_run(trained, folder, data: dict) -> str:
    """``trained``'s checkpoint in a run folder of its own whose ``config.yaml`` says ``data``, beside ``evilmod.py``:
    a run folder someone else wrote."""
    import shutil

    import yaml

    (folder / "shared" / "version_0" / "checkpoints").mkdir(parents=True)
    (folder / "evilmod.py").write_text(EVIL)
    path = folder / "shared" / "version_0" / "checkpoints" / "last.ckpt"
    shutil.copy(trained, path)
    (folder / "shared" / "version_0" / "config.yaml").write_text(yaml.safe_dump({"data": data}))
    return str(path)


def load_run_folder(loader: str, path: str, *extra: str) -> None:
    from recipes.evaluation.cli import main as evaluate
    from recipes.hf.cli import main as hf
    from recipes.runs import load_run

    if loader == "generate":
        generate(["--config", "quickstart.yaml", "--ckpt_path", path, "--prompt", "a", "--max_new_tokens", "2", *extra])
    elif loader == "eval":
        evaluate(["--config", "quickstart.yaml", "--ckpt_path", path, "--suite", "length", *extra])
    elif loader == "hf export":  # (no --config: the run folder's config.yaml is all it reads)
        hf(["export", path, "--out", str(Path(path).parents[3] / "exported"), *extra])
    else:
        load_run("quickstart.yaml", path, allow_classes=[e for e in extra if e != "--allow_classes"])


@pytest.mark.parametrize("attack", RUN_DATA_ATTACKS)
@pytest.mark.parametrize("loader", RUN_LOADERS)
def test_a_shared_run_folders_config_imports_and_runs_nothing(trained, tmp_path, monkeypatch, attack, loader):
    """``generate``, ``eval``, ``hf export`` and ``load_run`` build the data module a checkpoint's run folder records in
    its ``config.yaml`` (its tokenizer is the run's). That file travels with a shared run as the checkpoint does, and
    before 2026-12-05 its ``data.class_path`` was imported and called unchecked: ``subprocess.Popen`` with
    ``shell: true`` ran a command. Now it is held to the checkpoint's rule: the zoo's data modules, the recipe's own, or
    ``--allow_classes``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # evilmod is importable, as a module in the working folder is
    path = shared_run(trained, tmp_path, RUN_DATA_ATTACKS[attack])
    with pytest.raises((CheckpointError, SystemExit)) as caught:
        load_run_folder(loader, path)
    message = str(caught.value)
    assert "refused before importing anything: its data section names" in message, message
    assert str(tmp_path / "shared" / "version_0" / "config.yaml") in message and "--allow_classes" in message
    assert not (tmp_path / "IMPORTED").exists() and not (tmp_path / "POPEN_RAN").exists(), "the run folder's code ran"
    assert "evilmod" not in sys.modules


@pytest.mark.parametrize("loader", RUN_LOADERS)
def test_a_run_folders_data_module_of_the_zoo_the_recipe_or_the_allow_list_is_built(trained, tmp_path, monkeypatch,
                                                                                     capsys, loader):
    """The other side: the zoo's data module, one the recipe names, and one on ``--allow_classes`` are built."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "mydata.py").write_text("from pathlib import Path\nPath(__file__).with_name('MINE').write_text('ran')\n"
                                        "from recipes.data import TextCorpus\nclass MyText(TextCorpus):\n    pass\n")
    mine = {"class_path": "mydata.MyText", "init_args": {"seq_len": 16}}
    try:
        load_run_folder(loader, shared_run(trained, tmp_path, {**mine, "class_path": "recipes.data.TextCorpus"}))
        assert not (tmp_path / "MINE").exists()
        path = shared_run(trained, tmp_path / "again", mine)
        with pytest.raises((CheckpointError, SystemExit), match="its data section names mydata.MyText"):
            load_run_folder(loader, path)
        assert not (tmp_path / "MINE").exists()
        load_run_folder(loader, path, "--allow_classes", "mydata")
        assert (tmp_path / "MINE").read_text() == "ran"
    finally:
        sys.modules.pop("mydata", None)
    if loader == "generate":  # a recipe whose own data section names the class trusts it, as fit does
        (tmp_path / "MINE").unlink()
        (tmp_path / "mine.yaml").write_text("data:\n  class_path: mydata.MyText\n")
        try:
            generate(["--config", "quickstart.yaml", "--config", "mine.yaml", "--ckpt_path", path, "--prompt", "a",
                      "--max_new_tokens", "2"])
        finally:
            sys.modules.pop("mydata", None)
        assert (tmp_path / "MINE").read_text() == "ran"


@pytest.mark.filterwarnings("ignore:Found keys that are")  # the crafted class's weights differ by design
def test_the_allow_list_lets_a_trusted_class_through(trained, tmp_path, monkeypatch):
    """The other side of the test above: with the module allowed, it is imported and the model is built
    from it — so the refusal above is the allow-list's doing, not a broken checkpoint."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = crafted(trained, tmp_path, as_class_path)
    try:
        lm = LanguageModel.load_from_checkpoint(path, allow_classes=["evilmod"], strict=False)
        assert (tmp_path / "IMPORTED").read_text() == "evilmod ran"
        assert type(lm.model.blocks[0].sequence_mixer).__name__ == "Evil"
    finally:
        sys.modules.pop("evilmod", None)


def test_the_recipe_own_bindings_are_trusted_on_resume(trained, tmp_path, monkeypatch, capsys):
    """A run whose recipe binds a custom mixer resumes without --allow_classes: the user named it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "mymixer.py").write_text(EVIL.replace("IMPORTED", "MINE"))
    args = [*TINY, "--model.mixers.A", "{class_path: mymixer.Evil}"]
    try:
        main(["fit", *args])
        main(["validate", *args, "--ckpt_path", "last"])
    finally:
        sys.modules.pop("mymixer", None)
    assert "val/loss" in capsys.readouterr().out


@pytest.mark.parametrize("content, expected", [
    (b"", "is empty (0 bytes)"),
    (b"\x80\x02random bytes that are not a checkpoint" * 50, "is not a checkpoint: a checkpoint is a zip archive"),
    ("truncated", "is not a readable checkpoint"),
    ("pickled", "holds pickled Python objects (it names posix.system)"),
    ("not-a-model", "is not a model checkpoint: it has no 'state_dict'"),
])
def test_a_file_that_is_not_a_checkpoint_gets_an_error_that_names_it(trained, tmp_path, content, expected):
    path = tmp_path / "bad.ckpt"
    if content == "truncated":
        data = trained.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif content == "pickled":
        import os

        class Payload:
            def __reduce__(self):
                return os.system, ("true",)
        torch.save({"state_dict": {}, "x": Payload()}, path)
    elif content == "not-a-model":
        torch.save({"weights": torch.ones(2), "step": 3}, path)
    else:
        path.write_bytes(content)
    for read in (load_checkpoint, AtomicCheckpointIO().load_checkpoint, LanguageModel.load_from_checkpoint):
        with pytest.raises(CheckpointError) as caught:
            read(str(path))
        message = str(caught.value)
        assert str(path) in message and expected in message
        assert "weights_only=False" not in message and "will likely succeed" not in message


def test_a_file_of_bare_weights_is_read_only_where_ddp_spawn_hands_weights_back(trained, tmp_path, monkeypatch):
    path = tmp_path / "weights.ckpt"
    weights = torch.load(trained, weights_only=True)["state_dict"]
    torch.save(weights, path)  # what a ddp_spawn worker writes for the main process: names → tensors, nothing else
    got = AtomicCheckpointIO().load_checkpoint(str(path))
    assert list(got) == list(weights) and all(torch.equal(got[k], weights[k]) for k in weights)
    for read in (load_checkpoint, LanguageModel.load_from_checkpoint):  # a model checkpoint it is not
        with pytest.raises(CheckpointError, match="is not a model checkpoint: it has no 'state_dict'"):
            read(str(path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="it has no 'state_dict'"):
        main(["validate", *TINY, "--ckpt_path", str(path)])


def test_weights_only_is_explicit_whatever_the_environment_says(trained, tmp_path, monkeypatch):
    """torch's default flips with an environment variable; every zoo reader passes weights_only=True itself."""
    import os

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'RAN'}",)
    checkpoint = torch.load(trained, weights_only=True)
    checkpoint["payload"] = Payload()
    path = tmp_path / "payload.ckpt"
    torch.save(checkpoint, path)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    for read in (load_checkpoint, AtomicCheckpointIO().load_checkpoint, LanguageModel.load_from_checkpoint):
        with pytest.raises(CheckpointError, match="holds pickled Python objects"):
            read(str(path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="holds pickled Python objects"):
        main(["validate", *TINY, "--ckpt_path", str(path)])
    assert not (tmp_path / "RAN").exists()


def test_weights_only_false_is_refused_on_the_command_line(trained, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="--weights_only false is refused"):
        main(["validate", *TINY, "--ckpt_path", str(trained), "--weights_only", "false"])


def test_untrusted_references_lists_class_paths_and_path_like_strings():
    hparams = {"pattern": "SM×2", "lr": 1e-3, "compile": "inductor", "betas": [0.9, 0.98], "eps": "1e-6",
               "mixers": {"S": {"class_path": "components.SSD", "init_args": {"rope": True}},
                          "M": {"class_path": "components.sequence.ssd.SSD", "init_args": {}},
                          "X": {"class_path": "mypkg.sub.Mixer", "init_args": {"where": "../x", "name": "os.path"}}}}
    assert untrusted_references(hparams) == ["mixers.X.class_path='mypkg.sub.Mixer'", "mixers.X.init_args.where='../x'",
                                             "mixers.X.init_args.name='os.path'"]
    assert untrusted_references(hparams, allow=["mypkg", "os"]) == ["mixers.X.init_args.where='../x'"]
    # a prefix is a package, not a string prefix: "componentsx" is not "components"
    assert untrusted_references({"class_path": "componentsx.Evil"}) == ["class_path='componentsx.Evil'"]
    with pytest.raises(CheckpointError, match=r"mixers.A=str \(not a \{class_path, init_args\} mapping\)"):
        check_hyperparameters({"mixers": {"A": "components.MLP"}}, "x.ckpt")


def test_a_shard_index_that_points_outside_the_folder_is_refused(tmp_path):
    import json

    from safetensors.torch import save_file

    from recipes.hf import read_weights

    secret = tmp_path / "elsewhere.safetensors"
    save_file({"w": torch.ones(2)}, str(secret))
    model = tmp_path / "model"
    model.mkdir()
    save_file({"v": torch.ones(2)}, str(model / "part-1.safetensors"))
    for outside in ("../elsewhere.safetensors", str(secret)):
        (model / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"v": "part-1.safetensors", "w": outside}}))
        with pytest.raises(ValueError, match="weight_map names files outside the model folder"):
            read_weights(model)
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"v": "part-1.safetensors"}}))
    assert set(read_weights(model)) == {"v"}


@pytest.mark.parametrize("flag", [["--trainer.logger.init_args.name", "../../escaped"],
                                  ["--trainer.logger.init_args.version", "../escaped"],
                                  ["--trainer.logger.init_args.name", "/tmp/escaped"]])
def test_a_run_name_that_leaves_the_runs_folder_is_refused(tmp_path, monkeypatch, flag):
    monkeypatch.chdir(tmp_path / ".")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    with pytest.raises(SystemExit, match="would write outside the logger's save_dir"):
        main(["fit", *TINY, *flag])
    assert not (tmp_path / "escaped").exists() and not list(tmp_path.glob("**/escaped"))


class _WritesMarker:
    """Unpickled, calls ``open(path, "w")``: a file that appears is code that ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_sharded_checkpoint_whose_index_names_code_is_refused_before_torch_unpickles_it(tmp_path):
    """torch's distributed checkpoint reads a shard folder's ``.metadata`` with plain pickle; the zoo reads it
    first with an unpickler that resolves only the index's own classes, on every path into the folder."""
    import pickle

    from recipes.checkpoints import CheckpointError, consolidate, load_checkpoint

    folder = tmp_path / "last.ckpt"
    folder.mkdir()
    torch.save({"global_step": 4, "hyper_parameters": {}}, folder / "meta.pt")
    marker = tmp_path / "ran"
    (folder / ".metadata").write_bytes(pickle.dumps(_WritesMarker(marker)))
    for read in (load_checkpoint, consolidate):
        with pytest.raises(CheckpointError, match=r"\.metadata names io\.open"):
            read(folder)
    assert not marker.exists()
    (folder / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(CheckpointError, match=r"\.metadata is not a readable checkpoint index"):
        load_checkpoint(folder)


def shard_folder(folder, weights: dict, meta: dict):
    """``folder``: a sharded checkpoint as a ModelParallelStrategy run writes it (torch's distributed checkpoint of the
    weights, on one process, and the run's ``meta.pt``)."""
    import torch.distributed.checkpoint as dcp

    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"state_dict": weights}, checkpoint_id=folder)
    torch.save(meta, folder / "meta.pt")
    return folder


def test_consolidate_reads_what_the_shards_assemble_to_as_data_too(tmp_path, monkeypatch):
    """Defence in depth: the file torch's ``dcp_to_torch_save`` assembles from the shards is read with
    ``weights_only`` as every other checkpoint is, so an object that reached it (a shard's byte item) never runs."""
    import pickle

    import torch.distributed.checkpoint.format_utils as format_utils

    from recipes.checkpoints import consolidate

    folder = shard_folder(tmp_path / "last.ckpt", {"model.w": torch.randn(3)}, {"global_step": 7})
    marker = tmp_path / "RAN"
    monkeypatch.setattr(format_utils, "dcp_to_torch_save",
                        lambda shards, out: torch.save({"state_dict": {}, "extra": _WritesMarker(marker)}, out))
    with pytest.raises(pickle.UnpicklingError):
        consolidate(folder)
    assert not marker.exists() and not (tmp_path / "last.ckpt.consolidated").exists()
    assert not list(tmp_path.glob(".last.ckpt.consolidated.tmp-*"))  # the temporary file is removed


def test_a_shard_folder_torch_writes_passes_the_index_check_and_consolidates_to_its_weights(tmp_path):
    """The index check refuses what a shard index never holds, so it must let through everything one does hold: the
    planner's records and the dtypes of the tensors (bf16 and fp32 here), written by torch's own distributed
    checkpoint on one process."""
    import pickle

    from recipes.checkpoints import check_shard_metadata, consolidate, load_weights

    weights = {"model.w": torch.randn(3, 5, dtype=torch.bfloat16), "model.b": torch.randn(5)}
    folder = shard_folder(tmp_path / "last.ckpt", weights, {"global_step": 7, "hyper_parameters": {"d_model": 5}})
    check_shard_metadata(folder)
    assert load_checkpoint(folder) == {"global_step": 7, "hyper_parameters": {"d_model": 5}}
    with pytest.raises(CheckpointError, match="is a sharded checkpoint .* python -m recipes.consolidate"):
        load_weights(folder)
    state = load_weights(consolidate(folder))
    assert state.keys() == weights.keys() and all(torch.equal(state[k], weights[k]) for k in weights)
    assert consolidate(folder) == tmp_path / "last.ckpt.consolidated"  # again (the run trained on): its own, replaced
    other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {}}, other)  # another run's checkpoint: kept unless --force
    with pytest.raises(FileExistsError, match=r"other.ckpt already exists: .* \(it is not a consolidation of this folder\)"):
        consolidate(folder, other)
    assert load_weights(consolidate(folder, other, overwrite=True)).keys() == weights.keys()
    with pytest.raises(IsADirectoryError, match=r"--out .*plain is a folder: name the file to write"):
        (tmp_path / "plain").mkdir()
        consolidate(folder, tmp_path / "plain")
    # a folder without the run's meta.pt, index and shards
    with pytest.raises(CheckpointError, match=r"plain is not a sharded checkpoint \(a folder with meta.pt, .metadata "
                                              r"and the .distcp shards a ModelParallelStrategy run writes\)"):
        consolidate(tmp_path / "plain")
    # a dtype's name is allowed from torch only: `builtins.float` is not `torch.float`
    (folder / ".metadata").write_bytes(pickle.dumps(float))
    with pytest.raises(CheckpointError, match=r"\.metadata names builtins\.float"):
        check_shard_metadata(folder)


def test_a_folder_that_is_not_a_sharded_checkpoint_is_named_as_a_folder(tmp_path):
    for folder in (tmp_path, tmp_path / "half"):
        folder.mkdir(exist_ok=True)
        with pytest.raises(CheckpointError, match=f"{folder} is a folder, not a checkpoint file, nor a sharded"):
            load_checkpoint(folder)
        (folder / ".metadata").write_bytes(b"")  # an index without meta.pt is not a sharded checkpoint either
    with pytest.raises(FileNotFoundError, match="missing.ckpt: no such checkpoint file"):
        load_checkpoint(tmp_path / "missing.ckpt")


def test_untrusted_references_walks_lists():
    hparams = {"callbacks": [{"class_path": "components.MLP"}, {"class_path": "evilmod.Evil"}],
               "files": ("a", "../x"), "lrs": [1e-3, "2e-3"]}
    assert untrusted_references(hparams) == ["callbacks[1].class_path='evilmod.Evil'", "files[1]='../x'"]
    # a recipe's own classes are trusted on its resume wherever they sit, a list included (a false refusal else)
    from recipes.checkpoints import class_paths

    assert class_paths({"mixers": {"E": {"class_path": "a.B", "init_args": {"parts": [{"class_path": "c.D"}]}}}}) \
        == ["a.B", "c.D"]
    with pytest.raises(CheckpointError, match=r"its hyper-parameters name mixers=list"):
        check_hyperparameters({"mixers": [{"class_path": "components.MLP"}]}, "x.ckpt")
