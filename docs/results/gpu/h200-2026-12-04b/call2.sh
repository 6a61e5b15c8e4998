# 2026-12-04 second lease, call 2: the CUDA tests the session changed, the autocast rule's spread over 16 seeds, then
# the models phase's steps but the two that ran on the last lease (finite) or need no rerun (ops_retrieval)
out=$1
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/.gpu_extra:$PWD" TRITON_CACHE_AUTOTUNING=1
{
  timeout 80 python3 -m pytest -q -p no:cacheprovider -n 8 -rf tests/zoo_kernels/test_half_interpreter.py \
      tests/zoo_kernels/test_ssd_triton.py tests/zoo_kernels/test_gpu_precision.py tests/zoo_kernels/test_attention.py 2>&1 | tail -30
  echo "tests rc ${PIPESTATUS[0]} at $SECONDS s"
  timeout 35 python3 .gpu_extra/alog_seeds.py 16 /tmp/alog.json 2>&1 | grep -v Warn
  echo "alog at $SECONDS s"
} > "$out/pre.log" 2>&1
mkdir -p "$out/m"
step() { local name=$1 limit=$2; shift 2; local start=$SECONDS
  timeout --kill-after=5 "$limit" "$@" > "$out/m/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - start)) s" | tee -a "$out/m/summary.txt"; tail -n 12 "$out/m/$name.log"; }
step gpu_decoding 60 python3 -m pytest -q -p no:cacheprovider -n 0 tests/components/test_gpu_decoding.py \
    tests/recipes/test_generate.py -k 'gpu or cuda'
step decode 120 python3 -m recipes.benchmarks.decode_hf --batches 1 8 --rounds 3
step models 110 python3 -m recipes.benchmarks.models --models llama hf-llama hybrid --lengths 4096 --trials 1 --profile 15
step ops_decode 30 python3 -m recipes.benchmarks.ops --ops decode --lengths 4096 16384 --repeats 20
