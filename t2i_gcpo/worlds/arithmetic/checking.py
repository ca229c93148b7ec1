"""Reading a model's completion: its answer, its rewards, and its first wrong step
(docs/worlds/arithmetic.md).

A completion is read line by line ("\\n"). The *answer line* is the first line that starts with
"####" (after optional spaces); the answer is the integer after it, or None when there is no such
line or it holds anything else. Text after the answer line is ignored by the answer and the step
check (the format reward refuses it).

First wrong step (for step lift = share of credit on its tokens / share of its tokens, over failed
completions). A completion whose answer is correct has none. Otherwise the step lines before the
answer line are replayed against the problem's expression tree; blank lines are skipped, and the
first line that is

- not of the form `a op b = c` (integers, op in + - *, spaces allowed), or
- false arithmetic (a op b ≠ c), or
- not a correct next reduction: no node of the current tree has children a and b and operator op
  (`problems.reductions`: any order that respects precedence and left associativity counts, e.g.
  either product of "2*3+4*5" first, but never "2+3" in "9-2+3"; nothing is left to reduce once
  the tree is a number)

is the wrong step. When every step line is right, the answer line is (its answer is wrong or
unreadable); when there is no answer line, the span is empty at the end of the text: the wrong
decision was to stop, i.e. the end-of-sequence token, which the caller may add. Spans are
(start, end) character offsets into the completion, end exclusive, covering the line without its
newline. When two redexes read alike, every tree they lead to is kept, so no valid order is missed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from t2i_gcpo.worlds.arithmetic.problems import INTEGER, Node, Problem, Step, expression_tree, reductions

_STEP = re.compile(r" *(-?\d+) *([-+*]) *(-?\d+) *= *(-?\d+) *")
_CANONICAL_STEP = re.compile(r"-?\d+[-+*]-?\d+=-?\d+")
_ANSWER = re.compile(rf"####\s*({INTEGER})\s*")  # "#### 2,000" as problem files accept it
_CANONICAL_ANSWER = re.compile(r"#### -?\d+")


def _lines(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, line) for each "\\n"-separated line, end exclusive of the newline."""
    start = 0
    for line in text.split("\n"):
        yield start, start + len(line), line
        start += len(line) + 1


def _is_answer_line(line: str) -> bool:
    return line.lstrip().startswith("####")


def parse_step(line: str) -> Step | None:
    """The step a line writes ("7*3=21", " 7 * 3 = 21 "), true or not; None if it is not one."""
    m = _STEP.fullmatch(line)
    return None if m is None else Step(int(m[1]), m[2], int(m[3]), int(m[4]))


def extract_answer(text: str) -> int | None:
    """The integer of the first "####" line; None when there is none or it is malformed."""
    for _, _, line in _lines(text):
        if _is_answer_line(line):
            m = _ANSWER.fullmatch(line.strip())
            return None if m is None else int(m[1].replace(",", ""))
    return None


def correctness_reward(problem: Problem, text: str) -> float:
    """1.0 when the completion's answer equals the problem's, else 0.0."""
    if problem.answer is None:
        raise ValueError(f"problem {problem.question!r} has no answer to check against")
    return float(extract_answer(text) == problem.answer)


def format_reward(text: str) -> float:
    """1.0 when the completion is well formed: canonical step lines ("7*3=21", true or not), then
    one "#### N" line, then at most a newline; no blank lines. Else 0.0."""
    lines = text.removesuffix("\n").split("\n")
    ok = all(_CANONICAL_STEP.fullmatch(x) for x in lines[:-1]) and _CANONICAL_ANSWER.fullmatch(lines[-1])
    return float(bool(ok))


def overlong_penalty(length: int, max_len: int, cache_len: int) -> float:
    """DAPO's soft overlong punishment (arXiv 2503.14476 §3.4), L_max = `max_len`,
    L_cache = `cache_len`: 0 up to L_max − L_cache tokens, then falling linearly to −1 at L_max,
    −1 beyond."""
    if not 0 <= cache_len <= max_len:
        raise ValueError(f"need 0 ≤ cache_len ≤ max_len, got cache_len={cache_len}, max_len={max_len}")
    if length <= max_len - cache_len:
        return 0.0
    if length <= max_len:
        return (max_len - cache_len - length) / cache_len
    return -1.0


def first_wrong_step(problem: Problem, text: str) -> tuple[int, int] | None:
    """The (start, end) character span of the completion's first wrong step (module docstring);
    None when its answer is correct. Raises ValueError for a problem outside this world."""
    tree = expression_tree(problem)
    if extract_answer(text) == problem.answer:
        return None
    states: set[Node] = {tree}
    for start, end, line in _lines(text):
        if not line.strip():
            continue
        if _is_answer_line(line):
            return start, end
        step = parse_step(line)
        if step is None or not step.is_true:
            return start, end
        states = {after for node in states for s, after in reductions(node) if s == step}
        if not states:
            return start, end
    return len(text), len(text)


def span_to_token_indices(span: tuple[int, int], offsets: Sequence[tuple[int, int]]) -> list[int]:
    """Indices of the tokens overlapping the character span, given a tokenizer's offset mapping
    (one (start, end) per token, over the same text as the span). Zero-width tokens (specials)
    and an empty span give none."""
    lo, hi = span
    return [i for i, (s, e) in enumerate(offsets) if s < e and s < hi and e > lo]
