"""Section `progress`: how a step's cost grows with training, read from a real run.

As the reward rises, more groups score the same for every sample and dynamic sampling has to draw more
groups for the same batch. This section reads a finished run's metrics.jsonl (``--progress-run DIR``; default:
the newest ``runs/gcpo-*`` or ``runs/dapo-*`` directory with at least 150 steps, e.g. the README's
default ``t2i-gcpo train --prompts prompts/shapeworld_train.txt``) and compares the median step time
of the first 50 steps with that of the last 50, with what the steps drew, kept and carried. Target: a
late step costs at most 1.2× an early one (issue "Performance and scale"). Nothing is trained here:
the run's own clock is the measurement, so run it on a quiet machine.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.suite.common import REPO, Context

TITLE = "Step cost over training (`progress`)"
TARGET = 1.2
WINDOW = 50


def find_run(given: str | None) -> Path | None:
    if given:
        return Path(given)
    candidates = [p for pat in ("gcpo-*", "dapo-*") for p in (REPO / "runs").glob(pat) if p.is_dir()]
    long_enough = [p for p in candidates if len(train_rows(p)) >= 150]
    return max(long_enough, key=lambda p: p.stat().st_mtime) if long_enough else None


def train_rows(run: Path) -> list[dict]:
    """The run's training steps, one record per step (a resumed run's re-logged steps merged)."""
    from t2i_gcpo.viz.report import read_metrics

    records, _unreadable = read_metrics(run / "metrics.jsonl")
    return [r for r in records if r.get("time/step") is not None]


def window(rows: list[dict], name: str) -> dict:
    def med(key: str) -> float | None:
        vals = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    def mean(key: str) -> float | None:
        vals = [r[key] for r in rows if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    return {
        "steps": name,
        "step_s": med("time/step"),
        "rollout_s": med("time/rollout"),
        "reward_s": med("time/reward"),
        "update_s": med("time/update"),
        "zero_std_ratio": mean("zero_std_ratio"),
        "groups_drawn": mean("groups_drawn"),
        "groups_kept": mean("groups_kept"),
        "groups_carried": mean("groups_carried"),
    }


def run(ctx: Context) -> dict:
    found = find_run(ctx.run)
    rows = train_rows(found) if found else []
    if len(rows) < 2 * WINDOW:  # nothing to read: say how to get it, measure nothing
        note = (
            f"Not measured: this section reads a run of ≥ {2 * WINDOW} steps. Give --progress-run DIR, or "
            f"first run `t2i-gcpo train --prompts prompts/shapeworld_train.txt` (the README's default run)."
        )
        return {
            "title": TITLE,
            "timing": "—",
            "columns": [("steps", "steps")],
            "rows": [],
            "summary": {"late_over_early": None, "target": TARGET},
            "reading": note,
        }
    early = window(rows[:WINDOW], f"{rows[0]['step']}–{rows[WINDOW - 1]['step']}")
    late = window(rows[-WINDOW:], f"{rows[-WINDOW]['step']}–{rows[-1]['step']}")
    ratio = late["step_s"] / early["step_s"]
    config = (found / "config.yaml").read_text() if (found / "config.yaml").is_file() else ""
    budget = next((ln.split(":")[1].strip() for ln in config.splitlines() if "draw_budget" in ln), "?")
    early, late = ({k: ("—" if v is None else v) for k, v in w.items()} for w in (early, late))
    n = {
        k: f"{v:.1f}" if isinstance(v, float) else v
        for k, v in {
            "ed": early["groups_drawn"],
            "ek": early["groups_kept"],
            "ld": late["groups_drawn"],
            "lk": late["groups_kept"],
        }.items()
    }
    reading = (
        f"In {found.name}, the median step took {early['step_s']:.2f} s over steps {early['steps']} and "
        f"{late['step_s']:.2f} s over steps {late['steps']}: {ratio:.2f}× (target ≤ {TARGET}×, "
        f"{'met' if ratio <= TARGET else 'missed'}). The share of groups without signal rose from "
        f"{early['zero_std_ratio']:.2f} to {late['zero_std_ratio']:.2f}. Dynamic sampling draws the missing "
        f"groups divided by (1 − r̂) in one batched round, at most advantage.draw_budget = {budget} × P per "
        f"step, and carries surplus groups with signal into the next step; late in training the budget caps "
        f"the draw ({n['ld']} groups drawn, {n['lk']} trained per step, against {n['ed']} and "
        f"{n['ek']} early)."
    )
    return {
        "title": TITLE,
        "timing": f"medians of the run's own time/* metrics over its first and last {WINDOW} steps",
        "columns": [
            ("steps", "steps"),
            ("step_s", "step s"),
            ("rollout_s", "rollout s"),
            ("reward_s", "decode+reward s"),
            ("update_s", "update s"),
            ("zero_std_ratio", "groups without signal"),
            ("groups_drawn", "groups drawn"),
            ("groups_kept", "groups trained"),
            ("groups_carried", "groups carried in"),
        ],
        "rows": [early, late],
        "summary": {"late_over_early": ratio, "target": TARGET, "run": str(found)},
        "reading": reading,
    }
