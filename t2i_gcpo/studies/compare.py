"""Multi-seed comparison of algorithms: train each (algo, seed), then tabulate the held-out score
(mean and 95 % interval over seeds) — for image tasks the strict GenEval score per tag and overall
and the credit lift of the run's credit, for text tasks accuracy, pass@k, format rate and the step
lift — the steps each algorithm needs to reach the baseline's final score, each algorithm's final
score against the baseline's seed by seed (paired) and overall (unpaired), every run's held-out curve
and the paired differences at every evaluation (with each algorithm's gain over its own start), and
plot the held-out curves with bands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from typing_extensions import Required, TypedDict

from t2i_gcpo import metrics as M
from t2i_gcpo.eval.records.paired import cell as _cell
from t2i_gcpo.eval.records.paired import strict_json
from t2i_gcpo.metrics import MetricsRow
from t2i_gcpo.outdir import open_append, read_json, read_jsonl, write_file
from t2i_gcpo.stats import mean_ci95, welch_ci95
from t2i_gcpo.tasks.geneval import TAG_ORDER


class MatchedArm(TypedDict, total=False):
    """One matched arm of budget.json: the arm it matches, the unit, the --set that sizes it, what was
    measured."""

    __pydantic_config__ = {"extra": "allow"}  # type: ignore[misc]
    of: Required[str]
    set: str
    unit: str


class BudgetPlans(TypedDict, total=False):
    """budget.json: the settings the matched arms were planned under, and the arms."""

    __pydantic_config__ = {"extra": "allow"}  # type: ignore[misc]
    match: str
    by: str
    baseline: str
    arms: Required[dict[str, MatchedArm]]


def check_baseline(algos: list[str], baseline: str | None) -> str:
    """The algorithm the others are measured against: `baseline`, which must be one of `algos`, or by
    default dapo when compared, else the first algorithm."""
    from t2i_gcpo.errors import UserError

    if baseline is None:
        return "dapo" if "dapo" in algos else algos[0]
    if baseline not in algos:
        raise UserError(f"--baseline {baseline} is not among the compared algorithms ({', '.join(algos)})")
    return baseline


def seed_lists(algos: list[str], seeds: list[int] | dict[str, list[int]]) -> dict[str, list[int]]:
    """Each algorithm's seeds, from one list for all or a dict algorithm → list."""
    return {a: list(seeds[a]) for a in algos} if isinstance(seeds, dict) else {a: list(seeds) for a in algos}


def run_comparison(
    algos: list[str],
    seeds: list[int] | dict[str, list[int]],
    steps: int,
    out: Path,
    prompts: str,
    model: str = "shapeworld",
    reward: str | None = None,
    eval_every: int = 25,
    overrides: tuple[str, ...] = (),
    jobs: int = 1,
    baseline: str | None = None,
    match_budget: str | None = None,
    match_by: str = "group",
) -> dict[str, Any]:
    """Train every (algo, seed) not already finished under `out/<algo>/seed<k>` (so an interrupted
    comparison resumes where it stopped), then summarise against `baseline`. `jobs` > 1 trains that
    many runs side by side, each in its own process with an equal share of the CPU threads. `seeds`:
    one list for every algorithm, or each algorithm's own list. `match_budget="samples"`: the baseline
    is also trained, as arm `<baseline>-at-<algo>-budget` with the same seeds, at the sample budget of
    every algorithm that scores extra samples (its group size or prompt count scaled, `match_by`);
    "tokens": as arm `<baseline>-at-<algo>-tokens`, at its budget of tokens sampled;
    "samples,tokens": both."""
    from t2i_gcpo.train.run import prepare, run

    named = named_code(reward, overrides)  # a resumed run runs only the code this command names
    seeds = seed_lists(algos, seeds)
    baseline = check_baseline(algos, baseline)
    flags = dict(prompts=prompts, model=model, reward=reward, steps=steps)
    units = match_units(match_budget, match_by, algos, baseline) if match_budget is not None else None
    claim_comparison(out, algos, flags, eval_every, overrides, named)  # every arm planned, then the record
    algos, presets, extra = list(algos), {a: a for a in algos}, {a: () for a in algos}
    if units is not None:
        plans = plan_matches(out, algos, seeds, baseline, flags, overrides, match_by, units)
        for matched, info in plans.items():
            algos.insert(algos.index(info["of"]) + 1, matched)
            presets[matched], extra[matched] = baseline, (info["set"],)
            seeds[matched] = seeds[info["of"]]
    same = shared_runs(out, algos, seeds)
    todo = []
    for algo in algos:
        if algo in same:
            continue  # the same runs as an earlier matched arm: trained once, read under both names
        for seed in seeds[algo]:
            run_dir = out / algo / f"seed{seed}"
            if (run_dir / "eval.json").is_file():
                continue  # finished earlier
            resumable = (run_dir / "checkpoints" / "latest").is_file()
            if run_dir.exists() and not resumable:  # started but never checkpointed: start again
                import shutil

                shutil.rmtree(run_dir)
            flags = dict(
                prompts=prompts, model=model, reward=reward, out=str(run_dir), steps=steps, seed=seed
            )
            todo.append((presets[algo], run_dir, resumable, flags, extra[algo]))
    overrides = (f"eval_every={eval_every}", *overrides)
    if jobs > 1:
        run_side_by_side(todo, steps, overrides, jobs, named)
        return summarise(out, algos, seeds, baseline)
    for preset, run_dir, resumable, flags, own in todo:
        if resumable:
            run(prepare(resume_dir=run_dir, steps=steps, resume_options=named))
        else:
            run(prepare(algo=preset, flags=flags, overrides=(*overrides, *own)))
    return summarise(out, algos, seeds, baseline)


