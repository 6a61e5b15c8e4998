#!/usr/bin/env bash
# GPU call 2 of session 2026-11-27 (not part of the project): the new SSD backward and tiles on CUDA: tests, against
# mamba_ssm (with per-kernel profiles), the tile search again, then the training-step rows at T 2K/8K/16K.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
out=${OUT:-/tmp/out}
step() { local name=$1 limit=$2; shift 2; local s=$SECONDS
  timeout --kill-after=5 "$limit" "$@" > "$out/$name.log" 2>&1; local rc=$?
  echo "$name: exit $rc in $((SECONDS - s)) s" | tee -a "$out/summary.txt"; tail -n 4 "$out/$name.log"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$out/summary.txt" 2>&1
cat "$out/summary.txt"
step tests 80 python3 -m pytest -q -p no:cacheprovider -n 8 -rf tests/kernels/test_ssd_triton.py tests/kernels/test_gpu_precision.py tests/kernels/test_finite.py tests/kernels/test_ssd.py tests/kernels/test_documents.py
step ops_ssd 150 env PYTHONPATH="$PWD/.gpu_extra:$PWD" python3 -m recipes.benchmarks.ops --ops ssd --lengths 4096 16384 --repeats 10 --profile 12
step tiles 75 python3 -m recipes.benchmarks.ssd_tiles
step lengths 180 python3 -m recipes.benchmarks.models --models hybrid llama hf-llama --lengths 16384 8192 2048 --trials 1
cat "$out/summary.txt"
