"""Benchmark of ``TokenizedCorpus`` on a generated corpus: tokenization throughput and peak memory, and
training throughput from the memory-mapped cache against the same tokens held in memory.

    python -m recipes.benchmarks.corpus                      # a 300 MB .jsonl corpus, BPE of 8192
    python -m recipes.benchmarks.corpus --mb 50 --format txt

The corpus is written to ``--dir`` (default a temporary directory): documents of 100 to 3,000 words
drawn from a Zipf law over 50,000 made-up words, ``--mb`` megabytes in all, in files of about 50 MB.
Each tokenization runs in a fresh process, into a fresh cache, and reports its wall time, MB/s of
corpus and the growth of its peak resident set (``VmHWM``): first with no tokenizer (the BPE is
trained, then the corpus encoded), then with the trained BPE's file (encoding only). Training: a
4-block ``AM`` model (``d_model`` 128, T 256, batch 16) takes ``--steps`` optimizer steps from each
loader — the ``.bin`` file memory-mapped, and the same tokens read into a tensor first — and reports
the median tokens/s of each, interleaved in rounds.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from components import HybridLM
from recipes.argtypes import positive_int
from recipes.benchmarks.timing import interleaved_seconds, peak_growth_mib, seconds_of
from recipes.data.corpus import MemmapWindows, TokenizedCorpus
from recipes.data.text import Windows

FILE_MB = 50


def generate(directory: Path, mb: int, fmt: str, seed: int = 0) -> list[str]:
    """Write about ``mb`` MB of documents as ``.jsonl`` or ``.txt`` files; returns their paths."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, size=rng.integers(2, 11))) for _ in range(50_000)]
    directory.mkdir(parents=True, exist_ok=True)
    paths, written, index = [], 0, 0
    while written < mb * 1e6:
        path = directory / f"part{index:03d}.{fmt}"
        with open(path, "w", encoding="utf-8") as out:
            size = 0
            while size < FILE_MB * 1e6 and written + size < mb * 1e6:
                ids = np.minimum(rng.zipf(1.3, size=int(rng.integers(100, 3000))) - 1, len(words) - 1)
                text = " ".join(words[i] for i in ids)
                line = json.dumps({"text": text}) + "\n" if fmt == "jsonl" else text + "\n<DOC>\n"
                out.write(line)
                size += len(line)
        written += size
        paths.append(str(path))
        index += 1
    return paths


def tokenize_child(paths: list[str], cache: str, tokenizer: str | None, vocab: int, fmt: str) -> dict:
    """In this (fresh) process: build the cache; wall time and peak memory growth."""
    data = TokenizedCorpus(paths, tokenizer=tokenizer, vocab_size=vocab, cache_dir=cache,
                           txt_separator="\n<DOC>\n" if fmt == "txt" else None)
    seconds: list[float] = []
    peak_mib = peak_growth_mib(lambda: seconds.append(seconds_of(data.prepare_data)))
    data.setup()
    return {"seconds": seconds[0], "peak_mib": peak_mib, "cache": str(data.cache),
            "tokens": data.meta["tokens"]["train"] + data.meta["tokens"]["val"]}


def run_tokenize(paths, cache, tokenizer, args) -> dict:
    command = [sys.executable, "-m", "recipes.benchmarks.corpus", "--child", json.dumps([paths, cache, tokenizer, args.vocab, args.format])]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"tokenization failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def train_rates(cache: Path, vocab: int, steps: int) -> dict[str, float]:
    """Median tokens/s of training steps fed from the memory map and from the same tokens in memory."""
    meta = json.loads((cache / "meta.json").read_text())
    T, batch = 256, 16
    memmap = MemmapWindows(cache / "train.bin", meta["dtype"], T, T)
    in_memory = Windows(torch.from_numpy(np.fromfile(cache / "train.bin", dtype=meta["dtype"]).astype(np.int64)), T, T)
    torch.manual_seed(0)
    model = HybridLM(vocab, 128, "AM×4", {"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 4}},
                                          "M": {"class_path": "components.MLP"}}, max_seq_len=T)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loaders = {name: iter(torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, drop_last=True))
               for name, ds in (("memory-mapped", memmap), ("in memory", in_memory))}
    def step(loader) -> None:
        b = next(loader)
        loss = F.cross_entropy(model(b["input_ids"]).flatten(0, 1), b["labels"].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = interleaved_seconds({name: partial(step, loader) for name, loader in loaders.items()}, steps)
    return {name: batch * T / statistics.median(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.corpus",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=positive_int, default=300)
    parser.add_argument("--format", choices=["jsonl", "txt"], default="jsonl")
    parser.add_argument("--vocab", type=positive_int, default=8192)
    parser.add_argument("--steps", type=positive_int, default=20)
    parser.add_argument("--dir", default=None, help="where the corpus and caches go (default: a temporary directory)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(tokenize_child(*json.loads(args.child))))
        return
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.dir or scratch)
        started = time.perf_counter()
        paths = generate(root / "corpus", args.mb, args.format)
        mb = sum(Path(p).stat().st_size for p in paths) / 1e6
        print(f"# {mb:,.0f} MB of .{args.format} in {len(paths)} files (generated in {time.perf_counter() - started:.0f} s); "
              f"torch {torch.__version__}, {torch.get_num_threads()} threads")
        print("\n| tokenization | seconds | MB/s | tokens | peak MiB above the start |\n|---|---|---|---|---|")
        trained = run_tokenize(paths, str(root / "cache-bpe"), None, args)
        print(f"| train a BPE of {args.vocab}, then encode | {trained['seconds']:.1f} | {mb / trained['seconds']:.1f} | "
              f"{trained['tokens']:,} | {trained['peak_mib']:,.0f} |", flush=True)
        encoded = run_tokenize(paths, str(root / "cache-file"), str(Path(trained["cache"]) / "tokenizer.json"), args)
        print(f"| encode with the trained tokenizer file | {encoded['seconds']:.1f} | {mb / encoded['seconds']:.1f} | "
              f"{encoded['tokens']:,} | {encoded['peak_mib']:,.0f} |", flush=True)
        rates = train_rates(Path(encoded["cache"]), args.vocab, args.steps)
        base = rates["in memory"]
        print("\n| training batches from | tok/s | × in memory |\n|---|---|---|")
        for name, rate in rates.items():
            print(f"| {name} | {rate:,.0f} | {rate / base:.2f} |")


if __name__ == "__main__":
    main()
