"""Compile every Triton kernel for an NVIDIA GPU, without one, and report its resource use.

    python -m recipes.benchmarks.compile_check                          # sm_90 (H100), bf16
    python -m recipes.benchmarks.compile_check --arch 80 --dtypes bf16 fp16 fp32

The interpreter that runs the kernels on CPU in the tests checks their logic but never lowers them to
GPU code, so it misses what only the compiler sees: a ``tl.dot`` shape or dtype it rejects, a
construct it cannot lower, a tile that needs too much shared memory. This compiles each kernel, at
the launch configuration its wrapper uses on CUDA and the benchmark's shapes, with Triton's bundled
``ptxas``, and the pointer types a model launches under mixed precision (``bf16-mixed``, the GPU recipes'):
activations in ``--dtypes``, what a parameter makes in fp32 — the SSD's Δ, the retrieval experts' rows (attention
rounds its key bias to the activations' dtype). It prints registers per thread, spilled bytes (stack) and shared
memory per program. Spills are what the tile and warp choices in each ``launch_config`` were picked to avoid; how fast
the kernels run still needs a GPU (``python -m recipes.benchmarks.ops``). It also reads the compiled
TTIR for pointer arguments offset in 32 bits (column "32-bit bases"): offsets from a (batch, chunk,
head) base pass 2^31 on long batches. Exits 1 if a kernel fails to compile, needs more shared memory
than the architecture gives one program (it would fail at launch), or has a 32-bit base.

Needs ``TRITON_INTERPRET`` unset (with it, ``@triton.jit`` builds interpreter functions instead).
"""

import argparse
import inspect
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from recipes.argtypes import positive_int

DTYPES = ("bf16", "fp16", "fp32")


@dataclass
class Case:
    """One kernel at one configuration. ``data`` pointers take the input dtype; ``types`` fixes the
    rest (other pointers, float scalars); unnamed arguments are i32 scalars."""

    name: str
    kernel: object
    constexprs: dict
    options: dict  # num_warps, num_stages
    data: tuple[str, ...] = ()
    types: dict = field(default_factory=dict)


# Shared memory one program may use, KiB, by compute capability (CUDA programming guide, opt-in max).
SHARED_LIMIT_KIB = {80: 163, 86: 99, 87: 163, 89: 99, 90: 227}


