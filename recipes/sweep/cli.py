"""Run a family of recipes and compare them: ``python -m recipes.sweep FOLDER``.

    python -m recipes.sweep positions                          # every recipes/configs/positions/*.yaml
    python -m recipes.sweep positions --only ssd_rope ssd_conv  # a subset
    python -m recipes.sweep positions --set trainer.max_steps=50  # any override, for every run
    python -m recipes.sweep positions --table-only              # tabulate the latest existing runs
    python -m recipes.sweep positions --seeds 3 --jobs 2 --baseline ssd_rope   # statistics over seeds

Each recipe runs as its own ``python -m recipes fit`` process, logging into a run folder named for
this sweep (``<logger root>/sweep_<time>``; its output goes to ``runs/sweep-logs/<time>/NAME.log``);
then one markdown table is printed from exactly those folders: final validation loss, perplexity and
accuracy, parameters, and median training tokens per second. A run that failed is marked FAILED in the
table (with its exit status and log), and the sweep then exits with status 1.

With ``--seeds N`` each recipe runs N times (``seed_everything`` 0 … N-1; ``--first-seed K``: K … K+N-1, to
add seeds to an earlier sweep and tabulate both with ``--from``), ``--jobs J`` at a time, each
process given ``cores // J`` threads so the runs do not oversubscribe the machine. The table then
gives, per recipe, the final validation loss and accuracy as mean ± standard deviation with a 95%
interval of the mean, the number of runs behind each cell (of those launched), and with
``--baseline NAME`` the difference of mean loss to that recipe with the p-value of Welch's t-test
(:mod:`recipes.stats`). The cells come from exactly the runs launched; a failed run is named under the
table and left out of its recipe's cells.

Every sweep writes ``runs/sweep-logs/<time>/``: the runs' logs, ``sweep.json`` (the runs it launched:
recipe, seed, run folder, exit status; rewritten as each run ends), ``table.md`` (the table printed),
and ``val_loss.png``, each recipe's validation-loss curve (with seeds: the mean over seeds and a band
of ± one standard deviation). ``--from runs/sweep-logs/<time> …`` tabulates and plots earlier sweeps
again from their ``sweep.json``, exactly their runs (several folders: one table, in the first; ``--only NAME …``:
those recipes' runs alone). An option that launches runs (``--set``, ``--seeds``, a launcher…) has no place there and
is refused, not ignored.

Each sweep also writes ``record.json``, rewritten as each run ends: the manifest with every finished run's
numbers (final and best validation loss, accuracy, speed, validation-loss curve, hyper-parameters). ``--from``
takes such a file as well as a folder, so a sweep can be tabulated and plotted again once its run folders are
gone — on another machine, or from the copy kept with the results (``docs/results/records/``, one per sweep
quoted in docs/results.md).

``--vs KEY`` adds ``<metric>_vs_<KEY>.png``: the
final ``--metric`` (default ``val_acc``) against a model hyper-parameter such as ``d_model``, or a data or trainer
setting of the runs' ``config.yaml`` such as ``data.init_args.seq_len``, one line per recipe name without its last
``_`` part (``ssd_T64_d16``, ``ssd_T64_d32`` → line ``ssd_T64``; a grid's ``lr0.002``, ``lr0.006`` → one line; a
family's ``dense`` beside ``dense_lr0.012`` → one line), and under the table the same points as a table, each line's
best value in bold.

Ctrl+C (or SIGTERM) stops the sweep: no run starts, each running run gets one SIGINT (it writes its ``last.ckpt``
and stops), and the sweep says what finished; ``--resume runs/sweep-logs/<time>`` runs the rest again as they were
launched, each stopped run from its ``last.ckpt``, then tabulates the whole sweep. A run reads its recipe file when
it starts: one edited after the sweep began does not start (``NOT STARTED`` in the table; put it back, then resume).

``--launcher gpus`` runs one recipe per visible GPU (or group of ``--devices-per-run``) at a time;
``--launcher slurm`` submits the runs as a submitit job array, requeued from their ``last.ckpt`` on
preemption, and tabulates them when the array is done (:mod:`recipes.launchers`, docs/training.md).

TensorBoard: every run logs to ``<save_dir>/<family>/<recipe>/sweep_<time>[_seed<k>]``, so
``tensorboard --logdir runs/<family>`` overlays the family's recipes and seeds (filter on
``sweep_<time>`` for one sweep); the sweep prints that command.

Fine-tuning a family's runs: ``--init-from runs/sweep-logs/<time> …`` starts each run from the ``last.ckpt`` of
the earlier sweep's run with the same recipe name and seed (``--model.init_from``; all are checked before
anything launches). A family whose ``_family.yaml`` says ``starts_from: FOLDER`` (english/transfer/finetune)
is only run that way, from a sweep of that folder, or with ``--init-from none``: from scratch, the control.
"""

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

