"""Hugging Face interoperability, without importing ``transformers``: a ``save_pretrained`` folder
(``config.json`` + safetensors) into the equal ``HybridLM``, and a zoo model out to such a folder.

    from recipes.hf import from_pretrained, hf_recipe, export
    model = from_pretrained("path/to/Doge-40M-MoE")          # HybridLM; model(input_ids) gives the logits
    hf_recipe("path/to/Doge-40M-MoE")                         # the LanguageModel arguments that describe it
    export("runs/llama/version_0/checkpoints/last.ckpt", "llama-hf")   # a folder AutoModelForCausalLM loads

    python -m recipes.hf import path/to/folder --out doge.ckpt   # writes doge.ckpt and doge.yaml (also: recipes.hf FOLDER --out …)
    python -m recipes.hf export runs/…/last.ckpt --out llama-hf  # config.json, safetensors, generation config, tokenizer

Supported both ways: ``LlamaForCausalLM`` (pattern ``AM×L``; ``MistralForCausalLM`` imports as it), ``Qwen3ForCausalLM``
(``AM×L`` with a QK-norm), ``Mamba2ForCausalLM`` (``S-×L``),
``DogeForCausalLM`` (``IM×L`` dense, ``IE×L`` with CDMoE), ``GraniteMoeHybridForCausalLM`` (the hybrid: SSD and
attention blocks, with MLPs or with ``SharedExpertMoE``, ``SM SM AM``…) and ``BambaForCausalLM`` (SSD and attention
blocks with MLPs, the attention's RoPE on part of each head), ``Qwen3NextForCausalLM`` (Gated DeltaNet and gated
attention blocks, ``GR GR GR AR``…), ``Qwen3_5ForCausalLM`` (those with MLPs) and more (``SUPPORTED``); anything
else is refused by name, saying which part
Hugging Face cannot express. docs/architectures.md lists the mapping of every weight.
"""

import json
import re
import shutil
from pathlib import Path

import torch

from components.model import HybridLM
from components.sequence import QCAttention
from recipes.hf.architectures import ADAPTERS, EXPORTABLE, audit, number, rope_settings, to_hf, to_zoo
from recipes.outputs import refuse_overwrite

SUPPORTED = tuple(ADAPTERS)
__all__ = ["SUPPORTED", "convert_weights", "export", "from_pretrained", "hf_recipe", "hf_training", "main", "number", "read_config",
           "read_weights", "rope_settings", "write_checkpoint"]


def read_config(folder: str | Path) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no config.json (a folder written by save_pretrained is expected)")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} holds a {type(config).__name__}, not a configuration object")
    architecture = (config.get("architectures") or [None])[0]
    if architecture not in SUPPORTED:
        named = (f"architecture {architecture!r}" if architecture is not None else
                 f"no architectures entry, model_type {config.get('model_type')!r}")
        raise ValueError(f"{folder}: {named} is not supported (supported: {', '.join(SUPPORTED)}: a causal LM, "
                         "as save_pretrained writes it)")
    return config


def read_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``model.safetensors`` or of the shards its ``.index.json`` lists (inside the folder only)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        inside = folder.resolve()
        outside = [name for name in files if Path(name).is_absolute() or not (folder / name).resolve().is_relative_to(inside)]
        if outside:
            raise ValueError(f"{index}: weight_map names files outside the model folder ({', '.join(outside[:3])}); "
                             "refused: a checkpoint's shards lie in its own folder")
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{folder}: no model.safetensors (nor an index of shards)")
    weights = {}
    for name in files:
        weights.update(load_file(str(folder / name)))
    return weights


def hf_recipe(folder_or_config: str | Path | dict) -> dict:
    """The ``LanguageModel`` / ``HybridLM`` arguments of the model a folder holds. Every field of its config is
    honoured or refused by name; a missing required key is named with the file."""
    c = folder_or_config if isinstance(folder_or_config, dict) else read_config(folder_or_config)
    where = "config.json" if isinstance(folder_or_config, dict) else Path(folder_or_config) / "config.json"
    adapter = ADAPTERS[c["architectures"][0]]
    audit(c, adapter.honoured, str(where))
    try:
        return adapter.recipe(c)
    except KeyError as error:
        raise ValueError(f"{where}: the required key {error.args[0]!r} is missing ({adapter.name} needs it)") from None


