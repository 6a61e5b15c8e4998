"""Kernel benchmark: each op's Triton kernel against its plain-torch reference and public baselines.

    python -m recipes.benchmarks.ops                         # on a CUDA GPU, bf16, the shapes of docs/kernels.md
    python -m recipes.benchmarks.ops --lengths 1024 2048 --ops attention
    python -m recipes.benchmarks.ops --device cpu            # references only (no Triton timing on CPU), CPU sizes
    python -m recipes.benchmarks.ops --ops ssd --lengths 4096 --profile 12   # + each row's 12 costliest kernels
    python -m recipes.benchmarks.ops --ops ssd --ssd-config winners.json     # the SSD on the tile search's winners

Prints one markdown table per op: forward and forward+backward milliseconds (median), TFLOP/s where
meaningful (forward+backward counted as 3.5 × the forward's matmul FLOPs for attention, FlashAttention's
convention, and 3 × for the SSD, whose backward makes twice its forward's), and peak memory above the inputs
(CUDA only). Optional baselines are used when installed and named when missing: mamba_ssm's
``mamba_chunk_scan_combined`` (SSD) and flash-dmattn (attention with a dynamic mask). Shapes: SSD ``B=4, H=32,
P=64, N=128, chunk 256`` with the ``D`` skip (Mamba-2's layer passes it); the gated delta rule ``B=4, H=16,
K=V=128, chunk 64`` (Qwen3-Next's head dims; flash-linear-attention's ``chunk_gated_delta_rule`` beside it when
installed); attention ``B=4, H=16, D=64, causal``
(``--head-dim``); CDMoE retrieval ``n_experts=65536, top_k=16, heads=4``; a decoding step's attention (``decode``: one query against ``T`` cached keys,
GQA 4:1, D 128, batch 1 and 2 × ``--batch``). Sizes follow the device: on a GPU, T = 1024 … 8192 and batch 4; on a CPU, T = 512 … 2048 and batch 1 (the dense-mask baseline alone is ``B·H·T²`` floats:
16 GiB at GPU sizes). The inputs' dtypes are those a model launches under mixed precision (``bf16-mixed``):
activations in the benchmark's dtype, what a model makes from fp32 parameters in fp32 (the SSD's Δ, attention's
key bias, the retrieval experts' rows). ``python -m recipes.benchmarks.ops_cpu`` is the CPU benchmark with peak memory.
"""

import argparse
import importlib.util
import json
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from recipes.argtypes import bounded, device, positive_int
from recipes.benchmarks.mamba_ssm_triton import MAMBA_MISSING
from recipes.benchmarks.timing import median_ms
from components.flops import gated_delta_flops_per_token
from zoo_kernels.attention import attention
from zoo_kernels.gated_delta import gated_delta_rule
from zoo_kernels.retrieval import expert_mix
from zoo_kernels.ssd import ssd_scan
from recipes.benchmarks.ssd import ssd_flops


def step(fn, inputs: list[torch.Tensor], backward: bool) -> None:
    """One call of ``fn()`` (and the backward of its sum), the inputs' gradients cleared first."""
    for t in inputs:
        t.grad = None
    out = fn()
    if backward:
        out.float().sum().backward()


def measure(fn, inputs: list[torch.Tensor], backward: bool, repeats: int) -> tuple[float, float]:
    """(median ms, peak MiB or nan) of ``fn()`` (+ backward of its sum)."""
    cuda = inputs[0].is_cuda
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()

    def timed():
        step(fn, inputs, backward)
        if cuda:
            torch.cuda.synchronize()
    ms = median_ms(timed, repeats)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else math.nan
    return ms, peak


def profile_tables(fn, inputs: list[torch.Tensor], rows: int) -> Iterator[str]:
    """One forward, then one forward+backward, of ``fn`` under torch's profiler (after the timed calls, so nothing is
    compiled or autotuned inside it): each one's ``rows`` costliest kernels by self time on the device (CUDA's, or the
    CPU's ops), as preformatted tables — where the time of a row goes, kernel by kernel."""
    cuda = inputs[0].is_cuda
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    for label, backward in (("forward", False), ("forward+backward", True)):
        with torch.profiler.profile(activities=activities) as profiler:
            step(fn, inputs, backward)
            if cuda:
                torch.cuda.synchronize()
        table = profiler.key_averages().table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                                              row_limit=rows, max_name_column_width=70)
        yield from [f"{label}:", "```", table.rstrip(), "```"]


