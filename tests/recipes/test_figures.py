import pytest

from recipes.figures import png_figure


def test_a_figure_is_saved_as_png_with_a_legend_beside_the_axes_kept(tmp_path):
    with png_figure(tmp_path / "beside.png", figsize=(4, 3)) as (figure, axes):
        axes.plot([0, 1], [0, 1], label="a long legend entry that needs room")
        legend = axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    assert (tmp_path / "beside.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The legend lies inside the saved figure, not cut off at its right edge.
    box, page = legend.get_window_extent(), figure.bbox
    assert box.x1 <= page.x1 and box.y0 >= page.y0 and box.width > 100


def test_drawing_a_figure_leaves_pyplot_and_the_backend_alone(tmp_path):
    import matplotlib
    import matplotlib.pyplot as plt

    before = matplotlib.get_backend()
    matplotlib.use("svg")  # stands for a user's own backend (a notebook's inline one): a report must not switch it
    try:
        with png_figure(tmp_path / "two.png", ncols=2) as (_, (left, right)):
            left.plot([0, 1]), right.plot([1, 0])
        assert matplotlib.get_backend() == "svg" and plt.get_fignums() == []
        assert (tmp_path / "two.png").read_bytes()[:4] == b"\x89PNG"
    finally:
        matplotlib.use(before)


def test_a_figure_whose_drawing_fails_is_not_written(tmp_path):
    with pytest.raises(ValueError, match="bad data"), png_figure(tmp_path / "x.png") as (_, axes):
        axes.plot([0, 1], [0, 1])
        raise ValueError("bad data")
    assert not (tmp_path / "x.png").exists()
