"""``python -m recipes.benchmarks.decode_ops``: what one eager decoding step asks of its host — the ops torch
dispatches for it, the host syncs among them and its time — the zoo's against Hugging Face's on the same weights
(docs/decoding.md).

    python -m recipes.benchmarks.decode_ops                               # llama, mamba2, hybrid; width 64, 8 layers
    python -m recipes.benchmarks.decode_ops --models llama --width 256 --rounds 15
    python -m recipes.benchmarks.decode_ops --models llama --device cuda --dtype bf16 --rounds 5   # what a GPU launches

An eager step on a GPU is its host's work: each op is dispatched and launched from Python, and the GPU waits
for the next; a sync (a tensor's value read on the host) makes the host wait for the GPU as well. This machine
needs no GPU to count them: the ops a step dispatches are counted at torch's dispatcher (a ``TorchDispatchMode``;
views, allocations and other ops that launch no kernel left out, syncs counted apart) as those of a generation of
5 new tokens less those of one of 4. On a CPU the zoo runs in two forms: ``zoo, CPU`` as it runs there (a call of
attention whose entries one sum, read back, shows finite skips the non-finite bookkeeping) and ``zoo, accelerator``
as it runs on a GPU (no such sum: every step keeps the bookkeeping, here forced); on a GPU it runs as ``zoo``. The
hybrid (TransXSSM's ``SM×7 AM``) has no Hugging Face form.

``step ms`` is each form's step on ``--device`` (this machine's CPU unless told), from the median times of
generations of ``--new-tokens`` tokens and of one token in interleaved rounds (a narrow model makes it the host's
time: each op's work is tiny), and ``× HF`` Hugging Face's step over it (for the hybrid: the first zoo form's).
Every generation's tokens are checked against the zoo model's full forward (``argmax``, as in
``recipes.benchmarks.decode_hf``). Needs the dev extras.
"""

import argparse
import collections
import statistics
import tempfile
from collections.abc import Callable
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from components import Context
from recipes.argtypes import device, positive_int
from recipes.benchmarks.decode_hf import DTYPES, first_departure, hf_model, zoo_hybrid
from recipes.benchmarks.timing import interleaved_seconds

# ops that launch no kernel: views and metadata, allocations without a fill
LAUNCH_NOTHING = frozenset({
    "view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "unsqueeze", "squeeze", "expand", "select",
    "slice", "as_strided", "permute", "detach", "alias", "split", "split_with_sizes", "unbind", "chunk", "narrow",
    "unflatten", "flatten", "view_as", "movedim", "diagonal", "lift_fresh", "empty", "empty_like", "new_empty",
    "empty_strided", "sym_size", "sym_stride", "promote_types", "result_type"})
SYNCS = frozenset({"_local_scalar_dense", "is_nonzero", "equal"})  # a value read back: .item(), bool(t), torch.equal


class OpCount(TorchDispatchMode):
    """Counts by name the ops dispatched while it is active, those in ``LAUNCH_NOTHING`` left out."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in LAUNCH_NOTHING:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def step_ops(generate: Callable[[int], object]) -> collections.Counter:
    """The ops of one decoding step by name: those of ``generate(5)`` (5 new tokens) less those of ``generate(4)``."""
    with OpCount() as four:
        generate(4)
    with OpCount() as five:
        generate(5)
    five.ops.subtract(four.ops)
    return +five.ops  # (positive counts only)


def as_on_an_accelerator():
    """A context in which attention's CPU-only check is off: the bookkeeping of every step, as on a GPU."""
    return mock.patch.object(Context, "_known_finite", lambda self, *tensors: False)


def zoo_forms(zoo, prompt: torch.Tensor, device: str) -> dict[str, Callable[[int], object]]:
    """The zoo's generations of ``n`` new tokens to count and time: on a CPU as it runs there and as it runs on an
    accelerator; elsewhere as it runs (the CPU's shortcut is off there already)."""
    def as_it_runs(n: int):
        return zoo.generate(prompt, n)

    def as_on_a_gpu(n: int):
        with as_on_an_accelerator():
            return zoo.generate(prompt, n)

    if device != "cpu":
        return {"zoo": as_it_runs}
    return {"zoo, CPU": as_it_runs, "zoo, accelerator": as_on_a_gpu}


