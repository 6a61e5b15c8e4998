"""``python -m recipes generate``: text from a trained checkpoint.

    python -m recipes generate --config quickstart.yaml --ckpt_path last --prompt "def " --max_new_tokens 200
    python -m recipes generate --config quickstart.yaml --ckpt_path last --prompt "The " --temperature 0.8 --top_p 0.95 --seed 1
    python -m recipes generate --config quickstart.yaml --ckpt_path last --prompt "def " --max_new_tokens 500 --compile
    python -m recipes generate --config quickstart.yaml --ckpt_path last --prompt "def " --prompt "class " --prompt_file p.txt

A model trained on documents (a BPE corpus: each document ends with its end-of-document token, which so also opens
the next, or begins with the ``start_of_document_token`` of a model imported from Hugging Face) reads each prompt as
a document's beginning: the prompt follows that token, and a continuation ends where the model ends its document
(``--mid_document`` reads the prompt as a document's middle; ``--past_document_end`` goes on into the next one). An
empty prompt then asks for a whole new document. A byte corpus has no such token.

Several prompts (``--prompt`` and ``--prompt_file`` repeat, in the order given; ``-`` reads stdin) decode as one
left-padded batch, each continuation printed under a ``==> prompt N <==`` line. One prompt's continuation is
printed as its tokens come (``--no_stream``: once it is whole, which spares a GPU a wait for each token).

The data module the run trained with (its ``config.yaml``, else the recipe's) says how text becomes tokens and
back (``encode``/``decode``: bytes for ``TextCorpus``); ``--ckpt_path`` is a file, or ``last``/``best``/``swa`` of the
recipe's runs, as for ``fit``.
"""

import argparse
import sys

from recipes.argtypes import device, positive_int, text_file, utf8_text

# (torch, Lightning and the run's tools are imported once the arguments are read: `--help` and a mistyped flag answer
# at once, not after 8 s of imports)


def finished_text(text: str) -> str:
    """``text`` without the replacement characters that the bytes of an unfinished multi-byte character decode to at
    its end: the next tokens may finish it into another character, so a stop string must not be looked for there."""
    return text.rstrip("\ufffd")


def before_end(ids: list[int], end: int | None) -> list[int]:
    """``ids`` up to (without) the first ``end`` token: a continuation ends with its document. (None: all of them.)"""
    return ids[:ids.index(end)] if end is not None and end in ids else ids


def cut_after(text: str, stop: str | None, start: int = 0) -> str:
    """``text`` up to and including the first ``stop`` at or after ``start`` (the prompt's length): a stop text of
    several tokens is found in the decoded text, and a one-token stop's filled positions after it are dropped."""
    end = text.find(stop, start) if stop else -1
    return text if end < 0 else text[:end + len(stop)]


