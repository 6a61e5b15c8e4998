"""Llama, Qwen2, Qwen3 and Mistral: the decoder of attention and SwiGLU blocks, with sliding windows per layer, and
what keeps a zoo model from being one (:func:`decoder_mismatch`)."""

from components.state.moe import MoE
from recipes.hf.architectures.common import (act_name, common_config, common_recipe, decoder_layer_pairs,
                                             nothing_reshaped, rope_settings, spec, swiglu_pairs)


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