@torch.no_grad()
def run(kind: str, args) -> list[dict]:
    """Rows of the table for one model: each form's ops a step (``ops``, syncs apart; ``kinds``: a Counter by name),
    host syncs a step, step ms, × HF (None where the step is within the timer's noise), argmax."""
    import transformers  # the dev extra, named in the error if missing

    from recipes.hf import from_pretrained

    if kind == "hybrid":
        zoo, hf = zoo_hybrid(args.width, args.layers, args.vocab), None
    else:
        hf = hf_model(kind, args.width, args.layers, args.vocab)
        with tempfile.TemporaryDirectory(prefix=f"decode-ops-{kind}-") as folder:
            transformers.utils.logging.disable_progress_bar()
            hf.save_pretrained(folder)
            zoo = from_pretrained(folder).eval()
        hf.generation_config.eos_token_id = None  # (as in decode_hf: every row runs its n tokens)
        hf = hf.to(args.device, DTYPES[args.dtype])
    zoo = zoo.to(args.device, DTYPES[args.dtype])
    torch.manual_seed(1)
    prompt = torch.randint(0, args.vocab, (args.batch, args.prompt)).to(args.device)
    forms: dict[str, Callable[[int], object]] = {}
    if hf is not None:
        common = {"do_sample": False, "pad_token_id": 0, "attention_mask": torch.ones_like(prompt)}
        forms["hf"] = lambda n: hf.generate(prompt, max_new_tokens=n, **common)
    forms.update(zoo_forms(zoo, prompt, args.device))
    ops = {name: step_ops(generate) for name, generate in forms.items()}
    n = args.new_tokens
    cases = {f"{name} {length}": (lambda g=generate, m=length: g(m))
             for name, generate in forms.items() for length in (1, n)}
    times = {case: statistics.median(t) for case, t in interleaved_seconds(cases, args.rounds).items()}
    step_ms = {name: 1e3 * (times[f"{name} {n}"] - times[f"{name} 1"]) / max(n - 1, 1) for name in forms}
    base = step_ms["hf" if hf is not None else next(name for name in forms if name.startswith("zoo"))]
    rows = []
    for name, generate in forms.items():
        departs = first_departure(zoo, generate(n), args.prompt)
        syncs = sum(ops[name][sync] for sync in SYNCS)
        rows.append({"model": kind, "form": name, "ops": sum(ops[name].values()) - syncs, "syncs": syncs,
                     "kinds": ops[name], "step_ms": step_ms[name],
                     "ratio": base / step_ms[name] if step_ms[name] > 0 else None, "argmax": departs or "ok"})
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.decode_ops",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    models = ["llama", "mamba2", "hybrid"]
    parser.add_argument("--models", nargs="+", default=models, choices=models)
    parser.add_argument("--batch", type=positive_int, default=1)
    parser.add_argument("--width", type=positive_int, default=64, help="narrow: the step's time is the host's")
    parser.add_argument("--layers", type=positive_int, default=8)
    parser.add_argument("--vocab", type=positive_int, default=256)
    parser.add_argument("--prompt", type=positive_int, default=16, help="prompt tokens")
    parser.add_argument("--new-tokens", type=positive_int, default=64)
    parser.add_argument("--rounds", type=positive_int, default=7)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--device", type=device, default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="weights and activations")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {args.threads} thread(s)"
    print(f"torch {torch.__version__}, {where}, {args.dtype}; {args.layers} layers × {args.width}, batch "
          f"{args.batch}, prompt {args.prompt}; step ms from {args.new_tokens} new tokens, median of {args.rounds} "
          f"interleaved rounds\n", flush=True)
    print("| model | form | ops a step | syncs a step | commonest | step ms | × HF | argmax |\n"
          "|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for kind in args.models:
        for r in run(kind, args):
            kinds = ", ".join(f"{name} {count}" for name, count in r["kinds"].most_common(6))
            ratio = f"{r['ratio']:.2f}×" if r["ratio"] is not None else "noise"
            print(f"| {r['model']} | {r['form']} | {r['ops']} | {r['syncs']} | {kinds} | {r['step_ms']:.3f} | {ratio} "
                  f"| {r['argmax']} |", flush=True)
            rows.append(r)
    return rows


if __name__ == "__main__":
    main()
