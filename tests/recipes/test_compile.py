"""Compilation and the sync-free training loss (docs/training.md): a named architecture compiled whole by inductor
computes what eager does; ``model.compile`` in a recipe trains as the eager run does; the loss over all
positions equals the gathered one and makes no host sync."""

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from recipes import LanguageModel
from recipes.cli import main

IGNORE = -100


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_a_named_architecture_compiled_by_inductor_equals_eager():
    """Tiny Jamba: SSD (conv), attention, MLP and a routed MoE with its balancing loss, one graph, compiled
    as the recipe compiles it (``model.compile: true``), at a length that is not a multiple of the chunk, with left
    padding. (A second batch shape compiles a graph of its own: that is checked with the eager backend below, where
    it costs nothing; under inductor it doubled this test's ~100 s on a cold cache.)"""
    # Two of its eight blocks: inductor compiles the whole eight in about 5 min on 2 cores, these in 1 (the
    # full model was checked the same way once: docs/performance.md).
    lm = main(["--config", "arch/tiny/jamba.yaml", "--model.pattern", "SR AM", "--model.compile", "true"],
              run=False).model
    model = lm.model.train()
    torch._dynamo.reset()
    B, T, pad = 2, 45, 7  # 45 is not a multiple of the chunk size (32)
    ids = torch.randint(0, model.vocab_size, (B, T), generator=torch.Generator().manual_seed(T))
    mask = torch.zeros(B, T, dtype=torch.bool)
    mask[0, :pad] = True  # left padding
    positions = (torch.cumsum(~mask, 1) - 1).clamp_min(0)

    def step(hidden_states):
        model.zero_grad(set_to_none=True)
        h = hidden_states(ids, position_ids=positions, padding_mask=mask)  # [B, T, d]
        loss = (h.square().mean(-1) * ~mask).mean() + sum(model.auxiliary_losses().values())
        loss.backward()
        return h.detach(), loss.detach(), gradients(model)

    want = step(model.hidden_states)
    got = step(lm._hidden_states)  # inductor: generated C++ on CPU
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], rtol=1e-3, atol=1e-6, msg=name)


