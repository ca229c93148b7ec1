"""The driver of the judge-scored suites (t2i_gcpo/eval/suites/, docs/evaluation/judge-suites.md): one request
per image to an OpenAI-compatible judge, built by the suite (`Suite.messages`), its answer read by the
suite's rule (`Suite.parse`) inside the retry loop — an answer the rule cannot read is asked again, as a
failed request is (eval/suites/asking.py) — and recorded in ``answers.jsonl`` with the score it gave the
moment it comes, so that an interrupted evaluation re-asks nothing it has. The rows (one per image: ``key``
"<prompt>/<image>", ``category``, ``score`` and the suite's fields) and the suite's summary follow.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from t2i_gcpo.eval.suites import Suite, SuiteItem

Entry = tuple[int, SuiteItem, Sequence[Any]]  # (prompt index, its item, its images or image paths)


def suite_questions(
    suite: Suite, entries: Sequence[Entry], scorer_fp: str, settings: dict, digest: Callable[[Any], str]
) -> list:
    """One `asking.Question` per image, id ``<prompt>/<image>``, fingerprinted by the request it makes (the
    messages with the image's digest in place of its bytes, the request settings) and the scorer."""
    from t2i_gcpo.eval.suites.asking import Question, fingerprint

    out = []
    for i, item, images in entries:
        for s, image in enumerate(images):
            seen = digest(image)
            out.append(
                Question(
                    f"{i:05d}/{s:04d}",
                    fingerprint(suite.name, suite.messages(item, seen), settings, scorer_fp),
                    (item, image),
                )
            )
    return out


def request_settings(suite: Suite, temperature: float | None = None, max_tokens: int | None = None) -> dict:
    """What a request sends besides its messages: the suite's temperature, token limit and extra fields,
    `temperature` / `max_tokens` in place of the suite's where given."""
    return {
        "temperature": suite.temperature if temperature is None else float(temperature),
        "max_tokens": suite.max_tokens if max_tokens is None else int(max_tokens),
        "extra": dict(suite.extra),
    }


def ask_function(suite: Suite, client: Any, settings: dict) -> Callable[[list], list[dict]]:
    """payloads (item, image) → [{"answer": the judge's text, "score", …the rule's fields}]; an answer the
    rule cannot read raises `BadAnswer` (asked again)."""
    from t2i_gcpo.eval.suites.judge_client import image_url

    def ask(payloads: list) -> list[dict]:
        out = []
        for item, image in payloads:
            text = client.chat(
                suite.messages(item, image_url(image)),
                temperature=settings["temperature"],
                max_tokens=settings["max_tokens"],
                extra=settings["extra"],
            )
            parsed = suite.parse(text, item)
            out.append({"answer": text, **parsed})
        return out

    return ask


def suite_rows(entries: Sequence[Entry], answers: dict[str, dict]) -> list[dict]:
    """One results row per image: key, category, score, the suite's id of the prompt, its answer's fields."""
    rows = []
    for i, item, images in entries:
        for s, image in enumerate(images):
            key = f"{i:05d}/{s:04d}"
            a = {k: v for k, v in answers[key].items() if k not in ("id", "fingerprint")}
            row = {
                "key": key,
                "category": item.category,
                "score": float(a.pop("score")),
                "id": item.id,
                "prompt": item.prompt,
                **a,
            }
            if isinstance(image, (str, os.PathLike)):
                row["image"] = str(image)
            rows.append(row)
    return rows


def score_suite(
    suite: Suite,
    entries: Sequence[Entry],
    client: Any,
    *,
    log: str | os.PathLike | None = None,
    within: str | os.PathLike | None = None,
    concurrency: int = 8,
    retries: int = 2,
    backoff: float = 1.0,
    temperature: float | None = None,
    max_tokens: int | None = None,
    progress: bool = True,
    digest: Callable[[Any], str] | None = None,
) -> list[dict]:
    """Judge every image of `entries` (module docstring); the results rows."""
    from t2i_gcpo.eval.suites.asking import answer_all, fingerprint, image_digest

    settings = request_settings(suite, temperature, max_tokens)
    questions = suite_questions(
        suite, entries, fingerprint(client.record()), settings, digest or image_digest
    )
    answers = answer_all(
        questions,
        ask_function(suite, client, settings),
        log,
        scorer=f"judge {client.name}",
        concurrency=concurrency,
        retries=retries,
        backoff=backoff,
        within=within,
        desc=f"{suite.name} judge",
        progress=progress,
    )
    return suite_rows(entries, answers)


def summary_of(suite: Suite, rows: list[dict]) -> dict:
    """The suite's summary with what every summary holds: suite, prompts, images, the 95 % interval of the
    mean image score over prompts (a prompt's images are not independent)."""
    from t2i_gcpo.stats import mean_ci95

    by_prompt: dict[str, list[float]] = {}
    for r in rows:
        by_prompt.setdefault(r["key"].split("/")[0], []).append(r["score"])
    mean, lo, hi, n = mean_ci95(sum(v) / len(v) for v in by_prompt.values())
    summary = {
        "suite": suite.name,
        **suite.summarize(rows),
        "mean_image_score": mean,
        "mean_image_score_ci95": [None if lo != lo else lo, None if hi != hi else hi],
        "prompts": n,
        "images": len(rows),
    }
    return summary


def format_summary(summary: dict) -> str:
    """A plain-text table: the overall, each category, the suite's own tables."""
    lines = [
        f"{summary['suite']} ({summary['prompts']} prompts, {summary['images']} images), judged by "
        f"{summary.get('scorer', '?')}"
    ]
    width = max([12, *map(len, summary["categories"])])
    lines += [f"  {k:<{width}} {v:7.4f}" for k, v in summary["categories"].items()]
    for key in ("groups", "primary_dimensions", "overall_by_description"):
        if key in summary:
            table = summary[key]
            if table and all(isinstance(v, dict) for v in table.values()):
                for sub, inner in table.items():
                    lines.append(f"{key} ({sub}): " + ", ".join(f"{k} {v:.4f}" for k, v in inner.items()))
            else:
                lines.append(f"{key}: " + ", ".join(f"{k} {v:.4f}" for k, v in table.items()))
    if "note" in summary:
        lines.append(f"note: {summary['note']}")
    lines.append(f"{summary['suite']} overall: {summary['overall']:.4f}")
    return "\n".join(lines)
