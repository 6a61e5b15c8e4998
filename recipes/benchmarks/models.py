"""Model-level benchmark: one training step (forward, cross-entropy, backward, AdamW) of each named
architecture, and of its Hugging Face twin where one exists, for several sequence lengths.

    python -m recipes.benchmarks.models                                    # every model, T = 512 2048 8192 (CPU sizes)
    python -m recipes.benchmarks.models --models llama hf-llama hybrid --lengths 4096 8192
    python -m recipes.benchmarks.models --models llama hybrid --lengths 2048 --compile   # adds torch.compile'd rows
    python -m recipes.benchmarks.models --models llama hybrid hybrid-recompute --lengths 2048 --saved  # kept for backward
    python -m recipes.benchmarks.models --family efficiency --plot efficiency.png   # TransXSSM Fig. 4 / Wonderful Matrices v2 Fig. 6
    python -m recipes.benchmarks.models --models hybrid --lengths 4096 --profile 15  # + one step's 15 costliest ops

Twins are built from one Hugging Face config (``transformers`` must be installed for the ``hf-*``
rows): ``hf-llama`` is ``LlamaForCausalLM`` and ``llama`` the zoo model :func:`recipes.hf.hf_recipe`
makes of the same config, so the two have the same parameter count by construction; likewise
``mamba2`` / ``hf-mamba2`` and ``doge`` / ``hf-doge`` (HF's SDPA attention where it has one). The other
named architectures take their pattern and components from ``recipes/configs/arch/tiny/`` at the
benchmark's width (heads of 64, SSD states of ``--d-state``, no key window: Doge's window, a top-k over
a written-out ``[B, H, T, S]`` mask in HF's code and the zoo's alike, would take minutes per step at
T = 8192 on a CPU, so the Doge twins get a window as long as the sequence); ``hybrid`` is ``SM×(L-1) AM``, the
SSD hybrid of the issue that asked for this, against ``llama``'s ``AM×L``, and ``hybrid-recompute``
the same with the SSD's activations recomputed in the backward (``SSD(recompute=True)``), ``hybrid-checkpointed``
with every block's (``HybridLM(checkpoint_blocks=True)``).

Each (model, T) runs in a fresh process: a warm-up step at T=64 (AdamW's states exist after it), then
one step at T whose peak memory is read (CPU: growth of the peak resident set, ``VmHWM``, reset through
``/proc/self/clear_refs``; CUDA: ``max_memory_allocated``), then ``--repeats`` timed steps whose median
gives tokens/s. The ratio column divides by the row's baseline: the HF twin for ``llama``, ``mamba2``,
``doge``; ``llama`` for the others (``--baseline NAME``: that model for every row). On CUDA the step
runs under bf16 autocast and the sizes grow.

``--trials N`` measures each (model, T) in N fresh processes: tokens/s and peak memory are the medians
over them, and the table adds the range of tokens/s. ``--plot PATH`` draws tokens/s and peak memory
against T, one line per model. ``--family efficiency`` is the efficiency family of the ablations
(Llama, Mamba-2, TransXSSM and Jamba at one width, T = 512 … 8192, against llama, 3 trials); any
option given with it overrides its setting.
"""

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from components import HybridLM, count_parameters
from components.block import block_mixers
from components.flops import forward_flops_per_token
from recipes.argtypes import bounded, positive_int
from recipes.benchmarks.timing import median_ms, peak_growth_mib, seconds_of, synchronize
from recipes.figures import png_figure
from recipes.mfu import device_peak_flops, training_flops

CONFIGS = Path(__file__).parent.parent / "configs"  # recipes/configs
TWINS = {"llama": "hf-llama", "mamba2": "hf-mamba2", "doge": "hf-doge"}
NAMED = ["jamba", "otce", "cheems", "transxssm", "doge_moe"]
# Wonderful Matrices v1 Figure 3 (inner function attention with the SSD as its value against plain attention, 4%
# slower there): Cheems' layout with its attention letter replaced; ``cheems`` itself is v2's (retrieved values).
VARIANTS = {"cheems-ssd-value": ("cheems", {"I": {"class_path": "components.InnerFuncAttention",
                                                  "init_args": {"n_heads": 4, "inner": "ssd", "mask": "none"}}}),
            "cheems-attention": ("cheems", {"I": {"class_path": "components.QCAttention", "init_args": {"n_heads": 4}}})}
