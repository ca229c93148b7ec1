"""The question-based benchmark suites a VLM judge scores (docs/evaluation/judge-suites.md): one file per
suite, each a `Suite` — its data format (`read`), its question (`messages`), its score rule (`parse`)
and its aggregation (`summarize`), from the benchmark's paper and reference code — added to `SUITES` (the
registry config.EVAL_SUITES: t2i_gcpo/extensions.py) by `register_suite`. The driver
(t2i_gcpo/eval/suites/driver.py, ``t2i-gcpo eval judge``) asks the judge one request per image, resumably, and
writes the suite's results.

`suites()` lists them (every module of this package but its machinery registers itself when first listed: a
new suite is a new file and nothing else); `suites_help()` is what ``--help`` prints. The modules import
nothing heavy (``--help`` reads them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from t2i_gcpo.config import EVAL_SUITES
from t2i_gcpo.errors import UserError


@dataclass(frozen=True)
class SuiteItem:
    """One prompt of a suite: `id` the suite's own name for it (WISE's prompt_id, TIIF's "type/short/3"),
    `prompt` what the model draws, `category` its results rows' category, `data` what the question and the
    score rule read (questions, answers, checkpoints)."""

    id: str
    prompt: str
    category: str
    data: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Suite:
    """A registered suite (module docstring).

    read(path) → [SuiteItem] (a file in the wrong format: one line naming the file and the field);
    summarize(rows) → {"overall", "categories", …its own tables}, rows one per image (key, category, score,
    …). A judge suite also has messages(item, image_url) → the chat messages of one request (the image as a
    data URL); parse(answer, item) → {"score": float in [0, 1], …the fields it read}, raising
    `asking.BadAnswer` for an answer it cannot read (asked again); reference_image(root, item, sample) → the
    image of the reference's own folder layout (``--score-only``).
    """

    name: str
    doc: str  # one line: what it measures
    source: str  # the reference code it follows (repository, files, commit)
    data: str  # what --data is and where it comes from
    read: Callable[[Path], list[SuiteItem]]
    summarize: Callable[[list[dict]], dict]
    kind: str = "judge"  # "judge": one request per image to a judge; "vqa": a VQA model per atom (GenEval 2)
    messages: Callable[[SuiteItem, str], list[dict]] | None = None
    parse: Callable[[str, SuiteItem], dict] | None = None
    reference_image: Callable[[Path, SuiteItem, int], Path] | None = None
    images_per_prompt: int = 1  # the reference's
    temperature: float = 0.0
    max_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # more fields of the request body
    example: str = ""


SUITES = EVAL_SUITES  # every registered suite by name


def register_suite(suite: Suite) -> Suite:
    """Add `suite` to `SUITES` under its name (one registration per suite file)."""
    return SUITES.add(suite)


def suites(kind: str | None = None) -> dict[str, Suite]:
    """Every registered suite by name (those of `kind`, when given), in name order of their modules."""
    return {name: SUITES[name] for name in SUITES.names(plugins=True) if kind in (None, SUITES[name].kind)}


def suite_names(kind: str | None = None) -> tuple[str, ...]:
    return tuple(suites(kind))


def get_suite(name: str, kind: str | None = None) -> Suite:
    found = suites(kind).get(name)
    if found is None:
        what = "judge suite" if kind == "judge" else "suite"
        raise UserError(f"unknown {what} {name!r}: use one of {', '.join(suite_names(kind))}")
    return found


def suites_help(kind: str | None = None) -> str:
    """One entry per suite: its name, what it measures and its data."""
    return "; ".join(f"{s.name}: {s.doc} (--data: {s.data})" for s in suites(kind).values())