from recipes.argtypes import bounded, did_you_mean, positive_int
from recipes.evaluation.cli import SUITES
from recipes.launchers import LAUNCHERS, RECIPE_EDITED
from recipes.sweep.launch import (SweepInterrupted, family_settings, launch, logger_root, newest_run, recipe_files,
                                  recipe_logger, resume, seed_list, starting_checkpoints)
from recipes.sweep.report import report
from recipes.sweep.records import Run, pooling_problem, read_manifest, write_record


def check_vs_key(key: str, config: Path | None = None) -> None:
    """Before any run starts: ``--vs``'s key is one a run records (an argument of the model, its sizes, or a dotted
    key under one, such as ``mixers.A.init_args.n_heads``; or a data or trainer setting such as
    ``data.init_args.seq_len``, looked up in recipe ``config`` as its run will parse it), not a typo found when the
    sweep is over."""
    from recipes.module import hyperparameter_keys
    from recipes.sweep.records import CONFIG_SECTIONS

    top = key.split(".")[0]
    if top in CONFIG_SECTIONS:
        if config is not None:
            from recipes.ckpt_path import dotted_get

            from recipes.cli import parse_recipe

            parsed = parse_recipe(["--config", str(config)]).config
            try:
                dotted_get(parsed.get("fit", parsed), key)
            except KeyError:
                sys.exit(f"error: --vs {key}: not a setting of {config.name} (its run's config.yaml would not hold it; "
                         f"e.g. data.init_args.seq_len)")
        return
    known = hyperparameter_keys()
    if top not in known:
        hint = did_you_mean([top], known) or ("e.g. d_model, lr, n_params (a run's hparams.yaml lists them), or a data "
                                              "or trainer setting such as data.init_args.seq_len")
        sys.exit(f"error: --vs {key}: not a hyper-parameter a run records; {hint}")


def note_erased_differences(configs: list[Path], settings: list[str]) -> None:
    """Say when a ``--set KEY=VALUE`` replaces a setting the family's recipes differ in (a grid's axis, say): every
    run then takes the one value, and the comparison the family was written for is gone from the table."""
    from recipes.ckpt_path import dotted_get
    from recipes.recipe_files import read_config

    def setting(recipe: dict, key: str):
        try:
            return dotted_get(recipe, key)
        except KeyError:
            return "(not set)"

    recipes = {config.stem: read_config(str(config)) for config in configs}
    for item in settings:
        key, value = item.split("=", 1)
        found = {name: setting(recipe, key) for name, recipe in recipes.items()}
        if len({repr(v) for v in found.values()}) > 1:
            shown = ", ".join(f"{name}: {v}" for name, v in list(found.items())[:4]) + (" …" if len(found) > 4 else "")
            print(f"note: --set {item} replaces a setting the recipes differ in ({shown}): every run takes {value}, "
                  "so the runs no longer differ in it", file=sys.stderr)


def model_build_error(config) -> str | None:
    """The error building the model of a recipe's parsed ``config`` (:func:`parse_recipe`'s) raises, on the ``meta``
    device (no memory, no data read, no checkpoint loaded; the vocabulary the data's settings name, else bytes'), or
    None. What the parser cannot see — a width the heads do not divide, an unbound letter — shows here."""
    import torch

    from recipes import LanguageModel

    config = config.get("fit", config)
    options = config["model"].as_dict()
    data = config.get("data") or {}
    init_args = (data.as_dict() if hasattr(data, "as_dict") else dict(data)).get("init_args") or {}
    vocab = init_args.get("padded_vocab_size") or init_args.get("vocab_size")
    options.update(init_from=None, vocab_size=vocab if isinstance(vocab, int) else 256)
    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            LanguageModel(**options)
    except Exception as error:  # (any: a user's mixer raises its own)
        return f"{type(error).__name__}: {error}"
    return None


