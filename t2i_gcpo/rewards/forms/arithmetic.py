"""The arithmetic reward (docs/worlds/arithmetic.md): answer correctness, an optional format bonus and DAPO's
soft overlong penalty, on the completions of the text path.

    r_i = correct_i + λ_fmt · format_i + overlong_i

- correct_i ∈ {0, 1}: the completion's "#### N" answer equals the problem's
  (`worlds.arithmetic.correctness_reward`);
- format_i ∈ {0, 1}: canonical step lines, then one "#### N" line (`format_reward`); λ_fmt = 0 by
  default (spec option ``format=λ``);
- overlong_i ∈ [−1, 0]: DAPO's soft overlong punishment (arXiv 2503.14476 §3.4) with L_max, L_cache
  (spec option ``overlong=L_MAX/L_CACHE``; off by default). The length is counted in characters of
  the decoded completion (its EOS not counted) — the token count of the built-in character tokenizer;
  give ``tokenizer=`` to count another tokenizer's tokens of the decoded text instead.

Per-sample details: ``correct`` (bool), ``answer`` (the completion's answer, int or None),
``target`` (the problem's answer), ``first_wrong_span`` ((start, end) character span of the first
wrong step in the completion, or None when the answer is correct or the question is free text whose
steps are unknown), ``format`` (float), ``overlong`` (float), ``length`` (int) and ``completion``
(the text scored — the task checks its token offsets against it for step lift).

Prompts: the metadata the arithmetic task writes (`problem_meta`: question, answer, steps); a prompt
without metadata is read from its text (an expression of this world such as "12+7*3=?"). A problem
without an answer cannot be scored: a `UserError`, raised as `RewardError` by the registry's wrapper.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any

from t2i_gcpo.errors import UserError, shorten
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.registry import Option, register_reward
from t2i_gcpo.worlds.arithmetic import (
    Problem,
    extract_answer,
    first_wrong_step,
    format_reward,
    overlong_penalty,
    parse_question,
)

SPEC_FORM = "arithmetic[:format=W][,overlong=L_MAX/L_CACHE]"
EXAMPLE = "arithmetic:format=0.1,overlong=256/64"


@register_reward(
    "arithmetic",
    scores="text",
    doc=(
        "the arithmetic world's answer correctness (1/0), plus W × format reward, plus DAPO's "
        "overlong penalty"
    ),
    weights="none",
    source="DAPO's soft overlong punishment, arXiv 2503.14476 §3.4; docs/worlds/arithmetic.md",
    licence="Apache-2.0 (this package)",
    usage=SPEC_FORM,
    example=EXAMPLE,
)
def load(
    *,
    format: Annotated[float, Option("λ_fmt: the weight of the format reward")] = 0.0,
    overlong: Annotated[
        str | None, Option("L_MAX/L_CACHE: DAPO's soft overlong penalty (off when not given)")
    ] = None,
    tokenizer: Any = None,
) -> ArithmeticReward:
    max_len = cache_len = None
    if overlong is not None:
        lmax, slash, lcache = overlong.partition("/")
        try:
            if not slash:
                raise ValueError
            max_len, cache_len = int(lmax), int(lcache)
        except ValueError:
            raise UserError(
                f"reward option 'overlong={overlong}': write {SPEC_FORM}, e.g. {EXAMPLE}"
            ) from None
    return ArithmeticReward(format, max_len, cache_len, tokenizer=tokenizer)


def problem_meta(problem: Problem) -> dict[str, Any]:
    """The prompt metadata of a problem: ``{"question", "answer", "steps"}`` (steps: the canonical
    step lines, or None for a free-text question whose steps are unknown). JSON-serialisable."""
    steps = None if problem.steps is None else [s.text for s in problem.steps]
    return {"question": problem.question, "answer": problem.answer, "steps": steps}


def problem_from(meta: dict | None, text: str) -> Problem:
    """The problem a prompt asks: from `problem_meta` metadata, else from the prompt text. A world
    expression gets its steps back (for the first wrong step); anything else is free text."""
    meta = meta or {}
    question = meta.get("question", text)
    answer = meta.get("answer")
    world = parse_question(question) if isinstance(question, str) else None
    if world is not None:
        if answer is not None and answer != world.answer:
            raise UserError(
                f"prompt {shorten(question)!r}: metadata answer {answer} ≠ its value {world.answer}"
            )
        return world
    return Problem(str(question), None if answer is None else int(answer))


class ArithmeticReward:
    """r_i = correct_i + format_weight · format_i + overlong_i (module docstring)."""

    name = "arithmetic"

    def __init__(
        self,
        format_weight: float = 0.0,
        max_len: int | None = None,
        cache_len: int | None = None,
        tokenizer: Any = None,
    ) -> None:
        if not math.isfinite(float(format_weight)):
            raise UserError(f"arithmetic reward: format weight must be finite, got {format_weight}")
        if (max_len is None) != (cache_len is None):
            raise UserError(
                "arithmetic reward: give both L_max and L_cache for the overlong penalty, or neither"
            )
        if max_len is not None and not 0 < int(cache_len) <= int(max_len):
            raise UserError(
                f"arithmetic reward: need 0 < L_cache ≤ L_max, got L_max={max_len}, L_cache={cache_len}"
            )
        self.format_weight = float(format_weight)  # λ_fmt
        self.max_len = None if max_len is None else int(max_len)  # L_max (DAPO)
        self.cache_len = None if cache_len is None else int(cache_len)  # L_cache (DAPO)
        self.tokenizer = tokenizer  # counts lengths in its tokens when given; else characters

    @property
    def bounds(self) -> tuple[float, float]:
        """The range every r_i lies in (rewards.combine.reward_bounds): correct_i and format_i in {0, 1},
        overlong_i in [−1, 0] when on."""
        low = (-1.0 if self.max_len is not None else 0.0) + min(self.format_weight, 0.0)
        return (low, 1.0 + max(self.format_weight, 0.0))

    def length(self, text: str) -> int:
        """The completion's length for the overlong penalty: characters, or the tokenizer's tokens."""
        if self.tokenizer is None:
            return len(text)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def score_text(self, problem: Problem, text: str) -> dict[str, Any]:
        """Details of one completion (module docstring) plus its reward under "reward"."""
        if problem.answer is None:
            raise UserError(
                f"question {shorten(problem.question)!r} has no answer to score against "
                "(give a .jsonl problem file with answers)"
            )
        answer = extract_answer(text)
        correct = answer == problem.answer
        span = None
        if not correct and problem.steps is not None:
            span = first_wrong_step(problem, text)
        fmt = format_reward(text)
        length = self.length(text)
        over = overlong_penalty(length, self.max_len, self.cache_len) if self.max_len is not None else 0.0
        return {
            "reward": float(correct) + self.format_weight * fmt + over,
            "correct": bool(correct),
            "answer": answer,
            "target": problem.answer,
            "first_wrong_span": span,
            "format": fmt,
            "overlong": over,
            "length": length,
            "completion": text,
        }

    def check_prompts(self, prompts: list[str], metadata: list[dict]) -> None:
        """Every prompt must carry its answer (a question alone cannot be scored)."""
        for i, text in enumerate(prompts):
            problem = problem_from(metadata[i] if metadata else None, text)
            if problem.answer is None:
                raise UserError(
                    f"question {shorten(problem.question)!r} has no answer to score against "
                    "(give a .jsonl problem file with answers)"
                )

    def __call__(self, texts: Sequence[str], prompts: list[str], metadata: list[dict]) -> RewardOutput:
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise UserError("the arithmetic reward scores text completions (a list of strings)")
        if len(texts) != len(prompts) or (metadata and len(metadata) != len(texts)):
            raise ValueError(
                f"{len(texts)} completions but {len(prompts)} prompts and {len(metadata)} metadata"
            )
        details = []
        for i, text in enumerate(texts):
            problem = problem_from(metadata[i] if metadata else None, prompts[i])
            details.append(self.score_text(problem, text))
        import torch

        scores = torch.tensor([d.pop("reward") for d in details], dtype=torch.float32)  # [B]
        return RewardOutput(scores=scores, details=details)
