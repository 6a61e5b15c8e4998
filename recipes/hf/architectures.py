"""One adapter per Hugging Face architecture the zoo can be: Llama, Qwen2, Qwen3, Mistral, Mixtral, Qwen3-MoE,
Qwen2-MoE, dots.llm1 and GLM-4.5 (import), Mamba-2, Doge (dense and CDMoE), the hybrids of Mamba-2 and attention
layers, Granite 4.0, Bamba and Nemotron-H, Falcon-H1's of the two side by side, LFM2's of gated short
convolutions and attention, Qwen3-Next's and Qwen3.5's of Gated DeltaNet and gated attention, and AI2's OLMo 2, OLMo 3
and OLMo-Hybrid (norms after the mixers, a QK-norm over every head; OLMo-Hybrid's beside Gated DeltaNet).

Each adapter knows, for its ``transformers`` class: the zoo model a ``config.json`` describes (``recipe``),
the weights both ways (``to_zoo``, ``to_hf``), the ``config.json`` a zoo model is (``config``, for export),
and why a zoo model is not one (``mismatch``). Every config field is accounted for (:func:`audit`): one that
changes the computation is honoured, or the import is refused by name — never dropped silently.
"""

import inspect
import math

import torch

from components.sequence import GatedDeltaNet, ParallelMixers, QCAttention, ShortConv
from components.state.mlp import ACTIVATIONS
from components.state.moe import MoE

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


class Llama:
    name, model_type = "LlamaForCausalLM", "llama"
    honoured = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_theta",
                "rope_parameters", "rope_scaling", "tie_word_embeddings", "pad_token_id"}

    @staticmethod
    def recipe(c: dict) -> dict:
        return decoder_recipe(c)

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        """``(zoo name, HF names concatenated along dim 0)`` of layer ``i``."""
        return [*decoder_layer_pairs(i), *swiglu_pairs(f"blocks.{i}.state_mixer", f"model.layers.{i}.mlp")]

    ends = [("embedding.weight", ["model.embed_tokens.weight"]), ("norm.weight", ["model.norm.weight"])]
    reshaped = staticmethod(nothing_reshaped)

    @staticmethod
    def mismatch(model) -> str | None:
        return decoder_mismatch(model, Llama.name, qk_norm=False)

    @staticmethod
    def config(model) -> dict:
        return decoder_config(model, Llama.name, Llama.model_type)


def attention_shape(c: dict, *, decoupled: bool = False, head_dim: int | None = None) -> tuple[int, int, int]:
    """``(heads, key/value heads, head_dim)``; ``head_dim`` the class's default when the config has none (else the
    width over the heads). Heads whose widths do not add up to the model's are refused unless ``decoupled`` (the
    class's attention is the zoo's ``QCAttention``, which takes ``head_dim``)."""
    heads, kv_heads = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
    head_dim = c.get("head_dim") or head_dim or c["hidden_size"] // heads
    if head_dim * heads != c["hidden_size"] and not decoupled:
        raise ValueError(f"head_dim={head_dim} · heads={heads} != hidden_size={c['hidden_size']}: not supported")
    return heads, kv_heads, head_dim


def decoder_recipe(c: dict, head_dim: int | None = None, **attention) -> dict:
    """Llama's stack (Qwen3's with ``qk_norm``): QCAttention with RoPE and a SwiGLU MLP in every block."""
    base, ntk, dynamic = rope_settings(c)
    heads, kv_heads, head_dim = attention_shape(c, decoupled=True, head_dim=head_dim)
    if head_dim * heads != c["hidden_size"]:
        attention["head_dim"] = head_dim  # (the default otherwise: the width over the heads)
    mlp = spec("components.MLP", d_ff=c["intermediate_size"], activation="swiglu", act=c.get("hidden_act", "silu"))
    return {**common_recipe(c, base, ntk, dynamic), "pattern": f"AM×{c['num_hidden_layers']}",
            "norm_eps": c["rms_norm_eps"],
            "mixers": {"A": spec("components.QCAttention", n_heads=heads, n_kv_heads=kv_heads, **attention), "M": mlp}}


def layer_settings(block) -> tuple:
    """What a decoder layer computes with, its attention's window aside: the heads, RoPE and QK-norm, and the MLP's or
    the MoE's shape."""
    a, m = block.sequence_mixer, block.state_mixer
    norm = a.positions.q_norm
    state = ((m.router.n_experts, m.router.top_k, m.experts.d_ff, m.experts.activation, act_name(m.experts.act))
             if isinstance(m, MoE) else (m.d_ff, m.activation, m.act_name))
    return (a.n_heads, a.n_kv_heads, a.head_dim, a.positions.rope, a.positions.rope_fraction,
            None if norm is None else norm.eps, a.qkv_bias, state)


def routed_moe_mismatch(m, short: str, normalized: bool | None) -> str | None:
    """What keeps a MoE from transformers' sparse block (Mixtral's, Qwen3-MoE's): a TopKRouter over SwiGLU experts, no
    shared expert, no cross-domain part, its top-k gates renormalised where ``normalized`` (None: either)."""
    if (type(m.router).__name__ != "TopKRouter" or (normalized is not None and m.router.normalize != normalized)
            or type(m.experts).__name__ != "MLPExperts" or m.experts.activation != "swiglu"
            or m.shared_expert is not None or m.cross_domain is not None):
        gates = {True: " with normalised gates", False: " with gates not renormalised", None: ""}[normalized]
        return (f"its MoE is not {short}'s (a TopKRouter{gates} over SwiGLU experts, no shared expert, no "
                "cross-domain part)")
    return None


STATE_MIXERS = {"M": "SwiGLU MLP", "R": "routed MoE"}
"""The state letters of transformers' decoders (:func:`decoder_mismatch`)."""


def decoder_mismatch(model, name: str, *, qk_norm: bool, windows: str = "none", states: str = "M",
                     normalized: bool | None = True, qkv_bias: bool = False) -> str | None:
    """What keeps ``model`` from Llama's stack (``qk_norm``: Qwen3's, a QK-norm of the model's eps; ``qkv_bias``:
    Qwen2's, biases on the query, key and value projections). ``windows``: which
    attention windows the class writes — ``none`` (Llama: every key), ``every layer`` (Mistral: one window, or none, for
    every layer) or ``per layer`` (Qwen3: one window, on any of the layers; their blocks may then have two letters).
    ``states``: the state letters its blocks may have — ``M``, a SwiGLU MLP; ``R``, a routed MoE of SwiGLU experts whose
    top-k gates are renormalised (``normalized``: Mixtral's), or not, or either (None: Qwen3-MoE's ``norm_topk_prob``)."""
    short = name.removesuffix("ForCausalLM")
    mixers = " or ".join(STATE_MIXERS[letter] for letter in states)
    why = (f"a {name} is QCAttention{' with a QK-norm' if qk_norm else ''} + {mixers} in every block "
           f"({', '.join(repr('A' + letter) for letter in states)})")
    blocks = model.blocks
    tokens = sorted({block.token for block in blocks})
    if windows != "per layer" and not set(tokens) <= {"A" + letter for letter in states}:
        return f"its pattern has blocks {tokens}; {why}"
    # (a whole block, the Expresser's, has no mixers of its own)
    kinds = sorted({f"{type(getattr(b, 'sequence_mixer', b)).__name__}/{type(getattr(b, 'state_mixer', None)).__name__}"
                    for b in blocks})
    if windows == "per layer" and kinds != ["QCAttention/MLP"]:
        return f"its pattern has blocks of {', '.join(kinds)}; {why}"

    def letter_of(block) -> str:  # (per layer, the blocks are all attention and MLPs, whatever their letters)
        return "M" if windows == "per layer" else block.token[1]

    for block in blocks:
        letter, a, m = letter_of(block), getattr(block, "sequence_mixer", block), getattr(block, "state_mixer", None)
        if type(a).__name__ != "QCAttention" or (type(m).__name__ != "MLP" if letter == "M" else not isinstance(m, MoE)):
            return f"its 'A'/'{letter}' letters are {type(a).__name__}/{type(m).__name__}; {why}"
        if letter != "M" and (reason := routed_moe_mismatch(m, short, normalized)):
            return reason
        if letter == "M" and m.activation != "swiglu":  # (its act is the config's hidden_act: SiLU, GELU or ReLU)
            return f"its MLP is {m.activation} with {m.act_name}; {short}'s is SwiGLU"
    settings = {(letter_of(block), layer_settings(block)) for block in blocks}
    if len({layer[:-1] for _, layer in settings}) > 1 or len(settings) > len({letter for letter, _ in settings}):
        return f"its blocks' attentions or MLPs differ in more than a window; {short}'s layers are alike"
    acts = {layer[-1][-1] for _, layer in settings}
    if len(acts) > 1:
        return f"its MLPs and experts use different activations {sorted(acts)}; a {name} has one hidden_act"
    block = blocks[0]
    a = block.sequence_mixer
    window_sizes = {b.sequence_mixer.sliding_window for b in blocks}
    if windows == "none" and window_sizes != {None}:
        return f"its attention keeps to the last {max(window_sizes - {None})} keys; {short}'s attends to every key"
    if windows == "every layer" and len(window_sizes) > 1:
        return f"its layers keep to different windows {sorted(window_sizes, key=str)}; {short}'s have one"
    if len(window_sizes - {None}) > 1:
        return f"its layers keep to different windows {sorted(window_sizes - {None})}; {short} has one sliding_window"
    if not a.positions.rope or (a.positions.q_norm is not None) != qk_norm:
        return (f"its attention has no RoPE or no QK-norm; {short}'s has both" if qk_norm else
                f"its attention has no RoPE or has a QK-norm, which {short} has not")
    if a.positions.rope_fraction != 1:
        return f"its attention turns {a.positions.rope_fraction:g} of each head by RoPE; {short}'s turns all of it"
    if a.qkv_bias != qkv_bias:
        return (f"its attention has no bias on its query, key and value projections; {short}'s has" if qkv_bias else
                f"its attention has biases on its query, key and value projections (qkv_bias); {short}'s has none")
    if qk_norm and a.positions.q_norm.eps != model.norm.eps:
        return (f"its attention's QK-norm has eps {a.positions.q_norm.eps} and its other norms {model.norm.eps}; a "
                f"{name} has one rms_norm_eps for all of them")
    if block.sequence_residual is not None:
        return f"its blocks scale their residuals, which {short} does not"
    return None


def decoder_config(model, name: str, model_type: str) -> dict:
    block = model.blocks[0]
    a, m = block.sequence_mixer, block.state_mixer
    d_ff, act = (m.experts.d_ff, act_name(m.experts.act)) if isinstance(m, MoE) else (m.d_ff, m.act_name)
    return {**common_config(model, name, model_type), "intermediate_size": d_ff, "num_attention_heads": a.n_heads,
            "num_key_value_heads": a.n_kv_heads, "head_dim": a.head_dim, "hidden_act": act,
            "rms_norm_eps": model.norm.eps, "attention_bias": False, "mlp_bias": False}


QWEN3_HEAD_DIM = 128
"""Qwen3's ``head_dim`` where its config has none: transformers' ``Qwen3Config`` default, not the width over the heads."""


QWEN3_WINDOW = 4096
"""Qwen3's ``sliding_window`` where its config turns windows on (``use_sliding_window``) and gives none: transformers'
``Qwen3Config`` default."""


def windowed_layer_types(c: dict, window: int | None, first_windowed: int) -> list[bool]:
    """Whether each layer attends within ``window``, as transformers reads it for Qwen3 and dots.llm1: the layers
    ``layer_types`` names ``sliding_attention``, or where it has none those from ``first_windowed`` on; none without a
    window."""
    layers = c["num_hidden_layers"]
    types = c.get("layer_types") or ["sliding_attention" if window is not None and i >= first_windowed
                                     else "full_attention" for i in range(layers)]
    if len(types) != layers or set(types) - {"full_attention", "sliding_attention"}:
        raise ValueError(f"layer_types={types!r}: num_hidden_layers={layers} of full_attention, sliding_attention "
                         "expected")
    return [window is not None and kind == "sliding_attention" for kind in types]


def qwen3_windowed_layers(c: dict) -> tuple[int | None, list[bool]]:
    """``(window, whether each layer attends within it)`` of a Qwen3 config, as transformers reads them: no window
    unless ``use_sliding_window``; the layers ``layer_types`` names ``sliding_attention``, or where it has none those
    from ``max_window_layers`` on (28 where the config has none)."""
    window = qwen3_window(c)
    return window, windowed_layer_types(c, window, c.get("max_window_layers", 28))


def qwen3_window(c: dict) -> int | None:
    """A Qwen3's (or Qwen3-MoE's) window: ``sliding_window`` (4,096 where the config gives none) where
    ``use_sliding_window``; else none, as transformers drops it."""
    return checked_window(c.get("sliding_window", QWEN3_WINDOW)) if c.get("use_sliding_window") else None


def checked_window(window) -> int | None:
    """A config's ``sliding_window``: None (every key) or a whole number of keys, at least one; else refused by name."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"sliding_window={window!r}: a window of at least one key expected")
    return window


def windowed_spec(attention: dict, window: int) -> dict:
    """An attention's spec, keeping to the last ``window`` keys."""
    return spec(attention["class_path"], **attention["init_args"], sliding_window=window)


def windowed(recipe: dict, window: int | None, layers: list[bool]) -> dict:
    """A decoder ``recipe`` (``AM`` blocks) whose ``layers`` attend to the last ``window`` keys only: every layer's
    ``A`` windowed, or a second attention letter ``W``, the same but windowed, at those layers."""
    if window is None or not any(layers):
        return recipe
    window_attention = windowed_spec(recipe["mixers"]["A"], window)
    if all(layers):
        return {**recipe, "mixers": {**recipe["mixers"], "A": window_attention}}
    return {**recipe, "pattern": " ".join("WM" if layer else "AM" for layer in layers),
            "mixers": {**recipe["mixers"], "W": window_attention}}


def attention_windows(model) -> tuple[int | None, list[bool]]:
    """``(the window, whether each block's attention keeps to it)`` of a decoder whose blocks all hold a QCAttention;
    the window of the first windowed block (:func:`decoder_mismatch` refuses two)."""
    windows = [block.sequence_mixer.sliding_window for block in model.blocks]
    window = next((w for w in windows if w is not None), None)
    return window, [w is not None for w in windows]


MISTRAL_WINDOW = 4096
"""Mistral's ``sliding_window`` where its config has none: transformers' ``MistralConfig`` default."""


class Mistral:
    """Mistral: Llama's stack (its ``head_dim`` too: Mistral-Nemo's heads are 128 channels in a width of 5,120 over 32
    heads) whose every layer attends to the last ``sliding_window`` keys (none where it is null). A zoo model whose
    attention has no window exports as Llama, which computes the same; one whose every layer has the same window, as
    Mistral."""

    name, model_type = "MistralForCausalLM", "mistral"
    honoured = Llama.honoured | {"sliding_window"}
    ends, reshaped, layer_pairs = Llama.ends, staticmethod(nothing_reshaped), staticmethod(Llama.layer_pairs)

    @staticmethod
    def recipe(c: dict) -> dict:
        window = checked_window(c.get("sliding_window", MISTRAL_WINDOW))
        return windowed(decoder_recipe(c), window, [True] * c["num_hidden_layers"])

    @staticmethod
    def mismatch(model) -> str | None:
        return decoder_mismatch(model, Mistral.name, qk_norm=False, windows="every layer")

    @staticmethod
    def config(model) -> dict:
        return {**decoder_config(model, Mistral.name, Mistral.model_type), "sliding_window": attention_windows(model)[0]}


def expert_stacks(ours: str, theirs: str, E: int, gate: str, up: str, down: str) -> list[tuple]:
    """A bank of ``E`` SwiGLU experts as transformers' files hold it, one matrix each (``{theirs}.{e}.{gate}.weight``
    and ``up`` ``[d_ff, d]``, ``down`` ``[d, d_ff]``: Mixtral's ``w1``, ``w3``, ``w2``; Qwen3-MoE's ``gate_proj``,
    ``up_proj``, ``down_proj``), and the zoo's stacks ``{ours}.w_in [E, d, gate | up]`` and ``{ours}.w_out [E, d_ff, d]``."""
    def w_in(*weights: torch.Tensor) -> torch.Tensor:  # gate₀, up₀, gate₁, up₁, … → [E, d, 2·d_ff]
        return torch.stack([torch.cat(weights[2 * e:2 * e + 2]) for e in range(E)]).transpose(1, 2).contiguous()

    def w_in_back(w: torch.Tensor) -> list[torch.Tensor]:
        return [half.contiguous() for e in range(E) for half in w[e].T.chunk(2)]  # (safetensors: contiguous only)

    def w_out(*weights: torch.Tensor) -> torch.Tensor:  # down₀, down₁, … → [E, d_ff, d]
        return torch.stack([w.T for w in weights]).contiguous()

    def w_out_back(w: torch.Tensor) -> list[torch.Tensor]:
        return [w[e].T.contiguous() for e in range(E)]

    return [(f"{ours}.w_in", [f"{theirs}.{e}.{name}.weight" for e in range(E) for name in (gate, up)], w_in, w_in_back),
            (f"{ours}.w_out", [f"{theirs}.{e}.{down}.weight" for e in range(E)], w_out, w_out_back)]


def mixtral_experts(c: dict, i: int) -> list[tuple]:
    """Mixtral's experts: ``block_sparse_moe.experts.{e}.w1`` (gate), ``w3`` (up), ``w2`` (down)."""
    return expert_stacks(f"blocks.{i}.state_mixer.experts", f"model.layers.{i}.block_sparse_moe.experts",
                         c.get("num_local_experts", MIXTRAL_EXPERTS), "w1", "w3", "w2")


MIXTRAL_EXPERTS, MIXTRAL_TOP_K = 8, 2
"""Mixtral's ``num_local_experts`` and ``num_experts_per_tok`` where its config has none: ``MixtralConfig``'s defaults."""


class Mixtral:
    """Mixtral: Mistral's stack with a routed MoE in place of the MLP (``R``: ``RoutedMoE`` with SwiGLU experts and
    normalised gates, Mixtral's softmax over every expert renormalised over the top-k), every layer windowed by
    ``sliding_window`` (null, every key, where the config has none: ``MixtralConfig``'s default)."""

    name, model_type = "MixtralForCausalLM", "mixtral"
    honoured = Mistral.honoured | {"num_local_experts", "num_experts_per_tok"}
    ends = Llama.ends

    @staticmethod
    def recipe(c: dict) -> dict:
        window, layers = checked_window(c.get("sliding_window")), c["num_hidden_layers"]
        recipe = decoder_recipe(c)
        moe = spec("components.RoutedMoE", n_experts=c.get("num_local_experts", MIXTRAL_EXPERTS),
                   top_k=c.get("num_experts_per_tok", MIXTRAL_TOP_K), d_ff=c["intermediate_size"],
                   act=c.get("hidden_act", "silu"), normalize=True)
        recipe = {**recipe, "pattern": f"AR×{layers}", "mixers": {"A": recipe["mixers"]["A"], "R": moe}}
        return windowed(recipe, window, [True] * layers)

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        return [*decoder_layer_pairs(i), (f"blocks.{i}.state_mixer.router.centroids.weight",
                                          [f"model.layers.{i}.block_sparse_moe.gate.weight"])]

    reshaped = staticmethod(mixtral_experts)

    @staticmethod
    def mismatch(model) -> str | None:
        return decoder_mismatch(model, Mixtral.name, qk_norm=False, windows="every layer", states="R")

    @staticmethod
    def config(model) -> dict:
        moe = model.blocks[0].state_mixer
        return {**decoder_config(model, Mixtral.name, Mixtral.model_type), "sliding_window": attention_windows(model)[0],
                "num_local_experts": moe.router.n_experts, "num_experts_per_tok": moe.router.top_k,
                "router_jitter_noise": 0.0}