COMMAND = "compare"


def comparison_settings(flags: dict, eval_every: int, overrides: tuple[str, ...]) -> dict[str, Any]:
    """What every run of a comparison shares, so that its runs are comparable: steps, prompts (the file
    they resolve to), model, reward, the evaluation interval and the ``--set`` values (by key and by the
    value the config takes: neither their order nor their spelling matters; trackers left out)."""
    import os

    from t2i_gcpo.config import override_values
    from t2i_gcpo.policies.registry import model_identity
    from t2i_gcpo.resources import prompt_file

    sets = {k: v for k, v in override_values(overrides).items() if k != "report_to"}
    return {
        "--steps": flags["steps"],
        "--prompts": os.path.realpath(prompt_file(flags["prompts"])),
        "--model": model_identity(flags["model"]),
        "--reward": flags["reward"],
        "--eval-every": eval_every,
        "--set": sets,
    }


def claim_comparison(
    out: Path, algos: list[str], flags: dict, eval_every: int, overrides: tuple[str, ...], named: Any = None
) -> None:
    """Before any run and before anything is written in `out`: `out` holds no runs of a comparison with
    other settings (`comparison_settings`, recorded by `outdir.write_settings_record`; a comparison with other
    settings is one line naming them), every arm's run is planned as `train` plans it (its config, the
    trackers starting, the model loaded once and each arm's scheme, decode loop, cost, prompts and reward
    checked against it, train/run.plan_job) and reads a held-out score, and every run to be continued names
    only the code this comparison names (`named`); then the settings are recorded. (A folder of an earlier
    version holds no record: its runs are taken as they are.)"""
    from t2i_gcpo.config import load_config
    from t2i_gcpo.errors import UserError
    from t2i_gcpo.outdir import check_settings_record, write_settings_record
    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.train.plan import plan_config
    from t2i_gcpo.train.run import check_resumable, plan_job
    from t2i_gcpo.train.tracking import resolve_report_to

    sets = (f"eval_every={eval_every}", *overrides)
    configs = {algo: load_config(algo, flags={**flags, "out": None}, overrides=sets) for algo in algos}
    settings = comparison_settings(flags, eval_every, overrides)
    check_settings_record(out, COMMAND, settings)
    budget = out / "budget.json"  # the matched arms of an earlier run of this comparison, continued too
    arms = [*algos, *(read_json(budget, BudgetPlans)["arms"] if budget.is_file() else ())]
    for run_dir in sorted(p for arm in arms for p in (out / arm).glob("seed*")):  # before any model loads
        if (run_dir / "checkpoints" / "latest").is_file() and not (run_dir / "eval.json").is_file():
            check_resumable(run_dir, flags["steps"], named)
    first = configs[algos[0]]
    trackers = resolve_report_to(first.report_to)  # 'all' included: each one checked to start, once
    for cfg in configs.values():  # what the configs alone decide, before the model loads
        plan_config(cfg, trackers)
    policy = load_policy(first.model, first.model_options)
    for cfg in configs.values():
        job = plan_job(cfg, policy, trackers)
        if job.eval_prompts is None:
            held_out = job.task.default_eval_prompts() or "FILE"
            raise UserError(
                f"compare reads each run's held-out score, and a run with --reward {flags['reward']} "
                f"(not the task's own reward, {job.task.default_reward}) has no held-out prompts: give "
                f"them with --set eval_prompts={held_out} (scored with your reward)"
            )
    write_settings_record(out, COMMAND, settings)


