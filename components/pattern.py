"""The layer pattern: a string such as ``"SM + SE×11 + AE×2"`` that lists the model's blocks.

Grammar (docs/architecture.md)::

    pattern := term (sep term)*            sep := whitespace | '+'
    term    := unit (('x' | '×' | '*') INT)?
    unit    := TOKEN | '(' pattern ')'
    TOKEN   := SEQ STATE                    SEQ, STATE ∈ A–Z or '-' (none), not both '-'

A run of letters with no separator is split into two-letter tokens (``"SMSMAM"`` = ``SM SM AM``), so
the papers' tables paste as they are. A repetition after a run of more than one token is refused as
ambiguous (write ``(SMSM)×2``). Counts are ASCII digits; a pattern may expand to at most
``MAX_BLOCKS`` blocks and nest at most ``MAX_DEPTH`` parentheses deep. Every error names the column
(1-based) where it was found.
"""

from dataclasses import dataclass

REPEAT = "x×*"
LETTERS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZ-")
DIGITS = set("0123456789")  # ASCII only: str.isdigit() also accepts '²' and other scripts' digits
MAX_BLOCKS = 10_000  # far beyond any real model; stops "(SM×1000)×1000" before it fills memory
MAX_DEPTH = 32  # nested parentheses


class PatternError(ValueError):
    """A malformed layer pattern; the message quotes the pattern and points at the column."""

    def __init__(self, pattern: str, column: int, problem: str):
        self.pattern, self.column, self.problem = pattern, column, problem
        # A long pattern is shown as a window around the column, so the message stays readable.
        start = max(0, min(column - 1 - 30, len(pattern) - 60)) if len(pattern) > 60 else 0
        window = pattern[start:start + 60]
        left, right = ("…" if start > 0 else ""), ("…" if start + 60 < len(pattern) else "")
        shown = f"  pattern '{left}{window}{right}'"
        pointer = " " * (len("  pattern '") + len(left) + column - 1 - start) + "^"
        quoted = repr(pattern) if len(pattern) <= 60 else f"of {len(pattern)} characters"
        super().__init__(f"pattern {quoted}, column {column}: {problem}\n{shown}\n{pointer}")


@dataclass(frozen=True)
class Token:
    """One block: its sequence and state letters (None for '-') and their 1-based columns."""

    seq: str | None
    state: str | None
    column: int  # of the sequence letter; the state letter is at column + 1

    def __str__(self) -> str:
        return f"{self.seq or '-'}{self.state or '-'}"


def parse_pattern(pattern: str) -> list[tuple[str | None, str | None]]:
    """Parse a layer pattern into ``[(seq_letter, state_letter), ...]``, one pair per block.

    >>> parse_pattern("(SM AE)x2 -E")
    [('S', 'M'), ('A', 'E'), ('S', 'M'), ('A', 'E'), (None, 'E')]
    """
    return [(t.seq, t.state) for t in parse_tokens(pattern)]


def parse_tokens(pattern: str) -> list[Token]:
    """Like :func:`parse_pattern`, keeping each token's column for error messages."""
    if not isinstance(pattern, str):
        raise TypeError(f"pattern must be a string; got {type(pattern).__name__}")
    parser = _Parser(pattern)
    return parser.pattern(open_at=None)


class _Parser:
    """Recursive descent over the string; ``self.i`` is the 0-based cursor."""

    def __init__(self, text: str):
        self.text, self.i, self.depth = text, 0, 0

    def error(self, problem: str, at: int | None = None) -> PatternError:
        return PatternError(self.text, (self.i if at is None else at) + 1, problem)

    def peek(self) -> str:
        return self.text[self.i] if self.i < len(self.text) else ""

    def skip_space(self) -> None:
        while self.peek().isspace():
            self.i += 1

    def pattern(self, open_at: int | None) -> list[Token]:
        """Terms separated by whitespace or '+', up to the ')' closing the '(' at ``open_at`` (or, at
        the top level where ``open_at`` is None, up to the end of the string)."""
        tokens: list[Token] = []
        self.skip_space()
        if self.peek() in ("", ")"):
            if open_at is None and self.peek() == ")":
                raise self.error("unbalanced ')' with no matching '('")
            raise self.error("empty pattern" if open_at is None else "empty group '()'")
        while True:
            tokens += self.term()
            if len(tokens) > MAX_BLOCKS:
                raise self.error(f"the pattern exceeds the limit of {MAX_BLOCKS:,} blocks")
            start = self.i
            self.skip_space()
            had_space = self.i > start
            char = self.peek()
            if char == "+":
                self.i += 1
                self.skip_space()
                if self.peek() in ("", ")"):
                    raise self.error("'+' must be followed by a block")
                continue
            if char == "" or char == ")":
                if char == ")" and open_at is None:
                    raise self.error("unbalanced ')' with no matching '('")
                if char == "" and open_at is not None:
                    raise self.error("unbalanced '(' with no matching ')'", at=open_at)
                return tokens
            if not had_space:
                raise self.error(f"expected a separator (space or '+') before {char!r}")

    def term(self) -> list[Token]:
        start = self.i
        char = self.peek()
        if char == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise self.error(f"parentheses nest deeper than {MAX_DEPTH} levels")
            self.i += 1
            tokens = self.pattern(open_at=start)
            self.i += 1  # the ')'
            self.depth -= 1
            run_length = 1
        elif char in LETTERS:
            tokens = self.letter_run()
            run_length = len(tokens)
        elif char in REPEAT:
            raise self.error(f"repetition {char!r} has nothing before it to repeat")
        else:
            raise self.error(f"unexpected character {char!r} (blocks are pairs of letters A-Z or '-')")
        # An optional repetition, possibly with spaces around the operator.
        save = self.i
        self.skip_space()
        if self.peek() and self.peek() in REPEAT:
            op_at = self.i
            self.i += 1
            self.skip_space()
            digits_at = self.i
            while self.peek() and self.peek() in DIGITS:
                self.i += 1
            if self.i == digits_at:
                raise self.error(f"repetition {self.text[op_at]!r} needs a count after it (ASCII digits 0-9)")
            digits = self.text[digits_at:self.i]
            count = int(digits) if len(digits) <= len(str(MAX_BLOCKS)) else MAX_BLOCKS + 1
            if count < 1:
                raise self.error(f"repetition count must be at least 1; got {count}", at=digits_at)
            if len(tokens) * count > MAX_BLOCKS:
                shown = digits if len(digits) <= 12 else f"{digits[:6]}… ({len(digits)} digits)"
                raise self.error(f"repeating {len(tokens)} blocks {shown} times exceeds the limit of {MAX_BLOCKS:,} "
                                 "blocks", at=digits_at)
            if run_length > 1:
                raise self.error(
                    f"repetition after the run {self.text[start:op_at].strip()!r} of {run_length} blocks is "
                    "ambiguous: put the run in parentheses, or separate the blocks",
                    at=op_at,
                )
            return tokens * count
        self.i = save
        return tokens

    def letter_run(self) -> list[Token]:
        start = self.i
        while self.peek() and self.peek() in LETTERS:
            self.i += 1
        run = self.text[start:self.i]
        if len(run) % 2 != 0:
            raise self.error(
                f"the letter run {run!r} has an odd number of letters ({len(run)}); blocks are pairs", at=start
            )
        tokens = []
        for k in range(0, len(run), 2):
            seq, state = run[k], run[k + 1]
            if seq == "-" and state == "-":
                raise self.error("'--' is a block with neither a sequence nor a state mixer", at=start + k)
            tokens.append(Token(None if seq == "-" else seq, None if state == "-" else state, start + k + 1))
        return tokens
