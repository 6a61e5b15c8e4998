"""``python -m recipes.benchmarks.evaluation``: the zoo's lm-eval adapter against lm-eval's own Hugging Face model,
on the same weights and the same requests, in one run (docs/evaluation.md).

A tiny Llama is built with ``transformers``, saved with a byte-level tokenizer, and loaded both ways: as
lm-eval's ``HFLM`` and, through ``recipes.hf``, as the zoo's ``HybridLM`` behind :class:`ZooLM` with the same
tokenizer. Both score the ``zoo_cloze`` requests (multiple choice, four continuations per context); rounds
alternate between them and the table gives median requests/s and the ratio. The scores must agree (the
largest difference is printed): a benchmark of two different computations would mean nothing.

Needs the dev extras (transformers, lm-eval, accelerate).
"""

import argparse
import statistics
import tempfile
from functools import partial
from pathlib import Path

import torch

from recipes.argtypes import positive_int
from recipes.benchmarks.timing import interleaved_seconds


def byte_tokenizer(folder: Path):
    """A byte-level tokenizer (one token per byte, no merges) saved in ``folder`` for ``AutoTokenizer``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=sorted(alphabet)[10])
    fast.save_pretrained(folder)
    return fast


class TokenizerText:
    """``encode``/``decode`` of a Hugging Face tokenizer, as the zoo's data modules offer them."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


def requests(limit: int):
    from lm_eval.api.instance import Instance

    from recipes.evaluation.tasks import cloze_items

    out = []
    for i, item in enumerate(cloze_items(limit)):
        out += [Instance(request_type="loglikelihood", doc=item, arguments=(item["context"], choice), idx=j)
                for j, choice in enumerate(item["choices"])]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.evaluation",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=positive_int, default=4)
    parser.add_argument("--width", type=positive_int, default=128)
    parser.add_argument("--questions", type=positive_int, default=60, help="cloze questions (four requests each)")
    parser.add_argument("--batch_size", type=positive_int, default=8)
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--threads", type=positive_int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers
    from lm_eval.models.huggingface import HFLM

    from recipes.evaluation.harness import ZooLM
    from recipes.hf import from_pretrained

    folder = Path(tempfile.mkdtemp(prefix="eval-bench-"))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=args.width, intermediate_size=4 * args.width,
                                      num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=512, tie_word_embeddings=False)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    text = TokenizerText(byte_tokenizer(folder))
    theirs = HFLM(pretrained=str(folder), batch_size=args.batch_size, device="cpu", dtype="float32")
    ours = {"zoo (shared context)": ZooLM(from_pretrained(folder).eval(), text, batch_size=args.batch_size),
            "zoo (no sharing)": ZooLM(from_pretrained(folder).eval(), text, batch_size=args.batch_size,
                                      reuse_context=False)}
    models = {"lm-eval hf": theirs, **ours}
    work = requests(args.questions)
    print(f"{len(work)} loglikelihood requests ({args.questions} cloze questions × 4), Llama {args.layers} layers × "
          f"{args.width}, batch {args.batch_size}, {args.threads} threads; rounds alternate between the models", flush=True)
    scores = {}

    @torch.no_grad()
    def score(name: str) -> None:
        scores[name] = [score for score, _ in models[name].loglikelihood(work, disable_tqdm=True)]

    times = interleaved_seconds({name: partial(score, name) for name in models}, args.rounds, warmup=0)
    base = statistics.median(times["lm-eval hf"])
    print("| model | requests/s (median) | × lm-eval hf | largest |Δ score| vs hf |\n|---|---|---|---|")
    for name in models:
        seconds = statistics.median(times[name])
        gap = max(abs(a - b) for a, b in zip(scores[name], scores["lm-eval hf"]))
        print(f"| {name} | {len(work) / seconds:,.1f} | {base / seconds:.2f} | {gap:.1e} |", flush=True)


if __name__ == "__main__":
    main()
