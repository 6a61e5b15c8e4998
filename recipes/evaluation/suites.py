"""Suites that need no download (``python -m recipes eval --suite length|passkey|mqar|sink``;
docs/evaluation.md). Each returns a result dict that :func:`write_result` turns into a table and a PNG
(``eval --out`` writes it, with the run's record, as JSON).

- ``length``: the loss at each position of windows of 1×, 2×, 4×, 8×, 16× the training length, drawn
  from the recipe's validation split, bucketed by position in training-length pieces — with plain RoPE
  past the training length and with the NTK stretch of the base (:class:`components.RotaryEmbedding`).
- ``passkey``: a five-digit key hidden at a depth of filler text; the model must prefer the true key to
  three others after "What is the pass key? The pass key is" (chance 0.25), over length × depth.
- ``mqar``: recall accuracy of an MQAR checkpoint on sequences 1×–8× its training length, the same
  number of pairs spread over more filler.
- ``sink``: the attention sink (Qiu et al.'s measure) — per attention layer, the mean weight the heads' queries give
  the first token of windows of the validation split, against what a head spreading its weight evenly would give it.
"""

import contextlib
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from components.generation import left_padded
from zoo_kernels.linear_cross_entropy import IGNORE_INDEX
from recipes.figures import png_figure

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
QUESTION = " What is the pass key? The pass key is"




def progress(suite: str, total: int) -> tqdm:
    """A bar on stderr over a suite's ``total`` forward passes, gone when done; none where stderr is no terminal
    (a pipe, a log, a test), which gets the table alone."""
    return tqdm(total=total, desc=f"{suite} suite", unit="pass", leave=False, disable=None)


# ---- scoring shared with the harness adapter ------------------------------------------------------

@torch.no_grad()
def score_shared(model, contexts: list[list[int]], continuations: list[list[list[int]]]) -> list[list[tuple[float, bool]]]:
    """For each context and each of its continuations: ``(sum of log p(continuation | context), whether every
    token is the argmax)``. One forward over the contexts (left-padded, positions from each one's first real
    token) into a decoding cache, whose rows are copied to every continuation of their context
    (:meth:`InferenceCache.select`); one forward over all continuations (right-padded after each, which a
    causal model never sees)."""
    device = model.embedding.weight.device
    width = max(len(c) for c in contexts)
    longest = max(len(k) for choices in continuations for k in choices)
    ids, padding = left_padded(contexts, device)  # [b, width], [b, width]
    positions = (~padding).long().cumsum(dim=1).sub(1).clamp_min(0)  # [b, width]
    cache = model.new_cache(len(contexts), width + longest)
    last = model(ids, position_ids=positions, padding_mask=padding if bool(padding.any()) else None,
                 cache=cache)[:, -1]  # [b, V]: each predicts its continuations' first token
    owners = [row for row, choices in enumerate(continuations) for _ in choices]
    flat = [k for choices in continuations for k in choices]
    rest = None
    if longest > 1:
        cache = cache.select(torch.tensor(owners))
        tail = torch.zeros(len(flat), longest - 1, dtype=torch.long, device=device)
        for row, continuation in enumerate(flat):
            tail[row, :len(continuation) - 1] = torch.tensor(continuation[:-1])
        start = torch.tensor([len(contexts[o]) for o in owners], device=device)[:, None]
        rest = model(tail, position_ids=start + torch.arange(longest - 1, device=device), cache=cache)  # [n, longest-1, V]
    scores = []
    for row, (owner, continuation) in enumerate(zip(owners, flat)):
        logits = last[owner][None] if rest is None else torch.cat([last[owner][None], rest[row, :len(continuation) - 1]])
        scores.append(score(logits, continuation))
    out, at = [], 0
    for choices in continuations:
        out.append(scores[at:at + len(choices)])
        at += len(choices)
    return out


def score_continuations(model, context: list[int], continuations: list[list[int]]) -> list[tuple[float, bool]]:
    """:func:`score_shared` for one context."""
    return score_shared(model, [context], [continuations])[0]


