"""What every adapter shares: the config fields that say nothing about the computation and those that must keep
their defaults (:func:`audit`), RoPE's settings, the recipe and ``config.json`` every decoder starts from, and the
weight pairs of the common layers (attention, SwiGLU, Mamba-2's projections)."""

import inspect
import math

import torch

from components.state.mlp import ACTIVATIONS


# Fields that say nothing about the computation (bookkeeping, token ids, initialisation, cache use).
BOOKKEEPING = {
    "transformers_version", "architectures", "output_hidden_states", "return_dict", "dtype", "torch_dtype",
    "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id", "problem_type", "use_cache",
    "bos_token_id", "eos_token_id", "_name_or_path", "model_type", "output_attentions", "initializer_range",
    "tokenizer_class", "prefix", "task_specific_params", "finetuning_task", "torchscript", "use_return_dict",
    "time_step_min", "time_step_max", "time_step_floor", "rescale_prenorm_residual", "output_router_logits",
    "router_aux_loss_coef", "_attn_implementation_autoset", "num_labels", "tie_encoder_decoder", "pruned_heads",
    "cross_attention_hidden_size", "add_cross_attention", "decoder_start_token_id", "sep_token_id",
    "_attn_implementation", "time_step_rank", "residual_in_fp32", "num_logits_to_keep",
    "auto_map",  # (the hub's own code for the class; the import follows transformers' class of that name)
}


# Fields the zoo has no equivalent for, with the only values it computes exactly.
MUST_BE = {"attention_bias": (False, None), "mlp_bias": (False, None), "attention_dropout": (0, 0.0, None),
           "hidden_dropout": (0, 0.0, None), "pretraining_tp": (1, None), "sliding_window": (None,),
           "router_jitter_noise": (0.0, 0, None),
           "use_bias": (False,), "use_conv_bias": (True,), "norm_topk_prob": (False, None), "rms_norm": (True, None),
           "norm_before_gate": (False, None), "hidden_act": ("silu",), "mlp_type": (None,)}


def audit(config: dict, honoured: set[str], where: str) -> None:
    """Refuse, by name, a field that would change the computation and is not honoured."""
    problems = []
    for key, value in config.items():
        if key in honoured or key in BOOKKEEPING:
            continue
        if key in MUST_BE:
            if value not in MUST_BE[key] and not (key == "sliding_window" and value is not None and
                                                  value >= config.get("max_position_embeddings", math.inf)):
                problems.append(f"{key}={value!r} (the zoo computes only {MUST_BE[key][0]!r})")
        elif value not in (None, False, 0, 0.0, [], {}, ""):
            problems.append(f"{key}={value!r} (unknown to the importer)")
    refuse_fields(problems, f"{where}: ")


def refuse_fields(problems: list[str], where: str = "") -> None:
    """Refuse an import whose config has ``problems`` (each a field, its value and why), naming every one."""
    if problems:
        raise ValueError(f"{where}fields the zoo would not honour: {'; '.join(problems)}. Importing would give a model "
                         "that computes something else, so it is refused")


def number(value) -> float:
    """A config number; ``save_pretrained`` writes infinity as ``{"__float__": "Infinity"}``."""
    return float(value["__float__"]) if isinstance(value, dict) and "__float__" in value else float(value)


