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
    rows = [line for line in result.stdout.splitlines()
            if line.startswith(("| ssd", "| attention", "| retrieval", "| gated_delta"))]
    names = {row.split("|")[1].strip() for row in rows}
    assert {"gated_delta _delta_chunks", "gated_delta _delta_chunks_backward"} <= names
    if dtype == "fp32":  # 14 SSD kernels with documents, _state_dots and _group_scores, 16 attention, 2 retrieval,
        # 2 gated delta
        assert len(rows) == 36 and "ssd _chunk_scan (y), documents" in names and "ssd _chunk_scan (y)" not in names
    else:
        assert {"ssd _chunk_scan (y)", "ssd _chunk_scan_reverse (dB)", "attention _backward_kv",
                "attention _backward_kv, documents", "retrieval _mix_backward", "ssd _chunk_scan (y), documents",
                "ssd _chunk_scan_reverse (dB), documents", "attention _forward, sliding window", "ssd _log_decay_pairs",
                "ssd _log_decay_pairs, documents", "ssd _chunk_scan (dC), documents", "ssd _state_dots",
                "ssd _group_scores", "ssd _chunk_scan_reverse (dx, shared scores), documents",
                "attention _decode_partials", "attention _decode_partials, sliding window",
                "attention _forward, bias only"} <= names
        assert len(rows) == 50  # 14 SSD kernels with and without documents, _state_dots and _group_scores, 13 + 3
        # attention, 2 retrieval, 2 gated delta
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


TOY_KERNELS = '''import sys

import triton
import triton.language as tl

import recipes.benchmarks.compile_check as check


@triton.jit
def wide(X, OUT, stride, BLOCK: tl.constexpr):  # each program's base in 64 bits
    row = tl.program_id(0).to(tl.int64) * stride
    tl.store(OUT + row + tl.arange(0, BLOCK), tl.load(X + row + tl.arange(0, BLOCK)))


@triton.jit
def narrow(X, OUT, stride, BLOCK: tl.constexpr):  # in 32 bits: past 2^31 elements it wraps
    row = tl.program_id(0) * stride
    tl.store(OUT + row + tl.arange(0, BLOCK), tl.load(X + row + tl.arange(0, BLOCK)))


@triton.jit
def tiled(A, B, OUT, BLOCK: tl.constexpr):  # a dot: its tiles staged in shared memory
    offs = tl.arange(0, BLOCK)
    a = tl.load(A + offs[:, None] * BLOCK + offs[None, :])
    b = tl.load(B + offs[:, None] * BLOCK + offs[None, :])
    tl.store(OUT + offs[:, None] * BLOCK + offs[None, :], tl.dot(a, b))


CASES = {"wide": check.Case("toy wide", wide, dict(BLOCK=128), {"num_warps": 4}, ("X", "OUT")),
         "narrow": check.Case("toy narrow", narrow, dict(BLOCK=128), {"num_warps": 4}, ("X", "OUT")),
         "tiled": check.Case("toy tiled", tiled, dict(BLOCK=64), {"num_warps": 2}, ("A", "B"), {"OUT": "*fp32"}),
         "broken": check.Case("toy broken", tiled, dict(BLOCK=8), {"num_warps": 4}, ("A", "B"), {"OUT": "*fp32"})}
limit, *names = sys.argv[1:]
check.shape_cases = lambda *args, **kwargs: ((CASES[name], "toy") for name in names)
check.SHARED_LIMIT_KIB[90] = int(limit)
sys.exit(check.main(["--arch", "90"]))
'''


def test_a_kernel_that_fails_to_compile_overflows_shared_memory_or_offsets_in_32_bits_fails_the_check(tmp_path):
    """The check's three failures, each on a toy kernel built to show it (the bundled kernels show none, so the tests
    above never see a failing row): a ``tl.dot`` on 8-wide tiles does not compile (its row names the cause, the last
    line of Triton's message, not its first, ``at 5:58:``); a dot's 16 KiB of staged tiles exceed a limit set to 8;
    a program base ``program_id * stride`` in 32 bits is named. Exit 1 with the count; the clean kernel alone: 0."""
    (tmp_path / "toy_kernels.py").write_text(TOY_KERNELS)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join([os.getcwd(), *sys.path]))

    def check(limit: int, *names: str) -> tuple[int, dict[str, list[str]], str]:
        result = subprocess.run([sys.executable, str(tmp_path / "toy_kernels.py"), str(limit), *names],
                                capture_output=True, text=True, env=env, timeout=300)
        rows = [[c.strip() for c in line.split("|")[1:-1]] for line in result.stdout.splitlines()
                if line.startswith("| toy")]
        return result.returncode, {cells[0].removeprefix("toy "): cells for cells in rows}, result.stderr

    code, rows, err = check(8, "wide", "narrow", "tiled", "broken")
    assert code == 1 and "\n3 kernel(s) failed to compile, need more shared memory than sm_90 has" in err, err
    assert list(rows) == ["wide", "narrow", "tiled", "broken"]
    assert rows["wide"][6:8] == ["0", "none"] and int(rows["wide"][4]) > 0  # registers read from the cubin
    assert rows["narrow"][7] == "OUT, X: NARROW"
    assert rows["tiled"][6] == "16 > 8: TOO MUCH" and rows["tiled"][7] == "none"
    assert rows["broken"][4].startswith("FAILED: CompilationError at ") and rows["broken"][4].endswith("K >= 16")
    code, rows, err = check(16, "wide", "tiled")  # at the limit: fits
    assert code == 0 and err == "" and rows["tiled"][6] == "16", (rows, err)


