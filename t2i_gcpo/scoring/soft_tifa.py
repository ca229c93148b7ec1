"""Soft-TIFA, TIFA and VQAScore as GenEval 2 computes them (Kamath et al. 2025, "GenEval 2: Addressing
Benchmark Drift in Text-to-Image Evaluation", arXiv 2512.16853; facebookresearch/GenEval2 evaluation.py and
soft_tifa_analysis.py, commit a6e82d2289e8d418f27f0adee77908b07060eea3, written anew): the questions, the
answer lists and the per-image scores, shared by the ``eval geneval2`` benchmark
(t2i_gcpo/eval/suites/geneval2.py) and the ``soft_tifa`` reward (t2i_gcpo/rewards/forms/soft_tifa.py).
docs/evaluation/geneval2.md has the formulas.

A prompt carries its atoms as GenEval 2's data does: ``vqa_list``, [question, answer] pairs (and, for the
benchmark's tables, ``skills`` and ``atom_count``). Atom k is asked as "<question> Answer in one word." with
its answer list A_k: for a question starting "How many", the answer as written, capitalised, each with a
leading space, and its digits ("four" → four, Four, " four", " Four", 4, " 4"; a word outside one … ten gives
"other"); otherwise Yes, yes, " yes", " Yes". VQAScore asks 'Does this image show "<prompt>"? Answer the
question with Yes or No.' with the yes list. A VQA model gives each question's

    s_k = P(A_k | image, question_k) = Σ_{a ∈ A_k} P(first answer token = a)       (soft score)
    t_k = 1[argmax token, lower-cased, ∈ A_k]                                        (TIFA's hard score)

and an image with K atoms scores

    Soft-TIFA AM = (1/K) Σ_k s_k          Soft-TIFA GM = (Π_k s_k)^{1/K}  (0 when any s_k = 0)
    TIFA = (1/K) Σ_k t_k                  VQAScore = P(yes list | image, VQAScore question)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from t2i_gcpo.errors import UserError, shorten

SKILLS = ("object", "attribute", "count", "position", "verb")
YES = ("Yes", "yes", " yes", " Yes")
NUMBERS = {
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
}
ATOM_QUESTION = "{} Answer in one word."
VQASCORE_QUESTION = 'Does this image show "{}"? Answer the question with Yes or No.'
KEYS = ("prompt", "atom_count", "vqa_list", "skills")


def check_row(row: Any, where: str) -> dict:
    """One GenEval 2 prompt object, checked field by field (`where` names it in the message)."""

    def bad(field: str, why: str) -> UserError:
        return UserError(f"{where}: field '{field}' {why} (not GenEval 2's format: {', '.join(KEYS)})")

    if not isinstance(row, dict):
        raise UserError(
            f"{where}: expected a JSON object with {', '.join(KEYS)}, got {shorten(repr(row), 60)}"
        )
    for key in KEYS:
        if key not in row:
            raise bad(key, "is missing")
    if not isinstance(row["prompt"], str) or not row["prompt"].strip():
        raise bad("prompt", "must be a non-empty string")
    if isinstance(row["atom_count"], bool) or not isinstance(row["atom_count"], int) or row["atom_count"] < 1:
        raise bad("atom_count", f"must be a positive integer, got {shorten(repr(row['atom_count']), 40)}")
    pairs = row["vqa_list"]
    if not isinstance(pairs, list) or not pairs:
        raise bad("vqa_list", "must be a non-empty list of [question, answer] pairs")
    for i, pair in enumerate(pairs):
        if not (
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) and x.strip() for x in pair)
        ):
            raise bad(
                f"vqa_list[{i}]",
                f"must be a [question, answer] pair of strings, got {shorten(repr(pair), 60)}",
            )
    skills = row["skills"]
    if not isinstance(skills, list) or len(skills) != len(pairs):
        raise bad("skills", f"must be a list of one skill per question ({len(pairs)})")
    for i, skill in enumerate(skills):
        if skill not in SKILLS:
            raise bad(f"skills[{i}]", f"must be one of {', '.join(SKILLS)}, got {shorten(repr(skill), 40)}")
    return row


def numeric(word: str) -> str:
    """The reference's digits of a number word ("four" → "4"; any other word → "other")."""
    return NUMBERS.get(word, "other")


def answer_list(question: str, answer: str) -> tuple[str, ...]:
    """The answers whose probability is an atom's soft score (module docstring)."""
    if question.startswith("How many"):
        return (
            answer,
            answer.capitalize(),
            " " + answer,
            " " + answer.capitalize(),
            numeric(answer),
            " " + numeric(answer),
        )
    return YES


def atom_questions(row: dict) -> list[tuple[str, tuple[str, ...]]]:
    """(the text asked, its answer list) per atom of a prompt."""
    return [(ATOM_QUESTION.format(q), answer_list(q, a)) for q, a in row["vqa_list"]]


def vqascore_question(row: dict) -> tuple[str, tuple[str, ...]]:
    return VQASCORE_QUESTION.replace("{}", row["prompt"]), YES


# ----------------------------------------------------------------------------- scores


def tifa_hit(prediction: str, answers: Sequence[str]) -> float:
    """TIFA's hard score: 1 when the argmax token, lower-cased, is one of the answers (module docstring)."""
    return 1.0 if prediction.lower() in answers else 0.0


def geometric_mean(values: Sequence[float]) -> float:
    """(Π v)^{1/n}, 0 when any v is 0 (scipy.stats.gmean's value there)."""
    if any(v <= 0 for v in values):
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


def image_scores(soft: Sequence[float | None], hard: Sequence[float]) -> dict[str, float | None]:
    """Soft-TIFA AM / GM and TIFA of one image from its atoms' soft and hard scores (soft None: a judge
    without log-probabilities)."""
    out: dict[str, float | None] = {"tifa": sum(hard) / len(hard)}
    if all(s is not None for s in soft):
        out["soft_tifa_am"] = sum(soft) / len(soft)  # type: ignore[arg-type]
        out["soft_tifa_gm"] = geometric_mean(soft)  # type: ignore[arg-type]
    else:
        out["soft_tifa_am"] = out["soft_tifa_gm"] = None
    return out
