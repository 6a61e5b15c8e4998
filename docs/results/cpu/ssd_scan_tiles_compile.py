"""Registers and spills on sm_90 of the SSD's y, d(dt·x) and log-decay pair kernels at the tiles the search tries
(docs/kernels.md, "Each kernel's own tiles, and the heads innermost"), compiled without a GPU: bf16, P 64, N 128,
shared scores, no documents — the Hopper case the search times — each as the unmarked variant (odd strides or lengths)
and as the one a launch at the benchmarks' shapes compiles (``compile_check --aligned``: pointers 16-byte aligned,
integers multiples of 16). With mamba_ssm's Triton files on PYTHONPATH (docs/performance.md says which), its forward
kernel at each of its autotuning configurations too (unmarked and marked). A record of that compile:

    python docs/results/cpu/ssd_scan_tiles_compile.py        # TRITON_INTERPRET unset; about 2 minutes
"""

import importlib.util
import inspect
import os

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from zoo_kernels.ssd import triton as ssd
from recipes.benchmarks import compile_check, ssd_tiles

CASES = {"y": "ssd _chunk_scan (y, shared scores)", "dx": "ssd _chunk_scan_reverse (dx, shared scores)",
         "pairs": "ssd _log_decay_pairs (shared scores)"}


def ours(kernel: str, tiles: dict | None, aligned: bool) -> tuple[int, int, float]:
    """(registers, spilled bytes, shared KiB) of one kernel at ``tiles`` (None: launch_config's), compiled as a
    launch with 16-byte aligned pointers and integers that are multiples of 16 (``aligned``) or without those marks."""
    config = ssd.launch_config
    if tiles is not None:
        ssd.launch_config = lambda *a, **k: {**config(*a, **k), kernel: tiles}
    try:
        case = next(c for c in compile_check.cases("bf16", ssd_shape=(64, 128), arch=90) if c.name == CASES[kernel])
    finally:
        ssd.launch_config = config
    case.constexprs["HAS_DOCS"], case.types["SEG"] = False, "*i32"
    compiled = compile_check.compile_case(case, "bf16", 90, aligned)
    usage = compile_check.resource_usage(compiled.asm["cubin"])
    return usage.get("REG"), usage.get("STACK"), compiled.metadata.shared / 1024


def mamba_forward() -> None:
    """mamba_ssm's _chunk_scan_fwd_kernel at its configurations: CB fp32, x, C, states bf16, no z, D per head."""
    from mamba_ssm.ops.triton.ssd_chunk_scan import _chunk_scan_fwd_kernel as tuner

    names = list(inspect.signature(tuner.fn.fn).parameters)
    fixed = dict(IS_CAUSAL=True, HAS_D=True, D_HAS_HDIM=False, HAS_Z=False, HAS_SEQ_IDX=False, BLOCK_SIZE_DSTATE=128,
                 IS_TRITON_22=True)
    fp32 = {"cb_ptr", "dt_ptr", "dA_cumsum_ptr", "D_ptr"}
    print("\n| mamba_ssm _chunk_scan_fwd_kernel: M, N (head dim), K (columns) | warps | stages | registers | spilled "
          "bytes | shared KiB | aligned: registers | spilled bytes | shared KiB |\n|---|---|---|---|---|---|---|---|---|")
    for config in tuner.configs:
        constexprs = {**fixed, **config.kwargs}
        signature = {n: "constexpr" if n in constexprs else "*fp32" if n in fp32 else "*bf16" if n.endswith("_ptr")
                     else "i32" for n in names}
        cells = []
        for aligned in (False, True):
            # a launch folds the strides that are 1 (the innermost ones, and D's) into constants; ours take none
            ones = {n: 1 for n in names if aligned and n.startswith("stride_")
                    and n.endswith(("_hdim", "_dstate", "_csize", "_csize_k", "_D_head"))}
            marked = {**signature, **{n: "constexpr" for n in ones}}
            attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if marked[n] != "constexpr"}
            folded = {(names.index(k),): v for k, v in {**constexprs, **ones}.items()}
            source = ASTSource(tuner.fn, marked, constexprs=folded, attrs=attrs if aligned else None)
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                      options=dict(num_warps=config.num_warps, num_stages=config.num_stages))
            usage = compile_check.resource_usage(compiled.asm["cubin"])
            cells.append(f"{usage.get('REG')} | {usage.get('STACK')} | {compiled.metadata.shared / 1024:.0f}")
        sizes = ", ".join(str(config.kwargs[k]) for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"))
        print(f"| {sizes} | {config.num_warps} | {config.num_stages} | {' | '.join(cells)} |", flush=True)


def main() -> None:
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    for kernel, keys, candidates in (("y", ("rows", "cols", "warps", "stages", "p_block"), ssd_tiles.Y),
                                     ("dx", ("rows", "cols", "warps", "stages"), ssd_tiles.DX),
                                     ("pairs", ("rows", "cols", "warps", "stages"), ssd_tiles.PAIRS)):
        print(f"\n| {kernel}: {', '.join(keys)} | registers | spilled bytes | shared KiB | aligned: registers | "
              "spilled bytes | shared KiB |\n|---|---|---|---|---|---|---|")
        for values in [None, *candidates]:
            tiles = None if values is None else dict(zip(keys, values))
            cells = [f"{r} | {s} | {m:.0f}" for r, s, m in (ours(kernel, tiles, aligned) for aligned in (False, True))]
            label = "launch_config's" if values is None else ", ".join(map(str, values))
            print(f"| {label} | {' | '.join(cells)} |", flush=True)
    if importlib.util.find_spec("mamba_ssm") is not None:
        mamba_forward()


if __name__ == "__main__":
    main()