def score(logits: torch.Tensor, continuation: list[int]) -> tuple[float, bool]:
    """``logits [n, V]`` predicting ``n`` tokens → (sum of their log-probabilities, all of them the argmax)."""
    target = torch.tensor(continuation, device=logits.device)
    logprobs = F.log_softmax(logits.float(), dim=-1)  # [n, V]
    return float(logprobs.gather(1, target[:, None]).sum()), bool((logprobs.argmax(-1) == target).all())


# ---- positions past the training length -----------------------------------------------------------

MODES = ("plain", "ntk")


@contextlib.contextmanager
def position_mode(model, mode: str, trained: int):
    """Let ``model`` run past its ``max_seq_len``: ``plain`` keeps RoPE's base (positions it never saw),
    ``ntk`` stretches the base once a sequence is longer than ``trained`` (the model's own NTK rule)."""
    if mode not in MODES:
        raise ValueError(f"position mode {mode!r} is not one of {MODES}")
    saved = model.extrapolate, model.rotary.max_position
    model.extrapolate = True
    model.rotary.max_position = trained if mode == "ntk" else 1 << 40
    try:
        yield model
    finally:
        model.extrapolate, model.rotary.max_position = saved


def check_length(model, length: int, extrapolate: bool) -> None:
    if length > model.max_seq_len and not extrapolate:
        raise ValueError(f"length {length} exceeds the model's max_seq_len={model.max_seq_len}; pass --extrapolate "
                         "to evaluate past it (plain RoPE and the NTK stretch), or smaller --multiples")


def check_settings(suite: str, multiples, whole: bool, **counts) -> tuple:
    """``multiples`` as numbers > 0 (whole numbers where ``whole``: the length and MQAR suites read whole training
    lengths), and each of ``counts`` an integer >= 1, or a ``ValueError`` naming the setting. Without it a 0 gave a
    NaN row (logged to TensorBoard), a 1.5 was read as 1 and ``trials=0`` divided by zero."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{suite} suite: {name}={value!r} must be an integer >= 1")
    if not multiples:
        raise ValueError(f"{suite} suite: no multiples of the training length given")
    for m in multiples:
        if not (isinstance(m, (int, float)) and math.isfinite(m) and m > 0):
            raise ValueError(f"{suite} suite: multiple {m!r} of the training length must be a number > 0")
        if whole and m != int(m):
            raise ValueError(f"{suite} suite: multiple {m!r} of the training length must be a whole number (the "
                             "losses are read in buckets of one training length)" if suite == "length" else
                             f"{suite} suite: multiple {m!r} of the training length must be a whole number")
    return tuple(int(m) for m in multiples) if whole else tuple(multiples)


# ---- the suites -----------------------------------------------------------------------------------

LENGTH_MULTIPLES, PASSKEY_MULTIPLES, MQAR_MULTIPLES, SINK_MULTIPLES = (1, 2, 4, 8, 16), (0.5, 1, 2, 4), (1, 2, 4, 8), (1,)
# (the defaults)


@torch.no_grad()
def length_suite(model, tokens: torch.Tensor, trained: int, multiples=LENGTH_MULTIPLES, windows: int = 8,
                 extrapolate: bool = True, source: str = "the validation split") -> dict:
    """Per mode and evaluation length ``m · trained``: the mean next-token loss of ``windows`` windows of the
    token stream ``tokens [n]`` (the validation split, or ``source``'s text; evenly spaced, the same windows read to
    each length), overall and per bucket of ``trained`` positions."""
    multiples = check_settings("length", multiples, whole=True, windows=windows)
    model.eval()
    device = model.embedding.weight.device
    longest = max(multiples) * trained
    if len(tokens) < longest + 1:
        raise ValueError(f"{source} has {len(tokens)} tokens; length {longest} needs {longest + 1}")
    # the same text at every length: each length reads the first tokens of the same evenly spaced windows, so
    # a change with the length is the context's doing, not the text's
    starts = np.linspace(0, len(tokens) - longest - 1, num=windows).astype(int)
    # up to the training length the two modes are the same model; without extrapolate, the model as built
    # (max_seq_len at least this length, so its RoPE is plain)
    cells = [(multiple, mode) for multiple in multiples
             for mode in (MODES if extrapolate and multiple * trained > trained else MODES[:1])]
    rows = []
    with progress("length", len(cells) * len(starts)) as bar:
        for multiple, mode in cells:
            length = multiple * trained
            check_length(model, length, extrapolate)
            batch = torch.stack([tokens[s:s + length + 1] for s in starts]).to(device)  # [w, length + 1]
            losses = []  # one window at a time bounds the memory
            with position_mode(model, mode, trained) if extrapolate else contextlib.nullcontext():
                for row in batch:
                    losses.append(F.cross_entropy(model(row[None, :-1])[0].float(), row[1:], reduction="none"))
                    bar.update()
            per_position = torch.stack(losses).mean(0)  # [w, length] -> [length]
            buckets = per_position.view(multiple, trained).mean(1).tolist()
            rows.append({"mode": mode, "length": length, "multiple": multiple, "loss": float(per_position.mean()),
                         "buckets": buckets, "windows": len(starts)})
    return {"suite": "length", "trained": trained, "bucket": trained, "rows": rows}


MEAN_OVER_LAYERS = "mean over layers"


def uniform_first_share(length: int) -> float:
    """The first token's mean share over queries 1…length−1 for heads that weigh their keys evenly: ``1 / (i + 1)``."""
    return sum(1 / (i + 1) for i in range(1, length)) / (length - 1)