def match_units(match: str, match_by: str, algos: list[str], baseline: str) -> list[str]:
    """The units of `--match-budget` (samples, tokens or both), checked with `--match-by` and the compared
    algorithms before anything is written: a one-line UserError for an unknown unit, a baseline that scores
    extra samples itself, or no algorithm to match."""
    from t2i_gcpo.errors import UserError
    from t2i_gcpo.studies import budget as B

    if match_by not in B.MATCH_BY:
        raise UserError(f"--match-by must be one of {', '.join(B.MATCH_BY)}, got '{match_by}'")
    units = [u.strip() for u in match.split(",") if u.strip()]
    if not units or any(u not in B.UNITS for u in units) or len(set(units)) < len(units):
        raise UserError(f"--match-budget must be samples, tokens or samples,tokens, got '{match}'")
    if B.samples_extra(baseline):
        raise UserError(
            f"--match-budget: the baseline {baseline} scores extra samples itself; use --baseline dapo"
        )
    if not [a for a in algos if a != baseline and B.samples_extra(a)]:
        raise UserError(
            f"--match-budget {match}: no compared algorithm scores extra samples (vine, tree, pods and "
            "knapsack do), nothing to match: add one to --algos (e.g. --algos "
            f"{','.join(dict.fromkeys([*algos, 'tree']))}) or leave out --match-budget"
        )
    return units


def plan_matches(
    out: Path,
    algos: list[str],
    seeds: dict[str, list[int]],
    baseline: str,
    flags: dict,
    overrides: tuple[str, ...],
    match_by: str,
    units: list[str] | str = "samples",
) -> dict[str, dict]:
    """The matched arms of `--match-budget` (`units`, checked by `match_units`): for every algorithm that
    scores extra samples, the baseline sized to its measured samples (tokens) per step (`budget.plan_match`,
    its first seed, two steps), as {matched name: {"of", "unit", "set", …}}; kept in out/budget.json so a
    resumed comparison trains the same arms without probing again."""
    from t2i_gcpo.errors import UserError
    from t2i_gcpo.studies import budget as B

    units = [u.strip() for u in units.split(",")] if isinstance(units, str) else units
    arms = [a for a in algos if a != baseline and B.samples_extra(a)]
    path = out / "budget.json"
    # the model and the --set values are the comparison's own settings, which `claim_comparison` checked
    key = {
        "match": ",".join(units),
        "by": match_by,
        "baseline": baseline,
        "model": flags["model"],
        "overrides": list(overrides),
    }
    if path.exists() or path.is_symlink():
        saved = read_json(path, BudgetPlans)
        if any(saved.get(k) != key[k] for k in ("match", "by", "baseline")):
            raise UserError(
                f"{path} was written by a comparison with other settings (--match-budget "
                f"{saved.get('match')}, --match-by {saved.get('by')}, baseline {saved.get('baseline')}): "
                f"use another --out"
            )
        arms_done = saved["arms"]
    else:
        arms_done = {}
    wanted = [(B.matched_name(baseline, arm, unit), arm, unit) for arm in arms for unit in units]
    for name, arm, unit in wanted:
        if name in arms_done:
            continue
        arms_done[name] = B.plan_match(
            arm, baseline, {**flags, "seed": seeds[arm][0]}, overrides, match_by, unit
        )
        write_file(path, json.dumps({**key, "arms": arms_done}, indent=1), within=out)
    return {name: arms_done[name] for name, _, _ in wanted}


def shared_runs(out: Path, algos: list[str], seeds: dict[str, list[int]]) -> dict[str, str]:
    """Matched arms that would be the same runs as an earlier one — the baseline with the same setting and
    seeds (`pods` and `knapsack` both matched by groups of 16) — as {arm: the earlier arm whose runs it
    reads}. Such runs are trained once and read under both names."""
    path = out / "budget.json"
    if not path.exists() and not path.is_symlink():
        return {}
    plans = read_json(path, BudgetPlans)["arms"]
    first: dict[tuple, str] = {}
    same = {}
    for algo in algos:
        plan = plans.get(algo)
        if not isinstance(plan, dict) or "set" not in plan:
            continue
        key = (plan["set"], tuple(seeds.get(algo, ())))
        if key in first:
            same[algo] = first[key]
        else:
            first[key] = algo
    return same


