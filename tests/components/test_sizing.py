from functools import partial

import pytest

from components import MLP, HybridLM, QCAttention, RoutedMoE, count_parameters
from components.sizing import SizeTarget, sized_mixers, solve_width


def test_solve_width_finds_the_closest_multiple():
    count = lambda w: 1000 + 30 * w  # noqa: E731
    assert solve_width(count, 1000 + 30 * 96, multiple_of=8) == 96  # exact
    assert solve_width(count, 1000 + 30 * 99, multiple_of=8) == 96  # 99 is nearer 96 than 104
    assert solve_width(count, 1000 + 30 * 101, multiple_of=8) == 104
    with pytest.raises(ValueError, match=r"below the smallest model \(1,240 parameters at width 8\)$"):
        solve_width(count, 500)
    # a target that a width under multiple_of would reach (an SSD's expand, say) says so
    with pytest.raises(ValueError, match=r"at width 8\); multiple_of=8 makes 8 the smallest width tried: 1 tries every"):
        solve_width(count, 1100)
    # the edges: a target the smallest width meets exactly; one only width 1 reaches (no hint: multiple_of is 1
    # already, or width 1 overshoots too); a target past the widest width tried
    assert solve_width(count, 1000 + 30 * 8) == 8 and solve_width(count, 1030, multiple_of=1) == 1
    with pytest.raises(ValueError, match=r"at width 1\)$"):
        solve_width(count, 1000, multiple_of=1)
    with pytest.raises(ValueError, match=r"at width 8\); multiple_of=8 makes 8 the smallest width tried"):
        solve_width(count, 1030)  # width 1 is 1,030: exactly the target
    assert solve_width(count, 1000 + 30 * 1000, multiple_of=8, limit=1024) == 1000  # searched up to the limit itself
    with pytest.raises(ValueError, match="target of 1,000,000 parameters needs a width above 1,024"):
        solve_width(count, 1_000_000, multiple_of=8, limit=1024)


