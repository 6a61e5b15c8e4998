"""Falcon-H1: attention and Mamba-2 side by side in every layer, with its µP multipliers folded into the weights."""

import torch

from components.sequence import ParallelMixers
from recipes.hf.architectures.common import (attention_pairs, common_config, common_recipe, mamba2_pairs, mamba_in_proj,
                                             number, refuse_fields, rope_settings, spec, swiglu_pairs)
from recipes.hf.architectures.decoders import attention_shape
from recipes.hf.architectures.mamba import Bamba, hybrid_mamba_problems, mamba2_ssd_problem


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
        for i in range(c["num_hidden_layers"]):
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
