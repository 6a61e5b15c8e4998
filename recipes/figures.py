"""One way to draw a figure into a PNG file, shared by the sweep, evaluation, transfer and benchmark reports."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def png_figure(path: Path, figsize: tuple[float, float] = (7, 4.5), **subplots) -> Iterator[tuple]:
    """Yield ``(figure, axes)``, ``axes`` from ``figure.subplots(**subplots)`` (one ``Axes``, or an array with
    ``ncols``/``nrows``); on leaving, save the figure to ``path`` as a PNG (dpi 120, cropped to what was drawn, so a
    legend placed beside the axes is kept). Nothing is written when drawing raises.

    The figure is a bare ``matplotlib.figure.Figure``, not made through pyplot: no backend is chosen or switched
    (a notebook that calls a report keeps its inline plots), nothing needs a display, and no figure stays
    registered with pyplot after a sweep has reported many families."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=figsize, layout="constrained")
    yield figure, figure.subplots(**subplots)
    figure.savefig(path, dpi=120, bbox_inches="tight")
