"""Every Triton kernel compiles for an H100 (sm_90) at the launch configuration its wrapper uses on
CUDA, in bf16 and fp32, with Triton's bundled ptxas — no GPU needed. The interpreter tests check the
kernels' logic; this checks what only the GPU compiler sees (dot shapes and dtypes, lowering, shared
memory per program). Beyond bf16 at the default sizes, each SSD kernel is compiled in its packed-documents variant
only (``--ssd-documents-only``): its code is the other's plus the document masks, so what fits and does not spill
there fits without them — and the suite's compile time is its largest share."""

import os
import subprocess
import sys

import pytest


def run_check(*args, interpret: bool = False, tmp_path=None):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    if tmp_path is not None:
        env["TRITON_CACHE_DIR"] = str(tmp_path)  # a cold cache: compile for real
    return subprocess.run([sys.executable, "-m", "recipes.benchmarks.compile_check", *args], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_every_kernel_compiles_for_sm90(dtype, tmp_path):
    """Every kernel in bf16; in fp32 each SSD kernel in its packed-documents variant, whose code holds the other's."""
    result = run_check("--arch", "90", "--dtypes", dtype, *(["--ssd-documents-only"] if dtype == "fp32" else []),
                       tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith(("| ssd", "| attention", "| retrieval"))]
    names = {row.split("|")[1].strip() for row in rows}
    if dtype == "fp32":  # 14 SSD kernels with documents, _state_dots and _group_scores, 16 attention, 2 retrieval
        assert len(rows) == 34 and "ssd _chunk_scan (y), documents" in names and "ssd _chunk_scan (y)" not in names
    else:
        assert {"ssd _chunk_scan (y)", "ssd _chunk_scan_reverse (dB)", "attention _backward_kv",
                "attention _backward_kv, documents", "retrieval _mix_backward", "ssd _chunk_scan (y), documents",
                "ssd _chunk_scan_reverse (dB), documents", "attention _forward, sliding window", "ssd _log_decay_pairs",
                "ssd _log_decay_pairs, documents", "ssd _chunk_scan (dC), documents", "ssd _state_dots",
                "ssd _group_scores", "ssd _chunk_scan_reverse (dx, shared scores), documents",
                "attention _decode_partials", "attention _decode_partials, sliding window",
                "attention _forward, bias only"} <= names
        assert len(rows) == 48  # 14 SSD kernels with and without documents, _state_dots and _group_scores, 13 + 3
        # attention, 2 retrieval
    for row in rows:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert cells[2] == dtype and "FAILED" not in row and "TOO MUCH" not in row, row
        assert cells[7] == "none", row  # every pointer argument moved to its (batch, head) base in 64 bits


def test_refuses_to_run_under_the_interpreter():
    result = run_check(interpret=True)
    assert result.returncode == 2 and "unset TRITON_INTERPRET" in result.stderr


def test_the_large_head_and_state_sizes_compile_without_spills_for_sm90(tmp_path):
    """The tile table: attention at head dim 128 and 256 (the decoding kernel too), the SSD at (P, N) = (64, 256)
    and (128, 128) in bf16 spill no register and fit an A100's and a consumer GPU's shared memory (99 KiB)."""
    result = run_check("--arch", "90", "--dtypes", "bf16", "--only", "attention", "--head-dims", "128", "256",
                       tmp_path=tmp_path)
    ssd = run_check("--arch", "90", "--dtypes", "bf16", "--only", "ssd", "--ssd-shapes", "64x256", "128x128",
                    "--ssd-documents-only", tmp_path=tmp_path)
    assert result.returncode == 0 and ssd.returncode == 0, result.stdout + result.stderr + ssd.stdout + ssd.stderr
    rows = [line for line in (result.stdout + ssd.stdout).splitlines() if line.startswith(("| ssd", "| attention"))]
    assert len(rows) == 2 * 16 + 2 * 16  # attention's 16 kernels, the SSD's 14 with documents and 2 more
    for row in rows:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert cells[5] == "0" and float(cells[6]) <= 99, row  # spilled bytes, shared KiB


def test_attention_compiles_without_spills_for_sm80(tmp_path):
    """Before Hopper the attention kernels take 32×64 tiles (launch_config's ``arch``): at 64×64, sm_80's code with
    packed documents spilled 8-16 bytes in the forward and 144 in dQ at head dim 64."""
    result = run_check("--arch", "80", "--dtypes", "bf16", "--only", "attention", "--head-dims", "64", "128",
                       tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| attention")]
    assert len(rows) == 2 * 16 and sum(", documents" in row for row in rows) == 2 * 3
    for row in rows:
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert cells[5] == "0" and float(cells[6]) <= 99, row  # spilled bytes, shared KiB


def test_the_variant_a_launch_at_the_benchmark_shapes_compiles_fits_sm90(tmp_path):
    """A launch whose pointers are 16-byte aligned and whose integer arguments are multiples of 16 (the benchmarks'
    shapes; Triton marks both) compiles a variant of its own, with vectorised loads and asynchronous copies: fewer
    registers and more shared memory than the unmarked variant the tests above compile (the SSD's ``y`` at P 64, N 128
    on Hopper's tiles: 162 registers and 72 KiB against 255 and 32, 2026-11-27). That variant is the one the GPU runs
    in training: every SSD kernel fits sm_90 there and spills nothing, but the per-head ``dC`` kernel, which Hopper's
    bf16 path replaces by the per-group one where heads share a group."""
    result = run_check("--arch", "90", "--dtypes", "bf16", "--only", "ssd", "--aligned", "--ssd-documents-only",
                       tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "aligned arguments" in result.stdout
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in result.stdout.splitlines() if line.startswith("| ssd")]
    assert len(rows) == 16
    for cells in rows:
        assert cells[7] == "none" and float(cells[6]) <= 227, cells  # 64-bit bases; sm_90's shared memory
        assert cells[5] == "0" or cells[0].startswith("ssd _chunk_scan (dC)"), cells


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_largest_sizes_fit_a_consumer_gpu_as_launched(dtype, tmp_path):
    """A consumer Ampere or Ada GPU (sm_86, sm_89) gives a program 99 KiB of shared memory, and the variant a launch at
    aligned shapes compiles takes more than the unmarked one. There, in fp32, attention's 32×32 tiles at head dim 256
    needed 100-132 KiB, the SSD's 64-row log-decay pair blocks 100 KiB at N 256 and its group scores 128 KiB — kernels
    that would not launch (2026-11-27). Every kernel fits at the largest head and state sizes (compile_check exits 1
    on a kernel over the limit; the unmarked variant, smaller, fit before and after)."""
    result = run_check("--arch", "86", "--dtypes", dtype, "--aligned", "--ssd-shapes", "64x256", "--head-dims", "256",
                       "--ssd-documents-only", tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith(("| ssd", "| attention"))]
    assert len(rows) == 16 + 16 and not any("TOO MUCH" in row for row in rows)
