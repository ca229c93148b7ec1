"""The GenEval rules engine (docs/evaluation/geneval.md), shared by ShapeWorld and the real-image GenEval.

GenEval (Ghosh et al., 2023, "GenEval: An Object-Focused Framework for Evaluating Text-to-Image
Alignment") scores an image by running an instance detector and checking the prompt's metadata
against the detections: counts, excludes, colours and relative positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from t2i_gcpo.errors import UserError
from t2i_gcpo.scoring.detections import Detection

COLORS = ["red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white"]
DETECTION_THRESHOLD = 0.3  # keep detections with score > this
COUNTING_THRESHOLD = 0.9  # ... > this for counting prompts
MAX_OBJECTS = 16  # at most this many detections per class
POSITION_MARGIN = 0.1  # GenEval's position threshold: share of the box sizes ignored in the offset


def relative_position(box_a: tuple, box_b: tuple) -> set[str]:
    """Relations of box A relative to box B (docs/evaluation/geneval.md), boxes (x0, y0, x1, y1), y downward.

    offset = c_A − c_B; revised = max(|offset| − 0.1·(d_A + d_B), 0)·sign(offset); no relation if
    all |revised| < 1e-3; else (dx, dy) = revised / ‖offset‖ and dx < −0.5 → "left of",
    dx > 0.5 → "right of", dy < −0.5 → "above", dy > 0.5 → "below".
    """
    a = np.asarray(box_a, dtype=np.float64).reshape(2, 2)  # [[x0, y0], [x1, y1]]
    b = np.asarray(box_b, dtype=np.float64).reshape(2, 2)
    offset = a.mean(axis=0) - b.mean(axis=0)  # [2] centre difference
    dims = (a[1] - a[0]) + (b[1] - b[0])  # [2] summed widths and heights
    revised = np.maximum(np.abs(offset) - POSITION_MARGIN * dims, 0.0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    relations = set()
    if dx < -0.5:
        relations.add("left of")
    if dx > 0.5:
        relations.add("right of")
    if dy < -0.5:
        relations.add("above")
    if dy > 0.5:
        relations.add("below")
    return relations


@dataclass
class ImageResult:
    correct: bool  # the strict GenEval verdict for the image
    partial: float  # partial credit in [0, 1] (see each function for its definition)
    reason: str  # why it failed, GenEval-style lines joined by "\n" ("" when correct)


def default_threshold(metadata: dict) -> float:
    """GenEval's detection score threshold: 0.9 for counting prompts, 0.3 otherwise
    (docs/evaluation/geneval.md)."""
    return COUNTING_THRESHOLD if metadata.get("tag") == "counting" else DETECTION_THRESHOLD


def _detections_by_class(
    detections: list[Detection], threshold: float, max_per_class: int | None
) -> dict[str, list[Detection]]:
    """Detections with score > threshold, grouped by class, best score first, at most max_per_class."""
    by_class: dict[str, list[Detection]] = {}
    for det in sorted(detections, key=lambda d: -d.score):
        if det.score > threshold:
            group = by_class.setdefault(det.cls, [])
            if max_per_class is None or len(group) < max_per_class:
                group.append(det)
    return by_class


def _colour_reason(cls: str, want: str, count: int, colours: list[str]) -> str:
    found = ", ".join(f"{colours.count(c)} {c}" for c in [*COLORS, "unknown"] if c in colours)
    return f"expected {want} {cls}>={count}, found {colours.count(want)} {want}; and {found}"


def _position_ok(found: list[Detection], targets: list[Detection], relation: str) -> tuple[bool, str]:
    """Every found object must stand in `relation` to every target object (GenEval)."""
    for det in found:
        for target in targets:
            rels = relative_position(det.box, target.box)
            if relation not in rels:
                return (
                    False,
                    (
                        f"expected {det.cls} {relation} target, found "
                        f"{' and '.join(sorted(rels)) or 'no relation'} target"
                    ),
                )
    return True, ""


def evaluate_detections(
    metadata: dict,
    detections: list[Detection],
    color_of: Callable[[Detection], str] | None = None,
    *,
    threshold: float | None = None,
    max_per_class: int = MAX_OBJECTS,
) -> ImageResult:
    """GenEval's per-image verdict (docs/evaluation/geneval.md): includes ANDed, excludes ORed.

    Detections with score > threshold (default 0.3; 0.9 for counting), at most `max_per_class` per
    class, best first. Include: the top-`count` detections of the class, fail if fewer; colour: each
    of them classified by `color_of` (default `det.color`) must be the requested colour; position:
    every found object vs every object of the target clause (unmatched target fails). Exclude: fail
    if the class has ≥ `count` detections.

    `partial` is the share of passed checks (one per include count, colour, position and exclude;
    colour and position checks of a failed count fail).
    """
    color_of = color_of or (lambda d: d.color or "unknown")
    thr = default_threshold(metadata) if threshold is None else threshold
    detected = _detections_by_class(detections, thr, max_per_class)
    includes = metadata.get("include", [])
    reasons: list[str] = []
    checks: list[bool] = []

    # count and colour: a clause is matched when both pass; its objects are position targets
    groups: list[list[Detection] | None] = []
    for req in includes:
        cls, count = req["class"], int(req.get("count", 1))
        found = detected.get(cls, [])[:count]
        matched = len(found) >= count
        checks.append(matched)
        if not matched:
            reasons.append(f"expected {cls}>={count}, found {len(found)}")
        if "color" in req:
            colours = [color_of(d) for d in found] if matched else []
            colour_ok = matched and colours.count(req["color"]) >= count
            checks.append(colour_ok)
            if matched and not colour_ok:
                reasons.append(_colour_reason(cls, req["color"], count, colours))
            matched = colour_ok
        groups.append(found if matched else None)

    for req, group in zip(includes, groups):
        if "position" not in req:
            continue
        relation, target = req["position"][0], int(req["position"][1])
        if group is None:  # the clause itself failed: GenEval skips its position check
            checks.append(False)
            continue
        if not 0 <= target < len(groups) or groups[target] is None:
            checks.append(False)
            reasons.append(f"no target for {req['class']} to be {relation}")
            continue
        ok, why = _position_ok(group, groups[target], relation)
        checks.append(ok)
        if not ok:
            reasons.append(why)

    for req in metadata.get("exclude", []):
        cls, count = req["class"], int(req["count"])
        n = len(detected.get(cls, []))
        checks.append(n < count)
        if n >= count:
            reasons.append(f"expected {cls}<{count}, found {n}")

    correct = all(checks)
    return ImageResult(correct, float(np.mean(checks)) if checks else 1.0, "\n".join(reasons))


PARTIAL_VARIANTS = ("spec", "flow_grpo")  # the two partial-credit formulas of `reward_detections`


def check_score_and_variant(reward: str, field: str, score: str, variant: str) -> None:
    """A GenEval-rules reward's `field` (its score: the 'partial' credit or the 'strict' verdict) and its
    partial-credit `variant`, refused in one line naming `reward` (the GenEval and ShapeWorld rewards)."""
    if score not in ("partial", "strict"):
        raise UserError(f"{reward} reward {field} must be 'partial' or 'strict', got {score!r}")
    if variant not in PARTIAL_VARIANTS:
        raise UserError(
            f"{reward} partial-credit variant must be one of {', '.join(PARTIAL_VARIANTS)}, got {variant!r}"
        )


def partial_credit_bounds(score: str, variant: str) -> tuple[float, float] | None:
    """The range every score of a GenEval-rules reward lies in (rewards.combine.reward_bounds): [0, 1] for the
    strict verdict and the spec partial credit; none for flow_grpo's (an over-count goes negative)."""
    return (0.0, 1.0) if score == "strict" or variant == "spec" else None