class TextStream:
    """Writes one prompt and its continuation to ``out`` as the tokens come: at each step the text decoded so far,
    less an unfinished character at its end (:func:`finished_text`) and cut after the stop text (:func:`cut_after`),
    is written past what already was. So the written text is always a beginning of the text :func:`main` returns;
    where a tokenizer decodes a longer sequence into text that does not begin with a shorter one's (a merge across
    tokens), the writing waits until it does, and :meth:`finish` writes the rest.

    Args:
        decode: token ids -> text, the data module's.
        prompt: the prompt's ids.
        stop: the stop text (``--stop``) or None.
        out: where to write (default ``sys.stdout``).
    """

    def __init__(self, decode, prompt: list[int], stop: str | None, out=None):
        self.decode, self.prompt, self.stop, self.out = decode, prompt, stop, out or sys.stdout
        self.start = len(decode(prompt))  # (a stop inside the prompt does not count)
        self.written = ""

    def write(self, text: str) -> None:
        if text.startswith(self.written) and len(text) > len(self.written):
            self.out.write(text[len(self.written):])
            self.out.flush()
            self.written = text

    def update(self, new: list[int]) -> None:
        """The continuation's ids so far."""
        self.write(cut_after(finished_text(self.decode(self.prompt + new)), self.stop, start=self.start))

    def finish(self, text: str) -> None:
        """The whole text, as :func:`main` prints it: what is not written yet, and the end of the line."""
        if not text.startswith(self.written):  # (a tokenizer whose decoding changed text already written)
            self.out.write("\n[the text as decoded at the end:]\n")
            self.written = ""
        self.write(text)
        self.out.write("\n")
        self.out.flush()


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m recipes generate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, action="append",
                        help="the recipe the checkpoint was trained with (repeat it as for fit: the files merge as "
                             "fit merged them)")
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint file, or last / best / swa")
    parser.add_argument("--prompt", dest="prompts", action="append", type=utf8_text, metavar="TEXT",
                        help="the text to continue; repeat it (or --prompt_file) for several, decoded as one batch")
    parser.add_argument("--prompt_file", dest="prompts", action="append", type=text_file, metavar="PATH",
                        help="a file whose whole text is one prompt (- : stdin)")
    parser.add_argument("--max_new_tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    parser.add_argument("--top_k", type=int, default=None)
    parser.add_argument("--top_p", type=float, default=None)
    parser.add_argument("--stop", type=utf8_text, default=None,
                        help="end the continuation, and generation, after the first occurrence of this text")
    parser.add_argument("--mid_document", action="store_true",
                        help="the prompt continues a document already begun: no end-of-document token before it (by "
                             "default there is one, as before every document the model trained on)")
    parser.add_argument("--past_document_end", action="store_true",
                        help="go on past the end-of-document token the model writes, into another document (by "
                             "default the continuation ends there)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--allow_classes", nargs="*", action="extend", default=[],
                        help="packages whose classes the checkpoint may name (the recipe's own are trusted)")
    parser.add_argument("--extrapolate", action="store_true",
                        help="continue past the model's max_seq_len, RoPE's base NTK-stretched as the model stretches it "
                             "(keys cached before keep the stretch they were rotated with: docs/decoding.md)")
    parser.add_argument("--compile", action="store_true",
                        help="each step through torch.compile from a fixed-shape cache (pays off past ~100 tokens)")
    parser.add_argument("--no_stream", dest="stream", action="store_false",
                        help="print one prompt's text once it is whole, not as its tokens come")
    parser.add_argument("--device", type=device, default="cpu",
                        help="cpu (default), cuda, cuda:N, mps (a seed samples otherwise on another device)")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch's CPU threads (default: the cores other processes leave free, as for fit)")
    args = parser.parse_args(argv)
    if not args.prompts:
        parser.error("one of the arguments --prompt --prompt_file is required")
    if args.stop == "":
        parser.error("argument --stop: an empty text (it would end every continuation before its first token)")
    import torch

    from components.generation import left_padded
    from recipes.run_report import choose_threads
    from recipes.runs import load_run, text_tokenizer

    said = choose_threads(args.threads)
    if said:  # (stdout is the text: this goes beside it)
        print(said, file=sys.stderr, flush=True)
    try:
        # (the run's own data settings, from its config.yaml: a --data.paths given to fit means another BPE than the
        # recipe file's, which would turn the prompt into the wrong tokens without a word)
        run = load_run(args.config, args.ckpt_path, device=args.device, allow_classes=args.allow_classes)
        data = text_tokenizer(run.data, "generate")
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
    if args.extrapolate:  # (it changes no weight: validate's --model.extrapolate true, for one command)
        run.lm.model.extrapolate = True
    end = getattr(data, "end_of_document", None)  # (a byte corpus has none)
    start = getattr(data, "start_of_document", end)  # (a beginning-of-sequence token, or the end of the one before)
    start = [start] if isinstance(start, int) and not args.mid_document else []
    end = end if isinstance(end, int) and not args.past_document_end else None
    encoded = [data.encode(text) for text in args.prompts]
    if not start and not all(encoded):  # (generate's own error would not say which)
        sys.exit(f"error: prompt {[len(ids) for ids in encoded].index(0) + 1} is empty; give at least one token")
    prompt, padding = left_padded([start + ids for ids in encoded], args.device)  # [B, T], [B, T]
    stop = data.encode(args.stop) if args.stop else []

    def ended(new: torch.Tensor) -> torch.Tensor:  # [B, n] -> [B]: the document's end, or a longer stop, ends generation
        done = torch.zeros(new.shape[0], dtype=torch.bool, device=new.device)
        if end is not None:  # (generate keeps what held at earlier steps: the newest token is enough)
            done |= new[:, -1] == end
        if len(stop) > 1:
            done |= torch.tensor([args.stop in finished_text(data.decode(before_end(row, end))) for row in new.tolist()],
                                 device=new.device)
        return done

    stream = TextStream(data.decode, encoded[0], args.stop) if args.stream and len(encoded) == 1 else None

    def streamed(new: torch.Tensor) -> torch.Tensor:  # [1, n] -> [1]: writes the text so far
        stream.update(before_end(new[0].tolist(), end))
        return ended(new)

    try:
        out = run.lm.model.generate(prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                                    top_p=args.top_p, stop_token=stop[0] if len(stop) == 1 else None,
                                    padding_mask=padding if bool(padding.any()) else None,
                                    generator=torch.Generator(args.device).manual_seed(args.seed),
                                    compile=args.compile,
                                    stop_when=streamed if stream else ended if end is not None or len(stop) > 1 else None)
    except ValueError as error:  # a bad sampling setting or length, named by generate
        sys.exit(f"error: {error}")
    texts = []
    for n, (row, ids) in enumerate(zip(out.tolist(), encoded), 1):
        new = row[prompt.shape[1]:]  # (the row without its left padding and its start: ids + new)
        kept = before_end(new, end)
        whole = data.decode(ids + kept)
        texts.append(cut_after(whole, args.stop, start=len(data.decode(ids))))
        if len(kept) < len(new) and texts[-1] == whole:  # (said beside the text: a short one is not cut off)
            print(f"(prompt {n}: the model ended the document after {len(kept)} new tokens; --past_document_end goes "
                  "on)", file=sys.stderr, flush=True)
    printed = texts[0] if len(texts) == 1 else "\n\n".join(f"==> prompt {n} <==\n{text}"
                                                            for n, text in enumerate(texts, 1))
    if stream:
        stream.finish(printed)
    else:
        print(printed)
    return printed
