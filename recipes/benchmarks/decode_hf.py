"""``python -m recipes.benchmarks.decode_hf``: the zoo's ``generate`` against Hugging Face's, on the same weights,
in one run (docs/decoding.md).

    python -m recipes.benchmarks.decode_hf                                  # llama, mamba2, hybrid at batch 1, 8, 32
    python -m recipes.benchmarks.decode_hf --models llama --batches 1 --threads 2
    python -m recipes.benchmarks.decode_hf --device cuda --dtype bf16            # on a GPU (the default there)
    python -m recipes.benchmarks.decode_hf --models llama --batches 1 4 --products  # A/B the CPU step's row sums
    python -m recipes.benchmarks.decode_hf --models llama mistral --window 64        # a sliding window's cache
    python -m recipes.benchmarks.decode_hf --models falcon_h1 --batches 1 8          # attention beside Mamba-2
    python -m recipes.benchmarks.decode_hf --models qwen3_next --batches 1 8         # Gated DeltaNet, gated attention
    python -m recipes.benchmarks.decode_hf --models olmo_hybrid --batches 1 8        # Gated DeltaNet, post-norm attention

A Llama, a Mistral (Llama's shapes, every layer attending to its last ``--window`` keys), a Mamba-2, a Falcon-H1
(Llama's attention beside a Mamba-2 twice the width wide in every layer), a Qwen3-Next (Gated DeltaNet in three
layers of four, gated attention in the fourth, SwiGLU MLPs) and an OLMo-Hybrid (Qwen3-Next's shapes, its attention
without RoPE or gate, behind norms after its mixers; 8 layers, width 256 unless told) are built
with ``transformers`` from a seed and imported with :mod:`recipes.hf`; the hybrid (TransXSSM's ``SM×7 AM``) has no Hugging Face form, so only the
zoo's two modes run for it. Every mode continues the same prompts greedily by the same number of tokens:
Hugging Face's ``generate`` with its dynamic cache and with ``cache_implementation="static"`` (Llama's and Mistral's:
Mamba-2's, Falcon-H1's, Qwen3-Next's and OLMo-Hybrid's keep a state, which transformers' static cache has no place for), the zoo's
``generate`` eager and with ``compile=True`` (each step through ``torch.compile`` from a fixed-shape cache;
compiled once, before the timed rounds; on a GPU a CUDA graph, and the run says whether torch kept any from
being one). Rounds alternate between the modes; the table gives the median
new tokens per second and the ratio to Hugging Face's dynamic cache (for the hybrid, to the zoo's eager).
A generation's time includes its prompt's prefill (eager in both of the zoo's modes), so the zoo's step is also
given alone: ``step ms`` is what the generation takes beyond a generation of one token (the prefill, timed in
the same rounds), per step, and ``step × eager`` the eager step's time over it. ``--products`` adds the mode
``zoo compiled, products``: a copy of the zoo model compiled with its linear layers left as matrix products (on a
CPU the compiled step takes them as row sums up to ``components.generation.ROW_SUM_MAX_ROWS`` rows), timed in the
same rounds. Where that difference is not
positive (tiny sizes, one round) the cells say ``noise``: the timer cannot tell the step from the prefill.

A timing of two different computations would mean nothing, so every mode's tokens are checked against
the zoo model's full forward: at each generated position the token must be the argmax of the logits of
the full forward over everything before it (the ``argmax`` column: ok, or the first position that is not, with
the full forward's margin there: a margin at rounding level is a near tie between two tokens, not an error).

Needs the dev extras (transformers).
"""

import argparse
import copy
import statistics
import tempfile
from functools import partial
from unittest import mock

import torch

from recipes.argtypes import device, positive_int
from recipes.benchmarks.timing import interleaved_seconds

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


WINDOW = 64  # Mistral's sliding window here: a quarter of the default prompt, so the generation runs past it