def reward_detections(
    metadata: dict,
    detections: list[Detection],
    color_of: Callable[[Detection], str] | None = None,
    threshold: float | None = None,
    variant: str = "spec",
) -> ImageResult:
    """GenEval as an RL reward, the flow_grpo variant (docs/evaluation/geneval.md#geneval-as-a-reward).

    All detections of the class above the threshold are used (no top-count cut) and strict
    correctness needs the exact count; excludes only enter the strict verdict. Partial credit is the
    mean of per-clause terms, in one of two variants (the strict verdict is the same in both, but
    for flow_grpo's cap of 16 detections per class):

    ``variant="spec"`` (default) — the terms of docs/evaluation/geneval.md#geneval-as-a-reward, kept in [0,
    1]; no per-class cap:
    - per include: count term 1 − |count − found| / count, clipped at 0 (one dog asked, two or three
      seen: 0 either way);
    - per colour clause: 1 − |count − n_colour| / count with a right count, else 0;
    - per position clause: 1 if every object is in the relation to every target object (with a right
      count and colour and a matched target), else 0.

    ``variant="flow_grpo"`` — flow_grpo's reward code term for term (its GenEval reward server,
    yifan123/reward-server, reward_server/gen_eval.py, ``evaluate_reward``):
    - at most 16 detections per class (GenEval's cap);
    - per include: count term 1 − |count − found| / count, not clipped, so an over-count goes
      negative (one dog asked, three seen: −1);
    - a wrong count adds one 0 term, whether the clause has a colour, a position or both;
    - with a right count: the colour term as above; then, only if the colour passed, the position:
      a missing target adds 0, a failed relation adds 0 and then 1, a held relation adds 1 (so a
      failed position of a two-object prompt scores (1 + 1 + 0 + 1) / 4 = 0.75, not 2/3);
    - the target must be an earlier clause (GenEval's prompts put it first); a later one counts as
      missing (flow_grpo's code would fail on it).
    """
    if variant not in PARTIAL_VARIANTS:
        raise ValueError(f"partial-credit variant must be one of {PARTIAL_VARIANTS}, got {variant!r}")
    color_of = color_of or (lambda d: d.color or "unknown")
    thr = default_threshold(metadata) if threshold is None else threshold
    if variant == "flow_grpo":
        return _reward_flow_grpo(metadata, _detections_by_class(detections, thr, MAX_OBJECTS), color_of)
    detected = _detections_by_class(detections, thr, None)
    includes = metadata.get("include", [])
    terms: list[float] = []
    reasons: list[str] = []
    correct = True

    groups: list[list[Detection] | None] = []
    for req in includes:
        cls, count = req["class"], int(req.get("count", 1))
        found = detected.get(cls, [])
        exact = len(found) == count
        terms.append(max(0.0, 1.0 - abs(count - len(found)) / count))
        matched = exact
        if not exact:
            reasons.append(f"expected {cls}=={count}, found {len(found)}")
        if "color" in req:
            colours = [color_of(d) for d in found]
            n_colour = colours.count(req["color"])
            terms.append(1.0 - abs(count - n_colour) / count if exact else 0.0)
            if exact and n_colour < count:
                reasons.append(_colour_reason(cls, req["color"], count, colours))
                matched = False
        correct &= matched
        groups.append(found if matched else None)

    for req, group in zip(includes, groups):
        if "position" not in req:
            continue
        relation, target = req["position"][0], int(req["position"][1])
        ok = False
        if group is not None:
            if not 0 <= target < len(groups) or groups[target] is None:
                reasons.append(f"no target for {req['class']} to be {relation}")
            else:
                ok, why = _position_ok(group, groups[target], relation)
                if not ok:
                    reasons.append(why)
        terms.append(1.0 if ok else 0.0)
        correct &= ok

    correct &= _excludes_hold(metadata, detected, reasons)
    partial = float(np.mean(terms)) if terms else float(correct)
    return ImageResult(bool(correct), partial, "\n".join(reasons))


