"""Liquid AI's LFM2: gated short convolutions and attention."""

from components.sequence import QCAttention, ShortConv
from recipes.hf.architectures.common import (attention_pairs, common_config, common_recipe, compact_pattern,
                                             nothing_reshaped, refuse_fields, rope_settings, spec)
from recipes.hf.architectures.decoders import attention_shape
from recipes.hf.architectures.mamba import no_attention_reason
from recipes.hf.architectures.moe import LFM2_BOOKKEEPING, LFM2_DEFAULTS, LFM2_ECHOES, LFM2_FLAGS


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
