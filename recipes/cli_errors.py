"""What a configuration mistake prints: jsonargparse's and Lightning's errors turned into one line in the command
line's terms, with the near misses of a misspelt option (docs/training.md, "Bad input")."""

import ast
import inspect
import re
import sys

from recipes.argtypes import did_you_mean

UNION_HEADER = "Does not validate against any of the Union subtypes"
# a union's alternatives that a class path or a mapping could never have been: noise beside the real reason
NOT_MEANT = ("Expected a <class 'NoneType'>", "Expected a <class 'bool'>",
             "Expected a <class 'collections.abc.Iterable'>", "Expected a path but ", UNION_HEADER)


SHORT_EPOCH = re.compile(r"`val_check_interval` \((\d+)\) must be less than or equal to the number of the "
                         r"training batches \((\d+)\)")


LIGHTNING_OPTIMIZER = ("is Lightning's, which would drop the zoo's parameter groups and learning-rate schedule; name "
                       "the optimiser with --model.optimizer (SGD, a torch.optim name, or '{class_path: torch.optim.SGD, "
                       "init_args: {momentum: 0.9}}'), its rate with --model.lr, and the schedule with "
                       "--model.schedule, --model.warmup_fraction and --model.final_lr_fraction")
"""Why ``--optimizer`` / ``--lr_scheduler`` (LightningCLI's, turned off here) are refused, and what to use."""


def short_epoch_message(error: Exception) -> str | None:
    """Lightning's refusal of a ``val_check_interval`` longer than an epoch, in the command line's terms: a small
    corpus is a short epoch, and a step-based recipe wants its interval counted in steps across epochs (its own
    hint says ``check_val_every_n_epoch=None``, which a YAML or the command line spells ``null``)."""
    found = SHORT_EPOCH.search(str(error))
    if found is None:
        return None
    interval, batches = found.groups()
    return (f"the data gives {batches} training batch{'es' * (batches != '1')} per epoch, fewer than "
            f"val_check_interval {interval}: "
            f"--trainer.check_val_every_n_epoch null counts the interval in steps across epochs (a small corpus is "
            f"then read several times), or --trainer.val_check_interval {batches} or less validates within each")


def parse_error_message(error: Exception) -> str:
    """jsonargparse's error in a line: the key, and for a value that fits none of a union's types the reasons of
    the types that could have fit — a class's own problem (a missing package, a bad argument) with the lines
    under it, not "Expected a <class 'NoneType'>" or the value dumped back."""
    lines = str(error).splitlines()
    if not any(UNION_HEADER in line for line in lines):
        return "\n".join(line for line in lines[:6])
    key = lines[0].strip().rstrip(":") if lines[0].startswith("Parser key") else None
    reasons = []
    for i, line in enumerate(lines):
        if not line.strip().startswith("- "):
            continue
        depth = len(line) - len(line.lstrip())
        under = []  # the reason's own lines, indented below it
        for following in lines[i + 1:]:
            if len(following) - len(following.lstrip()) <= depth:
                break
            under.append(following.strip())
        reason = " ".join([line.strip()[2:], *under])
        if reason.startswith("Type ") and ": " in reason:  # "Type X expects a function or a callable class: why"
            reason = reason.split(": ", 1)[1]
        # the whole value dumped back: only the class it was for
        reason = re.sub(r" Got value: Namespace\(.*class_path='([^']+)'\)$", r" (for \1)", reason)
        reasons.append(re.sub(r" Got value: Namespace\(.*$", "", reason))
    meant = [reason for reason in reasons if not reason.startswith(NOT_MEANT)]
    text = "; ".join(meant or reasons) or lines[-1].strip()
    return f"{key}: {text}" if key else text


def class_options(path: str) -> list[str]:
    """The keyword arguments of an already-imported class (jsonargparse imported it to reject the option), or none:
    nothing is imported here."""
    module_name, _, name = path.rpartition(".")
    cls = getattr(sys.modules.get(module_name), name, None)
    if not inspect.isclass(cls):
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in inspect.signature(cls).parameters.values() if p.kind in kinds]


def near_misses(message: str, options: list[str]) -> str:
    """`` (did you mean …?)`` for the unknown options in a parse error that are a typo of one the parser (``options``,
    its ``--flags``) or the named class takes; empty when none is close."""
    if "unrecognized arguments:" in message:
        unknown = [token.split("=", 1)[0] for token in message.split("unrecognized arguments:", 1)[1].split()
                   if token.startswith("--")]
        known = options
    elif group := re.search(r"(Group|Subcommand) '([\w.]+)' does not accept option '([\w.]+)'", message):
        # a config file's key, under a section (Group 'trainer': 'max_stepz') or whole ('trainer.max_stepz')
        prefix = f"--{group.group(2)}." if group.group(1) == "Group" else "--"
        unknown, known = [group.group(3)], [o[len(prefix):] for o in options if o.startswith(prefix)]
    else:
        found = re.search(r"Option '(\w+)' is not accepted", message)
        owner = re.search(r"class_path '([\w.]+)'|\(for ([\w.]+)\)", message)
        if found is None or owner is None:
            return ""
        unknown, known = [found.group(1)], class_options(owner.group(1) or owner.group(2))
    hint = did_you_mean(unknown, known, cutoff=0.8)
    return f" ({hint})" if hint else ""


def class_misses(message: str) -> str:
    """`` (did you mean QCAttention?)`` for a class path whose module lacks the name (``components.QCAtention``): the
    module's classes close to it. Nothing is imported here; jsonargparse imported the module to look in it."""
    found = re.search(r"module '([\w.]+)' has no attribute '(\w+)'", message)
    module = sys.modules.get(found.group(1)) if found else None
    if module is None:
        return ""
    classes = [name for name, value in vars(module).items() if inspect.isclass(value) and not name.startswith("_")]
    hint = did_you_mean([found.group(2)], classes)
    return "" if not hint else f" ({hint})"


def mixer_misses(message: str, error: BaseException) -> str:
    """`` (model.mixers.A, components.QCAttention: did you mean n_heads?)`` for a recipe file's misspelt mixer
    argument, whose error names neither the letter nor the class (``Parser key "model.mixers": Option 'n_head' is not
    accepted``; the same flag on the command line gets them from :func:`near_misses`): the letters whose
    ``init_args`` hold the option, read from the value jsonargparse quotes in its error. Empty when the error is
    another, or its value cannot be read back."""
    found = re.search(r"Parser key \"model\.mixers\": Option '(\w+)' is not accepted", message)
    given = re.search(r"^\s*Given value: (\{.*\})\s*$", str(error), flags=re.M)
    if found is None or given is None:
        return ""
    try:
        mixers = ast.literal_eval(given.group(1))
    except (ValueError, SyntaxError):
        return ""
    said = []
    for letter, spec in mixers.items() if isinstance(mixers, dict) else ():
        if isinstance(spec, dict) and found.group(1) in (spec.get("init_args") or {}):
            takes = [name for name in class_options(str(spec.get("class_path"))) if name != "d_model"]  # (the model's)
            hint = did_you_mean([found.group(1)], takes, cutoff=0.8)
            said.append(f"model.mixers.{letter}, {spec.get('class_path')}: "
                        + (hint or f"it takes {', '.join(takes) or 'no argument but d_model'}"))
    return f" ({'; '.join(said)})" if said else ""