def hf_training(folder_or_config: str | Path | dict) -> dict:
    """The ``LanguageModel`` training settings a folder's config holds beside the model (Bamba's z-loss), which a
    fine-tuning recipe takes; ``{}`` for most."""
    c = folder_or_config if isinstance(folder_or_config, dict) else read_config(folder_or_config)
    training = getattr(ADAPTERS[c["architectures"][0]], "training", None)
    return training(c) if training else {}


def convert_weights(config: dict, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face weight names and layouts → the ``HybridLM`` state dict of :func:`hf_recipe`'s model."""
    return to_zoo(config, hf)


def build(recipe: dict) -> HybridLM:
    recipe = dict(recipe)
    return HybridLM(recipe.pop("vocab_size"), recipe.pop("d_model"), recipe.pop("pattern"), recipe.pop("mixers"), **recipe)


def from_pretrained(folder: str | Path) -> HybridLM:
    """The ``HybridLM`` equal to the Hugging Face model saved in ``folder`` (in the folder's dtype)."""
    config = read_config(folder)
    model = build(hf_recipe(config))
    files = read_weights(folder)
    dtype = next(iter(files.values())).dtype  # (the files', not the conversion's: a fold may keep fp32 where it adds)
    weights = convert_weights(config, files)
    model.load_state_dict({k: v.to(torch.float32) for k, v in weights.items()}, strict=True)
    return model.to(dtype) if dtype != torch.float32 else model


# ---- import: a checkpoint and a recipe to fine-tune it --------------------------------------------

def write_checkpoint(folder: str | Path, out: str | Path, *, overwrite: bool = False) -> tuple[Path, Path]:
    """``out`` (a checkpoint ``LanguageModel.load_from_checkpoint`` reads) and ``out`` with ``.yaml``: a recipe that
    fine-tunes from it (``model.init_from``, relative to the recipe) on the folder's own tokenizer
    (``TokenizedCorpus``; byte text only when the vocabulary is bytes). Edit its ``data.init_args.paths``.

    Files already there are refused unless ``overwrite``: the recipe is the one a user edits (their data), and
    ``out`` may be a trained checkpoint."""
    import yaml

    from recipes.data.corpus import TokenizedCorpus
    from recipes.hf.tokenizer import corpus_settings, folder_tokenizer, is_byte_tokenizer
    from recipes.module import LanguageModel

    out = Path(out)
    if out.suffix in (".yaml", ".yml", ".json"):
        raise ValueError(f"--out {out}: the checkpoint to write (such as {out.with_suffix('.ckpt').name}); its recipe "
                         f"is written beside it as {out.with_suffix('.yaml').name}")
    recipe = hf_recipe(folder)
    tokenizer = folder_tokenizer(Path(folder))
    vocab = recipe["vocab_size"]
    loaded = TokenizedCorpus._load_tokenizer(tokenizer) if tokenizer is not None else None  # (names a bad file)
    if loaded is not None and vocab == 256 and is_byte_tokenizer(loaded):
        tokenizer = None  # bytes, as an exported byte-level model's: byte-level text, which has no end-of-document id
    settings = corpus_settings(Path(folder), loaded, vocab) if tokenizer is not None else {}
    tokenizer_copy = out.with_name(f"{out.stem}.tokenizer.json")
    written = [out, out.with_suffix(".yaml"), *([tokenizer_copy] if tokenizer is not None else [])]
    if not overwrite:
        refuse_overwrite(written, lost="an edited recipe would be lost; overwrite=True from Python")
    out.parent.mkdir(parents=True, exist_ok=True)
    if tokenizer is not None:
        shutil.copyfile(tokenizer, tokenizer_copy)
        data = {"class_path": "recipes.data.TokenizedCorpus",
                "init_args": {"paths": "data/*.jsonl", "tokenizer": str(tokenizer_copy.resolve()), **settings,
                              "seq_len": 256, "batch_size": 8}}
        note = "The data below is the folder's own tokenizer over your .jsonl/.txt/.parquet files: set paths."
    elif vocab == 256:
        data = {"class_path": "recipes.data.TextCorpus", "init_args": {"seq_len": 256, "batch_size": 8}}
        note = "The data below is byte-level text (the model's vocabulary is bytes): replace it with yours."
    else:
        raise ValueError(f"{folder}: no tokenizer.json, and the model's vocabulary ({vocab} tokens) is not bytes: a recipe "
                         "could not turn text into its tokens. Put the model's tokenizer.json in the folder")
    model = from_pretrained(folder).float()
    training = hf_training(folder)
    lm = LanguageModel(**recipe, **training)
    lm.model.load_state_dict(model.state_dict())
    import lightning

    torch.save({"state_dict": lm.state_dict(), "hyper_parameters": dict(lm.hparams),
                "pytorch-lightning_version": lightning.__version__, "global_step": 0, "epoch": 0}, out)
    config = {
        "seed_everything": 0,
        "model": {**{k: v for k, v in lm.hparams.items() if k in recipe or k in training}, "init_from": out.name,
                  "lr": 1e-4},
        "data": data,
        "trainer": {"max_steps": 1000, "val_check_interval": 200, "limit_val_batches": 20,
                    "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                               "init_args": {"save_dir": "runs", "name": f"finetune/{out.stem}", "default_hp_metric": False}}},
    }
    recipe_path = out.with_suffix(".yaml")
    recipe_path.write_text(f"# Fine-tune {Path(folder).name} (converted from Hugging Face by python -m recipes.hf).\n"
                           f"# model.init_from is relative to this file. {note}\n"
                           + yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return out, recipe_path


# ---- export: a zoo model as a transformers folder -------------------------------------------------

def hf_architecture(model: HybridLM, as_class: str | None = None):
    """The adapter of the Hugging Face class ``model`` is — the first of :data:`EXPORTABLE` that fits, or ``as_class``
    — or a ``ValueError`` that says why it is none."""
    if as_class is not None and as_class not in EXPORTABLE:
        raise ValueError(f"--as {as_class}: not a class the export writes ({', '.join(EXPORTABLE)})")
    reasons = {}
    attentions = [m for m in model.modules() if isinstance(m, QCAttention)]
    gated = any(a.gate_proj is not None for a in attentions)
    wide_qk_norm = any(a.qk_norm_over == "all_heads" for a in attentions)
    post_norm = any(getattr(block, "post_norm", False) for block in model.blocks)
    for name, adapter in EXPORTABLE.items() if as_class is None else [(as_class, EXPORTABLE[as_class])]:
        # (what few classes have, refused here for all the others, whose own checks predate it)
        reason = adapter.mismatch(model)
        if reason is None and gated and not getattr(adapter, "gated_attention", False):
            reason = f"its attention gates its output (output_gate), which {name}'s does not"
        if reason is None and wide_qk_norm and not getattr(adapter, "wide_qk_norm", False):
            reason = f"its attention's QK-norm spans every head (qk_norm_over='all_heads'), which {name}'s does not"
        if reason is None and post_norm and not getattr(adapter, "post_norm", False):
            reason = f"its blocks put their norms after their mixers (post_norm), which {name}'s do not"
        if reason is None:
            return adapter
        reasons[name] = reason
    if as_class is not None:
        raise ValueError(f"--as {as_class}: this model (pattern {model.pattern!r}) is not one: {reasons[as_class]}")
    closest = min(reasons, key=lambda name: 0 if "pattern" not in reasons[name] else 1)
    raise ValueError(f"this model (pattern {model.pattern!r}) has no Hugging Face class: as {closest}, "
                     f"{reasons[closest]}. Exportable: {', '.join(EXPORTABLE)}")


def shard_size(text: str | int) -> int:
    """Bytes from ``2GB``, ``500MB``, ``1000000`` or an int; a size under one byte is refused (every tensor would be
    a shard of its own)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B)?\s*", str(text).upper())
    if not match:
        raise ValueError(f"max_shard_size {text!r} is not a size such as 2GB, 500MB or 1000000")
    size = int(float(match.group(1)) * {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, None: 1}[match.group(2)])
    if size < 1:
        raise ValueError(f"max_shard_size {text!r} is under one byte: give a size such as 2GB or 500MB")
    return size


def write_weights(state: dict[str, torch.Tensor], out: Path, max_shard_size: int) -> list[str]:
    """``model.safetensors``, or shards of at most ``max_shard_size`` bytes with their index."""
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    shards, current, size = [], {}, 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > max_shard_size:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensor
        size += nbytes
    shards.append(current)
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for name, shard in zip(names, shards):
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update({key: name for key in shard})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}, indent=1))
    return names


WRITTEN_BY_EXPORT = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
                     "model-*-of-*.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
"""What :func:`export` writes into its folder (and, with ``overwrite``, clears first: a stale shard index beside
new weights would make ``from_pretrained`` load the old shards)."""


def export(source, out: str | Path, *, data=None, allow_classes=(), max_shard_size: str | int = "2GB",
           overwrite: bool = False, as_class: str | None = None) -> Path:
    """Write ``out``, a folder ``transformers.AutoModelForCausalLM.from_pretrained`` loads: ``config.json``,
    ``model.safetensors`` (sharded past ``max_shard_size``), ``generation_config.json``, and the tokenizer of
    ``data`` (the recipe's data module; bytes become a byte-level tokenizer ``AutoTokenizer`` loads).

    ``source``: a ``HybridLM``, a ``LanguageModel``, or a checkpoint path (read as data only; ``allow_classes``
    as for ``load_from_checkpoint``). A folder that holds files is refused unless ``overwrite``, which first removes
    the files an export writes (:data:`WRITTEN_BY_EXPORT`). ``as_class``: the Hugging Face class to write where the
    model is more than one (a dense Gated DeltaNet hybrid is Qwen3.5's and Qwen3-Next's); the first that fits
    otherwise."""
    from recipes.hf.tokenizer import write_tokenizer

    out = Path(out)
    shard_bytes = shard_size(max_shard_size)  # (before anything is written or cleared)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} is a file: the export writes a folder")
    occupied = out.is_dir() and any(out.iterdir())
    if occupied and not overwrite:
        raise FileExistsError(f"{out} is not empty: choose a new folder, or --force (overwrite=True) to replace the "
                              "model files there (other files stay)")
    if isinstance(source, (str, Path)):
        from recipes.module import LanguageModel

        source = LanguageModel.load_from_checkpoint(str(source), map_location="cpu", allow_classes=allow_classes)
    model = getattr(source, "model", source)
    if not isinstance(model, HybridLM):
        raise TypeError(f"export: {type(source).__name__} is not a HybridLM, a LanguageModel or a checkpoint path")
    adapter = hf_architecture(model, as_class)
    config = adapter.config(model)
    if "z_loss_coefficient" in config:  # (a training setting of the LanguageModel, where there is one)
        config["z_loss_coefficient"] = float(getattr(source, "hparams", {}).get("z_loss", 0.0))
    if occupied:  # (refused above before any of it is touched; cleared only now the model is known exportable)
        for pattern in WRITTEN_BY_EXPORT:
            for stale in out.glob(pattern):
                stale.unlink()
    out.mkdir(parents=True, exist_ok=True)
    state = to_hf(config, model.state_dict())
    files = write_weights(state, out, shard_bytes)
    config["torch_dtype"] = config["dtype"]
    tokenizer = "none"
    eos = bos = None
    if data is not None:
        tokenizer = write_tokenizer(data, out, model.vocab_size)
        eos = getattr(data, "end_of_document", None) if hasattr(data, "meta") else None
        bos = getattr(data, "start_of_document", eos) if hasattr(data, "meta") else None
    config.update(bos_token_id=bos, eos_token_id=eos)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"_from_model_config": True, "bos_token_id": bos,
                                                            "eos_token_id": eos, "pad_token_id": config.get("pad_token_id")},
                                                           indent=1))
    print(f"wrote {out}: {adapter.name}, {len(state)} tensors in {len(files)} file(s), tokenizer: {tokenizer}")
    return out


def main(argv: list[str] | None = None) -> None:
    from recipes.hf.cli import main as run

    run(argv)
