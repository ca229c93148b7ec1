"""Problem files: GSM8K-style .jsonl and one-question-a-line .txt (docs/worlds/arithmetic.md).

`.jsonl` rows are objects with a question — "question", else "prompt" — and an "answer" that is
either GSM8K's solution text ending in "#### N" (N may carry thousands commas: "#### 1,200") or an
integer. `.txt` files hold one question a line; blank lines and lines starting with "#" are
skipped. A question that is an expression of this world ("12+7*3=?", "12 + 7*3") becomes the
world's problem, in canonical form with its steps, so that first wrong steps can be found; a given
answer must then equal its value. Any other question is kept as free text with `steps=None`, and
from a .txt file also with `answer=None` (fine for sampling, not for rewards).

Errors are `UserError`s on one line, naming file and line: "p.jsonl:3: malformed JSON (…)".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from t2i_gcpo.errors import UserError, shorten
from t2i_gcpo.outdir import parse_json, read_lines
from t2i_gcpo.worlds.arithmetic.problems import INTEGER, Problem, parse_question
from t2i_gcpo.worlds.arithmetic.solutions import solution_text

_INTEGER = re.compile(INTEGER)


def answer_from_text(text: str) -> int:
    """The integer after the last "####" of a GSM8K answer text; `UserError` (reason only)."""
    if "####" not in text:
        raise UserError(
            f'answer text has no "#### N" line (give "…#### 33" or the integer 33): {shorten(text)!r}'
        )
    value = text.rsplit("####", 1)[1].strip()
    if not _INTEGER.fullmatch(value):
        raise UserError(f'the answer after "####" is not an integer: {shorten(value)!r}')
    return int(value.replace(",", ""))


def _problem(question: str, answer: int | None) -> Problem:
    """The world problem of `question` if it is an expression (checking `answer`), else free text."""
    world = parse_question(question)
    if world is None:
        return Problem(question.strip(), answer)
    if answer is not None and answer != world.answer:
        raise UserError(f"answer {answer} is wrong: {world.question} gives {world.answer}")
    return world


def _row(record: object) -> Problem:
    """The problem of one .jsonl row; `UserError` with the reason only."""
    if not isinstance(record, dict):
        raise UserError('expected a JSON object with "question" (or "prompt") and "answer"')
    question = record.get("question", record.get("prompt"))
    if not isinstance(question, str) or not question.strip():
        raise UserError('no "question" (or "prompt") text')
    if "answer" not in record:
        raise UserError(f'no "answer" for question {shorten(question)!r}')
    answer = record["answer"]
    if isinstance(answer, str):
        return _problem(question, answer_from_text(answer))
    if isinstance(answer, int) and not isinstance(answer, bool):
        return _problem(question, answer)
    raise UserError(
        f'"answer" must be an integer or a text ending in "#### N", got {shorten(json.dumps(answer))}'
    )


def read_problem_file(path: str | Path) -> list[Problem]:
    """The problems of a .jsonl or .txt file (module docstring); `UserError` for a bad line, naming
    file and line, and for a missing, unreadable or empty file. A UTF-8 byte-order mark is ignored."""
    path, lines = read_lines(path, "problem file", {".txt": "questions", ".jsonl": "question and answer"})
    out: list[Problem] = []
    for lineno, line in lines:
        try:
            if path.suffix == ".txt":
                out.append(_problem(line, None))
                continue
            record = parse_json(line, "")  # malformed or nested too deeply: one line
            out.append(_row(record))
        except UserError as e:
            raise UserError(f"{path}:{lineno}: {e}") from None
    if not out:
        raise UserError(f"problem file {path} has no problems")
    return out


def write_problems(problems: list[Problem], path: str | Path) -> None:
    """`.jsonl`: GSM8K rows {"question", "answer"} (the worked solution for world problems, else
    the integer); `.txt`: one question a line. `read_problem_file` reads both back."""
    path = Path(path)
    if path.suffix == ".txt":
        text = "".join(p.question + "\n" for p in problems)
    elif path.suffix == ".jsonl":
        if any(p.answer is None for p in problems):
            raise ValueError("a .jsonl problem file needs every answer; write questions alone to .txt")
        rows = [
            {"question": p.question, "answer": p.answer if p.steps is None else solution_text(p)}
            for p in problems
        ]
        text = "".join(json.dumps(r) + "\n" for r in rows)
    else:
        raise UserError(f"problem file {path} must end in .txt or .jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
