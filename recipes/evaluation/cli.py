"""``python -m recipes eval``: evaluate a recipe's checkpoint with lm-evaluation-harness tasks or with the
built-in long-context suites (docs/evaluation.md).

    python -m recipes eval --config quickstart.yaml --ckpt_path last --tasks zoo_cloze,zoo_passkey
    python -m recipes eval --config my.yaml --ckpt_path best --tasks hellaswag,arc_easy --num_fewshot 0 --limit 200
    python -m recipes eval --config quickstart.yaml --ckpt_path last --suite length --extrapolate
    python -m recipes eval --config quickstart.yaml --ckpt_path last --suite length --multiples 1 --text notes.md
    python -m recipes eval --config quickstart.yaml --ckpt_path last --suite passkey --extrapolate
    python -m recipes eval --config mqar/qcattn.yaml --ckpt_path last --suite mqar --extrapolate

Results: the table is printed; ``--out FILE`` writes the JSON (the harness's ``results``, ``configs``,
versions and sample counts; a suite's rows), a suite also its table (``.md``) and figure (``.png``)
beside it (files already there are refused unless ``--force``); and every score goes to TensorBoard under ``eval/``
in the checkpoint's run folder.
"""

import argparse
import contextlib
import hashlib
import json
import sys
from pathlib import Path
from unittest import mock

from recipes.argtypes import bounded, close_matches, device, positive_int, text_path
from recipes.code_version import code_version


SUITES = ("length", "passkey", "mqar", "sink", "entropy")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m recipes eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, action="append",
                   help="the recipe the checkpoint was trained with (repeat it as for fit: the files merge as fit "
                        "merged them)")
    p.add_argument("--ckpt_path", required=True, help="a checkpoint file, or last / best / swa of the recipe's runs")
    p.add_argument("--allow_classes", nargs="*", action="extend", default=[],
                   help="packages whose classes the checkpoint may name")
    p.add_argument("--tasks", default=None, help="lm-eval task names, comma-separated (zoo_cloze, zoo_passkey ship here)")
    p.add_argument("--include_path", action="append", default=[], help="a folder of task YAMLs (repeatable)")
    p.add_argument("--num_fewshot", type=bounded(int, 0), default=None)
    p.add_argument("--limit", type=bounded(float, 0, above=True), default=None, help="examples per task (a fraction if < 1)")
    p.add_argument("--batch_size", type=positive_int, default=None, help="--tasks: requests scored at once (default 8)")
    p.add_argument("--bootstrap_iters", type=bounded(int, 0), default=1000,
                   help="--tasks: resamples for a bootstrapped metric's standard error (default 1000; 0: no standard "
                        "errors at all, not even a mean's closed-form one)")
    p.add_argument("--suite", choices=SUITES, default=None)
    p.add_argument("--extrapolate", action="store_true",
                   help="evaluate past the model's max_seq_len (plain RoPE and the NTK stretch)")
    p.add_argument("--multiples", type=float, nargs="+", action="extend", default=None,
                   help="lengths as multiples of the training length (length: 1 2 4 8 16; passkey: 0.5 1 2 4; mqar: "
                        "1 2 4 8; sink: 1)")
    p.add_argument("--windows", type=int, default=None, help="length and sink suites: windows per length (default 8)")
    p.add_argument("--text", type=text_path, default=None, metavar="FILE",
                   help="length and sink suites: the windows from this UTF-8 file, tokenized as the run's text, "
                        "instead of the validation split")
    p.add_argument("--trials", type=int, default=None, help="passkey suite: keys per cell (default 8)")
    p.add_argument("--out", default=None, help="where to write the JSON (and a suite's .md and .png); files already "
                                               "there are refused unless --force")
    p.add_argument("--force", action="store_true", help="replace the files of an earlier --out")
    p.add_argument("--log_samples", action="store_true",
                   help="--tasks: also write each example's inputs, the model's answers and scores to "
                        "OUT.samples.jsonl (needs --out)")
    p.add_argument("--gen_kwargs", type=generation_settings, default=None,
                   help="--tasks: settings over every generation task's own, e.g. max_gen_toks=32,temperature=0")
    p.add_argument("--device", type=device, default="cpu", help="cpu (default), cuda, cuda:N, mps")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch's CPU threads (default: the cores other processes leave free, as for fit)")
    return p


