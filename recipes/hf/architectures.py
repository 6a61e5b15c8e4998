"""One adapter per Hugging Face architecture the zoo can be: Llama, Mamba-2, Doge (dense and CDMoE).

Each adapter knows, for its ``transformers`` class: the zoo model a ``config.json`` describes (``recipe``),
the weights both ways (``to_zoo``, ``to_hf``), the ``config.json`` a zoo model is (``config``, for export),
and why a zoo model is not one (``mismatch``). Every config field is accounted for (:func:`audit`): one that
changes the computation is honoured, or the import is refused by name — never dropped silently.
"""

import inspect
import math

import torch

# Fields that say nothing about the computation (bookkeeping, token ids, initialisation, cache use).
BOOKKEEPING = {
    "transformers_version", "architectures", "output_hidden_states", "return_dict", "dtype", "torch_dtype",
    "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id", "problem_type", "use_cache",
    "bos_token_id", "eos_token_id", "_name_or_path", "model_type", "output_attentions", "initializer_range",
    "tokenizer_class", "prefix", "task_specific_params", "finetuning_task", "torchscript", "use_return_dict",
    "time_step_min", "time_step_max", "time_step_floor", "rescale_prenorm_residual", "output_router_logits",
    "router_aux_loss_coef", "_attn_implementation_autoset", "num_labels", "tie_encoder_decoder", "pruned_heads",
    "cross_attention_hidden_size", "add_cross_attention", "decoder_start_token_id", "sep_token_id",
    "_attn_implementation", "time_step_rank", "residual_in_fp32",
}
# Fields the zoo has no equivalent for, with the only values it computes exactly.
MUST_BE = {"attention_bias": (False, None), "mlp_bias": (False, None), "attention_dropout": (0, 0.0, None),
           "hidden_dropout": (0, 0.0, None), "pretraining_tp": (1, None), "sliding_window": (None,),
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
    if problems:
        raise ValueError(f"{where}: fields the zoo would not honour: {'; '.join(problems)}. Importing would give a "
                         "model that computes something else, so it is refused")


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
        base, ntk, dynamic = rope_settings(c)
        heads, kv_heads, head_dim = attention_shape(c)
        mlp = spec("components.MLP", d_ff=c["intermediate_size"], activation="swiglu", act=c.get("hidden_act", "silu"))
        return {**common_recipe(c, base, ntk, dynamic), "pattern": f"AM×{c['num_hidden_layers']}",
                "norm_eps": c["rms_norm_eps"],
                "mixers": {"A": spec("components.QCAttention", n_heads=heads, n_kv_heads=kv_heads), "M": mlp}}

    @staticmethod
    def layer_pairs(c: dict, i: int) -> list[tuple[str, list[str]]]:
        """``(zoo name, HF names concatenated along dim 0)`` of layer ``i``."""
        hf, ours = f"model.layers.{i}", f"blocks.{i}"
        return [(f"{ours}.sequence_norm.weight", [f"{hf}.input_layernorm.weight"]),
                (f"{ours}.state_norm.weight", [f"{hf}.post_attention_layernorm.weight"]),
                (f"{ours}.sequence_mixer.q_proj.weight", [f"{hf}.self_attn.q_proj.weight"]),
                (f"{ours}.sequence_mixer.kv_proj.weight", [f"{hf}.self_attn.k_proj.weight", f"{hf}.self_attn.v_proj.weight"]),
                (f"{ours}.sequence_mixer.out_proj.weight", [f"{hf}.self_attn.o_proj.weight"]),
                (f"{ours}.state_mixer.in_proj.weight", [f"{hf}.mlp.gate_proj.weight", f"{hf}.mlp.up_proj.weight"]),
                (f"{ours}.state_mixer.out_proj.weight", [f"{hf}.mlp.down_proj.weight"])]

    ends = [("embedding.weight", ["model.embed_tokens.weight"]), ("norm.weight", ["model.norm.weight"])]

    @staticmethod
    def mismatch(model) -> str | None:
        why = "a LlamaForCausalLM is QCAttention + SwiGLU MLP in every block ('AM')"
        reason = only(model, "AM", why)
        if reason:
            return reason
        block = model.blocks[0]
        a, m = block.sequence_mixer, block.state_mixer
        if type(a).__name__ != "QCAttention" or type(m).__name__ != "MLP":
            return f"its 'A'/'M' letters are {type(a).__name__}/{type(m).__name__}; {why}"
        if not a.positions.rope or a.positions.q_norm is not None:
            return "its attention has no RoPE or has a QK-norm, which Llama has not"
        if m.activation != "swiglu":  # (its act is the config's hidden_act: SiLU, GELU or ReLU, as transformers reads them)
            return f"its MLP is {m.activation} with {m.act_name}; Llama's is SwiGLU"
        if block.sequence_residual is not None:
            return "its blocks scale their residuals, which Llama does not"
        return None

    @staticmethod
    def config(model) -> dict:
        block = model.blocks[0]
        a, m = block.sequence_mixer, block.state_mixer
        return {**common_config(model, Llama.name, Llama.model_type), "intermediate_size": m.d_ff,
                "num_attention_heads": a.n_heads, "num_key_value_heads": a.n_kv_heads, "head_dim": a.head_dim,
                "hidden_act": m.act_name, "rms_norm_eps": model.norm.eps, "attention_bias": False, "mlp_bias": False}


def attention_shape(c: dict) -> tuple[int, int, int]:
    heads, kv_heads = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    if head_dim * heads != c["hidden_size"]:
        raise ValueError(f"head_dim={head_dim} · heads={heads} != hidden_size={c['hidden_size']}: not supported")
    return heads, kv_heads, head_dim


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

    ends = Llama.ends

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
        hf, m = f"backbone.layers.{i}", f"blocks.{i}.sequence_mixer"
        return [(f"blocks.{i}.sequence_norm.weight", [f"{hf}.norm.weight"]),
                (f"{m}.conv.weight", [f"{hf}.mixer.conv1d.weight"]), (f"{m}.conv.bias", [f"{hf}.mixer.conv1d.bias"]),
                (f"{m}.dt_bias", [f"{hf}.mixer.dt_bias"]), (f"{m}.A_log", [f"{hf}.mixer.A_log"]),
                (f"{m}.D", [f"{hf}.mixer.D"]), (f"{m}.gate_norm.weight", [f"{hf}.mixer.norm.weight"]),
                (f"{m}.out_proj.weight", [f"{hf}.mixer.out_proj.weight"])]

    ends = [("embedding.weight", ["backbone.embeddings.weight"]), ("norm.weight", ["backbone.norm_f.weight"])]

    @staticmethod
    def in_proj_split(c: dict) -> list[int]:
        """HF's in_proj rows are ``[z | xBC | dt]``, the zoo's ``[xBC | dt | z]``: the three sizes."""
        d_inner = int(c.get("expand", 2) * c["hidden_size"])
        return [d_inner, d_inner + 2 * c["n_groups"] * c["state_size"], c["num_heads"]]

    @staticmethod
    def mismatch(model) -> str | None:
        why = "a Mamba2ForCausalLM is an SSD with Mamba-2's conv, D and gate in every block, and no state mixer ('S-')"
        reason = only(model, "S-", why)
        if reason:
            return reason
        s = model.blocks[0].sequence_mixer
        if type(s).__name__ != "SSD":
            return f"its 'S' letter is {type(s).__name__}; {why}"
        if s.conv is None or s.rope or s.gate_norm is None or s.D is None:
            return (f"its SSD has conv={s.conv is not None}, rope={s.rope}, gate={s.gate_norm is not None}, "
                    f"D={s.D is not None}; {why}")
        if model.blocks[0].sequence_residual is not None:
            return "its blocks scale their residuals, which Mamba-2 does not"
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


ADAPTERS = {adapter.name: adapter for adapter in (Llama, Mamba2, Doge)}


def to_zoo(config: dict, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face weight names and layouts → the zoo's state dict (every HF tensor must find its place, and every
    one the config implies must be there: either is refused by name)."""
    adapter = ADAPTERS[config["architectures"][0]]
    hf = dict(hf)

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise ValueError(f"the folder's weights lack {name!r}, which a {adapter.name} of its config has")
        return hf.pop(name)

    out = {}
    for i in range(config["num_hidden_layers"]):
        for ours, theirs in adapter.layer_pairs(config, i):
            out[ours] = torch.cat([take(name) for name in theirs]) if len(theirs) > 1 else take(theirs[0])
        if adapter is Mamba2:
            z, xbc, dt = take(f"backbone.layers.{i}.mixer.in_proj.weight").split(Mamba2.in_proj_split(config))
            out[f"blocks.{i}.sequence_mixer.in_proj.weight"] = torch.cat([xbc, dt, z])
    for ours, (theirs,) in adapter.ends:
        out[ours] = take(theirs)
    head = hf.pop("lm_head.weight", None)
    out["lm_head.weight"] = out["embedding.weight"] if config.get("tie_word_embeddings") or head is None else head
    leftover = [k for k in hf if not k.endswith("rotary_emb.inv_freq")]
    if leftover:
        raise ValueError(f"weights the zoo has no place for: {leftover[:5]}{' …' if len(leftover) > 5 else ''}")
    return out


def to_hf(config: dict, zoo: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The zoo's state dict → Hugging Face names and layouts (the inverse of :func:`to_zoo`)."""
    adapter = ADAPTERS[config["architectures"][0]]
    zoo = dict(zoo)
    out = {}
    for i in range(config["num_hidden_layers"]):
        for ours, theirs in adapter.layer_pairs(config, i):
            tensor = zoo.pop(ours)
            # several HF tensors are equal parts of one zoo tensor: gate | up, k | v
            out.update(zip(theirs, tensor.chunk(len(theirs)) if len(theirs) > 1 else [tensor]))
        if adapter is Mamba2:
            z_size, xbc_size, dt_size = Mamba2.in_proj_split(config)
            xbc, dt, z = zoo.pop(f"blocks.{i}.sequence_mixer.in_proj.weight").split([xbc_size, dt_size, z_size])
            out[f"backbone.layers.{i}.mixer.in_proj.weight"] = torch.cat([z, xbc, dt])
    for ours, (theirs,) in adapter.ends:
        out[theirs] = zoo.pop(ours)
    head = zoo.pop("lm_head.weight")
    if not config.get("tie_word_embeddings"):
        out["lm_head.weight"] = head
    if zoo:
        raise ValueError(f"zoo weights Hugging Face's {adapter.name} has no place for: {sorted(zoo)[:5]}")
    return out