RUN_ONLY = ("config", "ckpt_path", "weights_only", "trainer.logger.init_args.version", "trainer.enable_progress_bar")
"""Keys of a run's ``config.yaml`` that say how it was launched, not what it computed."""


def departures(config: Path, run: Path) -> dict[str, tuple]:
    """``{key: (the recipe's value, the run's)}`` where the run in folder ``run`` was fit with other settings than
    its recipe file now resolves to (``--set``, a flag given to ``fit``, an edit of the file since); empty where the
    run kept no ``config.yaml`` or the recipe no longer parses (nothing to compare)."""
    import yaml

    from recipes.cli import parse_recipe
    from recipes.recipe_files import flat_settings

    try:
        ran = flat_settings(yaml.safe_load((run / "config.yaml").read_text()))
        recipe = parse_recipe(["--config", str(config)]).config
    except (OSError, yaml.YAMLError, SystemExit):
        return {}
    recipe = flat_settings(recipe.get("fit", recipe).as_dict())
    absent = "(not set)"
    return {key: (recipe.get(key, absent), ran.get(key, absent)) for key in sorted(set(recipe) | set(ran))
            if key not in RUN_ONLY and recipe.get(key, absent) != ran.get(key, absent)}


def departure_note(runs: list) -> str | None:
    """One note naming the settings the tabulated runs (``--table-only``: each recipe's newest) were fit with that
    their recipe files do not hold, which runs, and the recipes' values: a debugging run with another learning
    rate, or a sweep's ``--set``, would otherwise stand in the table as the recipe."""
    found: dict[str, dict[str, tuple]] = {}  # {key: {recipe: (its value, the run's)}}
    for run in runs:
        for key, values in departures(run.config, Path(run.folder)).items():
            found.setdefault(key, {})[run.config.stem] = values
    if not found:
        return None
    parts = []
    for key, where in found.items():
        by_value: dict[str, list[str]] = {}
        for name, (_, value) in where.items():
            by_value.setdefault(json.dumps(value), []).append(name)
        recipes = sorted({json.dumps(recipe_value) for recipe_value, _ in where.values()})
        ran = "; ".join(f"{value} in {', '.join(names)}" for value, names in by_value.items())
        parts.append(f"{key}: {ran} (recipe{'s' if len(where) > 1 else ''}: {', '.join(recipes)})")
    return ("the newest runs tabulated were fit with settings their recipe files do not hold — where the runs "
            "differ in one, the table compares it too: " + "; ".join(parts))


