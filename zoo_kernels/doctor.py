"""``python -m zoo_kernels.doctor``: check every Triton kernel on this machine before trusting it.

    python -m zoo_kernels.doctor                 # on a GPU: recipe shapes, bf16 and fp32; else the interpreter, tiny shapes
    python -m zoo_kernels.doctor --tf32          # fp32 dots in TF32 (torch.set_float32_matmul_precision("high"))
    python -m zoo_kernels.doctor --no-timing

For each kernel (``attention``, its decoding step, ``ssd_scan``, ``gated_delta_rule``, ``expert_mix``) and dtype it runs the Triton
kernel and the plain-torch reference on the same inputs — activations in that dtype, what a model makes from fp32
parameters in fp32, as mixed precision launches them (``KEPT_FP32``) — and compares both with the reference in
float64: the output and the gradient of every floating input (the decoding step: its output; it has no backward).
A kernel passes when its error is at most ``FACTOR`` × the
reference's own error in that dtype, plus a floor (flash-attention's rule: a kernel may round differently,
not worse). TF32 is taken where torch's fp32 matmuls take it (:func:`zoo_kernels._backend.dot_precision`), so the
reference rounds the same way and the rule holds either way.

Without a GPU the kernels run in Triton's numpy interpreter (``TRITON_INTERPRET=1``, set here before Triton is
imported; fp32 and fp16 only): a check of the kernels' logic at tiny shapes, what CI runs. On a GPU the shapes
are those of the recipes (head dims 64 and 128, SSD heads 64 × state 128) in bf16 and fp32, and a timing table
gives the forward + backward median of each kernel against its reference and torch's SDPA (and
``mamba_ssm``'s ``mamba_chunk_scan_combined`` and flash-linear-attention's ``chunk_gated_delta_rule`` when they are
installed).

Last, the table says which backend ``auto`` takes for each op here. A kernel that fails its check is refused
for the rest of the process (:func:`zoo_kernels._backend.refuse_kernel`): ``auto`` then takes the reference with a
warning that names the failed check. The exit status is 1 when any check failed.
"""

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

FACTOR = 2.5  # kernel error ≤ FACTOR × reference error in the same dtype + FLOOR[dtype]
FLOOR = {torch.float32: 1e-5, torch.float16: 1e-4, torch.bfloat16: 1e-3}
# The inputs a model makes from fp32 parameters: under mixed precision (bf16-mixed) they reach the kernels in fp32
# whatever the activations' dtype — the SSD's Δ (its bias), A and D, attention's key bias, the experts' rows, Gated
# DeltaNet's log-decays.
KEPT_FP32 = {"ssd_scan": {"dt", "A", "D"}, "attention": {"bias"}, "expert_mix": {"down", "up"},
             "gated_delta_rule": {"g"}}


def as_a_model_launches(op: str, inputs: dict, dtype: torch.dtype) -> dict:
    """``inputs`` in ``dtype``, those of :data:`KEPT_FP32` in fp32 (non-floating ones as they are)."""
    return {k: v.to(torch.float32 if k in KEPT_FP32.get(op, ()) else dtype)
            if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}


@dataclass
class Check:
    op: str
    shape: str
    dtype: torch.dtype
    worst: str  # the result (output or gradient) with the largest error ratio
    kernel_error: float
    reference_error: float
    ok: bool


def _results(fn: Callable, inputs: dict, seed: int = 1) -> list[torch.Tensor]:
    """Output and the gradient of each floating input of ``Σ ⟨out, w⟩`` (w fixed by ``seed``), in float64."""
    leaves = {k: (v.detach().clone().requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
              for k, v in inputs.items()}
    out = fn(**leaves)
    if not out.requires_grad:  # a forward-only kernel (the decoding step's): its output alone
        return [out.detach().double()]
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(out.device)
    floating = [v for v in leaves.values() if isinstance(v, torch.Tensor) and v.requires_grad]
    grads = torch.autograd.grad((out.double() * w).sum(), floating)
    return [t.detach().double() for t in (out, *grads)]


def check(op: str, shape: str, fn: Callable[..., torch.Tensor], inputs: dict, dtype: torch.dtype) -> Check:
    """``fn(backend=…, **inputs)`` by the Triton kernel in ``dtype`` (as a model launches it: :data:`KEPT_FP32`) against
    the reference on the same inputs, both measured against the reference in float64 on those (rounded) inputs."""
    rounded = as_a_model_launches(op, inputs, dtype)
    exact = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in rounded.items()}
    names = ["out", *[k for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]]
    want = _results(lambda **a: fn(backend="reference", **a), exact)
    got = _results(lambda **a: fn(backend="triton", **a), rounded)
    base = _results(lambda **a: fn(backend="reference", **a), rounded)
    rows = []
    for name, g, b, w in zip(names, got, base, want):
        scale = w.abs().max().clamp_min(1e-30)
        err, err_ref = ((g - w).abs().max() / scale).item(), ((b - w).abs().max() / scale).item()
        rows.append((err / (FACTOR * err_ref + FLOOR[dtype]), name, err, err_ref))  # passes at a ratio <= 1
    ratio, name, err, err_ref = max(rows)
    return Check(op, shape, dtype, name, err, err_ref, ok=ratio <= 1)