def row(name: str, T: int, fwd, both, flops_fwd: float | None, passes: float = 3.5) -> str:
    """A table row; forward+backward TFLOP/s count ``passes`` forwards (3.5, FlashAttention's convention for
    attention, whose backward recomputes the scores; the SSD's backward is twice its forward: 3)."""
    tflops = lambda ms, mult: f"{flops_fwd * mult / (ms * 1e-3) / 1e12:.3g}" if flops_fwd else "-"  # noqa: E731
    peak = "-" if math.isnan(both[1]) else f"{both[1]:.0f}"
    return (f"| {name} | {T} | {fwd[0]:.2f} | {tflops(fwd[0], 1)} | {both[0]:.2f} | {tflops(both[0], passes)} | "
            f"{peak} |")


HEADER = "| kernel | T | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s | fwd+bwd peak MiB |\n|---|---|---|---|---|---|---|"


def bench_attention(lengths, device, dtype, repeats, use_triton, B: int, D: int = 64, profile: int = 0) -> Iterator[str]:
    H = 16
    yield from [f"Attention, B={B}, H={H}, D={D}, causal, {dtype}:", "", HEADER]
    for T in lengths:
        q, k, v = (torch.randn(B, T, H, D, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        bias = torch.randn(B, H, T, device=device, requires_grad=True)  # fp32, as a model's (made from fp32 parameters)
        flops = 4 * B * H * T * T * D / 2  # causal: half the scores
        dense_mask = torch.triu(torch.full((T, T), float("-inf"), device=device, dtype=dtype), 1)
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        cases = {
            "SDPA, no bias": (lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True), [q, k, v]),
            "SDPA, dense float bias mask": (
                lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=dense_mask + bias.to(dtype)[:, :, None, :]),
                [q, k, v, bias]),
            "reference (bias)": (lambda: attention(q, k, v, bias=bias, backend="reference"), [q, k, v, bias]),
        }
        if use_triton:
            cases["triton flash (bias)"] = (lambda: attention(q, k, v, bias=bias, backend="triton"), [q, k, v, bias])
        note = "flash-dmattn not installed: its row is skipped"
        if importlib.util.find_spec("flash_dmattn") is not None and use_triton:
            from flash_dmattn import flash_dmattn_func_auto

            dmattn = flash_dmattn_func_auto()  # its best backend: CUDA, else Triton, else Flex
            # its bias is [B, H, T|1, S]; the per-key bias broadcast over queries, as a view
            dm_bias = lambda: bias.to(dtype)[:, :, None, :].expand(B, H, T, T)  # noqa: E731
            cases["flash-dmattn (bias)"] = (lambda: dmattn(q, k, v, attn_bias=dm_bias(), is_causal=True), [q, k, v, bias])
            note = "flash-dmattn: flash_dmattn_func_auto(), bias passed as a broadcast [B, H, T, S] view"
        profiled = []
        for name, (fn, ins) in cases.items():
            try:
                yield row(name, T, measure(fn, ins, False, repeats), measure(fn, ins, True, repeats), flops)
                profiled.append((name, fn, ins))
            except Exception as error:  # an optional baseline that fails is named, not fatal
                yield f"| {name} | {T} | failed: {type(error).__name__}: {str(error).splitlines()[0][:120]} | | | | |"
        yield from profiled_rows(profiled, T, profile)
    yield from ["", note]


def profiled_rows(cases: list[tuple[str, object, list[torch.Tensor]]], T: int, rows: int) -> Iterator[str]:
    """:func:`profile_tables` of each ``(name, fn, inputs)`` at length ``T``, under a heading each; nothing when
    ``rows`` is 0."""
    for name, fn, ins in cases if rows else []:
        yield from ["", f"#### {name}, T={T}: the {rows} costliest kernels"]
        yield from profile_tables(fn, ins, rows)
    if rows and cases:
        yield ""


