"""WISE_Verified (Niu et al. 2025, "WISE: A World Knowledge-Informed Semantic Evaluation for Text-to-Image
Generation", arXiv 2503.07265): 1,000 prompts whose answer must be inferred from world knowledge, each image
judged 0/1 by an open VLM (Qwen3.5-35B-A3B behind vLLM) against the prompt's explanation. From
PKU-YuanGroup/WISE vllm_eval.py and calculate_verified.py (commit eb51174483a5de2e34e8614cf9dfb3319ee7fcd0).

Data: a JSON list of {"Prompt", "Explanation", "Category", "Subcategory", "prompt_id"} — the repository's
data_verified/merge.json (all 1,000) or one of its category files. Question: the reference's system message
and its user message (the protocol, the PROMPT and the EXPLANATION) then the image, temperature 0, at most
500 tokens, ``chat_template_kwargs: {"enable_thinking": false}``. Score rule: ``<think>…</think>`` removed,
then the first ``Score: 0|1`` (case and ``**`` ignored), else a lone line ``0`` or ``1``; anything else is
asked again (the reference retries 3 times, then leaves the prompt out; here the evaluation stops after the
retries). Categories by prompt_id, as the reference assigns them: CULTURE 1–400, TIME 401–520, SPACE 521–640,
BIOLOGY 641–760, PHYSICS 761–880, CHEMISTRY 881–1000; a category's score is the mean of its images' scores and

    Overall = 0.40·CULTURE + 0.12·(TIME + SPACE + BIOLOGY + PHYSICS + CHEMISTRY)

(on a subset missing some categories the present weights are renormalised and the summary says so; the
reference then reports no overall). Reference layout for ``--score-only``: ``DIR/<prompt_id>.png``.
"""

from __future__ import annotations

import re
from pathlib import Path

from t2i_gcpo.errors import UserError, shorten
from t2i_gcpo.eval.suites import Suite, SuiteItem, register_suite
from t2i_gcpo.eval.suites.asking import BadAnswer

SOURCE = "PKU-YuanGroup/WISE vllm_eval.py, calculate_verified.py (eb51174)"
CATEGORIES = (
    ("CULTURE", 1, 400),
    ("TIME", 401, 520),
    ("SPACE", 521, 640),
    ("BIOLOGY", 641, 760),
    ("PHYSICS", 761, 880),
    ("CHEMISTRY", 881, 1000),
)
WEIGHTS = {"CULTURE": 0.40, "TIME": 0.12, "SPACE": 0.12, "BIOLOGY": 0.12, "PHYSICS": 0.12, "CHEMISTRY": 0.12}
FIELDS = ("Prompt", "Explanation", "Subcategory", "prompt_id")
SYSTEM = (
    "You are a professional text-to-image quality auditor. Evaluate the image strictly according "
    "to the protocol."
)
# the reference's user message, {prompt} and {explanation} filled in (vllm_eval.py build_evaluation_messages)
TEMPLATE = """Please evaluate this generated image for the WISE benchmark and return ONLY one binary score.

# WISE Text-to-Image Evaluation Protocol

## What WISE Is Evaluating
WISE is a knowledge-intensive text-to-image benchmark. Many prompts do not directly state the final visual answer. Instead, the model must use commonsense, cultural, scientific, spatial, or temporal knowledge to infer what should appear in the image.

Your job is not to judge whether the image is beautiful. Your job is to judge whether the generated image correctly realizes the knowledge-based meaning of the prompt and is visually usable.

## Input Fields

**PROMPT**
The original text-to-image prompt given to the image generation model. It may contain an implicit clue rather than the explicit final answer.

**EXPLANATION**
The reference interpretation used for judging. It explains the intended answer, the required knowledge reasoning chain, and the visual evidence that should appear in a correct image. Treat EXPLANATION as the ground-truth judging guide.

For example:
- If PROMPT says "the round pastry commonly shared during Mid-Autumn Festival family gatherings", EXPLANATION may specify mooncakes. A correct image should show mooncakes, not just any festival food.
- If PROMPT says "a plant kept for many days beside a bright one-sided window", EXPLANATION may specify phototropism. A correct image should show the plant bending toward the light source.
- If PROMPT says "a street in New York when it is midnight in Beijing", EXPLANATION may specify the corresponding local time and expected lighting/activity. A correct image should reflect that inferred local time, not simply show Beijing or generic night.

## How To Judge

Evaluate the image using these checks:
1. Does the image contain the main objects or scene required by the PROMPT?
2. Does it satisfy the intended knowledge-based answer described in the EXPLANATION?
3. Are important relations correct, such as spatial layout, temporal state, physical effect, biological behavior, cultural object, or scientific phenomenon?
4. Is the image visually usable for judging, without obvious collapse, severe deformation, unreadable main objects, or major artifacts?

## Binary Score

**Score: 1**
Give 1 only when both conditions are met:
- The image is semantically correct according to both PROMPT and EXPLANATION.
- The image has no obvious generation failure that prevents reliable judging.

Minor aesthetic weakness, ordinary composition, non-photorealistic style, or lack of artistic beauty should not by itself cause rejection if the semantic target is correct and the image is clear.

**Score: 0**
Give 0 if any of the following applies:
- The image misses the intended answer in EXPLANATION.
- The image only follows surface words in PROMPT but fails the required knowledge inference.
- Key objects, attributes, states, behaviors, or relations are missing or wrong.
- The image contradicts the prompt or explanation.
- The main visual evidence is ambiguous enough that a human judge could not confidently verify correctness.
- The image has obvious visual collapse, severe deformation, garbled main objects, impossible structure, or artifacts that interfere with evaluation.

If there is serious doubt, return 0.

## Output Format

Return exactly one line and nothing else:

Score: 0

or

Score: 1

---

PROMPT: "{prompt}"
EXPLANATION: "{explanation}"

Return only `Score: 0` or `Score: 1`."""
_SCORE = re.compile(r"\*{0,2}Score\*{0,2}\s*:?\s*([01])\b", re.IGNORECASE)  # the reference's
_LONE = re.compile(r"(?m)^\s*([01])\s*$")