def rope_settings(config: dict) -> tuple[float, float, bool]:
    """``(base, NTK factor, dynamic)`` from either the 5.x ``rope_parameters`` or the 4.x ``rope_theta``/``rope_scaling``."""
    params = config.get("rope_parameters") or {}
    base = params.get("rope_theta", config.get("rope_theta", 10000.0))
    scaling = params if params.get("rope_type") not in (None, "default") else (config.get("rope_scaling") or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ("default", "dynamic"):
        raise ValueError(f"RoPE type {kind!r} is not supported (default and dynamic NTK are)")
    return float(base), float(scaling.get("factor", 1.0)) if kind == "dynamic" else 1.0, kind == "dynamic"


def spec(class_path: str, **init_args) -> dict:
    return {"class_path": class_path, "init_args": init_args}


def effective(module) -> dict:
    """A module's constructor arguments as they took effect: its signature's defaults, then its attributes."""
    return {name: getattr(module, name, p.default) for name, p in inspect.signature(type(module).__init__).parameters.items()
            if name not in ("self", "d_model")}


def common_recipe(c: dict, base: float, ntk: float, dynamic: bool, extrapolate: bool = False,
                  padding: bool = True) -> dict:
    """The model-level arguments; ``padding``: the HF class gives its embedding the ``pad_token_id`` as
    ``padding_idx`` (Llama and Doge do, Mamba-2 does not)."""
    pad = c.get("pad_token_id") if padding else None
    return dict(d_model=c["hidden_size"], vocab_size=c["vocab_size"], tie_embeddings=bool(c.get("tie_word_embeddings")),
                rope_base=base, rope_ntk_factor=ntk, max_seq_len=c.get("max_position_embeddings", 2048),
                extrapolate=dynamic or extrapolate,
                padding_idx=pad if isinstance(pad, int) and 0 <= pad < c["vocab_size"] else None)


def common_config(model, architecture: str, model_type: str) -> dict:
    """The fields every exported config shares."""
    rotary = model.rotary
    config = {"architectures": [architecture], "model_type": model_type, "vocab_size": model.vocab_size,
              "hidden_size": model.d_model, "num_hidden_layers": len(model.blocks),
              "tie_word_embeddings": bool(model.tie_embeddings), "dtype": str(model.embedding.weight.dtype).split(".")[1],
              "pad_token_id": model.embedding.padding_idx}
    if architecture != "Mamba2ForCausalLM":
        config["max_position_embeddings"] = model.max_seq_len
        config["rope_theta"] = rotary.base
        if model.extrapolate:
            config["rope_scaling"] = {"rope_type": "dynamic", "factor": rotary.scaling_factor}
    return config


def mamba_in_proj(zoo_name: str, hf_name: str, z: int, xbc: int, dt: int) -> tuple:
    """Mamba-2's fused input projection, Hugging Face's rows ``[z | xBC | dt]``, the zoo's ``[xBC | dt | z]``:
    ``(zoo name, HF name, HF → zoo, zoo → HF)``."""
    def to_zoo(w: torch.Tensor) -> torch.Tensor:
        z_rows, xbc_rows, dt_rows = w.split([z, xbc, dt])
        return torch.cat([xbc_rows, dt_rows, z_rows])

    def to_hf(w: torch.Tensor) -> torch.Tensor:
        xbc_rows, dt_rows, z_rows = w.split([xbc, dt, z])
        return torch.cat([z_rows, xbc_rows, dt_rows])

    return zoo_name, hf_name, to_zoo, to_hf


def transposed(zoo_name: str, hf_name: str) -> tuple:
    """A stacked experts' tensor stored ``[E, out, in]`` by Hugging Face and ``[E, in, out]`` by the zoo."""
    def swap(w: torch.Tensor) -> torch.Tensor:
        return w.transpose(1, 2).contiguous()  # (safetensors writes contiguous tensors only)

    return zoo_name, hf_name, swap, swap


def mamba2_pairs(ours: str, theirs: str) -> list[tuple[str, list[str]]]:
    """Mamba-2's weights that only change names, from the zoo's SSD ``ours`` to Hugging Face's mixer ``theirs``
    (Mamba-2's, Granite's and Bamba's mixers name them alike; ``in_proj`` is reordered, :func:`mamba_in_proj`)."""
    return [(f"{ours}.conv.weight", [f"{theirs}.conv1d.weight"]), (f"{ours}.conv.bias", [f"{theirs}.conv1d.bias"]),
            (f"{ours}.dt_bias", [f"{theirs}.dt_bias"]), (f"{ours}.A_log", [f"{theirs}.A_log"]), (f"{ours}.D", [f"{theirs}.D"]),
            (f"{ours}.gate_norm.weight", [f"{theirs}.norm.weight"]), (f"{ours}.out_proj.weight", [f"{theirs}.out_proj.weight"])]


def swiglu_pairs(ours: str, theirs: str) -> list[tuple[str, list[str]]]:
    """Llama's MLP (Bamba's alike) as the zoo's SwiGLU ``MLP``: its ``in_proj`` rows are ``[gate | up]``."""
    return [(f"{ours}.in_proj.weight", [f"{theirs}.gate_proj.weight", f"{theirs}.up_proj.weight"]),
            (f"{ours}.out_proj.weight", [f"{theirs}.down_proj.weight"])]


def attention_pairs(ours: str, theirs: str, out: str = "o_proj") -> list[tuple[str, list[str]]]:
    """Llama's attention (Granite's and Bamba's alike; LFM2's, whose output projection is ``out_proj``) as the zoo's
    ``QCAttention``: keys and values in one matrix."""
    return [(f"{ours}.q_proj.weight", [f"{theirs}.q_proj.weight"]),
            (f"{ours}.kv_proj.weight", [f"{theirs}.k_proj.weight", f"{theirs}.v_proj.weight"]),
            (f"{ours}.out_proj.weight", [f"{theirs}.{out}.weight"])]


def compact_pattern(tokens: list[str]) -> str:
    """A pattern from each layer's token: ``AR×4`` where they are all one, else ``AM AR AR``."""
    return f"{tokens[0]}×{len(tokens)}" if len(set(tokens)) == 1 else " ".join(tokens)


def partial_rope_parameters(config: dict, model, fraction: float) -> dict:
    """``config`` (a :func:`common_config`) with its ``rope_theta`` and ``rope_scaling`` moved into ``rope_parameters``
    beside ``partial_rotary_factor``: transformers reads a config with ``rope_theta`` alone as its class's default share."""
    config = dict(config)
    scaling, base = config.pop("rope_scaling", None), config.pop("rope_theta")
    rope = {"rope_type": "dynamic", "factor": model.rotary.scaling_factor} if scaling else {"rope_type": "default"}
    return {**config, "rope_parameters": {**rope, "rope_theta": base, "partial_rotary_factor": fraction}}


def nothing_reshaped(c: dict, i: int) -> list[tuple]:
    """The weights of layer ``i`` that need more than a rename and a concatenation: none."""
    return []


def decoder_layer_pairs(i: int, qk_norm: bool = False, qkv_bias: bool = False) -> list[tuple[str, list[str]]]:
    """Layer ``i``'s norms and attention in transformers' decoders (Llama's, Qwen3's with ``qk_norm``, Qwen2's with
    ``qkv_bias``, Mixtral's, Qwen3-MoE's): everything but the MLP or MoE."""
    hf, ours = f"model.layers.{i}", f"blocks.{i}"
    pairs = [(f"{ours}.sequence_norm.weight", [f"{hf}.input_layernorm.weight"]),
             (f"{ours}.state_norm.weight", [f"{hf}.post_attention_layernorm.weight"]),
             *attention_pairs(f"{ours}.sequence_mixer", f"{hf}.self_attn")]
    if qkv_bias:  # (keys' and values' biases in one vector, as their weights in one matrix)
        pairs += [(f"{ours}.sequence_mixer.q_proj.bias", [f"{hf}.self_attn.q_proj.bias"]),
                  (f"{ours}.sequence_mixer.kv_proj.bias", [f"{hf}.self_attn.k_proj.bias", f"{hf}.self_attn.v_proj.bias"])]
    if qk_norm:
        pairs += [(f"{ours}.sequence_mixer.positions.{norm}.weight", [f"{hf}.self_attn.{norm}.weight"])
                  for norm in ("q_norm", "k_norm")]
    return pairs


def only(model, token: str, why: str) -> str | None:
    tokens = [block.token for block in model.blocks]
    if any(t != token for t in tokens):
        return f"its pattern has blocks {sorted(set(tokens))}; {why}"
    return None


def act_name(function) -> str:
    """The name of one of the zoo's activations (an expert bank keeps the function)."""
    return next(name for name, f in ACTIVATIONS.items() if f is function)