def hf_model(kind: str, width: int, layers: int, vocab: int, window: int = WINDOW):
    import transformers

    torch.manual_seed(0)
    if kind in ("llama", "mistral"):
        shapes = dict(vocab_size=vocab, hidden_size=width, intermediate_size=688 * width // 256, num_hidden_layers=layers,
                      num_attention_heads=max(width // 64, 1), num_key_value_heads=max(width // 64, 1),
                      max_position_embeddings=4096, tie_word_embeddings=False)  # (MistralConfig's default: 8 KV heads)
        if kind == "mistral":
            return transformers.MistralForCausalLM(transformers.MistralConfig(**shapes, sliding_window=window)).eval()
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**shapes)).eval()
    if kind == "falcon_h1":
        return transformers.FalconH1ForCausalLM(transformers.FalconH1Config(
            vocab_size=vocab, hidden_size=width, intermediate_size=688 * width // 256, num_hidden_layers=layers,
            num_attention_heads=max(width // 64, 1), num_key_value_heads=max(width // 64, 1), head_dim=64,
            mamba_d_ssm=2 * width, mamba_n_heads=2 * width // 64, mamba_d_state=64, mamba_n_groups=1,
            mamba_chunk_size=256, max_position_embeddings=4096, tie_word_embeddings=False)).eval()
    if kind == "qwen3_next":  # Gated DeltaNet in three layers of four, gated attention in the fourth; MLPs, no experts
        return transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(
            vocab_size=vocab, hidden_size=width, intermediate_size=688 * width // 256, num_hidden_layers=layers,
            num_attention_heads=max(width // 64, 1), num_key_value_heads=max(width // 128, 1), head_dim=64,
            linear_num_key_heads=max(width // 128, 1), linear_num_value_heads=max(width // 64, 1),
            linear_key_head_dim=64, linear_value_head_dim=64, num_experts=0, max_position_embeddings=4096,
            tie_word_embeddings=False)).eval()
    if kind == "olmo_hybrid":  # Qwen3-Next's shapes: Gated DeltaNet in three layers of four, attention in the fourth
        return transformers.OlmoHybridForCausalLM(transformers.OlmoHybridConfig(
            vocab_size=vocab, hidden_size=width, intermediate_size=688 * width // 256, num_hidden_layers=layers,
            num_attention_heads=max(width // 64, 1), num_key_value_heads=max(width // 128, 1),
            linear_num_key_heads=max(width // 128, 1), linear_num_value_heads=max(width // 64, 1),
            linear_key_head_dim=64, linear_value_head_dim=64, max_position_embeddings=4096, pad_token_id=0,
            eos_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": None},
            tie_word_embeddings=False)).eval()
    config = transformers.Mamba2Config(vocab_size=vocab, hidden_size=width, num_hidden_layers=layers, expand=2,
                                       head_dim=64, num_heads=2 * width // 64, state_size=64, n_groups=1, chunk_size=256)
    return transformers.Mamba2ForCausalLM(config).eval()


def zoo_hybrid(width: int, layers: int, vocab: int):
    from components import SSD, HybridLM, QCAttention

    torch.manual_seed(0)
    pattern = " ".join(["SM"] * (layers - 1) + ["AM"])
    return HybridLM(vocab, width, pattern, {"S": partial(SSD, head_dim=64, d_state=64, chunk_size=256),
                                            "A": partial(QCAttention, n_heads=max(width // 64, 1))},
                    max_seq_len=4096).eval()


def first_departure(model, out: torch.Tensor, prompt_length: int) -> str | None:
    """Where the generated tokens first differ from the argmax of the full forward over what precedes them
    (None: nowhere), with the full forward's margin there between its best logit and the token taken:
    a margin at rounding level is a near tie, not an error."""
    logits = model(out[:, :-1])[:, prompt_length - 1:]  # [B, new, V]: position t predicts t+1
    taken = out[:, prompt_length:]  # [B, new]
    wrong = (logits.argmax(-1) != taken).nonzero()  # [k, 2] (row, position), row-major
    if not len(wrong):
        return None
    row, position = wrong[wrong[:, 1].argmin()].tolist()
    margin = (logits[row, position].max() - logits[row, position, taken[row, position]]).item()
    return f"departs at {position} (margin {margin:.1e})"


@torch.no_grad()
def run(kind: str, batch: int, args) -> list[dict]:
    import transformers  # the dev extra, named in the error if missing

    from recipes.hf import from_pretrained

    if kind == "hybrid":
        zoo, hf = zoo_hybrid(args.width, args.layers, args.vocab), None
    else:
        hf = hf_model(kind, args.width, args.layers, args.vocab, args.window)
        with tempfile.TemporaryDirectory(prefix=f"decode-{kind}-") as folder:
            transformers.utils.logging.disable_progress_bar()  # (its bar for the shards it writes, amid the table)
            hf.save_pretrained(folder)
            zoo = from_pretrained(folder).eval()
        hf = hf.to(args.device, DTYPES[args.dtype])
    zoo = zoo.to(args.device, DTYPES[args.dtype])
    torch.manual_seed(1)
    prompt = torch.randint(0, args.vocab, (batch, args.prompt)).to(args.device)
    n = args.new_tokens
    modes = {}
    if hf is not None:
        # The mask is given: left to infer it, HF would take every token equal to pad_token_id for padding. And no
        # end-of-sequence token, rather than min_new_tokens: that one makes HF suppress the EOS token's logit, so
        # a row whose argmax is EOS continues with another token (what looked like HF departing from its forward).
        hf.generation_config.eos_token_id = None
        common = {"max_new_tokens": n, "do_sample": False, "pad_token_id": 0, "attention_mask": torch.ones_like(prompt)}
        modes["hf dynamic"] = lambda: hf.generate(prompt, **common)
        if kind in ("llama", "mistral"):  # a state beside the keys (Mamba-2, Falcon-H1): no static form to ask for
            modes["hf static"] = lambda: hf.generate(prompt, cache_implementation="static", **common)
    modes["zoo eager"] = lambda: zoo.generate(prompt, n)
    modes["zoo compiled"] = lambda: zoo.generate(prompt, n, compile=True)
    if args.products:
        modes["zoo compiled, products"] = partial(generate_with_products, copy.deepcopy(zoo), prompt, n)
    outputs = {name: fn() for name, fn in modes.items()}  # also compiles the zoo's step, before the timing
    modes["zoo prefill"] = lambda: zoo.generate(prompt, 1)  # the prompt and one token: no step
    times = interleaved_seconds(modes, args.rounds, warmup=0)
    median = {name: statistics.median(t) for name, t in times.items()}
    base = median["hf dynamic" if hf is not None else "zoo eager"]
    step_ms, step_ratio = step_times(median, n)
    rows = []
    for name, tokens in outputs.items():
        departs = first_departure(zoo, tokens, args.prompt)
        rows.append({"model": kind, "batch": batch, "mode": name, "tok_s": batch * n / median[name],
                     "ratio": base / median[name], "step_ms": step_ms.get(name),
                     "step_ratio": step_ratio.get(name),
                     "prefill_ms": 1e3 * median["zoo prefill"], "argmax": departs or "ok"})
    return rows


def generate_with_products(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """``model.generate(prompt, n, compile=True)`` with the compiled step's linear layers left as matrix products.
    Give it a model of its own (a copy): its compiled step must never have been traced with the row sums, since
    the later steps skip the guards that would tell the two apart."""
    from components import generation

    with mock.patch.object(generation, "ROW_SUM_MAX_ROWS", 0):
        return model.generate(prompt, n, compile=True)


def step_times(median: dict[str, float], n: int) -> tuple[dict[str, float], dict[str, float]]:
    """The zoo's step alone, from median seconds of whole generations of ``n`` tokens and of ``"zoo prefill"``
    (one token): ms per step of ``"zoo eager"``, ``"zoo compiled"`` (and ``"zoo compiled, products"`` when timed),
    and the eager step over each. A step at or below zero is the timer's noise (tiny sizes, few rounds), not a
    time: then no ratio is given."""
    zoo_modes = [name for name in ("zoo eager", "zoo compiled", "zoo compiled, products") if name in median]
    step_ms = {name: 1e3 * (median[name] - median["zoo prefill"]) / max(n - 1, 1) for name in zoo_modes}
    if min(step_ms.values()) <= 0:
        return step_ms, {}
    return step_ms, {name: step_ms["zoo eager"] / ms for name, ms in step_ms.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.decode_hf",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["llama", "mamba2", "hybrid"],
                        choices=["llama", "mistral", "mamba2", "falcon_h1", "qwen3_next", "olmo_hybrid", "hybrid"])
    parser.add_argument("--batches", nargs="+", type=positive_int, default=[1, 8, 32])
    parser.add_argument("--width", type=positive_int, default=256)
    parser.add_argument("--layers", type=positive_int, default=8)
    parser.add_argument("--vocab", type=positive_int, default=1024)
    parser.add_argument("--prompt", type=positive_int, default=256, help="prompt tokens")
    parser.add_argument("--new-tokens", type=positive_int, default=64)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--window", type=positive_int, default=WINDOW, help="Mistral's sliding window (default %(default)s)")
    parser.add_argument("--products", action="store_true",
                        help="also time the compiled step with its linear layers as matrix products (a copy of the model)")
    cuda = torch.cuda.is_available()
    parser.add_argument("--device", type=device, default="cuda" if cuda else "cpu", help="default: cuda where there is one")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16" if cuda else "fp32",
                        help="weights and activations (default: bf16 on a GPU, fp32 on a CPU)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{args.threads} threads"
    print(f"torch {torch.__version__}, {where}, {args.dtype}; {args.layers} layers × {args.width}, prompt {args.prompt}, "
          f"{args.new_tokens} new tokens, greedy; median of {args.rounds} interleaved rounds\n", flush=True)
    print("| model | batch | mode | new tokens/s | × baseline | step ms | step × eager | argmax |\n"
          "|---|---|---|---|---|---|---|---|", flush=True)
    prefills = []
    for kind in args.models:
        for batch in args.batches:
            rows = run(kind, batch, args)
            prefills.append(f"{kind} batch {batch}: {rows[0]['prefill_ms']:.0f} ms")
            for r in rows:
                if r["step_ms"] is None:
                    step = "- | -"
                elif r["step_ratio"] is None:
                    step = "noise | -"  # the generation took no longer than the prefill: more tokens or rounds
                else:
                    step = f"{r['step_ms']:.2f} | {r['step_ratio']:.2f}×"
                print(f"| {r['model']} | {r['batch']} | {r['mode']} | {r['tok_s']:,.1f} | {r['ratio']:.2f}× | {step} | "
                      f"{r['argmax']} |", flush=True)
    print("\nThe zoo's prefill (the prompt and one token, eager; in every zoo mode's time): " + "; ".join(prefills))
    if args.device.startswith("cuda"):  # the compiled step is meant to be a CUDA graph there (docs/decoding.md)
        from torch._dynamo.utils import counters

        skips = counters["inductor"]["cudagraph_skips"]
        print(f"Compiled steps that torch kept from being CUDA graphs: {skips}" +
              (" (TORCH_LOGS=perf_hints says why)" if skips else " (every compiled step ran as a CUDA graph)"))


if __name__ == "__main__":
    main()
