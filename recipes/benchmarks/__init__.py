"""Benchmarks: scripts that print a table, run from a source checkout (they are not installed with the
package). Every one times with :mod:`recipes.benchmarks.timing` — medians, interleaved rounds where cases
are compared, peak memory in a fresh process — and reports ratios against a baseline from the same run.

=====================================  ==========================================================
``python -m recipes.benchmarks.ops``        each kernel (Triton on CUDA) against its torch reference
``python -m recipes.benchmarks.ops_cpu``    the CPU paths of each op, with peak memory
``python -m recipes.benchmarks.ssd``        the SSD scan's chunk-size and recurrence trade-offs
``python -m recipes.benchmarks.state_mixers``  MLP and the MoE variants at equal parameters
``python -m recipes.benchmarks.models``     a training step of each named model (and the efficiency family)
``python -m recipes.benchmarks.decoding``   prefill and per-token decoding against context length
``python -m recipes.benchmarks.corpus``     tokenizing a large corpus and feeding training from it
``python -m recipes.benchmarks.evaluation`` zoo scoring against lm-evaluation-harness's own HF model
``python -m recipes.benchmarks.compile_check``  every Triton kernel compiled for a GPU, no GPU needed
=====================================  ==========================================================

docs/performance.md holds the measured tables and the commands that give them.
"""