def named_code(reward: str | None, overrides: tuple[str, ...]) -> Any:
    """The code this comparison names (its --reward, a --set credit.scheme=…): the only code a run of
    it that is resumed may run (train/run.py ResumeOptions; a run folder's own config names any). A run
    naming other code is refused with what compare can do: train it anew."""
    from t2i_gcpo.config import parse_set
    from t2i_gcpo.train.run import ResumeOptions

    sets = dict(parse_set(item) for item in overrides)
    reward = reward if reward is not None else sets.get("reward")
    credit = sets.get("credit.scheme")
    remedy = (
        "compare runs only the code its own --reward and --set credit.scheme=… name; remove {folder} and "
        "run the same command again to train that run anew"
    )
    return ResumeOptions(
        credit=credit if isinstance(credit, str) else None,
        reward=reward if isinstance(reward, str) else None,
        remedy=remedy,
    )


def train_command(
    algo: str,
    run_dir: Path,
    resumable: bool,
    flags: dict,
    steps: int,
    overrides: tuple[str, ...],
    named: Any = None,
) -> list[str]:
    """The `t2i-gcpo train` arguments that start (or resume) one run of a comparison (`algo`: its preset;
    `named`: the code a resumed run may run, `named_code`)."""
    if resumable:
        args = ["train", "--resume", str(run_dir), "--steps", str(steps)]
        for option, spec in (
            ("--credit", getattr(named, "credit", None)),
            ("--reward", getattr(named, "reward", None)),
        ):
            args += [option, spec] if spec is not None else []
        return args
    args = ["train", "--algo", algo]
    for key in ("prompts", "model", "reward", "out", "steps", "seed"):
        if flags.get(key) is not None:
            args += [f"--{key}", str(flags[key])]
    for item in overrides:
        args += ["--set", item]
    return args


def run_side_by_side(
    todo: list, steps: int, overrides: tuple[str, ...], jobs: int, named: Any = None
) -> None:
    """Train the runs `jobs` at a time, each a `t2i-gcpo train` process with cores/jobs threads (torch
    threads of side-by-side processes must not add up past the cores: oversubscribed, a step can take
    20× longer). Each run logs to <run>/train.log; a failed run is reported with its log's last lines.
    Ctrl-C or SIGTERM (`kill`, a scheduler) stops the children the same way, each saving a checkpoint,
    before this process exits: none is left training on its own."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from tqdm import tqdm

    from t2i_gcpo.errors import UserError

    threads = max(
        1, len(os.sched_getaffinity(0)) // jobs
    )  # the cores this process may use (taskset, cgroups)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    children, failed, starting, stopping = [], [], threading.Lock(), threading.Event()

    def train_one(preset: str, run_dir: Path, resumable: bool, flags: dict, own: tuple) -> int | None:
        """One run, its exit status (None: stopped before it started)."""
        cmd = [
            sys.executable,
            "-m",
            "t2i_gcpo.cli",
            *train_command(preset, run_dir, resumable, flags, steps, (*overrides, *own), named),
        ]
        with starting:  # no child starts once the comparison is stopping
            if stopping.is_set():
                return None
            with open_append(run_dir / "train.log", within=run_dir.parent.parent) as log:
                children.append(proc := subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
        return proc.wait()

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    bar = tqdm(
        total=len(todo), desc=f"runs ({jobs} side by side, {threads} thread(s) each)", dynamic_ncols=True
    )
    previous = signal.signal(signal.SIGTERM, stop)
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        futures = {pool.submit(train_one, *item): item[1] for item in todo}
        for future in as_completed(futures):
            run_dir, code = futures[future], future.result()
            bar.update(1)
            if code != 0:
                failed.append(run_dir)
                tail = (run_dir / "train.log").read_text(errors="replace").strip().splitlines()[-3:]
                bar.write(f"{run_dir}: failed (exit {code}): " + " | ".join(tail))
    except KeyboardInterrupt:
        running = sum(proc.poll() is None for proc in children)
        bar.write(
            f"stopping: {running} run(s) save a checkpoint; run the same command again to resume",
            file=sys.stderr,
        )
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        with starting:
            stopping.set()
        for proc in children:  # interrupted: stop the children (each saves a checkpoint first)
            if proc.poll() is None:
                proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)  # each thread returns once its child has exited
        bar.close()
    if failed:
        raise UserError(f"{len(failed)} run(s) failed: {', '.join(map(str, failed))} (see train.log in each)")


# the headline of a run's held-out evaluation, by task kind, and how the table names it
HEADLINES = ((M.EVAL_STRICT, "held-out strict score"), (M.EVAL_ACCURACY, "held-out accuracy (pass@1)"))


def headline_key(row: dict) -> str | None:
    """The held-out headline metric a run logs (strict for image tasks, accuracy for text)."""
    return next((k for k, _ in HEADLINES if row.get(k) is not None), None)


def read_metrics(run_dir: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl (none when it has not logged yet)."""
    path = run_dir / "metrics.jsonl"
    return read_jsonl(path, MetricsRow) if path.exists() or path.is_symlink() else []


