"""TIIF-Bench (Wei et al. 2025, "TIIF-Bench: How Does Your T2I Model Follow Your Instructions?", arXiv
2506.02161): instruction-following prompts in 36 dimensions, each drawn from a short and a long description,
each image asked the prompt's yes/no questions by a VLM judge. From A113N-W3I/TIIF-Bench
eval/eval_with_vlm.py, eval/summary_results.py and eval/summary_dimension_results.py (commit
3aae7504d2546516eaec2fea82fde9ae445dfea3).

Data: the repository's evaluation-prompt folder (``data/testmini_eval_prompts`` or ``data/test_eval_prompts``:
``<dimension>_eval_prompts.jsonl``, lines {"type", "yn_question_list", "yn_answer_list"}) or one of its files;
the prompts drawn are the same lines of the sibling folder without "_eval" (``data/testmini_prompts``:
``<dimension>_prompts.jsonl``, lines {"type", "short_description", "long_description"}). A line gives two
images to judge, its short and its long description, scored apart as the reference does.

Question: the reference's system message ("You are a professional image critic.") and one user message, its
template with the questions one a line, then the image. The reference draws one of three equivalent
templates at random for each request, at temperature 1 (GPT-4o); here the first template always, at
temperature 0 (``--temperature`` sets another), so that a protocol is one request. Score rule: every
non-empty line of the answer that starts with "yes" or "no" is an answer, in order; their number must equal
the questions' (else asked again, as the reference retries); an image scores correct/questions, a correct
answer one equal to the expected yes/no (case ignored). Aggregation, per description length (short, long):
a dimension's accuracy = its correct answers / its questions; nine groups' scores the mean of their
dimensions' accuracies — Basic: Attribute, Relation, Reasoning; Advanced: Attribute+Relation,
Attribute+Reasoning, Relation+Reasoning, Text Generation, Style Control; Real World: Complex —; the
overall of a length the mean of the nine groups (groups absent from the data left out, as the reference's
skipna). ``overall`` here is the mean of the short and long overalls (the reference prints both).
Reference layout for ``--score-only``: ``DIR/<dimension>/[<model>/]<short|long>_description/<line>.png``.
"""

from __future__ import annotations

import re
from pathlib import Path

from t2i_gcpo.errors import UserError, shorten
from t2i_gcpo.eval.suites import Suite, SuiteItem, register_suite
from t2i_gcpo.eval.suites.asking import BadAnswer

SOURCE = (
    "A113N-W3I/TIIF-Bench eval/eval_with_vlm.py, summary_results.py, summary_dimension_results.py (3aae750)"
)
SYSTEM = "You are a professional image critic."
DESCRIPTIONS = ("short", "long")
GROUPS = {  # summary_dimension_results.py: the nine groups and their dimensions
    "Basic Attribute": ("shape+color", "color+texture", "texture+color", "shape+texture"),
    "Basic Relation": ("2d_spatial_relation", "3d_spatial_relation", "action+2d", "action+3d"),
    "Basic Reasoning": ("numeracy", "negation", "differentiation", "comparison"),
    "Advanced Attribute+Relation": (
        "action+color",
        "action+texture",
        "color+2d",
        "color+3d",
        "shape+2d",
        "shape+3d",
        "texture+2d",
        "texture+3d",
    ),
    "Advanced Attribute+Reasoning": (
        "numeracy+color",
        "numeracy+texture",
        "comparison+color",
        "comparison+texture",
        "differentiation+color",
        "differentiation+texture",
        "negation+color",
        "negation+texture",
    ),
    "Advanced Relation+Reasoning": (
        "numeracy+2d",
        "numeracy+3d",
        "comparison+2d",
        "comparison+3d",
        "differentiation+2d",
        "differentiation+3d",
        "negation+2d",
        "negation+3d",
    ),
    "Advanced Text Generation": ("text",),
    "Advanced Style Control": ("style",),
    "Real World Complex": ("real_world",),
}
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
# the reference's first template (eval_with_vlm.py raw_prompt); ##YNQuestions##: the questions, one a line
TEMPLATE = (
    "\n"
    "You are tasked with conducting a careful examination of the provided image. Based on the content of the "
    "image, please answer the following yes or no questions:\n"
    "\n"
    "Questions:\n"
    "##YNQuestions##\n"
    "\n"
    "Note that:\n"
    '1. Each answer should be on a separate line, starting with "yes" or "no", followed by the reason.\n'
    "2. The order of answers must correspond exactly to the order of the questions.\n"
    "3. Each question must have only one answer.\n"
    "4. Directly return the answers to each question, without any additional content.\n"
    "5. Each answer must be on its own line!\n"
    "6. Make sure the number of output answers equal to the number of questions!\n"
)
_ANSWER = re.compile(r"^(yes|no)\b", re.IGNORECASE)