def test_an_ssd_shape_that_is_not_p_by_n_is_named(monkeypatch, capsys):
    from recipes.benchmarks import compile_check

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    for shapes in (["64"], ["64x128", "64x128x2"], ["64xN"]):
        with pytest.raises(SystemExit) as info:
            compile_check.main(["--ssd-shapes", *shapes])
        assert info.value.code == 2
        assert f"--ssd-shapes takes PxN pairs such as 64x128; got {shapes}" in capsys.readouterr().err


def test_each_op_and_shape_is_asked_for_once():
    """``shape_cases``: the SSD's kernels at each (P, N), the retrieval and gated delta kernels once, attention's at
    each head dim;
    ``only`` one op; ``ssd_documents_only`` each SSD kernel that has a documents variant in it alone."""
    from recipes.benchmarks.compile_check import shape_cases

    every = [(case.name, shape) for case, shape in shape_cases("bf16", [64, 128], [(64, 128), (128, 128)])]
    assert len(every) == len(set(every)) == 2 * 30 + 2 + 2 + 2 * 16
    assert [shape for _, shape in every] == (["P=64 N=128"] * 30 + ["d=512"] * 2 + ["K=128 V=128"] * 2
                                             + ["P=128 N=128"] * 30 + ["D=64"] * 16 + ["D=128"] * 16)
    assert {name for name, _ in every if name.startswith("retrieval")} == {"retrieval _mix_forward",
                                                                           "retrieval _mix_backward"}
    documents = [case.name for case, _ in shape_cases("fp32", [64], [(64, 128)], only="ssd", ssd_documents_only=True)]
    assert len(documents) == 16 and "ssd _chunk_scan (y), documents" in documents
    assert "ssd _chunk_scan (y)" not in documents and {"ssd _state_dots", "ssd _group_scores"} <= set(documents)
    for only in ("attention", "retrieval", "gated_delta"):
        assert {case.name.split()[0] for case, _ in shape_cases("bf16", [64], [(64, 128)], only=only)} == {only}


def record_launches(monkeypatch, compiled) -> dict[int, list[tuple[dict, dict]]]:
    """Spy on the launches of each kernel the ``compiled`` cases name: ``{id(kernel): [(keyword arguments, with
    Triton's default warps and stages, {argument: dtype} of each tensor passed — a tensor passed again under another
    name once)]}``."""
    import inspect

    import torch

    launched: dict[int, list[tuple[dict, dict]]] = {}
    for kernel in {id(case.kernel): case.kernel for case in compiled}.values():
        def spy(*args, grid, warmup, _run=kernel.run, _key=id(kernel),
                _names=list(inspect.signature(kernel.fn).parameters), **kwargs):  # (the launch's own two apart)
            seen, dtypes = set(), {}
            for name, arg in zip(_names, args):
                if isinstance(arg, torch.Tensor):
                    if id(arg) not in seen:
                        dtypes[name] = arg.dtype
                    seen.add(id(arg))
            launched.setdefault(_key, []).append(({"num_warps": 4, "num_stages": 3, **kwargs}, dtypes))  # (defaults)
            return _run(*args, grid=grid, warmup=warmup, **kwargs)

        monkeypatch.setattr(kernel, "run", spy)
    return launched


