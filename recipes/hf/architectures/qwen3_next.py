"""Qwen3-Next and Qwen3.5: Gated DeltaNet and gated attention (Qwen3.5's language model inside its multimodal
files too)."""

import torch

from components.sequence import GatedDeltaNet, QCAttention
from components.state.moe import MoE
from recipes.hf.architectures.common import (act_name, attention_pairs, audit, common_config, compact_pattern,
                                             partial_rope_parameters, refuse_fields, spec, swiglu_pairs)
from recipes.hf.architectures.decoders import Llama, decoder_recipe
from recipes.hf.architectures.moe import (expert_stacks, partial_rotary_factor, qwen3_moe_experts, qwen3_moe_layers,
                                          shared_gated_moe, shared_gated_moe_pairs)


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
