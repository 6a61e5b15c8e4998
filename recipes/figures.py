"""One way to draw a figure into a PNG file, shared by the sweep, evaluation, transfer and benchmark reports."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def png_figure(path: Path, **subplots) -> Iterator[tuple]:
    """Yield ``(figure, axes)`` from ``plt.subplots(**subplots)``; on leaving, save it to ``path`` as a PNG (dpi 120,
    cropped to what was drawn, so a legend placed beside the axes is kept) and close it — also when drawing failed,
    so a sweep that reports many families does not keep their figures open. No display is needed (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; chosen here, not at import, so importing a report never picks a backend
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(layout="constrained", **subplots)
    try:
        yield figure, axes
        figure.savefig(path, dpi=120, bbox_inches="tight")
    finally:
        plt.close(figure)