def eval_curve(rows: list[dict]) -> list[tuple[int, float]]:
    """(step, held-out headline) of a run's metric rows, in step order (the last row for a repeated
    step wins)."""
    points: dict[int, float] = {}
    for r in rows:
        key = headline_key(r)
        if key is not None:
            points[r[M.STEP]] = r[key]
    return sorted(points.items())


def final_scores(run_dir: Path) -> dict:
    """A finished run's held-out scores (its eval.json); a UserError saying what to do when it has none."""
    from t2i_gcpo.errors import UserError

    path = run_dir / "eval.json"
    if not path.exists() and not path.is_symlink():
        raise UserError(
            f"{run_dir} has no eval.json (its final held-out scores); remove {run_dir} and run the "
            "same command again to train it anew"
        )
    final = read_json(path, dict[str, float | None])
    if headline_key(final) is None:
        raise UserError(
            f"{path} holds no held-out score ({' or '.join(k for k, _ in HEADLINES)}): a run without "
            "held-out prompts cannot be compared (give --set eval_prompts=FILE)"
        )
    return final


def training_mean(rows: list[dict], key: str) -> float:
    """Mean of a per-step training metric over a run's metric rows (NaN when it never logged it)."""
    vals = [r[key] for r in rows if r.get(key) is not None]
    return float(np.mean(vals)) if vals else np.nan


def summarise(
    out: Path, algos: list[str], seeds: list[int] | dict[str, list[int]], baseline: str | None = None
) -> dict[str, Any]:
    """Tabulate the finished runs out/<algo>/seed<k> (metrics.jsonl, eval.json) against `baseline`;
    write comparison.json, comparison.md and curves.png in `out`. `seeds`: one list for every
    algorithm, or each algorithm's own list (the paired differences use the seeds both runs have)."""
    baseline = check_baseline(algos, baseline)
    seeds = seed_lists(algos, seeds)
    same = shared_runs(out, algos, seeds)  # a matched arm that is an earlier one's runs reads those
    run_dirs = {a: [out / same.get(a, a) / f"seed{s}" for s in seeds[a]] for a in algos}
    metric_rows = {a: [read_metrics(r) for r in run_dirs[a]] for a in algos}
    finals = {a: [final_scores(r) for r in run_dirs[a]] for a in algos}
    curves = {a: [eval_curve(r) for r in metric_rows[a]] for a in algos}
    key = headline_key(finals[algos[0]][0]) or M.EVAL_STRICT
    if key == M.EVAL_STRICT:  # GenEval-style: one column per tag, where the credit went, then overall
        found = {
            k.split("/")[-1] for a in algos for f in finals[a] for k in f if k.startswith("eval/strict/")
        } - {"overall"}
        tags = [t for t in TAG_ORDER if t in found] + sorted(found - set(TAG_ORDER))
        columns = {t: (lambda f, r, t=t: f.get(f"eval/strict/{t}", np.nan)) for t in tags}
        columns["credit lift (training mean)"] = lambda f, r: training_mean(r, M.CREDIT_LIFT)
        columns["overall"] = lambda f, r: f[M.EVAL_STRICT]
    else:  # text: held-out accuracy and what goes with it, and where the credit went
        columns = {
            "pass@k": lambda f, r: f.get(M.EVAL_PASS_K, np.nan),
            "format": lambda f, r: f.get(M.EVAL_FORMAT_RATE, np.nan),
            "step lift (training mean)": lambda f, r: training_mean(r, M.STEP_LIFT),
            "overall": lambda f, r: f[M.EVAL_ACCURACY],
        }
    table: dict[str, dict[str, tuple[float, float, float, int]]] = {
        a: {c: mean_ci95([fn(f, r) for f, r in zip(finals[a], metric_rows[a])]) for c, fn in columns.items()}
        for a in algos
    }
    target = table[baseline]["overall"][0]
    # the first evaluation at or above the baseline's mean final, averaged over the seeds that get there;
    # how many do is kept beside it (a mean over 2 of 5 seeds is not a faster scheme)
    reach: dict[str, float | None] = {}
    reaching: dict[str, list[int]] = {}
    for a in algos:
        hits = []
        for curve in curves[a]:
            steps_hit = [step for step, v in curve if v >= target - 1e-9]
            hits.append(steps_hit[0] if steps_hit else np.nan)
        reach[a] = float(np.nanmean(hits)) if not all(np.isnan(hits)) else None
        reaching[a] = [int(np.sum(~np.isnan(hits))), len(hits)]
    headline = {
        a: {s: columns["overall"](f, r) for s, f, r in zip(seeds[a], finals[a], metric_rows[a])}
        for a in algos
    }
    label = dict(HEADLINES)[key]
    by_seed = {a: dict(zip(seeds[a], curves[a])) for a in algos}
    result = {
        "metric": label,
        "columns": list(columns),
        "table": table,
        "baseline": baseline,
        "steps_to_baseline_final": reach,
        "seeds_reaching_baseline_final": reaching,
        "paired": paired_differences(headline, baseline),
        "paired_by_step": paired_by_step(by_seed, baseline),
        "gain_over_start": gain_over_start(by_seed),
        "curves": {a: {str(s): c for s, c in by_seed[a].items()} for a in algos},
        "seeds": list(dict.fromkeys(s for a in algos for s in seeds[a])),
        "seeds_of": seeds,
        "same_runs": same,
    }
    result.update(budget_readings(out, algos, seeds, baseline, metric_rows, by_seed, headline))
    write_file(
        out / "comparison.json", json.dumps(strict_json(result), indent=1, allow_nan=False), within=out
    )
    write_file(out / "comparison.md", format_table(result), within=out)
    plot_curves(curves, out / "curves.png", label)
    return result