FAMILIES = {"efficiency": dict(models=["llama", "mamba2", "transxssm", "jamba", "otce", "cheems", "cheems-ssd-value",
                                       "cheems-attention"], lengths=[512, 1024, 2048, 4096, 8192],
                               baseline="llama", trials=3, repeats=2)}
MODELS = ["llama", "hf-llama", "mamba2", "hf-mamba2", "doge", "hf-doge", "hybrid", "hybrid-recompute", "hybrid-checkpointed",
          *NAMED, *VARIANTS]


def sizes(cuda: bool) -> dict:
    """The benchmark's shapes on the device it runs on."""
    if cuda:
        return dict(d_model=1024, layers=12, vocab=32768, batch=4, d_state=128, chunk=256, lengths=[512, 1024, 2048, 4096, 8192])
    return dict(d_model=256, layers=8, vocab=8192, batch=1, d_state=64, chunk=64, lengths=[512, 2048, 8192])


ARCHITECTURES = {"llama": "LlamaForCausalLM", "mamba2": "Mamba2ForCausalLM", "doge": "DogeForCausalLM"}


def twin_config(kind: str, s: dict, max_len: int) -> dict:
    """The Hugging Face config of a twin pair as a plain dict: what ``recipes.hf.hf_recipe`` reads for the zoo's
    model (no ``transformers`` needed) and what ``transformers`` builds its own from."""
    d, heads = s["d_model"], s["d_model"] // 64
    config = dict(architectures=[ARCHITECTURES[kind]], vocab_size=s["vocab"], hidden_size=d, num_hidden_layers=s["layers"],
                  tie_word_embeddings=False)
    ff = 64 * round(8 / 3 * d / 64)
    if kind == "llama":
        config.update(intermediate_size=ff, num_attention_heads=heads, num_key_value_heads=max(heads // 2, 1),
                      max_position_embeddings=max_len, rms_norm_eps=1e-6, hidden_act="silu")
    elif kind == "mamba2":
        config.update(num_heads=2 * d // 64, head_dim=64, expand=2, state_size=s["d_state"], n_groups=1,
                      chunk_size=s["chunk"], conv_kernel=4, layer_norm_epsilon=1e-5)
    else:  # doge: the key window as long as the sequence, so neither model takes the windowed path (a top-k
        # over a written-out [B, H, T, S] mask in both: minutes per step at T = 8192 on a CPU)
        config.update(intermediate_size=ff, num_attention_heads=heads, num_key_value_heads=max(heads // 2, 1),
                      max_position_embeddings=max_len, keep_window_size=max_len, rms_norm_eps=1e-6, hidden_act="silu")
    return config


def hf_config(kind: str, s: dict, max_len: int):
    import transformers

    plain = twin_config(kind, s, max_len)
    return getattr(transformers, plain["architectures"][0].replace("ForCausalLM", "Config"))(**plain)


def scaled(spec: dict, s: dict) -> dict:
    """A tiny recipe's mixer spec at the benchmark's width: heads of 64, SSD states of ``d_state``."""
    args = dict(spec.get("init_args", {}))
    name = spec["class_path"].rsplit(".", 1)[-1]
    if name == "SSD":
        args.update(head_dim=64, d_state=s["d_state"], chunk_size=s["chunk"])
    elif "n_heads" in args and name != "CDMoE":
        args.pop("keep_window", None)  # as for the Doge twins: no windowed path
        heads = s["d_model"] // 64
        group = args["n_heads"] // args.get("n_kv_heads", args["n_heads"])
        args.update(n_heads=heads, **({"n_kv_heads": max(heads // group, 1)} if "n_kv_heads" in args else {}))
    return {"class_path": spec["class_path"], "init_args": args}


def build(name: str, s: dict, max_len: int) -> torch.nn.Module:
    """The model ``name`` at the benchmark's sizes; HF models return logits through ``.logits``."""
    if name.startswith("hf-"):
        import transformers

        config = hf_config(name.removeprefix("hf-"), s, max_len)
        model = getattr(transformers, config.architectures[0])(config)
        if name == "hf-doge":
            model.config._attn_implementation = "sdpa"
        return model
    if name in TWINS:
        from recipes.hf import hf_recipe

        recipe = hf_recipe(twin_config(name, s, max_len))
        recipe["max_seq_len"] = max_len
        return HybridLM(recipe.pop("vocab_size"), recipe.pop("d_model"), recipe.pop("pattern"), recipe.pop("mixers"), **recipe)
    if name.startswith("hybrid"):
        ssd = {"class_path": "components.SSD", "init_args": {"conv": True, "rope": False, "expand": 2,
                                                             "recompute": name == "hybrid-recompute"}}
        attention = {"class_path": "components.QCAttention", "init_args": {"n_heads": 4, "n_kv_heads": 2}}
        mixers = {"S": scaled(ssd, s), "A": scaled(attention, s), "M": {"class_path": "components.MLP"}}
        return HybridLM(s["vocab"], s["d_model"], f"SM×{s['layers'] - 1} AM", mixers, max_seq_len=max_len,
                        checkpoint_blocks=name == "hybrid-checkpointed")
    base, replaced = VARIANTS.get(name, (name, {}))
    recipe = yaml.safe_load((CONFIGS / "arch" / "tiny" / f"{base}.yaml").read_text())["model"]
    options = {k: recipe[k] for k in ("tie_embeddings", "residual_scale") if k in recipe}
    mixers = {letter: scaled(spec, s) for letter, spec in {**recipe["mixers"], **replaced}.items()}
    return HybridLM(s["vocab"], s["d_model"], recipe["pattern"], mixers, max_seq_len=max_len, **options)


PROGRESS = "progress: "  # a child's stderr lines that the parent passes on


def progress(text: str, since: float) -> None:
    print(f"{PROGRESS}{text} ({time.perf_counter() - since:.1f} s)", file=sys.stderr, flush=True)


def measure(name: str, T: int, s: dict, repeats: int, compiled: bool, profile: int = 0) -> dict:
    """In this (fresh) process: peak MiB of one step at T above the warmed-up model, and the median step time;
    with ``profile`` > 0, one more step under torch's profiler and its ``profile`` costliest ops (self time on the
    device: CUDA's kernels, or the CPU's) as a table, ``"profile"``."""
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    torch.manual_seed(0)
    start = time.perf_counter()
    model = build(name, s, max(T, 64)).to(device).train()
    progress("built", start)
    params = count_parameters(model)
    forward = torch.compile(model, fullgraph=True, dynamic=False) if compiled else model  # as recipes.module does
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(length: int) -> None:
        ids = torch.randint(0, s["vocab"], (s["batch"], length + 1), device=device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=cuda):
            out = forward(ids[:, :-1])
            logits = out.logits if hasattr(out, "logits") else out  # [B, T, V]
            loss = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    warmup_s = seconds_of(lambda: step(64))  # the optimizer's states, libraries, (compiled) kernels
    progress("warm-up step at T=64", start)
    first_step: list[float] = []  # the first call at T also compiles its shapes when compiled
    peak_mib = peak_growth_mib(lambda: first_step.append(seconds_of(lambda: step(T))), device)
    progress(f"first step at T={T}", start)
    seconds = median_ms(lambda: step(T), repeats, warmup=0) / 1e3
    progress(f"{repeats} timed steps", start)
    table = None
    if profile:
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=activities) as profiler:
            step(T)
            synchronize()
        table = profiler.key_averages().table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                                              row_limit=profile, max_name_column_width=60)
        progress("profiled step", start)
    flops = forward_flops_per_token(model, T) if isinstance(model, HybridLM) else None  # an HF twin: its zoo twin's
    peak = device_peak_flops(device, "bf16-mixed") if cuda else None
    return {"params": params, "seconds": seconds, "peak_mib": peak_mib, "warmup_s": warmup_s,
            "first_step_s": first_step[0], "flops_per_token": flops, "peak_flops": peak, "profile": table}


def saved_for_backward(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, tuple[int, int]]:
    """What a training forward of ``model`` on ``ids [B, T]`` keeps for the backward, per kind of mixer:
    ``{class name: (layers, bytes)}``, plus ``"other"`` (embedding, norms, LM head, loss). Each storage
    counts once, parameters never; counted by a saved-tensor hook, so it is exact, not a peak."""
    owner, kept, seen, layers = ["other"], {}, set(), {}
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def leave(module, args, output) -> None:  # a forward hook that returns something replaces the output
        owner.pop()

    for block in getattr(model, "blocks", []):
        for mixer in filter(None, block_mixers(block)):  # Mamba-2's blocks have no state mixer
            kind = type(mixer).__name__
            layers[kind] = layers.get(kind, 0) + 1
            mixer.register_forward_pre_hook(lambda m, a, kind=kind: owner.append(kind))
            mixer.register_forward_hook(leave)

    alive = []  # every packed tensor, so no counted storage is freed and its address reused by another

    def pack(t: torch.Tensor) -> torch.Tensor:
        alive.append(t)
        key = t.untyped_storage().data_ptr()
        if key not in seen and key not in params:
            seen.add(key)
            kept[owner[-1]] = kept.get(owner[-1], 0) + t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(ids[:, :-1])  # [B, T, V]
        F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    return {kind: (layers.get(kind, 0), kept[kind]) for kind in sorted(kept)}


def print_saved(models: list[str], lengths: list[int], s: dict) -> None:
    print("\n| model | T | component | layers | MiB kept per layer | MiB kept in all |\n|---|---|---|---|---|---|")
    for name in models:
        for T in lengths:
            torch.manual_seed(0)
            ids = torch.randint(0, s["vocab"], (s["batch"], T + 1))
            kept = saved_for_backward(build(name, s, T).train(), ids)
            for kind, (layers, nbytes) in kept.items():
                per = f"{nbytes / layers / 2**20:,.1f}" if layers else "-"
                print(f"| {name} | {T} | {kind} | {layers or '-'} | {per} | {nbytes / 2**20:,.1f} |")
            print(f"| {name} | {T} | **total** | | | {sum(b for _, b in kept.values()) / 2**20:,.1f} |", flush=True)


def error_line(text: str) -> str:
    """The last ``SomeError: …`` line of a child's traceback (torch.compile's end with advice, not the
    error), else its last line; at most 160 characters."""
    lines = text.splitlines()
    errors = [line for line in lines if re.match(r"[\w.]+(Error|Exception|Unsupported): ", line)]
    return (errors or lines)[-1][:160]


def run_child(name: str, T: int, args) -> dict:
    command = [sys.executable, "-m", "recipes.benchmarks.models", "--child", name, str(T), "--repeats", str(args.repeats),
               *(["--compile"] if args.compile_child else []), "--profile", str(args.profile)]
    for key in ("d_model", "layers", "vocab", "batch", "d_state", "chunk"):
        command += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    errors = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        for line in child.stderr:  # the child's stages as they end: a run stopped at a time limit shows where it was
            errors.append(line.rstrip("\n"))
            if line.startswith(PROGRESS):
                print(f"  {name} T={T}: {line.removeprefix(PROGRESS).strip()}", file=sys.stderr, flush=True)
        stdout = child.stdout.read()  # one line of JSON: nothing fills the pipe while stderr is read
    if child.returncode != 0:
        return {"error": error_line("\n".join(errors).strip() or stdout.strip() or "no output")}
    return json.loads(stdout.strip().splitlines()[-1])


def needed_rows(name: str, compiled: bool, rows: list[tuple[str, bool]], baseline: str | None) -> set[tuple[str, bool]]:
    """The rows of ``rows`` that the row ``(name, compiled)`` is printed with: its baseline's, and for an HF twin
    its zoo twin's (whose FLOPs it is counted with)."""
    needs = {(name, False) if compiled else (baseline_of(name, baseline), False), (name.removeprefix("hf-"), compiled)}
    return (needs & set(rows)) - {(name, compiled)}


def baseline_of(name: str, baseline: str | None = None) -> str:
    if baseline is not None:
        return baseline
    return TWINS.get(name, "llama" if name not in ("llama", *TWINS.values()) else name)


def over_trials(trials: list[dict]) -> dict:
    """One (model, T)'s result over its trials (fresh processes): the median step time and peak, and the
    fastest and slowest trial's time; the first error if any trial failed."""
    errors = [t for t in trials if "error" in t]
    if errors:
        return errors[0]
    seconds = [t["seconds"] for t in trials]
    return {**trials[0], "seconds": statistics.median(seconds), "peak_mib": statistics.median(t["peak_mib"] for t in trials),
            "fastest_s": min(seconds), "slowest_s": max(seconds), "trials": len(trials)}


def plot(results: dict, batch: int, path: Path) -> None:
    """Tokens/s and peak memory against T, one line per model, from ``{(name, T): result}``."""
    with png_figure(path, ncols=2, figsize=(11, 4.2)) as (_, (speed, memory)):
        for name in dict.fromkeys(name for name, _ in results):
            points = sorted((T, r) for (n, T), r in results.items() if n == name and "seconds" in r)
            if not points:
                continue
            lengths = [T for T, _ in points]
            tok_s = [batch * T / r["seconds"] for T, r in points]
            low = [batch * T / r.get("slowest_s", r["seconds"]) for T, r in points]
            high = [batch * T / r.get("fastest_s", r["seconds"]) for T, r in points]
            line, = speed.plot(lengths, tok_s, marker="o", label=name)
            speed.fill_between(lengths, low, high, color=line.get_color(), alpha=0.2)
            memory.plot(lengths, [r["peak_mib"] for _, r in points], marker="o", label=name)
        for axes, label in ((speed, "training tokens/s (band: fastest to slowest trial)"),
                            (memory, "peak memory of a step (MiB)")):
            axes.set_xscale("log", base=2)
            axes.set(xlabel="sequence length T", ylabel=label)
            axes.grid(alpha=0.3)
            axes.legend(fontsize=8)
        memory.set_yscale("log", base=2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.models",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=sorted(FAMILIES), help="a preset of the options below")
    parser.add_argument("--models", nargs="+", action="extend", choices=MODELS, help="default: every model")
    parser.add_argument("--lengths", type=positive_int, nargs="+", action="extend")
    parser.add_argument("--repeats", type=positive_int, help="timed steps per process (default 3)")
    parser.add_argument("--trials", type=positive_int, help="fresh processes per (model, T) (default 1)")
    parser.add_argument("--baseline", choices=MODELS, help="divide every row by this model (default: twin or llama)")
    parser.add_argument("--plot", type=Path, help="a PNG of tokens/s and peak memory against T")
    parser.add_argument("--compile", action="store_true", help="add a torch.compile(fullgraph=True) row per zoo model")
    parser.add_argument("--saved", action="store_true",
                        help="instead of timing: what a step keeps for the backward, per kind of mixer (zoo models)")
    for key in ("d-model", "layers", "vocab", "batch", "d-state", "chunk"):
        parser.add_argument(f"--{key}", type=positive_int)
    parser.add_argument("--profile", type=bounded(int, 0), default=0, metavar="N",
                        help="after the table, each row's N costliest ops in one more step (torch's profiler; self "
                             "time on the GPU, or the CPU)")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "T"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    defaults = dict(models=MODELS, repeats=3, trials=1, baseline=None)
    for key, value in {**defaults, **FAMILIES.get(args.family, {})}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.baseline is not None and args.baseline not in args.models:
        sys.exit(f"error: --baseline {args.baseline} is not one of --models ({' '.join(args.models)})")
    s = sizes(torch.cuda.is_available())
    for key in ("d_model", "layers", "vocab", "batch", "d_state", "chunk"):
        if getattr(args, key) is None:
            setattr(args, key, s[key])
        s[key] = getattr(args, key)
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]), s, args.repeats, args.compile, args.profile)))
        return
    lengths = args.lengths or s["lengths"]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads, fp32"
    print(f"# {device}, torch {torch.__version__}; d_model {s['d_model']}, {s['layers']} blocks, vocab {s['vocab']}, "
          f"batch {s['batch']}, SSD state {s['d_state']}, chunk {s['chunk']}"
          + ("" if args.saved else f"; median of {args.repeats} steps" +
             (f", median of {args.trials} processes (range: fastest to slowest)" if args.trials > 1 else "")))
    if args.saved:
        return print_saved([m for m in args.models if not m.startswith("hf-")], lengths, s)
    print("\n| model | params | T | tok/s | model TFLOP/s | MFU | peak MiB | baseline | × baseline tok/s | × baseline peak |"
          "\n|---|---|---|---|---|---|---|---|---|---|")
    rows = [(name, False) for name in args.models]
    if args.compile:
        rows += [(name, True) for name in args.models if not name.startswith("hf-")]
    measured, failed = {}, []
    for T in lengths:
        results, printed = {}, set()
        for name, compiled in rows:
            args.compile_child = compiled
            results[name, compiled] = over_trials([run_child(name, T, args) for _ in range(args.trials)])
            measured[name + (" (compiled)" if compiled else ""), T] = results[name, compiled]
            # each row as soon as what it is compared with is measured (its baseline, an HF twin's zoo twin), so a
            # run stopped at a time limit keeps every row it finished
            for key in rows:
                if key in results and key not in printed and needed_rows(*key, rows, args.baseline) <= results.keys():
                    printed.add(key)
                    print(table_row(*key, T, results[key], results, s["batch"], args.baseline), flush=True)
                    if "error" in results[key]:
                        failed.append(f"{key[0]}{' (compiled)' if key[1] else ''} at T={T}")
    for (label, T), result in measured.items():
        if result.get("profile"):
            print(f"\n### {label} at T={T}: one step's {args.profile} costliest ops\n\n```\n{result['profile']}```")
    if args.plot:
        plot(measured, s["batch"], args.plot)
        print(f"\nplot: {args.plot}")
    if failed:
        sys.exit(f"error: {len(failed)} row(s) failed: {', '.join(failed)}")


