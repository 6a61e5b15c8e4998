"""Mamba-2, and the hybrids of Mamba-2 and attention layers that share its weights' layout: Granite 4.0 and Bamba."""

import math

from components.state.moe import MoE
from recipes.hf.architectures.common import (act_name, attention_pairs, common_config, common_recipe, mamba2_pairs,
                                             mamba_in_proj, number, only, partial_rope_parameters, refuse_fields,
                                             rope_settings, spec, swiglu_pairs, transposed)
from recipes.hf.architectures.decoders import Llama, attention_shape


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
