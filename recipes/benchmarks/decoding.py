"""Decoding benchmark: prefill time, per-token step time and memory against context length, for Llama,
Mistral (Llama with a sliding window), Mamba-2, TransXSSM and Jamba at equal width (docs/decoding.md).

    python -m recipes.benchmarks.decoding                                  # CPU: contexts 1K … 16K
    python -m recipes.benchmarks.decoding --contexts 1024 4096 --d-model 512 --steps 32
    python -m recipes.benchmarks.decoding --models llama mistral --window 1024
    python -m recipes.benchmarks.decoding --device cuda --contexts 4096 16384 65536

Each (model, context) row runs in its own process, so its peak memory is its own: the prompt of
``context`` tokens is prefilled once (the chunked forward, timed), then ``steps`` single tokens are
decoded from the cache (median step time → tokens/s). Memory: the cache (exact bytes of what it
holds) and the process's peak (RSS on CPU, allocated memory on CUDA) above the loaded model.
"""

import argparse
import json
import subprocess
import sys
from functools import partial

import torch

from components import SSD, HybridLM, QCAttention, RoutedMoE
from recipes.argtypes import device, positive_int
from recipes.benchmarks.timing import median_ms, resident_kib, seconds_of

MODELS = {  # 8 blocks each at the same width: attention, SSD, and the two hybrid ratios of the papers
    "llama": "AM×8",
    "mistral": "AM×8",  # every attention layer sees its last `window` keys
    "mamba2": "S-×8",
    "transxssm": "SM×7 AM",
    "jamba": "SM SR SM SR AM SR SM SR",
}


WINDOW = 512  # Mistral's sliding window here (Mistral 7B's is 4,096 keys): well inside the default contexts


def build(name: str, d_model: int, vocab: int, device: str, window: int = WINDOW) -> HybridLM:
    heads = max(d_model // 64, 1)
    mamba = name in ("mamba2", "jamba")  # Mamba-2's SSD: expanded, no rotary; TransXSSM's: rotary, not expanded
    mixers = {"A": partial(QCAttention, n_heads=heads, sliding_window=window if name == "mistral" else None),
              "S": partial(SSD, conv=True, rope=not mamba, gate=name == "mamba2", expand=2 if mamba else 1,
                           head_dim=64, d_state=64, chunk_size=256),
              "R": partial(RoutedMoE, n_experts=4, top_k=1)}
    used = {letter: factory for letter, factory in mixers.items() if letter in MODELS[name]}
    torch.manual_seed(0)
    return HybridLM(vocab, d_model, MODELS[name], used, max_seq_len=1 << 20).to(device).eval()


def peak_bytes(device: str) -> int:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated()
    return resident_kib("VmHWM") * 1024


@torch.no_grad()
def one(name: str, context: int, d_model: int, vocab: int, steps: int, device: str, window: int = WINDOW) -> dict:
    model = build(name, d_model, vocab, device, window)
    prompt = torch.randint(0, vocab, (1, context), device=device)
    cache = model.new_cache(1, context + steps + 2)
    model(prompt[:, :8], cache=model.new_cache(1, 8))  # warm-up
    before, out = peak_bytes(device), {}
    prefill = seconds_of(lambda: out.setdefault("logits", model(prompt, cache=cache)[:, -1]))
    token = out["logits"].argmax(-1, keepdim=True)

    def decode_one() -> None:
        nonlocal token
        token = model(token, cache=cache)[:, -1].argmax(-1, keepdim=True)

    step = median_ms(decode_one, steps, warmup=2) / 1e3
    return {"model": name, "context": context, "prefill_s": prefill, "prefill_tok_s": context / prefill,
            "step_ms": step * 1e3, "step_tok_s": 1 / step, "cache_mib": cache.nbytes() / 2**20,
            "peak_mib": max(peak_bytes(device) - before, 0) / 2**20}


def table(rows: list[dict], baseline: str = "llama") -> str:
    by = {(r["model"], r["context"]): r for r in rows}
    lines = ["| model | context | prefill s | prefill tok/s | step ms | decode tok/s | vs llama | cache MiB | peak MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = by.get((baseline, r["context"]))
        ratio = f"{r['step_tok_s'] / base['step_tok_s']:.2f}×" if base else "—"
        lines.append(f"| {r['model']} | {r['context']:,} | {r['prefill_s']:.2f} | {r['prefill_tok_s']:,.0f} | "
                     f"{r['step_ms']:.1f} | {r['step_tok_s']:,.1f} | {ratio} | {r['cache_mib']:.1f} | {r['peak_mib']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.decoding",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--contexts", nargs="+", type=positive_int, default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--d-model", type=positive_int, default=256)
    parser.add_argument("--vocab", type=positive_int, default=1024)
    parser.add_argument("--steps", type=positive_int, default=16)
    parser.add_argument("--device", type=device, default="cpu")
    parser.add_argument("--window", type=positive_int, default=WINDOW, help="Mistral's sliding window (default %(default)s)")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "CONTEXT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.d_model, args.vocab, args.steps, args.device,
                             args.window)))
        return
    print(f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} threads, d_model {args.d_model}, "
          f"8 blocks, batch 1, {args.steps} steps, Mistral's window {args.window}\n", flush=True)
    rows, failed = [], []
    for context in args.contexts:
        for name in args.models:
            command = [sys.executable, "-m", "recipes.benchmarks.decoding", "--one", name, str(context), "--d-model",
                       str(args.d_model), "--vocab", str(args.vocab), "--steps", str(args.steps), "--device", args.device,
                       "--window", str(args.window)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{name} at {context}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                failed.append(f"{name} at {context:,}")
                continue
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"{name} {context}: done", file=sys.stderr, flush=True)
    print(table(rows))
    if failed:  # a row that failed is named last, where it is seen, and the exit status says so
        sys.exit(f"{len(failed)} of {len(rows) + len(failed)} rows failed (their errors above): {', '.join(failed)}")


if __name__ == "__main__":
    main()