def budget_readings(
    out: Path,
    algos: list[str],
    seeds: dict[str, list[int]],
    baseline: str,
    metric_rows: dict[str, list[list[dict]]],
    by_seed: dict[str, dict[int, list]],
    headline: dict[str, dict[int, float]],
) -> dict[str, Any]:
    """What each arm spent (samples, tokens, reward calls, training seconds: means over its seeds), the
    equal-time reading, and — for a comparison with matched arms (out/budget.json) — the equal-sample and
    equal-token ones."""
    from t2i_gcpo.studies import budget as B

    spent = {a: [B.totals(rows) for rows in metric_rows[a]] for a in algos}
    readings: dict[str, Any] = {
        "budget": {a: {k: float(np.mean([t[k] for t in spent[a]])) for k in spent[a][0]} for a in algos}
    }
    if all(t["seconds"] > 0 for a in algos for t in spent[a]):
        clocks = {a: {s: B.training_clock(rows) for s, rows in zip(seeds[a], metric_rows[a])} for a in algos}
        readings["equal_time"] = B.equal_time(by_seed, clocks, baseline)
    path = out / "budget.json"
    if path.exists() or path.is_symlink():
        plans = read_json(path, BudgetPlans)["arms"]
        for unit, metric in B.UNITS.items():  # plans of earlier versions have no unit: samples
            matches = {
                m: p["of"] for m, p in plans.items() if m in algos and p.get("unit", "samples") == unit
            }
            if matches:
                clocks = {
                    a: {s: B.samples_clock(rows, metric) for s, rows in zip(seeds[a], metric_rows[a])}
                    for a in algos
                }
                readings[f"equal_{unit}"] = B.equal_samples(by_seed, clocks, matches)
    return readings


def format_budget(result: dict[str, Any]) -> list[str]:
    """comparison.md's budget table and its equal-sample and equal-time readings."""
    if "budget" not in result:
        return []
    baseline = result["baseline"]
    lines = [
        "",
        "What each run spent (mean over its seeds): samples scored, tokens sampled and reward calls "
        "(continuations included), and training time (held-out evaluations excluded):",
        "",
        "| algorithm | samples | tokens | reward calls | training time (s) |",
        "|---|---|---|---|---|",
    ]
    for algo, b in result["budget"].items():
        cells = [_count(b[M.BUDGET_SAMPLES]), _count(b[M.BUDGET_TOKENS]), _count(b[M.BUDGET_REWARD_CALLS])]
        lines.append(f"| {algo} | " + " | ".join(cells) + f" | {b['seconds']:.0f} |")
    for unit in ("samples", "tokens"):
        if not result.get(f"equal_{unit}"):
            continue
        what = (
            "samples the thriftier run of the seed scored"
            if unit == "samples"
            else "tokens the thriftier run of the seed sampled"
        )
        lines += [
            "",
            f"**At equal {unit}**: the algorithm minus the baseline trained at its {unit[:-1]} budget, "
            f"paired by seed, both read at their last evaluation by the {what} in all, + 5 % (the steps "
            f"read, mean over seeds), and at their last evaluations with what the matched arm spent there "
            f"(× the algorithm's {unit}):",
            "",
            "| algorithm | against | at equal " + unit + " | read at steps | seeds ahead | last evaluations "
            "| matched arm spent |",
            "|---|---|---|---|---|---|---|",
        ]
        for algo, r in result[f"equal_{unit}"].items():
            steps = " / ".join(
                "—" if v is None or not np.isfinite(v) else f"{v:.0f}" for v in r["read_at_step"].values()
            )
            spent = "—" if r["spent_ratio"] is None else f"{r['spent_ratio']:.2f}×"
            lines.append(
                f"| {algo} | {r['against']} | {_cell(*r['paired'][:3], sign=True)} | {steps} "
                f"| {r['ahead']}/{r['paired'][3]} | {_cell(*r['final'][:3], sign=True)} | {spent} |"
            )
    if result.get("equal_time"):
        t = result["equal_time"]
        secs = ", ".join(f"seed {s}: {v:.0f} s" for s, v in t["seconds"].items())
        lines += [
            "",
            f"**At equal training time** — the fastest run's of each seed ({secs}); each run read at "
            f"its last evaluation by then, minus {baseline}'s, paired by seed:",
            "",
            "| algorithm | score | paired Δ | seeds ahead |",
            "|---|---|---|---|",
        ]
        for algo, score in t["score"].items():
            p = t["paired"].get(algo)
            delta = "—" if p is None else _cell(*p["paired"][:3], sign=True)
            ahead = "—" if p is None else f"{p['ahead']}/{p['paired'][3]}"
            lines.append(f"| {algo} | {_cell(*score[:3])} | {delta} | {ahead} |")
    return lines


