"""``python -m recipes.consolidate FOLDER [--out FILE]``: one checkpoint file from the folder of shards a sharded run
(Lightning's ``ModelParallelStrategy``, FSDP2) writes — its weights and run record, for ``load_from_checkpoint``,
``--model.init_from``, ``generate``, ``eval`` and ``python -m recipes.hf export`` (docs/training.md)."""

import argparse

from recipes.checkpoints import CheckpointError, consolidate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.consolidate", description=__doc__)
    parser.add_argument("folder", help="a sharded checkpoint: runs/…/checkpoints/last.ckpt (a folder)")
    parser.add_argument("--out", default=None,
                        help="the file to write (default: FOLDER.consolidated beside it); a file there is replaced "
                             "only if consolidated from FOLDER, or with --force")
    parser.add_argument("--force", action="store_true", help="replace whatever file --out names")
    args = parser.parse_args(argv)
    try:
        print(consolidate(args.folder, args.out, overwrite=args.force))
    except (CheckpointError, OSError) as error:
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    main()
