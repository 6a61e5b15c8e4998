"""Doge (SmallDoges): dynamic-mask attention and, dense or CDMoE, its state mixer."""

import math

from recipes.hf.architectures.common import (common_config, common_recipe, effective, nothing_reshaped, rope_settings,
                                             spec)
from recipes.hf.architectures.decoders import Llama, attention_shape


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
