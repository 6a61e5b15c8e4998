import pytest

from recipes.figures import png_figure


def test_a_figure_is_saved_as_png_with_a_legend_beside_the_axes_kept_and_then_closed(tmp_path):
    import matplotlib.pyplot as plt

    with png_figure(tmp_path / "beside.png", figsize=(4, 3)) as (figure, axes):
        axes.plot([0, 1], [0, 1], label="a long legend entry that needs room")
        legend = axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    assert (tmp_path / "beside.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plt.get_fignums() == []
    # The legend lies inside the saved figure, not cut off at its right edge.
    box, page = legend.get_window_extent(), figure.bbox
    assert box.x1 <= page.x1 and box.y0 >= page.y0 and box.width > 100


def test_a_figure_whose_drawing_fails_is_closed_and_not_written(tmp_path):
    import matplotlib.pyplot as plt

    with pytest.raises(ValueError, match="bad data"), png_figure(tmp_path / "x.png") as (_, axes):
        axes.plot([0, 1], [0, 1])
        raise ValueError("bad data")
    assert plt.get_fignums() == [] and not (tmp_path / "x.png").exists()