@pytest.mark.parametrize("count", [
    lambda w: 1000 + 30 * w,  # a model's count in its FFN's width: the line through two widths finds it at once
    lambda w: 500 + w * w,  # grows faster than the line: the guess overshoots and the search steps down
    lambda w: 5000 + 400 * int(w ** 0.5),  # slower, and flat between squares: the largest width under the target
    lambda w: 7 + 3 * (w // 24),  # flat over 24 widths, steps of 3
], ids=["linear", "quadratic", "square root, flat runs", "steps"])
def test_solve_width_is_the_scans_answer_and_builds_a_linear_model_a_handful_of_times(count):
    """The search's answer is the scan's: of the largest multiple whose count is within the target and the next one,
    the nearer (the smaller on a tie) — over targets across the range, several multiples and a limit."""
    for multiple_of in (1, 8, 24):
        for target in range(count(multiple_of), count(400 * multiple_of), max(1, count(400 * multiple_of) // 97)):
            widths = [n * multiple_of for n in range(1, 401)]
            low = max(w for w in widths if count(w) <= target)
            want = min((low, low + multiple_of), key=lambda w: abs(count(w) - target))
            assert solve_width(count, target, multiple_of=multiple_of) == want, (multiple_of, target)
    built = []
    solve_width(lambda w: built.append(w) or count(w), count(8 * 123) + 5, multiple_of=8)
    assert len(built) == len(set(built)) <= 26  # a width is counted once; galloping: a few per bit of the distance
    if count(2) - count(1) == count(3) - count(2) == 30:  # linear: the two smallest widths, the answer, the next
        assert sorted(built) == [8, 16, 8 * 123, 8 * 124]


@pytest.mark.parametrize("pattern", ["AM AM", "AR AM", "AR AR"])
def test_sized_models_land_on_the_target(pattern):
    bindings = {"R": partial(RoutedMoE, n_experts=4, top_k=2), "M": MLP}
    target = SizeTarget(params=200_000, letters=["M", "R"], multiple_of=2)
    mixers, width = sized_mixers(64, 32, pattern, bindings, target)
    model = HybridLM(64, 32, pattern, mixers)
    assert abs(count_parameters(model) - 200_000) / 200_000 < 0.01
    widths = {m.experts.d_ff if isinstance(m, RoutedMoE) else m.d_ff for b in model.blocks for m in [b.state_mixer]}
    assert widths == {width}
    # the same total, more MoE: narrower FFNs
    if pattern == "AR AR":
        assert width < sized_mixers(64, 32, "AM AM", bindings, target)[1]


def test_sizing_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"letters=\['Q'\] must name bound letters"):
        sized_mixers(64, 32, "AM", None, SizeTarget(10_000, ["Q"]))
    with pytest.raises(ValueError, match=r"none of letters=\['R'\] occurs in pattern 'AM'"):
        sized_mixers(64, 32, "AM", None, SizeTarget(10_000, ["R"]))
    with pytest.raises(ValueError, match=r"arg='d_fff' is not an argument of the mixer of letter 'M', MLP \(it takes: d_ff, "):
        sized_mixers(64, 32, "AM", None, SizeTarget(10_000, ["M"], arg="d_fff"))
    # A keyword the mixer takes but whose value leaves the count unchanged was "needs a width above 1,048,576".
    with pytest.raises(ValueError, match="parameter count does not change with norm_eps of letters=\\['A'\\]"):
        sized_mixers(64, 32, "AM", {"A": partial(QCAttention, n_heads=2)}, SizeTarget(10_000, ["A"], arg="norm_eps"))
    for bad, problem in [({"params": 0}, "params=0 must be a positive integer"),
                         ({"params": 10_000, "multiple_of": 0}, "multiple_of=0 must be a positive integer"),
                         ({"params": 10_000, "letters": []}, "letters=\\[\\] must be a non-empty list"),
                         ({"params": 10_000, "letters": ["MR"]}, "letters=\\[.MR.\\] must be a non-empty list of pattern letters"),
                         ({"params": 10_000, "letters": ["M", "RR"]}, "letters=\\[.M., .RR.\\] must be a non-empty list"),
                         ({"params": True}, "params=True must be a positive integer"),
                         ({"params": 10_000.0}, "params=10000.0 must be a positive integer")]:
        with pytest.raises(ValueError, match=f"size_to: {problem}"):
            SizeTarget(**bad)
    assert SizeTarget(10_000, "MR").letters == SizeTarget(10_000, "M, R").letters == ["M", "R"] and SizeTarget(1, multiple_of=1).params == 1


class PassingMLP(MLP):
    """A user's mixer that passes its keywords on (``**kwargs``): the width keyword may be meant for its parent."""

    def __init__(self, d_model, **kwargs):
        super().__init__(d_model, **kwargs)


def test_a_mixer_that_passes_its_keywords_on_is_sized():
    mixers, width = sized_mixers(64, 32, "AM", {"M": PassingMLP}, SizeTarget(params=40_000, multiple_of=4))
    model = HybridLM(64, 32, "AM", mixers)
    assert model.blocks[0].state_mixer.d_ff == width and abs(count_parameters(model) - 40_000) < 32 * 3 * 4


def test_sizing_counts_tied_embeddings_once():
    # Vocabulary 500 at d_model 32: the 16,000-parameter head is shared when tied, so a tied model sized
    # to the same target has wider MLPs, and both land on the target.
    target = SizeTarget(params=120_000, letters=["M"], multiple_of=2)
    widths = {}
    for tie in (False, True):
        mixers, widths[tie] = sized_mixers(500, 32, "AM AM", None, target, tie_embeddings=tie)
        model = HybridLM(500, 32, "AM AM", mixers, tie_embeddings=tie)
        assert abs(count_parameters(model) - 120_000) <= 3 * 32 * 2, f"tie_embeddings={tie}: {count_parameters(model):,}"
    assert widths[True] > widths[False]
