#!/usr/bin/env bash
# GPU call 2 of session 2026-11-27b (not part of the project): narrow_states and shared_scores A/B in one process each.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
out=${OUT:-/tmp/out}
step() { local name=$1 limit=$2; shift 2; local s=$SECONDS
  timeout --kill-after=5 "$limit" "$@" > "$out/$name.log" 2>&1; local rc=$?
  echo "$name: exit $rc in $((SECONDS - s)) s" | tee -a "$out/summary.txt"; tail -n 12 "$out/$name.log"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; } > "$out/summary.txt" 2>&1
step tests 80 python3 -m pytest -q -p no:cacheprovider -n 8 -rf tests/kernels/test_ssd_triton.py tests/kernels/test_gpu_precision.py tests/kernels/test_ssd.py
step tiles4k 50 python3 -m recipes.benchmarks.ssd_tiles --sections scores states --repeats 10
step tiles16k 50 python3 -m recipes.benchmarks.ssd_tiles --sections scores states --length 16384 --repeats 10
step shared_narrow4k 40 python3 .gpu_extra/shared_on.py recipes.benchmarks.ssd_tiles --sections states --repeats 10
step shared_narrow16k 40 python3 .gpu_extra/shared_on.py recipes.benchmarks.ssd_tiles --sections states --length 16384 --repeats 10
cat "$out/summary.txt"
