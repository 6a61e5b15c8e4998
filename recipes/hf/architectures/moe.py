"""The mixture-of-experts decoders: Mixtral, Qwen3-MoE, Qwen2-MoE (a gated shared expert), dots.llm1 and GLM-4.5
(DeepSeek-V3's sigmoid router; import only)."""

import torch

from components.state.moe import MoE
from recipes.hf.architectures.common import compact_pattern, decoder_layer_pairs, number, spec, swiglu_pairs
from recipes.hf.architectures.decoders import (Llama, Mistral, attention_windows, checked_window, decoder_config,
                                               decoder_mismatch, decoder_recipe, qwen3_window, windowed,
                                               windowed_layer_types, windowed_spec)


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
