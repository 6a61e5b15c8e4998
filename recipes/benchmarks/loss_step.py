"""A recipe's training step with the head's cross-entropy in chunks against the written-out logits.

    python -m recipes.benchmarks.loss_step english/moe_placement/ablate_moe.yaml english/positions/ssd_rope.yaml
    python -m recipes.benchmarks.loss_step quickstart.yaml --rounds 9 --threads 2

Each config's model (as ``python -m recipes fit --config`` builds it) trains on one random batch of the recipe's
shape (its ``batch_size`` × ``seq_len``): forward, ``LanguageModel.training_loss``, backward, AdamW. The two loss
forms (:func:`zoo_kernels.linear_cross_entropy.linear_cross_entropy` and its written-out reference) alternate step by
step in one process; the table gives the median step of each and their ratio (docs/performance.md).
"""

import argparse
import statistics
import warnings

import torch

from zoo_kernels.linear_cross_entropy import linear_cross_entropy_parts, linear_cross_entropy_reference
from recipes import module
from recipes.argtypes import positive_int
from recipes.benchmarks.timing import interleaved_seconds
from recipes.cli import main as cli_main

FORMS = {  # (what LanguageModel.training_loss calls: the loss and, for its log, the z-loss's part)
    "written-out logits": lambda hidden, weight, labels, *, ignore_index, z_loss: (linear_cross_entropy_reference(
        hidden, weight, labels, ignore_index, z_loss), hidden.new_zeros(())),
    "in chunks": linear_cross_entropy_parts,
}


def step_seconds(config: str, rounds: int) -> dict[str, float]:
    """Median seconds of one training step of ``config``'s model with each loss form."""
    with warnings.catch_warnings():  # Lightning warns that this process's own command line is not the CLI's
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        cli = cli_main(["--config", config, "--trainer.logger", "false", "--trainer.enable_checkpointing", "false"],
                       run=False)
    lm, data = cli.model, cli.config["data"]["init_args"]  # the data module's arguments as parsed
    batch_size, seq_len = int(data["batch_size"]), int(data["seq_len"])
    ids = torch.randint(0, lm.model.vocab_size, (batch_size, seq_len + 1), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}  # [B, T] each
    optimizer = torch.optim.AdamW(lm.parameters(), lr=1e-4)

    def step(form):
        module.linear_cross_entropy_parts = form  # what LanguageModel.training_loss calls
        lm.training_loss(batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    try:
        times = interleaved_seconds({name: (lambda form=form: step(form)) for name, form in FORMS.items()}, rounds)
    finally:
        module.linear_cross_entropy_parts = linear_cross_entropy_parts
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.loss_step",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="+", help="recipe configs (bundled names or paths)")
    parser.add_argument("--rounds", type=positive_int, default=7)
    parser.add_argument("--threads", type=positive_int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s); median of {args.rounds} interleaved steps\n")
    print("| config | written-out logits, ms | in chunks, ms | × |\n|---|---|---|---|")
    for config in args.configs:
        seconds = step_seconds(config, args.rounds)
        base, chunked = seconds["written-out logits"], seconds["in chunks"]
        print(f"| {config} | {1e3 * base:.0f} | {1e3 * chunked:.0f} | {base / chunked:.2f} |", flush=True)


if __name__ == "__main__":
    main()