def generation_settings(text: str) -> str:
    """lm-eval's ``gen_kwargs`` form, ``key=value[,key=value...]``, checked here rather than inside the harness."""
    pieces = [piece.strip() for piece in text.split(",")]
    if not all("=" in piece and piece.split("=", 1)[0].strip() for piece in pieces):
        raise argparse.ArgumentTypeError(f"{text!r} is not key=value[,key=value...] (e.g. max_gen_toks=32,temperature=0)")
    return text


def samples_path(json_path: Path) -> Path:
    """Where ``--log_samples`` writes: beside ``FILE.json``, ``FILE.samples.jsonl``."""
    return json_path.with_name(json_path.name.removesuffix(".json") + ".samples.jsonl")


def write_samples(samples: dict, out: Path) -> int:
    """lm-eval's per-example records (``results["samples"]``: task → list), one JSON line each with its task's
    name; values JSON cannot hold are written as text. Returns the lines written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"task": task, **record}, default=str) for task, records in samples.items() for record in records]
    out.write_text("".join(line + "\n" for line in lines))
    return len(lines)


def harness_module():
    try:
        from recipes.evaluation import harness
    except ImportError as error:
        raise RuntimeError(f"--tasks needs EleutherAI's lm-evaluation-harness ({error}): pip install -e \".[eval]\" "
                           "(or pip install lm-eval)") from None
    return harness


_SHARED: list[tuple[Path, dict]] = []  # inside shared_task_index(): (the zoo's task folder, {include paths: manager})


@contextlib.contextmanager
def shared_task_index():
    """Evaluations inside the block share the zoo's task folder and one TaskManager per ``--include_path`` list (and
    per index, ``check_tasks``): a TaskManager with the harness's ~14K task YAMLs takes about 10 s on 2 cores to
    build, which a sweep scoring N runs would pay N times. (An include folder must not change inside the block.)"""
    from recipes.evaluation.tasks import task_folder

    with task_folder() as own_tasks:
        _SHARED.append((own_tasks, {}))
        try:
            yield
        finally:
            _SHARED.pop()


def check_tasks(names: list[str], include_paths: list[str], own_tasks: Path, managers: dict | None = None):
    """The harness's TaskManager for ``names``, with the zoo's own tasks (the YAMLs in ``own_tasks``) and
    ``include_paths``. Where every name is a task of those folders, the manager indexes them alone; else it indexes the
    harness's own ~14K task YAMLs as well (about 10 s on 2 cores), for a hub task, a group, a tag, or the close matches
    of an unknown name. A folder's task is the one run under its name either way, as in lm-eval 0.4.13 (0.4.5 ran its
    own task of that name with the full index). The manager for these paths and that choice is the one in
    ``managers`` where there is one, else a new one, kept there; unknown names are refused by name."""
    from lm_eval.tasks import TaskManager

    for folder in include_paths:
        if not Path(folder).is_dir():
            raise FileNotFoundError(f"--include_path {folder}: no such folder")
    managers = {} if managers is None else managers

    def manager(with_harness_tasks: bool):
        key = (tuple(include_paths), with_harness_tasks)
        if key not in managers:
            managers[key] = TaskManager(include_path=[str(own_tasks), *include_paths],
                                        include_defaults=with_harness_tasks)
        return managers[key]

    if set(names) <= set(manager(False).all_subtasks):  # tasks alone: a group or tag may reach the harness's own
        return manager(False)
    everything = manager(True)
    known = set(everything.all_tasks)
    unknown = [name for name in names if name not in known]
    if unknown:
        hints = {name: close_matches([name], known, n=3) for name in unknown}
        raise ValueError("unknown task(s): " + "; ".join(f"{n!r} (close: {', '.join(h) or 'none'})" for n, h in hints.items())
                         + ". Hub tasks need the harness's task list (python -m lm_eval --tasks list); local ones an "
                         "--include_path folder of YAMLs")
    return everything


def run_harness(model, data, args) -> tuple[dict, str, str | None]:
    """lm-eval's results, its table, and a note when requests were longer than the model takes (cut from the left)."""
    harness = harness_module()
    from lm_eval import simple_evaluate
    from lm_eval.utils import make_table

    from recipes import runs

    names = [name.strip() for name in args.tasks.split(",") if name.strip()]
    # alone, an index of its own (a sweep's evaluations share the sweep's)
    with contextlib.nullcontext() if _SHARED else shared_task_index(), without_harness_bookkeeping():
        own_tasks, managers = _SHARED[-1]
        manager = check_tasks(names, args.include_path, own_tasks, managers)
        lm = harness.ZooLM(model, runs.text_tokenizer(data, "--tasks"), **given(batch_size=args.batch_size))
        results = simple_evaluate(model=lm, tasks=names, num_fewshot=args.num_fewshot, limit=args.limit,
                                  task_manager=manager, log_samples=args.log_samples,
                                  bootstrap_iters=args.bootstrap_iters,
                                  gen_kwargs=args.gen_kwargs)
    note = None
    if lm.requests_cut:
        note = (f"note: {lm.requests_cut} of {lm.requests_seen} requests were longer than the model's "
                f"max_seq_len={lm.max_length} and were cut from the left, as lm-eval's Hugging Face model cuts them: "
                "where the answer depends on what was cut (a passkey's key), the score is chance's")
    return results, make_table(results), note