def _excludes_hold(metadata: dict, detected: dict[str, list[Detection]], reasons: list[str]) -> bool:
    ok = True
    for req in metadata.get("exclude", []):
        n = len(detected.get(req["class"], []))
        if n >= int(req["count"]):
            ok = False
            reasons.append(f"expected {req['class']}<{req['count']}, found {n}")
    return ok


def _reward_flow_grpo(
    metadata: dict, detected: dict[str, list[Detection]], color_of: Callable[[Detection], str]
) -> ImageResult:
    """`reward_detections(variant="flow_grpo")`: one pass over the includes, in order."""
    terms: list[float] = []
    reasons: list[str] = []
    correct = True
    groups: list[list[Detection] | None] = []  # matched clauses so far (position targets)
    for req in metadata.get("include", []):
        cls, count = req["class"], int(req.get("count", 1))
        found = detected.get(cls, [])
        terms.append(1.0 - abs(count - len(found)) / count)  # not clipped: may go below 0
        matched = len(found) == count
        if not matched:
            reasons.append(f"expected {cls}=={count}, found {len(found)}")
            if "color" in req or "position" in req:
                terms.append(0.0)  # one 0 for the clause's colour and position together
        else:
            if "color" in req:
                colours = [color_of(d) for d in found]
                n_colour = colours.count(req["color"])
                terms.append(1.0 - abs(count - n_colour) / count)
                if n_colour != count:
                    reasons.append(_colour_reason(cls, req["color"], count, colours))
                    matched = False
            if "position" in req and matched:
                relation, target = req["position"][0], int(req["position"][1])
                targets = groups[target] if 0 <= target < len(groups) else None
                if targets is None:
                    reasons.append(f"no target for {cls} to be {relation}")
                    terms.append(0.0)
                    matched = False
                else:
                    ok, why = _position_ok(found, targets, relation)
                    if not ok:
                        reasons.append(why)
                        terms.append(0.0)
                        matched = False
                    terms.append(1.0)  # flow_grpo appends 1 after the check, passed or failed
        correct &= matched
        groups.append(found if matched else None)
    correct &= _excludes_hold(metadata, detected, reasons)
    partial = float(np.mean(terms)) if terms else 0.0
    return ImageResult(bool(correct), partial, "\n".join(reasons))


def summarize(results_by_tag: dict[str, list[bool]]) -> dict:
    """GenEval's score table: per tag the mean image correctness; overall = unweighted mean of tags.

    Returns {"tags": {tag: {"score", "correct", "total"}}, "overall": float}. Tags with no images
    are left out of the overall mean.
    """
    tags = {}
    for tag, results in results_by_tag.items():
        if len(results) == 0:
            continue
        n_ok = int(sum(bool(r) for r in results))
        tags[tag] = {"score": n_ok / len(results), "correct": n_ok, "total": len(results)}
    overall = float(np.mean([t["score"] for t in tags.values()])) if tags else 0.0
    return {"tags": tags, "overall": overall}


def format_summary(summary: dict) -> str:
    """The summary in the style of GenEval's summary_scores.py output."""
    width = max((len(tag) for tag in summary["tags"]), default=0)
    lines = [
        f"{tag:<{width}} = {t['score'] * 100:.2f}% ({t['correct']} / {t['total']})"
        for tag, t in summary["tags"].items()
    ]
    lines.append(f"Overall score (avg. over {len(summary['tags'])} tasks): {summary['overall']:.5f}")
    return "\n".join(lines)