def _jsonl(path: Path, what: str) -> list[dict]:
    from t2i_gcpo.outdir import parse_json, read_side_text

    rows = []
    for lineno, line in enumerate(read_side_text(path, follow=True).splitlines(), start=1):
        if line.strip():
            row = parse_json(line, f"{path}:{lineno}")
            if not isinstance(row, dict):
                raise UserError(f"{path}:{lineno}: expected a JSON object ({what})")
            rows.append(row)
    return rows


def _eval_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(path.glob("*_eval_prompts.jsonl"))
        if not files:
            raise UserError(
                f"{path} holds no <dimension>_eval_prompts.jsonl (TIIF-Bench's data/testmini_eval_prompts)"
            )
        return files
    if not path.name.endswith("_eval_prompts.jsonl"):
        raise UserError(
            f"{path}: expected TIIF-Bench's evaluation prompts, <dimension>_eval_prompts.jsonl "
            f"(or their folder)"
        )
    return [path]


def read(path: Path) -> list[SuiteItem]:
    """Every (line, description) of the evaluation prompts at `path` with its drawn prompt
    (module docstring)."""
    path = Path(path)
    items = []
    for eval_file in _eval_files(path):
        prompts_dir = eval_file.parent.with_name(eval_file.parent.name.replace("_eval", "", 1))
        prompt_file = prompts_dir / eval_file.name.replace("_eval_prompts", "_prompts")
        if not prompt_file.is_file():
            raise UserError(
                f"{eval_file}: its prompts {prompt_file} are missing (TIIF-Bench's data/ holds both folders)"
            )
        questions, prompts = (
            _jsonl(eval_file, "type, yn_question_list, yn_answer_list"),
            _jsonl(prompt_file, "type, short_description, long_description"),
        )
        if len(questions) != len(prompts):
            raise UserError(
                f"{eval_file} holds {len(questions)} lines, {prompt_file} {len(prompts)}: they must "
                f"pair line by line"
            )
        for idx, (q, p) in enumerate(zip(questions, prompts)):
            where = f"{eval_file}:{idx + 1}"
            for key in ("type", "yn_question_list", "yn_answer_list"):
                if key not in q:
                    raise UserError(f"{where}: field '{key}' is missing (not TIIF-Bench's evaluation format)")
            qs, gts = q["yn_question_list"], q["yn_answer_list"]
            if not isinstance(qs, list) or not qs or not all(isinstance(x, str) and x.strip() for x in qs):
                raise UserError(f"{where}: field 'yn_question_list' must be a non-empty list of questions")
            if (
                not isinstance(gts, list)
                or len(gts) != len(qs)
                or not all(isinstance(a, str) and a.strip().lower() in ("yes", "no") for a in gts)
            ):
                raise UserError(
                    f"{where}: field 'yn_answer_list' must hold one 'yes' or 'no' per question ({len(qs)})"
                )
            if p.get("type") != q["type"]:
                raise UserError(
                    f"{prompt_file}:{idx + 1}: field 'type' is {shorten(repr(p.get('type')), 40)}, its "
                    f"evaluation line's {q['type']!r}"
                )
            for desc in DESCRIPTIONS:
                text = p.get(f"{desc}_description")
                if not isinstance(text, str) or not text.strip():
                    raise UserError(
                        f"{prompt_file}:{idx + 1}: field '{desc}_description' must be a non-empty string"
                    )
                items.append(
                    SuiteItem(
                        f"{q['type']}/{desc}/{idx}",
                        text,
                        str(q["type"]),
                        {"questions": qs, "answers": gts, "description": desc, "line": idx},
                    )
                )
    return items