def normalised_entropy(weights: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """``weights [B, H, L, L]`` (causal rows, each query's keys within ``window`` of it where given) → ``[H]``: each
    head's entropy of its queries 1…L−1, each over the log of the keys it sees (``log(min(i + 1, window))``; a window of
    one key reads 0), averaged over the queries and the batch — 1 for an even spread, 0 for a query that reads one key
    (entropy collapse)."""
    rows = weights[:, :, 1:].float()  # [B, H, L-1, L]: the first query sees one key only
    entropy = -(rows * rows.clamp_min(1e-30).log()).sum(-1)  # [B, H, L-1]
    keys = torch.arange(2, weights.shape[-1] + 1, device=weights.device, dtype=torch.float32)  # [L-1]
    if window is not None:
        keys = keys.clamp(max=max(window, 2))
    return (entropy / keys.log()).mean((0, 2))


@torch.no_grad()
def sink_suite(model, tokens: torch.Tensor, trained: int, multiples=SINK_MULTIPLES, windows: int = 8,
               extrapolate: bool = False, source: str = "the validation split") -> dict:
    """The attention sink: per attention layer (each ``QCAttention``, a block's by its layer number) and length
    ``m · trained``, the weight its heads' queries give the first token of the window, averaged over heads, over
    queries 1…L−1 (the first has only itself to read) and over ``windows`` evenly spaced windows of ``tokens [n]``;
    and its mean over the layers; ``busiest_head``, the largest one head gives it (a sink may sit in a few heads).
    ``uniform`` is what heads that spread their weight evenly over the keys would give it. Qiu et al. report about 0.47
    on average over a baseline's layers and 0.05 with gated attention. Each row also holds ``entropy``, the heads'
    attention entropy over the log of the keys each query sees (:func:`normalised_entropy`: 1 an even spread, 0 each
    query on one key — the entropy collapse a QK-norm prevents); ``--suite entropy`` reports that instead."""
    from components.sequence import QCAttention

    multiples = check_settings("sink", multiples, whole=False, windows=windows)
    model.eval()
    layers = {name: module for name, module in model.named_modules() if isinstance(module, QCAttention)}
    if not layers:
        raise ValueError("--suite sink measures attention layers (QCAttention); this model has none")
    label = {name: (f"layer {name.split('.')[1]}" if name.startswith("blocks.") and name.endswith(".sequence_mixer")
                    and name.count(".") == 2 else name) for name in layers}
    device = model.embedding.weight.device
    lengths = [max(2, int(m * trained)) for m in multiples]
    if len(tokens) < max(lengths):
        raise ValueError(f"{source} has {len(tokens)} tokens; length {max(lengths)} needs {max(lengths)}")
    shares: dict[str, list[torch.Tensor]] = {}
    entropies: dict[str, list[torch.Tensor]] = {}

    def measure(name):
        def hook(module, args, kwargs):
            x, context = args[0], (args[1] if len(args) > 1 else kwargs.get("context"))
            weights = module.attention_weights(x, context)  # [B, H, L, L]
            shares.setdefault(name, []).append(weights[:, :, 1:, 0].float().mean((0, 2)))  # [H]
            entropies.setdefault(name, []).append(normalised_entropy(weights, module.sliding_window))  # [H]
        return hook

    rows = []
    hooks = [module.register_forward_pre_hook(measure(name), with_kwargs=True) for name, module in layers.items()]
    try:
        with progress("sink", len(lengths) * windows) as bar:
            for length in lengths:
                check_length(model, length, extrapolate)
                starts = np.linspace(0, len(tokens) - length, num=windows).astype(int)
                shares.clear()
                entropies.clear()
                with position_mode(model, "plain", trained) if extrapolate else contextlib.nullcontext():
                    for start in starts:
                        model(tokens[start:start + length][None].to(device))
                        bar.update()
                heads = {label[name]: torch.stack(shares[name]).mean(0) for name in layers}  # {layer: [H]}
                spread = {label[name]: float(torch.stack(entropies[name]).mean()) for name in layers}  # {layer: mean}
                rows += [{"layer": layer, "length": length, "share": float(h.mean()), "busiest_head": float(h.max()),
                          "entropy": spread[layer]} for layer, h in heads.items()]
                rows.append({"layer": MEAN_OVER_LAYERS, "length": length,
                             "share": float(np.mean([float(h.mean()) for h in heads.values()])),
                             "busiest_head": max(float(h.max()) for h in heads.values()),
                             "entropy": float(np.mean(list(spread.values())))})
    finally:
        for hook in hooks:
            hook.remove()
    return {"suite": "sink", "trained": trained, "windows": windows, "rows": rows,
            "uniform": {str(length): uniform_first_share(length) for length in lengths}}


def entropy_suite(model, tokens: torch.Tensor, trained: int, **settings) -> dict:
    """Each attention layer's entropy (:func:`normalised_entropy`) at each length: :func:`sink_suite`'s measurement,
    reported and compared by its ``entropy``."""
    return {**sink_suite(model, tokens, trained, **settings), "suite": "entropy"}


def passkey_prompt(encode, key: int, length: int, depth: float) -> tuple[list[int], list[int]]:
    """The token ids of ``filler … [key sentence at depth] … filler + question`` of about ``length`` tokens,
    and of the answer ``" {key}"``."""
    needle = encode(f" The pass key is {key}. Remember it. {key} is the pass key.")
    question = encode(QUESTION)
    unit = encode(FILLER)
    room = max(length - len(needle) - len(question), 0)
    filler = (unit * (room // max(len(unit), 1) + 1))[:room]
    at = int(round(depth * len(filler)))
    return filler[:at] + needle + filler[at:] + question, encode(f" {key}")


@torch.no_grad()
def passkey_suite(model, encode, trained: int, multiples=PASSKEY_MULTIPLES, depths=(0.0, 0.25, 0.5, 0.75, 1.0),
                  trials: int = 8, choices: int = 4, seed: int = 0, extrapolate: bool = True) -> dict:
    """Accuracy of picking the true key among ``choices`` (chance ``1/choices``) over length × depth."""
    multiples = check_settings("passkey", multiples, whole=False, trials=trials, choices=choices)
    model.eval()
    rng = np.random.default_rng(seed)
    cells = []
    with progress("passkey", len(multiples) * len(depths) * trials) as bar:
        for multiple in multiples:
            length = int(multiple * trained)
            for depth in depths:
                correct = 0
                for _ in range(trials):
                    keys = rng.choice(np.arange(10_000, 100_000), size=choices, replace=False).tolist()
                    context, answer = passkey_prompt(encode, keys[0], length, depth)
                    check_length(model, len(context) + len(answer), extrapolate)
                    candidates = [answer] + [encode(f" {k}") for k in keys[1:]]
                    mode = position_mode(model, "ntk", trained) if extrapolate else contextlib.nullcontext()
                    with mode:
                        scores = [s for s, _ in score_continuations(model, context, candidates)]
                    correct += int(np.argmax(scores) == 0)
                    bar.update()
                cells.append({"length": length, "depth": depth, "accuracy": correct / trials, "trials": trials})
    return {"suite": "passkey", "trained": trained, "chance": 1 / choices, "cells": cells}


@torch.no_grad()
def mqar_suite(model, task: dict, multiples=MQAR_MULTIPLES, examples: int = 64, seed: int = 0,
               extrapolate: bool = True) -> dict:
    """Recall accuracy at ``multiple ×`` the task's ``seq_len`` with its ``num_pairs`` (more filler)."""
    from recipes.data.mqar import MQARSplit

    multiples = check_settings("mqar", multiples, whole=True, examples=examples)
    model.eval()
    device = model.embedding.weight.device
    rows = []
    with progress("mqar", len(multiples) * examples) as bar:
        for multiple in multiples:
            length = multiple * task["seq_len"]
            check_length(model, length, extrapolate)
            split = MQARSplit("test", examples, seed, **{**task, "seq_len": length})
            correct = total = 0
            for i in range(examples):
                item = split[i]
                with position_mode(model, "ntk", task["seq_len"]) if extrapolate else contextlib.nullcontext():
                    logits = model(item["input_ids"][None].to(device))[0]  # [length, V]
                keep = item["labels"] != IGNORE_INDEX
                correct += int((logits[keep.to(device)].argmax(-1).cpu() == item["labels"][keep]).sum())
                total += int(keep.sum())
                bar.update()
            rows.append({"length": length, "multiple": multiple, "accuracy": correct / max(total, 1), "queries": total})
    return {"suite": "mqar", "trained": task["seq_len"], "num_pairs": task["num_pairs"],
            "chance": 2 / task["vocab_size"], "rows": rows}


# ---- reporting ------------------------------------------------------------------------------------

def table(result: dict) -> str:
    if result["suite"] == "length":
        buckets = max(len(r["buckets"]) for r in result["rows"])
        head = ["mode", "length", "loss"] + [f"pos {i * result['bucket']}–{(i + 1) * result['bucket'] - 1}" for i in range(buckets)]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in result["rows"]:
            cells = [r["mode"], str(r["length"]), f"{r['loss']:.4f}"] + [f"{b:.4f}" for b in r["buckets"]]
            lines.append("| " + " | ".join(cells + [""] * (len(head) - len(cells))) + " |")
        return "\n".join(lines)
    if result["suite"] == "passkey":
        lengths, depths, grid = passkey_grid(result)
        lines = ["| length | " + " | ".join(f"depth {d:g}" for d in depths) + " |", "|---|" + "---|" * len(depths)]
        lines += [f"| {length} | " + " | ".join(f"{a:.2f}" for a in row) + " |" for length, row in zip(lengths, grid)]
        return "\n".join(lines) + f"\n\nchance: {result['chance']:.2f}"
    if result["suite"] in ("sink", "entropy"):
        lines = ["| layer | length | first token's share | its busiest head | spread evenly | entropy ÷ log(keys) |",
                 "|---|---|---|---|---|---|"]
        lines += [f"| {r['layer']} | {r['length']} | {r['share']:.4f} | {r['busiest_head']:.4f} | "
                  f"{result['uniform'][str(r['length'])]:.4f} | {r['entropy']:.4f} |" for r in result["rows"]]
        return "\n".join(lines)
    lines = ["| length | accuracy | queries |", "|---|---|---|"]
    lines += [f"| {r['length']} | {r['accuracy']:.4f} | {r['queries']} |" for r in result["rows"]]
    return "\n".join(lines)


def passkey_grid(result: dict) -> tuple[list[int], list[float], np.ndarray]:
    """A passkey result's ``(lengths, depths, accuracy [len(lengths), len(depths)])``, both sorted."""
    lengths = sorted({c["length"] for c in result["cells"]})
    depths = sorted({c["depth"] for c in result["cells"]})
    accuracy = {(c["length"], c["depth"]): c["accuracy"] for c in result["cells"]}
    return lengths, depths, np.array([[accuracy[n, d] for d in depths] for n in lengths])


def plot(result: dict, path: Path) -> None:
    with png_figure(path, figsize=(7, 4.5)) as (figure, axes):
        if result["suite"] == "length":
            for r in result["rows"]:
                xs = [(i + 0.5) * result["bucket"] for i in range(len(r["buckets"]))]
                axes.plot(xs, r["buckets"], marker="o", markersize=3, linestyle="-" if r["mode"] == "plain" else "--",
                          label=f"{r['mode']}, length {r['length']}")
            axes.axvline(result["trained"], color="grey", linewidth=0.8)
            axes.set(xlabel="position", ylabel="loss", title="loss by position (training length: grey line)")
            axes.set_xscale("log", base=2)
            axes.legend(fontsize=7)
        elif result["suite"] == "passkey":
            lengths, depths, grid = passkey_grid(result)
            image = axes.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
            axes.set_xticks(range(len(depths)), [f"{d:g}" for d in depths])
            axes.set_yticks(range(len(lengths)), [str(n) for n in lengths])
            axes.set(xlabel="depth of the key", ylabel="context length (tokens)",
                     title=f"passkey accuracy (chance {result['chance']:.2f})")
            figure.colorbar(image)
        elif result["suite"] in ("sink", "entropy"):
            sink = result["suite"] == "sink"
            for length in sorted({r["length"] for r in result["rows"]}):
                rows = [r for r in result["rows"] if r["length"] == length and r["layer"] != MEAN_OVER_LAYERS]
                axes.plot([r["layer"] for r in rows], [r["share" if sink else "entropy"] for r in rows], marker="o",
                          label=f"length {length}")
                axes.axhline(result["uniform"][str(length)] if sink else 1.0, color="grey", linewidth=0.8,
                             linestyle="--")
            axes.set(xlabel="attention layer", ylabel="weight on the first token" if sink else "entropy ÷ log(keys)",
                     title=f"attention {'sink' if sink else 'entropy'} (grey: heads that weigh every key alike)")
            axes.tick_params(axis="x", labelsize=7)
            axes.legend(fontsize=7)
        else:
            axes.plot([r["length"] for r in result["rows"]], [r["accuracy"] for r in result["rows"]], marker="o")
            axes.set_xscale("log", base=2)
            axes.set(xlabel="sequence length", ylabel="recall accuracy", title=f"MQAR, {result['num_pairs']} pairs")
        axes.grid(alpha=0.3)


def scalars(result: dict) -> dict[str, float]:
    """The result as TensorBoard scalars under ``eval/``."""
    if result["suite"] == "length":
        return {f"eval/length/{r['mode']}/{r['length']}": r["loss"] for r in result["rows"]}
    if result["suite"] == "passkey":
        return {f"eval/passkey/{c['length']}/depth_{c['depth']:g}": c["accuracy"] for c in result["cells"]}
    if result["suite"] in ("sink", "entropy"):
        key = "share" if result["suite"] == "sink" else "entropy"
        return {f"eval/{result['suite']}/{r['layer'].replace(' ', '_')}/{r['length']}": r[key] for r in result["rows"]}
    return {f"eval/mqar/{r['length']}": r["accuracy"] for r in result["rows"]}


RESULT_SUFFIXES = (".json", ".md", ".png")


def result_paths(out: str | Path) -> list[Path]:
    """The JSON, table and figure of ``--out``: ``out`` with ``.json``, ``.md`` and ``.png`` in place of one of
    those suffixes, and after any other name (``ratio_0.5_seed0`` is not cut to ``ratio_0``)."""
    out = Path(out)
    stem = out.name[: -len(out.suffix)] if out.suffix in RESULT_SUFFIXES else out.name
    return [out.with_name(stem + suffix) for suffix in RESULT_SUFFIXES]


def write_result(result: dict, out: Path) -> list[Path]:
    """``out.md`` (the table) and ``out.png`` (:func:`result_paths`); returns their paths."""
    _, text, figure = result_paths(out)
    text.parent.mkdir(parents=True, exist_ok=True)
    text.write_text(table(result) + "\n")
    plot(result, figure)
    return [text, figure]
