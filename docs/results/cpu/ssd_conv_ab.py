"""The SSD's causal conv on a CPU before and after 2026-11-27 in one process (docs/performance.md, "The SSD's causal
conv"): conv1d on [b, C, T] views (the old path, patched in) against K multiply-adds over [b, T, C], inside the SSD
mixer at the models benchmark's CPU sizes (d_model 256, state 64, chunk 64, batch 1, T 2048, fp32), forward+backward
with a dense cotangent, in interleaved rounds. A record of that measurement:  python docs/results/cpu/ssd_conv_ab.py"""

import statistics

import torch
import torch.nn.functional as F

from components import SSD
from components.sequence.ssd import SSD as SSDClass
from recipes.benchmarks.timing import interleaved_seconds


def old_conv(self, xbc, cache, document_ids=None):
    K = self.conv.kernel_size[0]
    full = torch.cat([xbc.new_zeros(xbc.shape[0], K - 1, xbc.shape[2]), xbc], dim=1)
    return F.conv1d(full.transpose(1, 2), self.conv.weight, self.conv.bias, groups=full.shape[2]).transpose(1, 2)


new_conv = SSDClass._causal_conv
torch.manual_seed(0)
mixer = SSD(256, d_state=64, chunk_size=64, conv=True, rope=False)
x = torch.randn(1, 2048, 256, requires_grad=True)
cotangent = torch.randn(1, 2048, 256)


def step(conv):
    def run():
        SSDClass._causal_conv = conv
        try:
            x.grad = None
            mixer.zero_grad(set_to_none=True)
            mixer(x).backward(cotangent)
        finally:
            SSDClass._causal_conv = new_conv
    return run


for run in range(3):
    t = interleaved_seconds({"conv1d": step(old_conv), "taps": step(new_conv)}, 30)
    old, new = (statistics.median(t[k]) * 1e3 for k in ("conv1d", "taps"))
    ratio = statistics.median(a / b for a, b in zip(t["conv1d"], t["taps"]))
    print(f"run {run}: SSD mixer fwd+bwd, conv1d {old:.2f} ms, taps {new:.2f} ms, per-round ratio {ratio:.2f}x")
