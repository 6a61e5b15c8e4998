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
