"""Arithmetic problems (docs/worlds/arithmetic.md): integer expressions over + - * and
their correct reductions.

An expression is parsed into a tree with the usual precedence (* before + and -, both left
associative), so "12-3+2*4" is ((12-3)+(2*4)). A reduction replaces one node whose two children
are numbers (a *redex*) by its value; a worked solution is one reduction per line. The canonical
order, used for the reference steps and for pretraining text, is "every multiplication first, left
to right, then + and - left to right" — the order a pupil uses. Other orders that respect the tree
are just as correct, and the checker accepts them (see `reductions`).

Generated problems have 2-3 operators and operands 1..20, and every value along the canonical
reduction lies in 0..999: no negative numbers (so "-" is only ever an operator) and at most three
digits per number, which keeps the tiny model's sequences short.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from t2i_gcpo.errors import UserError, shorten

OPS = "+-*"
MIN_OPS, MAX_OPS = 2, 3  # operators per generated problem
MAX_OPERAND = 20  # operands are drawn from 1..MAX_OPERAND
MAX_VALUE = 999  # every intermediate value of a generated problem lies in 0..MAX_VALUE

MAX_QUESTION_OPS = 200  # the most operators a question may have: trees are walked recursively
# (a deeper one overflows Python's stack) and the shipped model reads 1024 characters in all
# an integer as problem files and completions write it: "2000", "-7", or with thousands commas "2,000"
INTEGER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)"

Node = int | tuple[str, "Node", "Node"]  # a number, or (op, left, right)

_EXPRESSION = re.compile(r"\s*\d+(?:\s*[-+*]\s*\d+)*\s*(?:=\s*\??\s*)?")
_TOKEN = re.compile(r"\d+|[-+*]")


def apply(op: str, a: int, b: int) -> int:
    """`a op b` for op in "+-*"."""
    return a + b if op == "+" else a - b if op == "-" else a * b


@dataclass(frozen=True)
class Step:
    """One reduction `left op right = result`; `result` may be false in a noisy solution."""

    left: int
    op: str
    right: int
    result: int

    @property
    def text(self) -> str:
        """The step's line, e.g. "7*3=21"."""
        return f"{self.left}{self.op}{self.right}={self.result}"

    @property
    def is_true(self) -> bool:
        return apply(self.op, self.left, self.right) == self.result


@dataclass(frozen=True)
class Problem:
    """A question and its answer.

    question: "12+7*3=?" for a problem of this world; free text for a loaded GSM8K-style question.
    answer: the correct final answer; None only for a free-text question read without one.
    steps: the correct reductions in canonical order; None when the question is not an expression
        of this world (its steps are unknown). A bare number has `()`.
    """

    question: str
    answer: int | None
    steps: tuple[Step, ...] | None = None


def parse_expression(text: str) -> Node | None:
    """The tree of `text` ("12+7*3", "12 + 7*3 =?", …: non-negative integers, + - *, optional
    spaces and a trailing "=" or "=?"), or None when `text` is no such expression."""
    if not _EXPRESSION.fullmatch(text):
        return None
    tokens = _TOKEN.findall(text)
    if len(tokens) // 2 > MAX_QUESTION_OPS:
        raise UserError(
            f"question {shorten(text)!r} has {len(tokens) // 2} operators, more than this world's "
            f"{MAX_QUESTION_OPS}"
        )
    terms: list[tuple[str, Node]] = []  # (op joining it to the previous term, product)
    node: Node = int(tokens[0])
    for op, num in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            node = ("*", node, int(num))
        else:
            terms.append((op, node))
            node = int(num)
    terms.append(("", node))
    tree = terms[0][1]
    for (op, _), (_, right) in zip(terms, terms[1:]):
        tree = (op, tree, right)
    return tree


def expression_tree(problem: Problem) -> Node:
    """The tree of a world problem's question; ValueError for a free-text problem."""
    tree = parse_expression(problem.question) if problem.steps is not None else None
    if tree is None:
        raise ValueError(f"{problem.question!r} is not an arithmetic-world problem: its steps are unknown")
    return tree


