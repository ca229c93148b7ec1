"""The question-based benchmark suites a VLM judge scores (docs/evaluation/judge-suites.md): one file per
suite, each a `JudgeSuite` — its data format (`read`), its question (`messages`), its score rule (`parse`)
and its aggregation (`summarize`), from the benchmark's paper and reference code — added to `SUITES` by
`register_suite`. The driver (t2i_gcpo/eval/judge_suites.py, ``t2i-gcpo eval judge``) asks the judge one
request per image, resumably, and writes the suite's results.

`suites()` lists them (every module of this package registers itself when first listed: a new suite is a
new file and nothing else); `suites_help()` is what ``--help`` prints. The modules import nothing heavy
(``--help`` reads them).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
class JudgeSuite:
    """A registered suite (module docstring).

    read(path) → [SuiteItem] (a file in the wrong format: one line naming the file and the field);
    messages(item, image_url) → the chat messages of one request (the image as a data URL);
    parse(answer, item) → {"score": float in [0, 1], …the fields it read}, raising `asking.BadAnswer` for an
    answer it cannot read (asked again) ; summarize(rows) → {"overall", "categories", …its own tables};
    reference_image(root, item, sample) → the image of the reference's own folder layout (``--score-only``).
    """

    name: str
    doc: str  # one line: what it measures
    source: str  # the reference code it follows (repository, files, commit)
    data: str  # what --data is and where it comes from
    read: Callable[[Path], list[SuiteItem]]
    messages: Callable[[SuiteItem, str], list[dict]]
    parse: Callable[[str, SuiteItem], dict]
    summarize: Callable[[list[dict]], dict]
    reference_image: Callable[[Path, SuiteItem, int], Path]
    images_per_prompt: int = 1  # the reference's
    temperature: float = 0.0
    max_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # more fields of the request body
    example: str = ""


SUITES: dict[str, JudgeSuite] = {}
_discovered = {"done": False}


def register_suite(suite: JudgeSuite) -> JudgeSuite:
    """Add `suite` to `SUITES` under its name (one registration per suite file)."""
    if suite.name in SUITES and SUITES[suite.name] is not suite:
        raise ValueError(f"judge suite {suite.name!r} is already registered")
    SUITES[suite.name] = suite
    return suite


def suites() -> dict[str, JudgeSuite]:
    """Every registered suite by name (the modules of this package imported once, in name order)."""
    if not _discovered["done"]:
        _discovered["done"] = True
        for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
            if not module.startswith("_"):
                importlib.import_module(f"{__name__}.{module}")
    return dict(SUITES)


def suite_names() -> tuple[str, ...]:
    return tuple(suites())


def get_suite(name: str) -> JudgeSuite:
    found = suites().get(name)
    if found is None:
        raise UserError(f"unknown judge suite {name!r}: use one of {', '.join(suite_names())}")
    return found


def suites_help() -> str:
    """One entry per suite: its name, what it measures and its data."""
    return "; ".join(f"{s.name}: {s.doc} (--data: {s.data})" for s in suites().values())
