"""CPU benchmark of the plain-torch paths: attention with a per-key bias against torch's SDPA, a sliding window
(by blocks of queries, and written out) against full causal attention, the SSD reference against the textbook four-operand einsum form, the MoE experts' grouped matmul
against one matmul per expert, the gated delta rule's chunked form against the SSD's at the same state size, CDMoE's
expert mix as its tables grow (dense against sparse table gradients), and the LM head's cross-entropy in chunks against the written-out logits; time and
peak memory.

    python -m recipes.benchmarks.ops_cpu                        # T = 1024 2048 4096, fwd+bwd, 5 repeats
    python -m recipes.benchmarks.ops_cpu --lengths 1024 --repeats 3
    python -m recipes.benchmarks.ops_cpu --ops window --lengths 1024 2048 4096 8192

Times are medians of ``--repeats`` forward+backward passes, each case interleaved with its baseline
in the same process. Peak memory is measured in a fresh process per case: the growth of its peak
resident set (``VmHWM``, reset through ``/proc/self/clear_refs``; Linux) over what it held after
building the inputs, so it counts every buffer the pass allocates, the saved activations included. A baseline whose
peak is under 1 MiB (the counters' noise) gets no memory ratio ("—"). Shapes: attention ``B=1, H=8, D=64``, causal,
bias ``[B, H, T]``, a quarter of one sequence left-padded in the padded rows; the sliding window ``WINDOW`` = 256
keys; SSD ``B=1, H=8, P=64,
N=64, G=1, chunk 64``; the gated delta rule the same heads and state (``K=N``, ``V=P``, unit keys, chunk 64); experts ``E=8, d=256, f=704`` (a SiLU MLP per expert), ``T`` rows (token ×
top-k assignments) spread over the experts at random; CDMoE's mix ``T`` tokens, ``d=256``, 4 heads of
16 experts each, drawn at random from a table of 1,024 (the baseline) or 65,536 experts; the loss ``T`` tokens,
``d=256``, a vocabulary of 4,096 (the English recipes').
"""

import argparse
import json
import statistics
import subprocess
import sys
from functools import partial

import torch
import torch.nn.functional as F
from einops import rearrange

from zoo_kernels.attention.reference import attention_masked, attention_reference
from zoo_kernels.grouped_matmul import grouped_matmul, grouped_matmul_reference
from zoo_kernels.linear_cross_entropy import linear_cross_entropy, linear_cross_entropy_reference
from zoo_kernels.retrieval.reference import expert_mix_reference
from zoo_kernels.gated_delta.reference import gated_delta_chunked
from zoo_kernels.ssd.reference import segment_sum, ssd_chunked
from recipes.argtypes import positive_int
from recipes.benchmarks.timing import interleaved_seconds, peak_growth_mib

H, D, P, N, CHUNK = 8, 64, 64, 64, 64
EXPERTS, D_MODEL, D_FF = 8, 256, 704
MIX_HEADS, MIX_TOP_K = 4, 16
VOCAB = 4096
WINDOW = 256


def expert_mix_sparse_grads(x, experts, weights, down, up):
    """:func:`expert_mix_reference` with sparse gradients for the tables (the alternative measured)."""
    M, H, k = experts.shape
    rows = F.embedding(experts, down, sparse=True)  # [M, H, k, d]
    coef = weights * F.silu(torch.einsum("mhkd,md->mhk", rows, x))  # [M, H, k]
    return F.embedding_bag(experts.reshape(M, H * k), up, per_sample_weights=coef.reshape(M, H * k),
                           mode="sum", sparse=True)  # [M, d]