def category(prompt_id: int) -> str | None:
    return next((name for name, lo, hi in CATEGORIES if lo <= prompt_id <= hi), None)


def read(path: Path) -> list[SuiteItem]:
    """The prompts of a WISE_Verified JSON file (module docstring)."""
    from t2i_gcpo.outdir import read_json

    data = read_json(path, follow=True)
    if not isinstance(data, list) or not data:
        raise UserError(
            f"{path}: expected a JSON list of WISE prompts ({', '.join(FIELDS)}), e.g. "
            f"data_verified/merge.json"
        )
    items, seen = [], set()
    for i, row in enumerate(data):
        where = f"{path}: entry {i}"
        if not isinstance(row, dict):
            raise UserError(f"{where}: expected an object with {', '.join(FIELDS)}")
        for key in FIELDS:
            if key not in row:
                raise UserError(f"{where}: field '{key}' is missing (not WISE_Verified's format)")
        pid = row["prompt_id"]
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise UserError(f"{where}: field 'prompt_id' must be an integer, got {shorten(repr(pid), 40)}")
        if category(pid) is None:
            raise UserError(f"{where}: field 'prompt_id' {pid} is outside WISE's 1–1000 (no category)")
        if pid in seen:
            raise UserError(f"{where}: field 'prompt_id' {pid} appears twice")
        seen.add(pid)
        for key in ("Prompt", "Explanation", "Subcategory"):
            if not isinstance(row[key], str) or not row[key].strip():
                raise UserError(f"{where}: field '{key}' must be a non-empty string")
        items.append(
            SuiteItem(
                str(pid),
                row["Prompt"],
                category(pid),
                {"explanation": row["Explanation"], "subcategory": row["Subcategory"]},
            )
        )
    return items


def messages(item: SuiteItem, image_url: str) -> list[dict]:
    text = TEMPLATE.replace("{prompt}", item.prompt).replace("{explanation}", item.data["explanation"])
    return [
        {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": image_url}},
            ],
        },
    ]


def parse(answer: str, item: SuiteItem) -> dict:
    text = re.sub(r"<think>.*?</think>\s*", "", answer, flags=re.DOTALL)
    text = re.sub(r"</think>\s*", "", text).strip()
    m = _SCORE.search(text)
    if m is None:
        lone = _LONE.findall(text)
        if len(lone) != 1:
            raise BadAnswer(f"no 'Score: 0' or 'Score: 1' in the answer {shorten(text, 60)!r}")
        return {"score": float(lone[0])}
    return {"score": float(m.group(1))}


def summarize(rows: list[dict]) -> dict:
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(r["category"], []).append(r["score"])
    categories = {name: sum(by[name]) / len(by[name]) for name, _, _ in CATEGORIES if name in by}
    weight = sum(WEIGHTS[c] for c in categories)
    out = {
        "overall": sum(WEIGHTS[c] * v for c, v in categories.items()) / weight,
        "categories": categories,
        "weights": {c: WEIGHTS[c] / weight for c in categories},
    }
    if len(categories) < len(CATEGORIES):
        out["note"] = (
            f"{len(categories)} of {len(CATEGORIES)} categories: their weights renormalised (the reference "
            f"reports no overall)"
        )
    return out


def reference_image(root: Path, item: SuiteItem, sample: int) -> Path:
    if sample:
        raise UserError("WISE's own layout holds one image per prompt (<prompt_id>.png): use --n 1")
    return Path(root) / f"{item.id}.png"


register_suite(
    Suite(
        "wise",
        "world-knowledge prompts judged 0/1 against their explanation (WISE_Verified)",
        SOURCE,
        "WISE's data_verified/merge.json (github.com/PKU-YuanGroup/WISE)",
        read,
        summarize,
        messages=messages,
        parse=parse,
        reference_image=reference_image,
        images_per_prompt=1,
        temperature=0.0,
        max_tokens=500,
        extra={"chat_template_kwargs": {"enable_thinking": False}},
    )
)
