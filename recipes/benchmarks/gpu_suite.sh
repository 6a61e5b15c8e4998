#!/usr/bin/env bash
# Every GPU measurement the docs wait for (docs/performance.md "On a GPU", docs/kernels.md "GPU targets"), in three
# phases (step limits summing to 765, 420 and 555 s; the steps have taken half their limits or less, so the first two
# fit one fifteen-minute lease of an H100 or H200 when the machine starts in under a minute, as it did on 2026-11-27),
# each step under its own time limit so a slow step costs only itself, and at most eight files written per phase:
#
#   bash recipes/benchmarks/gpu_suite.sh OUT_DIR kernels   # kernel tests on CUDA, the SSD's tile search at 16K
#                                                          # against mamba_ssm, the SSD against mamba_ssm with
#                                                          # per-kernel profiles, its tile search at 4K, the doctor,
#                                                          # attention ops
#   bash recipes/benchmarks/gpu_suite.sh OUT_DIR models    # CUDA-graph decoding test, decoding against HF, training steps, T=1, CDMoE,
#                                                          # the finite passes' cost
#   bash recipes/benchmarks/gpu_suite.sh OUT_DIR lengths   # training steps at T 2K, 8K, 16K (4K is in models), the SSD
#                                                          # against mamba_ssm at 2K and 8K, the eager decoding step's
#                                                          # launches, the gated delta rule's kernel at 2K-16K (555 s;
#                                                          # the next lease first)
#
# mamba_ssm's rows need its Triton files first on PYTHONPATH: `python -m recipes.benchmarks.mamba_ssm_triton` writes
# them to .gpu_extra/ (then `PYTHONPATH=$PWD/.gpu_extra bash recipes/benchmarks/gpu_suite.sh OUT kernels`). The zoo's
# command line needs jsonargparse[signatures], which this workplace's GPU image lacks (the `models` phase's CUDA
# `generate` test failed on it, 2026-12-04): pure Python, it travels in the same folder, `pip install --no-deps
# --target .gpu_extra jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0` (6 MB).
# Run from the repository root of a source checkout; nothing is installed (the zoo is put on PYTHONPATH, so a
# machine with torch, triton, lightning, transformers and pytest runs it as it is). Each step's whole output goes to
# OUT_DIR/<step>.log and its last lines to the terminal; OUT_DIR/summary.txt names the machine and lists every
# step's exit status and seconds (124: it ran out of time). The exit status is that of the first step that failed, else 0.
set -uo pipefail

out=${1:?usage: bash recipes/benchmarks/gpu_suite.sh OUT_DIR kernels|models|lengths}
phase=${2:?usage: bash recipes/benchmarks/gpu_suite.sh OUT_DIR kernels|models|lengths}
cd "$(dirname "$0")/../.."
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# Triton keeps its autotuners' choices on disk (Triton 3.4+), so mamba_ssm's autotuning (about 80 s) runs in the first
# step that imports it and not again in each later process. Its autotune keys leave out the sequence length, so in one
# process its first call's tuning serves every length anyway; with the cache, the first step's does.
export TRITON_CACHE_AUTOTUNING=1
status=0

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "== $name (at most ${limit} s): $*"
    local start=$SECONDS
    timeout --kill-after=10 "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc in $((SECONDS - start)) s" | tee -a "$out/summary.txt"
    tail -n 25 "$out/$name.log"
    [ "$status" -eq 0 ] && [ "$rc" -ne 0 ] && status=$rc
    return 0
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
    python3 -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__, '|',
        torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')"
} > "$out/summary.txt" 2>&1  # the machine first, then each step's exit status
cat "$out/summary.txt"

