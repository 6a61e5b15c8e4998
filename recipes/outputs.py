"""What the commands that write results share: a file a command would write over is named and refused unless the
user says ``--force`` — an edited recipe, a trained checkpoint or an earlier evaluation is never replaced silently."""

from pathlib import Path


def refuse_overwrite(paths, *, lost: str = "") -> None:
    """Raise ``FileExistsError`` naming those of ``paths`` that exist; ``lost`` says what replacing them would lose."""
    present = [str(path) for path in paths if Path(path).exists()]
    if not present:
        return
    named = " and ".join([", ".join(present[:-1]), present[-1]] if len(present) > 1 else present)
    raise FileExistsError(f"{named} already exist{'s' * (len(present) == 1)}: choose another --out, or --force to "
                          f"replace {'it' if len(present) == 1 else 'them'}" + (f" ({lost})" if lost else ""))