def _count(x: float) -> str:
    return "—" if x is None or not np.isfinite(x) else f"{x:,.0f}"


def paired_differences(final: dict[str, dict[int, float]], baseline: str) -> dict[str, Any]:
    """Each other algorithm's final score minus the baseline's, from `final` (algo → seed → score): per
    seed d_s (seeds where both scores exist), their mean with its Student-t 95 % interval and count
    ("paired"), and the difference of the means over all of each one's seeds with Welch's 95 %
    interval ("unpaired")."""
    base = final[baseline]
    out = {}
    for algo, scores in final.items():
        if algo == baseline:
            continue
        per_seed = {
            str(s): a - base[s]
            for s, a in scores.items()
            if s in base and np.isfinite(a) and np.isfinite(base[s])
        }
        out[algo] = {
            "paired": mean_ci95(per_seed.values()),
            "unpaired": welch_ci95(list(scores.values()), list(base.values())),
            "per_seed": per_seed,
        }
    return out


def paired_by_step(curves: dict[str, dict[int, list[tuple[int, float]]]], baseline: str) -> dict[str, Any]:
    """Each other algorithm minus the baseline at every evaluation step both runs of a seed reached:
    algo → step → the mean of the per-seed differences with its Student-t 95 % interval and count. At
    step 0 the two runs of a seed hold the same weights and draw the same held-out samples, so the
    difference is exactly 0 when the pairing works."""
    base = {s: dict(c) for s, c in curves[baseline].items()}
    out: dict[str, Any] = {}
    for algo, runs in curves.items():
        if algo == baseline:
            continue
        diffs: dict[int, list[float]] = {}
        for seed, curve in runs.items():
            for step, v in curve:
                if step in base.get(seed, {}):
                    diffs.setdefault(step, []).append(v - base[seed][step])
        out[algo] = {step: mean_ci95(d) for step, d in sorted(diffs.items())}
    return out


def gain_over_start(curves: dict[str, dict[int, list[tuple[int, float]]]]) -> dict[str, Any]:
    """Each algorithm's last evaluation minus its step-0 one, over the seeds whose curve has both: the
    mean with its Student-t 95 % interval and count (does RL move the model at all?)."""
    return {
        algo: mean_ci95([c[-1][1] - c[0][1] for c in runs.values() if len(c) > 1 and c[0][0] == 0])
        for algo, runs in curves.items()
    }