@contextlib.contextmanager
def without_harness_bookkeeping():
    """After every evaluation lm-eval records the working folder's git commit — a ``git describe`` whose "fatal: not
    a git repository" reached the terminal from any other folder — and torch's environment report (about 2 s of
    subprocesses); the zoo keeps neither (its JSON holds the results, configs and versions). Both are names of
    ``lm_eval.evaluator``, replaced for the call where that version has them."""
    import lm_eval.evaluator as evaluator

    skipped = {"get_git_commit_hash": lambda: None, "add_env_info": lambda results: None}
    with contextlib.ExitStack() as stack:
        for name, stand_in in skipped.items():
            if hasattr(evaluator, name):
                stack.enter_context(mock.patch.object(evaluator, name, stand_in))
        yield


def run_suite(model, data, recipe: dict, args) -> dict:
    import torch

    from recipes import runs
    from recipes.evaluation import suites

    init = (recipe.get("data") or {}).get("init_args") or {}

    def lengths(defaults: tuple, base: int, extra: int = 0) -> dict:
        """``--multiples``, or the suite's defaults; without ``--extrapolate`` only the defaults the model takes (its
        ``max_seq_len``; ``extra`` tokens beyond each length), with a note naming the others."""
        if args.multiples:
            return {"multiples": tuple(args.multiples)}
        fits = tuple(m for m in defaults if int(m * base) + extra <= model.max_seq_len)
        if args.extrapolate or len(fits) == len(defaults) or not fits:
            return {}  # (none fits: the suite names the first length past max_seq_len)
        left = [str(int(m * base)) for m in defaults if m not in fits]
        print(f"note: length{'s' * (len(left) > 1)} {', '.join(left)} left out, past the model's max_seq_len="
              f"{model.max_seq_len}{f' with the answer (a key of {extra} tokens)' if extra else ''}; --extrapolate "
              "evaluates past it (plain RoPE and the NTK stretch)", file=sys.stderr, flush=True)
        return {"multiples": fits}

    if args.suite == "mqar":
        if not hasattr(data, "test") or not hasattr(data.test, "task"):
            raise ValueError(f"--suite mqar needs an MQAR recipe; this one's data module is {type(data).__name__}")
        task = dict(data.test.task)
        return suites.mqar_suite(model, task, extrapolate=args.extrapolate,
                                 **lengths(suites.MQAR_MULTIPLES, task["seq_len"]))
    trained = int(init.get("seq_len", getattr(data, "seq_len", 0)) or 0)
    if trained < 1:
        raise ValueError("the recipe's data has no seq_len: the training length the suite is relative to")
    if args.suite in ("length", "sink", "entropy"):
        suite, defaults = {"length": (suites.length_suite, suites.LENGTH_MULTIPLES),
                           "sink": (suites.sink_suite, suites.SINK_MULTIPLES),
                           "entropy": (suites.entropy_suite, suites.SINK_MULTIPLES)}[args.suite]
        settings = dict(**given(windows=args.windows), extrapolate=args.extrapolate, **lengths(defaults, trained))
        if args.text is not None:  # your text, read as the run reads text
            text = Path(args.text).read_text(encoding="utf-8-sig")  # (-sig: a leading byte-order mark is no text)
            tokens = torch.tensor(runs.text_tokenizer(data, "--text").encode(text), dtype=torch.long)  # [n]
            return {**suite(model, tokens, trained, source=args.text, **settings), "text": args.text}
        if not hasattr(data, "validation_tokens"):
            raise ValueError(f"--suite {args.suite} needs a text corpus with a validation split (or --text FILE); "
                             f"this is {type(data).__name__}")
        return suite(model, data.validation_tokens(), trained, **settings)
    encode = runs.text_tokenizer(data, "--suite passkey").encode
    answer = len(encode(" 99999"))  # (a key's tokens follow the context of each length)
    return suites.passkey_suite(model, encode, trained, **given(trials=args.trials), extrapolate=args.extrapolate,
                                **lengths(suites.PASSKEY_MULTIPLES, trained, answer))