def check_recipes(configs: list[Path], overrides: list[str], settings: list[str]) -> None:
    """Each recipe with the overrides (``--set`` ``settings``, as flags) parsed as its run will parse it, and its
    model built on the ``meta`` device, before any run starts: a misspelt key, a value of the wrong type or a width
    the heads do not divide failed every run of the sweep, each named only in its log. A recipe whose model does
    not build on ``meta`` even without the overrides is left to its runs (a mixer of a user's may need real
    tensors to initialise)."""
    from recipes.cli import parse_recipe

    for config in configs:
        try:
            parsed = parse_recipe(["--config", str(config), *overrides])
        except SystemExit as error:
            reason = str(error.code).removeprefix("error: ")
            try:  # the recipe's own fault, or the overrides'?
                parse_recipe(["--config", str(config)])
            except SystemExit:
                sys.exit(f"error: recipe {config}: {reason}; mend it, or leave it out with --only")
            sys.exit(f"error: --set {' '.join(settings)}, for recipe {config.stem}: {reason}")
        if overrides:
            problem = model_build_error(parsed.config)
            if problem and model_build_error(parse_recipe(["--config", str(config)]).config) is None:
                sys.exit(f"error: --set {' '.join(settings)}, for recipe {config.stem}: its model does not build: "
                         f"{problem}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", nargs="?", help="a folder of recipes: a path, or a bundled name such as 'positions'")
    parser.add_argument("--from", dest="from_logs", metavar="LOGS", nargs="+", action="extend", default=None,
                        help="tabulate and plot earlier sweeps again: their runs/sweep-logs/<time> folders "
                             "(several: one table of all their runs, written into the first)")
    parser.add_argument("--resume", metavar="LOGS", default=None,
                        help="go on with a stopped sweep (its runs/sweep-logs/<time> folder): each run that did not "
                             "finish runs again as launched, from its last.ckpt, with the sweep's launcher unless "
                             "--launcher is given; then the table of all its runs")
    parser.add_argument("--only", nargs="+", action="extend", default=None,
                        help="recipe names (file stems) to run; with --from, the recipes to tabulate")
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                        help="overrides for every run")
    parser.add_argument("--table-only", action="store_true", help="do not run; tabulate the latest runs")
    parser.add_argument("--seeds", type=int, default=None, help="run each recipe with seeds 0 … N-1; statistics")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="with --seeds: start at this seed (seeds K … K+N-1), to add seeds to an earlier sweep, "
                             "then tabulate both with --from")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (threads split between them)")
    parser.add_argument("--launcher", choices=LAUNCHERS, default=None,
                        help="local: this machine's cores; gpus: one run per visible GPU (or group of --devices-per-run); "
                             "slurm: a submitit job array (pip install submitit), requeued from last.ckpt on preemption "
                             "(default local; with --resume, the sweep's own)")
    parser.add_argument("--devices-per-run", type=positive_int, default=None,
                        help="GPUs per run (gpus, slurm; default 1; with --resume, the sweep's own)")
    parser.add_argument("--slurm", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                        help="submitit parameters for --launcher slurm: slurm_partition=gpu timeout_min=600 …")
    parser.add_argument("--submitit-cluster", choices=["slurm", "local", "debug"], default=None,
                        help="with --launcher slurm: force submitit's executor (local: processes here, for a test)")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="threads per run (default: the cores divided by --jobs); fewer leaves cores free")
    parser.add_argument("--baseline", default=None, help="with --seeds: the recipe the others are compared with "
                        "(default: the family's _family.yaml)")
    parser.add_argument("--margin", type=bounded(float, 0, above=True), default=None,
                        help="with --seeds: the equivalence margin in nats for the TOST column (default: the family's)")
    parser.add_argument("--vs", default=None, metavar="KEY",
                        help="also plot the final --metric against this hyper-parameter (e.g. d_model) or data or "
                             "trainer setting (e.g. data.init_args.seq_len)")
    parser.add_argument("--suite", choices=SUITES, default=None,
                        help="with --from: run this suite (long-context, or the attention sink or entropy) on every finished run's "
                             "last.ckpt and tabulate "
                             "it over seeds (docs/evaluation.md)")
    parser.add_argument("--tasks", default=None, metavar="T1,T2",
                        help="with --from: run these lm-eval tasks on every finished run's last.ckpt and tabulate them "
                             "over seeds (a local task's folder in --suite-args \"--include_path DIR\")")
    parser.add_argument("--suite-args", default="", metavar="ARGS",
                        help="more arguments for the suite or tasks, in one string: --suite-args \"--multiples 1 2 4 --windows 4\"")
    parser.add_argument("--init-from", nargs="+", action="extend", default=None, metavar="LOGS",
                        help="fine-tune: start each run from the last.ckpt of the run with the same recipe name and seed "
                             "in these earlier sweeps (their runs/sweep-logs/<time> folders); 'none': from scratch")
    parser.add_argument("--progress", type=bounded(float, 0), default=60.0, metavar="SECONDS",
                        help="how often the sweep reports its runs' progress (default 60)")
    parser.add_argument("--metric", default="val_acc", choices=["val_acc", "val_loss", "val_ppl"],
                        help="what --vs plots (default val_acc)")
    args = parser.parse_args(argv)
    new_runs = [flag for flag, given in (("--seeds", args.seeds is not None), ("--first-seed", args.first_seed != 0),
                                         ("--init-from", args.init_from is not None), ("--table-only", args.table_only))
                if given]  # what only a sweep of a FOLDER does: launch new runs, or tabulate a folder's latest
    if args.resume is not None:
        other = [flag for flag, given in (("FOLDER", args.folder is not None), ("--from", args.from_logs is not None),
                                          ("--set", bool(args.set)), ("--only", bool(args.only))) if given] + new_runs
        if other:
            sys.exit(f"error: --resume goes on with a sweep as it was launched, so it takes no {', '.join(other)}")
        if args.jobs < 1:
            sys.exit(f"error: --jobs {args.jobs} must be >= 1")
        try:
            family, runs = resume(Path(args.resume), args.jobs, args.threads, args.progress, launcher=args.launcher,
                                  devices_per_run=args.devices_per_run, submitit_cluster=args.submitit_cluster,
                                  slurm=slurm_parameters(parser, args.slurm) or None)
        except (FileNotFoundError, ValueError, ImportError) as error:
            sys.exit(f"error: {error}")
        except SweepInterrupted as stopped:
            stop_here(stopped)
        write_record(Path(args.resume), family, runs)
        args.from_logs = [args.resume]  # the table of all its runs, as --from gives it
    if args.from_logs is not None:
        if args.resume is None:
            check_from_alone(args, new_runs)
        try:
            sweeps = [read_manifest(Path(folder)) for folder in args.from_logs]
        except (FileNotFoundError, ValueError) as error:
            sys.exit(f"error: {error}")
        for folder, (name, found) in zip(args.from_logs, sweeps):  # an older sweep gains its record
            if Path(folder).is_dir() and not (Path(folder) / "record.json").is_file() and all(
                    run.failed or (Path(run.folder) / "hparams.yaml").is_file() for run in found):
                write_record(Path(folder), name, found)
        problem = pooling_problem([(folder, found) for folder, (_, found) in zip(args.from_logs, sweeps)])
        if problem:
            sys.exit(f"error: {problem}")
        family, runs = sweeps[0][0], [run for _, found in sweeps for run in found]
        if args.folder is not None and args.resume is None and Path(args.folder).name != family:
            sys.exit(f"error: --from reads a sweep of {family}, not of {args.folder}: name its own family, or none")
        if args.only:
            names = list(dict.fromkeys(run.config.stem for run in runs))
            unknown = sorted(set(args.only) - set(names))
            if unknown:
                sys.exit(f"error: --only names {unknown}, not recipes of that sweep ({', '.join(names)})")
            runs = [run for run in runs if run.config.stem in args.only]
        seeded = any(run.seed is not None for run in runs)
        try:
            settings = family_settings(Path(runs[0].config).parent) if runs else {}
        except ValueError as error:
            sys.exit(f"error: {error}")
        if settings.get("baseline") in {run.config.stem for run in runs}:
            args.baseline = args.baseline or settings["baseline"]
        args.margin = args.margin if args.margin is not None else settings.get("equivalence_margin")
        if args.baseline is not None and args.baseline not in {run.config.stem for run in runs}:
            sys.exit(f"error: --baseline {args.baseline!r} is not one of the recipes of that sweep")
        if args.suite and args.tasks:
            sys.exit("error: --suite or --tasks, one at a time")
        if (args.suite or args.tasks) and any(run.stored is not None for run in runs):
            sys.exit("error: --suite and --tasks evaluate the runs' checkpoints; a sweep's record holds only their "
                     "numbers: give the log folders of runs still on this machine")
        if args.suite or args.tasks:
            from recipes.evaluation.family import report as suite_report

            import shlex

            extra = shlex.split(args.suite_args) + (["--tasks", args.tasks] if args.tasks else [])
            print(suite_report(runs, Path(args.from_logs[0]), family, args.suite or "tasks", args.baseline, extra))
            return
        out = Path(args.from_logs[0])
        if not out.is_dir():  # a record kept elsewhere: the table and figures go to a new log folder
            out = Path("runs") / "sweep-logs" / time.strftime("%Y%m%d-%H%M%S-record")
        print(report(runs, out, family, seeded, args.baseline, args.vs, args.metric, args.margin))
        print(f"\ntable and figures: {out}/")
        if args.resume is not None:
            exit_if_failed(runs)
        return
    if args.folder is None:
        sys.exit("error: name a folder of recipes (or --from a sweep's log folder)")
    if args.suite or args.tasks:
        sys.exit("error: --suite and --tasks evaluate a finished sweep: give its log folder with --from")
    bad = [f"--{name} {value}" for name, value in (("seeds", args.seeds), ("jobs", args.jobs))
           if value is not None and value < 1]
    if bad:
        sys.exit(f"error: {' and '.join(bad)} must be >= 1")
    if args.first_seed < 0 or args.first_seed and args.seeds is None:
        sys.exit(f"error: --first-seed {args.first_seed} must be >= 0, and goes with --seeds")
    if args.seeds is not None and args.table_only:
        sys.exit("error: --table-only reads one run per recipe; --seeds launches new ones")
    if args.init_from is not None and args.table_only:
        sys.exit("error: --init-from starts new runs; --table-only launches none")
    if args.set and args.table_only:  # (the table would not be of runs with these settings)
        sys.exit(f"error: --set {' '.join(args.set)} configures new runs; --table-only launches none and tabulates the "
                 "latest runs as they were run")
    try:
        configs = recipe_files(args.folder)
    except FileNotFoundError as error:
        sys.exit(f"error: {error}")
    if args.vs is not None and not args.table_only:
        check_vs_key(args.vs, configs[0])
    try:
        settings = family_settings(configs[0].parent)
        for config in configs:  # a recipe that logs nothing would run and then have nothing to tabulate
            recipe_logger(config)
    except ValueError as error:
        sys.exit(f"error: {error}")
    if args.only:
        unknown = set(args.only) - {c.stem for c in configs}
        if unknown:
            sys.exit(f"error: --only names {sorted(unknown)} not in {args.folder} ({', '.join(c.stem for c in configs)})")
        configs = [c for c in configs if c.stem in args.only]
    starts_from = settings.get("starts_from")
    if starts_from is not None and args.init_from is None and not args.table_only:
        sys.exit(f"error: {args.folder} fine-tunes the runs of {starts_from}: run that family first "
                 f"(python -m recipes.sweep {starts_from} --seeds N), then give its log folder with "
                 f"--init-from runs/sweep-logs/<time> (--init-from none: from scratch, the no-transfer control)")
    init_from = None
    if args.init_from == ["none"]:
        args.init_from = None  # from scratch, said out loud
    elif args.init_from is not None:
        try:
            init_from = starting_checkpoints(configs, seed_list(args.seeds, args.first_seed),
                                             [Path(f) for f in args.init_from], starts_from)
        except (FileNotFoundError, ValueError) as error:
            sys.exit(f"error: {error}")
    if args.seeds is not None:
        if settings.get("baseline") in {c.stem for c in configs}:  # (not when --only leaves it out)
            args.baseline = args.baseline or settings["baseline"]
        args.margin = args.margin if args.margin is not None else settings.get("equivalence_margin")
    if args.baseline is not None and args.baseline not in {c.stem for c in configs}:
        sys.exit(f"error: --baseline {args.baseline!r} is not one of the recipes ({', '.join(c.stem for c in configs)})")
    overrides = []
    for item in args.set:
        if "=" not in item:
            sys.exit(f"error: --set takes KEY=VALUE; got {item!r}")
        key, value = item.split("=", 1)
        overrides += [f"--{key}", value]

    if not args.table_only:
        check_recipes(configs, overrides, args.set)
        note_erased_differences(configs, args.set)

    family = Path(args.folder).name
    if args.table_only:
        logs = Path("runs") / "sweep-logs" / time.strftime("%Y%m%d-%H%M%S-table")
        runs, unrun = [], []
        for config in configs:
            try:
                runs.append(Run(config, newest_run(config)))
            except FileNotFoundError:  # never run: not a failure, and nothing to tabulate
                unrun.append(config.stem)
        if not runs:
            sys.exit(f"error: --table-only: no recipe of {family} has a run under {logger_root(configs[0]).parent}/ "
                     "yet; drop --table-only to run them")
    else:
        try:
            logs, runs = launch(configs, overrides, args.seeds, args.jobs, family, args.progress, args.threads,
                                args.launcher or "local", args.devices_per_run or 1, args.submitit_cluster,
                                slurm_parameters(parser, args.slurm), args.first_seed, init_from)
        except (ValueError, ImportError) as error:  # a launcher that cannot run here (no GPU, no SLURM), named
            sys.exit(f"error: {error}")
        except SweepInterrupted as stopped:
            stop_here(stopped)
        write_record(logs, family, runs)
    notes = [note] if args.table_only and (note := departure_note(runs)) else []
    print(report(runs, logs, family, bool(args.seeds), args.baseline, args.vs, args.metric, args.margin, notes))
    roots = {logger_root(run.config).parent for run in runs}
    written = "table and figures" if args.table_only else ("table, figures and record.json (the runs' numbers, to keep "
                                                           "with the results)")
    print(f"\n{written}: {logs}/  TensorBoard: tensorboard --logdir {' '.join(map(str, sorted(roots)))}")
    if args.table_only and unrun:
        print(f"not run yet, so not in the table: {', '.join(unrun)} (python -m recipes.sweep {args.folder} --only "
              f"{' '.join(unrun)} runs them)", file=sys.stderr)
    exit_if_failed(runs)