def render_expression(node: Node) -> str:
    """The text of a tree without parentheses (valid for the trees `parse_expression` builds)."""
    if isinstance(node, int):
        return str(node)
    op, a, b = node
    return f"{render_expression(a)}{op}{render_expression(b)}"


def reductions(node: Node, slip: int = 0) -> list[tuple[Step, Node]]:
    """Every correct next reduction of `node`, left to right: (step, tree after it).

    A step is correct iff it reduces a node both of whose children are numbers; so in
    "2*3+4*5" both products may come first, while in "9-2+3" only 9-2 may (9-(2+3) is another
    expression). `slip` is added to the reduced value (a wrong step, for noisy solutions).
    """
    if isinstance(node, int):
        return []
    op, a, b = node
    if isinstance(a, int) and isinstance(b, int):
        value = apply(op, a, b) + slip
        return [(Step(a, op, b, value), value)]
    return [(s, (op, t, b)) for s, t in reductions(a, slip)] + [
        (s, (op, a, t)) for s, t in reductions(b, slip)
    ]


def canonical_reduction(node: Node, slip: int = 0) -> tuple[Step, Node]:
    """The canonical next reduction: the leftmost multiplication, else the leftmost reduction."""
    options = reductions(node, slip)
    return next((r for r in options if r[0].op == "*"), options[0])


def solve(node: Node) -> tuple[Step, ...]:
    """The canonical steps reducing `node` to a number."""
    steps = []
    while not isinstance(node, int):
        step, node = canonical_reduction(node)
        steps.append(step)
    return tuple(steps)


def parse_question(text: str) -> Problem | None:
    """The world problem of an expression ("12+7*3=?", "12 + 7*3"), its question rewritten in
    the canonical form "12+7*3=?"; None when `text` is not an expression of this world."""
    tree = parse_expression(text)
    if tree is None:
        return None
    steps = solve(tree)
    answer = steps[-1].result if steps else tree
    return Problem(f"{render_expression(tree)}=?", answer, steps)


def generate_problem(rng: random.Random) -> Problem:
    """One random problem: MIN_OPS..MAX_OPS operators and operands 1..MAX_OPERAND, redrawn until
    every value of its canonical reduction lies in 0..MAX_VALUE."""
    while True:
        n_ops = rng.randint(MIN_OPS, MAX_OPS)
        text = str(rng.randint(1, MAX_OPERAND))
        for _ in range(n_ops):
            text += rng.choice(OPS) + str(rng.randint(1, MAX_OPERAND))
        problem = parse_question(text)
        assert problem is not None and problem.steps is not None
        if all(0 <= s.result <= MAX_VALUE for s in problem.steps):
            return problem


def generate_problems(n: int, seed: int) -> list[Problem]:
    """`n` random problems (repeats possible), deterministic in `seed`."""
    rng = random.Random(seed)
    return [generate_problem(rng) for _ in range(n)]


def make_splits(n_train: int = 5000, n_test: int = 200, seed: int = 0) -> tuple[list[Problem], list[Problem]]:
    """(train, test): distinct problems, deterministic in `seed`, disjoint by question text.

    The test set is drawn first so that it does not change with `n_train`.
    """
    if n_train < 0 or n_test < 0:
        raise UserError(f"split sizes must be ≥ 0, got n_train={n_train}, n_test={n_test}")
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: list[list[Problem]] = []
    for n in (n_test, n_train):
        out: list[Problem] = []
        for _ in range(50 * n + 1000):  # the problem space has millions of members: ample
            if len(out) == n:
                break
            p = generate_problem(rng)
            if p.question not in seen:
                seen.add(p.question)
                out.append(p)
        if len(out) < n:
            raise UserError(f"cannot draw {n} distinct arithmetic problems; ask for fewer")
        splits.append(out)
    test, train = splits
    return train, test