class Qwen3:
    """Qwen3: Llama's stack with a per-head RMSNorm on Q and K before RoPE (``qk_norm``, of the model's eps) and heads
    whose width need not divide the model's (``head_dim``, 128 unless the config says)."""

    name, model_type = "Qwen3ForCausalLM", "qwen3"
    honoured = Llama.honoured | {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"}
    ends, reshaped = Llama.ends, staticmethod(nothing_reshaped)

    @staticmethod
    def recipe(c: dict) -> dict:
        window, layers = qwen3_windowed_layers(c)
        return windowed(decoder_recipe(c, head_dim=QWEN3_HEAD_DIM, qk_norm=True, norm_eps=c["rms_norm_eps"]), window,
                        layers)

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        return [*decoder_layer_pairs(i, qk_norm=True), *swiglu_pairs(f"blocks.{i}.state_mixer", f"model.layers.{i}.mlp")]

    @staticmethod
    def mismatch(model) -> str | None:
        return decoder_mismatch(model, Qwen3.name, qk_norm=True, windows="per layer")

    @staticmethod
    def config(model) -> dict:
        window, layers = attention_windows(model)
        return {**decoder_config(model, Qwen3.name, Qwen3.model_type), "use_sliding_window": window is not None,
                "sliding_window": window, "max_window_layers": layers.index(True) if window else len(layers),
                "layer_types": ["sliding_attention" if layer else "full_attention" for layer in layers]}


class Qwen2:
    """Qwen2 (Qwen2.5's class too): Llama's stack with a bias on the query, key and value projections
    (``QCAttention(qkv_bias=True)``) and Qwen3's windowed layers (``use_sliding_window``, ``max_window_layers``,
    ``layer_types``). A zoo model exports as one only with those biases (and as Llama, Mistral or Qwen3 only without)."""

    name, model_type = "Qwen2ForCausalLM", "qwen2"
    honoured = Qwen3.honoured
    ends, reshaped = Llama.ends, staticmethod(nothing_reshaped)

    @staticmethod
    def recipe(c: dict) -> dict:
        window, layers = qwen3_windowed_layers(c)
        return windowed(decoder_recipe(c, qkv_bias=True), window, layers)

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        return [*decoder_layer_pairs(i, qkv_bias=True), *swiglu_pairs(f"blocks.{i}.state_mixer", f"model.layers.{i}.mlp")]

    @staticmethod
    def mismatch(model) -> str | None:
        return decoder_mismatch(model, Qwen2.name, qk_norm=False, windows="per layer", qkv_bias=True)

    @staticmethod
    def config(model) -> dict:
        config = {**Qwen3.config(model), "architectures": [Qwen2.name], "model_type": Qwen2.model_type}
        del config["attention_bias"]  # (Qwen2 has no such field: its biases are always there)
        return config


QWEN3_MOE_EXPERTS, QWEN3_MOE_TOP_K, QWEN3_MOE_WIDTH = 128, 8, 768
"""Qwen3-MoE's ``num_experts``, ``num_experts_per_tok`` and ``moe_intermediate_size`` where its config has none:
``Qwen3MoeConfig``'s defaults."""


def qwen3_moe_experts(c: dict) -> int:
    """A Qwen3-MoE's expert count: ``num_experts``, or ``num_local_experts`` as transformers 5 writes it (it reads
    either as the other, so two that disagree are refused)."""
    counts = {c[key] for key in ("num_experts", "num_local_experts") if key in c}
    if len(counts) > 1:
        raise ValueError(f"num_experts={c['num_experts']} and num_local_experts={c['num_local_experts']} disagree: "
                         "transformers reads each as the other")
    return counts.pop() if counts else QWEN3_MOE_EXPERTS


def qwen3_moe_layers(c: dict) -> list[bool]:
    """Which layers of a Qwen3-MoE hold the routed MoE, as transformers decides: where it has experts, those not in
    ``mlp_only_layers`` whose number (from 1) ``decoder_sparse_step`` divides; the others a SwiGLU MLP."""
    step, dense = c.get("decoder_sparse_step", 1), set(c.get("mlp_only_layers") or [])
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"decoder_sparse_step={step!r}: a whole number of layers, at least 1, expected")
    experts = qwen3_moe_experts(c)
    return [experts > 0 and i not in dense and (i + 1) % step == 0 for i in range(c["num_hidden_layers"])]


class Qwen3Moe:
    """Qwen3-MoE: Qwen3's attention (a QK-norm of the model's eps; heads of ``head_dim`` where the config gives one,
    else the width over the heads, as transformers reads it) with a routed MoE (``R``: ``RoutedMoE``, a softmax over
    every expert and its top-k, renormalised where ``norm_topk_prob``; SwiGLU experts of ``moe_intermediate_size``) in
    the layers ``decoder_sparse_step`` and ``mlp_only_layers`` leave to it, a SwiGLU MLP (``M``) in the others, and
    every layer windowed by ``sliding_window`` where ``use_sliding_window``."""

    name, model_type = "Qwen3MoeForCausalLM", "qwen3_moe"
    honoured = Llama.honoured | {"use_sliding_window", "sliding_window", "decoder_sparse_step", "moe_intermediate_size",
                                 "num_experts_per_tok", "num_experts", "num_local_experts", "norm_topk_prob",
                                 "mlp_only_layers"}
    ends = Llama.ends

    @staticmethod
    def recipe(c: dict) -> dict:
        window, moe = qwen3_window(c), qwen3_moe_layers(c)
        base = decoder_recipe(c, qk_norm=True, norm_eps=c["rms_norm_eps"])
        mixers = {"A": base["mixers"]["A"]}
        if not all(moe):
            mixers["M"] = base["mixers"]["M"]
        if any(moe):
            mixers["R"] = spec("components.RoutedMoE", n_experts=qwen3_moe_experts(c),
                               top_k=c.get("num_experts_per_tok", QWEN3_MOE_TOP_K),
                               d_ff=c.get("moe_intermediate_size", QWEN3_MOE_WIDTH), act=c.get("hidden_act", "silu"),
                               normalize=bool(c.get("norm_topk_prob", False)))
        letters = ["AR" if layer else "AM" for layer in moe]
        pattern = compact_pattern(letters)
        return windowed({**base, "pattern": pattern, "mixers": mixers}, window, [True] * len(moe))

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        hf, ours = f"model.layers.{i}", f"blocks.{i}"
        pairs = decoder_layer_pairs(i, qk_norm=True)
        if qwen3_moe_layers(c)[i]:
            return [*pairs, (f"{ours}.state_mixer.router.centroids.weight", [f"{hf}.mlp.gate.weight"])]
        return [*pairs, *swiglu_pairs(f"{ours}.state_mixer", f"{hf}.mlp")]

    @staticmethod
    def reshaped(c: dict, i: int) -> list[tuple]:
        if not qwen3_moe_layers(c)[i]:
            return []
        return expert_stacks(f"blocks.{i}.state_mixer.experts", f"model.layers.{i}.mlp.experts", qwen3_moe_experts(c),
                             "gate_proj", "up_proj", "down_proj")

    @staticmethod
    def mismatch(model) -> str | None:
        return decoder_mismatch(model, Qwen3Moe.name, qk_norm=True, windows="every layer", states="MR", normalized=None)

    @staticmethod
    def config(model) -> dict:
        window, _ = attention_windows(model)
        states = [block.state_mixer for block in model.blocks]
        routed = next((m for m in states if isinstance(m, MoE)), None)
        dense = next((m for m in states if not isinstance(m, MoE)), None)
        return {**decoder_config(model, Qwen3Moe.name, Qwen3Moe.model_type),
                "intermediate_size": (dense or routed.experts).d_ff, "use_sliding_window": window is not None,
                "sliding_window": window, "decoder_sparse_step": 1,
                "mlp_only_layers": [i for i, m in enumerate(states) if not isinstance(m, MoE)],
                "num_experts": routed.router.n_experts if routed else 0,
                "num_experts_per_tok": routed.router.top_k if routed else 1,
                "moe_intermediate_size": routed.experts.d_ff if routed else dense.d_ff,
                "norm_topk_prob": bool(routed and routed.router.normalize)}


