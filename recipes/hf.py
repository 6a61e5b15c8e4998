"""Load a Hugging Face checkpoint folder (``config.json`` + safetensors, as ``save_pretrained`` writes
it) into the equal ``HybridLM``, without importing ``transformers``.

    from recipes.hf import from_pretrained, hf_recipe
    model = from_pretrained("path/to/Doge-40M-MoE")          # HybridLM; model(input_ids) gives the logits
    hf_recipe("path/to/Doge-40M-MoE")                         # the LanguageModel arguments that describe it

    python -m recipes.hf path/to/folder --out doge.ckpt       # writes doge.ckpt and doge.yaml
    python -m recipes fit --config doge.yaml                  # fine-tunes from it (data: edit the YAML)

Supported: ``LlamaForCausalLM`` (pattern ``AM×L``), ``Mamba2ForCausalLM`` (``S-×L``) and
``DogeForCausalLM`` (``IM×L`` dense, ``IE×L`` with CDMoE). docs/architectures.md lists the mapping of
every weight and the few places where the zoo's computation differs (none changes the logits).
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from components.model import HybridLM

SUPPORTED = ("LlamaForCausalLM", "Mamba2ForCausalLM", "DogeForCausalLM")


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
        raise ValueError(f"{folder}: architecture {architecture!r} is not supported (supported: {', '.join(SUPPORTED)})")
    return config


def read_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``model.safetensors`` or of the shards its ``.index.json`` lists."""
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