def ssd_four_operand(x, dt, A, B, C, chunk_size):
    """The baseline: the chunked SSD as the Mamba-2 paper writes it, B and C broadcast to every head and
    the intra-chunk term one four-operand einsum (``T`` a multiple of ``chunk_size``, one group)."""
    X, Bh, Ch = (rearrange(t, "b (c l) ... -> b c l ...", l=chunk_size) for t in (x * dt[..., None], B, C))
    Bh, Ch = (t.expand(-1, -1, -1, x.shape[2], -1) for t in (Bh, Ch))  # [b, c, l, h, n]
    a = rearrange(dt * A, "b (c l) h -> b h c l", l=chunk_size)
    a_cum = torch.cumsum(a, dim=-1)
    y = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", Ch, Bh, torch.exp(segment_sum(a)), X)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bh, torch.exp(a_cum[..., -1:] - a_cum), X)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    states = torch.einsum("bhzc,bchpn->bzhpn", torch.exp(segment_sum(F.pad(a_cum[..., -1], (1, 0)))), states)[:, :-1]
    y = y + torch.einsum("bclhn,bchpn,bhcl->bclhp", Ch, states, torch.exp(a_cum))
    return rearrange(y, "b c l h p -> b (c l) h p")


def inputs(case: str, T: int) -> tuple:
    torch.manual_seed(0)
    g = dict(requires_grad=True)
    if case.startswith("ssd"):
        return (torch.randn(1, T, H, P, **g), F.softplus(torch.randn(1, T, H) - 3).requires_grad_(),
                (-torch.exp(torch.rand(H) * 2.7)).requires_grad_(), torch.randn(1, T, 1, N, **g), torch.randn(1, T, 1, N, **g))
    if case.startswith("gated delta"):
        return (torch.randn(1, T, H, N, **g), F.normalize(torch.randn(1, T, H, N), dim=-1).requires_grad_(),
                torch.randn(1, T, H, P, **g), (-F.softplus(torch.randn(1, T, H) - 3)).requires_grad_(),
                torch.sigmoid(torch.randn(1, T, H)).requires_grad_())
    if case.startswith("cdmoe"):
        n = 65536 if "65,536" in case else 1024
        return (torch.randn(T, D_MODEL, **g), torch.randint(0, n, (T, MIX_HEADS, MIX_TOP_K)),
                torch.rand(T, MIX_HEADS, MIX_TOP_K, **g), (torch.randn(n, D_MODEL) / D_MODEL ** 0.5).requires_grad_(),
                (torch.randn(n, D_MODEL) / D_MODEL ** 0.5).requires_grad_())
    if case.startswith("loss"):
        return (torch.randn(T, D_MODEL, **g), (torch.randn(VOCAB, D_MODEL) / D_MODEL ** 0.5).requires_grad_(),
                torch.randint(0, VOCAB, (T,)))
    if case.startswith("experts"):
        ids = torch.randint(0, EXPERTS, (T,)).sort().values
        ends = torch.searchsorted(ids, torch.arange(EXPERTS), right=True).to(torch.int32)  # [E]
        return (torch.randn(T, D_MODEL, **g), (torch.randn(EXPERTS, D_MODEL, D_FF) / D_MODEL ** 0.5).requires_grad_(),
                (torch.randn(EXPERTS, D_FF, D_MODEL) / D_FF ** 0.5).requires_grad_(), ends)
    q, k, v = (torch.randn(1, T, H, D, **g) for _ in range(3))
    bias = torch.randn(1, H, T).requires_grad_()
    padding = torch.zeros(1, T, dtype=torch.bool)
    padding[0, : T // 4] = True
    return q, k, v, bias, padding


def run(case: str, tensors: tuple) -> torch.Tensor:
    if case == "ssd reference":
        return ssd_chunked(*tensors, chunk_size=CHUNK)[0]
    if case == "ssd four-operand einsum":
        return ssd_four_operand(*tensors, chunk_size=CHUNK)
    if case == "gated delta rule (chunked)":
        return gated_delta_chunked(*tensors, scale=N ** -0.5, chunk_size=CHUNK)[0]
    if case.startswith("cdmoe"):
        if "sparse" in case:
            return expert_mix_sparse_grads(*tensors)
        return expert_mix_reference(*tensors, act=F.silu)
    if case.startswith("loss"):
        return (linear_cross_entropy if "chunks" in case else linear_cross_entropy_reference)(*tensors)
    if case.startswith("experts"):
        x, w_in, w_out, ends = tensors
        matmul = grouped_matmul_reference if "loop" in case else grouped_matmul
        return matmul(F.silu(matmul(x, w_in, ends)), w_out, ends)  # [T, d]
    q, k, v, bias, padding = tensors
    if case == "attention SDPA, no bias":
        return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
    if case == "attention bias (fused)":
        return attention_reference(q, k, v, bias=bias)
    if case == "attention bias + padding (fused)":
        return attention_reference(q, k, v, bias=bias, key_padding_mask=padding)
    if case == "sliding window (blocks)":
        return attention_reference(q, k, v, keep_window=WINDOW)
    if case == "sliding window (written-out mask)":
        return attention_masked(*(t.transpose(1, 2) for t in (q, k, v)), bias=None, causal=True,
                                key_padding_mask=None, keep_window=WINDOW, scale=D ** -0.5).transpose(1, 2)
    if case == "attention bias (written-out mask)":
        return attention_masked(*(t.transpose(1, 2) for t in (q, k, v)), bias=bias, causal=True,
                                key_padding_mask=None, keep_window=None, scale=D ** -0.5).transpose(1, 2)  # [B, T, H, D]
    raise ValueError(case)


def step(case: str, tensors: tuple) -> None:
    for t in tensors:
        if t.is_floating_point():
            t.grad = None
    run(case, tensors).sum().backward()


def peak_mib(case: str, T: int) -> float:
    """Peak memory of one fwd+bwd above the inputs, in a fresh process."""
    out = subprocess.run([sys.executable, "-m", "recipes.benchmarks.ops_cpu", "--peak-of", case, str(T)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["mib"]


def measure_peak(case: str, T: int) -> None:
    tensors = inputs(case, T)
    step(case, inputs(case, 64))  # load kernels and libraries before the baseline
    print(json.dumps({"mib": peak_growth_mib(lambda: step(case, tensors))}))


PEAK_FLOOR_MIB = 1.0  # a baseline peak below this gives no memory ratio

PAIRS = {
    "attention": ["attention SDPA, no bias", "attention bias (fused)", "attention bias + padding (fused)",
                  "attention bias (written-out mask)"],
    "window": ["attention SDPA, no bias", "sliding window (blocks)", "sliding window (written-out mask)"],
    "ssd": ["ssd four-operand einsum", "ssd reference"],
    "delta": ["ssd reference", "gated delta rule (chunked)"],
    "moe": ["experts, one matmul per expert (loop)", "experts, grouped_mm"],
    "cdmoe": ["cdmoe mix, 1,024 experts", "cdmoe mix, 65,536 experts", "cdmoe mix, 65,536 experts, sparse grads"],
    "loss": ["loss, head then cross-entropy (written-out logits)", "loss, head and cross-entropy in chunks"],
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.ops_cpu",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=positive_int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--ops", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--peak-of", nargs=2, metavar=("CASE", "T"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.peak_of:
        return measure_peak(args.peak_of[0], int(args.peak_of[1]))
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, fwd+bwd")
    for op in args.ops:
        print(f"\n| {op} | T | ms | × baseline | peak MiB | × baseline |\n|---|---|---|---|---|---|")
        for T in args.lengths:
            tensors = {case: inputs(case, T) for case in PAIRS[op]}
            times = interleaved_seconds({case: partial(step, case, tensors[case]) for case in PAIRS[op]}, args.repeats)
            base = PAIRS[op][0]
            ms = {case: statistics.median(v) * 1e3 for case, v in times.items()}
            peaks = {case: peak_mib(case, T) for case in PAIRS[op]}
            for case in PAIRS[op]:
                # below a MiB the resident counters' noise is the reading (timing.peak_growth_mib): no ratio to it
                peak_ratio = f"{peaks[case] / peaks[base]:.2f}" if peaks[base] >= PEAK_FLOOR_MIB else "—"
                print(f"| {case} | {T} | {ms[case]:.1f} | {ms[case] / ms[base]:.2f} | {peaks[case]:.1f} | {peak_ratio} |",
                      flush=True)


if __name__ == "__main__":
    main()
