"""GenEval 2 (Kamath et al. 2025, arXiv 2512.16853; docs/evaluation/geneval2.md): 800 compositional prompts,
each with one VQA question per atom, scored by Soft-TIFA — the questions and per-image scores are
t2i_gcpo/scoring/soft_tifa.py's; here the data file, the asking of every image's questions (resumable, through
a local VLM or a judge) and the benchmark's numbers, from facebookresearch/GenEval2 evaluation.py and
soft_tifa_analysis.py (commit a6e82d2289e8d418f27f0adee77908b07060eea3), written anew.

Data: the user's copy of ``geneval2_data.jsonl`` (CC BY-NC 4.0: not shipped), one object a line: ``prompt``,
``atom_count`` (3 … 10), ``vqa_list`` ([question, answer] pairs) and ``skills`` (one of object, attribute,
count, position, verb per pair).

A method's benchmark score is 100 × the mean of its image score over images (one per prompt in the reference).
The analysis tables are the reference's: per skill, Soft-TIFA AM over every atom of that skill
(100 Σ s / count); per atom count, the mean Soft-TIFA GM of the prompts with that many atoms. Scores are kept
in [0, 1] in the files (summary.json, results.jsonl) and printed × 100 as the paper does. The atom questions
give Soft-TIFA AM, GM and TIFA at once (one forward pass each): ``--method`` only chooses which is the
headline and each row's ``score``; VQAScore asks its own question.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from t2i_gcpo.errors import UserError
from t2i_gcpo.scoring.soft_tifa import (
    SKILLS,
    atom_questions,
    check_row,
    image_scores,
    tifa_hit,
    vqascore_question,
)

SUITE = "geneval2"
SOURCE = "facebookresearch/GenEval2 evaluation.py, soft_tifa_analysis.py (a6e82d2)"
DATA_URL = "https://github.com/facebookresearch/GenEval2 (geneval2_data.jsonl, CC BY-NC 4.0)"
METHODS = ("soft_tifa_gm", "soft_tifa_am", "tifa", "vqascore")
METHOD_LABELS = {
    "soft_tifa_gm": "Soft-TIFA GM",
    "soft_tifa_am": "Soft-TIFA AM",
    "tifa": "TIFA",
    "vqascore": "VQAScore",
}


# ----------------------------------------------------------------------------- data


def read_geneval2_data(path: str | os.PathLike) -> list[dict]:
    """The prompts of a GenEval 2 data file (module docstring), checked: anything else is one line naming
    the file, the line and the field."""
    from t2i_gcpo.outdir import parse_json, read_side_text

    path = Path(path).expanduser()
    if path.is_dir():
        raise UserError(f"--data {path} is a folder: give GenEval 2's geneval2_data.jsonl ({DATA_URL})")
    if not path.is_file():
        raise UserError(f"--data {path} does not exist: GenEval 2's geneval2_data.jsonl is at {DATA_URL}")
    rows = []
    for lineno, line in enumerate(read_side_text(path, follow=True).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        row = parse_json(line, where)
        rows.append(check_row(row, where))
    if not rows:
        raise UserError(f"{path} holds no GenEval 2 prompts")
    return rows


def summarize(rows: Sequence[dict], method: str | None = None) -> dict[str, Any]:
    """The benchmark's numbers from results rows (one per image, as `image_rows` makes them): each method's
    score (mean over images), the headline (`method`'s), per atom count the mean of the method's image
    score ("categories", the rows' categories), and the reference's analysis tables where soft scores
    exist: per skill Soft-TIFA AM over atoms, per atom count mean Soft-TIFA GM."""
    from t2i_gcpo.stats import mean_ci95

    if not rows:
        raise UserError("GenEval 2: nothing to summarise (no images)")
    method = method or rows[0]["method"]
    methods = [m for m in METHODS if all(r.get(m) is not None for r in rows)]
    scores = {m: sum(r[m] for r in rows) / len(rows) for m in methods}
    by_count: dict[int, list[dict]] = {}
    for r in rows:
        by_count.setdefault(int(r["atom_count"]), []).append(r)
    categories = {f"atoms_{k}": sum(r["score"] for r in v) / len(v) for k, v in sorted(by_count.items())}
    mean, lo, hi, n = mean_ci95(_per_prompt(rows))
    summary: dict[str, Any] = {
        "suite": SUITE,
        "method": method,
        "label": METHOD_LABELS[method],
        "overall": scores.get(method, mean),
        "ci95": [lo, hi],
        "prompts": n,
        "images": len(rows),
        "categories": categories,
        "methods": scores,
    }
    if "soft_tifa_am" in methods:
        atoms: dict[str, list[float]] = {}
        for r in rows:
            for skill, s in zip(r["skills"], r["soft_tifa"]):
                atoms.setdefault(skill, []).append(s)
        summary["skills"] = {k: sum(atoms[k]) / len(atoms[k]) for k in SKILLS if k in atoms}
        summary["atom_counts"] = {
            str(k): sum(r["soft_tifa_gm"] for r in v) / len(v) for k, v in sorted(by_count.items())
        }
    elif "tifa" in methods:
        atoms = {}
        for r in rows:
            for skill, t in zip(r["skills"], r["tifa_atoms"]):
                atoms.setdefault(skill, []).append(t)
        summary["skills_tifa"] = {k: sum(atoms[k]) / len(atoms[k]) for k in SKILLS if k in atoms}
    return summary


def _per_prompt(rows: Sequence[dict]) -> list[float]:
    """Each prompt's mean image score (the interval is over prompts: a prompt's images are
    not independent)."""
    by_prompt: dict[str, list[float]] = {}
    for r in rows:
        by_prompt.setdefault(r["key"].split("/")[0], []).append(r["score"])
    return [sum(v) / len(v) for v in by_prompt.values()]


def format_summary(summary: dict) -> str:
    """GenEval 2's tables, in percent as the paper prints them."""
    lines = [
        (
            f"GenEval 2 ({summary['prompts']} prompts, {summary['images']} images), scored by "
            f"{summary.get('scorer', '?')}"
        )
    ]
    for m, v in summary["methods"].items():
        lines.append(f"  {METHOD_LABELS[m]:<14}{100 * v:7.2f}")
    if "skills" in summary:
        lines.append(
            "per skill (Soft-TIFA AM): "
            + ", ".join(f"{k} {100 * v:.2f}" for k, v in summary["skills"].items())
        )
        lines.append(
            "per atom count (Soft-TIFA GM): "
            + ", ".join(f"{k} {100 * v:.2f}" for k, v in summary["atom_counts"].items())
        )
    elif "skills_tifa" in summary:
        lines.append(
            "per skill (TIFA): " + ", ".join(f"{k} {100 * v:.2f}" for k, v in summary["skills_tifa"].items())
        )
    lo, hi = summary["ci95"]
    interval = f" (95 % interval over prompts {100 * lo:.2f} – {100 * hi:.2f})" if lo == lo else ""
    lines.append(f"GenEval 2 score ({summary['label']}): {100 * summary['overall']:.2f}{interval}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- asking


def questions_for(
    entries: Sequence[tuple[int, dict, Sequence[Any]]],
    method: str,
    scorer_fp: str,
    digest: Callable[[Any], str],
) -> list:
    """Every question of every image: the atoms' (or, for VQAScore, the prompt's), each an `asking.Question`
    whose payload is (image, text, answers) and whose id is ``<prompt>/<sample>#<atom>`` (``#p`` for
    VQAScore). `digest(image)` names an image's content in the fingerprint; `scorer_fp` the scorer's."""
    from t2i_gcpo.eval.suites.asking import Question, fingerprint

    out = []
    for i, row, images in entries:
        asked = [vqascore_question(row)] if method == "vqascore" else atom_questions(row)
        for s, image in enumerate(images):
            key, seen = f"{i:05d}/{s:04d}", digest(image)
            for k, (text, answers) in enumerate(asked):
                qid = f"{key}#p" if method == "vqascore" else f"{key}#{k}"
                out.append(Question(qid, fingerprint(text, answers, seen, scorer_fp), (image, text, answers)))
    return out


def ask_function(scorer: Any, method: str) -> Callable[[list], list[dict]]:
    """What `asking.answer_all` calls: payloads (image or path, text, answers) → answer records
    ({"question", "probability", "prediction"})."""
    need = method != "tifa"

    def ask(payloads: list) -> list[dict]:
        images = [_image(p[0]) if scorer.kind == "vqa" else p[0] for p in payloads]
        if scorer.kind == "vqa":
            got = scorer.probabilities(images, [p[1] for p in payloads], [p[2] for p in payloads])
        else:
            got = scorer.probabilities(images, [p[1] for p in payloads], [p[2] for p in payloads], need)
        return [
            {"question": p[1], "probability": prob, "prediction": pred}
            for p, (prob, pred) in zip(payloads, got)
        ]

    return ask


def _image(image: Any) -> Any:
    if isinstance(image, (str, os.PathLike)):
        from PIL import Image

        with Image.open(image) as im:
            return im.convert("RGB")
    return image


def image_rows(
    entries: Sequence[tuple[int, dict, Sequence[Any]]], answers: dict[str, dict], method: str
) -> list[dict]:
    """One results row per image (key, category, score and GenEval 2's own fields) from the answers by id."""
    rows = []
    for i, row, images in entries:
        for s, image in enumerate(images):
            key = f"{i:05d}/{s:04d}"
            out: dict[str, Any] = {
                "key": key,
                "category": f"atoms_{row['atom_count']}",
                "score": None,
                "prompt": row["prompt"],
                "atom_count": row["atom_count"],
                "skills": row["skills"],
            }
            if isinstance(image, (str, os.PathLike)):
                out["image"] = str(image)
            if method == "vqascore":
                out["vqascore"] = answers[f"{key}#p"]["probability"]
            else:
                got = [answers[f"{key}#{k}"] for k in range(len(row["vqa_list"]))]
                lists = [a for _, a in atom_questions(row)]
                soft = [g["probability"] for g in got]
                hard = [tifa_hit(g["prediction"], a) for g, a in zip(got, lists)]
                out.update(
                    {"soft_tifa": soft, "tifa_atoms": hard, "predictions": [g["prediction"] for g in got]}
                )
                out.update(image_scores(soft, hard))
            out["score"], out["method"] = out[method], method
            rows.append(out)
    return rows


def score_entries(
    entries: Sequence[tuple[int, dict, Sequence[Any]]],
    scorer: Any,
    method: str,
    *,
    log: str | os.PathLike | None = None,
    within: str | os.PathLike | None = None,
    concurrency: int = 1,
    retries: int = 0,
    backoff: float = 1.0,
    progress: bool = True,
    digest: Callable[[Any], str] | None = None,
) -> list[dict]:
    """Ask every question of `entries` ((prompt index, data row, images or image paths)) through `scorer`
    (a `LocalVLM` in batches of its batch_size, or a `JudgeClient` on `concurrency` threads), resumably
    into `log`, and return the results rows (`image_rows`)."""
    from t2i_gcpo.eval.suites.asking import answer_all, fingerprint, image_digest

    if method not in METHODS:
        raise UserError(f"GenEval 2 method must be one of {', '.join(METHODS)}, got {method!r}")
    if digest is None:
        digest = image_digest
    questions = questions_for(entries, method, fingerprint(scorer.record()), digest)
    local = scorer.kind == "vqa"
    answers = answer_all(
        questions,
        ask_function(scorer, method),
        log,
        scorer=f"VQA {scorer.name}" if local else f"judge {scorer.name}",
        batch_size=scorer.batch_size if local else 1,
        concurrency=1 if local else concurrency,
        retries=0 if local else retries,
        backoff=backoff,
        within=within,
        desc="GenEval 2 ask",
        progress=progress,
    )
    for a in answers.values():
        if method != "tifa" and a["probability"] is None:
            raise UserError(
                f"{a['id']}: no probability was recorded for this answer (asked with --method tifa?); "
                "use --overwrite, or another --out"
            )
    return image_rows(entries, answers, method)


def read_items(path: Path) -> list:
    """The data file as the suite registry reads a suite's prompts (eval.suites.SuiteItem,
    the row as data)."""
    from t2i_gcpo.eval.suites import SuiteItem

    return [
        SuiteItem(str(i), row["prompt"], f"atoms_{row['atom_count']}", row)
        for i, row in enumerate(read_geneval2_data(path))
    ]


def _register() -> None:
    from t2i_gcpo.eval.suites import Suite, register_suite

    register_suite(
        Suite(
            "geneval2",
            "GenEval 2: compositional prompts, every atom asked of a VQA model (Soft-TIFA)",
            SOURCE,
            "your copy of GenEval 2's geneval2_data.jsonl (github.com/facebookresearch/GenEval2)",
            read_items,
            summarize,
            kind="vqa",
        )
    )


_register()