def force_cuda_tables(monkeypatch, dtype, ssd: bool = True) -> None:
    """The wrappers' launch tables as on CUDA sm_90 for ``dtype``, whatever the inputs' device and dtype (the SSD's
    too, unless ``ssd`` is False; the gated delta rule's, whose kernels are fp32 whatever the dtype)."""
    from zoo_kernels.attention import decode
    from zoo_kernels.attention import triton as attention_triton
    from zoo_kernels.gated_delta import triton as gated_delta_triton
    from zoo_kernels.ssd import triton as ssd_triton

    attention_config, decode_config, ssd_config = (attention_triton.launch_config, decode.decode_config,
                                                   ssd_triton.launch_config)
    delta_config = gated_delta_triton.launch_config
    monkeypatch.setattr(gated_delta_triton, "launch_config", lambda K, V, cuda, arch=90: delta_config(K, V, True, 90))
    monkeypatch.setattr(attention_triton, "launch_config", lambda head_dim, cuda, _dtype, dot, arch: attention_config(
        head_dim, True, dtype, dot, 90))
    monkeypatch.setattr(decode, "decode_config", lambda head_dim, group, cuda, _dtype: decode_config(
        head_dim, group, True, dtype))
    if ssd:
        monkeypatch.setattr(ssd_triton, "launch_config", lambda P, N, cuda, _dtype, arch: ssd_config(P, N, True, dtype, 90))


def is_launch(case, kwargs: dict, dtypes: dict, inputs, switches: bool = True) -> bool:
    """Whether ``case`` compiles the variant of a launch (:func:`record_launches`): constexprs, warps and stages
    equal (the on/off switches aside unless ``switches``), each tensor typed as launched — ``inputs`` (the data's
    dtype) or the fp32/int type the case names."""
    import torch

    pointers = {"*fp32": torch.float32, "*i32": torch.int32, "*i8": torch.int8, "*i64": torch.int64}
    wanted = {k: v for k, v in {**case.constexprs, **case.options}.items() if switches or not isinstance(v, bool)}
    typed = {**{name: pointers.get(t) for name, t in case.types.items()}, **{name: inputs for name in case.data}}
    return (all(k in kwargs and kwargs[k] == v for k, v in wanted.items())
            and all(typed.get(name) == launched for name, launched in dtypes.items()))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # (fp16's masked scores)