case "$phase" in
    kernels)
        # first what decides the SSD's launch_config at 16K, so a lease cut short still answers it: the CUDA tests
        # (test_gpu_precision.py among them; 446 tests in 60 s on 8 workers, an H200, 2026-12-04), then the kernels'
        # own tiles around the current ones (three rounds so far: 2026-11-27 and twice on 2026-12-04; the last put the
        # per-group kernels on all of N) — with mamba_ssm's row (its autotuning: about 80 s) in the same process, so
        # the winners' "together" line is the ratio the goal asks for; the winners' entries go to
        # OUT/ssd_winners.json where together they beat the current tiles
        step kernel_tests 100 python3 -m pytest -q -p no:cacheprovider -n 8 -rf tests/zoo_kernels
        step ssd_tiles16k 200 python3 -m recipes.benchmarks.ssd_tiles --length 16384 --sections y dx pair_tiles \
            group --write-winners "$out/ssd_winners.json"
        # the SSD against mamba_ssm's mamba_chunk_scan_combined at 4K and 16K — on those winners where there are any
        # (the log's first lines say which), else the current tiles — each row's 12 costliest kernels forward and
        # forward+backward (116-117 s on an H100 and an H200, 2026-11-27)
        winners=()
        [ -f "$out/ssd_winners.json" ] && winners=(--ssd-config "$out/ssd_winners.json")
        step ops_ssd 150 python3 -m recipes.benchmarks.ops --ops ssd --lengths 4096 16384 --repeats 10 --profile 12 \
            ${winners[@]+"${winners[@]}"}
        # the SSD's tile search at 4K (44 s on an H200, 2026-12-04: nothing there beat the tiles chosen at 16K)
        step ssd_tiles 150 python3 -m recipes.benchmarks.ssd_tiles --length 4096 --sections rows y dx pair_tiles group \
            order group_order --no-mamba
        # with mamba_ssm on PYTHONPATH its timing row autotunes first: the doctor ran past 60 s on an H200 (2026-11-27)
        step doctor 120 python3 -m zoo_kernels.doctor
        # one step each: a table prints when its op is done (the attention's search ran on 2026-11-26, docs/kernels.md)
        step ops_attention 45 python3 -m recipes.benchmarks.ops --ops attention --lengths 2048 4096 8192 16384 --repeats 5
        ;;
    models)
        step gpu_decoding 60 python3 -m pytest -q -p no:cacheprovider -n 0 tests/components/test_gpu_decoding.py \
            tests/recipes/test_generate.py -k 'gpu or cuda'
        step decode 130 python3 -m recipes.benchmarks.decode_hf --batches 1 8 --rounds 3
        # a fresh process per row (import, CUDA, kernels' compilation): 15-25 s each before its steps
        step models 110 python3 -m recipes.benchmarks.models --models llama hf-llama hybrid --lengths 4096 --trials 1 \
            --profile 15
        step ops_decode 30 python3 -m recipes.benchmarks.ops --ops decode --lengths 4096 16384 --repeats 20
        step ops_retrieval 30 python3 -m recipes.benchmarks.ops --ops retrieval --repeats 5
        # what the finite passes cost the SSD and attention (the default path) at 4K and 16K, interleaved rounds (the
        # kernels without D compile first)
        step finite 60 python3 -m recipes.benchmarks.finite --lengths 4096 16384
        ;;
    lengths)
        # the T 2K-16K rows (models measures 4K; 8K and 16K ran on an H200 on 2026-11-27 with the SSD of then, 2K was
        # cut by the time limit, so it goes first): nine fresh processes of 15-25 s before their steps; a row that runs
        # out of memory says so and the others go on
        step lengths 300 python3 -m recipes.benchmarks.models --models hybrid llama hf-llama --lengths 2048 8192 16384 \
            --trials 1
        # the SSD against mamba_ssm at the two lengths the kernels phase leaves out (its autotuning: about 80 s)
        step ops_ssd_lengths 150 python3 -m recipes.benchmarks.ops --ops ssd --lengths 2048 8192 --repeats 10
        # the eager decoding step's launches and host time against HF's, after its bookkeeping went from 13 ops a layer
        # to 5 (2026-12-04, counted on a CPU: 387 -> 323 a step; the eager step was 0.68x HF's on the H200)
        step decode_ops 60 python3 -m recipes.benchmarks.decode_ops --models llama --width 256 --device cuda \
            --dtype bf16 --rounds 5
        # the gated delta rule's Triton recurrence over chunks against its plain-torch loop (never timed on a GPU yet;
        # flash-linear-attention's row where it is installed)
        step ops_gated_delta 45 python3 -m recipes.benchmarks.ops --ops gated_delta --lengths 2048 8192 16384 --repeats 5
        ;;
    *)
        echo "unknown phase '$phase': kernels, models or lengths" >&2
        exit 2
        ;;
esac
exit "$status"