def log_scalars(checkpoint: Path, values: dict[str, float], step: int) -> Path | None:
    from torch.utils.tensorboard import SummaryWriter

    from recipes.runs import run_folder

    folder = run_folder(checkpoint)
    if folder is None or not values:
        return None
    with SummaryWriter(str(folder)) as writer:
        for tag, value in values.items():
            writer.add_scalar(tag, value, step)
    return folder


def harness_scalars(results: dict) -> dict[str, float]:
    out = {}
    for task, metrics in (results.get("results") or {}).items():
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and "stderr" not in key and key != "alias":
                out[f"eval/{task}/{key.split(',')[0]}"] = float(value)
    return out


def given(**options) -> dict:
    """The options the command line set (not None): the rest keep the defaults of the function they go to, stated
    once, there (``--windows 0`` is given, and refused by the suite)."""
    return {name: value for name, value in options.items() if value is not None}


SCORE_SETTINGS = ("tasks", "include_path", "num_fewshot", "limit", "gen_kwargs", "bootstrap_iters", "suite",
                  "extrapolate", "multiples", "windows", "trials", "text")  # (not the batch, device or threads)


def score_settings(args: argparse.Namespace) -> dict:
    """The options an evaluation's scores depend on, as its ``--out`` JSON records them (``settings``; for ``--text``,
    the file's content hash beside its name): a sweep's stored result is reused only for the same ones."""
    settings = {name: getattr(args, name) for name in SCORE_SETTINGS}
    if args.text is not None:
        settings["text"] = f"{args.text} (sha256 {content_hash([Path(args.text)])})"
    # a task folder's YAMLs and data, not only its path: a task made again with other questions is another task
    settings["include_path"] = [f"{folder} (sha256 {content_hash(task_files(Path(folder)))})"
                                for folder in args.include_path]
    return json.loads(json.dumps(settings, default=str))


def task_files(folder: Path) -> list[Path]:
    """The files a task folder's scores depend on: its own, then the local data files its YAMLs read from elsewhere
    (``dataset_kwargs.data_files``, matched as ``datasets`` matches them, against the working folder as lm-eval
    resolves them; or a local ``dataset_path``): a task whose questions lie outside the folder is another task
    when they change, too."""
    import yaml

    from recipes.data.hf_datasets import HFDataset

    class Lenient(yaml.SafeLoader):  # (lm-eval's tags, such as !function, name code: read as nothing)
        pass

    Lenient.add_multi_constructor("", lambda loader, suffix, node: None)
    own = sorted(f for f in folder.rglob("*") if f.is_file())
    data = set()
    for path in own:
        if path.suffix not in (".yaml", ".yml"):
            continue
        try:
            task = yaml.load(path.read_text(), Loader=Lenient)
        except (yaml.YAMLError, UnicodeDecodeError):
            continue  # (lm-eval names a broken YAML itself)
        if not isinstance(task, dict):
            continue
        kwargs = task.get("dataset_kwargs")
        files = kwargs.get("data_files") if isinstance(kwargs, dict) else None
        if files is not None:  # (matched as the load matches them: relative to a local dataset folder, else here)
            with contextlib.suppress(FileNotFoundError, TypeError):  # (lm-eval names data that is not there)
                found = HFDataset(str(task.get("dataset_path", "")), data_files=files).data_file_paths()
                data.update(Path(f).resolve() for f in found)
        local = Path(str(task.get("dataset_path", ""))).expanduser()
        if task.get("dataset_path") and local.exists():
            data.update(f.resolve() for f in ([local] if local.is_file() else local.rglob("*")) if f.is_file())
    inside = {f.resolve() for f in own}
    return own + sorted(data - inside)