@pytest.mark.parametrize("table", ["fp32", "bf16"])
def test_every_variant_compiled_is_one_the_wrappers_launch(table, monkeypatch):
    """The check builds each kernel's launch itself — its switches (``TRANS_STATE``, ``HAS_ROW_DOTS``, ``HAS_DOCS`` …),
    tiles, warps and pointer types, from each op's ``launch_config`` on CUDA — and a variant the wrappers never launch
    would be checked in place of one they do. Here the wrappers run forward and backward under the interpreter with
    CUDA's launch settings for ``table`` (sm_90) forced on (the bf16 table on fp16 inputs: the interpreter has no
    bf16), at the check's shapes (SSD P 32, N 64 here; head dim 32, GQA 4:1 for the decoding step; width 512 for the
    retrieval mix), over the options that set the switches (documents, D, an initial state, per-group scores on and
    off; attention's bias, padding, window and documents; the gated delta rule at K = V = 128 with an initial state),
    each kernel's launches recorded. Every case the check
    compiles must be one of them — constexprs, warps and stages equal, each tensor argument typed as launched (the
    inputs' dtype or the fp32/int one named; a placeholder, a tensor passed again, aside) — and no two cases alike."""
    pytest.importorskip("triton")
    import torch

    import torch.nn.functional as F

    from zoo_kernels.attention import attention
    from zoo_kernels.gated_delta import gated_delta_rule
    from zoo_kernels.retrieval import expert_mix
    from zoo_kernels.ssd import ssd_scan
    from zoo_kernels.ssd import triton as ssd_triton
    from recipes.benchmarks.compile_check import cases

    compiled = cases(table, head_dim=32, ssd_shape=(32, 64))  # (the kernels' tables take the same branch as at 64, 128)
    variants = {(id(case.kernel), frozenset({**case.constexprs, **case.options}.items())) for case in compiled}
    assert len(variants) == len(compiled), "two cases compile the same variant"
    launched = record_launches(monkeypatch, compiled)
    dtype, inputs = {"fp32": (torch.float32, torch.float32), "bf16": (torch.bfloat16, torch.float16)}[table]
    ssd_config = ssd_triton.launch_config
    force_cuda_tables(monkeypatch, dtype, ssd=False)
    randn = lambda *shape: torch.randn(*shape, dtype=inputs)  # noqa: E731

    torch.manual_seed(0)
    T, H, P, G, N = 40, 4, 32, 1, 64  # (shared scores pay where G·L fp32 fit in H·P of x's: 64 · 4 <= 128 · 2)
    for shared in (False, True):  # (on by default in bf16 on Hopper, off in fp32)
        monkeypatch.setattr(ssd_triton, "launch_config", lambda P, N, cuda, _dtype, arch, _s=shared: {
            **ssd_config(P, N, True, dtype, 90), "shared_scores": _s})
        for docs, with_state in ((False, True), (True, False)):
            x, B, C = randn(1, T, H, P), randn(1, T, G, N), randn(1, T, G, N)
            dt, D, h0 = torch.rand(1, T, H) + 0.1, torch.randn(H), torch.randn(1, H, P, N)  # (fp32, as a model's)
            leaves = [t.requires_grad_() for t in (x, B, C, dt, D, h0)]
            starts = torch.zeros(1, T, dtype=torch.bool)
            starts[0, [0, 13, 29]] = True
            y = ssd_scan(x, dt, -torch.rand(H) - 0.5, B, C, chunk_size=64, D=D,
                         initial_state=h0 if with_state else None, document_starts=starts if docs else None,
                         backend="triton", check_finite=False)
            torch.autograd.grad(y.float().square().sum(), leaves, allow_unused=True)
    S, heads, kv_heads, head_dim = 20, 4, 1, 32
    for bias, pad, window, docs in ((True, True, True, False), (True, True, False, True), (False, True, True, False),
                                    (True, False, False, False)):
        q = randn(1, S, heads, head_dim).requires_grad_()
        k, v = (randn(1, S, kv_heads, head_dim).requires_grad_() for _ in range(2))
        b = torch.randn(1, heads, S).requires_grad_() if bias else None  # (fp32, as a model's key bias)
        kwargs = dict(bias=b, key_padding_mask=torch.arange(S)[None] < S - 3 if pad else None,
                      keep_window=5 if window else None, document_ids=(torch.arange(S)[None] // 7) if docs else None)
        out = attention(q, k, v, backend="triton", **kwargs)
        torch.autograd.grad(out.float().square().sum(), [t for t in (q, k, v, b) if t is not None])
        with torch.no_grad():  # one query: the decoding step's kernel (which takes no documents)
            attention(q[:, -1:], k, v, backend="triton", causal=False, **{**kwargs, "document_ids": None})
    M, mix_heads, top, rows, width = 3, 2, 3, 20, 512  # the retrieval mixer's gather-and-mix
    x = randn(M, width).requires_grad_()
    down, up = (torch.randn(rows, width).requires_grad_() for _ in range(2))  # (fp32: a model's parameters)
    weights = torch.rand(M, mix_heads, top, dtype=inputs, requires_grad=True)
    y = expert_mix(x, torch.randint(0, rows, (M, mix_heads, top)), weights, down, up, act="silu", backend="triton")
    torch.autograd.grad(y.float().square().sum(), [x, weights, down, up])
    q, k, v = randn(1, T, H, 128), F.normalize(randn(1, T, H, 128).float(), dim=-1).to(inputs), randn(1, T, H, 128)
    g, beta, h0 = -torch.rand(1, T, H), torch.rand(1, T, H, dtype=inputs), torch.randn(1, H, 128, 128)
    leaves = [t.requires_grad_() for t in (q, k, v, g, beta, h0)]
    y = gated_delta_rule(*leaves[:5], initial_state=h0, backend="triton")  # the gated delta rule, K = V = 128
    torch.autograd.grad(y.float().square().sum(), leaves)

    missing = [f"{case.name}: {case.constexprs} {case.options} {case.data} {case.types}" for case in compiled
               if not any(is_launch(case, kwargs, dtypes, inputs) for kwargs, dtypes in launched.get(id(case.kernel), []))]
    assert not missing, "compiled, never launched:\n" + "\n".join(missing)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # (fp16's masked scores)
def test_every_launch_a_model_makes_under_mixed_precision_is_a_variant_compiled(monkeypatch):
    """The other way round, from the models: under mixed precision (``bf16-mixed``, the GPU recipes' precision), the
    activations reach the kernels in bf16 but what a parameter makes stays fp32 — the SSD's Δ (its bias is fp32), the
    key biases (from fp32 ``A``), the retrieval experts' rows — and a variant compiled with those pointers in bf16 is
    one no run launches. A hybrid (the SSD at P 32, N 64; Doge's attention with a key window and its exp-content bias,
    GQA 4:1; plain attention; Gated DeltaNet at Qwen3-Next's head dim 128) trains a step, with left padding too, and decodes two tokens; the SSD and plain attention
    train on a row of two packed documents; and CDMoE at width 512 mixes forward and back,
    under fp16 autocast (the interpreter has no bf16) with CUDA's sm_90 launch tables for bf16 forced on. Every
    kernel launch must be a variant the check compiles: tiles, warps, stages and pointer types equal. The on/off
    switches aside: the check compiles the variants with every option on (and the other way round is the test above)."""
    pytest.importorskip("triton")
    from functools import partial

    import torch

    from components import CDMoE, SSD, GatedDeltaNet, HybridLM, InnerFuncAttention, QCAttention
    from recipes.benchmarks.compile_check import cases

    compiled = cases("bf16", head_dim=32, ssd_shape=(32, 64))
    launched = record_launches(monkeypatch, compiled)
    force_cuda_tables(monkeypatch, torch.bfloat16)
    torch.manual_seed(0)
    mixers = {"S": partial(SSD, head_dim=32, d_state=64, chunk_size=64, d_skip=True, backend="triton"),
              "I": partial(InnerFuncAttention, n_heads=4, n_kv_heads=1, inner="linear", mask="content_exp",
                           keep_window=8, backend="triton"),
              "A": partial(QCAttention, n_heads=4, n_kv_heads=1, backend="triton"),
              "G": partial(GatedDeltaNet, n_heads=1, head_dim=128, chunk_size=64, backend="triton")}
    model = HybridLM(64, 128, "SM IM AM GM", mixers)
    moe = CDMoE(512, n_experts=64, n_heads=2, top_k=4, backend="triton")
    ids = torch.randint(0, 64, (1, 21))
    packed = HybridLM(64, 128, "SM AM", {name: mixers[name] for name in "SA"})  # (documents take no key window)
    documents = (torch.arange(21) >= 8).long()[None]  # two documents in the row
    padding = torch.arange(21)[None] < 4  # left padding
    with torch.autocast("cpu", dtype=torch.float16):
        model(ids).float().logsumexp(-1).sum().backward()
        model(ids, padding_mask=padding).float().logsumexp(-1).sum().backward()
        packed(ids, document_ids=documents).float().logsumexp(-1).sum().backward()
        model.eval()
        with torch.no_grad():
            model.generate(ids[:, :11], max_new_tokens=2)
        moe(torch.randn(1, 9, 512)).float().square().sum().backward()
    kernels = {id(case.kernel): case.kernel.fn.__name__ for case in compiled}
    assert launched.keys() == kernels.keys(), "the models launch every kernel the check compiles"
    named = ("HAS_DOCS", "HAS_PAD", "HAS_WINDOW", "HAS_BIAS")  # each switch seen on and off; the SSD's D on
    assert {(name, value) for name in named for value in (True, False)} | {("HAS_D", True)} <= {
        (name, value) for launches in launched.values() for kwargs, _ in launches for name, value in kwargs.items()}
    missing = [f"{kernels[key]}: {kwargs} {dtypes}" for key, launches in launched.items() for kwargs, dtypes in launches
               if not any(is_launch(case, kwargs, dtypes, torch.float16, switches=False)
                          for case in compiled if id(case.kernel) == key)]
    assert not missing, "launched by a model, not compiled:\n" + "\n".join(missing)


def test_a_failures_reason_fits_one_table_cell():
    from recipes.benchmarks.compile_check import failure_reason

    assert failure_reason(ValueError("no tile fits")) == "ValueError: no tile fits"
    assert failure_reason(RuntimeError("")) == "RuntimeError: "
    located = RuntimeError("at 3:4:\n    a = tl.dot(x, y)\n        ^\nshapes a|b differ\n")
    assert failure_reason(located) == "RuntimeError at 3:4: shapes a/b differ"  # (a "|" would split the row)


def test_tf32_sets_torchs_precision_that_the_cases_dots_follow(monkeypatch):
    """``--tf32`` compiles the fp32 tiles as a run after ``torch.set_float32_matmul_precision('high')`` launches them
    (it is set before the interpreter's refusal, which keeps this test from compiling)."""
    import torch

    from recipes.benchmarks import compile_check

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    before = torch.get_float32_matmul_precision()
    try:
        assert {case.constexprs.get("DOT") for case in compile_check.cases("fp32")} == {"ieee", None}
        assert compile_check.main(["--tf32"]) == 2
        assert torch.get_float32_matmul_precision() == "high"
        assert {case.constexprs.get("DOT") for case in compile_check.cases("fp32")} == {"tf32", None}
    finally:
        torch.set_float32_matmul_precision(before)


def test_without_triton_s_cuobjdump_the_resources_are_unknown_not_an_error(tmp_path, monkeypatch):
    triton = pytest.importorskip("triton")
    from recipes.benchmarks.compile_check import resource_usage

    monkeypatch.setattr(triton, "__file__", str(tmp_path / "triton" / "__init__.py"))  # no backends/nvidia/bin there
    assert resource_usage(b"\x7fELF") == {}
