"""Section `compare_cost`: what a multi-seed comparison costs, read from a finished `t2i-gcpo compare`.

The target (issue "Performance and scale"): ``t2i-gcpo compare --algos dapo,gcpo,dgpo,grpo --seeds 5
--steps 150`` in at most 90 minutes on the 2-core test machine. Nothing is trained here: this section
reads the comparison directory given by ``--compare-dir DIR`` — per run, its training time (the sum of
its ``time/step``) and its wall time (from writing config.yaml to writing eval.json: training plus the
held-out evaluations), and the comparison's wall time (first start to last end). With
``--compare-reference DIR``, a comparison of the same algorithms and seeds run another way (e.g. in
float32), it also gives each algorithm's final held-out score minus the reference's, paired by seed,
with its Student-t 95 % interval: the check that the faster way gives equal results. Without
``--compare-dir`` the section keeps what an earlier run measured.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import yaml

from benchmarks.suite.common import Context

TITLE = "Cost of a multi-seed comparison (`compare_cost`)"
TARGET_MIN = 90.0


def runs_of(root: Path) -> dict[str, dict[int, Path]]:
    """algo → seed → finished run directory (one with eval.json) under a comparison's output."""
    out: dict[str, dict[int, Path]] = {}
    for run in sorted(root.glob("*/seed*")):
        if (run / "eval.json").is_file() and run.name[4:].isdecimal():
            out.setdefault(run.parent.name, {})[int(run.name[4:])] = run
    return out


def final_score(run: Path) -> float | None:
    from t2i_gcpo.studies.compare import headline_key

    data = json.loads((run / "eval.json").read_text())
    key = headline_key(data)
    return data[key] if key else None


def run(ctx: Context) -> dict | None:
    from t2i_gcpo.studies.compare import paired_differences, read_metrics

    if not ctx.compare_dir:
        return None  # nothing given: keep the earlier result
    root = Path(ctx.compare_dir)
    runs = runs_of(root)
    if not runs:
        raise SystemExit(f"--compare-dir {root}: no finished runs (<algo>/seed<k>/eval.json) under it")
    reference = runs_of(Path(ctx.compare_reference)) if ctx.compare_reference else {}
    starts, ends, rows, checks = [], [], [], {}
    for algo, seeds in runs.items():
        train_s, wall_s = [], []
        for run_dir in seeds.values():
            train_s.append(sum(r.get("time/step") or 0.0 for r in read_metrics(run_dir)))
            start, end = (run_dir / "config.yaml").stat().st_mtime, (run_dir / "eval.json").stat().st_mtime
            starts.append(start)
            ends.append(end)
            wall_s.append(end - start)
        finals = {s: final_score(r) for s, r in seeds.items()}
        row = {
            "algo": algo,
            "runs": len(seeds),
            "train_min": statistics.mean(train_s) / 60,
            "wall_min": statistics.mean(wall_s) / 60,
            "final": statistics.mean(finals.values()),
        }
        if algo in reference:
            ref = {s: final_score(r) for s, r in reference[algo].items()}
            paired = paired_differences({"this": finals, "reference": ref}, "reference")["this"]["paired"]
            mean, lo, hi, n = paired
            row.update(
                reference_final=statistics.mean(ref.values()),
                paired_diff=mean,
                ci_low=lo,
                ci_high=hi,
                pairs=n,
            )
            checks[algo] = {"diff": mean, "ci": [lo, hi], "pairs": n}
        rows.append(row)
    total_min = (max(ends) - min(starts)) / 60
    n_runs = sum(r["runs"] for r in rows)
    first = next(iter(next(iter(runs.values())).values()))
    config = yaml.safe_load((first / "config.yaml").read_text())
    precision = {key: config.get(key, {}).get("autocast", "?") for key in ("rollout", "optim")}
    reading = (
        f"{n_runs} runs in {root} took {total_min:.0f} min from the first start to the last end "
        f"(target for `compare --algos dapo,gcpo,dgpo,grpo --seeds 5 --steps 150`: ≤ {TARGET_MIN:.0f} min, "
        f"{'met' if total_min <= TARGET_MIN else 'missed'}), with rollout.autocast "
        f"{precision['rollout']} and optim.autocast {precision['optim']}. Per run the wall time includes the "
        f"held-out evaluations; the training time is the sum of the run's own step times."
    )
    if checks:
        parts = [
            f"{a.upper()} {c['diff']:+.3f} [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}] ({c['pairs']} seeds)"
            for a, c in checks.items()
        ]
        covered = all(c["ci"][0] <= 0 <= c["ci"][1] for c in checks.values())
        reading += (
            f" Against {ctx.compare_reference}, final held-out score minus the reference's, paired by seed "
            f"(mean, Student-t 95 % interval): {'; '.join(parts)} — "
            + ("every interval covers 0." if covered else "not every interval covers 0.")
        )
    columns = [
        ("algo", "algo"),
        ("runs", "runs"),
        ("train_min", "training min / run"),
        ("wall_min", "wall min / run"),
        ("final", "final held-out"),
    ]
    if checks:
        columns += [
            ("reference_final", "reference final"),
            ("paired_diff", "paired Δ"),
            ("ci_low", "95 % low"),
            ("ci_high", "95 % high"),
        ]
    return {
        "title": TITLE,
        "timing": "the runs' own clocks (time/step) and file times (config.yaml written → eval.json written)",
        "columns": columns,
        "rows": rows,
        "summary": {
            "total_min": total_min,
            "target_min": TARGET_MIN,
            "runs": n_runs,
            "dir": str(root),
            "reference": ctx.compare_reference,
            "paired": checks,
        },
        "reading": reading,
    }
