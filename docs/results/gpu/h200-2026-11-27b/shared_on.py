"""Run a recipes.benchmarks module with launch_config's shared_scores on (not part of the project)."""
import runpy
import sys

from kernels.ssd import triton as t

original = t.launch_config
t.launch_config = lambda *a, **k: {**original(*a, **k), "shared_scores": True}
module = sys.argv[1]
sys.argv = [module, *sys.argv[2:]]
runpy.run_module(module, run_name="__main__")
