"""``python -m recipes fit|validate|test --config FILE``: LightningCLI over ``LanguageModel``."""

import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.cli import LightningCLI

from recipes.module import LanguageModel

CONFIG_DIR = Path(__file__).parent / "configs"


def bundled_configs() -> list[str]:
    return sorted(str(p.relative_to(CONFIG_DIR)) for p in CONFIG_DIR.rglob("*.yaml"))


def resolve_config(value: str) -> str:
    """An existing path stays; otherwise ``NAME.yaml`` resolves to the bundled ``recipes/configs/NAME.yaml``."""
    if Path(value).is_file():
        return value
    bundled = CONFIG_DIR / value
    if bundled.is_file():
        return str(bundled)
    raise FileNotFoundError(
        f"config file {value!r} not found: it is not a path to a file, nor a bundled config "
        f"(bundled: {', '.join(bundled_configs())})"
    )


def resolve_config_args(args: list[str]) -> list[str]:
    """Rewrite every ``--config X`` / ``--config=X`` / ``-c X`` argument through :func:`resolve_config`."""
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        if arg in ("--config", "-c") and i + 1 < len(args):
            out += [arg, resolve_config(args[i + 1])]
            i += 2
            continue
        if arg.startswith("--config="):
            arg = "--config=" + resolve_config(arg.split("=", 1)[1])
        out.append(arg)
        i += 1
    return out


class HybridCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        # The vocabulary is the data's business; the model takes it from the instantiated data module.
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")


def main(args: list[str] | None = None) -> HybridCLI:
    """Run the CLI on ``args`` (default: the command line)."""
    try:
        if args is None:
            sys.argv[1:] = resolve_config_args(sys.argv[1:])
        else:
            args = resolve_config_args(args)
    except FileNotFoundError as error:
        sys.exit(f"error: {error}")
    return HybridCLI(
        LanguageModel,
        L.LightningDataModule,
        subclass_mode_data=True,
        args=args,
        # Our own per-block summary (printed by LanguageModel.on_fit_start) replaces Lightning's.
        trainer_defaults={"enable_model_summary": False},
        save_config_kwargs={"overwrite": True},
    )
