"""``python -m recipes.hf import|export``: a Hugging Face folder into a zoo checkpoint and a recipe, and a zoo
checkpoint out to a Hugging Face folder (``python -m recipes.hf FOLDER --out X.ckpt`` is ``import``)."""

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in ("import", "export", "-h", "--help"):
        argv = ["import", *argv]  # the earlier form: python -m recipes.hf FOLDER --out X.ckpt
    parser = argparse.ArgumentParser(prog="python -m recipes.hf", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    load = commands.add_parser("import", help="a Hugging Face folder → a zoo checkpoint and a fine-tuning recipe")
    load.add_argument("folder", help="a Hugging Face checkpoint folder (config.json + safetensors)")
    load.add_argument("--out", required=True, help="the checkpoint to write; a recipe is written beside it (.yaml)")
    load.add_argument("--force", action="store_true", help="replace the checkpoint and recipe if they exist")
    save = commands.add_parser("export", help="a zoo checkpoint → a Hugging Face folder")
    save.add_argument("checkpoint", nargs="?", help="a checkpoint file (last.ckpt, best.ckpt, or one python -m recipes.hf "
                      "import wrote), or last / best: the newest of --config's runs")
    save.add_argument("--ckpt_path", default=None, help="the checkpoint, as generate and eval spell it")
    save.add_argument("--out", required=True, help="the folder to write")
    save.add_argument("--config", default=None, action="append",
                      help="the recipe the checkpoint was trained with, for its tokenizer (default: the run's "
                      "config.yaml); repeat it as for fit")
    save.add_argument("--max_shard_size", default="2GB", help="shard the weights past this size (default 2GB)")
    save.add_argument("--as", dest="as_class", default=None, metavar="CLASS",
                      help="the Hugging Face class to write, where the model is more than one (default: the first that "
                           "fits; Qwen3_5ForCausalLM before Qwen3NextForCausalLM, Llama before Mistral)")
    save.add_argument("--force", action="store_true", help="write into a folder that holds files (the model's are replaced)")
    save.add_argument("--allow_classes", nargs="*", action="extend", default=[],
                      help="packages whose classes the checkpoint may name")
    args = parser.parse_args(argv)
    if args.command == "export":
        if args.checkpoint and args.ckpt_path and args.checkpoint != args.ckpt_path:
            save.error(f"two checkpoints: {args.checkpoint} and --ckpt_path {args.ckpt_path}; give one")
        args.checkpoint = args.checkpoint or args.ckpt_path
        if not args.checkpoint:
            save.error("which checkpoint? give a file, or --config RECIPE --ckpt_path last (or best)")
    from recipes.hf import export, write_checkpoint

    try:
        if args.command == "import":
            checkpoint, recipe = write_checkpoint(args.folder, args.out, overwrite=args.force)
            print(f"wrote {checkpoint} and {recipe}\nfine-tune: python -m recipes fit --config {recipe}")
            return
        from recipes.runs import load_recipe, trusted_classes

        recipe = load_recipe(args.config) if args.config else {}
        checkpoint = export_checkpoint(args.checkpoint, recipe, args.config)
        data = export_data(checkpoint, recipe, args.config, args.allow_classes)
        # the recipe's own bindings are trusted, as generate and eval trust them
        export(checkpoint, args.out, data=data, allow_classes=trusted_classes(recipe, args.allow_classes),
               max_shard_size=args.max_shard_size, overwrite=args.force, as_class=args.as_class)
    except (FileNotFoundError, FileExistsError, ValueError, TypeError) as error:
        sys.exit(f"error: {error}")


def export_checkpoint(checkpoint: str, recipe: dict, config: list[str] | None) -> str:
    """The checkpoint file: ``last``/``best``/``swa`` is the newest of the recipe's runs, as for ``generate``."""
    from recipes.runs import checkpoint_path
    from recipes.training import NAMED_CHECKPOINTS

    if config is None and checkpoint in NAMED_CHECKPOINTS:
        raise ValueError(f"{checkpoint}: the newest {checkpoint}.ckpt of which recipe's runs? give --config RECIPE")
    return checkpoint_path(recipe, checkpoint, config)


def export_data(checkpoint: str, recipe: dict, config: list[str] | None, allow_classes: list[str] = ()):
    """The data module whose tokenizer goes with the export: the recipe's (``--config``) with the run's own data
    settings when its ``config.yaml`` is beside the checkpoint (its classes trusted as
    :func:`recipes.runs.with_run_data` says)."""
    from recipes.runs import data_module, run_folder, with_run_data

    if not Path(checkpoint).exists():  # before asking for the recipe that goes with it
        raise FileNotFoundError(f"{checkpoint}: no such checkpoint file")
    folder = run_folder(Path(checkpoint))
    if config is None and (folder is None or not (folder / "config.yaml").is_file()):
        raise ValueError(f"{checkpoint} is not in a run folder with a config.yaml: give --config RECIPE, whose data "
                         "module's tokenizer goes with the model")
    return data_module(with_run_data(recipe, Path(checkpoint), allow_classes), text_only=True)  # (its tokenizer only)
