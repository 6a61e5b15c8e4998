"""NVIDIA's Nemotron-H: single-mixer layers (Mamba-2, attention, MLP, MoE routed as DeepSeek-V3's) in a pattern."""

import math

import torch

from components.state.mlp import ACTIVATIONS
from components.state.moe import MoE
from recipes.hf.architectures.common import (act_name, attention_pairs, common_config, common_recipe, mamba2_pairs,
                                             mamba_in_proj, number, refuse_fields, spec)
from recipes.hf.architectures.mamba import Mamba2, mamba2_ssd_problem, no_attention_reason


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