def table_row(name: str, compiled: bool, T: int, r: dict, results: dict, batch: int, baseline: str | None = None) -> str:
    label = name + (" (compiled)" if compiled else "")
    if "error" in r:
        return f"| {label} | - | {T} | failed: {r['error']} | | | | | | |"
    base_name = name if compiled else baseline_of(name, baseline)
    base = results.get((base_name, False), {})
    has_base = "seconds" in base and base is not r

    def ratio(key: str, invert: bool) -> str:
        return "-" if not has_base else f"{base[key] / r[key] if invert else r[key] / base[key]:.2f}"
    extra = f" (first step at T, compiling: {r['first_step_s']:.0f} s)" if compiled else ""
    spread = f" ({batch * T / r['slowest_s']:,.0f}–{batch * T / r['fastest_s']:,.0f})" if r.get("trials", 1) > 1 else ""
    flops = r.get("flops_per_token") or results.get((name.removeprefix("hf-"), compiled), {}).get("flops_per_token")
    achieved = training_flops(flops, batch * T / r["seconds"]) if flops else None
    tflops = f"{achieved / 1e12:.3f}" if achieved else "-"
    mfu = f"{achieved / r['peak_flops']:.1%}" if achieved and r.get("peak_flops") else "-"
    return (f"| {label} | {r['params'] / 1e6:.2f}M | {T} | {batch * T / r['seconds']:,.0f}{spread} | {tflops} | {mfu} | "
            f"{r['peak_mib']:,.0f} | {base_name if has_base else '-'} | {ratio('seconds', True)} | {ratio('peak_mib', False)}{extra} |")

if __name__ == "__main__":
    main()
