"""Paired differences of two evaluations over the same items: two models on the same prompts and seeds
(`t2i-gcpo eval compare A B`), or one run's held-out evaluation at a step against its step 0.

An item is one scored image (or text, or question): a row ``{"key", "category", "score", …}`` of an
evaluation's results.jsonl or of a run's ``eval/step_NNNNNN.jsonl``, its key stable across models and runs
for the same prompt and sample index (``"00012/0003"``: prompt 00012, its sample 3). Both sides must hold the
same keys. The unit of the intervals is the prompt (the key before its last "/"): the images of one prompt
share it and are not independent draws, so each prompt p contributes its mean score on each side, x_p
(before) and y_p (after), over the items both sides scored, and its difference d_p = y_p − x_p pairs away
what the two sides share — the prompt's difficulty and, where the sampling noise is the same, the draw. The
paired interval is narrower than the unpaired one by as much as the two sides' prompt scores agree.

Per category c (its prompts p = 1 … n_c):

    change_c = mean_p d_p                         paired: Student-t 95 % interval of the mean of d
                                                  unpaired: Welch's interval of mean(y) − mean(x)

Overall, as the suite aggregates (``aggregate``): "items" (the mean over every item: DPG-Bench, CompBench,
a reward's mean) takes the same formulas over all prompts; "categories" (the unweighted mean of the category
means: GenEval and ShapeWorld's overall, the mean of their tags) takes change = (1/C) Σ_c change_c with the
variance (1/C²) Σ_c s²_c/n_c (paired: s_c the spread of d over category c's prompts; unpaired: the sum of
both sides' s²/n) and the Welch–Satterthwaite degrees of freedom (`stats.linear_ci95`). With one item per
prompt (GenEval 2) the prompt is the item.

This module imports nothing of the package but `stats` and `errors`, so training (train/trainer.py) uses it
too."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from t2i_gcpo.errors import UserError
from t2i_gcpo.stats import linear_ci95

AGGREGATES = ("items", "categories")
OVERALL = "overall"


def index_rows(rows: Iterable[Mapping[str, Any]], where: str) -> dict[str, tuple[str, float]]:
    """key → (category, score) of result rows; a one-line UserError naming `where` and the row for a row
    without a string key, a string category or a numeric score (None reads as nan: left out), or a key
    given twice."""
    out: dict[str, tuple[str, float]] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise UserError(f"{where}: row {i + 1} is not an object")
        key, category, score = row.get("key"), row.get("category"), row.get("score")
        if not isinstance(key, str) or not key:
            raise UserError(f"{where}: row {i + 1} has no 'key' (a string naming the prompt and sample)")
        if not isinstance(category, str) or not category:
            raise UserError(f"{where}: row {i + 1} ({key}) has no 'category' (a string)")
        if score is None:
            score = math.nan
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise UserError(f"{where}: row {i + 1} ({key}) has no numeric 'score' (got {score!r})")
        if key in out:
            raise UserError(f"{where}: key {key} appears twice (rows of two evaluations mixed?)")
        out[key] = (category, float(score))
    return out


def key_mismatch(
    a: Mapping[str, tuple[str, float]],
    b: Mapping[str, tuple[str, float]],
    names: tuple[str, str] = ("A", "B"),
) -> str | None:
    """Why the indexed rows `a` and `b` do not score the same items, in one line; None when they do (the
    same keys, each in the same category)."""
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if only_a:
        return f"{names[1]} lacks {len(only_a)} of {names[0]}'s {len(a)} items (first: {only_a[0]})"
    if only_b:
        return f"{names[1]} holds {len(only_b)} items {names[0]} lacks (first: {only_b[0]})"
    for k in sorted(a):
        if a[k][0] != b[k][0]:
            return f"item {k} is in category {a[k][0]!r} in {names[0]}, {b[k][0]!r} in {names[1]}"
    return None


def _entry(
    pairs: Sequence[tuple[float, float]], weights: Sequence[tuple[float, Sequence[tuple[float, float]]]]
) -> dict[str, Any]:
    """Before, after, change and both intervals of one cell: `pairs` its (before, after) items, `weights`
    the groups it combines ((1, pairs) for a plain mean; (1/C, pairs_c) per category for a mean of
    category means)."""

    def finite(p: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
        return [(x, y) for x, y in p if math.isfinite(x) and math.isfinite(y)]

    groups = [(w, finite(p)) for w, p in weights]
    change, low, high = linear_ci95((w, [y - x for x, y in p]) for w, p in groups)
    before = linear_ci95((w, [x for x, _ in p]) for w, p in groups)[0]
    after = linear_ci95((w, [y for _, y in p]) for w, p in groups)[0]
    unpaired = linear_ci95(
        [*((w, [y for _, y in p]) for w, p in groups), *((-w, [x for x, _ in p]) for w, p in groups)]
    )
    return {
        "before": before,
        "after": after,
        "change": change,
        "paired": [low, high],
        "unpaired": list(unpaired[1:]),
        "prompts": sum(len(p) for _, p in groups),
    }


def paired_change(
    before: Iterable[Mapping[str, Any]] | Mapping[str, tuple[str, float]],
    after: Iterable[Mapping[str, Any]] | Mapping[str, tuple[str, float]],
    aggregate: str = "items",
    names: tuple[str, str] = ("A", "B"),
) -> dict[str, Any]:
    """The paired change from `before` to `after` (result rows, or rows already `index_rows`-ed), per
    category and overall (module docstring): ``{"aggregate", "categories": {c: cell}, "overall": cell}``,
    each cell ``{"before", "after", "change", "paired": [low, high], "unpaired": [low, high], "n"}`` (nan
    where undefined). Items whose score is nan on either side are left out of both. A UserError when the
    two sides do not hold the same items (`key_mismatch`) or `aggregate` is unknown."""
    if aggregate not in AGGREGATES:
        raise UserError(f"aggregate must be one of {', '.join(AGGREGATES)}, got {aggregate!r}")
    a = before if isinstance(before, Mapping) else index_rows(before, names[0])
    b = after if isinstance(after, Mapping) else index_rows(after, names[1])
    why = key_mismatch(a, b, names)
    if why:
        raise UserError(f"not the same items: {why}")
    if not a:
        raise UserError("no items to compare")
    clusters: dict[str, dict[str, list[tuple[float, float]]]] = {}  # category → prompt → its (before, after)
    for k in sorted(a):
        clusters.setdefault(a[k][0], {}).setdefault(prompt_of(k), []).append((a[k][1], b[k][1]))
    by_category = {c: prompt_means(prompts) for c, prompts in clusters.items()}
    items = {c: sum(_finite_count(p) for p in prompts.values()) for c, prompts in clusters.items()}
    categories = {c: {**_entry(p, [(1.0, p)]), "n": items[c]} for c, p in by_category.items()}
    everything = [x for p in by_category.values() for x in p]
    if aggregate == "categories":
        overall = _entry(everything, [(1.0 / len(by_category), p) for p in by_category.values()])
    else:
        overall = _entry(everything, [(1.0, everything)])
    overall["n"] = sum(items.values())
    return {"aggregate": aggregate, "categories": categories, OVERALL: overall}


def prompt_of(key: str) -> str:
    """The prompt an item's key names: the key before its last "/" ("00012/0003" → "00012"), or the key."""
    return key.rpartition("/")[0] or key


