"""Arms at equal budget (docs/concepts/tree_credit.md#budget): how many samples a preset scores per step,
measured by drawing its first steps' batches with the base model, and the readings of a comparison at
equal samples and at equal training time."""

from __future__ import annotations

from typing import Any

import numpy as np

from t2i_gcpo import metrics as M
from t2i_gcpo.stats import mean_ci95

MATCH_BY = ("group", "prompts")  # what a matched arm scales: rollout.group_size or rollout.prompts_per_step
# the equal-sample reading counts two runs as equal within this share of the thriftier one's samples: their
# dynamic sampling never spends to the sample alike, and a 2 % overspend must not push a
# run back one evaluation
SAMPLES_TOLERANCE = 0.05


UNITS = {"samples": M.BUDGET_SAMPLES, "tokens": M.BUDGET_TOKENS}  # what --match-budget equalises


def samples_extra(preset: str) -> bool:
    """Whether a preset scores samples beyond its groups: a credit scheme that needs branches (continuations
    scored) or leaves (tree groups), or a budget allocation (more drawn than trained on)."""
    from t2i_gcpo.config import load_config
    from t2i_gcpo.core.schemes import get_scheme

    cfg = load_config(preset)
    return (
        bool(get_scheme(cfg.credit.scheme).needs & {"branches", "leaves"}) or cfg.rollout.allocation != "none"
    )


def matched_name(baseline: str, arm: str, unit: str = "samples") -> str:
    """The folder and table name of `baseline` trained at `arm`'s sample (or token) budget."""
    return f"{baseline}-at-{arm}-budget" if unit == "samples" else f"{baseline}-at-{arm}-{unit}"


def probe_samples_per_step(
    algo: str, flags: dict, overrides: tuple[str, ...], steps: int = 2, metric: str = M.BUDGET_SAMPLES
) -> float:
    """Mean samples scored per step (`budget/samples`: every dynamic-sampling round and every
    continuation; or another budget `metric`, e.g. tokens) over the first `steps` steps of a run of `algo`
    with seed flags["seed"], drawn exactly as training draws them, from the base model (no update between
    the steps; nothing written)."""
    import torch

    from t2i_gcpo.hardware import local_device
    from t2i_gcpo.train.collect import BatchCollector
    from t2i_gcpo.train.data import PromptStream
    from t2i_gcpo.train.run import prepare
    from t2i_gcpo.train.run_settings import resolve_autocast, sampling_params

    job = prepare(algo=algo, flags={**flags, "out": None}, overrides=overrides)
    cfg, policy = job.cfg, job.policy
    device = local_device()
    resolve_autocast(cfg, torch.device(device).type, policy)
    if cfg.rollout.reveal_order and policy.capabilities.reveal_order:
        policy.keep_reveal_order(cfg.rollout.reveal_order)
    policy.to(device)
    collector = BatchCollector(cfg, PromptStream(job.prompts, cfg.seed), 0, 1)
    sampling = sampling_params(cfg)
    counts = [
        collector.collect(step, policy, job.reward, sampling).metrics()[metric]
        for step in range(1, steps + 1)
    ]
    return float(np.mean(counts))


def matched_size(samples_per_step: float, group_size: int, prompts_per_step: int, by: str) -> tuple[str, int]:
    """(config key, value) that makes a run score about `samples_per_step` samples a step in one round:
    a group size (by "group") or a prompt count (by "prompts"), at least the run's own."""
    if by == "group":
        return "rollout.group_size", max(group_size, round(samples_per_step / prompts_per_step))
    return "rollout.prompts_per_step", max(prompts_per_step, round(samples_per_step / group_size))


def plan_match(
    arm: str, baseline: str, flags: dict, overrides: tuple[str, ...], by: str, unit: str = "samples"
) -> dict[str, Any]:
    """How to train `baseline` at `arm`'s budget of samples (or tokens, `unit`): `arm`'s samples (tokens)
    per step measured (`probe_samples_per_step`), the baseline sized to spend as many in one round (samples:
    `matched_size`; tokens: its own size scaled by the ratio of what the two spend), then probed at that
    size and resized once by the ratio — a baseline whose larger groups still lack signal draws extra
    dynamic-sampling rounds, which the first size does not count."""
    from t2i_gcpo.config import load_config

    metric = UNITS[unit]
    base = load_config(baseline, flags=flags, overrides=overrides).rollout
    own = base.group_size if by == "group" else base.prompts_per_step
    key = "rollout.group_size" if by == "group" else "rollout.prompts_per_step"
    target = probe_samples_per_step(arm, flags, overrides, metric=metric)
    if unit == "samples":
        key, first = matched_size(target, base.group_size, base.prompts_per_step, by)
    else:
        first = max(
            own, round(own * target / probe_samples_per_step(baseline, flags, overrides, metric=metric))
        )
    drawn = probe_samples_per_step(baseline, flags, (*overrides, f"{key}={first}"), metric=metric)
    size = max(own, round(first * target / drawn))
    return {
        "of": arm,
        "unit": unit,
        f"{unit}_per_step": target,
        "first_size": first,
        "first_size_drew": drawn,
        "set": f"{key}={size}",
    }