def check_from_alone(args: argparse.Namespace, new_runs: list[str]) -> None:
    """``--from`` tabulates (or evaluates) runs that exist: an option that launches runs would be ignored without a
    word, and the table would not be of the runs the command line describes."""
    launching = new_runs + [flag for flag, given in (
        ("--set", bool(args.set)), ("--launcher", args.launcher is not None),
        ("--devices-per-run", args.devices_per_run is not None), ("--slurm", bool(args.slurm)),
        ("--submitit-cluster", args.submitit_cluster is not None), ("--threads", args.threads is not None)) if given]
    if launching:
        sys.exit(f"error: --from tabulates runs that exist; {', '.join(launching)} "
                 f"{'configures' if len(launching) == 1 else 'configure'} new runs (run the family's folder for those)")


def slurm_parameters(parser: argparse.ArgumentParser, items: list[str]) -> dict:
    """``--slurm KEY=VALUE …`` as submitit's keywords (digits as ints)."""
    slurm = dict(item.split("=", 1) for item in items if "=" in item)
    if len(slurm) != len(items):
        parser.error(f"--slurm takes KEY=VALUE items; got {items}")
    return {k: int(v) if v.isdigit() else v for k, v in slurm.items()}


def exit_if_failed(runs: list) -> None:
    failed = [run.config.stem for run in runs if run.failed]
    unstarted = sorted({run.config.name for run in runs if run.returncode == RECIPE_EDITED})
    if failed:
        why = (f"; {', '.join(unstarted)} changed since the sweep began, so its runs left did not start: put it back "
               "as it was and --resume the sweep" if unstarted else "")
        sys.exit(f"error: {len(failed)} of {len(runs)} runs failed: {', '.join(failed)}{why}")


def stop_here(stopped: SweepInterrupted) -> None:
    """A stopped sweep's ending: its record, what it left and what to run next, status 130."""
    write_record(stopped.logs, stopped.family, stopped.runs)
    print(stopped_summary(stopped.runs, stopped.logs), file=sys.stderr, flush=True)
    sys.exit(130)


def stopped_summary(runs: list, logs: Path) -> str:
    """What a stopped sweep left: its runs by how they ended, and the commands that go on from there."""
    finished = [run for run in runs if run.returncode == 0]
    unstarted = [run for run in runs if run.returncode is None]
    stopped = [run for run in runs if run.returncode not in (0, None)]
    name = lambda run: run.config.stem + ("" if run.seed is None else f" seed {run.seed}")  # noqa: E731
    lines = [f"sweep stopped: {len(finished)} of {len(runs)} runs finished"]
    if stopped:
        lines.append(f"  stopped or failed: {', '.join(map(name, stopped))}")
    if unstarted:
        lines.append(f"  not started: {', '.join(map(name, unstarted))}")
    lines.append(f"  go on (each stopped run from its last.ckpt): python -m recipes.sweep --resume {logs}")
    lines.append(f"  the finished runs' table: python -m recipes.sweep --from {logs}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