def messages(item: SuiteItem, image_url: str) -> list[dict]:
    text = TEMPLATE.replace("##YNQuestions##", "\n".join(q.strip() for q in item.data["questions"]))
    return [
        {"role": "system", "content": SYSTEM},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": image_url}},
            ],
        },
    ]


def parse(answer: str, item: SuiteItem) -> dict:
    preds = [m.group(1).lower() for line in answer.strip().split("\n") if (m := _ANSWER.match(line.strip()))]
    wanted = item.data["answers"]
    if len(preds) != len(wanted):
        raise BadAnswer(f"{len(preds)} yes/no answers to {len(wanted)} questions in {shorten(answer, 60)!r}")
    correct = sum(gt.strip().lower() == pred for gt, pred in zip(wanted, preds))
    return {
        "score": correct / len(wanted),
        "correct": correct,
        "questions": len(wanted),
        "predictions": preds,
        "description": item.data["description"],
    }


def summarize(rows: list[dict]) -> dict:
    cells: dict[tuple[str, str], list[int]] = {}  # (dimension, description) → [correct, questions]
    for r in rows:
        cell = cells.setdefault((r["category"], r["description"]), [0, 0])
        cell[0] += r["correct"]
        cell[1] += r["questions"]
    out: dict = {"dimensions": {}, "groups": {}, "overall_by_description": {}}
    for desc in DESCRIPTIONS:
        acc = {dim: c / q for (dim, d), (c, q) in sorted(cells.items()) if d == desc and q}
        out["dimensions"][desc] = acc
        groups = {}
        for name, dims in GROUPS.items():
            present = [acc[d] for d in dims if d in acc]
            if present:
                groups[name] = sum(present) / len(present)
        out["groups"][desc] = groups
        if groups:
            out["overall_by_description"][desc] = sum(groups.values()) / len(groups)
    pooled: dict[str, list[int]] = {}
    for (dim, _), (c, q) in cells.items():
        p = pooled.setdefault(dim, [0, 0])
        p[0], p[1] = p[0] + c, p[1] + q
    out["categories"] = {dim: c / q for dim, (c, q) in sorted(pooled.items())}
    by_desc = out["overall_by_description"]
    out["overall"] = sum(by_desc.values()) / len(by_desc)
    unknown = sorted(set(pooled) - {d for dims in GROUPS.values() for d in dims})
    if unknown:
        out["note"] = (
            f"dimensions in no group of the reference's (left out of the overall): {', '.join(unknown)}"
        )
    return out


def reference_image(root: Path, item: SuiteItem, sample: int) -> Path:
    if sample:
        raise UserError("TIIF-Bench's own layout holds one image per prompt and description: use --n 1")
    dim, desc, line = item.category, f"{item.data['description']}_description", item.data["line"]
    folder = Path(root) / dim / desc
    if not folder.is_dir() and (Path(root) / dim).is_dir():  # the reference's <dimension>/<model>/<desc>/
        inner = [p for p in (Path(root) / dim).iterdir() if (p / desc).is_dir()]
        if len(inner) == 1:
            folder = inner[0] / desc
    for suffix in IMAGE_SUFFIXES:
        if (folder / f"{line}{suffix}").is_file():
            return folder / f"{line}{suffix}"
    return folder / f"{line}.png"


register_suite(
    Suite(
        "tiif",
        "instruction following: yes/no questions per image, short and long prompts (TIIF-Bench)",
        SOURCE,
        "TIIF-Bench's data/testmini_eval_prompts or data/test_eval_prompts folder "
        "(github.com/A113N-W3I/TIIF-Bench)",
        read,
        summarize,
        messages=messages,
        parse=parse,
        reference_image=reference_image,
        images_per_prompt=1,
        temperature=0.0,
    )
)