def totals(rows: list[dict]) -> dict[str, float]:
    """A run's budget totals (the last logged `budget/*_total`) and its training time: the sum of
    `time/step` over its steps (held-out evaluations excluded), each step counted once."""
    per_step: dict[int, dict] = {}
    for r in rows:
        if M.TIME_STEP in r:
            per_step[r[M.STEP]] = r
    out = {"seconds": float(sum(r[M.TIME_STEP] for r in per_step.values()))}
    last = per_step[max(per_step)] if per_step else {}
    for key in M.BUDGET:
        out[key] = float(last.get(M.BUDGET_TOTAL.format(key=key), np.nan))
    return out


def training_clock(rows: list[dict]) -> dict[int, float]:
    """step → seconds of training up to and including that step (0 → 0: the start)."""
    per_step = {r[M.STEP]: r[M.TIME_STEP] for r in rows if M.TIME_STEP in r}
    clock, elapsed = {0: 0.0}, 0.0
    for step in sorted(per_step):
        elapsed += per_step[step]
        clock[step] = elapsed
    return clock


def samples_clock(rows: list[dict], metric: str = M.BUDGET_SAMPLES) -> dict[int, float]:
    """step → samples scored (or tokens sampled, `metric`) up to and including that step
    (`budget/samples_total`; 0 → 0)."""
    total = M.BUDGET_TOTAL.format(key=metric)
    clock = {0: 0.0}
    for r in rows:
        if total in r:
            clock[r[M.STEP]] = float(r[total])
    return clock


def score_at(curve: list[tuple[int, float]], clock: dict[int, float], seconds: float) -> float:
    """A run's held-out score at `seconds` of training: its last evaluation at or before that time."""
    reached = [v for step, v in curve if clock.get(step, np.inf) <= seconds + 1e-9]
    return reached[-1] if reached else np.nan


def equal_time(
    curves: dict[str, dict[int, list]], clocks: dict[str, dict[int, dict[int, float]]], baseline: str
) -> dict[str, Any]:
    """The equal-time reading: per seed, the training time of the fastest arm's whole run; every arm's
    score at that time (its last evaluation by then); each arm minus the baseline, paired by seed."""
    seeds = sorted({s for runs in curves.values() for s in runs})
    budget = {}
    for s in seeds:
        ends = [max(clocks[a][s].values()) for a in curves if s in clocks[a]]
        budget[s] = min(ends)
    scores = {a: {s: score_at(curves[a][s], clocks[a][s], budget[s]) for s in curves[a]} for a in curves}
    paired = {}
    for a in curves:
        if a == baseline:
            continue
        diffs = [scores[a][s] - scores[baseline][s] for s in scores[a] if s in scores[baseline]]
        diffs = [d for d in diffs if np.isfinite(d)]
        paired[a] = {"paired": mean_ci95(diffs), "ahead": int(sum(d > 0 for d in diffs))}
    return {
        "seconds": {str(s): t for s, t in budget.items()},
        "score": {a: mean_ci95([v for v in scores[a].values() if np.isfinite(v)]) for a in curves},
        "paired": paired,
    }


def equal_samples(
    curves: dict[str, dict[int, list]],
    clocks: dict[str, dict[int, dict[int, float]]],
    matches: dict[str, str],
) -> dict[str, Any]:
    """The equal-sample reading of each arm against the baseline trained at its budget (`matches`:
    matched arm → arm; `clocks`: arm → seed → step → samples scored so far). Per seed, both runs are
    read at their last evaluation by the samples the thriftier of the two scored in its whole run (+ 5 %,
    `SAMPLES_TOLERANCE`) — the matched arm's dynamic sampling can spend more or fewer samples than
    planned — and compared, paired by seed; "final" is the same for the two runs' last evaluations, with
    the ratio of what they spent."""
    out = {}
    for matched, arm in matches.items():
        if arm not in curves or matched not in curves:
            continue
        seeds = [s for s in curves[arm] if s in curves[matched]]
        diffs, finals, at, ratio = [], [], {arm: [], matched: []}, []
        for s in seeds:
            budget = min(max(clocks[arm][s].values()), max(clocks[matched][s].values()))
            budget *= 1 + SAMPLES_TOLERANCE
            a, b = (score_at(curves[x][s], clocks[x][s], budget) for x in (arm, matched))
            for x in (arm, matched):
                steps = [st for st, _ in curves[x][s] if clocks[x][s].get(st, np.inf) <= budget + 1e-9]
                at[x].append(steps[-1] if steps else np.nan)
            diffs.append(a - b)
            finals.append(curves[arm][s][-1][1] - curves[matched][s][-1][1])
            ratio.append(max(clocks[matched][s].values()) / max(max(clocks[arm][s].values()), 1.0))
        ok = [d for d in diffs if np.isfinite(d)]
        out[arm] = {
            "against": matched,
            "paired": mean_ci95(ok),
            "ahead": int(sum(d > 0 for d in ok)),
            "read_at_step": {x: _nanmean(v) for x, v in at.items()},
            "final": mean_ci95(finals),
            "spent_ratio": float(np.mean(ratio)) if ratio else np.nan,
        }
    return out


def _nanmean(values: list[float]) -> float:
    """The mean of the finite values, NaN where there are none (no budget point read at any seed)."""
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else np.nan
