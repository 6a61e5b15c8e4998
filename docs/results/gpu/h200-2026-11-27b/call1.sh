#!/usr/bin/env bash
# GPU call of session 2026-11-27b (not part of the project): shared_scores' per-group backward on CUDA: tests, then
# shared on/off in one process (ssd_tiles --sections scores) at 4K and 16K, then ops with shared on against mamba_ssm.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
out=${OUT:-/tmp/out}
step() { local name=$1 limit=$2; shift 2; local s=$SECONDS
  timeout --kill-after=5 "$limit" "$@" > "$out/$name.log" 2>&1; local rc=$?
  echo "$name: exit $rc in $((SECONDS - s)) s" | tee -a "$out/summary.txt"; tail -n 12 "$out/$name.log"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$out/summary.txt" 2>&1
cat "$out/summary.txt"
step tests 90 python3 -m pytest -q -p no:cacheprovider -n 8 -rf tests/kernels/test_ssd_triton.py tests/kernels/test_gpu_precision.py tests/kernels/test_ssd.py tests/kernels/test_documents.py
step scores4k 60 python3 -m recipes.benchmarks.ssd_tiles --sections scores --repeats 10
step scores16k 75 python3 -m recipes.benchmarks.ssd_tiles --sections scores --length 16384 --repeats 10
step ops_shared 170 env PYTHONPATH="$PWD/.gpu_extra:$PWD" python3 .gpu_extra/shared_on.py recipes.benchmarks.ops --ops ssd --lengths 4096 16384 --repeats 10 --profile 10
cat "$out/summary.txt"
