"""``python -m recipes.benchmarks.document_start``: what the token before a prompt is worth (docs/decoding.md).

    python -m recipes.benchmarks.document_start --config english/attention/ssd_qcattn.yaml --ckpt_path last

Each validation document of the run's corpus that has at least ``--tokens + 1`` tokens is read twice: after the
start-of-document token (the end-of-document one, or the corpus's own ``start_of_document_token``), as ``python -m
recipes generate`` reads a prompt, and alone, as a window cut in the middle of a document begins. Prints the mean
loss (nats) of its tokens 2 … ``tokens + 1`` given its first, by position, both ways.
"""

import argparse
import sys

from recipes.argtypes import positive_int


def documents(tokens, end: int, start: int, length: int) -> list:
    """The first ``length`` tokens of each document of the stream ``tokens [n]`` (documents end with ``end``; a
    ``start`` of their own that opens them is left out) that has that many."""
    cuts = [0] + [i + 1 for i in (tokens == end).nonzero().flatten().tolist()]
    pieces = [tokens[a:b - 1] for a, b in zip(cuts, cuts[1:])]  # (each without its end; an unended tail is no document)
    pieces = [p[1:] if start != end and len(p) and p[0] == start else p for p in pieces]
    return [p[:length] for p in pieces if len(p) >= length]


def losses(model, docs, first: int | None, batch: int):
    """``[D, n]`` the loss of each document's tokens 2 … n + 1 (``docs`` of n + 1 tokens each) given what comes
    before them, with ``first`` put before each document (None: nothing)."""
    import torch
    import torch.nn.functional as F

    out = []
    for i in range(0, len(docs), batch):
        x = torch.stack(docs[i:i + batch])  # [b, n + 1]
        if first is not None:
            x = torch.cat([torch.full_like(x[:, :1], first), x], dim=1)  # [b, n + 2]
        with torch.no_grad():
            logits = model(x[:, :-1])  # [b, n (+ 1), V]
        loss = F.cross_entropy(logits.transpose(1, 2).float(), x[:, 1:], reduction="none")  # [b, n (+ 1)]
        out.append(loss[:, 1:] if first is not None else loss)  # (the document's first token: no context alone)
    return torch.cat(out)


def buckets(n: int) -> list[tuple[int, int]]:
    """Position ranges (0-based, over tokens 2 … n + 1) that double in length: 1, 3, 12, then the rest."""
    edges = [e for e in (0, 1, 4, 16) if e < n] + [n]
    return list(zip(edges, edges[1:]))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.document_start", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, action="append", help="the recipe the run trained with")
    parser.add_argument("--ckpt_path", default="last", help="a checkpoint file, or last / best / swa (default last)")
    parser.add_argument("--tokens", type=positive_int, default=32, help="tokens of each document scored (default 32)")
    parser.add_argument("--batch", type=positive_int, default=64, help="documents a forward (default 64)")
    parser.add_argument("--allow_classes", nargs="*", action="extend", default=[])
    args = parser.parse_args(argv)
    from recipes.runs import load_run

    try:
        run = load_run(args.config, args.ckpt_path, allow_classes=args.allow_classes, text_only=False)
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"error: {error}")
    data = run.data
    if not hasattr(data, "end_of_document") or not hasattr(data, "validation_tokens"):
        sys.exit(f"error: the run's data module {type(data).__name__} has no documents (a TokenizedCorpus has)")
    end = data.end_of_document
    start = getattr(data, "start_of_document", end)
    docs = documents(data.validation_tokens(), end, start, args.tokens + 1)
    if not docs:
        sys.exit(f"error: no validation document has {args.tokens + 1} tokens; give a smaller --tokens")
    model = run.lm.model
    after, alone = losses(model, docs, start, args.batch), losses(model, docs, None, args.batch)  # [D, n] each
    print(f"{len(docs)} validation documents of at least {args.tokens + 1} tokens, {run.checkpoint}")
    print("| tokens | after the start token | alone | difference |\n|---|---|---|---|")
    rows = []
    for lo, hi in [*buckets(args.tokens), (0, args.tokens)]:
        a, b = float(after[:, lo:hi].mean()), float(alone[:, lo:hi].mean())
        label = f"{lo + 2}" if hi == lo + 1 else f"{lo + 2}–{hi + 1}"
        rows.append({"tokens": label, "after_start": a, "alone": b})
        print(f"| {label}{' (all)' if (lo, hi) == (0, args.tokens) else ''} | {a:.3f} | {b:.3f} | {b - a:+.3f} |")
    return {"documents": len(docs), "rows": rows}


if __name__ == "__main__":
    main()
