"""The named architectures (recipes/configs/arch/): each paper-size recipe builds (on the meta device)
at the size its paper names, and each tiny twin trains."""

import pytest
import torch

from components import count_parameters
from components.block import block_mixers
from recipes.cli import main

PAPER_SIZES = {  # total parameters the source names (docs/architectures.md)
    "llama": 320e6,  # TransXSSM Table 4, Llama3-320M
    "mamba2": 370e6,  # the Mamba-2 paper's 370M model
    "jamba": 1e9,  # OTCE Table 8
    "otce": 1e9,  # OTCE Tables 6 and 8
    "cheems": 320e6,  # Wonderful Matrices v2 Table 7, Cheems-320M
    "transxssm": 320e6,  # TransXSSM Table 4, TransXSSM-320M
    "nemotron_h": 8_100_852_736,  # Nemotron-H-8B-Base-8K, its published count (asserted exactly below)
}
RELEASED_DOGE = {  # SmallDoges/small-doge recipes/doge/<name>/config_full.yaml
    "doge": dict(vocab_size=32768, hidden_size=1024, intermediate_size=2048, num_hidden_layers=32,
                 num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=True, max_position_embeddings=2048),
    "doge_moe": dict(vocab_size=128256, hidden_size=256, intermediate_size=768, num_hidden_layers=8,
                     num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True, is_moe=True,
                     num_experts=1024, num_experts_per_tok=8, max_position_embeddings=2048),
}
TINY = ["llama", "mamba2", "jamba", "otce", "cheems", "transxssm", "doge", "doge_moe", "nemotron_h"]


def build_on_meta(name: str):
    with torch.device("meta"):
        return main(["--config", f"arch/{name}.yaml"], run=False).model


@pytest.mark.parametrize("name", PAPER_SIZES)
def test_paper_size_recipe_has_the_papers_parameter_count(name):
    total = count_parameters(build_on_meta(name).model)
    assert abs(total - PAPER_SIZES[name]) <= 0.10 * PAPER_SIZES[name], f"{total:,}"


def test_the_nemotron_h_recipe_has_nemotron_h_8bs_exact_parameter_count_and_exports_as_nemotron_h():
    from recipes.hf import hf_architecture

    model = build_on_meta("nemotron_h").model
    assert count_parameters(model) == PAPER_SIZES["nemotron_h"]
    assert hf_architecture(model).name == "NemotronHForCausalLM"


@pytest.mark.parametrize("name", RELEASED_DOGE)
def test_doge_recipes_have_exactly_the_released_models_parameter_count(name):
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        hf = transformers.DogeForCausalLM(transformers.DogeConfig(**RELEASED_DOGE[name]))
    assert count_parameters(build_on_meta(name).model) == count_parameters(hf)


@pytest.mark.parametrize("name", TINY)
def test_tiny_twin_trains(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = main(["fit", "--config", f"arch/tiny/{name}.yaml", "--trainer.max_steps", "3", "--trainer.limit_val_batches", "2",
                "--trainer.val_check_interval", "3", "--trainer.num_sanity_val_steps", "0",
                "--trainer.enable_progress_bar", "false", "--data.init_args.batch_size", "4",
                "--data.init_args.seq_len", "64", "--checkpoint.every_n_steps", "0"])
    assert cli.trainer.global_step == 3
    assert torch.isfinite(cli.trainer.callback_metrics["val/loss"])
    paper = build_on_meta(name)
    tiny = cli.model.model
    kinds = lambda model: {type(block_mixers(b)[0]).__name__ for b in model.blocks}  # noqa: E731
    assert tiny.pattern.replace(" ", "") != "" and kinds(tiny) == kinds(paper.model)  # the same kinds of mixers as the paper's