QWEN2_MOE_DEFAULTS = {"num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                      "shared_expert_intermediate_size": 5632}
"""Qwen2-MoE's expert fields where its config has none: ``Qwen2MoeConfig``'s defaults."""


def mixed_decoder(base: dict, moe: list[bool], letter: str, moe_spec, window: int | None = None,
                  windowed_layers: list[bool] | None = None) -> dict:
    """A decoder ``base`` recipe (``AM`` blocks) whose ``moe`` layers hold a MoE (letter ``letter``, built by
    ``moe_spec()`` where there are any) and whose ``windowed_layers`` attend to the last ``window`` keys (letter ``W``):
    Qwen2-MoE's, dots.llm1's and GLM-4.5's stacks."""
    windowed_layers = windowed_layers or [False] * len(moe)
    mixers = {"A": base["mixers"]["A"]}
    if any(windowed_layers):
        mixers["W"] = windowed_spec(mixers["A"], window)
    if not all(moe):
        mixers["M"] = base["mixers"]["M"]
    if any(moe):
        mixers[letter] = moe_spec()
    tokens = [("W" if w else "A") + (letter if m else "M") for w, m in zip(windowed_layers, moe)]
    pattern = compact_pattern(tokens)
    return {**base, "pattern": pattern, "mixers": mixers}


def qwen2_moe_windowed_layers(c: dict) -> tuple[int | None, list[bool]]:
    """``(window, whether each layer attends within it)`` of a Qwen2-MoE config, as transformers reads them: no window
    unless ``use_sliding_window``; the layers ``layer_types`` names ``sliding_attention``, or where it has none every
    other layer from the first (0, 2, 4, …) before ``max_window_layers`` (28 where the config has none) — not Qwen2's
    rule, which windows the layers from it on."""
    window = qwen3_window(c)
    if c.get("layer_types") is None:
        last = c.get("max_window_layers", 28)
        c = {**c, "layer_types": ["sliding_attention" if window is not None and i % 2 == 0 and i < last
                                  else "full_attention" for i in range(c["num_hidden_layers"])]}
    return window, windowed_layer_types(c, window, 0)


def shared_gated_moe(experts: int, top_k: int, normalize: bool, d_ff: int, shared_d_ff: int, act: str) -> dict:
    """Qwen2-MoE's and Qwen3-Next's MoE: ``ComposedMoE`` of a softmax ``TopKRouter`` (renormalised where
    ``normalize``), SwiGLU experts of ``d_ff`` and a shared SwiGLU MLP of ``shared_d_ff`` under a per-token sigmoid gate
    (``SigmoidGated``)."""
    return spec("components.ComposedMoE",
                router=spec("components.TopKRouter", n_experts=experts, top_k=top_k, normalize=normalize),
                experts=spec("components.state.MLPExperts", n_experts=experts, d_ff=d_ff, act=act),
                shared_expert=spec("components.state.SigmoidGated",
                                   inner=spec("components.MLP", d_ff=shared_d_ff, act=act)))


def shared_gated_moe_pairs(ours: str, theirs: str) -> list[tuple[str, list[str]]]:
    """That MoE's router, shared MLP and its gate (``{theirs}.gate``, ``shared_expert``, ``shared_expert_gate``); its
    experts are Qwen3-MoE's, one matrix each (:func:`expert_stacks`)."""
    return [(f"{ours}.router.centroids.weight", [f"{theirs}.gate.weight"]),
            (f"{ours}.shared_expert.gate.weight", [f"{theirs}.shared_expert_gate.weight"]),
            *swiglu_pairs(f"{ours}.shared_expert.inner", f"{theirs}.shared_expert")]


class Qwen2Moe:
    """Qwen2-MoE (Qwen1.5-MoE's and Qwen2-57B-A14B's class): Qwen2's attention (biases on the query, key and value
    projections where ``qkv_bias``, true by default; windowed layers, letter ``W``, by its own rule:
    :func:`qwen2_moe_windowed_layers`) with a MoE in the
    layers ``decoder_sparse_step`` and ``mlp_only_layers`` leave to it (``R``: ``ComposedMoE`` of a softmax
    ``TopKRouter``, renormalised where ``norm_topk_prob``, SwiGLU experts of ``moe_intermediate_size``, and a shared
    SwiGLU MLP of ``shared_expert_intermediate_size`` that each token scales by its own sigmoid gate,
    ``SigmoidGated``) and a SwiGLU MLP in the others (``M``). Import only."""

    name, model_type = "Qwen2MoeForCausalLM", "qwen2_moe"
    honoured = Qwen3Moe.honoured | {"max_window_layers", "layer_types", "shared_expert_intermediate_size", "qkv_bias"}
    ends = Llama.ends

    @staticmethod
    def recipe(c: dict) -> dict:
        c = {**QWEN2_MOE_DEFAULTS, **c}
        window, windowed_layers = qwen2_moe_windowed_layers(c)
        moe = qwen3_moe_layers(c)
        base = decoder_recipe(c, qkv_bias=bool(c.get("qkv_bias", True)))
        return mixed_decoder(base, moe, "R", lambda: shared_gated_moe(
            c["num_experts"], c["num_experts_per_tok"], bool(c.get("norm_topk_prob", False)), c["moe_intermediate_size"],
            c["shared_expert_intermediate_size"], c.get("hidden_act", "silu")), window, windowed_layers)

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        hf, t = f"model.layers.{i}.mlp", f"blocks.{i}.state_mixer"
        pairs = decoder_layer_pairs(i, qkv_bias=bool(c.get("qkv_bias", True)))
        if not qwen3_moe_layers({**QWEN2_MOE_DEFAULTS, **c})[i]:
            return [*pairs, *swiglu_pairs(t, hf)]
        return [*pairs, *shared_gated_moe_pairs(t, hf)]

    @staticmethod
    def reshaped(c: dict, i: int) -> list[tuple]:
        return Qwen3Moe.reshaped({**QWEN2_MOE_DEFAULTS, **c}, i)  # (its experts' files are Qwen3-MoE's)


DOTS1_WINDOW, DOTS1_WINDOW_LAYERS = 4096, 62
"""dots.llm1's ``sliding_window`` and ``max_window_layers`` where its config gives none: ``Dots1Config``'s defaults."""


def deepseek_v3_moe(c: dict, defaults: dict | None = None) -> dict:
    """DeepSeek-V3's MoE as transformers' dots.llm1 and GLM-4.5 build it, from their config ``c`` (a field it lacks
    taken from ``defaults``, the class's, or refused by name where there are none): ``ComposedMoE`` of a
    ``SigmoidRouter`` (group-limited, ``norm_topk_prob``, ``routed_scaling_factor``), SwiGLU experts of
    ``moe_intermediate_size`` and one SwiGLU MLP of ``n_shared_experts`` times that width."""
    field = {**(defaults or {}), **c}.__getitem__
    experts, width, act = field("n_routed_experts"), field("moe_intermediate_size"), c.get("hidden_act", "silu")
    router = spec("components.SigmoidRouter", n_experts=experts, top_k=field("num_experts_per_tok"),
                  normalize=bool(c.get("norm_topk_prob", (defaults or {}).get("norm_topk_prob"))),
                  scale=float(c.get("routed_scaling_factor", 1.0)),
                  n_groups=c.get("n_group") or 1, top_groups=c.get("topk_group") or 1)
    return spec("components.ComposedMoE", router=router,
                experts=spec("components.state.MLPExperts", n_experts=experts, d_ff=width, act=act),
                shared_expert=spec("components.MLP", d_ff=width * field("n_shared_experts"), act=act))


def deepseek_v3_moe_pairs(ours: str, theirs: str) -> list[tuple[str, list[str]]]:
    """That MoE's router (its ``e_score_correction_bias`` the zoo router's ``balance_bias``) and shared MLP."""
    return [(f"{ours}.router.centroids.weight", [f"{theirs}.gate.weight"]),
            (f"{ours}.router.balance_bias", [f"{theirs}.gate.e_score_correction_bias"]),
            *swiglu_pairs(f"{ours}.shared_expert", f"{theirs}.shared_experts")]


def deepseek_v3_experts(c: dict, i: int, experts: int | None = None) -> list[tuple]:
    """Layer ``i``'s experts of that MoE, one matrix each in the files (as Qwen3-MoE's)."""
    return expert_stacks(f"blocks.{i}.state_mixer.experts", f"model.layers.{i}.mlp.experts",
                         experts or c["n_routed_experts"], "gate_proj", "up_proj", "down_proj")


def dots1_windowed_layers(c: dict) -> tuple[int | None, list[bool]]:
    """``(window, whether each layer attends within it)`` of a dots.llm1 config, as transformers reads them: the layers
    ``layer_types`` names ``sliding_attention``, or where it has none those from ``max_window_layers`` on; no window
    where ``sliding_window`` is null."""
    window = checked_window(c.get("sliding_window", DOTS1_WINDOW))
    return window, windowed_layer_types(c, window, c.get("max_window_layers", DOTS1_WINDOW_LAYERS))


def dots1_moe_layers(c: dict) -> list[bool]:
    """Which layers of a dots.llm1 hold the MoE: those from ``first_k_dense_replace`` on (a SwiGLU MLP before)."""
    dense = c.get("first_k_dense_replace") or 0
    return [i >= dense for i in range(c["num_hidden_layers"])]


class Dots1:
    """rednote's dots.llm1 (``Dots1ForCausalLM``): Qwen3's attention (a QK-norm of the model's eps, RoPE; the layers
    ``layer_types`` or ``max_window_layers`` name windowed, letter ``W``) with a SwiGLU MLP in its first
    ``first_k_dense_replace`` layers (``M``) and DeepSeek-V3's MoE in the others (``E``: ``ComposedMoE`` of a
    ``SigmoidRouter`` — group-limited, ``norm_topk_prob``, ``routed_scaling_factor``, its ``e_score_correction_bias`` the
    router's bias — SwiGLU experts of ``moe_intermediate_size`` and one SwiGLU MLP of ``n_shared_experts`` times that
    width). Import only."""

    name, model_type = "Dots1ForCausalLM", "dots1"
    honoured = Llama.honoured | {"moe_intermediate_size", "n_shared_experts", "n_routed_experts", "num_local_experts",
                                 "n_group", "topk_group", "num_experts_per_tok", "first_k_dense_replace",
                                 "norm_topk_prob", "routed_scaling_factor", "sliding_window", "max_window_layers",
                                 "layer_types"}
    ends = Llama.ends

    @staticmethod
    def recipe(c: dict) -> dict:
        window, windowed_layers = dots1_windowed_layers(c)
        moe = dots1_moe_layers(c)
        base = decoder_recipe(c, qk_norm=True, norm_eps=c["rms_norm_eps"])
        return mixed_decoder(base, moe, "E", lambda: deepseek_v3_moe(c), window, windowed_layers)

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        hf, t = f"model.layers.{i}.mlp", f"blocks.{i}.state_mixer"
        pairs = decoder_layer_pairs(i, qk_norm=True)
        if not dots1_moe_layers(c)[i]:
            return [*pairs, *swiglu_pairs(t, hf)]
        return [*pairs, *deepseek_v3_moe_pairs(t, hf)]

    @staticmethod
    def reshaped(c: dict, i: int) -> list[tuple]:
        return deepseek_v3_experts(c, i) if dots1_moe_layers(c)[i] else []


GLM4_MOE_DEFAULTS = {"n_routed_experts": 128, "moe_intermediate_size": 1408, "num_experts_per_tok": 8,
                     "n_shared_experts": 1, "first_k_dense_replace": 1, "norm_topk_prob": True}
"""GLM-4.5's MoE fields where its config has none: ``Glm4MoeConfig``'s defaults."""

GLM4_MOE_ROPE_FRACTION = 0.5
"""The share of each head GLM-4.5 turns by RoPE where its config says none: ``Glm4MoeConfig``'s default."""


def partial_rotary_factor(c: dict, default: float) -> float:
    """A config's ``partial_rotary_factor``: in ``rope_parameters`` (as transformers 5 writes it) or at the top level (as
    the hub's files do), ``default`` where neither says; two that disagree are refused by name (transformers takes the
    first, other readers the second)."""
    said = {number(value) for value in ((c.get("rope_parameters") or {}).get("partial_rotary_factor"),
                                        c.get("partial_rotary_factor")) if value is not None}
    if len(said) > 1:
        raise ValueError(f"fields that disagree on RoPE: partial_rotary_factor={c['partial_rotary_factor']!r} at the "
                         f"top level and {c['rope_parameters']['partial_rotary_factor']!r} in rope_parameters; the "
                         "import would compute what one of them does not, so it is refused")
    return said.pop() if said else default


def glm4_moe_rope_fraction(c: dict) -> float:
    """GLM-4.5's ``partial_rotary_factor``, 0.5 where its config says none."""
    return partial_rotary_factor(c, GLM4_MOE_ROPE_FRACTION)


def glm4_moe_layers(c: dict) -> list[bool]:
    """Which layers of a GLM-4.5 hold the MoE: those from ``first_k_dense_replace`` (1 where the config has none) on."""
    dense = c.get("first_k_dense_replace", GLM4_MOE_DEFAULTS["first_k_dense_replace"])
    return [i >= dense for i in range(c["num_hidden_layers"])]


def glm4_moe_mtp_layer(c: dict, name: str) -> bool:
    """Whether ``name`` is a weight of GLM-4.5's multi-token-prediction layers, which its files keep after the
    ``num_hidden_layers`` (``num_nextn_predict_layers`` of them) and which the causal LM never runs (transformers drops
    them as it loads)."""
    layers, extra = c["num_hidden_layers"], c.get("num_nextn_predict_layers", c.get("num_mtp_layers", 0)) or 0
    return any(name.startswith(f"model.layers.{i}.") for i in range(layers, layers + extra))


class Glm4Moe:
    """Zhipu's GLM-4.5 (``Glm4MoeForCausalLM``; GLM-4.5-Air's class too): Llama's attention turning only part of each
    head by RoPE (``rope_fraction``, ``partial_rotary_factor``, 0.5 unless the config says), with biases on the query,
    key and value projections where ``attention_bias`` (``qkv_bias``) and a QK-norm where ``use_qk_norm``; a SwiGLU
    MLP in its first ``first_k_dense_replace`` layers (``M``) and DeepSeek-V3's MoE in the others (``E``, as
    dots.llm1's). Its multi-token-prediction layers (``num_nextn_predict_layers``, after the others in its files) are
    left out, as transformers leaves them. Import only."""

    name, model_type = "Glm4MoeForCausalLM", "glm4_moe"
    honoured = Llama.honoured | {"moe_intermediate_size", "n_shared_experts", "n_routed_experts", "n_group",
                                 "topk_group", "num_experts_per_tok", "first_k_dense_replace", "norm_topk_prob",
                                 "routed_scaling_factor", "attention_bias", "use_qk_norm", "partial_rotary_factor",
                                 "num_nextn_predict_layers", "num_mtp_layers"}
    ends = Llama.ends
    unused = staticmethod(glm4_moe_mtp_layer)

    @staticmethod
    def recipe(c: dict) -> dict:
        attention = {"rope_fraction": glm4_moe_rope_fraction(c), "qkv_bias": bool(c.get("attention_bias"))}
        if c.get("use_qk_norm"):
            attention.update(qk_norm=True, norm_eps=c["rms_norm_eps"])
        return mixed_decoder(decoder_recipe(c, **attention), glm4_moe_layers(c), "E",
                             lambda: deepseek_v3_moe(c, GLM4_MOE_DEFAULTS))

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        hf, t = f"model.layers.{i}.mlp", f"blocks.{i}.state_mixer"
        pairs = decoder_layer_pairs(i, qk_norm=bool(c.get("use_qk_norm")), qkv_bias=bool(c.get("attention_bias")))
        return [*pairs, *(deepseek_v3_moe_pairs(t, hf) if glm4_moe_layers(c)[i] else swiglu_pairs(t, hf))]

    @staticmethod
    def reshaped(c: dict, i: int) -> list[tuple]:
        experts = c.get("n_routed_experts", GLM4_MOE_DEFAULTS["n_routed_experts"])
        return deepseek_v3_experts(c, i, experts) if glm4_moe_layers(c)[i] else []


LFM2_ECHOES = {"block_dim": "hidden_size", "conv_dim": "hidden_size", "conv_dim_out": "hidden_size",
               "num_heads": "num_attention_heads", "block_norm_eps": "norm_eps"}
"""Fields of LFM2's hub files that transformers does not read, each repeating the field it names: honoured where equal
(to that field, or to the value transformers takes for it), refused by name where not."""
LFM2_FLAGS = {"block_use_swiglu": True, "use_pos_enc": True}
"""Fields of LFM2's hub files that transformers does not read, and the only values it computes."""
LFM2_BOOKKEEPING = {"block_mlp_init_scale", "block_out_init_scale", "block_use_xavier_init", "conv_use_xavier_init"}
"""Fields of LFM2's hub files about initialisation alone."""
LFM2_DEFAULTS = {"intermediate_size": 12288, "norm_eps": 1e-5, "max_position_embeddings": 128_000, "pad_token_id": 0,
                 "tie_word_embeddings": True, "conv_L_cache": 3, "block_multiple_of": 256}
"""``Lfm2Config``'s defaults that differ from what a config's silence means elsewhere."""


def lfm2_config(c: dict) -> dict:
    """An LFM2 config as transformers reads it: its defaults where silent, ``block_ff_dim`` and ``tie_embedding`` over
    ``intermediate_size`` and ``tie_word_embeddings``, the hub's echoing fields checked."""
    c = {**LFM2_DEFAULTS, **c}
    c["intermediate_size"] = c.get("block_ff_dim", c["intermediate_size"])
    c["tie_word_embeddings"] = c.get("tie_embedding", c["tie_word_embeddings"])
    problems = [f"{field}={c[field]!r} (transformers reads {source}={c[source]!r})" for field, source in
                LFM2_ECHOES.items() if field in c and c[field] != c[source]]
    problems += [f"{field}={c[field]!r} (the zoo computes only {value!r})" for field, value in LFM2_FLAGS.items()
                 if field in c and c[field] != value]
    refuse_fields(problems)
    return c


def lfm2_ff_dim(c: dict) -> int:
    """The MLPs' width as transformers' ``Lfm2MLP`` derives it: ``intermediate_size``, where
    ``block_auto_adjust_ff_dim`` two thirds of it, then times ``block_ffn_dim_multiplier`` rounded up to a multiple of
    ``block_multiple_of`` (the rounding only with a multiplier, as transformers has it)."""
    d_ff = c["intermediate_size"]
    if c.get("block_auto_adjust_ff_dim", True):
        d_ff = int(2 * d_ff / 3)
        multiplier = c.get("block_ffn_dim_multiplier", 1.0)
        if multiplier is not None:
            d_ff = int(multiplier * d_ff)
            d_ff = c["block_multiple_of"] * ((d_ff + c["block_multiple_of"] - 1) // c["block_multiple_of"])
    return d_ff


def lfm2_attention_layers(c: dict) -> list[bool]:
    """Which layers of an LFM2 attend (the others convolve): ``layer_types``, or ``full_attn_idxs`` (every layer where
    it names none), as transformers reads them."""
    layers = c["num_hidden_layers"]
    types = c.get("layer_types")
    if types is None:
        attending = c.get("full_attn_idxs")
        attending = range(layers) if attending is None else attending
        types = ["full_attention" if i in attending else "conv" for i in range(layers)]
    if len(types) != layers or set(types) - {"full_attention", "conv"}:
        raise ValueError(f"layer_types={types!r}: num_hidden_layers={layers} of full_attention, conv expected")
    return [kind == "full_attention" for kind in types]


class Lfm2:
    """Liquid AI's LFM2 (``Lfm2ForCausalLM``): gated short convolutions (``C``: ``ShortConv``, ``conv_L_cache`` taps,
    ``conv_bias``) and attention with a QK-norm (``A``: ``QCAttention(qk_norm=True)``) in the layers ``layer_types``
    (or ``full_attn_idxs``) names, each with a SwiGLU MLP (``M``, its width derived as transformers derives it), pre-norm,
    the final norm its ``embedding_norm``. Both ways; an export writes the MLP's width as it is
    (``block_auto_adjust_ff_dim: false``)."""

    name, model_type = "Lfm2ForCausalLM", "lfm2"
    honoured = ({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings", "norm_eps", "rope_theta", "rope_parameters",
                 "rope_scaling", "tie_word_embeddings", "pad_token_id", "conv_bias", "conv_L_cache", "block_multiple_of",
                 "block_ffn_dim_multiplier", "block_auto_adjust_ff_dim", "full_attn_idxs", "layer_types",
                 "block_ff_dim", "tie_embedding", "head_dim"} | set(LFM2_ECHOES) | set(LFM2_FLAGS) | LFM2_BOOKKEEPING)
    ends = [("embedding.weight", ["model.embed_tokens.weight"]), ("norm.weight", ["model.embedding_norm.weight"])]
    reshaped = staticmethod(nothing_reshaped)

    @staticmethod
    def recipe(c: dict) -> dict:
        c = lfm2_config(c)
        base, ntk, dynamic = rope_settings(c)
        heads, kv_heads, head_dim = attention_shape(c)
        attending = lfm2_attention_layers(c)
        mixers = {"M": spec("components.MLP", d_ff=lfm2_ff_dim(c), activation="swiglu", act="silu")}
        if any(attending):
            mixers["A"] = spec("components.QCAttention", n_heads=heads, n_kv_heads=kv_heads, qk_norm=True,
                               norm_eps=c["norm_eps"])
        if not all(attending):
            mixers["C"] = spec("components.ShortConv", kernel_size=c["conv_L_cache"], bias=bool(c.get("conv_bias")))
        tokens = ["AM" if a else "CM" for a in attending]
        pattern = compact_pattern(tokens)
        return {**common_recipe(c, base, ntk, dynamic), "pattern": pattern, "norm_eps": c["norm_eps"], "mixers": mixers}

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        c = lfm2_config(c)
        hf, ours = f"model.layers.{i}", f"blocks.{i}"
        pairs = [(f"{ours}.sequence_norm.weight", [f"{hf}.operator_norm.weight"]),
                 (f"{ours}.state_norm.weight", [f"{hf}.ffn_norm.weight"]),
                 (f"{ours}.state_mixer.in_proj.weight", [f"{hf}.feed_forward.w1.weight", f"{hf}.feed_forward.w3.weight"]),
                 (f"{ours}.state_mixer.out_proj.weight", [f"{hf}.feed_forward.w2.weight"])]
        mixer = f"{ours}.sequence_mixer"
        if lfm2_attention_layers(c)[i]:
            return [*pairs, *attention_pairs(mixer, f"{hf}.self_attn", out="out_proj"),
                    (f"{mixer}.positions.q_norm.weight", [f"{hf}.self_attn.q_layernorm.weight"]),
                    (f"{mixer}.positions.k_norm.weight", [f"{hf}.self_attn.k_layernorm.weight"])]
        tensors = ["in_proj.weight", "conv.weight", "out_proj.weight"]
        if c.get("conv_bias"):
            tensors += ["in_proj.bias", "conv.bias", "out_proj.bias"]
        return [*pairs, *((f"{mixer}.{t}", [f"{hf}.conv.{t}"]) for t in tensors)]

    @staticmethod
    def mismatch(model) -> str | None:
        why = "an Lfm2ForCausalLM is QCAttention (with a QK-norm) or ShortConv, then a SwiGLU MLP, in every block"
        blocks = list(model.blocks)
        kinds = {(type(getattr(b, "sequence_mixer", b)).__name__, type(getattr(b, "state_mixer", None)).__name__)
                 for b in blocks}
        if not kinds <= {("QCAttention", "MLP"), ("ShortConv", "MLP")}:
            return f"its blocks hold {sorted('/'.join(k) for k in kinds)}; {why}"
        if any(b.sequence_residual is not None for b in blocks):
            return "its blocks scale their residuals, which LFM2 does not"
        mlps = {(b.state_mixer.d_ff, b.state_mixer.activation, b.state_mixer.act_name) for b in blocks}
        if len(mlps) > 1 or next(iter(mlps))[1:] != ("swiglu", "silu"):
            return f"its MLPs are {sorted(mlps)}; LFM2's are SwiGLU with SiLU, one width for all"
        attentions = [b.sequence_mixer for b in blocks if isinstance(b.sequence_mixer, QCAttention)]
        convs = [b.sequence_mixer for b in blocks if isinstance(b.sequence_mixer, ShortConv)]
        if not attentions:
            return no_attention_reason("LFM2")
        if len({(a.n_heads, a.n_kv_heads, a.head_dim) for a in attentions}) > 1:
            return "its attentions differ in heads; LFM2 has one attention configuration"
        for a in attentions:
            norm = a.positions.q_norm
            if (norm is None or norm.eps != model.norm.eps or not a.positions.rope or a.positions.rope_fraction != 1
                    or a.sliding_window is not None or a.qkv_bias or a.n_heads * a.head_dim != model.d_model):
                return ("its attention is not LFM2's (a QK-norm of the model's eps, RoPE on all of each head, every key, "
                        "no biases, heads the width over the heads)")
        if len({(c.conv.kernel_size[0], c.bias) for c in convs}) > 1:
            return "its ShortConvs differ in taps or biases; LFM2 has one conv_L_cache and one conv_bias"
        return None

    @staticmethod
    def config(model) -> dict:
        blocks = list(model.blocks)
        attentions = [b.sequence_mixer for b in blocks if isinstance(b.sequence_mixer, QCAttention)]
        convs = [b.sequence_mixer for b in blocks if isinstance(b.sequence_mixer, ShortConv)]
        return {**common_config(model, Lfm2.name, Lfm2.model_type), "intermediate_size": blocks[0].state_mixer.d_ff,
                "block_auto_adjust_ff_dim": False, "num_attention_heads": attentions[0].n_heads,
                "num_key_value_heads": attentions[0].n_kv_heads,
                "norm_eps": model.norm.eps, "conv_L_cache": convs[0].conv.kernel_size[0] if convs else 3,
                "conv_bias": bool(convs and convs[0].bias),
                "layer_types": ["full_attention" if isinstance(b.sequence_mixer, QCAttention) else "conv"
                                for b in blocks]}


EVERY_KEY = 2 ** 31 - 1
"""Doge's ``keep_window_size`` for a model that keeps every key (``keep_window=None``) at any length: Hugging Face
windows a longer sequence than ``keep_window_size`` keys, and a model that extrapolates has no longest one."""


class Doge:
    name, model_type = "DogeForCausalLM", "doge"
    # (norm_topk_prob: dividing the top-k's softmax by its sum, 1, which changes nothing)
    honoured = Llama.honoured | {"keep_window_size", "is_moe", "num_experts", "num_experts_per_tok", "norm_topk_prob"}

    @staticmethod
    def recipe(c: dict) -> dict:
        base, ntk, dynamic = rope_settings(c)
        heads, kv_heads, _ = attention_shape(c)
        window = c.get("keep_window_size")
        attention = spec("components.InnerFuncAttention", n_heads=heads, n_kv_heads=kv_heads, inner="linear",
                         mask="content_exp", keep_window=None if window == EVERY_KEY else window, qk_norm=True,
                         norm_eps=c["rms_norm_eps"])
        mixers = {"I": attention}
        if c.get("is_moe"):
            n = c["num_experts"]
            if math.isqrt(n) ** 2 != n:
                raise ValueError(f"num_experts={n} is not a square: Doge's CDMoE uses only the first ⌊√N⌋² experts")
            mixers["E"] = spec("components.CDMoE", n_experts=n, n_heads=1, top_k=c["num_experts_per_tok"],
                               d_ff=c["intermediate_size"], key_dim=None, shared_mlp="swiglu", act=c.get("hidden_act", "silu"),
                               cross_domain="parallel")
        else:
            mixers["M"] = spec("components.MLP", d_ff=c["intermediate_size"], activation="swiglu", act=c.get("hidden_act", "silu"))
        return {**common_recipe(c, base, ntk, dynamic), "pattern": f"I{'E' if c.get('is_moe') else 'M'}×{c['num_hidden_layers']}",
                "norm_eps": c["rms_norm_eps"], "residual_scale": True, "mixers": mixers}

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        hf, ours = f"model.layers.{i}", f"blocks.{i}"
        a, s = f"{ours}.sequence_mixer", f"{ours}.state_mixer"
        mlp = f"{s}.shared" if c.get("is_moe") else s
        pairs = [(f"{ours}.sequence_norm.weight", [f"{hf}.input_layernorm.weight"]),
                 (f"{ours}.state_norm.weight", [f"{hf}.post_attention_layernorm.weight"]),
                 (f"{a}.q_proj.weight", [f"{hf}.self_attn.q_proj.weight"]),
                 (f"{a}.k_proj.weight", [f"{hf}.self_attn.k_proj.weight"]),
                 (f"{a}.value.weight", [f"{hf}.self_attn.v_proj.weight"]),
                 (f"{a}.key_bias.delta_proj.weight", [f"{hf}.self_attn.dt_proj.weight"]),
                 (f"{a}.key_bias.A", [f"{hf}.self_attn.A"]),
                 (f"{a}.positions.q_norm.weight", [f"{hf}.self_attn.q_norm.weight"]),
                 (f"{a}.positions.k_norm.weight", [f"{hf}.self_attn.k_norm.weight"]),
                 (f"{a}.out_proj.weight", [f"{hf}.self_attn.o_proj.weight"]),
                 (f"{ours}.sequence_residual", [f"{hf}.input_residual"]),
                 (f"{ours}.state_residual", [f"{hf}.post_attention_residual"]),
                 (f"{mlp}.in_proj.weight", [f"{hf}.mlp.gate_proj.weight", f"{hf}.mlp.up_proj.weight"]),
                 (f"{mlp}.out_proj.weight", [f"{hf}.mlp.down_proj.weight"])]
        if c.get("is_moe"):
            pairs += [(f"{s}.router.weight", [f"{hf}.mlp.router_gate.weight"]), (f"{s}.down", [f"{hf}.mlp.down_embed.weight"]),
                      (f"{s}.up", [f"{hf}.mlp.up_embed.weight"])]
        return pairs

    ends, reshaped = Llama.ends, staticmethod(nothing_reshaped)

    @staticmethod
    def mismatch(model) -> str | None:
        tokens = {block.token for block in model.blocks}
        why = "a DogeForCausalLM is InnerFuncAttention (linear values, exp content mask, QK-norm) and a SwiGLU MLP or Doge's CDMoE in every block"
        if tokens not in ({"IM"}, {"IE"}):
            return f"its pattern has blocks {sorted(tokens)}; {why}"
        block = model.blocks[0]
        a, m = block.sequence_mixer, block.state_mixer
        if type(a).__name__ != "InnerFuncAttention":
            return f"its 'I' letter is {type(a).__name__}; {why}"
        if (type(a.value).__name__ != "LinearValue" or type(a.key_bias).__name__ != "ExpContentBias" or not a.key_bias.per_kv_head
                or a.positions.q_norm is None or not a.positions.rope):
            return f"its InnerFuncAttention is inner={a.inner!r}, mask={a.mask!r}; {why}"
        if a.positions.rope_fraction != 1:
            return f"its attention turns {a.positions.rope_fraction:g} of each head by RoPE; Doge's turns all of it"
        if block.sequence_residual is None:
            return "its blocks do not scale their residuals, which Doge does"
        if a.positions.q_norm.eps != model.norm.eps:
            return (f"its attention's QK-norm has eps {a.positions.q_norm.eps} and its other norms {model.norm.eps}; a "
                    "DogeForCausalLM has one rms_norm_eps for all of them")
        if type(m).__name__ == "MLP" and m.activation != "swiglu":
            return f"its MLP is {m.activation} with {m.act_name}; Doge's is SwiGLU"
        if type(m).__name__ == "CDMoE":
            e = effective(m)
            if (m.n_heads != 1 or e.get("cross_domain") != "parallel" or m.shared.activation != "swiglu"
                    or e.get("key_dim") is not None or m.n_keys[0] != m.n_keys[1]):
                return "its CDMoE is not Doge's (one head, parallel, SwiGLU cross-domain MLP, square keys scored by x)"
        elif type(m).__name__ != "MLP":
            return f"its state mixer is {type(m).__name__}; {why}"
        return None

    @staticmethod
    def config(model) -> dict:
        block = model.blocks[0]
        a, m = block.sequence_mixer, block.state_mixer
        moe = type(m).__name__ == "CDMoE"
        config = {**common_config(model, Doge.name, Doge.model_type), "num_attention_heads": a.n_heads,
                  "num_key_value_heads": a.n_kv_heads, "head_dim": a.head_dim,
                  "hidden_act": m.act_name,  # (the MLP's act; CDMoE's, which its experts and cross-domain MLP share)
                  "rms_norm_eps": model.norm.eps,
                  # every key kept: a window of the whole length, or of any length where the model extrapolates
                  "keep_window_size": a.keep_window or (EVERY_KEY if model.extrapolate else model.max_seq_len),
                  "is_moe": moe, "intermediate_size": (m.shared if moe else m).d_ff, "attention_bias": False,
                  "mlp_bias": False, "sliding_window": None}
        if moe:
            config.update(num_experts=m.n_experts, num_experts_per_tok=m.top_k)
        return config


class Mamba2:
    name, model_type = "Mamba2ForCausalLM", "mamba2"
    honoured = {"vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "head_dim", "expand", "state_size",
                "n_groups", "chunk_size", "conv_kernel", "layer_norm_epsilon", "time_step_limit", "tie_word_embeddings",
                "pad_token_id"}

    @staticmethod
    def recipe(c: dict) -> dict:
        d_inner = int(c.get("expand", 2) * c["hidden_size"])
        if c["num_heads"] * c["head_dim"] != d_inner:
            raise ValueError(f"num_heads·head_dim = {c['num_heads'] * c['head_dim']} != expand·hidden_size = {d_inner}")
        limit = tuple(number(v) for v in c.get("time_step_limit", (0.0, float("inf"))))
        if limit != (0.0, float("inf")):
            raise ValueError(f"time_step_limit={c['time_step_limit']} is not supported (the zoo does not clamp Δ)")
        ssd = spec("components.SSD", n_heads=c["num_heads"], d_state=c["state_size"], n_groups=c["n_groups"],
                   expand=int(c.get("expand", 2)), chunk_size=c.get("chunk_size", 256), conv=True, rope=False, gate=True,
                   conv_kernel=c.get("conv_kernel", 4), norm_eps=c["layer_norm_epsilon"])
        # Mamba-2 has no position table and no length limit: the recipe accepts any length
        return {**common_recipe(c, 10000.0, 1.0, False, extrapolate=True, padding=False), "pattern": f"S-×{c['num_hidden_layers']}",
                "norm_eps": c["layer_norm_epsilon"], "mixers": {"S": ssd}}

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        hf = f"backbone.layers.{i}"
        return [(f"blocks.{i}.sequence_norm.weight", [f"{hf}.norm.weight"]),
                *mamba2_pairs(f"blocks.{i}.sequence_mixer", f"{hf}.mixer")]

    ends = [("embedding.weight", ["backbone.embeddings.weight"]), ("norm.weight", ["backbone.norm_f.weight"])]

    @staticmethod
    def in_proj_split(c: dict) -> list[int]:
        """HF's in_proj rows are ``[z | xBC | dt]``, the zoo's ``[xBC | dt | z]``: the three sizes."""
        d_inner = int(c.get("expand", 2) * c["hidden_size"])
        return [d_inner, d_inner + 2 * c["n_groups"] * c["state_size"], c["num_heads"]]

    @staticmethod
    def reshaped(c: dict, i: int) -> list[tuple]:
        return [mamba_in_proj(f"blocks.{i}.sequence_mixer.in_proj.weight", f"backbone.layers.{i}.mixer.in_proj.weight",
                              *Mamba2.in_proj_split(c))]

    @staticmethod
    def mismatch(model) -> str | None:
        why = "a Mamba2ForCausalLM is an SSD with Mamba-2's conv, D and gate in every block, and no state mixer ('S-')"
        reason = only(model, "S-", why)
        if reason:
            return reason
        s = model.blocks[0].sequence_mixer
        if type(s).__name__ != "SSD":
            return f"its 'S' letter is {type(s).__name__}; {why}"
        if s.conv is None or s.rope or not s.gate or s.D is None:
            return (f"its SSD has conv={s.conv is not None}, rope={s.rope}, gate={s.gate}, "
                    f"D={s.D is not None}; {why}")
        if reason := mamba2_gate_problem([s], "Mamba-2"):
            return reason
        if model.blocks[0].sequence_residual is not None:
            return "its blocks scale their residuals, which Mamba-2 does not"
        if s.d_inner % s.d_model:
            return f"its SSD is d_inner={s.d_inner} wide, no whole multiple of its width; Mamba-2's config has expand"
        if s.gate_norm.eps != model.norm.eps:
            return (f"its SSD's gate norm has eps {s.gate_norm.eps} and its other norms {model.norm.eps}; a Mamba2ForCausalLM "
                    "has one layer_norm_epsilon for all of them")
        return None

    @staticmethod
    def config(model) -> dict:
        s = model.blocks[0].sequence_mixer
        return {**common_config(model, Mamba2.name, Mamba2.model_type), "num_heads": s.n_heads, "head_dim": s.head_dim,
                "expand": s.d_inner // s.d_model, "state_size": s.d_state, "n_groups": s.n_groups, "chunk_size": s.chunk_size,
                "conv_kernel": s.conv.kernel_size[0], "layer_norm_epsilon": model.norm.eps, "use_bias": False,
                "use_conv_bias": True, "time_step_limit": [0.0, float("inf")], "residual_in_fp32": True,
                "hidden_act": "silu"}


GRANITE_LAYERS = {"mamba": "S", "linear_attention": "S", "attention": "A", "full_attention": "A"}


def granite_letters(c: dict) -> list[str]:
    """Each layer's sequence mixer from ``layer_types`` (Hugging Face's default: every layer Mamba-2)."""
    types = c.get("layer_types") or ["mamba"] * c["num_hidden_layers"]
    unknown = sorted({str(t) for t in types} - set(GRANITE_LAYERS))
    if unknown or len(types) != c["num_hidden_layers"]:
        raise ValueError(f"layer_types={types!r}: num_hidden_layers={c['num_hidden_layers']} of "
                         f"{', '.join(GRANITE_LAYERS)} expected")
    return [GRANITE_LAYERS[t] for t in types]


def act_name(function) -> str:
    """The name of one of the zoo's activations (an expert bank keeps the function)."""
    return next(name for name, f in ACTIVATIONS.items() if f is function)


# ---- the hybrids of Mamba-2 and attention layers (Granite 4.0, Bamba): what they share --------------------------

def hybrid_mamba_problems(c: dict) -> list[str]:
    """The Mamba-2 fields of a hybrid's config that the zoo's SSD cannot honour."""
    problems = []
    if not c.get("mamba_conv_bias", True) or c.get("mamba_proj_bias"):
        problems.append(f"mamba_conv_bias={c.get('mamba_conv_bias')!r}, mamba_proj_bias={c.get('mamba_proj_bias')!r} "
                        "(the zoo's conv has a bias, its projections none)")
    if tuple(number(v) for v in c.get("time_step_limit", (0.0, math.inf))) != (0.0, math.inf):
        problems.append(f"time_step_limit={c['time_step_limit']} (the zoo does not clamp Δ)")
    return problems


def hybrid_ssd(c: dict) -> dict:
    """The SSD (Mamba-2's: conv, D, gate) of a hybrid's ``mamba_*`` fields."""
    d_inner = c.get("mamba_expand", 2) * c["hidden_size"]
    head_dim = c.get("mamba_d_head", "auto")
    head_dim = d_inner // c["mamba_n_heads"] if head_dim == "auto" else head_dim  # (as transformers resolves it)
    if c["mamba_n_heads"] * head_dim != d_inner:
        raise ValueError(f"mamba_n_heads·mamba_d_head = {c['mamba_n_heads'] * head_dim} != "
                         f"mamba_expand·hidden_size = {d_inner}")
    return spec("components.SSD", n_heads=c["mamba_n_heads"], d_state=c["mamba_d_state"], n_groups=c["mamba_n_groups"],
                expand=int(c.get("mamba_expand", 2)), chunk_size=c.get("mamba_chunk_size", 256), conv=True, rope=False,
                gate=True, conv_kernel=c.get("mamba_d_conv", 4), norm_eps=c["rms_norm_eps"])


def hybrid_reshaped(c: dict, i: int, letters: list[str]) -> list[tuple]:
    """A hybrid's Mamba-2 layer ``i``: its ``in_proj`` reordered (:func:`mamba_in_proj`); an attention layer: nothing."""
    if letters[i] != "S":
        return []
    d_inner = c.get("mamba_expand", 2) * c["hidden_size"]
    return [mamba_in_proj(f"blocks.{i}.sequence_mixer.in_proj.weight", f"model.layers.{i}.mamba.in_proj.weight", d_inner,
                          d_inner + 2 * c["mamba_n_groups"] * c["mamba_d_state"], c["mamba_n_heads"])]


def hybrid_sequence_pairs(i: int, letter: str) -> list[tuple[str, list[str]]]:
    """Layer ``i``'s sequence mixer: Mamba-2 (``S``) or Llama's attention (``A``)."""
    ours, hf = f"blocks.{i}.sequence_mixer", f"model.layers.{i}"
    return mamba2_pairs(ours, f"{hf}.mamba") if letter == "S" else attention_pairs(ours, f"{hf}.self_attn")


def mamba2_gate_problem(ssds: list, name: str) -> str | None:
    """Why gated SSDs' gates are not Mamba-2's ``rms_norm_g(y ⊙ silu(z))``: a norm before the gate, or none (Falcon-H1's
    forms, which a Mamba-2 class would compute otherwise)."""
    if any(s.gate_norm is None or s.norm_before_gate for s in ssds):
        return (f"its SSDs' gates are not all Mamba-2's, which normalises the gated output (norm_before_gate=False, "
                f"gate_rms_norm=True); {name}'s does")
    return None


def mamba2_ssd_problem(model, ssds: list, name: str, eps_field: str, any_gate: bool = False) -> str | None:
    """What a hybrid (Granite, Bamba, Nemotron-H, Falcon-H1) asks of each of its SSDs: Mamba-2's (conv, D, the gate, no
    RoPE), its gate Mamba-2's (:func:`mamba2_gate_problem`; ``any_gate``: any of the gate's forms, Falcon-H1's), its
    gate norm of the model's one eps (the config's ``eps_field``)."""
    if any(s.conv is None or s.rope or not s.gate or s.D is None for s in ssds):
        return "its SSDs are not all Mamba-2's (conv, D and the gate, no RoPE)"
    if not any_gate and (reason := mamba2_gate_problem(ssds, name)):
        return reason
    if any(s.gate_norm is not None and s.gate_norm.eps != model.norm.eps for s in ssds):
        return f"its SSDs' gate norms have another eps than its other norms ({model.norm.eps}); {name} has one {eps_field}"
    return None


def no_attention_reason(name: str) -> str:
    """Why a hybrid without an attention block is not exported (an import of such a folder works: the zoo runs it)."""
    return (f"it has no attention block, and transformers' {name} fails without one (its cache asks an attention layer "
            "for the mask sizes; transformers 5.25)")


def hybrid_mismatch(model, name: str, why: str) -> str | None:
    """What keeps ``model``'s blocks from a hybrid of Mamba-2 and attention layers of one configuration each (the
    state mixers are each class's own to check)."""
    blocks = list(model.blocks)
    if any(getattr(b, "sequence_mixer", None) is None or getattr(b, "state_mixer", None) is None for b in blocks):
        return f"its pattern has blocks {sorted({b.token for b in blocks})}; {why}"
    sequence = {type(b.sequence_mixer).__name__ for b in blocks} - {"SSD", "QCAttention"}
    if sequence:
        return f"its sequence mixers include {sorted(sequence)}; {why}"
    if any(b.sequence_residual is not None for b in blocks):
        return f"its blocks scale their residuals, which {name} does not"
    ssds = [b.sequence_mixer for b in blocks if type(b.sequence_mixer).__name__ == "SSD"]
    reason = mamba2_ssd_problem(model, ssds, name, "rms_norm_eps")
    if reason:
        return reason
    if len({(s.n_heads, s.d_inner, s.d_state, s.n_groups, s.conv.kernel_size[0]) for s in ssds}) > 1:
        return f"its SSDs differ in heads, width, state, groups or conv; {name} has one Mamba-2 configuration"
    if any(s.d_inner % s.d_model for s in ssds):
        return f"its SSDs are d_inner={ssds[0].d_inner} wide, no whole multiple of its width; {name}'s config has mamba_expand"
    attentions = [b.sequence_mixer for b in blocks if type(b.sequence_mixer).__name__ == "QCAttention"]
    if not attentions:
        return no_attention_reason(name)
    if any(a.positions.q_norm is not None for a in attentions):
        return f"its attention has a QK-norm, which {name}'s has not"
    if any(a.qkv_bias for a in attentions):
        return f"its attention has biases on its query, key and value projections (qkv_bias); {name}'s has none"
    window = next((a.sliding_window for a in attentions if a.sliding_window is not None), None)
    if window is not None:
        return f"its attention keeps to the last {window} keys; {name}'s attends to every key"
    if any(a.n_heads * a.head_dim != model.d_model for a in attentions):
        return (f"its attention's heads are not its width over the heads (head_dim); {name}'s config has no head_dim "
                "and derives it so")
    if len({(a.n_heads, a.n_kv_heads, a.positions.rope, a.positions.rope_fraction) for a in attentions}) > 1:
        return f"its attentions differ in heads or RoPE; {name} has one attention configuration"
    return None


def first_attention(model):
    """A hybrid's first QCAttention (:func:`hybrid_mismatch` has checked there is one and that all are alike)."""
    return next(b.sequence_mixer for b in model.blocks if type(b.sequence_mixer).__name__ == "QCAttention")


def hybrid_config(model, name: str, model_type: str) -> dict:
    """The fields a Granite or Bamba config takes from ``model``'s attention and SSD blocks (:func:`hybrid_mismatch`)."""
    blocks = list(model.blocks)
    attention = first_attention(model)
    config = {**common_config(model, name, model_type), "rms_norm_eps": model.norm.eps, "attention_bias": False,
              "mamba_conv_bias": True, "mamba_proj_bias": False, "time_step_limit": [0.0, float("inf")],
              "num_attention_heads": attention.n_heads, "num_key_value_heads": attention.n_kv_heads,
              "mamba_n_heads": 1, "mamba_d_head": 2 * model.d_model, "mamba_expand": 2}  # (no SSD: valid values)
    ssd = next((b.sequence_mixer for b in blocks if type(b.sequence_mixer).__name__ == "SSD"), None)
    if ssd is not None:
        config.update(mamba_n_heads=ssd.n_heads, mamba_d_head=ssd.head_dim, mamba_expand=ssd.d_inner // ssd.d_model,
                      mamba_d_state=ssd.d_state, mamba_n_groups=ssd.n_groups, mamba_chunk_size=ssd.chunk_size,
                      mamba_d_conv=ssd.conv.kernel_size[0])
    return config


class GraniteHybrid:
    """IBM's Granite 4.0 hybrid: Mamba-2 (``S``) and attention (``A``, RoPE or none) layers in one stack, each with
    a SwiGLU MLP (``M``) or a top-k MoE beside a shared SwiGLU MLP (``E``: ``SharedExpertMoE``, gates the softmax of
    the top-k logits). Its multipliers must be 1, the attention's 1/√head_dim: the zoo's scaling."""

    name, model_type = "GraniteMoeHybridForCausalLM", "granitemoehybrid"
    honoured = {"vocab_size", "hidden_size", "intermediate_size", "shared_intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                "rope_theta", "rope_parameters", "rope_scaling", "tie_word_embeddings", "pad_token_id",
                "embedding_multiplier", "logits_scaling", "residual_multiplier", "attention_multiplier",
                "num_local_experts", "num_experts_per_tok", "position_embedding_type", "layer_types", "mamba_n_heads",
                "mamba_n_groups", "mamba_d_state", "mamba_d_head", "mamba_d_conv", "mamba_expand", "mamba_chunk_size",
                "mamba_conv_bias", "mamba_proj_bias", "time_step_limit"}
    ends = Llama.ends

    @staticmethod
    def recipe(c: dict) -> dict:
        letters = granite_letters(c)
        heads, kv_heads, head_dim = attention_shape(c) if "A" in letters else (0, 0, 0)  # (no attention: unused)
        problems = [f"{key}={c[key]!r} (the zoo computes only 1)"
                    for key in ("embedding_multiplier", "logits_scaling", "residual_multiplier") if number(c.get(key, 1)) != 1]
        if "A" in letters and not math.isclose(number(c.get("attention_multiplier", 1)), head_dim ** -0.5, rel_tol=1e-6):
            problems.append(f"attention_multiplier={c.get('attention_multiplier', 1)!r} (the zoo scales the scores by "
                            f"1/√head_dim = {head_dim ** -0.5:.6g})")
        problems += hybrid_mamba_problems(c)
        experts, shared, width = c.get("num_local_experts") or 0, c["shared_intermediate_size"], c["intermediate_size"]
        if experts and (shared <= 0 or shared % width):
            problems.append(f"shared_intermediate_size={shared} (the zoo's shared expert is a positive multiple of "
                            f"intermediate_size={width})")
        position = c.get("position_embedding_type") or "nope"
        if position not in ("rope", "nope"):
            problems.append(f"position_embedding_type={position!r} (rope or nope)")
        refuse_fields(problems)
        act = c.get("hidden_act", "silu")
        mixers = {}  # (only the kinds of layer there are: a config without Mamba-2 layers need not give its sizes)
        if "S" in letters:
            mixers["S"] = hybrid_ssd(c)
        if "A" in letters:
            mixers["A"] = spec("components.QCAttention", n_heads=heads, n_kv_heads=kv_heads, rope=position == "rope")
        if experts:
            state = "E"
            mixers["E"] = spec("components.SharedExpertMoE", n_experts=experts, top_k=c["num_experts_per_tok"],
                               n_shared=shared // width, d_ff=width, act=act, normalize=True)
        else:
            state = "M"
            mixers["M"] = spec("components.MLP", d_ff=shared, activation="swiglu", act=act)
        rotary = position == "rope" and "A" in letters
        base, ntk, dynamic = rope_settings(c) if rotary else (10000.0, 1.0, False)
        # without RoPE (NoPE attention, Mamba-2) nothing limits the length: the recipe accepts any
        return {**common_recipe(c, base, ntk, dynamic, extrapolate=not rotary), "norm_eps": c["rms_norm_eps"],
                "pattern": " ".join(letter + state for letter in letters), "mixers": mixers}

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        hf, ours = f"model.layers.{i}", f"blocks.{i}"
        t = f"{ours}.state_mixer"
        pairs = [(f"{ours}.sequence_norm.weight", [f"{hf}.input_layernorm.weight"]),
                 (f"{ours}.state_norm.weight", [f"{hf}.post_attention_layernorm.weight"]),
                 *hybrid_sequence_pairs(i, granite_letters(c)[i])]
        moe = bool(c.get("num_local_experts"))
        mlp = f"{t}.shared_expert" if moe else t  # Granite's shared MLP: input_linear rows [gate | up], as the zoo's
        pairs += [(f"{mlp}.in_proj.weight", [f"{hf}.shared_mlp.input_linear.weight"]),
                  (f"{mlp}.out_proj.weight", [f"{hf}.shared_mlp.output_linear.weight"])]
        if moe:
            pairs.append((f"{t}.router.centroids.weight", [f"{hf}.block_sparse_moe.router.layer.weight"]))
        return pairs

    @staticmethod
    def reshaped(c: dict, i: int) -> list[tuple]:
        hf, t = f"model.layers.{i}", f"blocks.{i}.state_mixer"
        out = hybrid_reshaped(c, i, granite_letters(c))
        if c.get("num_local_experts"):
            # (the names of the files transformers writes and reads; its modules call them experts.gate_up_proj, ...)
            out += [transposed(f"{t}.experts.w_in", f"{hf}.block_sparse_moe.input_linear.weight"),  # [E, d, gate | up]
                    transposed(f"{t}.experts.w_out", f"{hf}.block_sparse_moe.output_linear.weight")]  # [E, d_ff, d]
        return out

    @staticmethod
    def mismatch(model) -> str | None:
        why = ("a GraniteMoeHybridForCausalLM is SSD or attention blocks, each with a SwiGLU MLP or each with a routed "
               "MoE beside a shared SwiGLU MLP ('SM', 'AM'; 'SE', 'AE' with SharedExpertMoE)")
        reason = hybrid_mismatch(model, "Granite", why)
        if reason:
            return reason
        attention = first_attention(model)
        if attention.positions.rope and attention.positions.rope_fraction != 1:
            return (f"its attention turns {attention.positions.rope_fraction:g} of each head by RoPE; Granite's turns all "
                    "of it or none")
        states = [b.state_mixer for b in model.blocks]
        if all(type(m).__name__ == "MLP" for m in states):
            if any(m.activation != "swiglu" for m in states) or len({(m.d_ff, m.act_name) for m in states}) > 1:
                return "its MLPs are not all one SwiGLU MLP; Granite's blocks share one"
            return None
        if not all(isinstance(m, MoE) for m in states):
            return f"its state mixers are {sorted({type(m).__name__ for m in states})}; {why}"
        shapes = set()
        for m in states:
            experts, shared = m.experts, m.shared_expert
            if (type(experts).__name__ != "MLPExperts" or experts.activation != "swiglu" or m.cross_domain is not None
                    or not getattr(m.router, "normalize", False) or type(m.router).__name__ != "TopKRouter"
                    or shared is None or type(shared).__name__ != "MLP" or shared.activation != "swiglu"
                    or shared.act_name != act_name(experts.act) or shared.d_ff % experts.d_ff):
                return ("its MoE is not Granite's (a TopKRouter with normalised gates, SwiGLU experts, a shared SwiGLU MLP "
                        "of the same activation, a multiple of their width, no cross-domain part)")
            shapes.add((m.router.n_experts, m.router.top_k, experts.d_ff, shared.d_ff, shared.act_name))
        if len(shapes) > 1:
            return "its MoEs differ; Granite's blocks share one configuration"
        return None

    @staticmethod
    def config(model) -> dict:
        blocks = list(model.blocks)
        kinds = ["mamba" if type(b.sequence_mixer).__name__ == "SSD" else "attention" for b in blocks]
        config = hybrid_config(model, GraniteHybrid.name, GraniteHybrid.model_type)
        attention = next(b.sequence_mixer for b, kind in zip(blocks, kinds) if kind == "attention")  # (mismatch: one)
        config.update(layer_types=kinds, embedding_multiplier=1.0, logits_scaling=1.0, residual_multiplier=1.0,
                      attention_multiplier=attention.head_dim ** -0.5,
                      position_embedding_type="rope" if attention.positions.rope else "nope")
        state = blocks[0].state_mixer
        if type(state).__name__ == "MLP":
            config.update(intermediate_size=state.d_ff, shared_intermediate_size=state.d_ff, num_local_experts=0,
                          hidden_act=state.act_name)
        else:
            config.update(intermediate_size=state.experts.d_ff, shared_intermediate_size=state.shared_expert.d_ff,
                          num_local_experts=state.router.n_experts, num_experts_per_tok=state.router.top_k,
                          hidden_act=state.shared_expert.act_name)
        return config


BAMBA_ROPE_FRACTION = 0.5
"""The share of each attention head Bamba's RoPE turns when its config's ``rope_parameters`` do not say: transformers
sets ``partial_rotary_factor`` 0.5 for every Bamba config, over a top-level field of that name."""


def bamba_letters(c: dict) -> list[str]:
    """Each layer's sequence mixer: attention (``A``) at ``attn_layer_indices``, Mamba-2 (``S``) elsewhere."""
    layers, indices = c["num_hidden_layers"], c.get("attn_layer_indices") or []
    if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers for i in indices):
        raise ValueError(f"attn_layer_indices={indices!r}: layer numbers from 0 to num_hidden_layers - 1 = {layers - 1} "
                         "expected")
    return ["A" if i in indices else "S" for i in range(layers)]


def bamba_rope_fraction(c: dict, head_dim: int) -> float:
    """The share of each head Bamba's attention turns, as transformers reads it; the fields that say otherwise refused."""
    fraction = number((c.get("rope_parameters") or {}).get("partial_rotary_factor", BAMBA_ROPE_FRACTION))
    problems = []
    if "partial_rotary_factor" in c and number(c["partial_rotary_factor"]) != fraction:
        problems.append(f"partial_rotary_factor={c['partial_rotary_factor']!r} at the top level, which transformers "
                        f"replaces by {fraction:g}")
    if c.get("attn_rotary_emb") is not None and c["attn_rotary_emb"] != head_dim * fraction:
        problems.append(f"attn_rotary_emb={c['attn_rotary_emb']!r} (transformers turns head_dim·partial_rotary_factor = "
                        f"{head_dim}·{fraction:g} = {head_dim * fraction:g} channels; other readers take "
                        "attn_rotary_emb)")
    if problems:
        raise ValueError(f"fields that disagree on RoPE: {'; '.join(problems)}. Either way the import would compute "
                         "something one of them does not, so it is refused")
    return fraction


class Bamba:
    """IBM's Bamba: Mamba-2 (``S``) and attention (``A``) layers in one stack, each with a SwiGLU MLP (``M``). Its
    attention turns only part of each head by RoPE (``rope_fraction``, 0.5 unless ``rope_parameters`` say)."""

    name, model_type = "BambaForCausalLM", "bamba"
    honoured = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_theta",
                "rope_parameters", "rope_scaling", "tie_word_embeddings", "pad_token_id", "attn_layer_indices",
                "attn_rotary_emb", "partial_rotary_factor", "mamba_n_heads", "mamba_n_groups", "mamba_d_state",
                "mamba_d_head", "mamba_d_conv", "mamba_expand", "mamba_chunk_size", "mamba_conv_bias", "mamba_proj_bias",
                "time_step_limit", "z_loss_coefficient"}
    ends = [("embedding.weight", ["model.embed_tokens.weight"]), ("norm.weight", ["model.final_layernorm.weight"])]

    @staticmethod
    def recipe(c: dict) -> dict:
        letters = bamba_letters(c)
        problems = hybrid_mamba_problems(c)
        refuse_fields(problems)
        mixers = {"M": spec("components.MLP", d_ff=c["intermediate_size"], activation="swiglu",
                            act=c.get("hidden_act", "silu"))}
        if "S" in letters:
            mixers["S"] = hybrid_ssd(c)
        base, ntk, dynamic = 10000.0, 1.0, False
        if "A" in letters:
            heads, kv_heads, head_dim = attention_shape(c)
            mixers["A"] = spec("components.QCAttention", n_heads=heads, n_kv_heads=kv_heads,
                               rope_fraction=bamba_rope_fraction(c, head_dim))
            base, ntk, dynamic = rope_settings(c)
        return {**common_recipe(c, base, ntk, dynamic, extrapolate="A" not in letters), "norm_eps": c["rms_norm_eps"],
                "pattern": " ".join(letter + "M" for letter in letters), "mixers": mixers}

    @staticmethod
    def training(c: dict) -> dict:
        """Its z-loss, which transformers adds to Bamba's training loss (over every position; the zoo's ``z_loss``
        over the labelled ones)."""
        coefficient = number(c.get("z_loss_coefficient") or 0)
        if not 0 <= coefficient < math.inf:
            raise ValueError(f"z_loss_coefficient={c['z_loss_coefficient']!r} must be a finite number >= 0")
        return {"z_loss": coefficient} if coefficient else {}

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        hf, ours = f"model.layers.{i}", f"blocks.{i}"
        return [(f"{ours}.sequence_norm.weight", [f"{hf}.input_layernorm.weight"]),
                (f"{ours}.state_norm.weight", [f"{hf}.pre_ff_layernorm.weight"]),
                *hybrid_sequence_pairs(i, bamba_letters(c)[i]), *swiglu_pairs(f"{ours}.state_mixer", f"{hf}.feed_forward")]

    @staticmethod
    def reshaped(c: dict, i: int) -> list[tuple]:
        return hybrid_reshaped(c, i, bamba_letters(c))

    @staticmethod
    def mismatch(model) -> str | None:
        why = "a BambaForCausalLM is SSD or attention blocks, each with a SwiGLU MLP ('SM', 'AM')"
        reason = hybrid_mismatch(model, "Bamba", why)
        if reason:
            return reason
        if not first_attention(model).positions.rope:
            return "its attention has no RoPE, which Bamba's has"
        states = [b.state_mixer for b in model.blocks]
        if any(type(m).__name__ != "MLP" or m.activation != "swiglu" for m in states) or \
                len({(m.d_ff, m.act_name) for m in states}) > 1:
            return f"its state mixers are not all one SwiGLU MLP; {why}"
        return None

    @staticmethod
    def config(model) -> dict:
        blocks = list(model.blocks)
        attention = first_attention(model)
        # (rope_parameters, not rope_theta alone: transformers would read a config without them as turning half)
        config = partial_rope_parameters(hybrid_config(model, Bamba.name, Bamba.model_type), model,
                                         attention.positions.rope_fraction)
        mlp = blocks[0].state_mixer
        config.update(attn_layer_indices=[i for i, b in enumerate(blocks) if type(b.sequence_mixer).__name__ == "QCAttention"],
                      intermediate_size=mlp.d_ff, hidden_act=mlp.act_name, mlp_bias=False, z_loss_coefficient=0.0)
        return config


# ---- Falcon-H1: attention and Mamba-2 side by side in every layer ------------------------------------------------

FALCON_H1_DEFAULTS = {"num_key_value_heads": 8, "mamba_d_ssm": 1024, "mamba_n_heads": 128, "mamba_d_head": "auto",
                      "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2,
                      "mamba_chunk_size": 256, "mamba_norm_before_gate": True, "mamba_rms_norm": False,
                      "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "pad_token_id": 0}
"""``FalconH1Config``'s defaults that differ from what a config's silence means elsewhere (an absent ``mamba_d_ssm`` is
1,024 channels, not ``mamba_expand · hidden_size``: that is what an explicit null means)."""

FALCON_H1_MULTIPLIERS = {"embedding_multiplier": 1.0, "lm_head_multiplier": 1.0, "key_multiplier": 1.0,
                         "attention_in_multiplier": 1.0, "attention_out_multiplier": 1.0, "ssm_in_multiplier": 1.0,
                         "ssm_out_multiplier": 1.0, "mlp_multipliers": [1.0, 1.0], "ssm_multipliers": [1.0] * 5}
"""Falcon-H1's µP multipliers (a null one is its default): each scales what a linear map reads or writes, so an import
folds it into that map's weights (:meth:`FalconH1.fold`) and an export writes them all 1."""


def falcon_h1_config(c: dict) -> dict:
    """A Falcon-H1 config as transformers reads it: its defaults where silent, its multipliers' where null."""
    c = {**FALCON_H1_DEFAULTS, **c}
    c.update({k: c[k] if c.get(k) is not None else v for k, v in FALCON_H1_MULTIPLIERS.items()})
    for key, size in (("mlp_multipliers", 2), ("ssm_multipliers", 5)):
        if len(c[key]) != size:
            raise ValueError(f"{key}={c[key]!r}: {size} multipliers expected")
    return c


def falcon_h1_d_inner(c: dict) -> int:
    """The Mamba-2 mixer's width: ``mamba_d_ssm``, or ``mamba_expand · hidden_size`` where it is null."""
    return c["mamba_d_ssm"] if c["mamba_d_ssm"] is not None else int(c["mamba_expand"] * c["hidden_size"])


class FalconH1:
    """TII's Falcon-H1 (``FalconH1ForCausalLM``): in every layer attention (``QCAttention``, RoPE) and Mamba-2 (an ``SSD``
    of ``mamba_d_ssm`` channels whose gate has a grouped RMSNorm before or after it, or none: ``mamba_rms_norm``,
    ``mamba_norm_before_gate``) read the same normed input side by side and their outputs are summed
    (``P``: ``ParallelMixers``), then a SwiGLU MLP (``M``). Its µP multipliers are folded into the weights on import;
    an export writes them 1. Both ways."""

    name, model_type = "FalconH1ForCausalLM", "falcon_h1"
    honoured = ({"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta",
                 "rope_parameters", "rope_scaling", "tie_word_embeddings", "pad_token_id", "mamba_d_ssm", "mamba_n_heads",
                 "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_chunk_size",
                 "mamba_conv_bias", "mamba_proj_bias", "mamba_norm_before_gate", "mamba_rms_norm", "time_step_limit",
                 "projectors_bias"} | set(FALCON_H1_MULTIPLIERS))
    ends = Bamba.ends

    @staticmethod
    def recipe(c: dict) -> dict:
        c = falcon_h1_config(c)
        problems = hybrid_mamba_problems(c)
        if c.get("projectors_bias"):
            problems.append("projectors_bias=True (the zoo's SSD has no output bias)")
        if c.get("tie_word_embeddings") and c["embedding_multiplier"] != c["lm_head_multiplier"]:
            problems.append(f"tie_word_embeddings with embedding_multiplier={c['embedding_multiplier']} ≠ "
                            f"lm_head_multiplier={c['lm_head_multiplier']} (one tied matrix takes one of them)")
        refuse_fields(problems)
        d_inner, heads = falcon_h1_d_inner(c), c["mamba_n_heads"]
        if c["mamba_d_head"] != "auto" and c["mamba_d_head"] * heads != d_inner:
            raise ValueError(f"mamba_n_heads·mamba_d_head = {c['mamba_d_head'] * heads} != the Mamba-2 width {d_inner}")
        base, ntk, dynamic = rope_settings(c)
        heads_a, kv_heads, head_dim = attention_shape(c, decoupled=True)
        attention = spec("components.QCAttention", n_heads=heads_a, n_kv_heads=kv_heads,
                         **({"head_dim": head_dim} if head_dim * heads_a != c["hidden_size"] else {}))
        rms_norm = bool(c["mamba_rms_norm"])
        ssd = spec("components.SSD", d_inner=d_inner, n_heads=heads, d_state=c["mamba_d_state"],
                   n_groups=c["mamba_n_groups"], chunk_size=c["mamba_chunk_size"], conv=True, rope=False, gate=True,
                   gate_rms_norm=rms_norm, norm_before_gate=rms_norm and bool(c["mamba_norm_before_gate"]),
                   conv_kernel=c["mamba_d_conv"], norm_eps=c["rms_norm_eps"])
        mlp = spec("components.MLP", d_ff=c["intermediate_size"], activation="swiglu", act="silu")
        return {**common_recipe(c, base, ntk, dynamic), "norm_eps": c["rms_norm_eps"],
                "pattern": f"PM×{c['num_hidden_layers']}",
                "mixers": {"P": spec("components.ParallelMixers", mixers=[attention, ssd]), "M": mlp}}

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        hf, ours = f"model.layers.{i}", f"blocks.{i}"
        mamba = [pair for pair in mamba2_pairs(f"{ours}.sequence_mixer.mixers.1", f"{hf}.mamba")
                 if falcon_h1_config(c)["mamba_rms_norm"] or not pair[0].endswith("gate_norm.weight")]
        return [(f"{ours}.sequence_norm.weight", [f"{hf}.input_layernorm.weight"]),
                (f"{ours}.state_norm.weight", [f"{hf}.pre_ff_layernorm.weight"]),
                *attention_pairs(f"{ours}.sequence_mixer.mixers.0", f"{hf}.self_attn"), *mamba,
                *swiglu_pairs(f"{ours}.state_mixer", f"{hf}.feed_forward")]

    @staticmethod
    def reshaped(c: dict, i: int) -> list[tuple]:
        c = falcon_h1_config(c)
        d_inner = falcon_h1_d_inner(c)
        return [mamba_in_proj(f"blocks.{i}.sequence_mixer.mixers.1.in_proj.weight", f"model.layers.{i}.mamba.in_proj.weight",
                              d_inner, d_inner + 2 * c["mamba_n_groups"] * c["mamba_d_state"], c["mamba_n_heads"])]

    @staticmethod
    def fold(c: dict, zoo: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``zoo`` (the weights as the files hold them, renamed) with each multiplier folded into the map it scales:
        the embedding's into the embedding, the head's into the head; in each layer the attention's input multiplier
        into the query, key and value maps (the key multiplier into the keys' rows too: it scales the keys before RoPE,
        which is linear), its output multiplier into the output map; the SSD's input multiplier into its input map,
        whose five blocks of rows ``z, x, B, C, Δ`` (``ssm_multipliers``, in that order) are scaled each, its output
        multiplier into its output map; the MLP's gate and down multipliers into the gate's rows and the down map."""
        c = falcon_h1_config(c)
        m = {k: [number(v) for v in c[k]] if isinstance(c[k], list) else number(c[k]) for k in FALCON_H1_MULTIPLIERS}
        out = dict(zoo)
        out["embedding.weight"] = zoo["embedding.weight"] * m["embedding_multiplier"]
        tied = zoo["lm_head.weight"] is zoo["embedding.weight"]  # (a tied head: its multiplier equal, checked by recipe)
        out["lm_head.weight"] = out["embedding.weight"] if tied else zoo["lm_head.weight"] * m["lm_head_multiplier"]
        d_inner, groups_state, heads = (falcon_h1_d_inner(c), c["mamba_n_groups"] * c["mamba_d_state"],
                                        c["mamba_n_heads"])
        z, x, b, c_, dt = m["ssm_multipliers"]
        ssd_rows = torch.cat([torch.full((n,), f) for n, f in
                              ((d_inner, x), (groups_state, b), (groups_state, c_), (heads, dt), (d_inner, z))])
        gate, down = m["mlp_multipliers"]
        for i in range(layer_count(c)):
            a, s, mlp = f"blocks.{i}.sequence_mixer.mixers.0", f"blocks.{i}.sequence_mixer.mixers.1", f"blocks.{i}.state_mixer"
            attention_in = m["attention_in_multiplier"]
            out[f"{a}.q_proj.weight"] = zoo[f"{a}.q_proj.weight"] * attention_in
            kv = zoo[f"{a}.kv_proj.weight"]  # rows [k | v]
            keys = kv.shape[0] // 2
            out[f"{a}.kv_proj.weight"] = torch.cat([kv[:keys] * (attention_in * m["key_multiplier"]),
                                                    kv[keys:] * attention_in])
            out[f"{a}.out_proj.weight"] = zoo[f"{a}.out_proj.weight"] * m["attention_out_multiplier"]
            # rows in the zoo's order [x | B | C | Δ | z] (mamba_in_proj)
            out[f"{s}.in_proj.weight"] = zoo[f"{s}.in_proj.weight"] * (ssd_rows[:, None] * m["ssm_in_multiplier"])
            out[f"{s}.out_proj.weight"] = zoo[f"{s}.out_proj.weight"] * m["ssm_out_multiplier"]
            w = zoo[f"{mlp}.in_proj.weight"]  # rows [gate | up]
            out[f"{mlp}.in_proj.weight"] = torch.cat([w[:w.shape[0] // 2] * gate, w[w.shape[0] // 2:]])
            out[f"{mlp}.out_proj.weight"] = zoo[f"{mlp}.out_proj.weight"] * down
        return out

    @staticmethod
    def mismatch(model) -> str | None:
        why = ("a FalconH1ForCausalLM is ParallelMixers of a QCAttention and an SSD (in that order), then a SwiGLU MLP, "
               "in every block ('PM')")
        blocks = list(model.blocks)
        if not all(isinstance(getattr(b, "sequence_mixer", None), ParallelMixers) and
                   [type(x).__name__ for x in b.sequence_mixer.mixers] == ["QCAttention", "SSD"] and
                   type(b.state_mixer).__name__ == "MLP" for b in blocks):
            return f"its blocks are not all alike: {why}"
        if any(b.sequence_residual is not None for b in blocks):
            return "its blocks scale their residuals, which Falcon-H1 does not"
        attentions = [b.sequence_mixer.mixers[0] for b in blocks]
        ssds = [b.sequence_mixer.mixers[1] for b in blocks]
        if reason := mamba2_ssd_problem(model, ssds, "Falcon-H1", "rms_norm_eps", any_gate=True):
            return reason
        if len({(s.n_heads, s.d_inner, s.d_state, s.n_groups, s.conv.kernel_size[0], s.chunk_size, s.gate_rms_norm,
                 s.norm_before_gate) for s in ssds}) > 1:
            return "its SSDs differ; Falcon-H1 has one Mamba-2 configuration"
        if any(a.positions.q_norm is not None or a.qkv_bias or a.sliding_window is not None or not a.positions.rope
               or a.positions.rope_fraction != 1 for a in attentions):
            return ("its attention is not Falcon-H1's (RoPE on all of each head, no QK-norm, no biases, every key)")
        if len({(a.n_heads, a.n_kv_heads, a.head_dim) for a in attentions}) > 1:
            return "its attentions differ in heads; Falcon-H1 has one attention configuration"
        mlps = {(b.state_mixer.d_ff, b.state_mixer.activation, b.state_mixer.act_name) for b in blocks}
        if len(mlps) > 1 or next(iter(mlps))[1:] != ("swiglu", "silu"):
            return f"its MLPs are {sorted(mlps)}; Falcon-H1's are SwiGLU with SiLU, one width for all"
        return None

    @staticmethod
    def config(model) -> dict:
        a, s = model.blocks[0].sequence_mixer.mixers
        config = {**common_config(model, FalconH1.name, FalconH1.model_type), "rms_norm_eps": model.norm.eps,
                  "intermediate_size": model.blocks[0].state_mixer.d_ff, "hidden_act": "silu",
                  "num_attention_heads": a.n_heads, "num_key_value_heads": a.n_kv_heads, "head_dim": a.head_dim,
                  "mamba_d_ssm": s.d_inner, "mamba_n_heads": s.n_heads, "mamba_d_head": s.head_dim,
                  "mamba_n_groups": s.n_groups, "mamba_d_state": s.d_state, "mamba_d_conv": s.conv.kernel_size[0],
                  "mamba_chunk_size": s.chunk_size, "mamba_conv_bias": True, "mamba_proj_bias": False,
                  "projectors_bias": False, "mamba_rms_norm": s.gate_rms_norm, "mamba_norm_before_gate": s.norm_before_gate,
                  "time_step_limit": [0.0, float("inf")], "attention_bias": False, "mlp_bias": False,
                  **FALCON_H1_MULTIPLIERS}
        return config


NEMOTRON_LAYERS = {"linear_attention": "S-", "full_attention": "A-", "mlp": "-M", "moe": "-E"}
"""Nemotron-H's layer kinds as the zoo's tokens: each of its layers is one mixer behind one norm."""
NEMOTRON_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
"""The letters of the ``hybrid_override_pattern`` older Nemotron-H configs give (transformers reads it so)."""
NEMOTRON_DEFAULTS = {"chunk_size": 128, "conv_kernel": 4, "n_groups": 8, "ssm_state_size": 128, "head_dim": 128,
                     "mlp_hidden_act": "relu2", "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
                     "routed_scaling_factor": 1.0, "layer_norm_epsilon": 1e-5}
"""``NemotronHConfig``'s defaults for the fields a config may leave out."""
NEMOTRON_LEGACY = {"n_groups": "mamba_n_groups", "conv_kernel": "mamba_d_conv", "chunk_size": "mamba_chunk_size",
                   "use_conv_bias": "mamba_conv_bias", "time_step_limit": "mamba_dt_limit"}
"""The older names transformers still reads for these fields."""


def nemotron_field(c: dict, name: str):
    """A Nemotron-H config field under its name or its older one (:data:`NEMOTRON_LEGACY`), else its default."""
    legacy = NEMOTRON_LEGACY.get(name)
    if name in c:
        return c[name]
    if legacy in c:
        return c[legacy]
    return NEMOTRON_DEFAULTS.get(name)


def nemotron_tokens(c: dict) -> list[str]:
    """Each layer's token, from ``layers_block_type`` (or ``layer_types``, or the older ``hybrid_override_pattern``)."""
    kinds = c.get("layers_block_type") or c.get("layer_types")
    if kinds is None and "hybrid_override_pattern" in c:
        pattern = c["hybrid_override_pattern"]
        unknown = sorted(set(pattern) - set(NEMOTRON_PATTERN))
        if unknown:
            raise ValueError(f"hybrid_override_pattern={pattern!r}: letters {unknown} are none of "
                             f"{', '.join(NEMOTRON_PATTERN)}")
        kinds = [NEMOTRON_PATTERN[letter] for letter in pattern]
    if not kinds:
        raise ValueError("layers_block_type: the config lists no layers (nor a hybrid_override_pattern)")
    unknown = sorted({str(k) for k in kinds} - set(NEMOTRON_LAYERS))
    if unknown:
        raise ValueError(f"layers_block_type={kinds!r}: {unknown} are none of {', '.join(NEMOTRON_LAYERS)}")
    given = c.get("num_hidden_layers")
    if given is not None and given != len(kinds):  # (transformers warns and builds the list's length)
        raise ValueError(f"num_hidden_layers={given} but layers_block_type lists {len(kinds)} layers")
    return [NEMOTRON_LAYERS[k] for k in kinds]


def nemotron_head_dim(c: dict) -> int:
    """The attention's head width: ``head_dim``, or the ``attention_head_dim`` of NVIDIA's own configs where there is
    none (transformers' default, 128, would not fit their weights); two that disagree are refused."""
    widths = {c[key] for key in ("head_dim", "attention_head_dim") if c.get(key) is not None}
    if len(widths) > 1:
        raise ValueError(f"head_dim={c['head_dim']} and attention_head_dim={c['attention_head_dim']} disagree")
    return widths.pop() if widths else NEMOTRON_DEFAULTS["head_dim"]


def nemotron_problems(c: dict) -> list[str]:
    """The fields of a Nemotron-H config the zoo cannot honour."""
    problems = []
    eps = nemotron_field(c, "layer_norm_epsilon")
    if c.get("rms_norm_eps", eps) != eps:  # (NVIDIA's configs carry both; transformers reads layer_norm_epsilon)
        problems.append(f"rms_norm_eps={c['rms_norm_eps']!r} beside layer_norm_epsilon={eps!r} (one eps for every norm)")
    if c.get("mamba_proj_bias") or nemotron_field(c, "use_conv_bias") not in (True, None):
        problems.append(f"use_conv_bias={nemotron_field(c, 'use_conv_bias')!r}, mamba_proj_bias="
                        f"{c.get('mamba_proj_bias')!r} (the zoo's conv has a bias, its projections none)")
    limit = nemotron_field(c, "time_step_limit")
    if limit is not None and tuple(number(v) for v in limit) != (0.0, math.inf):
        problems.append(f"time_step_limit={limit} (the zoo does not clamp Δ)")
    if c.get("mamba_hidden_act", "silu") != "silu":
        problems.append(f"mamba_hidden_act={c['mamba_hidden_act']!r} (the zoo's conv is followed by SiLU)")
    act = nemotron_field(c, "mlp_hidden_act")
    if act not in ACTIVATIONS:
        problems.append(f"mlp_hidden_act={act!r} (the zoo's MLPs take {', '.join(ACTIVATIONS)})")
    if c.get("moe_latent_size") is not None:
        problems.append(f"moe_latent_size={c['moe_latent_size']} (the zoo's experts read the model's width)")
    if c.get("num_nextn_predict_layers"):
        problems.append(f"num_nextn_predict_layers={c['num_nextn_predict_layers']} (multi-token prediction layers)")
    return problems


def nemotron_ssd(c: dict) -> dict:
    """Nemotron-H's Mamba-2 mixer as the zoo's SSD, ``mamba_num_heads · mamba_head_dim`` wide (its ``expand`` where
    that is a whole multiple of the model's width, else its ``d_inner``: transformers ignores the config's ``expand``)."""
    d_inner = c["mamba_num_heads"] * c["mamba_head_dim"]
    width = {"d_inner": d_inner} if d_inner % c["hidden_size"] else {"expand": d_inner // c["hidden_size"]}
    return spec("components.SSD", n_heads=c["mamba_num_heads"], d_state=nemotron_field(c, "ssm_state_size"),
                n_groups=nemotron_field(c, "n_groups"), **width,
                chunk_size=nemotron_field(c, "chunk_size"), conv=True, rope=False, gate=True,
                conv_kernel=nemotron_field(c, "conv_kernel"), norm_eps=nemotron_field(c, "layer_norm_epsilon"))


def nemotron_moe(c: dict) -> dict:
    """Nemotron-H's MoE: DeepSeek-V3's sigmoid router (its correction bias the router's ``balance_bias``), plain
    experts of ``moe_intermediate_size`` and one shared plain MLP (transformers builds it whatever
    ``n_shared_experts`` says), all of ``mlp_hidden_act``."""
    act, experts = nemotron_field(c, "mlp_hidden_act"), c["n_routed_experts"]
    router = spec("components.SigmoidRouter", n_experts=experts, top_k=c["num_experts_per_tok"],
                  normalize=bool(nemotron_field(c, "norm_topk_prob")),
                  scale=float(nemotron_field(c, "routed_scaling_factor")), n_groups=nemotron_field(c, "n_group"),
                  top_groups=nemotron_field(c, "topk_group"))
    return spec("components.ComposedMoE", router=router,
                experts=spec("components.state.MLPExperts", n_experts=experts, d_ff=c["moe_intermediate_size"],
                             activation="plain", act=act),
                shared_expert=spec("components.MLP", d_ff=c["moe_shared_expert_intermediate_size"], activation="plain",
                                   act=act))


def plain_expert_stacks(ours: str, theirs: str, E: int, up: str, down: str) -> list[tuple]:
    """A bank of ``E`` plain experts as transformers' files hold it, one matrix each (``{theirs}.{e}.{up}.weight``
    ``[d_ff, d]``, ``down`` ``[d, d_ff]``), and the zoo's stacks ``{ours}.w_in [E, d, d_ff]``, ``w_out [E, d_ff, d]``."""
    def stacked(*weights: torch.Tensor) -> torch.Tensor:
        return torch.stack(weights).transpose(1, 2).contiguous()

    def unstacked(w: torch.Tensor) -> list[torch.Tensor]:
        return [w[e].T.contiguous() for e in range(E)]  # (safetensors: contiguous only)

    return [(f"{ours}.w_in", [f"{theirs}.{e}.{up}.weight" for e in range(E)], stacked, unstacked),
            (f"{ours}.w_out", [f"{theirs}.{e}.{down}.weight" for e in range(E)], stacked, unstacked)]


def nemotron_alike(settings: list, what: str) -> str | None:
    """Nemotron-H has one configuration of each kind of layer: ``settings`` (one per layer of a kind) that differ,
    named."""
    if len(set(settings)) > 1:
        return f"its {what} differ: {sorted(set(settings), key=str)}; Nemotron-H has one configuration of them"
    return None


def nemotron_mixer(block) -> tuple[str | None, object]:
    """A block's Nemotron-H layer kind (``linear_attention``, ``full_attention``, ``mlp``, ``moe``) and its one mixer;
    ``(None, None)`` for a block that is none of them (two mixers, a whole block, another class)."""
    s, t = getattr(block, "sequence_mixer", None), getattr(block, "state_mixer", None)
    if (s is None) == (t is None):
        return None, None
    m = s if t is None else t
    kind = {"SSD": "linear_attention", "QCAttention": "full_attention", "MLP": "mlp"}.get(type(m).__name__)
    if isinstance(m, MoE):
        kind = "moe"
    return (kind, m) if kind else (None, None)


class NemotronH:
    """NVIDIA's Nemotron-H: a stack of single-mixer layers, each behind one RMSNorm: Mamba-2 (``S-``), attention
    without positions (``A-``: QCAttention with ``rope=False``, heads of ``head_dim``), a plain MLP (``-M``: two
    matrices, ``mlp_hidden_act``, relu² by default) or a routed MoE (``-E``: :func:`nemotron_moe`)."""

    name, model_type = "NemotronHForCausalLM", "nemotron_h"
    # (ignored because transformers' model ignores them: expand, n_shared_experts, moe_shared_expert_overlap,
    # mtp_layers_block_type without MTP layers, use_mamba_kernels, mamba_ssm_cache_dtype)
    honoured = {"vocab_size", "hidden_size", "layers_block_type", "layer_types", "hybrid_override_pattern",
                "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
                "intermediate_size", "mlp_hidden_act", "mamba_num_heads", "mamba_head_dim", "mamba_hidden_act",
                "ssm_state_size", "n_groups", "conv_kernel", "chunk_size", "use_conv_bias", "mamba_proj_bias",
                "time_step_limit", "layer_norm_epsilon", "tie_word_embeddings", "pad_token_id", "n_routed_experts",
                "num_experts_per_tok", "moe_intermediate_size", "moe_shared_expert_intermediate_size",
                "moe_latent_size", "norm_topk_prob", "routed_scaling_factor", "n_group", "topk_group",
                "num_nextn_predict_layers", "expand", "n_shared_experts", "moe_shared_expert_overlap",
                "mtp_layers_block_type", "use_mamba_kernels", "mamba_ssm_cache_dtype", "attention_head_dim",
                "rms_norm_eps", *NEMOTRON_LEGACY.values()}
    ends = Mamba2.ends
    ties_embeddings = False  # transformers' Nemotron-H never ties its head, whatever tie_word_embeddings says (5.25)

    @staticmethod
    def layer_count(c: dict) -> int:
        return len(nemotron_tokens(c))

    @staticmethod
    def recipe(c: dict) -> dict:
        tokens = nemotron_tokens(c)
        problems = nemotron_problems(c)
        refuse_fields(problems)
        kinds, mixers = {t.strip("-") for t in tokens}, {}
        if "S" in kinds:
            mixers["S"] = nemotron_ssd(c)
        if "A" in kinds:
            heads = c["num_attention_heads"]
            mixers["A"] = spec("components.QCAttention", n_heads=heads, n_kv_heads=c.get("num_key_value_heads") or heads,
                               head_dim=nemotron_head_dim(c), rope=False)
        if "M" in kinds:
            mixers["M"] = spec("components.MLP", d_ff=c["intermediate_size"], activation="plain",
                               act=nemotron_field(c, "mlp_hidden_act"))
        if "E" in kinds:
            mixers["E"] = nemotron_moe(c)
        # (no positions anywhere: the recipe accepts any length; its embedding has no padding row)
        return {**common_recipe(c, 10000.0, 1.0, False, extrapolate=True, padding=False), "tie_embeddings": False,
                "pattern": " ".join(tokens), "norm_eps": nemotron_field(c, "layer_norm_epsilon"), "mixers": mixers}

    @staticmethod
    def training(c: dict) -> dict:
        """No balancing loss for its MoE layers: their router balances by its bias (DeepSeek-V3's way, which
        the zoo's ``SigmoidRouter`` keeps stepping while it fine-tunes); a recipe may add Switch's loss back."""
        return {"aux_loss_coef": 0.0} if "-E" in nemotron_tokens(c) else {}

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        token, hf, ours = nemotron_tokens(c)[i], f"backbone.layers.{i}", f"blocks.{i}"
        norm = "sequence_norm" if token[1] == "-" else "state_norm"
        pairs = [(f"{ours}.{norm}.weight", [f"{hf}.norm.weight"])]
        if token == "S-":
            return pairs + mamba2_pairs(f"{ours}.sequence_mixer", f"{hf}.mixer")
        if token == "A-":
            return pairs + attention_pairs(f"{ours}.sequence_mixer", f"{hf}.mixer")
        t, mixer = f"{ours}.state_mixer", f"{hf}.mixer"
        if token == "-M":
            return pairs + [(f"{t}.in_proj.weight", [f"{mixer}.up_proj.weight"]),
                            (f"{t}.out_proj.weight", [f"{mixer}.down_proj.weight"])]
        return pairs + [(f"{t}.router.centroids.weight", [f"{mixer}.gate.weight"]),
                        (f"{t}.router.balance_bias", [f"{mixer}.gate.e_score_correction_bias"]),
                        (f"{t}.shared_expert.in_proj.weight", [f"{mixer}.shared_experts.up_proj.weight"]),
                        (f"{t}.shared_expert.out_proj.weight", [f"{mixer}.shared_experts.down_proj.weight"])]

    @staticmethod
    def reshaped(c: dict, i: int) -> list[tuple]:
        token, mixer = nemotron_tokens(c)[i], f"backbone.layers.{i}.mixer"
        if token == "S-":
            d_inner = c["mamba_num_heads"] * c["mamba_head_dim"]
            xbc = d_inner + 2 * nemotron_field(c, "n_groups") * nemotron_field(c, "ssm_state_size")
            return [mamba_in_proj(f"blocks.{i}.sequence_mixer.in_proj.weight", f"{mixer}.in_proj.weight", d_inner, xbc,
                                  c["mamba_num_heads"])]
        if token == "-E":
            return plain_expert_stacks(f"blocks.{i}.state_mixer.experts", f"{mixer}.experts", c["n_routed_experts"],
                                       "up_proj", "down_proj")
        return []

    @staticmethod
    def mismatch(model) -> str | None:
        why = ("a NemotronHForCausalLM is single-mixer blocks: an SSD, an attention without RoPE, a plain MLP or a MoE "
               "of a SigmoidRouter, plain experts and a plain shared MLP ('S-', 'A-', '-M', '-E')")
        blocks = list(model.blocks)
        mixers = [nemotron_mixer(b) for b in blocks]
        for b, (kind, _) in zip(blocks, mixers):
            if kind is None:
                s, t = getattr(b, "sequence_mixer", None), getattr(b, "state_mixer", None)
                return (f"its block {b.token!r} holds {type(s).__name__ if s else '-'} and "
                        f"{type(t).__name__ if t else '-'}; {why}")
        if any(b.sequence_residual is not None or b.state_residual is not None for b in blocks):
            return "its blocks scale their residuals, which Nemotron-H does not"
        ssds = [m for k, m in mixers if k == "linear_attention"]
        reason = mamba2_ssd_problem(model, ssds, "Nemotron-H", "layer_norm_epsilon")
        if reason:
            return reason
        attentions = [m for k, m in mixers if k == "full_attention"]
        if not attentions:
            return no_attention_reason("Nemotron-H")
        if any(a.positions.rope or a.positions.q_norm is not None or a.sliding_window is not None or a.qkv_bias
               for a in attentions):
            return "its attention has RoPE, a QK-norm, a window or query/key/value biases; Nemotron-H's has none of them"
        mlps = [m for k, m in mixers if k == "mlp"]
        if any(m.activation != "plain" for m in mlps):
            return f"its MLPs are {sorted({m.activation for m in mlps})}; Nemotron-H's are plain (two matrices)"
        moes = [m for k, m in mixers if k == "moe"]
        for m in moes:
            r, e, sh = m.router, m.experts, m.shared_expert
            if (type(r).__name__ != "SigmoidRouter" or type(e).__name__ != "MLPExperts" or e.activation != "plain"
                    or m.cross_domain is not None or sh is None or type(sh).__name__ != "MLP" or sh.activation != "plain"
                    or sh.act_name != act_name(e.act)):
                return ("its MoE is not Nemotron-H's (a SigmoidRouter, plain MLPExperts and a plain shared MLP of their "
                        "activation, no cross-domain part)")
        acts = {m.act_name for m in mlps} | {act_name(m.experts.act) for m in moes}
        if acts and len(acts) > 1:
            return f"its MLPs and experts use {sorted(acts)}; Nemotron-H has one mlp_hidden_act"
        return (nemotron_alike([(s.n_heads, s.d_inner, s.d_state, s.n_groups, s.chunk_size, s.conv.kernel_size[0])
                                for s in ssds], "SSDs (heads, width, state, groups, chunk, conv)")
                or nemotron_alike([(a.n_heads, a.n_kv_heads, a.head_dim) for a in attentions],
                                  "attentions (heads, key/value heads, head_dim)")
                or nemotron_alike([m.d_ff for m in mlps], "MLPs' widths")
                or nemotron_alike([(m.router.n_experts, m.router.top_k, m.router.normalize, m.router.scale,
                                    m.router.n_groups, m.router.top_groups, m.experts.d_ff, m.shared_expert.d_ff)
                                   for m in moes], "MoEs (experts, top-k, normalize, scale, groups, widths)"))

    @staticmethod
    def config(model) -> dict:
        config = common_config(model, NemotronH.name, NemotronH.model_type)
        for key in ("num_hidden_layers", "rope_theta", "rope_scaling"):  # (the list counts the layers; no RoPE)
            config.pop(key, None)
        mixers = [nemotron_mixer(b) for b in model.blocks]
        config.update(layers_block_type=[kind for kind, _ in mixers], tie_word_embeddings=False,  # (see ties_embeddings)
                      layer_norm_epsilon=model.norm.eps, use_bias=False,
                      use_conv_bias=True, mamba_proj_bias=False, attention_bias=False, mlp_bias=False,
                      time_step_limit=[0.0, float("inf")], sliding_window=None, mamba_hidden_act="silu",
                      num_nextn_predict_layers=0, moe_latent_size=None)
        for kind, m in mixers:  # (mismatch has checked that each kind has one configuration)
            if kind == "linear_attention":
                config.update(mamba_num_heads=m.n_heads, mamba_head_dim=m.head_dim, ssm_state_size=m.d_state,
                              n_groups=m.n_groups, chunk_size=m.chunk_size, conv_kernel=m.conv.kernel_size[0])
            elif kind == "full_attention":
                config.update(num_attention_heads=m.n_heads, num_key_value_heads=m.n_kv_heads, head_dim=m.head_dim)
            elif kind == "moe":
                r = m.router
                config.update(n_routed_experts=r.n_experts, num_experts_per_tok=r.top_k, norm_topk_prob=r.normalize,
                              routed_scaling_factor=r.scale, n_group=r.n_groups, topk_group=r.top_groups,
                              moe_intermediate_size=m.experts.d_ff, n_shared_experts=1,
                              moe_shared_expert_intermediate_size=m.shared_expert.d_ff,
                              mlp_hidden_act=act_name(m.experts.act))
            else:
                config.update(intermediate_size=m.d_ff, mlp_hidden_act=m.act_name)
        return config



# ---- Qwen3-Next: Gated DeltaNet and gated attention ----------------------------------------------------------------

QWEN3_NEXT_DEFAULTS = {"intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
                       "rms_norm_eps": 1e-6, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
                       "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                       "decoder_sparse_step": 1, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                       "num_experts_per_tok": 10, "num_experts": 512, "norm_topk_prob": True,
                       "max_position_embeddings": 32768}
"""Qwen3-Next's fields where its config has none: ``Qwen3NextConfig``'s defaults."""

QWEN3_NEXT_ROPE_FRACTION, QWEN3_NEXT_ATTENTION_EVERY = 0.25, 4
"""The share of each head Qwen3-Next's RoPE turns, and every how many layers one attends (``full_attention_interval``),
where its config says neither: ``Qwen3NextConfig``'s defaults."""


def qwen3_next_attending(c: dict) -> list[bool]:
    """Which layers of a Qwen3-Next attend (``full_attention``); the others are Gated DeltaNet (``linear_attention``).
    ``layer_types``, or where it has none every ``full_attention_interval``-th layer (4 where that is absent)."""
    layers = c["num_hidden_layers"]
    types = c.get("layer_types")
    if types is None:
        every = c.get("full_attention_interval", QWEN3_NEXT_ATTENTION_EVERY)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"full_attention_interval={every!r}: a whole number of layers, at least 1, expected")
        return [(i + 1) % every == 0 for i in range(layers)]
    return attending_layers(types, layers)


def attending_layers(types, layers: int) -> list[bool]:
    """Which of ``layers`` layers a ``layer_types`` list of ``linear_attention`` and ``full_attention`` (Gated DeltaNet
    hybrids': Qwen3-Next's, OLMo-Hybrid's) names ``full_attention``; any other list is refused by name."""
    if not isinstance(types, list) or len(types) != layers or not set(types) <= {"linear_attention", "full_attention"}:
        raise ValueError(f"layer_types={types!r}: {layers} entries (num_hidden_layers), each 'linear_attention' or "
                         "'full_attention', expected")
    return [kind == "full_attention" for kind in types]


def gated_deltanet_pairs(ours: str, theirs: str, norm: str = "norm", out: str = "out_proj") -> list[tuple[str, list[str]]]:
    """A Gated DeltaNet layer's weights that only change names, from the zoo's ``ours`` to transformers' ``theirs``
    (Qwen3-Next's and Qwen3.5's; OLMo-Hybrid's with ``norm="o_norm"``, ``out="o_proj"``); ``in_proj`` is stacked
    from the class's input maps (``in_proj`` hooks)."""
    return [(f"{ours}.{mine}", [f"{theirs}.{name}"]) for mine, name in
            (("conv.weight", "conv1d.weight"), ("A_log", "A_log"), ("dt_bias", "dt_bias"),
             ("norm.weight", f"{norm}.weight"), ("out_proj.weight", f"{out}.weight"))]


def qwen3_next_zero_centred(c: dict) -> list[str]:
    """The zoo names of the RMSNorm gains a Qwen3-Next stores as offsets from 1 (its norm scales by ``1 + w``): each
    layer's two, the attention's QK-norms, the final norm — not Gated DeltaNet's own norm, which scales by ``w``."""
    attending = qwen3_next_attending(c)
    names = ["norm.weight"]
    for i in range(c["num_hidden_layers"]):
        names += [f"blocks.{i}.sequence_norm.weight", f"blocks.{i}.state_norm.weight"]
        if attending[i]:
            names += [f"blocks.{i}.sequence_mixer.positions.{norm}.weight" for norm in ("q_norm", "k_norm")]
    return names


def qwen3_next_in_proj(ours: str, theirs: str, c: dict) -> tuple:
    """Gated DeltaNet's input map: transformers' ``in_proj_qkvz`` groups its rows by key head, ``[q | k | v | z]`` for
    each (the value heads that share it together), and ``in_proj_ba`` its rows as ``[β | a]`` per key head; the zoo's
    one ``in_proj`` is ``[q | k | v | z | β | a]``, each part head after head."""
    Hk, H = c["linear_num_key_heads"], c["linear_num_value_heads"]
    K, V, r = c["linear_key_head_dim"], c["linear_value_head_dim"], H // Hk
    parts = [K, K, r * V, r * V]

    def to_zoo(qkvz: torch.Tensor, ba: torch.Tensor) -> torch.Tensor:
        grouped = [*qkvz.view(Hk, sum(parts), -1).split(parts, dim=1), *ba.view(Hk, 2 * r, -1).split([r, r], dim=1)]
        return torch.cat([part.flatten(0, 1) for part in grouped])  # each [heads · dim, d], head after head

    def to_hf(w: torch.Tensor) -> list[torch.Tensor]:
        q, k, v, z, b, a = (part.view(Hk, -1, w.shape[1]) for part in w.split([Hk * K, Hk * K, H * V, H * V, H, H]))
        return [torch.cat([q, k, v, z], dim=1).flatten(0, 1), torch.cat([b, a], dim=1).flatten(0, 1)]

    return ours, [f"{theirs}.in_proj_qkvz.weight", f"{theirs}.in_proj_ba.weight"], to_zoo, to_hf


QWEN3_NEXT_MTP_FIELDS = ("mtp_num_hidden_layers", "mtp_use_dedicated_embeddings")
"""The multi-token-prediction layers' settings in the hub's Qwen3-Next and Qwen3.5 configs: transformers never runs those
layers (it drops their ``mtp.*`` weights on loading), nor does the import."""


class Qwen3Next:
    """Qwen3-Next (``Qwen3NextForCausalLM``): Gated DeltaNet (``G``: ``GatedDeltaNet``, key heads shared by value heads,
    ``linear_*`` shapes) in most layers and gated attention (``A``: ``QCAttention(output_gate=True)`` with a QK-norm and
    RoPE on ``partial_rotary_factor`` of each head, 0.25 unless said) in those ``layer_types`` names
    ``full_attention``; in the layers ``decoder_sparse_step`` and ``mlp_only_layers`` leave to it a MoE (``R``:
    ``ComposedMoE`` of a softmax ``TopKRouter`` renormalised where ``norm_topk_prob``, SwiGLU experts of
    ``moe_intermediate_size`` and a shared SwiGLU MLP of ``shared_expert_intermediate_size`` under a per-token
    ``SigmoidGated``), a SwiGLU MLP of ``intermediate_size`` in the others (``M``). Its RMSNorms scale by ``1 + w``:
    the import adds 1 to those gains and the export takes it off (:meth:`fold`), and the attention's query map, whose
    rows hold each head's query then its gate, is split into ``q_proj`` and ``gate_proj``. Both ways."""

    name, model_type = "Qwen3NextForCausalLM", "qwen3_next"
    honoured = Llama.honoured | {"layer_types", "full_attention_interval", "partial_rotary_factor", "decoder_sparse_step",
                                 "mlp_only_layers", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                 "shared_expert_intermediate_size", "norm_topk_prob", "linear_conv_kernel_dim",
                                 "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                                 "linear_num_value_heads"} | set(QWEN3_NEXT_MTP_FIELDS)
    ends = Llama.ends
    gated_attention = True  # (the export's dispatcher lets a model whose attention gates its output through)
    in_proj = staticmethod(qwen3_next_in_proj)

    @staticmethod
    def settings(c: dict) -> dict:
        """The config with the class's defaults where it is silent."""
        return {**QWEN3_NEXT_DEFAULTS, **c}

    @classmethod
    def recipe(cls, c: dict) -> dict:
        c = cls.settings(c)
        attending, moe = qwen3_next_attending(c), qwen3_moe_layers(c)
        base = decoder_recipe(c, qk_norm=True, norm_eps=c["rms_norm_eps"], output_gate=True,
                              rope_fraction=partial_rotary_factor(c, QWEN3_NEXT_ROPE_FRACTION))
        act = c.get("hidden_act", "silu")
        if act != "silu" and not all(attending):  # (transformers' Gated DeltaNet runs its conv through hidden_act)
            refuse_fields([f"hidden_act={act!r} (Gated DeltaNet's convolution runs through it too, and the zoo's "
                           "through SiLU)"])
        mixers = {}
        if any(attending):
            mixers["A"] = base["mixers"]["A"]
        if not all(attending):
            mixers["G"] = spec("components.GatedDeltaNet", n_heads=c["linear_num_value_heads"],
                               n_k_heads=c["linear_num_key_heads"], head_dim=c["linear_key_head_dim"],
                               v_head_dim=c["linear_value_head_dim"], conv_kernel=c["linear_conv_kernel_dim"],
                               norm_eps=c["rms_norm_eps"])
        if not all(moe):
            mixers["M"] = base["mixers"]["M"]
        if any(moe):
            mixers["R"] = shared_gated_moe(qwen3_moe_experts(c), c["num_experts_per_tok"], bool(c["norm_topk_prob"]),
                                           c["moe_intermediate_size"], c["shared_expert_intermediate_size"], act)
        tokens = [("A" if a else "G") + ("R" if m else "M") for a, m in zip(attending, moe)]
        pattern = compact_pattern(tokens)
        return {**base, "pattern": pattern, "mixers": mixers}

    @classmethod
    def layer_pairs(cls, c: dict, i: int) -> list[tuple[str, list[str]]]:
        c = cls.settings(c)
        hf, ours = f"model.layers.{i}", f"blocks.{i}"
        mixer, state = f"{ours}.sequence_mixer", f"{ours}.state_mixer"
        pairs = [(f"{ours}.sequence_norm.weight", [f"{hf}.input_layernorm.weight"]),
                 (f"{ours}.state_norm.weight", [f"{hf}.post_attention_layernorm.weight"])]
        if qwen3_next_attending(c)[i]:  # (q_proj: each head's query and gate rows, split by fold)
            pairs += [*attention_pairs(mixer, f"{hf}.self_attn"),
                      *((f"{mixer}.positions.{norm}.weight", [f"{hf}.self_attn.{norm}.weight"]) for norm in ("q_norm", "k_norm"))]
        else:
            pairs += gated_deltanet_pairs(mixer, f"{hf}.linear_attn")
        if not qwen3_moe_layers(c)[i]:
            return [*pairs, *swiglu_pairs(state, f"{hf}.mlp")]
        return [*pairs, *shared_gated_moe_pairs(state, f"{hf}.mlp")]

    @classmethod
    def reshaped(cls, c: dict, i: int) -> list[tuple]:
        c = cls.settings(c)
        out = [] if qwen3_next_attending(c)[i] else [
            cls.in_proj(f"blocks.{i}.sequence_mixer.in_proj.weight", f"model.layers.{i}.linear_attn", c)]
        if qwen3_moe_layers(c)[i]:
            out += expert_stacks(f"blocks.{i}.state_mixer.experts", f"model.layers.{i}.mlp.experts",
                                 qwen3_moe_experts(c), "gate_proj", "up_proj", "down_proj")
        return out

    @staticmethod
    def unused(c: dict, name: str) -> bool:
        return name.startswith("mtp.")  # (the multi-token-prediction layers, which transformers drops on loading)

    @classmethod
    def fold(cls, c: dict, zoo: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``zoo`` (the files' tensors renamed) with 1 added to the zero-centred norms' gains (in fp32, where a bf16
        ``1 + w`` would round ``w`` away) and each attention's ``[query | gate]`` rows per head split in two."""
        c = cls.settings(c)
        out = dict(zoo)
        for name in qwen3_next_zero_centred(c):
            out[name] = zoo[name].float() + 1
        heads, head_dim = c["num_attention_heads"], c["head_dim"]
        for i, attends in enumerate(qwen3_next_attending(c)):
            if attends:
                a = f"blocks.{i}.sequence_mixer"
                rows = zoo[f"{a}.q_proj.weight"].view(heads, 2, head_dim, -1)  # [H, query | gate, Dh, d]
                out[f"{a}.q_proj.weight"] = rows[:, 0].reshape(heads * head_dim, -1)
                out[f"{a}.gate_proj.weight"] = rows[:, 1].reshape(heads * head_dim, -1)
        return out

    @classmethod
    def unfold(cls, c: dict, zoo: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The inverse of :meth:`fold`, before an export renames the tensors."""
        out = dict(zoo)
        for name in qwen3_next_zero_centred(c):
            out[name] = (zoo[name].float() - 1).to(zoo[name].dtype)
        heads, head_dim = c["num_attention_heads"], c["head_dim"]
        for i, attends in enumerate(qwen3_next_attending(c)):
            if attends:
                a = f"blocks.{i}.sequence_mixer"
                q, gate = zoo[f"{a}.q_proj.weight"], out.pop(f"{a}.gate_proj.weight")
                out[f"{a}.q_proj.weight"] = torch.stack([q.view(heads, head_dim, -1), gate.view(heads, head_dim, -1)],
                                                        dim=1).reshape(2 * heads * head_dim, -1)
        return out

    @classmethod
    def mismatch(cls, model) -> str | None:
        why = ("a Qwen3NextForCausalLM is GatedDeltaNet or QCAttention with an output gate, then a SwiGLU MLP or a "
               "ComposedMoE with a shared expert, in every block")
        blocks = list(model.blocks)
        if any(getattr(b, "sequence_mixer", None) is None or getattr(b, "state_mixer", None) is None for b in blocks):
            return f"its pattern has blocks {sorted({b.token for b in blocks})}; {why}"
        kinds = {(type(b.sequence_mixer).__name__, type(b.state_mixer).__name__) for b in blocks}
        if not kinds <= {(s, m) for s in ("QCAttention", "GatedDeltaNet") for m in ("MLP", "ComposedMoE")}:
            return f"its blocks hold {sorted('/'.join(k) for k in kinds)}; {why}"
        if any(b.sequence_residual is not None for b in blocks):
            return "its blocks scale their residuals, which Qwen3-Next does not"
        attentions = [b.sequence_mixer for b in blocks if isinstance(b.sequence_mixer, QCAttention)]
        rules = [b.sequence_mixer for b in blocks if isinstance(b.sequence_mixer, GatedDeltaNet)]
        mlps = [b.state_mixer for b in blocks if not isinstance(b.state_mixer, MoE)]
        moes = [b.state_mixer for b in blocks if isinstance(b.state_mixer, MoE)]
        eps = model.norm.eps
        if not attentions:
            return "it has no attention block, and transformers' Qwen3NextForCausalLM fails without one (transformers 5.25)"
        if len({(a.n_heads, a.n_kv_heads, a.head_dim, a.positions.rope_fraction) for a in attentions}) > 1:
            return "its attentions differ in heads or RoPE; Qwen3-Next has one attention configuration"
        for a in attentions:
            norm = a.positions.q_norm
            if (a.gate_proj is None or norm is None or norm.eps != eps or not a.positions.rope
                    or a.sliding_window is not None or a.qkv_bias):
                return ("its attention is not Qwen3-Next's (an output gate, a QK-norm of the model's eps, RoPE, every key, "
                        "no biases)")
        if len({(g.n_heads, g.n_k_heads, g.head_dim, g.v_head_dim, g.conv.kernel_size[0]) for g in rules}) > 1:
            return "its Gated DeltaNets differ in shape; Qwen3-Next has one linear_* configuration"
        if any(not g.gate or g.allow_neg_eigval or g.norm.eps != eps for g in rules):
            return ("its Gated DeltaNet is not Qwen3-Next's (the output gate on, β in (0, 1), its norm of the model's "
                    "eps)")
        if len({(m.d_ff, m.activation) for m in mlps}) > 1 or any(m.activation != "swiglu" for m in mlps):
            return "its MLPs are not SwiGLU of one width; Qwen3-Next's are"
        for m in moes:
            shared = m.shared_expert
            if (type(m.router).__name__ != "TopKRouter" or type(m.experts).__name__ != "MLPExperts"
                    or m.experts.activation != "swiglu" or m.cross_domain is not None
                    or type(shared).__name__ != "SigmoidGated" or type(shared.inner).__name__ != "MLP"
                    or shared.inner.activation != "swiglu"):
                return ("its MoE is not Qwen3-Next's (a TopKRouter over SwiGLU experts and a shared SwiGLU MLP under a "
                        "per-token sigmoid gate, SigmoidGated)")
        if len({(m.router.n_experts, m.router.top_k, m.router.normalize, m.experts.d_ff, m.shared_expert.inner.d_ff)
                for m in moes}) > 1:
            return "its MoEs differ in experts, top-k or widths; Qwen3-Next has one MoE configuration"
        acts = {m.act_name for m in mlps} | {act_name(m.experts.act) for m in moes} | {m.shared_expert.inner.act_name
                                                                                     for m in moes}
        if len(acts) > 1:
            return f"its MLPs and experts use different activations {sorted(acts)}; a Qwen3-Next has one hidden_act"
        if rules and acts - {"silu"}:
            return (f"its MLPs use {sorted(acts)[0]} beside Gated DeltaNet; Qwen3-Next's one hidden_act is also its "
                    "Gated DeltaNet's convolution's activation, SiLU in the zoo's")
        return None

    @classmethod
    def config(cls, model) -> dict:
        blocks = list(model.blocks)
        a = next(b.sequence_mixer for b in blocks if isinstance(b.sequence_mixer, QCAttention))
        g = next((b.sequence_mixer for b in blocks if isinstance(b.sequence_mixer, GatedDeltaNet)), None)
        mlp = next((b.state_mixer for b in blocks if not isinstance(b.state_mixer, MoE)), None)
        moe = next((b.state_mixer for b in blocks if isinstance(b.state_mixer, MoE)), None)
        config = partial_rope_parameters(common_config(model, cls.name, cls.model_type), model, a.positions.rope_fraction)
        config.update(
            rms_norm_eps=model.norm.eps, hidden_act=mlp.act_name if mlp else act_name(moe.experts.act),
            num_attention_heads=a.n_heads, num_key_value_heads=a.n_kv_heads, head_dim=a.head_dim, attention_bias=False,
            layer_types=["full_attention" if isinstance(b.sequence_mixer, QCAttention) else "linear_attention"
                         for b in blocks],
            decoder_sparse_step=1, mlp_only_layers=[i for i, b in enumerate(blocks) if not isinstance(b.state_mixer, MoE)],
            intermediate_size=(mlp.d_ff if mlp else moe.experts.d_ff),
            num_experts=moe.router.n_experts if moe else 0, num_experts_per_tok=moe.router.top_k if moe else 1,
            moe_intermediate_size=moe.experts.d_ff if moe else mlp.d_ff,
            shared_expert_intermediate_size=moe.shared_expert.inner.d_ff if moe else mlp.d_ff,
            norm_topk_prob=bool(moe and moe.router.normalize))
        if g is not None:
            config.update(linear_num_value_heads=g.n_heads, linear_num_key_heads=g.n_k_heads,
                          linear_key_head_dim=g.head_dim, linear_value_head_dim=g.v_head_dim,
                          linear_conv_kernel_dim=g.conv.kernel_size[0])
        return config


QWEN3_5_DEFAULTS = {"vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
                    "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256, "rms_norm_eps": 1e-6,
                    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "max_position_embeddings": 32768}
"""Qwen3.5's text fields where its config has none: ``Qwen3_5TextConfig``'s defaults."""

QWEN3_NEXT_MOE_FIELDS = ("decoder_sparse_step", "mlp_only_layers", "num_experts", "num_experts_per_tok",
                         "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob")


def qwen3_5_in_proj(ours: str, theirs: str, c: dict) -> tuple:
    """Qwen3.5's Gated DeltaNet input maps, ``in_proj_qkv`` (``[q | k | v]``, each head after head), ``in_proj_z``,
    ``in_proj_b`` and ``in_proj_a``: the zoo's one ``in_proj`` ``[q | k | v | z | β | a]`` is the four stacked."""
    Hk, H = c["linear_num_key_heads"], c["linear_num_value_heads"]
    K, V = c["linear_key_head_dim"], c["linear_value_head_dim"]
    sizes = [2 * Hk * K + H * V, H * V, H, H]
    names = [f"{theirs}.in_proj_{part}.weight" for part in ("qkv", "z", "b", "a")]
    return ours, names, lambda *parts: torch.cat(parts), lambda w: list(w.split(sizes))


class Qwen3_5(Qwen3Next):
    """Qwen3.5's language model (``Qwen3_5ForCausalLM``, ``qwen3_5_text``): Qwen3-Next's layers (Gated DeltaNet, gated
    attention, zero-centred norms; :class:`Qwen3Next`) with a SwiGLU MLP in every layer, and Gated DeltaNet's input maps
    stored as four matrices (:func:`qwen3_5_in_proj`). Its RoPE is multimodal (``mrope_section``), which on text, every
    section at the same position, is plain RoPE. Both ways."""

    name, model_type = "Qwen3_5ForCausalLM", "qwen3_5_text"
    honoured = Qwen3Next.honoured - set(QWEN3_NEXT_MOE_FIELDS)
    in_proj = staticmethod(qwen3_5_in_proj)

    @staticmethod
    def settings(c: dict) -> dict:
        return {**QWEN3_5_DEFAULTS, **c, "num_experts": 0}  # (no MoE: an MLP in every layer)

    @classmethod
    def mismatch(cls, model) -> str | None:
        if any(isinstance(getattr(b, "state_mixer", None), MoE) for b in model.blocks):
            return "it has MoE blocks; Qwen3.5's language model has a SwiGLU MLP in every layer"
        return super().mismatch(model)

    @classmethod
    def config(cls, model) -> dict:
        config = super().config(model)
        for field in QWEN3_NEXT_MOE_FIELDS:
            config.pop(field)
        return config


def language_model_name(name: str) -> str:
    """A text-only class's weight name as a multimodal checkpoint holds it: under ``model.language_model.``."""
    return f"model.language_model.{name.removeprefix('model.')}" if name.startswith("model.") else name


class Qwen3_5Multimodal:
    """Qwen3.5 as the hub holds it (``Qwen3_5ForConditionalGeneration``): its language model is imported — the
    ``text_config`` read as :class:`Qwen3_5` reads a config (its fields audited there), the weights under
    ``model.language_model.`` — and its vision tower (``model.visual.``) is left out: the zoo model reads text. Import
    only; the export writes the language model as ``Qwen3_5ForCausalLM``."""

    name, model_type = "Qwen3_5ForConditionalGeneration", "qwen3_5"
    honoured = {"text_config", "vision_config", "image_token_id", "video_token_id", "vision_start_token_id",
                "vision_end_token_id", "tie_word_embeddings"}
    ends = [(ours, [language_model_name(theirs)]) for ours, (theirs,) in Llama.ends]

    @staticmethod
    def text(c: dict) -> dict:
        """The language model's config: ``text_config``, with the checkpoint's ``tie_word_embeddings``."""
        text = c.get("text_config")
        if not isinstance(text, dict):
            raise ValueError(f"text_config={text!r}: a Qwen3_5ForConditionalGeneration config holds its language model's "
                             "settings there")
        return {**text, "tie_word_embeddings": c.get("tie_word_embeddings", text.get("tie_word_embeddings", False))}

    @staticmethod
    def recipe(c: dict) -> dict:
        text = Qwen3_5Multimodal.text(c)
        audit(text, Qwen3_5.honoured | {"model_type"}, "config.json's text_config")
        return Qwen3_5.recipe(text)

    @staticmethod
    def layer_count(c: dict) -> int:
        return Qwen3_5.settings(Qwen3_5Multimodal.text(c))["num_hidden_layers"]

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        return [(ours, [language_model_name(name) for name in theirs])
                for ours, theirs in Qwen3_5.layer_pairs(Qwen3_5Multimodal.text(c), i)]

    @staticmethod
    def reshaped(c: dict, i: int) -> list[tuple]:
        return [(ours, [language_model_name(name) for name in theirs] if isinstance(theirs, list)
                 else language_model_name(theirs), forward, backward)
                for ours, theirs, forward, backward in Qwen3_5.reshaped(Qwen3_5Multimodal.text(c), i)]

    @staticmethod
    def fold(c: dict, zoo: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return Qwen3_5.fold(Qwen3_5Multimodal.text(c), zoo)

    @staticmethod
    def unused(c: dict, name: str) -> bool:
        return name.startswith(("model.visual.", "mtp."))  # (the vision tower: the zoo reads text; the MTP layers)

# ---- AI2's OLMo 2, OLMo 3 and OLMo-Hybrid: norms after the mixers, a QK-norm over every head ---------------------

OLMO2_DEFAULTS = {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "hidden_act": "silu"}
"""OLMo 2's fields where its config has none: ``Olmo2Config``'s defaults."""


def olmo_layer_pairs(i: int) -> list[tuple[str, list[str]]]:
    """Layer ``i`` of OLMo 2's decoder (OLMo-Hybrid's attention layers alike): its norms after the attention and the
    MLP (``post_attention_layernorm``, ``post_feedforward_layernorm``), a QK-norm over the whole projections."""
    hf, ours = f"model.layers.{i}", f"blocks.{i}"
    return [(f"{ours}.sequence_norm.weight", [f"{hf}.post_attention_layernorm.weight"]),
            (f"{ours}.state_norm.weight", [f"{hf}.post_feedforward_layernorm.weight"]),
            *attention_pairs(f"{ours}.sequence_mixer", f"{hf}.self_attn"),
            *((f"{ours}.sequence_mixer.positions.{norm}.weight", [f"{hf}.self_attn.{norm}.weight"])
              for norm in ("q_norm", "k_norm")),
            *swiglu_pairs(f"{ours}.state_mixer", f"{hf}.mlp")]


def olmo_attention_mismatch(a, model, short: str, windows: bool = False) -> str | None:
    """What keeps attention ``a`` from OLMo's: a QK-norm over every head's channels (``qk_norm_over="all_heads"``) of
    the model's eps, RoPE over whole heads or none, every key (a window too, where ``windows``: OLMo 3's), no gate, no
    biases."""
    norm = a.positions.q_norm
    if norm is None or a.qk_norm_over != "all_heads" or norm.eps != model.norm.eps:
        return (f"its attention's QK-norm is not {short}'s (one RMSNorm over every head's channels, "
                "qk_norm_over='all_heads', of the model's eps)")
    if (a.gate_proj is not None or (a.sliding_window is not None and not windows) or a.qkv_bias
            or (a.positions.rope and a.positions.rope_fraction != 1)):
        keys = "every key or a window" if windows else "every key"
        return (f"its attention is not {short}'s ({keys}, RoPE over whole heads or none, no output gate, no "
                "biases)")
    return None


def olmo_decoder_mismatch(model, name: str, short: str, windows: bool = False) -> str | None:
    """What keeps ``model`` from OLMo 2's stack (OLMo 3's, with ``windows``): Llama's, with a QK-norm over every head
    (:func:`olmo_attention_mismatch`) and every block's norms after its mixers."""
    if reason := decoder_mismatch(model, name, qk_norm=True, windows="per layer" if windows else "none"):
        return reason
    if not all(block.post_norm for block in model.blocks):
        return f"its blocks norm their mixers' inputs; {short}'s norm what each mixer adds (post_norm)"
    if windows and model.extrapolate:
        return f"it stretches RoPE past its trained length (extrapolate); the export writes {short}'s RoPE plain"
    return olmo_attention_mismatch(model.blocks[0].sequence_mixer, model, short, windows=windows)


class Olmo2:
    """OLMo 2 (``Olmo2ForCausalLM``): Llama's stack with its norms after the attention and the MLP instead of before
    them (``post_norm``: ``x += norm(attend(x))``, ``x += norm(mlp(x))``) and a QK-norm over each whole projection
    (``qk_norm_over="all_heads"``, a gain per channel of ``H·Dh``), both of the model's eps. Both ways."""

    name, model_type = "Olmo2ForCausalLM", "olmo2"
    honoured = Llama.honoured
    ends, reshaped = Llama.ends, staticmethod(nothing_reshaped)
    post_norm = wide_qk_norm = True  # (the export's dispatcher lets these through: :func:`recipes.hf.hf_architecture`)

    @staticmethod
    def recipe(c: dict) -> dict:
        c = {**OLMO2_DEFAULTS, **c}
        recipe = decoder_recipe(c, qk_norm=True, qk_norm_over="all_heads", norm_eps=c["rms_norm_eps"])
        return {**recipe, "post_norm": True}

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        return olmo_layer_pairs(i)

    @staticmethod
    def mismatch(model) -> str | None:
        return olmo_decoder_mismatch(model, Olmo2.name, "OLMo 2")

    @staticmethod
    def config(model) -> dict:
        return decoder_config(model, Olmo2.name, Olmo2.model_type)


OLMO3_DEFAULTS = {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048, "hidden_act": "silu", "sliding_window": 4096}
"""OLMo 3's fields where its config has none: ``Olmo3Config``'s defaults."""

OLMO3_THETA = 500000.0
"""OLMo 3's RoPE base for a layer kind its config gives none: ``Olmo3Config.default_theta``."""


def olmo3_rope_parameters(c: dict) -> dict:
    """OLMo 3's RoPE per layer kind, as ``Olmo3Config`` reads a config: ``rope_parameters`` keyed by
    ``sliding_attention`` and ``full_attention`` (a flat one, not so keyed, is not read: both kinds take the default);
    ``rope_scaling`` joins the full-attention layers' only; a top-level ``rope_theta`` goes to those where they have
    none, and a kind with none takes 500,000."""
    params = c.get("rope_parameters") or {}
    kinds = {kind: dict(params.get(kind) or {"rope_type": "default"}) for kind in ("sliding_attention", "full_attention")}
    kinds["full_attention"].update(c.get("rope_scaling") or {})
    kinds["full_attention"].setdefault("rope_theta", c.get("rope_theta", OLMO3_THETA))
    kinds["sliding_attention"].setdefault("rope_theta", OLMO3_THETA)
    return kinds


def olmo3_rope(c: dict, windows: list[bool]) -> dict:
    """The one plain RoPE the zoo's model holds, as ``rope_parameters``: the layer kinds ``c`` has (``windows``: whether
    each layer is ``sliding_attention``) must agree on it, since the zoo's attention layers read one rotary table."""
    kinds = olmo3_rope_parameters(c)
    used = [kinds["sliding_attention" if w else "full_attention"] for w in windows]
    bases = {number(rope["rope_theta"]) for rope in used}
    if {rope["rope_type"] for rope in used} != {"default"} or len(bases) > 1:
        which = {kind: kinds[kind] for kind, w in (("sliding_attention", True), ("full_attention", False)) if w in windows}
        refuse_fields([f"rope_parameters={which!r} (the zoo's attention layers share one plain RoPE; these layer kinds "
                       "differ, or one is not plain)"])
    return {"rope_type": "default", "rope_theta": bases.pop()}


class Olmo3:
    """OLMo 3 (``Olmo3ForCausalLM``): OLMo 2's layers (:class:`Olmo2`), those ``layer_types`` names
    ``sliding_attention`` (three in four by default) attending to the last ``sliding_window`` keys (4,096 unless
    said), a second attention letter ``W`` at those layers. The layer kinds may hold RoPE of their own; the zoo's
    model holds one plain RoPE, so they must agree (the released models stretch the full-attention layers' by YaRN:
    refused by name). Both ways."""

    name, model_type = "Olmo3ForCausalLM", "olmo3"
    honoured = Llama.honoured | {"sliding_window", "layer_types"}
    ends, reshaped = Llama.ends, staticmethod(nothing_reshaped)
    post_norm = wide_qk_norm = True

    @staticmethod
    def recipe(c: dict) -> dict:
        c = {**OLMO3_DEFAULTS, **c}
        layers = c["num_hidden_layers"]
        default = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(layers)]
        window, types = checked_window(c["sliding_window"]), {**c, "layer_types": c.get("layer_types") or default}
        rope = olmo3_rope(c, windowed_layer_types(types, 1, 0))  # (by kind: a sliding layer without a window too)
        windows = windowed_layer_types(types, window, 0)
        c = {key: value for key, value in c.items() if key not in ("rope_theta", "rope_scaling")}
        recipe = Olmo2.recipe({**c, "rope_parameters": rope})
        return windowed(recipe, window, windows)

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        return olmo_layer_pairs(i)

    @staticmethod
    def mismatch(model) -> str | None:
        return olmo_decoder_mismatch(model, Olmo3.name, "OLMo 3", windows=True)

    @staticmethod
    def config(model) -> dict:
        window, layers = attention_windows(model)
        config = decoder_config(model, Olmo3.name, Olmo3.model_type)
        rope = {"rope_type": "default", "rope_theta": config.pop("rope_theta")}
        return {**config, "rope_parameters": {"sliding_attention": rope, "full_attention": dict(rope)},
                "sliding_window": window,
                "layer_types": ["sliding_attention" if layer else "full_attention" for layer in layers]}


OLMO_HYBRID_DEFAULTS = {"intermediate_size": 11008, "num_attention_heads": 30, "rms_norm_eps": 1e-6,
                        "max_position_embeddings": 65536, "linear_conv_kernel_dim": 4, "linear_allow_neg_eigval": True,
                        "hidden_act": "silu"}
"""OLMo-Hybrid's fields where its config has none: ``OlmoHybridConfig``'s defaults (the linear layers' shapes follow
from the width and heads, :func:`olmo_hybrid_settings`)."""

OLMO_HYBRID_GATE_EPS = 1e-5
"""The eps of OLMo-Hybrid's Gated DeltaNet output norm, whatever ``rms_norm_eps`` says (transformers pins it)."""

OLMO_HYBRID_INIT = {"linear_a_log_min", "linear_a_log_max", "linear_dt_min", "linear_dt_max", "linear_dt_init_floor"}
"""OLMo-Hybrid's fields that only draw the first weights, which an import replaces."""


def olmo_hybrid_settings(c: dict) -> dict:
    """An OLMo-Hybrid config with the class's defaults where it is silent, as ``OlmoHybridConfig`` fills them: the
    linear layers' heads those of the attention, keys ``0.75 · width / key heads`` wide, values twice the keys."""
    c = {**OLMO_HYBRID_DEFAULTS, **c}
    k_heads = c.get("linear_num_key_heads") or c["num_attention_heads"]
    k_dim = c.get("linear_key_head_dim") or int(0.75 * c["hidden_size"] / k_heads)
    return {**c, "linear_num_key_heads": k_heads, "linear_key_head_dim": k_dim,
            "linear_num_value_heads": c.get("linear_num_value_heads") or c["num_attention_heads"],
            "linear_value_head_dim": c.get("linear_value_head_dim") or 2 * k_dim}


def olmo_hybrid_attending(c: dict) -> list[bool]:
    """Which layers of an OLMo-Hybrid attend (``full_attention``); the others are Gated DeltaNet. ``layer_types``, or
    where it has none every 4th layer (the last where that leaves none), as transformers reads it; a model of one kind
    only is refused, as transformers refuses it."""
    layers = c["num_hidden_layers"]
    types = c.get("layer_types")
    if types is None:
        types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
        types[-1] = "full_attention" if "full_attention" not in types else types[-1]
    attending = attending_layers(types, layers)
    if len(set(attending)) < 2:
        raise ValueError(f"layer_types={types!r}: an OLMo-Hybrid has both 'linear_attention' and 'full_attention' "
                         "layers (transformers refuses it otherwise)")
    return attending


def olmo_hybrid_rope_base(c: dict) -> float | None:
    """The RoPE base of an OLMo-Hybrid's attention, or None where it has none (the released models: ``rope_theta``
    null, in ``rope_parameters`` or at the top level); 10,000 where the config says neither, as transformers fills it.
    Only plain RoPE: its rotary table skips transformers' dynamic update."""
    params = c.get("rope_parameters") or {}
    theta = params["rope_theta"] if "rope_theta" in params else c.get("rope_theta", 10000.0)
    if params.get("rope_type", "default") != "default":
        refuse_fields([f"rope_parameters={params!r} (an OLMo-Hybrid's RoPE is plain: transformers' class skips the "
                       "update other RoPE types need)"])
    return None if theta is None else number(theta)


def olmo_hybrid_in_proj(ours: str, theirs: str, c: dict) -> tuple:
    """OLMo-Hybrid's Gated DeltaNet input maps ``q_proj``, ``k_proj``, ``v_proj``, ``g_proj`` (the output gate),
    ``b_proj`` (β) and ``a_proj`` (the decay): the zoo's one ``in_proj`` ``[q | k | v | z | β | a]`` is the six
    stacked."""
    Hk, H = c["linear_num_key_heads"], c["linear_num_value_heads"]
    K, V = c["linear_key_head_dim"], c["linear_value_head_dim"]
    sizes = [Hk * K, Hk * K, H * V, H * V, H, H]
    names = [f"{theirs}.{part}_proj.weight" for part in ("q", "k", "v", "g", "b", "a")]
    return ours, names, lambda *parts: torch.cat(parts), lambda w: list(w.split(sizes))


class OlmoHybrid:
    """OLMo-Hybrid (``OlmoHybridForCausalLM``, AI2's): Gated DeltaNet (``G``: key heads shared by value heads, the
    ``linear_*`` shapes, β in ``(0, 2)`` where ``linear_allow_neg_eigval``, its output norm's eps 1e-5) behind norms
    before the mixers, as Llama's, in most layers; in those ``layer_types`` names ``full_attention`` (every 4th by
    default) OLMo 2's attention layer (``A``: a QK-norm over every head, RoPE or none — the released models have none —
    its norms after the mixers: ``post_norm=["AM"]``); a SwiGLU MLP in every layer. Both ways."""

    name, model_type = "OlmoHybridForCausalLM", "olmo_hybrid"
    honoured = (Llama.honoured | {"layer_types", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                  "linear_value_head_dim", "linear_conv_kernel_dim", "linear_allow_neg_eigval"}
                | OLMO_HYBRID_INIT)
    ends = Llama.ends
    post_norm = wide_qk_norm = True
    in_proj = staticmethod(olmo_hybrid_in_proj)

    @staticmethod
    def from_files(c: dict, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The files' tensors under the names of transformers' modules, as its conversion mapping loads them: the hub's
        files (and transformers' ``save_pretrained``) name the norms ``attention_layer_norm`` and
        ``feedforward_layer_norm`` and hold the convolution as three parts, ``q_conv1d``, ``k_conv1d`` and ``v_conv1d``,
        concatenated on loading (whatever their sizes: transformers 5.25 writes them in three near-equal chunks).
        Files under the modules' names, as the export writes them, pass as they are."""
        out = {}
        for name, tensor in hf.items():
            name = name.replace(".attention_layer_norm.", ".input_layernorm.")
            out[name.replace(".feedforward_layer_norm.", ".post_attention_layernorm.")] = tensor
        for i in range(c["num_hidden_layers"]):
            parts = [f"model.layers.{i}.linear_attn.{part}_conv1d.weight" for part in "qkv"]
            if any(part in out for part in parts):
                missing = [part for part in parts if part not in out]
                if missing:
                    raise ValueError(f"the folder's weights lack {missing[0]!r}, which a {OlmoHybrid.name} whose files "
                                     "split the convolution in three has")
                out[f"model.layers.{i}.linear_attn.conv1d.weight"] = torch.cat([out.pop(part) for part in parts])
        return out

    @staticmethod
    def recipe(c: dict) -> dict:
        c = olmo_hybrid_settings(c)
        attending, base = olmo_hybrid_attending(c), olmo_hybrid_rope_base(c)
        if c["hidden_act"] != "silu":  # (transformers' Gated DeltaNet runs its conv through hidden_act)
            refuse_fields([f"hidden_act={c['hidden_act']!r} (Gated DeltaNet's convolution runs through it too, and "
                           "the zoo's through SiLU)"])
        heads, kv_heads, head_dim = attention_shape(c, decoupled=True)
        attention = {"n_heads": heads, "n_kv_heads": kv_heads, "qk_norm": True, "qk_norm_over": "all_heads",
                     "norm_eps": c["rms_norm_eps"], **({"rope": False} if base is None else {}),
                     **({"head_dim": head_dim} if head_dim * heads != c["hidden_size"] else {})}
        rule = {"n_heads": c["linear_num_value_heads"], "n_k_heads": c["linear_num_key_heads"],
                "head_dim": c["linear_key_head_dim"], "v_head_dim": c["linear_value_head_dim"],
                "conv_kernel": c["linear_conv_kernel_dim"], "norm_eps": OLMO_HYBRID_GATE_EPS,
                "allow_neg_eigval": bool(c["linear_allow_neg_eigval"])}
        mixers = {"A": spec("components.QCAttention", **attention), "G": spec("components.GatedDeltaNet", **rule),
                  "M": spec("components.MLP", d_ff=c["intermediate_size"], activation="swiglu", act="silu")}
        return {**common_recipe(c, 10000.0 if base is None else base, 1.0, False), "norm_eps": c["rms_norm_eps"],
                "pattern": compact_pattern(["AM" if a else "GM" for a in attending]), "mixers": mixers,
                "post_norm": ["AM"]}

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        c = olmo_hybrid_settings(c)
        if olmo_hybrid_attending(c)[i]:
            return olmo_layer_pairs(i)
        hf, ours = f"model.layers.{i}", f"blocks.{i}"
        return [(f"{ours}.sequence_norm.weight", [f"{hf}.input_layernorm.weight"]),
                (f"{ours}.state_norm.weight", [f"{hf}.post_attention_layernorm.weight"]),
                *gated_deltanet_pairs(f"{ours}.sequence_mixer", f"{hf}.linear_attn", norm="o_norm", out="o_proj"),
                *swiglu_pairs(f"{ours}.state_mixer", f"{hf}.mlp")]

    @classmethod
    def reshaped(cls, c: dict, i: int) -> list[tuple]:
        c = olmo_hybrid_settings(c)
        return [] if olmo_hybrid_attending(c)[i] else [
            cls.in_proj(f"blocks.{i}.sequence_mixer.in_proj.weight", f"model.layers.{i}.linear_attn", c)]

    @staticmethod
    def mismatch(model) -> str | None:
        why = ("an OlmoHybridForCausalLM is GatedDeltaNet, then a SwiGLU MLP, behind norms before them, or QCAttention, "
               "then a SwiGLU MLP, behind norms after them (post_norm), in every block, with both kinds")
        blocks = list(model.blocks)
        kinds = {(type(getattr(b, "sequence_mixer", b)).__name__, type(getattr(b, "state_mixer", None)).__name__)
                 for b in blocks}
        if kinds != {("QCAttention", "MLP"), ("GatedDeltaNet", "MLP")}:
            return f"its blocks hold {sorted('/'.join(k) for k in kinds)}; {why}"
        if any(b.post_norm != isinstance(b.sequence_mixer, QCAttention) for b in blocks):
            return f"its attention blocks do not all norm after their mixers, or its other blocks do; {why}"
        if any(b.sequence_residual is not None for b in blocks):
            return "its blocks scale their residuals, which OLMo-Hybrid does not"
        attentions = [b.sequence_mixer for b in blocks if isinstance(b.sequence_mixer, QCAttention)]
        rules = [b.sequence_mixer for b in blocks if isinstance(b.sequence_mixer, GatedDeltaNet)]
        mlps = [b.state_mixer for b in blocks]
        if len({(a.n_heads, a.n_kv_heads, a.head_dim, a.positions.rope) for a in attentions}) > 1:
            return "its attentions differ in heads or RoPE; OLMo-Hybrid has one attention configuration"
        for a in attentions:
            if reason := olmo_attention_mismatch(a, model, "OLMo-Hybrid"):
                return reason
        if attentions[0].positions.rope and model.extrapolate:
            return "it stretches RoPE past its trained length (extrapolate); OLMo-Hybrid's RoPE is plain"
        if len({(g.n_heads, g.n_k_heads, g.head_dim, g.v_head_dim, g.conv.kernel_size[0], g.allow_neg_eigval)
                for g in rules}) > 1:
            return "its Gated DeltaNets differ in shape or β's range; OLMo-Hybrid has one linear_* configuration"
        if any(not g.gate or g.norm.eps != OLMO_HYBRID_GATE_EPS for g in rules):
            return f"its Gated DeltaNet is not OLMo-Hybrid's (the output gate on, its norm's eps {OLMO_HYBRID_GATE_EPS})"
        if len({(m.d_ff, m.activation, m.act_name) for m in mlps}) > 1 or mlps[0].activation != "swiglu" \
                or mlps[0].act_name != "silu":
            return "its MLPs are not SwiGLU with SiLU of one width; OLMo-Hybrid's are (its one hidden_act is also its " \
                   "Gated DeltaNet's convolution's)"
        return None

    @staticmethod
    def config(model) -> dict:
        blocks = list(model.blocks)
        a = next(b.sequence_mixer for b in blocks if isinstance(b.sequence_mixer, QCAttention))
        g = next(b.sequence_mixer for b in blocks if isinstance(b.sequence_mixer, GatedDeltaNet))
        config = common_config(model, OlmoHybrid.name, OlmoHybrid.model_type)
        base = config.pop("rope_theta")
        config.pop("rope_scaling", None)  # (:meth:`mismatch` refuses a stretched RoPE)
        config.update(
            rope_parameters={"rope_type": "default", "rope_theta": base if a.positions.rope else None},
            intermediate_size=blocks[0].state_mixer.d_ff, hidden_act="silu", rms_norm_eps=model.norm.eps,
            num_attention_heads=a.n_heads, num_key_value_heads=a.n_kv_heads, head_dim=a.head_dim, attention_bias=False,
            layer_types=["full_attention" if isinstance(b.sequence_mixer, QCAttention) else "linear_attention"
                         for b in blocks],
            linear_num_value_heads=g.n_heads, linear_num_key_heads=g.n_k_heads, linear_key_head_dim=g.head_dim,
            linear_value_head_dim=g.v_head_dim, linear_conv_kernel_dim=g.conv.kernel_size[0],
            linear_allow_neg_eigval=g.allow_neg_eigval)
        return config


ADAPTERS = {adapter.name: adapter for adapter in (Llama, Qwen2, Qwen3, Mistral, Mixtral, Qwen2Moe, Qwen3Moe, Dots1, Glm4Moe,
                                                  Mamba2, Doge, GraniteHybrid, Bamba, NemotronH, Lfm2, FalconH1,
                                                  Qwen3_5, Qwen3Next, Qwen3_5Multimodal, Olmo2, Olmo3, OlmoHybrid)}
EXPORTABLE = {name: adapter for name, adapter in ADAPTERS.items() if hasattr(adapter, "config")}
"""The classes a zoo model is written as, in the order tried (a Mistral without a window is written as Llama, a
Qwen3-Next without experts as Qwen3.5; ``export(..., as_class=...)`` picks another that fits)."""


def layer_count(config: dict) -> int:
    """How many layers a config describes: ``num_hidden_layers``, or the length of Nemotron-H's list of them."""
    adapter = ADAPTERS[config["architectures"][0]]
    return adapter.layer_count(config) if hasattr(adapter, "layer_count") else config["num_hidden_layers"]


def to_zoo(config: dict, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face weight names and layouts → the zoo's state dict (every HF tensor must find its place, and every
    one the config implies must be there: either is refused by name)."""
    adapter = ADAPTERS[config["architectures"][0]]
    from_files = getattr(adapter, "from_files", None)  # (files that name the weights otherwise than the class's modules)
    hf = dict(hf) if from_files is None else from_files(config, hf)

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise ValueError(f"the folder's weights lack {name!r}, which a {adapter.name} of its config has")
        return hf.pop(name)

    out = {}
    for i in range(layer_count(config)):
        for ours, theirs in adapter.layer_pairs(config, i):
            out[ours] = torch.cat([take(name) for name in theirs]) if len(theirs) > 1 else take(theirs[0])
        for ours, theirs, forward, _ in adapter.reshaped(config, i):  # (theirs: one name, or a list of them)
            out[ours] = forward(*map(take, theirs)) if isinstance(theirs, list) else forward(take(theirs))
    for ours, (theirs,) in adapter.ends:
        out[ours] = take(theirs)
    head = hf.pop("lm_head.weight", None)
    tied = config.get("tie_word_embeddings") and getattr(adapter, "ties_embeddings", True)
    out["lm_head.weight"] = out["embedding.weight"] if tied or head is None else head
    fold = getattr(adapter, "fold", None)  # multipliers its class applies at run time, folded into the weights
    if fold is not None:
        out = fold(config, out)
    unused = getattr(adapter, "unused", lambda config, name: False)  # weights its class never runs (GLM-4.5's MTP)
    leftover = [k for k in hf if not k.endswith("rotary_emb.inv_freq") and not unused(config, k)]
    if leftover:
        raise ValueError(f"weights the zoo has no place for: {leftover[:5]}{' …' if len(leftover) > 5 else ''}")
    return out


def to_hf(config: dict, zoo: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The zoo's state dict → Hugging Face names and layouts (the inverse of :func:`to_zoo`)."""
    adapter = ADAPTERS[config["architectures"][0]]
    zoo = dict(zoo)
    unfold = getattr(adapter, "unfold", None)  # (the inverse of a fold that is not a multiplier an export writes as 1)
    if unfold is not None:
        zoo = unfold(config, zoo)
    out = {}
    for i in range(layer_count(config)):
        for ours, theirs in adapter.layer_pairs(config, i):
            tensor = zoo.pop(ours)
            # several HF tensors are equal parts of one zoo tensor: gate | up, k | v
            out.update(zip(theirs, tensor.chunk(len(theirs)) if len(theirs) > 1 else [tensor]))
        for ours, theirs, _, backward in adapter.reshaped(config, i):
            tensors = backward(zoo.pop(ours))
            out.update(zip(theirs, tensors, strict=True) if isinstance(theirs, list) else [(theirs, tensors)])
    for ours, (theirs,) in adapter.ends:
        out[theirs] = zoo.pop(ours)
    head = zoo.pop("lm_head.weight")
    if not config.get("tie_word_embeddings"):
        embedding = out[dict(adapter.ends)["embedding.weight"][0]]
        # (a tied model written as a class that never ties: the head as a tensor of its own, which safetensors needs)
        out["lm_head.weight"] = head.clone() if head.data_ptr() == embedding.data_ptr() else head
    if zoo:
        raise ValueError(f"zoo weights Hugging Face's {adapter.name} has no place for: {sorted(zoo)[:5]}")
    return out