def bench_ssd(lengths, device, dtype, repeats, use_triton, B: int, profile: int = 0) -> Iterator[str]:
    H, P, N, L = 32, 64, 128, 256
    yield from [f"SSD, B={B}, H={H}, P={P}, N={N}, chunk {L}, with D, {dtype}:", "", HEADER]
    have_mamba = importlib.util.find_spec("mamba_ssm") is not None
    for T in lengths:
        x = torch.randn(B, T, H, P, device=device, dtype=dtype, requires_grad=True)
        dt = F.softplus(torch.randn(B, T, H, device=device) - 3).requires_grad_()  # fp32, as a model's (Δ's bias is)
        A = (-torch.exp(torch.rand(H, device=device))).requires_grad_()
        Bm, Cm = (torch.randn(B, T, 1, N, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
        D = torch.randn(H, device=device, requires_grad=True)  # the skip, as Mamba-2's layer passes it (fp32)
        ins = [x, dt, A, Bm, Cm, D]
        cases = {"reference (chunked torch)": lambda: ssd_scan(x, dt, A, Bm, Cm, chunk_size=L, D=D, backend="reference")}
        if use_triton:
            cases["triton"] = lambda: ssd_scan(x, dt, A, Bm, Cm, chunk_size=L, D=D, backend="triton")
            # the kernels alone, as mamba_ssm's row: without the passes that take out non-finite inputs
            cases["triton, check_finite=False"] = lambda: ssd_scan(x, dt, A, Bm, Cm, chunk_size=L, D=D, backend="triton",
                                                                   check_finite=False)
        if have_mamba:
            from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

            cases["mamba_ssm mamba_chunk_scan_combined"] = lambda: mamba_chunk_scan_combined(x, dt, A, Bm, Cm, chunk_size=L,
                                                                                             D=D)
        for name, fn in cases.items():
            yield row(name, T, measure(fn, ins, False, repeats), measure(fn, ins, True, repeats),
                      ssd_flops(B, T, H, P, N, L), passes=3)
        yield from profiled_rows([(name, fn, ins) for name, fn in cases.items()], T, profile)
    yield from [""] + ([] if have_mamba else [MAMBA_MISSING])


FLA_MISSING = ("flash-linear-attention not installed: its chunk_gated_delta_rule row is skipped "
               "(pip install flash-linear-attention)")


def bench_gated_delta(lengths, device, dtype, repeats, use_triton, B: int, profile: int = 0) -> Iterator[str]:
    """The gated delta rule: the plain-torch chunked form (a Python loop over chunks) against the Triton recurrence
    over chunks, with unit keys and the log-decays in fp32 (as the mixer gives them). TFLOP/s count the chunked form's
    products (``components.flops``); forward+backward as 3 forwards."""
    H, K, V, L = 16, 128, 128, 64
    yield from [f"Gated delta rule, B={B}, H={H}, K={K}, V={V}, chunk {L}, {dtype}:", "", HEADER]
    have_fla = importlib.util.find_spec("fla") is not None
    for T in lengths:
        q, v = (torch.randn(B, T, H, D, device=device, dtype=dtype, requires_grad=True) for D in (K, V))
        k = F.normalize(torch.randn(B, T, H, K, device=device), dim=-1).to(dtype).requires_grad_()
        g = (-F.softplus(torch.randn(B, T, H, device=device) - 2)).requires_grad_()  # fp32, from fp32 parameters
        beta = torch.sigmoid(torch.randn(B, T, H, device=device)).to(dtype).requires_grad_()
        ins = [q, k, v, g, beta]
        cases = {"reference (chunked torch)": lambda: gated_delta_rule(q, k, v, g, beta, chunk_size=L,
                                                                       backend="reference")}
        if use_triton:
            cases["triton (recurrence over chunks)"] = lambda: gated_delta_rule(q, k, v, g, beta, chunk_size=L,
                                                                                backend="triton")
            cases["triton, check_finite=False"] = lambda: gated_delta_rule(q, k, v, g, beta, chunk_size=L,
                                                                           backend="triton", check_finite=False)
        if have_fla and use_triton:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule

            cases["flash-linear-attention chunk_gated_delta_rule"] = lambda: chunk_gated_delta_rule(q, k, v, g, beta)[0]
        flops = gated_delta_flops_per_token(T, L, H, K, V) * T * B
        for name, fn in cases.items():
            yield row(name, T, measure(fn, ins, False, repeats), measure(fn, ins, True, repeats), flops, passes=3)
        yield from profiled_rows([(name, fn, ins) for name, fn in cases.items()], T, profile)
    yield from [""] + ([] if have_fla else [FLA_MISSING])


def bench_decode(lengths, device, dtype, repeats, use_triton, batches: list[int]) -> Iterator[str]:
    """One decoding step's attention: one query per sequence against ``S`` cached keys with a per-key bias and a
    padding mask, as :meth:`components.context.Context.attend` calls it — the route ``auto`` takes (torch's SDPA
    through the reference) against the split-K decoding kernel (``backend="triton"``), with and without a key window.
    GB/s: the bytes of the keys, values and bias read, over the time (a step is bound by reading the cache)."""
    H, H_kv, D = 16, 4, 128  # GQA 4:1 at the recipes' head size
    yield from [f"Attention, one decoding step (T = 1): H={H}, H_kv={H_kv}, D={D}, a bias and a padding mask, {dtype}:",
                "", "| route | batch | S | window | ms | GB/s | × auto | max abs diff to auto |", "|---|---|---|---|---|---|---|---|"]
    for B in batches:
        for S in lengths:
            q = torch.randn(B, 1, H, D, device=device, dtype=dtype)
            k, v = (torch.randn(B, S, H_kv, D, device=device, dtype=dtype).repeat_interleave(H // H_kv, dim=2)
                    for _ in range(2))  # [B, S, H, D]: the cache as the step reads it
            bias = torch.randn(B, H, S, device=device)  # fp32, as a model's
            padding = torch.zeros(B, S, dtype=torch.bool, device=device)
            padding[:, : S // 16] = True  # a left-padded prompt
            read = 2 * k.numel() * k.element_size() + bias.numel() * bias.element_size()
            for window in (None, S // 4):
                routes = {"auto (SDPA)": "auto"} | ({"triton forced": "triton"} if use_triton else {})
                times, outputs = {}, {}
                for name, backend in routes.items():
                    fn = lambda: attention(q, k, v, bias=bias, causal=True, key_padding_mask=padding,  # noqa: E731
                                           keep_window=window, backend=backend, check_finite=False)
                    times[name], outputs[name] = measure(fn, [q], False, repeats)[0], fn().float()
                for name, ms in times.items():
                    error = (outputs[name] - outputs["auto (SDPA)"]).abs().max().item()
                    yield (f"| {name} | {B} | {S} | {window or '-'} | {ms:.3f} | {read / (ms * 1e-3) / 1e9:.0f} | "
                           f"{times['auto (SDPA)'] / ms:.2f}× | {error:.1e} |")
    yield from ["", "`auto` sends one query to the reference (torch's SDPA); `triton forced` is the split-K decoding "
                    "kernel (zoo_kernels/attention/decode.py). Where it wins, auto should take it (docs/kernels.md)."]


def bench_retrieval(device, dtype, repeats, use_triton, tokens: int) -> Iterator[str]:
    N, H, k, d = 65536, 4, 16, 512
    x = torch.randn(tokens, d, device=device, dtype=dtype, requires_grad=True)
    down, up = (torch.randn(N, d, device=device, requires_grad=True) for _ in range(2))  # parameters: fp32, as a model's
    weights = torch.rand(tokens, H, k, device=device, dtype=dtype, requires_grad=True)
    experts = torch.randint(0, N, (tokens, H, k), device=device)
    yield from [f"CDMoE gather-and-mix, {tokens} tokens, d={d}, n_experts={N}, heads={H}, top_k={k}, {dtype}:", "", HEADER]
    backends = ["reference"] + (["triton"] if use_triton else [])
    for backend in backends:
        fn = lambda: expert_mix(x, experts, weights, down, up, backend=backend)  # noqa: E731
        ins = [x, weights, down, up]
        yield row(backend, tokens, measure(fn, ins, False, repeats), measure(fn, ins, True, repeats), None)


def ssd_config_over(path: str) -> dict:
    """The ``launch_config`` entries in the JSON file ``path`` (``ssd_tiles --write-winners`` writes one), laid over the
    SSD kernels' own choice (a kernel's entry key by key, ``zoo_kernels.ssd.triton.with_entries``) for the rest of this
    process — the tile search's winners timed in the same lease, before
    they are written into ``zoo_kernels.ssd.triton.launch_config``. Returns the entries; a missing file, a file that is
    not a JSON object, or a key ``launch_config`` does not have is an error that names it."""
    from zoo_kernels.ssd import triton as ssd_triton

    try:
        with open(path) as f:
            entries = json.load(f)
    except FileNotFoundError:
        raise SystemExit(f"error: --ssd-config {path}: no such file") from None
    except json.JSONDecodeError as bad:
        raise SystemExit(f"error: --ssd-config {path} is not JSON: {bad}") from None
    if not isinstance(entries, dict):
        raise SystemExit(f"error: --ssd-config {path} must hold a JSON object of launch_config entries")
    own = ssd_triton.launch_config
    unknown = sorted(set(entries) - set(own(64, 128, False)))
    if unknown:
        raise SystemExit(f"error: --ssd-config {path}: {unknown} are not launch_config entries")
    ssd_triton.launch_config = lambda *args, **kwargs: ssd_triton.with_entries(own(*args, **kwargs), entries)
    return entries


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.ops",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=device, default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--lengths", type=positive_int, nargs="+", action="extend",
                        help="default: 1024 … 8192 on a GPU, 512 … 2048 on a CPU")
    parser.add_argument("--batch", type=positive_int, help="default: 4 on a GPU, 1 on a CPU")
    parser.add_argument("--ops", nargs="+", default=["attention", "ssd", "gated_delta", "retrieval", "decode"],
                        choices=["attention", "ssd", "gated_delta", "retrieval", "decode"])
    parser.add_argument("--repeats", type=positive_int, default=10)
    parser.add_argument("--head-dim", type=positive_int, default=64, help="attention's head dim (default 64)")
    parser.add_argument("--profile", type=bounded(int, 0), default=0, metavar="N",
                        help="after each length's rows of attention, the SSD and the gated delta rule, one forward and one forward+backward "
                             "of every row under torch's profiler: its N costliest kernels (default 0: none)")
    parser.add_argument("--ssd-config", metavar="FILE",
                        help="a JSON object of launch_config entries laid over the SSD kernels' own choice "
                             "(recipes.benchmarks.ssd_tiles --write-winners writes one)")
    args = parser.parse_args(argv)
    cuda = args.device.startswith("cuda")
    lengths = args.lengths or ([1024, 2048, 4096, 8192] if cuda else [512, 1024, 2048])
    batch = args.batch or (4 if cuda else 1)
    dtype = torch.bfloat16 if cuda else torch.float32
    name = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"device: {name}, torch {torch.__version__}, {dtype}")
    if args.ssd_config:
        print(f"SSD launch_config entries from {args.ssd_config}, over its own: {ssd_config_over(args.ssd_config)}")
    if not cuda:
        print("No CUDA: Triton rows are skipped (the interpreter checks logic, not speed).")
    sections = {
        "attention": lambda: bench_attention(lengths, args.device, dtype, args.repeats, cuda, batch, args.head_dim,
                                             args.profile),
        "ssd": lambda: bench_ssd(lengths, args.device, dtype, args.repeats, cuda, batch, args.profile),
        "gated_delta": lambda: bench_gated_delta(lengths, args.device, dtype, args.repeats, cuda, batch, args.profile),
        "retrieval": lambda: bench_retrieval(args.device, dtype, args.repeats, cuda, tokens=4 * 1024 if cuda else 1024),
        "decode": lambda: bench_decode(lengths, args.device, dtype, args.repeats, cuda, sorted({1, batch * 2})),
    }
    for op in args.ops:
        print()
        for line in sections[op]():  # each row as it is measured: a run stopped at a time limit keeps what it timed
            print(line, flush=True)


if __name__ == "__main__":
    main()
