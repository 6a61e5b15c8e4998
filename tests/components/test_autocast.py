"""Every mixer of the catalogue under bf16 autocast on a CPU, as ``--trainer.precision bf16-mixed`` runs it: the
forward and backward run (Cheems' retrieved value once reached the attention in fp32 beside bf16 queries and keys,
and the run stopped), and the output stays within bf16 rounding of the fp32 forward. And in float64
(``--trainer.precision 64-true``, or a user's gradcheck of a model holding their own component): the analytic
gradients are the finite differences', so no path from input to output rounds to a narrower dtype (the rotary
angles, a constant of the input, are fp32 as in Hugging Face's models)."""

import copy

import pytest
import torch

from components import CDMoE, TopKRouter
from components.catalogue import SEQUENCE_MIXERS, STATE_MIXERS
from zoo_kernels.retrieval import product_key_topk

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


@pytest.mark.parametrize("name", MIXERS)
def test_a_mixer_in_float64_passes_gradcheck_on_its_output_and_auxiliary_loss(name):
    """The routers once took their softmax in fp32 whatever the model's dtype: a float64 mixture's gates carried
    fp32 rounding, and every mixture failed gradcheck. (Top-k routing is piecewise smooth: the random input sits
    away from a tie, so a step of 1e-6 does not change the selection.)"""
    torch.manual_seed(0)
    mixer = MIXERS[name](32).double()
    x = torch.randn(1, 6, 32, dtype=torch.float64, requires_grad=True)

    def outputs(x):
        y = mixer(x)
        aux = getattr(mixer, "aux_loss", None)
        return (y,) if aux is None else (y, aux)

    assert outputs(x)[0].dtype == torch.float64
    assert torch.autograd.gradcheck(outputs, (x,), eps=1e-6, atol=1e-6, rtol=1e-5)


def top_k_router_choice(d_model: int):
    return TopKRouter(d_model, n_experts=16, top_k=2), lambda router, x: router(x).experts  # [M, 2]


def cdmoe_choice(d_model: int, key_dim: int | None):
    mixer = CDMoE(d_model, n_experts=256, n_heads=2, top_k=4, key_dim=key_dim)
    return mixer, lambda mixer, x: product_key_topk(*mixer.half_scores(x), mixer.top_k)[1]  # [M, 2, 4]


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
@pytest.mark.parametrize("choice", [top_k_router_choice, lambda d: cdmoe_choice(d, 64), lambda d: cdmoe_choice(d, None)],
                         ids=["TopKRouter", "CDMoE query and keys", "CDMoE scores directly"])
def test_routing_in_bf16_picks_the_experts_fp32_picks(choice, precision):
    """Switch Transformer's selective precision: the routers score in fp32 whatever autocast says, and from bf16
    weights and inputs (``bf16-true``) too. In bf16 the scores of close candidates tie or swap, and under autocast
    0.5% of tokens (TopKRouter, top-2 of 16) or 7.7% (CDMoE, top-4 of 256 by product keys) went to other experts than
    the same weights pick in fp32."""
    torch.manual_seed(0)
    module, pick = choice(256)
    x = torch.randn(4096, 256)
    if precision == "bf16-true":  # the same bf16 values, scored in fp32
        module = module.to(torch.bfloat16)
        half = pick(module, x.bfloat16())
        full = pick(copy.deepcopy(module).float(), x.bfloat16().float())
    else:
        full = pick(module, x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = pick(module, x)
    assert torch.equal(half, full)
