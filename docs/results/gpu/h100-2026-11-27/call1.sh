#!/usr/bin/env bash
# GPU call 1 of session 2026-11-27 (not part of the project): SSD per-kernel profile against mamba_ssm, the
# shared-scores patch, the SSD tile search.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
out=${OUT:-/tmp/out}
step() { local name=$1 limit=$2; shift 2; local s=$SECONDS
  timeout --kill-after=5 "$limit" "$@" > "$out/$name.log" 2>&1; local rc=$?
  echo "$name: exit $rc in $((SECONDS - s)) s" | tee -a "$out/summary.txt"; tail -n 3 "$out/$name.log"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$out/summary.txt" 2>&1
cat "$out/summary.txt"
step ops_ssd 150 env PYTHONPATH="$PWD/.gpu_extra:$PWD" python3 -m recipes.benchmarks.ops --ops ssd --lengths 4096 --repeats 10 --profile 14
rm -rf /tmp/p && mkdir /tmp/p && cp -r kernels recipes components /tmp/p/ && cp .gpu_extra/patched/kernels/ssd/triton.py /tmp/p/kernels/ssd/triton.py
step patched 60 env -C /tmp/p PYTHONPATH=/tmp/p python3 -m recipes.benchmarks.ops --ops ssd --lengths 4096 --repeats 10 --profile 8
step tiles 185 python3 -m recipes.benchmarks.ssd_tiles
cat "$out/summary.txt"