# ---- the cases: each op at the recipes' shapes (GPU) or tiny ones (interpreter) -------------------------------

def attention_case(cuda: bool, D: int, device: str) -> tuple[str, Callable, dict]:
    from zoo_kernels.attention import attention

    B, T, H, Hkv = (2, 1024, 8, 2) if cuda else (1, 19, 2, 1)
    g = torch.Generator().manual_seed(0)
    inputs = {"q": torch.randn(B, T, H, D, generator=g), "k": torch.randn(B, T, Hkv, D, generator=g),
              "v": torch.randn(B, T, Hkv, D, generator=g), "bias": torch.randn(B, H, T, generator=g)}
    inputs = {k: v.to(device) for k, v in inputs.items()}
    padding = torch.zeros(B, T, dtype=torch.bool, device=device)
    padding[0, : T // 5] = True  # left padding in the first row

    def fn(backend: str, **a) -> torch.Tensor:
        return attention(**a, causal=True, key_padding_mask=padding, backend=backend)

    return f"B{B} T{T} H{H}/{Hkv} D{D}, bias, padding", fn, inputs


def attention_decode_case(cuda: bool, D: int, device: str) -> tuple[str, Callable, dict]:
    """One decoding step (forward only, as decoding runs it): the Triton backend's split-K kernel."""
    from zoo_kernels.attention import attention

    B, S, H, Hkv = (8, 4096, 32, 8) if cuda else (2, 37, 4, 2)
    g = torch.Generator().manual_seed(0)
    inputs = {"q": torch.randn(B, 1, H, D, generator=g), "k": torch.randn(B, S, Hkv, D, generator=g),
              "v": torch.randn(B, S, Hkv, D, generator=g), "bias": torch.randn(B, H, S, generator=g)}
    inputs = {k: v.to(device) for k, v in inputs.items()}
    padding = torch.zeros(B, S, dtype=torch.bool, device=device)
    padding[0, : S // 5] = True

    def fn(backend: str, **a) -> torch.Tensor:
        with torch.no_grad():
            return attention(**a, causal=True, key_padding_mask=padding, keep_window=S // 4, backend=backend)

    return f"decode B{B} S{S} H{H}/{Hkv} D{D}, bias, padding, window {S // 4}", fn, inputs


def ssd_case(cuda: bool, P: int, N: int, device: str) -> tuple[str, Callable, dict]:
    from zoo_kernels.ssd import ssd_scan

    B, T, H, G, L = (2, 1024, 8, 1, 64) if cuda else (1, 21, 2, 1, 8)
    g = torch.Generator().manual_seed(0)
    inputs = {"x": torch.randn(B, T, H, P, generator=g),
              "dt": torch.nn.functional.softplus(torch.randn(B, T, H, generator=g) - 1.0),
              "A": -torch.exp(0.5 * torch.randn(H, generator=g)),
              "B": torch.randn(B, T, G, N, generator=g), "C": torch.randn(B, T, G, N, generator=g),
              "D": torch.randn(H, generator=g)}
    inputs = {k: v.to(device) for k, v in inputs.items()}

    def fn(backend: str, **a) -> torch.Tensor:
        return ssd_scan(a["x"], a["dt"], a["A"], a["B"], a["C"], chunk_size=L, D=a["D"], backend=backend)

    return f"B{B} T{T} H{H} P{P} N{N} chunk {L}", fn, inputs


def gated_delta_case(cuda: bool, device: str) -> tuple[str, Callable, dict]:
    """Qwen3-Next's head dims (K = V = 128) on a GPU; unit keys, as the mixer gives them."""
    from zoo_kernels.gated_delta import gated_delta_rule

    B, T, H, K, V, L = (2, 1024, 8, 128, 128, 64) if cuda else (1, 21, 2, 16, 16, 8)
    g = torch.Generator().manual_seed(0)
    inputs = {"q": torch.randn(B, T, H, K, generator=g),
              "k": torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=g), dim=-1),
              "v": torch.randn(B, T, H, V, generator=g),
              "g": -torch.nn.functional.softplus(torch.randn(B, T, H, generator=g) - 2.0),
              "beta": torch.sigmoid(torch.randn(B, T, H, generator=g))}
    inputs = {k: v.to(device) for k, v in inputs.items()}

    def fn(backend: str, **a) -> torch.Tensor:
        return gated_delta_rule(**a, chunk_size=L, backend=backend)

    return f"B{B} T{T} H{H} K{K} V{V} chunk {L}", fn, inputs


def expert_mix_case(cuda: bool, device: str) -> tuple[str, Callable, dict]:
    from zoo_kernels.retrieval import expert_mix

    M, d, N, H, k = (4096, 512, 4096, 1, 8) if cuda else (13, 16, 64, 2, 4)
    g = torch.Generator().manual_seed(0)
    experts = torch.randint(0, N, (M, H, k), generator=g).to(device)
    inputs = {"x": torch.randn(M, d, generator=g), "weights": torch.softmax(torch.randn(M, H, k, generator=g), -1),
              "down": torch.randn(N, d, generator=g) / d**0.5, "up": torch.randn(N, d, generator=g) / d**0.5}
    inputs = {k: v.to(device) for k, v in inputs.items()}

    def fn(backend: str, **a) -> torch.Tensor:
        return expert_mix(a["x"], experts, a["weights"], a["down"], a["up"], backend=backend)

    return f"M{M} d{d} N{N} H{H} k{k}", fn, inputs


def cases(cuda: bool, device: str) -> list[tuple[str, str, Callable, dict]]:
    heads = (64, 128) if cuda else (16,)
    ssd_sizes = ((64, 128),) if cuda else ((8, 8),)
    out = [("attention", *attention_case(cuda, D, device)) for D in heads]
    out += [("attention", *attention_decode_case(cuda, D, device)) for D in heads[-1:]]  # refused with attention's
    out += [("ssd_scan", *ssd_case(cuda, P, N, device)) for P, N in ssd_sizes]
    out.append(("gated_delta_rule", *gated_delta_case(cuda, device)))
    out.append(("expert_mix", *expert_mix_case(cuda, device)))
    return out


# ---- timing (a GPU only: the interpreter's speed says nothing) ------------------------------------------------

def median_ms(fn: Callable[[], object], repeats: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def forward_backward(fn: Callable, inputs: dict) -> Callable[[], None]:
    leaves = {k: (v.detach().clone().requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
              for k, v in inputs.items()}
    return lambda: fn(**leaves).float().sum().backward()


def timings(all_cases, dtype: torch.dtype) -> list[tuple[str, str, str, float]]:
    rows = []
    for op, shape, fn, inputs in all_cases:
        if shape.startswith("decode"):  # forward only: python -m recipes.benchmarks.ops --ops decode times it
            continue
        rounded = as_a_model_launches(op, inputs, dtype)
        for backend in ("triton", "reference"):
            rows.append((op, shape, backend, median_ms(forward_backward(lambda **a: fn(backend=backend, **a), rounded))))
        if op == "attention":  # torch's SDPA without the bias and padding: the floor a fused kernel sets
            sdpa = torch.nn.functional.scaled_dot_product_attention
            q, k, v = (rounded[n].transpose(1, 2) for n in ("q", "k", "v"))
            rows.append((op, shape, "torch SDPA (no bias)", median_ms(forward_backward(
                lambda q, k, v: sdpa(q, k, v, is_causal=True, enable_gqa=True), {"q": q, "k": k, "v": v}))))
        if op == "ssd_scan":
            try:
                from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
            except ImportError:
                continue
            x, dt, A, B, C = (rounded[n] for n in ("x", "dt", "A", "B", "C"))
            # its first call autotunes: 60-80 s on an H200 (2026-11-27) before the table can print
            print("zoo_kernels.doctor: timing mamba_ssm's mamba_chunk_scan_combined; its first call autotunes its kernels "
                  "(about a minute on a Hopper GPU)", file=sys.stderr, flush=True)
            rows.append((op, shape, "mamba_ssm", median_ms(forward_backward(
                lambda x, dt, B, C: mamba_chunk_scan_combined(x, dt, A.float(), B, C, chunk_size=64),
                {"x": x, "dt": dt, "B": B, "C": C}))))
        if op == "gated_delta_rule":
            try:
                from fla.ops.gated_delta_rule import chunk_gated_delta_rule
            except ImportError:
                continue
            rows.append((op, shape, "flash-linear-attention", median_ms(forward_backward(
                lambda **a: chunk_gated_delta_rule(**a)[0], rounded))))
    return rows


# ---- the report ----------------------------------------------------------------------------------------------

def auto_backends(device: str) -> dict[str, str]:
    from zoo_kernels._backend import resolve_backend

    sample = torch.zeros(1, device=device, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    return {op: resolve_backend("auto", sample, op=op, has_triton=True)
            for op in ("attention", "ssd_scan", "gated_delta_rule", "expert_mix")}


def run(*, timing: bool = True, out=None) -> list[Check]:
    """Check every kernel here (and time them on a GPU); print the tables to ``out`` (default stdout); refuse
    the kernels that fail."""
    out = out or sys.stdout
    from zoo_kernels._backend import dot_precision, refuse_kernel

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtypes = (torch.bfloat16, torch.float32) if cuda else (torch.float32, torch.float16)
    where = torch.cuda.get_device_name() if cuda else "CPU, Triton interpreter (tiny shapes)"
    print(f"zoo_kernels.doctor: {where}; torch {torch.__version__}; fp32 dots: {dot_precision()}\n", file=out)
    all_cases = cases(cuda, device)
    checks = []
    print("| kernel | shape | dtype | worst result | kernel error | reference error | check |\n|---|---|---|---|---|---|---|",
          file=out, flush=True)
    for op, shape, fn, inputs in all_cases:
        for dtype in dtypes:
            c = check(op, shape, fn, inputs, dtype)
            checks.append(c)
            verdict = "ok" if c.ok else f"FAIL (> {FACTOR} × reference + {FLOOR[dtype]:g})"
            print(f"| {op} | {shape} | {str(dtype).removeprefix('torch.')} | {c.worst} | {c.kernel_error:.2e} | "
                  f"{c.reference_error:.2e} | {verdict} |", file=out, flush=True)
            if not c.ok:
                refuse_kernel(op, f"zoo_kernels.doctor: {shape}, {dtype}: error {c.kernel_error:.2e} on {c.worst} against "
                                  f"{c.reference_error:.2e} for the reference")
    if timing and cuda:
        print("\n| kernel | shape | implementation | forward + backward ms (median, bf16) |\n|---|---|---|---|", file=out)
        for op, shape, impl, ms in timings(all_cases, torch.bfloat16):
            print(f"| {op} | {shape} | {impl} | {ms:.3f} |", file=out, flush=True)
    elif timing:
        print("\ntiming: none without a GPU (the interpreter's speed says nothing about the kernels)", file=out)
    chosen = auto_backends(device)
    print("\nbackend 'auto' here: " + ", ".join(f"{op} → {b}" for op, b in chosen.items()), file=out)
    if chosen["attention"] == "triton":
        print("  (attention: torch's fused SDPA instead for one query, for no bias, padding, window or documents, and for "
              "a bias at head dims above 64 — timed faster there; docs/kernels.md)", file=out)
    print(ssd_tiles_here(cuda), file=out)
    return checks


def ssd_tiles_here(cuda: bool) -> str:
    """The SSD kernels' launch configuration here at Mamba-2's head dim and state (P 64, N 128) in bf16 (fp32 without
    a GPU): tiles, whether the per-group products, narrow states and the forward's states kept for the backward are
    on, and the grids' orders (what varies fastest among the programs launched together)."""
    from zoo_kernels.ssd.triton import launch_config

    major, minor = torch.cuda.get_device_capability() if cuda else (0, 0)
    dtype = torch.bfloat16 if cuda else torch.float32
    c = launch_config(64, 128, cuda, dtype, 10 * major + minor)
    own_orders = "".join(f"{kernel}: {c[kernel]['order']}, " for kernel in ("y", "dx", "pairs") if "order" in c[kernel])
    return (f"SSD tiles here (P 64, N 128, {str(dtype).removeprefix('torch.')}): {c['rows']} rows, {c['warps']} warps, "
            f"{c['stages']} stages; per-group C·Bᵀ, dB, dC (shared_scores): {'on' if c['shared_scores'] else 'off'}; "
            f"states in the inputs' dtype (narrow_states): {'on' if c['narrow_states'] else 'off'}; "
            f"forward's states kept (keep_states): {'on' if c['keep_states'] else 'off'}; grid order: {c['order']} "
            f"({own_orders}per-group kernels: {c['group_order']})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo_kernels.doctor",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tf32", action="store_true", help='fp32 dots in TF32: torch.set_float32_matmul_precision("high")')
    parser.add_argument("--no-timing", dest="timing", action="store_false")
    args = parser.parse_args(argv)
    if args.tf32:
        torch.set_float32_matmul_precision("high")
    checks = run(timing=args.timing)
    failed = [c for c in checks if not c.ok]
    print(f"\n{len(checks) - len(failed)} of {len(checks)} checks passed" +
          ("" if not failed else "; the failed kernels are refused by 'auto' in this process"))
    return 1 if failed else 0


if __name__ == "__main__":
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
    sys.exit(main())
