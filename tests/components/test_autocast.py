"""Every mixer of the catalogue under bf16 autocast on a CPU, as ``--trainer.precision bf16-mixed`` runs it: the
forward and backward run (Cheems' retrieved value once reached the attention in fp32 beside bf16 queries and keys,
and the run stopped), and the output stays within bf16 rounding of the fp32 forward."""

import pytest
import torch

from components.catalogue import SEQUENCE_MIXERS, STATE_MIXERS

MIXERS = {**SEQUENCE_MIXERS, **STATE_MIXERS}


@pytest.mark.parametrize("name", MIXERS)
def test_a_mixer_trains_under_bf16_autocast(name):
    torch.manual_seed(0)
    mixer = MIXERS[name](32)
    x = torch.randn(2, 11, 32, requires_grad=True)
    full = mixer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = mixer(x)
    half.float().square().sum().backward()
    grads = [p.grad for p in mixer.parameters() if p.requires_grad]
    assert torch.isfinite(half.float()).all() and torch.isfinite(x.grad).all()
    assert all(g is None or torch.isfinite(g).all() for g in grads)
    assert sum(g is not None and bool(g.abs().sum() > 0) for g in grads) > 0
    error = ((half.float() - full).norm() / full.norm()).item()
    assert error < 0.05, f"bf16 autocast output {error:.3f} from fp32 (relative)"