def cases(dtype: str, head_dim: int = 64, ssd_shape: tuple[int, int] = (64, 128), arch: int = 90) -> list[Case]:
    """Every kernel at the launch configuration its wrapper picks on CUDA for ``dtype``, attention at
    ``head_dim`` and the SSD at ``ssd_shape = (P, N)``."""
    import torch

    from zoo_kernels.attention import decode
    from zoo_kernels.attention import triton as attention
    from zoo_kernels.gated_delta import triton as gated_delta
    from zoo_kernels.retrieval import triton as retrieval
    from zoo_kernels.ssd import triton as ssd

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    from zoo_kernels._backend import dot_precision

    dot = dot_precision()  # as the wrappers choose: torch's fp32 matmul precision
    out = []
    cfg = ssd.launch_config(*ssd_shape, cuda=True, dtype=torch_dtype, arch=arch)
    rows, P, N = cfg["rows"], cfg["P"], cfg["N"]
    warps = dict(num_warps=cfg["warps"], num_stages=cfg["stages"])
    group_rows, group_warps = cfg["group_rows"], dict(num_warps=cfg["group_warps"], num_stages=cfg["stages"])
    group_n = min(cfg["group_n"], N)  # the state's columns one per-group dC/dB program makes
    f32 = lambda *names: {n: "*fp32" for n in names}  # noqa: E731
    seg = {"SEG": "*i32"}
    # each scan kernel's tiles (launch_config's entry for it over the shared ones) and their grid order
    y, dx, dC, dB, pairs = (ssd._tiles(cfg, kernel) for kernel in ("y", "dx", "dC", "dB", "pairs"))
    y_warps, dx_warps, dC_warps, dB_warps, pair_warps = (dict(num_warps=t["warps"], num_stages=t["stages"])
                                                         for t in (y, dx, dC, dB, pairs))
    y_cols = min(P, y["p_block"] or P)
    group_order = dict(GROUP_ORDER=cfg["group_order"])
    ssd_cases = [
        Case("ssd _chunk_state (forward)", ssd._chunk_state, dict(DECAY_TO_END=True, SCALE_BY_DT=True, BLOCK_L=rows,
             BLOCK_P=P, BLOCK_N=N, DOT=dot), warps, ("X", "BM"), f32("DT", "LAM", "OUT")),
        Case("ssd _chunk_state (backward)", ssd._chunk_state, dict(DECAY_TO_END=False, SCALE_BY_DT=False,
             BLOCK_L=rows, BLOCK_P=P, BLOCK_N=N, DOT=dot), warps, ("X", "BM"), f32("DT", "LAM", "OUT")),
        Case("ssd _decayed_scan", ssd._decayed_scan, dict(HAS_H0=True, REVERSE=True, BLOCK=1024), {}, (),
             f32("U", "LAM", "H0", "OUT", "FINAL")),
        # the backward's dC and dB kernels also write the log-decay gradient's row dots (HAS_ROW_DOTS); the dx kernel
        # writes dx itself and ⟨x, d(dt·x)⟩ (DX_EPILOGUE)
        Case("ssd _chunk_scan (y)", ssd._chunk_scan, dict(TRANS_STATE=True, HAS_D=True, HAS_ROW_DOTS=False, HAS_QK=False,
             BLOCK_L=y["rows"], BLOCK_M=y["cols"], BLOCK_QK=N, BLOCK_V=y_cols, DOT=dot, ORDER=y["order"]),
             y_warps,
             ("Q", "K", "V", "W", "OUT"), f32("DT", "LAM", "STATES", "DSKIP", "QK", "ROW_DOTS")),
        Case("ssd _chunk_scan (dC)", ssd._chunk_scan, dict(TRANS_STATE=False, HAS_D=False, HAS_ROW_DOTS=True,
             HAS_QK=False, BLOCK_L=dC["rows"], BLOCK_M=dC["cols"], BLOCK_QK=P, BLOCK_V=N, DOT=dot, ORDER=dC["order"]),
             dC_warps,
             ("Q", "K", "V", "W"), f32("DT", "LAM", "STATES", "DSKIP", "QK", "OUT", "ROW_DOTS")),
        Case("ssd _chunk_scan_reverse (dx)", ssd._chunk_scan_reverse, dict(TRANS_STATE=True, SCALE_BY_DT=False,
             HAS_ROW_DOTS=False, DX_EPILOGUE=True, HAS_D=True, HAS_QK=False, BLOCK_M=dx["rows"], BLOCK_L=dx["cols"],
             BLOCK_QK=N, BLOCK_V=P, DOT=dot, ORDER=dx["order"]), dx_warps,
             ("Q", "K", "V", "W", "OUT"),
             f32("DT", "LAM", "DSTATES", "DSKIP", "QK", "ROW_DOTS", "X_DOTS", "D_DOTS")),
        Case("ssd _chunk_scan_reverse (dB)", ssd._chunk_scan_reverse, dict(TRANS_STATE=False, SCALE_BY_DT=True,
             HAS_ROW_DOTS=True, DX_EPILOGUE=False, HAS_D=False, HAS_QK=False, BLOCK_M=dB["rows"], BLOCK_L=dB["cols"],
             BLOCK_QK=P, BLOCK_V=N, DOT=dot, ORDER=dB["order"]), dB_warps, ("Q", "K", "V", "W"),
             f32("DT", "LAM", "DSTATES", "DSKIP", "QK", "OUT", "ROW_DOTS", "X_DOTS", "D_DOTS")),
        # launch_config's shared_scores (off by default, for the tile search): y and d(dt·x) read C·Bᵀ per group
        Case("ssd _chunk_scan (y, shared scores)", ssd._chunk_scan, dict(TRANS_STATE=True, HAS_D=True,
             HAS_ROW_DOTS=False, HAS_QK=True, BLOCK_L=y["rows"], BLOCK_M=y["cols"], BLOCK_QK=N, BLOCK_V=y_cols,
             DOT=dot, ORDER=y["order"]), y_warps, ("Q", "K", "V", "W", "OUT"),
             f32("DT", "LAM", "STATES", "DSKIP", "QK", "ROW_DOTS")),
        Case("ssd _chunk_scan_reverse (dx, shared scores)", ssd._chunk_scan_reverse, dict(TRANS_STATE=True,
             SCALE_BY_DT=False, HAS_ROW_DOTS=False, DX_EPILOGUE=True, HAS_D=True, HAS_QK=True, BLOCK_M=dx["rows"],
             BLOCK_L=dx["cols"], BLOCK_QK=N, BLOCK_V=P, DOT=dot, ORDER=dx["order"]), dx_warps,
             ("Q", "K", "V", "W", "OUT"),
             f32("DT", "LAM", "DSTATES", "DSKIP", "QK", "ROW_DOTS", "X_DOTS", "D_DOTS")),
        Case("ssd _log_decay_pairs", ssd._log_decay_pairs, dict(HAS_QK=False, BLOCK_L=pairs["rows"],
             BLOCK_M=pairs["cols"], BLOCK_P=P, BLOCK_N=N, DOT=dot, ORDER=pairs["order"]), pair_warps,
             ("X", "DY", "BM", "CM"),
             f32("DT", "LAM", "QK", "OUT")),
        # shared_scores' backward: the pair kernel reads C·Bᵀ; dC and dB are made per group (the heads' in-chunk
        # gradients summed by _group_pair_grads, their state terms inside _group_bc_grads)
        Case("ssd _log_decay_pairs (shared scores)", ssd._log_decay_pairs, dict(HAS_QK=True, BLOCK_L=pairs["rows"],
             BLOCK_M=pairs["cols"], BLOCK_P=P, BLOCK_N=N, DOT=dot, ORDER=pairs["order"]), pair_warps,
             ("X", "DY", "BM", "CM"),
             f32("DT", "LAM", "QK", "OUT")),
        Case("ssd _group_pair_grads", ssd._group_pair_grads, dict(BLOCK=cfg["group_block"], BLOCK_P=P, DOT=dot,
             **group_order),
             dict(num_warps=cfg["group_pair_warps"] or cfg["group_warps"]),  # (Triton's default stages, as launched)
             ("X", "DY", "OUT"), f32("DT", "LAM")),  # the pairs' gradients in B's and C's dtype
        Case("ssd _group_bc_grads (dC)", ssd._group_bc_grads, dict(SOURCE_ROWS=False, BLOCK_L=group_rows,
             BLOCK_M=group_rows, BLOCK_P=P, BLOCK_N=group_n,
             N_BLOCKS=-(-N // group_n), DOT=dot, **group_order), group_warps, ("Q", "W", "R", "OUT", "PAIRS"),
             f32("STATES", "DT", "LAM", "ROW_DOTS")),
        Case("ssd _group_bc_grads (dB)", ssd._group_bc_grads, dict(SOURCE_ROWS=True, BLOCK_L=group_rows,
             BLOCK_M=group_rows, BLOCK_P=P, BLOCK_N=group_n,
             N_BLOCKS=-(-N // group_n), DOT=dot, **group_order), group_warps, ("Q", "W", "R", "OUT", "PAIRS"),
             f32("STATES", "DT", "LAM", "ROW_DOTS")),
    ]
    if cfg["narrow_states"]:  # the chunks' states (the scan's OUT, the readers' STATES/DSTATES) in the inputs' dtype
        for case in ssd_cases:
            narrow = {"STATES", "DSTATES"} | ({"OUT"} if case.kernel is ssd._decayed_scan else set())
            case.data = (*case.data, *(n for n in narrow if n in case.types))
            case.types = {n: t for n, t in case.types.items() if n not in narrow}
    # Each SSD kernel without and with packed documents (their masks cost registers).
    for case in ssd_cases:
        for docs in (False, True):
            out.append(Case(case.name + (", documents" if docs else ""), case.kernel, {**case.constexprs, "HAS_DOCS": docs},
                            case.options, case.data, {**case.types, **seg}))
    out.append(Case("ssd _state_dots", ssd._state_dots, dict(BLOCK=1024), {},
                    ("E", "G") if cfg["narrow_states"] else (), f32("OUT") if cfg["narrow_states"] else f32("E", "G", "OUT")))
    out.append(Case("ssd _group_scores", ssd._group_scores, dict(BLOCK=cfg["scores_block"], BLOCK_N=N, DOT=dot,
                    **group_order),
                    dict(num_warps=cfg["scores_warps"]),
                    ("C", "B"), f32("QK")))
    # Attention with every option on (bias, padding, causal, window), then with packed
    # documents in place of the window (the two never meet: the host refuses documents with a window),
    # then a window without a bias (a sliding window: its loops start at the oldest kept key's block), then a bias alone.
    configs = attention.launch_config(head_dim, cuda=True, dtype=torch_dtype, dot=dot, arch=arch)
    # (the key bias in the activations' dtype: the wrapper rounds a model's fp32 one as the reference does)
    types = {"PAD": "*i8", "DOC": "*i32", "WIN_J": "*i32", "scale": "fp32", **f32("WIN_B", "LSE", "DELTA", "DBIAS")}
    data = ("Q", "K", "V", "BIAS", "O", "DO", "DQ", "DK", "DV")
    for label, window, bias, pad in (("", True, True, True), (", documents", False, True, True),
                                     (", sliding window", True, False, True), (", bias only", False, True, False)):
        # ", bias only": training's case, where the loops skip the masks of the key blocks every row sees whole
        flags = dict(HAS_BIAS=bias, HAS_PAD=pad, CAUSAL=True, HAS_WINDOW=window, HAS_DOCS=not window and pad, DOT=dot)
        for kernel, part in ((attention._forward, "forward"), (attention._backward_kv, "backward_kv"),
                             (attention._backward_q, "backward_q")):
            cfg = dict(configs[part])
            warps = {k: cfg.pop(k) for k in ("num_warps", "num_stages")}
            out.append(Case(f"attention {kernel.__name__}{label}", kernel, {**flags, **cfg}, warps, data, types))
    rows_q = configs["backward_q"]
    out.append(Case("attention _delta", attention._delta, dict(BLOCK_M=rows_q["BLOCK_M"], BLOCK_D=rows_q["BLOCK_D"]),
                    {"num_warps": 4}, ("O", "DO"), f32("DELTA")))
    # The decoding step's split-K kernel, GQA 4:1 (the group's query heads are its tile's rows, padded to 16).
    cfg = decode.decode_config(head_dim, 4, cuda=True, dtype=torch_dtype)
    warps = {k: cfg.pop(k) for k in ("num_warps", "num_stages")}
    types = {"PAD": "*i8", "WIN_J": "*i32", "scale": "fp32", **f32("WIN_B", "M_OUT", "L_OUT", "ACC_OUT")}
    for label, window, bias in (("", True, True), (", sliding window", True, False), (", no window", False, True)):
        flags = dict(HAS_BIAS=bias, HAS_PAD=True, HAS_WINDOW=window, DOT=dot, **cfg)
        out.append(Case(f"attention _decode_partials{label}", decode._decode_partials, flags, warps,
                        ("Q", "K", "V", "BIAS"), types))
    # Gather-and-mix at d_model 512 (the benchmark's width).
    cfg = retrieval.launch_config(512)
    warps = {k: cfg.pop(k) for k in ("num_warps", "num_stages")}
    # the experts' rows are parameters, fp32 under mixed precision; the routing weights are cast to the activations'
    types = {"e_ptr": "*i64", **f32("down_ptr", "up_ptr", "dw_ptr", "ddown_ptr", "dup_ptr")}
    data = ("x_ptr", "w_ptr", "y_ptr", "dy_ptr", "dx_ptr")
    for kernel in (retrieval._mix_forward, retrieval._mix_backward):
        out.append(Case(f"retrieval {kernel.__name__}", kernel, dict(ACT=0, **cfg), warps, data, types))
    # The gated delta rule's recurrence over chunks at Qwen3-Next's head dims (K = V = 128), chunk 64: every pointer
    # fp32 whatever the activations' dtype (the rule computes in fp32).
    cfg = gated_delta.launch_config(128, 128, cuda=True, arch=arch)
    warps = {k: cfg.pop(k) for k in ("num_warps", "num_stages")}
    tiles = dict(BLOCK_R=cfg["BLOCK_R"], BLOCK_K=cfg["BLOCK_K"], BLOCK_V=cfg["BLOCK_V"], DOT=dot)
    for kernel, flags in ((gated_delta._delta_chunks, dict(HAS_H0=True)), (gated_delta._delta_chunks_backward, {})):
        pointers = [n for n in inspect.signature(kernel.fn).parameters if n not in ("n_bh", "n_chunks", "L", "K", "V")
                    and n not in flags and n not in tiles]
        out.append(Case(f"gated_delta {kernel.__name__}", kernel, {**flags, **tiles}, warps, (), f32(*pointers)))
    return out


def shape_cases(dtype: str, head_dims: list[int], ssd_shapes: list[tuple[int, int]], only: str | None = None,
                arch: int = 90, ssd_documents_only: bool = False):
    """``(case, shape label)`` for each kernel at each shape asked for: the SSD's per (P, N), attention's per
    head dim, the retrieval and gated delta kernels once. ``ssd_documents_only``: each SSD kernel that has a packed-documents
    variant in that variant alone — the other is the same code less the document masks (no branch of the kernels
    runs without documents only), so it takes no more registers or shared memory: half the compile time for the
    checks of the largest sizes."""
    for i, shape in enumerate(ssd_shapes):
        at_shape = cases(dtype, ssd_shape=shape, arch=arch)
        twins = {case.name for case in at_shape}
        for case in at_shape:
            if ssd_documents_only and case.name + ", documents" in twins:
                continue
            if case.name.startswith("ssd") and only in (None, "ssd"):
                yield case, f"P={shape[0]} N={shape[1]}"
            elif case.name.startswith("retrieval") and i == 0 and only in (None, "retrieval"):
                yield case, "d=512"
            elif case.name.startswith("gated_delta") and i == 0 and only in (None, "gated_delta"):
                yield case, "K=128 V=128"
    for head_dim in head_dims:
        for case in cases(dtype, head_dim=head_dim, arch=arch):
            if case.name.startswith("attention") and only in (None, "attention"):
                yield case, f"D={head_dim}"


def compile_case(case: Case, dtype: str, arch: int, aligned: bool = False):
    """Compile for ``sm_{arch}``; returns the compiled kernel (``.asm`` holds ptx and cubin). ``aligned``: as a
    launch whose pointers are 16-byte aligned and whose integer arguments are multiples of 16 (the benchmarks'
    shapes), which Triton marks and compiles apart — vectorised loads and asynchronous copies, so fewer registers and
    more shared memory; without it, the variant a launch with odd strides or lengths gets."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(inspect.signature(case.kernel.fn).parameters)
    signature = {}
    for n in names:
        if n in case.constexprs:
            signature[n] = "constexpr"
        elif n in case.data:
            signature[n] = f"*{dtype}"
        else:
            signature[n] = case.types.get(n, "i32")
    constexprs = {(names.index(k),): v for k, v in case.constexprs.items()}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if signature[n] != "constexpr"}
    source = ASTSource(case.kernel, signature, constexprs=constexprs, attrs=attrs if aligned else None)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=case.options)


def resource_usage(cubin: bytes) -> dict:
    """``{"REG": …, "STACK": …}`` from the bundled cuobjdump, or {} where it is missing."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    for line in text.splitlines():
        if "REG:" in line:
            return {k: int(v) for k, v in (item.split(":") for item in line.split() if ":" in item) if v.isdigit()}
    return {}


# Pointers a kernel may offset in 32 bits: per-head vectors ``[H]``, indexed by a head number.
SMALL_POINTERS = {"DSKIP"}


def narrow_bases(case: Case, ttir: str) -> list[str]:
    """The kernel's pointer arguments first offset by a 32-bit integer in the compiled TTIR. Offsets
    from a (batch, chunk, head) base pass 2^31 on long batches (e.g. ``B·T·H·P`` at about 210K tokens
    at Mamba-2 2.7B's sizes), so each kernel moves its pointers there in 64 bits; a 32-bit one here is
    an overflow waiting for a long enough call."""
    args = set(inspect.signature(case.kernel.fn).parameters) - SMALL_POINTERS
    found = re.findall(r"tt\.addptr %(\w+), %\S+ : !tt\.ptr<\w+>, (i\d+)", ttir)
    return sorted({name for name, width in found if name in args and width != "i64"})


def failure_reason(error: Exception) -> str:
    """One line for a table cell: the error's class, and for a Triton ``CompilationError`` (``at L:C:``, the kernel's
    source, a caret, the cause) the place and the cause, which is its last line, not its first."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    where = f" {lines[0].rstrip(':')}" if len(lines) > 1 else ""
    return f"{type(error).__name__}{where}: {lines[-1][:200] if lines else ''}".replace("|", "/")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.compile_check",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=positive_int, default=90, help="compute capability ×10: 80 A100, 90 H100 (default)")
    parser.add_argument("--dtypes", nargs="+", default=["bf16"], choices=DTYPES)
    parser.add_argument("--head-dims", nargs="+", type=positive_int, default=[64],
                        help="attention head dims to compile for (default 64; the recipes use 64-128, models up to 256)")
    parser.add_argument("--ssd-shapes", nargs="+", default=["64x128"],
                        help="SSD (head dim P)x(state dim N) pairs (default 64x128; Mamba-2 also uses 128x128, 64x256)")
    parser.add_argument("--only", choices=("ssd", "attention", "retrieval", "gated_delta"), default=None, help="one op's kernels")
    parser.add_argument("--aligned", action="store_true",
                        help="compile the variant a launch at the benchmarks' shapes gets: pointers 16-byte aligned, "
                             "integer arguments multiples of 16 (default: the variant for odd strides and lengths)")
    parser.add_argument("--ssd-documents-only", action="store_true",
                        help="each SSD kernel only in its packed-documents variant, a superset of the other's code "
                             "(the checks of the largest sizes, in half the time)")
    parser.add_argument("--tf32", action="store_true", help="fp32 tiles in TF32, as after "
                        "torch.set_float32_matmul_precision('high') (default: full fp32, torch's default)")
    args = parser.parse_args(argv)
    if args.tf32:
        import torch

        torch.set_float32_matmul_precision("high")
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("recipes.benchmarks.compile_check: unset TRITON_INTERPRET (it makes @triton.jit build interpreter functions, "
              "which cannot be compiled)", file=sys.stderr)
        return 2
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's own default, stated to silence its warning
    print(f"Compiling for sm_{args.arch} (no GPU needed){', aligned arguments' if args.aligned else ''}:\n")
    try:
        ssd_shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.ssd_shapes]
        assert all(len(shape) == 2 for shape in ssd_shapes)
    except (ValueError, AssertionError):
        parser.error(f"--ssd-shapes takes PxN pairs such as 64x128; got {args.ssd_shapes}")
    print("| kernel | shape | dtype | warps, stages | registers | spilled bytes | shared KiB | 32-bit bases | compile s |\n"
          "|---|---|---|---|---|---|---|---|---|")
    limit = SHARED_LIMIT_KIB.get(args.arch)
    failures = 0
    for dtype in args.dtypes:
        for case, shape in shape_cases(dtype, args.head_dims, ssd_shapes, args.only, args.arch,
                                         args.ssd_documents_only):
            launch = f"{case.options.get('num_warps', 4)}, {case.options.get('num_stages', 3)}"
            start = time.perf_counter()
            try:
                compiled = compile_case(case, dtype, args.arch, args.aligned)
            except Exception as error:  # report every kernel, then fail
                failures += 1
                print(f"| {case.name} | {shape} | {dtype} | {launch} | FAILED: {failure_reason(error)} | | | | |")
                continue
            seconds = time.perf_counter() - start
            usage = resource_usage(compiled.asm["cubin"])
            shared = compiled.metadata.shared / 1024
            over = limit is not None and shared > limit
            narrow = narrow_bases(case, compiled.asm["ttir"])
            failures += over + bool(narrow)
            print(f"| {case.name} | {shape} | {dtype} | {launch} | {usage.get('REG', '-')} | {usage.get('STACK', '-')} "
                  f"| {shared:.0f}{f' > {limit}: TOO MUCH' if over else ''} "
                  f"| {', '.join(narrow) + ': NARROW' if narrow else 'none'} | {seconds:.1f} |")
    if failures:
        print(f"\n{failures} kernel(s) failed to compile, need more shared memory than sm_{args.arch} has, or offset "
              "a pointer argument in 32 bits", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
