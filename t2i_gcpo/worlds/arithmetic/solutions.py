"""Worked solutions: one reduction per line in canonical order, then "#### <answer>"
(docs/worlds/arithmetic.md).

    12+7*3=?   →   7*3=21
                   12+21=33
                   #### 33

Noisy solutions are the pretraining data that keep the tiny model's base accuracy well below 1:
each step's result is off by a small offset with probability `p_wrong`, and the later steps
compute exactly from the wrong value, as a pupil who slipped once would. So a noisy solution's
answer is wrong exactly when one of its steps was corrupted (`noisy_solution` makes sure that two
slips never cancel), and its first wrong step is its first corrupted line. A slip never makes a
value negative by itself, but a later subtraction from a value slipped upwards may (12-13=-1).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from t2i_gcpo.worlds.arithmetic.problems import Node, Problem, Step, canonical_reduction, expression_tree

ANSWER_PREFIX = "#### "


def render_solution(steps: tuple[Step, ...] | list[Step], answer: int) -> str:
    """The solution text: each step's line, then "#### answer" (no trailing newline)."""
    return "".join(s.text + "\n" for s in steps) + f"{ANSWER_PREFIX}{answer}"


def solution_text(problem: Problem) -> str:
    """The correct worked solution of a world problem."""
    expression_tree(problem)
    assert problem.steps is not None and problem.answer is not None
    return render_solution(problem.steps, problem.answer)


@dataclass(frozen=True)
class NoisySolution:
    """A solution with some corrupted steps.

    text: the rendered solution. steps: its steps as written (a corrupted step's `is_true` is
    False; every other step is true arithmetic on the values written before it). answer: its final
    value, wrong iff `corrupted` is not empty. corrupted: indices into `steps`, ascending.
    """

    text: str
    steps: tuple[Step, ...]
    answer: int
    corrupted: tuple[int, ...]


def _run(tree: Node, slips: list[int]) -> tuple[list[Step], int]:
    """The steps as written when `slips[i]` is added to the result of canonical step i."""
    steps = []
    for slip in slips:
        step, tree = canonical_reduction(tree, slip)
        steps.append(step)
    assert isinstance(tree, int)
    return steps, tree


def _slip_choices(op: str, value: int, max_offset: int) -> list[int]:
    """Offsets ±1..±max_offset, keeping a product ≥ 1 and a sum or difference ≥ 0 when possible:
    a product of positive factors never becomes 0, so a slip stays visible in the answer."""
    offsets = [o for m in range(1, max_offset + 1) for o in (m, -m)]
    floor = 1 if op == "*" else 0
    return [o for o in offsets if value + o >= floor] or offsets


def noisy_solution(
    problem: Problem, p_wrong: float, rng: random.Random | int, max_offset: int = 3
) -> NoisySolution:
    """A solution whose every step slips with probability `p_wrong`, seeded by `rng` (a
    `random.Random`, advanced, or a seed).

    A slip adds a nonzero offset of at most `max_offset` (≥ 2) to the step's result; later steps
    use the wrong value. Two slips could cancel (+1 then -1); then the last slip takes another
    offset — at most one offset cancels when the operands are ≥ 1, since the rest of the reduction
    is then injective in that value — or, failing that, is undone, so the answer is wrong
    iff some step slipped.
    """
    if not 0.0 <= p_wrong <= 1.0:
        raise ValueError(f"p_wrong must lie in [0, 1], got {p_wrong}")
    if max_offset < 2:
        raise ValueError(f"max_offset must be ≥ 2, got {max_offset}")
    rng = rng if isinstance(rng, random.Random) else random.Random(rng)
    tree = expression_tree(problem)
    slips: list[int] = []
    node = tree
    while not isinstance(node, int):
        step, _ = canonical_reduction(node)
        slip = rng.choice(_slip_choices(step.op, step.result, max_offset)) if rng.random() < p_wrong else 0
        _, node = canonical_reduction(node, slip)
        slips.append(slip)
    steps, answer = _run(tree, slips)
    while any(slips) and answer == problem.answer:  # slips cancelled: change the last one
        last = max(i for i, s in enumerate(slips) if s)
        value = steps[last].result - slips[last]  # the step's true result given earlier slips
        for slip in [o for o in _slip_choices(steps[last].op, value, max_offset) if o != slips[last]] + [0]:
            slips[last] = slip
            steps, answer = _run(tree, slips)
            if answer != problem.answer:
                break
    corrupted = tuple(i for i, s in enumerate(slips) if s)
    return NoisySolution(render_solution(steps, answer), tuple(steps), answer, corrupted)
