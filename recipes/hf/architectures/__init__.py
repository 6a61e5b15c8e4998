"""One adapter per Hugging Face architecture the zoo can be: Llama, Qwen2, Qwen3, Mistral, Mixtral, Qwen3-MoE,
Qwen2-MoE, dots.llm1 and GLM-4.5 (import), Mamba-2, Doge (dense and CDMoE), the hybrids of Mamba-2 and attention
layers, Granite 4.0, Bamba and Nemotron-H, Falcon-H1's of the two side by side, LFM2's of gated short
convolutions and attention, Qwen3-Next's and Qwen3.5's of Gated DeltaNet and gated attention, and AI2's OLMo 2, OLMo 3
and OLMo-Hybrid (norms after the mixers, a QK-norm over every head; OLMo-Hybrid's beside Gated DeltaNet).

Each adapter knows, for its ``transformers`` class: the zoo model a ``config.json`` describes (``recipe``),
the weights both ways (``to_zoo``, ``to_hf``), the ``config.json`` a zoo model is (``config``, for export),
and why a zoo model is not one (``mismatch``). Every config field is accounted for (:func:`audit`): one that
changes the computation is honoured, or the import is refused by name — never dropped silently.

One module per family (``decoders``, ``moe``, ``mamba``, ``falcon_h1``, ``nemotron_h``, ``lfm2``, ``doge``,
``qwen3_next``, ``olmo``) over what they share (``common``); here the registry and the weight maps both ways.
"""

import torch

from recipes.hf.architectures.common import MUST_BE, audit, common_recipe, number, rope_settings
from recipes.hf.architectures.decoders import Llama, Mistral, Qwen2, Qwen3
from recipes.hf.architectures.doge import EVERY_KEY, Doge
from recipes.hf.architectures.falcon_h1 import FalconH1
from recipes.hf.architectures.lfm2 import Lfm2
from recipes.hf.architectures.mamba import Bamba, GraniteHybrid, Mamba2
from recipes.hf.architectures.moe import Dots1, Glm4Moe, Mixtral, Qwen2Moe, Qwen3Moe
from recipes.hf.architectures.nemotron_h import NemotronH, nemotron_tokens
from recipes.hf.architectures.olmo import Olmo2, Olmo3, OlmoHybrid
from recipes.hf.architectures.qwen3_next import Qwen3_5, Qwen3_5Multimodal, Qwen3Next

__all__ = ["ADAPTERS", "EVERY_KEY", "EXPORTABLE", "MUST_BE", "Bamba", "Doge", "Dots1", "FalconH1", "Glm4Moe",
           "GraniteHybrid", "Lfm2", "Llama", "Mamba2", "Mistral", "Mixtral", "NemotronH", "Olmo2", "Olmo3", "OlmoHybrid",
           "Qwen2", "Qwen2Moe", "Qwen3", "Qwen3Moe", "Qwen3Next", "Qwen3_5", "Qwen3_5Multimodal", "audit",
           "common_recipe", "layer_count", "nemotron_tokens", "number", "rope_settings", "to_hf", "to_zoo"]


ADAPTERS = {adapter.name: adapter for adapter in (Llama, Qwen2, Qwen3, Mistral, Mixtral, Qwen2Moe, Qwen3Moe, Dots1, Glm4Moe,
                                                  Mamba2, Doge, GraniteHybrid, Bamba, NemotronH, Lfm2, FalconH1,
                                                  Qwen3_5, Qwen3Next, Qwen3_5Multimodal, Olmo2, Olmo3, OlmoHybrid)}


EXPORTABLE = {name: adapter for name, adapter in ADAPTERS.items() if hasattr(adapter, "config")}


"""The classes a zoo model is written as, in the order tried (a Mistral without a window is written as Llama, a
Qwen3-Next without experts as Qwen3.5; ``export(..., as_class=...)`` picks another that fits)."""


def layer_count(config: dict) -> int:
    """How many layers a config describes: ``num_hidden_layers``, or the length of Nemotron-H's list of them."""
    adapter = ADAPTERS[config["architectures"][0]]
    return adapter.layer_count(config) if hasattr(adapter, "layer_count") else config["num_hidden_layers"]


def to_zoo(config: dict, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face weight names and layouts → the zoo's state dict (every HF tensor must find its place, and every
    one the config implies must be there: either is refused by name)."""
    adapter = ADAPTERS[config["architectures"][0]]
    from_files = getattr(adapter, "from_files", None)  # (files that name the weights otherwise than the class's modules)
    hf = dict(hf) if from_files is None else from_files(config, hf)

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise ValueError(f"the folder's weights lack {name!r}, which a {adapter.name} of its config has")
        return hf.pop(name)

    out = {}
    for i in range(layer_count(config)):
        for ours, theirs in adapter.layer_pairs(config, i):
            out[ours] = torch.cat([take(name) for name in theirs]) if len(theirs) > 1 else take(theirs[0])
        for ours, theirs, forward, _ in adapter.reshaped(config, i):  # (theirs: one name, or a list of them)
            out[ours] = forward(*map(take, theirs)) if isinstance(theirs, list) else forward(take(theirs))
    for ours, (theirs,) in adapter.ends:
        out[ours] = take(theirs)
    head = hf.pop("lm_head.weight", None)
    tied = config.get("tie_word_embeddings") and getattr(adapter, "ties_embeddings", True)
    out["lm_head.weight"] = out["embedding.weight"] if tied or head is None else head
    fold = getattr(adapter, "fold", None)  # multipliers its class applies at run time, folded into the weights
    if fold is not None:
        out = fold(config, out)
    unused = getattr(adapter, "unused", lambda config, name: False)  # weights its class never runs (GLM-4.5's MTP)
    leftover = [k for k in hf if not k.endswith("rotary_emb.inv_freq") and not unused(config, k)]
    if leftover:
        raise ValueError(f"weights the zoo has no place for: {leftover[:5]}{' …' if len(leftover) > 5 else ''}")
    return out


def to_hf(config: dict, zoo: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The zoo's state dict → Hugging Face names and layouts (the inverse of :func:`to_zoo`)."""
    adapter = ADAPTERS[config["architectures"][0]]
    zoo = dict(zoo)
    unfold = getattr(adapter, "unfold", None)  # (the inverse of a fold that is not a multiplier an export writes as 1)
    if unfold is not None:
        zoo = unfold(config, zoo)
    out = {}
    for i in range(layer_count(config)):
        for ours, theirs in adapter.layer_pairs(config, i):
            tensor = zoo.pop(ours)
            # several HF tensors are equal parts of one zoo tensor: gate | up, k | v
            out.update(zip(theirs, tensor.chunk(len(theirs)) if len(theirs) > 1 else [tensor]))
        for ours, theirs, _, backward in adapter.reshaped(config, i):
            tensors = backward(zoo.pop(ours))
            out.update(zip(theirs, tensors, strict=True) if isinstance(theirs, list) else [(theirs, tensors)])
    for ours, (theirs,) in adapter.ends:
        out[theirs] = zoo.pop(ours)
    head = zoo.pop("lm_head.weight")
    if not config.get("tie_word_embeddings"):
        embedding = out[dict(adapter.ends)["embedding.weight"][0]]
        # (a tied model written as a class that never ties: the head as a tensor of its own, which safetensors needs)
        out["lm_head.weight"] = head.clone() if head.data_ptr() == embedding.data_ptr() else head
    if zoo:
        raise ValueError(f"zoo weights Hugging Face's {adapter.name} has no place for: {sorted(zoo)[:5]}")
    return out