def content_hash(files: list[Path]) -> str:
    """16 hex digits of the SHA-256 of ``files``' names and bytes, in order."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def unused_options(args: argparse.Namespace) -> list[str]:
    """The options given that nothing this evaluation runs would read, each with what reads it: ignored, they would
    leave a user believing a number was measured as they asked."""
    applies = [("--windows", args.windows, "--suite length, sink or entropy", args.suite in ("length", "sink", "entropy")),
               ("--text", args.text, "--suite length, sink or entropy", args.suite in ("length", "sink", "entropy")),
               ("--trials", args.trials, "--suite passkey", args.suite == "passkey"),
               ("--multiples", args.multiples, "a --suite", args.suite),
               ("--extrapolate", args.extrapolate, "a --suite", args.suite),
               *((flag, getattr(args, flag[2:]), "--tasks", args.tasks)
                 for flag in ("--num_fewshot", "--limit", "--include_path", "--gen_kwargs", "--batch_size"))]
    return [f"{flag} (it goes with {reader})" for flag, value, reader, runs in applies
            if value is not None and value is not False and value != [] and not runs]  # (0 is given: not `in`)


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    if not args.tasks and not args.suite:
        sys.exit("error: name --tasks and/or a --suite to run")
    unused = unused_options(args)
    if unused:
        sys.exit(f"error: this evaluation would not use {', '.join(unused)}: leave it out, or run what reads it")
    from recipes.checkpoints import load_checkpoint
    from recipes.training import averaged_weights, averaged_weights_note
    from recipes.evaluation.suites import result_paths
    from recipes.outputs import refuse_overwrite
    from recipes.runs import load_run

    if args.log_samples and not (args.tasks and args.out):
        sys.exit("error: --log_samples writes the examples of --tasks beside --out FILE (FILE.samples.jsonl): name both")
    from recipes.run_report import choose_threads

    said = choose_threads(args.threads)
    if said:  # (beside the tables, which a user may pipe)
        print(said, file=sys.stderr, flush=True)
    try:
        written = result_paths(args.out) if args.out else []
        samples = [samples_path(written[0])] if args.log_samples else []
        if not args.force:  # before the evaluation, which may take long
            refuse_overwrite((written if args.suite else written[:1]) + samples, lost="an earlier evaluation's results")
        # (a suite reads the validation text: the data module is built whole)
        run = load_run(args.config, args.ckpt_path, device=args.device, allow_classes=args.allow_classes,
                       text_only=not args.suite or args.text is not None)
        model, data, path, recipe = run.lm.model, run.data, run.checkpoint, run.recipe
        record = load_checkpoint(path, mmap=True)
        step = int(record.get("global_step", 0))
        output: dict = {"checkpoint": str(path), "step": step, "settings": score_settings(args),
                        "code": code_version()}  # (a sweep that reuses these scores says where its code differs)
        averaging = averaged_weights(record)
        if averaging:  # (said: a comparison with another run's trained weights is not like for like)
            output["weights"] = f"{averaging} average"
            print(averaged_weights_note(record, path), file=sys.stderr, flush=True)
        scalars = {}
        if args.tasks:
            results, text, cut = run_harness(model, data, args)
            print(text)
            output["harness"] = {key: results.get(key) for key in ("results", "configs", "versions", "n-shot",
                                                                  "higher_is_better", "n-samples") if key in results}
            if cut:
                print(cut, file=sys.stderr, flush=True)
                output["harness"]["note"] = cut
            scalars.update(harness_scalars(results))
            if samples:
                print(f"wrote {samples[0]} ({write_samples(results.get('samples') or {}, samples[0])} examples)")
        if args.suite:
            from recipes.evaluation.suites import scalars as suite_scalars, table, write_result

            result = run_suite(model, data, recipe, args)
            print(table(result))
            output["suite"] = result
            scalars.update(suite_scalars(result))
            if args.out:
                print("wrote", ", ".join(map(str, write_result(result, Path(args.out)))))
    except (FileNotFoundError, FileExistsError, ValueError, RuntimeError) as error:
        sys.exit(f"error: {error}")
    except ConnectionError as error:  # a hub task's dataset, offline: the harness's traceback said only this
        sys.exit(f"error: {error}. A Hugging Face Hub task downloads its dataset on first use (then it is cached); "
                 "offline, run the zoo's own tasks (zoo_cloze, zoo_passkey) or --include_path YAMLs over local files")
    if args.out:
        written[0].parent.mkdir(parents=True, exist_ok=True)
        written[0].write_text(json.dumps(output, indent=1, default=str))
        print(f"wrote {written[0]}")
    folder = log_scalars(path, scalars, step)
    if folder is not None:
        print(f"TensorBoard: {len(scalars)} scalar{'s' * (len(scalars) != 1)} under eval/ in {folder} (step {step})")
    return output