def format_curves(result: dict[str, Any]) -> list[str]:
    """comparison.md's per-run table (the headline at every evaluation) and the paired differences
    against the baseline at every evaluation, with each algorithm's gain over its own start."""
    curves, baseline = result["curves"], result["baseline"]
    steps = sorted({step for runs in curves.values() for c in runs.values() for step, _ in c})
    if not steps:
        return []
    lines = [
        "",
        f"{result['metric']} per run at each evaluation:",
        "",
        "| run | " + " | ".join(f"step {s}" for s in steps) + " |",
        "|" + "---|" * (len(steps) + 1),
    ]
    for algo, runs in curves.items():
        for seed, curve in runs.items():
            points = dict(curve)
            cells = [_cell(points[s], np.nan, np.nan) if s in points else "—" for s in steps]
            lines.append(f"| {algo} seed {seed} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Paired with {baseline} at each evaluation (mean of the per-seed differences ± half-width "
        "of its 95 % interval; step 0 reads +0.000 when the runs of a seed share their start and "
        "their held-out draws), and each algorithm's last evaluation minus its own step 0:",
        "",
        "| algorithm | " + " | ".join(f"step {s}" for s in steps) + " | gain over its own start |",
        "|" + "---|" * (len(steps) + 2),
    ]
    for algo, gain in result["gain_over_start"].items():
        by_step = {int(s): v for s, v in result["paired_by_step"].get(algo, {}).items()}  # JSON keys: str
        cells = [
            "—" if algo == baseline or s not in by_step else _cell(*by_step[s][:3], sign=True) for s in steps
        ]
        lines.append(f"| {algo} | " + " | ".join(cells) + f" | {_cell(*gain[:3], sign=True)} |")
    return lines


def format_table(result: dict[str, Any]) -> str:
    """comparison.md: the score table, then each algorithm's final score against the baseline's."""
    columns, baseline, seeds = result["columns"], result["baseline"], result["seeds"]
    head = "| algorithm | " + " | ".join(columns) + f" | steps to {baseline}'s final |"
    lines = [head, "|" + "---|" * (len(columns) + 2)]
    for algo, row in result["table"].items():
        cells = [_cell(*row[c][:3]) for c in columns]
        reach = result["steps_to_baseline_final"].get(algo)
        hit, total = result["seeds_reaching_baseline_final"][algo]
        when = "—" if reach is None else f"{reach:.0f} ({hit}/{total} seeds)"
        lines.append(f"| {algo} | " + " | ".join(cells) + f" | {when} |")
    lines.append(
        f"\n{result['metric']} (overall), mean ± half-width of the 95 % interval over {len(seeds)} seed(s) "
        f"({', '.join(map(str, seeds))})"
    )
    fewer = {a: s for a, s in result.get("seeds_of", {}).items() if s != seeds}
    if fewer:  # algorithms given fewer seeds (--algos NAME@N)
        lines[-1] += "; " + "; ".join(f"{a}: {len(s)} ({', '.join(map(str, s))})" for a, s in fewer.items())
    lines[-1] += (
        f". Steps to {baseline}'s final: the first evaluation step at or above {baseline}'s mean "
        f"final score, averaged over the seeds that reach it (how many do, in brackets)."
    )
    for algo, source in result.get("same_runs", {}).items():
        lines[-1] += f" {algo}: the runs of {source} (the same settings and seeds, trained once)."
    if result["paired"]:
        lines += [
            "",
            f"| algorithm | paired Δ vs {baseline} | unpaired Δ | seeds ahead |",
            "|---|---|---|---|",
        ]
        for algo, p in result["paired"].items():
            ahead = sum(d > 0 for d in p["per_seed"].values())
            lines.append(
                f"| {algo} | {_cell(*p['paired'][:3], sign=True)} | {_cell(*p['unpaired'], sign=True)} "
                f"| {ahead}/{p['paired'][3]} |"
            )
        lines.append(
            f"\nΔ: final overall minus {baseline}'s. Paired: mean over seeds of the difference between the "
            f"two runs with the same seed, which share the prompt stream, the sampling seeds and the "
            f"held-out draws (Student-t 95 % interval); unpaired: difference of the means (Welch 95 % "
            f"interval). Seeds ahead: seeds where the algorithm ends above {baseline}."
        )
    return "\n".join(lines + format_budget(result) + format_curves(result))


def plot_curves(
    curves: dict[str, list[list[tuple[int, float]]]], path: Path, label: str = "held-out strict score"
) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for algo, runs in curves.items():
        steps = sorted({s for run in runs for s, _ in run})
        if not steps:
            continue
        grid = np.full((len(runs), len(steps)), np.nan)
        for i, run in enumerate(runs):
            for s, v in run:
                grid[i, steps.index(s)] = v
        stats = [mean_ci95(grid[:, j]) for j in range(len(steps))]
        mean = np.array([m for m, _, _, _ in stats])
        lo = np.array([lo for _, lo, _, _ in stats])
        hi = np.array([hi for _, _, hi, _ in stats])
        ax.plot(steps, mean, label=algo, lw=2)
        ax.fill_between(
            steps, np.where(np.isfinite(lo), lo, mean), np.where(np.isfinite(hi), hi, mean), alpha=0.2
        )
    ax.set_xlabel("step")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    write_file(path, lambda f: fig.savefig(f, format="png"), within=path.parent)
