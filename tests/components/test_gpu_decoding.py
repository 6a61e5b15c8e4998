"""GPU only: ``generate(compile=True)`` on CUDA runs each step as a CUDA graph (``mode="reduce-overhead"``).

What a CPU cannot show: that torch.compile keeps the step a CUDA graph (no "skipping cudagraphs" for inputs
written in place: the cache's entries are marked as fixed addresses), that replaying it — and recording it again
for a second generation's new cache — gives the eager tokens. Skipped without CUDA; the GPU suite runs it
(``bash recipes/benchmarks/gpu_suite.sh OUT models``).
"""

from functools import partial

import pytest
import torch
from torch._dynamo.utils import counters

from components import SSD, HybridLM, InnerFuncAttention, QCAttention
from components.sequence.token_shift import TokenShift

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MODELS = {
    # an SSD with its conv window and state, a token shift, GQA attention: every kind of entry the cache keeps
    "hybrid": ("SM TM AM", {"S": partial(SSD, d_state=16, head_dim=16, chunk_size=8, conv=True),
                            "T": TokenShift, "A": partial(QCAttention, n_heads=4, n_kv_heads=2)}),
    # a per-key mask bias in the cache and a key window
    "doge": ("IM IM", {"I": partial(InnerFuncAttention, n_heads=4, n_kv_heads=2, mask="content_exp", qk_norm=True,
                                    keep_window=6)}),
}


@pytest.mark.parametrize("name", MODELS)
def test_a_compiled_generation_on_a_gpu_replays_a_cuda_graph_with_the_eager_tokens(name):
    torch.manual_seed(0)
    pattern, mixers = MODELS[name]
    model = HybridLM(101, 64, pattern, mixers).cuda().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)  # wider logit margins: a near tie is not what this checks
    mask = torch.zeros(3, 9, dtype=torch.bool, device="cuda")
    mask[1, :2] = mask[2, :5] = True  # left padding
    prompt = torch.randint(1, 101, (3, 9), device="cuda").masked_fill(mask, 0)
    eager = model.generate(prompt, 16, padding_mask=mask)
    counters.clear()
    compiled = model.generate(prompt, 16, padding_mask=mask, compile=True)
    assert counters["inductor"]["cudagraph_skips"] == 0, "the step did not become a CUDA graph (see TORCH_LOGS=perf_hints)"
    # recorded once; each replay copies in only its non-static inputs: the new token (and position), never the cache
    copied = counters["inductor"]["cudagraph_recorded_non_static_inputs"]
    assert copied > 0, "no CUDA graph was recorded"
    assert copied <= 3, f"{copied} inputs copied into the graph before each replay: cache entries not marked as fixed"
    assert torch.equal(compiled, eager)
    # a second generation: a new cache at new addresses, so the graph is recorded again, not replayed on stale memory
    again = model.generate(prompt[:, 2:], 11, padding_mask=mask[:, 2:], compile=True)
    assert torch.equal(again, model.generate(prompt[:, 2:], 11, padding_mask=mask[:, 2:]))
    assert counters["inductor"]["cudagraph_skips"] == 0