def prompt_means(prompts: Mapping[str, Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
    """(x_p, y_p) of each prompt: the means of its items' (before, after) scores over the items both sides
    scored (nan on either side: left out); a prompt with none is left out."""
    out = []
    for pairs in prompts.values():
        kept = [(x, y) for x, y in pairs if math.isfinite(x) and math.isfinite(y)]
        if kept:
            out.append((sum(x for x, _ in kept) / len(kept), sum(y for _, y in kept) / len(kept)))
    return out


def _finite_count(pairs: Sequence[tuple[float, float]]) -> int:
    return sum(1 for x, y in pairs if math.isfinite(x) and math.isfinite(y))


def half_width(interval: Sequence[float | None]) -> float:
    """Half the width of a [low, high] interval (nan where it is undefined)."""
    low, high = (math.nan if v is None else float(v) for v in interval)
    return (high - low) / 2


def cell(mean: float | None, low: float | None, high: float | None, sign: bool = False) -> str:
    """'0.405 ± 0.021' (half-width of the 95 % interval), or just the mean without an interval;
    '+0.012 ± 0.021' with `sign`; '—' for no value (None: a NaN read back from JSON)."""
    if mean is None or math.isnan(mean):
        return "—"
    m = f"{mean:+.3f}" if sign else f"{mean:.3f}"
    return m if low is None or high is None or math.isnan(low) else f"{m} ± {(high - low) / 2:.3f}"


def format_change(result: Mapping[str, Any], names: tuple[str, str] = ("A", "B")) -> str:
    """A plain-text table of `paired_change`'s result: each category and overall, A, B, the paired change
    B − A with its 95 % interval, the unpaired interval's half-width, and the prompts and items paired."""
    rows = [*result["categories"].items(), (OVERALL, result[OVERALL])]
    w = max(12, *(len(c) for c, _ in rows))
    a, b = names
    lines = [
        f"{'category':<{w}} {a[:8]:>8} {b[:8]:>8}  {'change (paired 95 %)':>20}  {'unpaired ±':>10} "
        f"{'prompts':>7} {'items':>6}"
    ]
    for c, e in rows:
        unpaired = half_width(e["unpaired"])
        lines.append(
            f"{c:<{w}} {_num(e['before']):>8} {_num(e['after']):>8}  "
            f"{cell(e['change'], *e['paired'], sign=True):>20}  "
            f"{'—' if math.isnan(unpaired) else f'{unpaired:.3f}':>10} {e.get('prompts', e['n']):>7} "
            f"{e['n']:>6}"
        )
    return "\n".join(lines)


def _num(v: float | None) -> str:
    return "—" if v is None or math.isnan(v) else f"{v:.3f}"


def strict_json(value: Any) -> Any:
    """`value` with every NaN or infinity as None, so json.dumps writes null: bare NaN is not JSON, and
    strict parsers (browsers, jq, serde) reject the file. The readers take None as "no value"."""
    import numpy as np

    if isinstance(value, Mapping):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


# ---------------------------------------------------------------------------------------------
# a run's held-out evaluation against its step 0 (train/trainer.py)
# ---------------------------------------------------------------------------------------------


def category_means(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The mean score of each category of result rows (nan scores left out), in first-seen order."""
    sums: dict[str, list[float]] = {}
    for c, s in index_rows(rows, "held-out rows").values():
        if math.isfinite(s):
            sums.setdefault(c, []).append(s)
    return {c: sum(v) / len(v) for c, v in sums.items()}


def change_metrics(change: Mapping[str, Any], prefix: str = "eval") -> dict[str, float]:
    """The metrics.jsonl keys of a paired change (metrics.EVAL_CHANGE, EVAL_CHANGE_CI per category and
    overall, EVAL_CHANGE_UNPAIRED_CI); nan where undefined. Another `prefix` than "eval" (an in-training
    suite's, "eval/geneval2") puts the same keys under it: "eval/geneval2/change/overall"."""
    from t2i_gcpo import metrics as M

    def key(name: str) -> str:
        return prefix + name[len("eval") :]

    out: dict[str, float] = {}
    for c, e in [*change["categories"].items(), (OVERALL, change[OVERALL])]:
        out[key(M.EVAL_CHANGE.format(category=c))] = float(e["change"])
        out[key(M.EVAL_CHANGE_CI.format(category=c))] = half_width(e["paired"])
    out[key(M.EVAL_CHANGE_UNPAIRED_CI)] = half_width(change[OVERALL]["unpaired"])
    return out


def change_headline(change: Mapping[str, Any], since: str = "step 0") -> str:
    """The overall paired change, "change from step 0 +0.015 ± 0.012 (paired 95 %; unpaired ± 0.041)"."""
    e = change[OVERALL]
    unpaired = half_width(e["unpaired"])
    tail = "" if math.isnan(unpaired) else f"; unpaired ± {unpaired:.3f}"
    return f"change from {since} {cell(e['change'], *e['paired'], sign=True)} (paired 95 %{tail})"


def categories_line(means: Mapping[str, float], change: Mapping[str, Any] | None = None) -> str:
    """Each category's score, and with `change` its paired change and interval: "single_object 1.000
    (+0.000 ± 0.000) · two_object …"; empty for a single category "all" (the headline says it)."""
    if list(means) == ["all"]:
        return ""
    parts = []
    for c, m in means.items():
        e = (change or {}).get("categories", {}).get(c)
        parts.append(
            f"{c} {m:.3f}" + ("" if e is None else f" ({cell(e['change'], *e['paired'], sign=True)})")
        )
    return " · ".join(parts)


# ---------------------------------------------------------------------------------------------
# two evaluations' output folders (`t2i-gcpo eval compare A B`)
# ---------------------------------------------------------------------------------------------


def read_evaluation(path: str | Path) -> tuple[list[dict], dict[str, Any], str]:
    """(result rows, protocol, what was read) of an evaluation: an output folder of ``t2i-gcpo eval …``
    (results.jsonl and protocol.json), a run directory (its last held-out evaluation:
    eval/step_NNNNNN.jsonl, and eval/protocol.json), or one such step file. A one-line UserError for
    anything else."""
    from t2i_gcpo.eval.records.protocol import PROTOCOL_NAME, read_protocol
    from t2i_gcpo.outdir import read_jsonl

    p = Path(path)
    if p.is_file() and p.parent.name == "eval" and p.name.startswith("step_"):
        rows_path, protocol_path = p, p.parent / PROTOCOL_NAME
    elif (p / "results.jsonl").is_file():
        rows_path, protocol_path = p / "results.jsonl", p / PROTOCOL_NAME
    elif (p / "eval").is_dir():
        steps = sorted((p / "eval").glob("step_*.jsonl"))
        if not steps:
            raise UserError(f"{p}: its eval/ holds no held-out items (eval/step_NNNNNN.jsonl)")
        rows_path, protocol_path = steps[-1], p / "eval" / PROTOCOL_NAME
    else:
        raise UserError(
            f"{p} is neither an evaluation's output folder (results.jsonl, protocol.json) nor a run "
            f"directory (eval/step_NNNNNN.jsonl)"
        )
    if not protocol_path.is_file():
        raise UserError(
            f"{protocol_path.parent}: no {PROTOCOL_NAME} beside {rows_path.name} (written by an older "
            f"version): score the images again (--score-only) to record it"
        )
    return read_jsonl(rows_path), read_protocol(protocol_path), str(rows_path)


def compare_evaluations(a: str | Path, b: str | Path) -> dict[str, Any]:
    """B against A, item by item (`paired_change`, as their protocol aggregates), after checking that they
    are comparable: a one-line UserError "protocol_mismatch: …" when their protocols differ in a field two
    comparable evaluations share (`protocol.protocol_mismatch`), or when they scored other items."""
    from t2i_gcpo.eval.records.protocol import protocol_mismatch

    rows_a, proto_a, read_a = read_evaluation(a)
    rows_b, proto_b, read_b = read_evaluation(b)
    why = protocol_mismatch(proto_a, proto_b)
    if why:
        raise UserError(f"protocol_mismatch: {why} ({a} against {b}): not the same prompts, seeds and scorer")
    aggregate = proto_a.get("aggregate", "items")
    change = paired_change(index_rows(rows_a, read_a), index_rows(rows_b, read_b), aggregate)
    return {
        "a": read_a,
        "b": read_b,
        "suite": proto_a["suite"],
        "label": _label(proto_a),
        "models": [_model(proto_a), _model(proto_b)],
        "change": change,
    }


def _model(protocol: Mapping[str, Any]) -> str | None:
    model = protocol.get("model")
    return model.get("spec") if isinstance(model, Mapping) else None


def _label(protocol: Mapping[str, Any]) -> str | None:
    scorer = protocol.get("scorer")
    return scorer.get("label") if isinstance(scorer, Mapping) else None


def format_comparison(result: Mapping[str, Any]) -> str:
    """What `t2i-gcpo eval compare` prints: the suite, A and B, the table (`format_change`), a legend."""
    change = result["change"]
    how = "the mean of the categories" if change["aggregate"] == "categories" else "the mean over every item"
    head = [
        f"{result['suite']}" + (f" ({result['label']})" if result.get("label") else ""),
        f"A: {result['a']}" + (f"  (model {result['models'][0]})" if result["models"][0] else ""),
        f"B: {result['b']}" + (f"  (model {result['models'][1]})" if result["models"][1] else ""),
    ]
    legend = (
        f"change: B − A, the mean over the items (the same prompt and sample index on both sides) of "
        f"the difference, with its Student-t 95 % interval; unpaired ±: half-width of the interval of "
        f"the same difference taken as independent samples (Welch); overall: {how}."
    )
    return "\n".join([*head, "", format_change(change), "", legend])
