"""AI2's OLMo 2, OLMo 3 and OLMo-Hybrid: norms after the mixers, a QK-norm over every head; OLMo-Hybrid's beside
Gated DeltaNet."""

import torch

from components.sequence import GatedDeltaNet, QCAttention
from recipes.hf.architectures.common import (attention_pairs, common_config, common_recipe, compact_pattern,
                                             nothing_reshaped, number, refuse_fields, spec, swiglu_pairs)
from recipes.hf.architectures.decoders import (Llama, attention_shape, attention_windows, checked_window,
                                               decoder_config, decoder_mismatch, decoder_recipe, windowed,
                                               windowed_layer_types)
from recipes.hf.architectures.qwen3_next import attending_layers, gated_deltanet_pairs


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
