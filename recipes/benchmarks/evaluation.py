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


def character_tokenizer(folder: Path):
    """A tokenizer of 256 characters (printable ASCII, typographic quotes, Latin letters), one token each, in ``folder``: the
    text an untrained model generates with it is characters, where with bytes it is mostly invalid UTF-8."""
    import string

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    characters = list(string.printable[:95]) + list("\n—‘’“”")  # (the cloze contexts' characters)
    characters += [chr(c) for c in range(0xA1, 0xA1 + 256 - len(characters))]
    # no unknown token: lm-eval's model decodes without the special ones, and the zoo's with them (the contexts are
    # ASCII); the end of text is a stop string of every request, so neither text holds it
    tokenizer = Tokenizer(models.WordLevel(vocab={c: i for i, c in enumerate(characters)}))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one character a token
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=characters[-1])
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


def generation_requests(zoo, text, limit: int, budget: int, eot: str):
    """``generate_until`` requests over the cloze contexts sharing one list of stop strings: three characters of the
    greedy continuation of every fourth context, 4 to 40 tokens in (the untrained model repeats itself, so these end
    most continuations a few to a few dozen tokens in, and some not before the budget), and the end-of-text string
    lm-eval's Hugging Face model adds to every list (so that both stop at the same places)."""
    from lm_eval.api.instance import Instance

    from recipes.evaluation.tasks import cloze_items

    contexts = [item["context"] for item in cloze_items(limit)]
    stops, generator = {eot}, torch.Generator().manual_seed(0)
    for context in contexts[::4]:
        ids = torch.tensor([text.encode(context)])  # [1, T]
        with torch.no_grad():
            continuation = text.decode(zoo.generate(ids, 48)[0, ids.shape[1]:].tolist())
        at = int(torch.randint(4, 40, (1,), generator=generator))
        if continuation[at:at + 3]:
            stops.add(continuation[at:at + 3])
    kwargs = {"until": sorted(stops), "max_gen_toks": budget, "do_sample": False}
    return [Instance(request_type="generate_until", doc={}, arguments=(context, dict(kwargs)), idx=0)
            for context in contexts]


def whole_budget_one_at_a_time(zoo, text, work) -> list[str]:
    """What the zoo's ``generate_until`` did before it batched and stopped early: each request alone, to its whole
    budget, then cut at the first stop string."""
    out = []
    for request in work:
        context, kwargs = request.args
        ids = torch.tensor([text.encode(context)])  # [1, T]
        with torch.no_grad():
            continuation = text.decode(zoo.generate(ids, kwargs["max_gen_toks"])[0, ids.shape[1]:].tolist())
        for stop in kwargs["until"]:
            continuation = continuation.split(stop)[0]
        out.append(continuation)
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
    parser.add_argument("--generate", action="store_true",
                        help="generate_until requests (greedy, stop strings, max_gen_toks --budget) instead of scoring")
    parser.add_argument("--budget", type=positive_int, default=256, help="max_gen_toks (lm-eval's default 256)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="eval-bench-") as folder:  # the tokenizer and the model, saved and read
        compare(args, Path(folder))


def compare(args, folder: Path) -> None:
    """The timing table of ``args`` (see :func:`main`), with the saved tokenizer and Llama in ``folder``."""
    import transformers
    from lm_eval.models.huggingface import HFLM

    from recipes.evaluation.harness import ZooLM
    from recipes.hf import from_pretrained

    tokenizer = character_tokenizer(folder) if args.generate else byte_tokenizer(folder)
    text = TokenizerText(tokenizer)
    torch.manual_seed(0)
    # the tokenizer's end of text is the model's (Hugging Face's generate stops a sequence there; Llama's default is 2)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=args.width, intermediate_size=4 * args.width,
                                      num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=512, tie_word_embeddings=False,
                                      bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
    theirs = HFLM(pretrained=str(folder), batch_size=args.batch_size, device="cpu", dtype="float32")
    if args.generate:
        return generation_table(args, theirs, from_pretrained(folder).eval(), text)
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


def generation_table(args, theirs, zoo, text) -> None:
    from recipes.evaluation.harness import ZooLM

    work = generation_requests(zoo, text, args.questions, args.budget,
                               theirs.tok_decode(theirs.eot_token_id, skip_special_tokens=False))
    print(f"{len(work)} generate_until requests (greedy, {len(work[0].args[1]['until'])} stop strings, max_gen_toks "
          f"{args.budget}), Llama {args.layers} layers × {args.width}, batch {args.batch_size}, {args.threads} threads; "
          "rounds alternate between the models", flush=True)
    lm = ZooLM(zoo, text, batch_size=args.batch_size, max_length=theirs.max_length)
    runs = {"lm-eval hf": lambda: theirs.generate_until(work, disable_tqdm=True),
            "zoo": lambda: lm.generate_until(work, disable_tqdm=True),
            "zoo before (alone, whole budget)": lambda: whole_budget_one_at_a_time(zoo, text, work)}
    texts = {}

    def timed(name: str) -> None:
        texts[name] = runs[name]()

    times = interleaved_seconds({name: partial(timed, name) for name in runs}, args.rounds, warmup=0)
    base = statistics.median(times["lm-eval hf"])
    lengths = [len(text.encode(t)) for t in texts["zoo"]]
    print(f"answers: median {statistics.median(lengths):.0f} tokens; {sum(n >= args.budget for n in lengths)} of "
          f"{len(lengths)} ran to the budget")
    print("| model | requests/s (median) | × lm-eval hf | texts equal to hf's |\n|---|---|---|---|")
    for name in runs:
        seconds = statistics.median(times[name])
        same = sum(a == b for a, b in zip(texts[name], texts["lm-eval hf"]))
        print(f"| {name} | {len(work) / seconds:,.2f} | {base / seconds:.2f} | {same} of {len(work)} |", flush=True)


if __name__ == "__main__":
    main()