def rope_settings(config: dict) -> tuple[float, float]:
    """``(base, NTK factor)`` from either the 5.x ``rope_parameters`` or the 4.x ``rope_theta``/``rope_scaling``."""
    params = config.get("rope_parameters") or {}
    base = params.get("rope_theta", config.get("rope_theta", 10000.0))
    scaling = params if params.get("rope_type") not in (None, "default") else (config.get("rope_scaling") or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ("default", "dynamic"):
        raise ValueError(f"RoPE type {kind!r} is not supported (default and dynamic NTK are)")
    return float(base), float(scaling.get("factor", 1.0)) if kind == "dynamic" else 1.0


def number(value) -> float:
    """A config number; ``save_pretrained`` writes infinity as ``{"__float__": "Infinity"}``."""
    return float(value["__float__"]) if isinstance(value, dict) and "__float__" in value else float(value)


def spec(class_path: str, **init_args) -> dict:
    return {"class_path": class_path, "init_args": init_args}


def hf_recipe(folder_or_config: str | Path | dict) -> dict:
    """The ``LanguageModel`` / ``HybridLM`` arguments of the model a folder holds; a missing required key is
    named with the file."""
    c = folder_or_config if isinstance(folder_or_config, dict) else read_config(folder_or_config)
    try:
        return _recipe(c)
    except KeyError as error:
        where = "config.json" if isinstance(folder_or_config, dict) else Path(folder_or_config) / "config.json"
        raise ValueError(f"{where}: the required key {error.args[0]!r} is missing "
                         f"({c.get('architectures', ['?'])[0]} needs it)") from None


def _recipe(c: dict) -> dict:
    architecture = c["architectures"][0]
    base, ntk = rope_settings(c) if architecture != "Mamba2ForCausalLM" else (10000.0, 1.0)
    common = dict(d_model=c["hidden_size"], vocab_size=c["vocab_size"], tie_embeddings=bool(c.get("tie_word_embeddings")),
                  rope_base=base, rope_ntk_factor=ntk, max_seq_len=c.get("max_position_embeddings", 2048))
    L = c["num_hidden_layers"]
    if architecture in ("LlamaForCausalLM", "DogeForCausalLM"):
        heads, kv_heads = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
        head_dim = c.get("head_dim") or c["hidden_size"] // heads
        if head_dim * heads != c["hidden_size"]:
            raise ValueError(f"head_dim={head_dim} · heads={heads} != hidden_size={c['hidden_size']}: not supported")
        if c.get("attention_bias") or c.get("mlp_bias"):
            raise ValueError("attention or MLP biases are not supported (the zoo's linear layers have none)")
        mlp = spec("components.MLP", d_ff=c["intermediate_size"], activation="swiglu", act=c.get("hidden_act", "silu"))
    if architecture == "LlamaForCausalLM":
        return {**common, "pattern": f"AM×{L}", "norm_eps": c["rms_norm_eps"], "mixers": {
            "A": spec("components.QCAttention", n_heads=heads, n_kv_heads=kv_heads), "M": mlp}}
    if architecture == "DogeForCausalLM":
        attention = spec("components.InnerFuncAttention", n_heads=heads, n_kv_heads=kv_heads, inner="linear",
                         mask="content_exp", keep_window=c.get("keep_window_size"), qk_norm=True, norm_eps=c["rms_norm_eps"])
        mixers = {"I": attention}
        if c.get("is_moe"):
            n = c["num_experts"]
            root = int(n ** 0.5)
            if root * root != n:
                raise ValueError(f"num_experts={n} is not a square: Doge's CDMoE uses only the first ⌊√N⌋² experts")
            mixers["E"] = spec("components.CDMoE", n_experts=n, n_heads=1, top_k=c["num_experts_per_tok"],
                               d_ff=c["intermediate_size"], key_dim=None, shared_mlp="swiglu", act=c.get("hidden_act", "silu"),
                               cross_domain="parallel")
        else:
            mixers["M"] = mlp
        return {**common, "pattern": f"I{'E' if c.get('is_moe') else 'M'}×{L}", "norm_eps": c["rms_norm_eps"],
                "residual_scale": True, "mixers": mixers}
    # Mamba2ForCausalLM
    d_inner = int(c.get("expand", 2) * c["hidden_size"])
    if c["num_heads"] * c["head_dim"] != d_inner:
        raise ValueError(f"num_heads·head_dim = {c['num_heads'] * c['head_dim']} != expand·hidden_size = {d_inner}")
    if c.get("use_bias") or not c.get("use_conv_bias", True):
        raise ValueError("Mamba-2 with in/out projection biases, or without a conv bias, is not supported")
    limit = tuple(number(v) for v in c.get("time_step_limit", (0.0, float("inf"))))
    if limit != (0.0, float("inf")):
        raise ValueError(f"time_step_limit={c['time_step_limit']} is not supported (the zoo does not clamp Δ)")
    ssd = spec("components.SSD", n_heads=c["num_heads"], d_state=c["state_size"], n_groups=c["n_groups"],
               expand=int(c.get("expand", 2)), chunk_size=c.get("chunk_size", 256), positions="conv", gate=True,
               conv_kernel=c.get("conv_kernel", 4), norm_eps=c["layer_norm_epsilon"])
    return {**common, "pattern": f"S-×{L}", "norm_eps": c["layer_norm_epsilon"], "mixers": {"S": ssd}}


def convert_weights(config: dict, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face weight names and layouts → the ``HybridLM`` state dict of :func:`hf_recipe`'s model."""
    architecture = config["architectures"][0]
    out, L = {}, config["num_hidden_layers"]
    prefix = "backbone" if architecture == "Mamba2ForCausalLM" else "model"
    for i in range(L):
        hf_layer, ours = f"{prefix}.layers.{i}", f"blocks.{i}"
        take = lambda name: hf.pop(f"{hf_layer}.{name}")  # noqa: E731
        if architecture == "Mamba2ForCausalLM":
            out[f"{ours}.sequence_norm.weight"] = take("norm.weight")
            d_inner = int(config.get("expand", 2) * config["hidden_size"])
            conv_dim = d_inner + 2 * config["n_groups"] * config["state_size"]
            z, xbc, dt = take("mixer.in_proj.weight").split([d_inner, conv_dim, config["num_heads"]])  # HF: [z | xBC | dt]
            m = f"{ours}.sequence_mixer"
            out[f"{m}.in_proj.weight"] = torch.cat([xbc, dt, z])  # ours: [xBC | dt | z]
            out[f"{m}.conv.weight"], out[f"{m}.conv.bias"] = take("mixer.conv1d.weight"), take("mixer.conv1d.bias")
            for name in ("dt_bias", "A_log", "D"):
                out[f"{m}.{name}"] = take(f"mixer.{name}")
            out[f"{m}.gate_norm.weight"] = take("mixer.norm.weight")
            out[f"{m}.out_proj.weight"] = take("mixer.out_proj.weight")
            continue
        out[f"{ours}.sequence_norm.weight"] = take("input_layernorm.weight")
        out[f"{ours}.state_norm.weight"] = take("post_attention_layernorm.weight")
        a, s = f"{ours}.sequence_mixer", f"{ours}.state_mixer"
        out[f"{a}.q_proj.weight"] = take("self_attn.q_proj.weight")
        out[f"{a}.out_proj.weight"] = take("self_attn.o_proj.weight")
        if architecture == "LlamaForCausalLM":
            out[f"{a}.kv_proj.weight"] = torch.cat([take("self_attn.k_proj.weight"), take("self_attn.v_proj.weight")])
        else:  # Doge
            out[f"{a}.k_proj.weight"] = take("self_attn.k_proj.weight")
            out[f"{a}.value.weight"] = take("self_attn.v_proj.weight")
            out[f"{a}.delta_proj.weight"] = take("self_attn.dt_proj.weight")
            out[f"{a}.A"] = take("self_attn.A")
            out[f"{a}.positions.q_norm.weight"] = take("self_attn.q_norm.weight")
            out[f"{a}.positions.k_norm.weight"] = take("self_attn.k_norm.weight")
            out[f"{ours}.sequence_residual"] = take("input_residual")
            out[f"{ours}.state_residual"] = take("post_attention_residual")
        mlp = f"{s}.shared" if architecture == "DogeForCausalLM" and config.get("is_moe") else s
        out[f"{mlp}.in_proj.weight"] = torch.cat([take("mlp.gate_proj.weight"), take("mlp.up_proj.weight")])
        out[f"{mlp}.out_proj.weight"] = take("mlp.down_proj.weight")
        if architecture == "DogeForCausalLM" and config.get("is_moe"):
            out[f"{s}.router.weight"] = take("mlp.router_gate.weight")
            out[f"{s}.down"], out[f"{s}.up"] = take("mlp.down_embed.weight"), take("mlp.up_embed.weight")
    embed = "backbone.embeddings.weight" if architecture == "Mamba2ForCausalLM" else "model.embed_tokens.weight"
    out["embedding.weight"] = hf.pop(embed)
    out["norm.weight"] = hf.pop("backbone.norm_f.weight" if architecture == "Mamba2ForCausalLM" else "model.norm.weight")
    head = hf.pop("lm_head.weight", None)
    out["lm_head.weight"] = out["embedding.weight"] if config.get("tie_word_embeddings") or head is None else head
    leftover = [k for k in hf if not k.endswith("rotary_emb.inv_freq")]
    if leftover:
        raise ValueError(f"weights the zoo has no place for: {leftover[:5]}{' …' if len(leftover) > 5 else ''}")
    return out


def from_pretrained(folder: str | Path) -> HybridLM:
    """The ``HybridLM`` equal to the Hugging Face model saved in ``folder``."""
    config = read_config(folder)
    recipe = hf_recipe(config)
    model = HybridLM(recipe.pop("vocab_size"), recipe.pop("d_model"), recipe.pop("pattern"), recipe.pop("mixers"), **recipe)
    weights = convert_weights(config, read_weights(folder))
    dtype = next(iter(weights.values())).dtype
    model.load_state_dict({k: v.to(torch.float32) for k, v in weights.items()}, strict=True)
    return model.to(dtype) if dtype != torch.float32 else model


def write_checkpoint(folder: str | Path, out: str | Path) -> tuple[Path, Path]:
    """``out`` (a checkpoint ``LanguageModel.load_from_checkpoint`` reads) and ``out`` with ``.yaml``: a recipe
    that fine-tunes from it (``model.init_from``) on the bundled text; edit its ``data:`` for yours."""
    import yaml

    from recipes.module import LanguageModel

    recipe = hf_recipe(folder)
    model = from_pretrained(folder).float()
    lm = LanguageModel(**recipe)
    lm.model.load_state_dict(model.state_dict())
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": lm.state_dict(), "hyper_parameters": dict(lm.hparams),
                "pytorch-lightning_version": "2.6.0", "global_step": 0, "epoch": 0}, out)
    vocab = recipe["vocab_size"]
    config = {
        "seed_everything": 0,
        "model": {**{k: v for k, v in lm.hparams.items() if k in recipe}, "init_from": str(out), "lr": 1e-4},
        "data": {"class_path": "recipes.data.TextCorpus", "init_args": {"seq_len": 256, "batch_size": 8, "vocab_size": vocab}},
        "trainer": {"max_steps": 1000, "val_check_interval": 200, "limit_val_batches": 20,
                    "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                               "init_args": {"save_dir": "runs", "name": f"finetune/{out.stem}", "default_hp_metric": False}}},
    }
    recipe_path = out.with_suffix(".yaml")
    recipe_path.write_text(f"# Fine-tune {Path(folder).name} (converted from Hugging Face by python -m recipes.hf).\n"
                           "# The data below is byte-level text: replace it with your tokenized corpus.\n"
                           + yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return out, recipe_path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="a Hugging Face checkpoint folder (config.json + safetensors)")
    parser.add_argument("--out", required=True, help="the checkpoint to write; a recipe is written beside it (.yaml)")
    args = parser.parse_args(argv)
    try:
        checkpoint, recipe = write_checkpoint(args.folder, args.out)
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
    print(f"wrote {checkpoint} and {recipe}\nfine-tune: python -m recipes fit --config {recipe}")


if __name__ == "__main__":
    main()
