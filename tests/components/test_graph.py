"""Compile-friendly models (docs/training.md): a training-mode forward and backward of every sequence
and state mixer, inside a model with padding and positions, makes no device→host synchronisation, and
``torch.compile(model, fullgraph=True)`` traces each one whole and computes what eager does — outputs,
auxiliary losses and every gradient.

The compile check uses the ``aot_eager`` backend: it runs the same dynamo trace and the same
autograd split as inductor (where the fullgraph and stride failures come from) without generating C++,
so twenty models compile in seconds. One named architecture goes through inductor in
tests/recipes/test_compile.py."""

from functools import partial

import pytest
import torch

from components.catalogue import SEQUENCE_MIXERS, STATE_MIXERS, WHOLE_BLOCKS
from components import (
    MLP, HybridLM, QCAttention,
)

SEQUENCE, STATE = SEQUENCE_MIXERS, STATE_MIXERS  # every mixer the zoo exports (components/catalogue.py)
MODELS = {**{name: ("A-" if name in WHOLE_BLOCKS else "AM", {"A": f}) for name, f in SEQUENCE.items()},
          **{name: ("AM", {"A": partial(QCAttention, n_heads=4), "M": f}) for name, f in STATE.items()}}

def build(name: str) -> HybridLM:
    torch.manual_seed(0)
    pattern, mixers = MODELS[name]
    model = HybridLM(61, 32, pattern, mixers)
    with torch.no_grad():  # dynamic masks away from their neutral start
        for param_name, p in model.named_parameters():
            if param_name.endswith(("A", "key_bias.table")):
                p.uniform_(-1.0, 1.0)
    return model.train()


def batch():
    """Two sequences of 11 (not a multiple of the chunk size); the second left-padded by 3."""
    ids = torch.randint(1, 61, (2, 11), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(2, 11, dtype=torch.bool)
    mask[1, :3] = True
    return ids.masked_fill(mask, 0), (torch.cumsum(~mask, 1) - 1).clamp_min(0), mask


def training_step(model, forward):
    """Logits, the loss (a logit functional plus every auxiliary loss) and the gradients, by name."""
    ids, positions, mask = batch()
    logits = forward(ids, position_ids=positions, padding_mask=mask)
    aux = sum(model.auxiliary_losses().values(), torch.zeros(()))
    loss = (logits.square().mean(-1) * (~mask)).sum() + aux
    model.zero_grad(set_to_none=True)
    loss.backward()
    return logits.detach(), aux.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", MODELS)
def test_a_training_step_makes_no_host_sync(name, host_syncs):
    model = build(name)
    with host_syncs() as syncs:
        training_step(model, model)
    assert syncs.found == []


def test_the_sync_detector_sees_every_kind_of_sync(host_syncs):
    x = torch.arange(6.0)
    for planted, expected in [(lambda: int(x.max()), "_local_scalar_dense"), (lambda: x[x > 2], "boolean index"),
                              (lambda: x.nonzero(), "nonzero"), (lambda: x.tolist(), "tolist"),
                              (lambda: torch.bincount(x.long()), "bincount")]:
        with host_syncs() as syncs:
            planted()
        assert len(syncs.found) == 1 and expected in syncs.found[0]
    with host_syncs() as syncs:  # the on-device assert the model's checks use is not a sync
        torch._assert_async(x.sum() > 0, "x must be positive")
    assert syncs.found == []


def test_evaluation_keeps_its_value_naming_check(host_syncs):
    """In eval the token-range check reads its values back, by design, to name them in the error."""
    model = build("QCAttention").eval()
    with host_syncs() as syncs:
        model(torch.randint(0, 61, (1, 5)))
    assert any("_local_scalar_dense" in op for op in syncs.found)


@pytest.mark.parametrize("name", MODELS)
def test_fullgraph_compile_equals_eager(name):
    eager_model = build(name)
    want_logits, want_aux, want_grads = training_step(eager_model, eager_model)
    torch._dynamo.reset()
    compiled = torch.compile(eager_model, fullgraph=True, backend="aot_eager")
    got_logits, got_aux, got_grads = training_step(eager_model, compiled)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_aux, want_aux, rtol=1e-5, atol=1e-6)
    assert got_grads.keys() == want_grads.keys() and len(got_grads) == len(list(eager_model.parameters()))
    for param in want_grads:
        torch.testing.assert_close(got_grads[param], want_grads[param], rtol=1e-5, atol=1e-6, msg=param)


@pytest.mark.parametrize("name", MODELS)
def test_a_packed_row_computes_what_its_documents_compute_alone(name):
    """Packed documents (docs/data.md): with ``document_ids``, one row of three documents gives each the
    logits it gets alone — attention keeps to its document, the SSD's state and conv restart, positions
    count from each document's start. Lengths 5, 9, 3 cross the chunk size (4) inside and at its edge."""
    model = build(name).eval()
    lengths = [5, 9, 3]
    ids = torch.randint(1, 61, (2, sum(lengths)), generator=torch.Generator().manual_seed(2))
    documents = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths)).expand(2, -1)  # [2, 17]
    with torch.no_grad():
        packed = model(ids, document_ids=documents)  # [2, 17, V]
        alone = torch.cat([model(part) for part in ids.split(lengths, dim=1)], dim=1)
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)


def test_a_packed_row_of_a_hybrid_computes_what_its_documents_compute_alone():
    """SSD (conv + RoPE), attention and IFA blocks with MLP and routed-MoE state mixers in one model. The
    ids 0, 1, 0, 1 come back: each run is its own document (the conv's taps reach across the 2-token one)."""
    torch.manual_seed(0)
    model = HybridLM(61, 32, "SM AR IM", {"S": SEQUENCE["SSD conv+rope, gate, 2 groups"], "A": SEQUENCE["QCAttention"],
                                          "I": SEQUENCE["IFA content"], "M": MLP, "R": STATE["RoutedMoE"]}).eval()
    lengths = [6, 2, 11, 4]
    ids = torch.randint(1, 61, (1, sum(lengths)), generator=torch.Generator().manual_seed(3))
    documents = torch.repeat_interleave(torch.tensor([0, 1, 0, 1]), torch.tensor(lengths))[None]  # [1, 23]
    with torch.no_grad():
        packed = model(ids, document_ids=documents)
        alone = torch.cat([model(part) for part in ids.split(lengths, dim=1)], dim=1)
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
