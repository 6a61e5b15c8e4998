import re

import pytest

from components import HybridLM, PatternError, parse_pattern

S, M, A, E, I = "SMAEI"


def test_otce_pattern_gives_24_blocks_in_order():
    blocks = parse_pattern("SM + SE×11 + AE×2 + SE×8 + SM + AM")
    assert len(blocks) == 24
    assert blocks == [(S, M)] + [(S, E)] * 11 + [(A, E)] * 2 + [(S, E)] * 8 + [(S, M), (A, M)]


def test_jamba_group_repetition_gives_24_blocks():
    group = [(S, M), (S, E), (S, M), (S, E), (A, M), (S, E), (S, M), (S, E)]
    assert parse_pattern("(SM SE SM SE AM SE SM SE)×3") == group * 3


def test_cheems_and_doge_examples():
    assert parse_pattern("(SE×7 IE)×3") == ([(S, E)] * 7 + [(I, E)]) * 3
    assert parse_pattern("IE -E -E") == [(I, E), (None, E), (None, E)]
    assert parse_pattern("S- A-") == [(S, None), (A, None)]


def test_letter_runs_split_into_pairs():
    assert parse_pattern("SMSMAM") == [(S, M), (S, M), (A, M)]
    assert parse_pattern("SMSM+AM") == [(S, M), (S, M), (A, M)]
    assert parse_pattern("SMAE-E") == [(S, M), (A, E), (None, E)]  # each pair its own state letter


@pytest.mark.parametrize("op", ["x", "×", "*"])
def test_all_repetition_operators_agree(op):
    assert parse_pattern(f"SM{op}3") == [(S, M)] * 3
    assert parse_pattern(f"SM {op} 2 AM") == [(S, M)] * 2 + [(A, M)]


def test_nested_groups_multiply():
    assert len(parse_pattern("((SM AM)x2 SE)x3")) == 15
    assert parse_pattern("  SM\t+\nAM  ") == [(S, M), (A, M)]


@pytest.mark.parametrize(
    "pattern, column, words",
    [
        ("(SM AM", 1, "unbalanced '('"),
        ("SM AM)", 6, "unbalanced ')'"),
        ("SM SMA", 4, "odd number of letters"),
        ("SM×0", 4, "at least 1"),
        ("SM×", 4, "needs a count"),
        ("SM x AM", 6, "needs a count"),
        ("", 1, "empty pattern"),
        ("   ", 4, "empty pattern"),
        ("--", 1, "neither a sequence nor a state mixer"),
        ("SM --", 4, "neither"),
        ("SM ()", 5, "empty group"),
        ("×2", 1, "nothing before it"),
        ("SM +", 5, "followed by a block"),
        ("SM(AM)", 3, "separator"),
        ("SMSM×2", 5, "ambiguous"),
        ("sm", 1, "unexpected character 's'"),
        (")SM", 1, "unbalanced ')' with no matching '('"),
        ("SM×10001", 4, "exceeds the limit of 10,000 blocks"),  # at the count, before the blocks are made
    ],
)
def test_malformed_patterns_point_at_the_column(pattern, column, words):
    with pytest.raises(PatternError) as info:
        parse_pattern(pattern)
    assert info.value.column == column
    assert words in str(info.value)
    assert f"column {column}" in str(info.value)


def test_unbound_letter_lists_the_bound_letters():
    with pytest.raises(PatternError) as info:
        HybridLM(16, 32, "AM QE", mixers={"S": lambda d: None})
    message = str(info.value)
    assert "letter 'Q' is not bound" in message
    assert "column 4" in message
    assert "bound: A, C, E, H, I, M, R, S, X" in message
    with pytest.raises(PatternError, match="column 5: letter 'Q' is not bound") as info:
        HybridLM(16, 32, "AM AQ", mixers={"S": lambda d: None})  # an unbound state letter: its own column
    assert info.value.column == 5


def test_the_limits_are_inclusive_and_a_count_of_one_is_the_unit_itself():
    assert parse_pattern("(SM AE)×1") == parse_pattern("SM AE")
    assert len(parse_pattern("-E×10000")) == 10_000 == len(parse_pattern("(-E×5000)×2"))
    with pytest.raises(PatternError, match="exceeds the limit of 10,000 blocks"):
        parse_pattern("-E×10000 SM")
    assert parse_pattern("(" * 32 + "SM" + ")" * 32) == [(S, M)]
    with pytest.raises(PatternError, match="nest deeper than 32 levels"):
        parse_pattern("(" * 33 + "SM" + ")" * 33)
    with pytest.raises(TypeError, match="pattern must be a string; got list"):
        parse_pattern(["SM"])


@pytest.mark.parametrize("at", [0, 36, 99, 198])
def test_an_error_in_a_long_pattern_shows_a_window_with_the_caret_under_the_column(at):
    blocks = ["SM"] * 67  # 200 characters
    pattern = " ".join(blocks)[:at] + "?" + " ".join(blocks)[at + 1:]
    with pytest.raises(PatternError) as info:
        parse_pattern(pattern)
    _, shown, pointer = str(info.value).split("\n")
    assert str(info.value).startswith(f"pattern of 200 characters, column {at + 1}: unexpected character '?'")
    assert shown[pointer.index("^")] == "?" and pointer.strip() == "^"
    window = shown.removeprefix("  pattern '").removesuffix("'")
    assert window.startswith("…") == (at > 30) and window.endswith("…") == (at < 170)
    assert len(window.strip("…")) == 60 and window.strip("…") in pattern
    exact = "SM " * 19 + "?SM"  # 60 characters: shown whole, no window
    with pytest.raises(PatternError, match=re.escape(f"pattern {exact!r}, column 58: unexpected character '?'")):
        parse_pattern(exact)
