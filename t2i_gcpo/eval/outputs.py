"""What every question-based evaluation (GenEval 2, the judge suites) writes into its output folder, whole
(`outdir.write_file`):

    results.jsonl   one row per image: "key" (<prompt>/<image>, the same for the same prompt and sample index
                    across models and runs), "category", "score" (a float) and the suite's own fields
    summary.json    per-category and overall scores ("categories", "overall") and the suite's tables
    summary.txt     the same as a table
    protocol.json   `eval.protocol.protocol_record`: suite, data hashes, model, scorer, seeds, sampling
    answers.jsonl   every answer as it came (eval/suites/asking.py), the resume log

Scores are fractions in [0, 1] in these files; a table may print them in percent.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

RESULTS_NAME = "results.jsonl"
SUMMARY_NAME, SUMMARY_TEXT = "summary.json", "summary.txt"
PROTOCOL_NAME = "protocol.json"


def jsonable(value: Any) -> Any:
    """`value` with every non-finite float as None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def write_evaluation(
    out: str | os.PathLike, rows: list[dict], summary: dict, text: str, protocol: dict
) -> None:
    """results.jsonl, summary.json, summary.txt and protocol.json in `out` (module docstring)."""
    from t2i_gcpo.outdir import write_file

    out = Path(out)
    write_file(
        out / RESULTS_NAME,
        "".join(json.dumps(jsonable(r), ensure_ascii=False) + "\n" for r in rows),
        within=out,
    )
    write_file(
        out / SUMMARY_NAME, json.dumps(jsonable(summary), indent=1, ensure_ascii=False) + "\n", within=out
    )
    write_file(out / SUMMARY_TEXT, text + "\n", within=out)
    write_file(
        out / PROTOCOL_NAME, json.dumps(jsonable(protocol), indent=1, ensure_ascii=False) + "\n", within=out
    )