def test_a_compiled_model_keeps_static_shapes_each_new_batch_shape_compiles_once():
    """Recipes compile with ``dynamic=False``: a run sees a few fixed shapes (training's, validation's), each gets a
    graph specialised to it, and no graph with a symbolic length is made — under torch's default, a third length
    would reuse the symbolic graph the second one made."""
    lm = LanguageModel(32, "AM", {"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2}}},
                       vocab_size=50, compile="eager")
    torch._dynamo.reset()
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for T in (9, 14, 19):
        ids = torch.randint(0, 50, (2, T))
        torch.testing.assert_close(lm._hidden_states(ids), lm.model.hidden_states(ids))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - before == 3


def test_a_hybrid_exports_at_a_fixed_shape_and_the_program_computes_the_model():
    """``torch.export`` (the way to ExecuTorch, AOTInductor) of an SSD + attention + routed MoE model in eval mode: the
    exported program's logits equal the module's. Shapes are fixed: the SSD's chunked scan does not export with a
    symbolic length (docs/training.md)."""
    from functools import partial

    from components import SSD, HybridLM, InnerFuncAttention, QCAttention

    torch.manual_seed(0)
    mixers = {"A": partial(QCAttention, n_heads=2), "I": partial(InnerFuncAttention, n_heads=2),
              "S": partial(SSD, n_heads=2, d_state=8, chunk_size=8)}
    model = HybridLM(50, 32, "SM AR IE", mixers).eval()
    ids = torch.randint(0, 50, (2, 13))  # 13: not a multiple of the chunk
    with torch.no_grad():
        program = torch.export.export(model, (ids,))
        torch.testing.assert_close(program.module()(ids), model(ids), rtol=0, atol=0)


def test_a_hybrid_exports_with_its_length_a_symbolic_multiple_of_the_chunk():
    """What docs/training.md tells a user who wants one program for every length: the length as ``chunk_size ·
    Dim`` (two chunks or more), and a prompt of any length padded on the right to that multiple. Causality makes the
    padding harmless: the first ``T`` positions' logits are the module's on the unpadded prompt."""
    from functools import partial

    from components import SSD, HybridLM, QCAttention

    torch.manual_seed(0)
    mixers = {"A": partial(QCAttention, n_heads=2), "S": partial(SSD, n_heads=2, d_state=8, chunk_size=8)}
    model = HybridLM(50, 32, "SM AM", mixers).eval()
    length = 8 * torch.export.Dim("chunks", min=2, max=64)
    with torch.no_grad():
        program = torch.export.export(model, (torch.randint(0, 50, (2, 16)),), dynamic_shapes=({0: torch.export.Dim("batch", max=64), 1: length},))
        for T in (16, 40):  # lengths the trace never saw
            ids = torch.randint(0, 50, (3, T))
            torch.testing.assert_close(program.module()(ids), model(ids), rtol=0, atol=0)
        prompt = torch.randint(0, 50, (2, 13))
        padded = torch.nn.functional.pad(prompt, (0, 3))  # [2, 16]
        torch.testing.assert_close(program.module()(padded)[:, :13], model(prompt), rtol=1e-5, atol=1e-6)


def test_attention_compiles_with_dynamic_shapes():
    """Under dynamic shapes the causal flag must reach SDPA as a Python bool, not a SymBool."""
    model = LanguageModel(32, "AM", {"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2}}},
                          vocab_size=50).model
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")
    for T in (9, 14):
        ids = torch.randint(0, 50, (2, T))
        torch.testing.assert_close(compiled(ids), model(ids), rtol=1e-5, atol=1e-6)


def train_losses(run: Path) -> list[float]:
    events = EventAccumulator(str(run))
    events.Reload()
    return [e.value for e in events.Scalars("train/loss")]


def test_compile_from_the_recipe_trains_as_eager(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    common = ["--config", "quickstart.yaml", "--model.d_model", "32", "--model.mixers.A.init_args.n_heads", "2",
              "--data.init_args.seq_len", "32", "--data.init_args.batch_size", "4", "--trainer.max_steps", "4",
              "--trainer.limit_val_batches", "0", "--trainer.log_every_n_steps", "1",
              "--trainer.enable_progress_bar", "false", "--checkpoint.every_n_steps", "0"]
    losses = {}
    for name, extra in (("eager", []), ("compiled", ["--model.compile", "aot_eager"])):
        torch._dynamo.reset()
        cli = main(["fit", *common, *extra, "--trainer.logger.init_args.version", name])
        assert cli.trainer.global_step == 4
        losses[name] = train_losses(Path(cli.trainer.logger.log_dir))
    assert cli.model.hparams.compile == "aot_eager" and cli.model._hidden_states is not cli.model.model.hidden_states
    assert len(losses["eager"]) == 4
    torch.testing.assert_close(losses["compiled"], losses["eager"], rtol=1e-5, atol=1e-6)


def batches():
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (3, 9))
    labels = ids.roll(-1, 1).masked_fill(torch.rand(3, 9) < 0.5, IGNORE)
    yield {"input_ids": ids, "labels": labels}
    yield {"input_ids": ids, "labels": torch.full_like(ids, IGNORE)}  # nothing labelled


@pytest.mark.parametrize("labelled", ["some", "none"])
def test_the_loss_over_all_positions_equals_the_gathered_one(labelled):
    lm = LanguageModel(32, "AM", {"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2}}},
                       vocab_size=50)
    batch = list(batches())[0 if labelled == "some" else 1]
    lm.model.zero_grad()
    over_all = lm.training_loss(batch)
    over_all.backward()
    grads_all = gradients(lm.model)
    lm.model.zero_grad()
    gathered = lm.forward_loss(batch)[0]
    gathered.backward()
    torch.testing.assert_close(over_all, gathered, rtol=1e-6, atol=1e-7)
    if labelled == "none":
        assert over_all.item() == 0.0
    for name, grad in gradients(lm.model).items():
        torch.testing.assert_close(grads_all[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_the_training_loss_makes_no_host_sync_unless_asked_to_gather(host_syncs):
    spec = {"A": {"class_path": "components.QCAttention", "init_args": {"n_heads": 2}},
            "M": {"class_path": "components.RoutedMoE", "init_args": {"n_experts": 4}}}
    batch = next(batches())
    for loss_positions, syncs_expected in (("all", False), ("labelled", True)):
        lm = LanguageModel(32, "AM", spec, vocab_size=50, loss_positions=loss_positions).train()
        with host_syncs() as syncs:
            lm.training_loss(batch).backward()
        assert bool(syncs.found) == syncs_expected, syncs.found
