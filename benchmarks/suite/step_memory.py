"""Section `step_memory`: the memory model's estimate of a step's peak against the peak measured, on each path
(train/draws.py; docs/performance.md#step-memory).

Per path — the ShapeWorld AR prior's groups (`grpo`), its budget allocation (`pods`), its continuations
(`vine`) and tree groups (`tree`); the masked prior's groups and its step predictions (`stepwise`); the
arithmetic text model's groups and tree groups — one fresh process plans the run as `t2i-gcpo train` does (the
estimate: the plan's, from the profile measured on the model before the run) and then runs its first step,
measured as the plan measures: the peak resident size (CPU; VmHWM reset through /proc/self/clear_refs, the
heap trimmed first) or the CUDA allocator's peak above the memory held before the step's collection, over its
collection and its update. float32 (rollout.autocast and optim.autocast none); the counts are each path's
preset at a small P·G, so that a path runs in about a minute on two CPU threads.

    python -m benchmarks --only step_memory

One path alone (what tests/train/test_draws.py runs at tiny shapes):

    python -m benchmarks.suite.step_memory \
        '{"algo": "grpo", "model": "shapeworld", "set": ["rollout.group_size=8"]}'
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.suite.common import Context, load_average, shared_cpu_note

TITLE = "Step memory: the memory model against a measured peak (`step_memory`) {#step-memory}"
REPO = Path(__file__).resolve().parents[2]
# float32, and every group trained (dynamic sampling off): the estimate bounds a step whose
# groups all have signal
FLOAT32 = [
    "rollout.autocast=none",
    "optim.autocast=none",
    "eval_every=-1",
    "sample_every=0",
    "save_every=100",
    "advantage.dynamic_sampling=false",
]

# path → (algo, model, overrides): each preset at a small P·G
PATHS = {
    "AR groups": ("grpo", "shapeworld", ["rollout.prompts_per_step=8", "rollout.group_size=8"]),
    "AR allocation": ("pods", "shapeworld", ["rollout.prompts_per_step=8", "rollout.group_size=4"]),
    "AR continuations": ("vine", "shapeworld", ["rollout.prompts_per_step=4", "rollout.group_size=4"]),
    "AR tree groups": ("tree", "shapeworld", ["rollout.prompts_per_step=4", "rollout.group_size=4"]),
    "masked groups": ("grpo", "shapeworld-masked", ["rollout.prompts_per_step=8", "rollout.group_size=8"]),
    "masked step predictions": (
        "stepwise",
        "shapeworld-masked",
        ["rollout.prompts_per_step=4", "rollout.group_size=4"],
    ),
    "text groups": ("grpo", "arithmetic", ["rollout.prompts_per_step=8", "rollout.group_size=8"]),
    "text tree groups": ("tree", "arithmetic", ["rollout.prompts_per_step=4", "rollout.group_size=4"]),
}
PROMPTS = {"arithmetic": "prompts/arithmetic_train.jsonl"}


def measure(spec: dict) -> dict:
    """In this process: plan the run of `spec` ({"algo", "model", "prompts", "set": [overrides], "out"}) and
    run its first step → {"estimate_mb", "measured_mb", "collect_mb", "update_mb", "largest", "parts_mb",
    "samples"}: measured, the peak above the memory held right before the step (the heap trimmed first)."""
    import tempfile

    import torch

    import t2i_gcpo.train.collect as collect_mod
    import t2i_gcpo.train.trainer as trainer_mod
    from t2i_gcpo.train.draws import _status, _trim
    from t2i_gcpo.train.run import prepare, run

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    cuda = torch.cuda.is_available()
    marks: dict[str, float] = {}

    def now() -> float:
        return float(torch.cuda.memory_allocated() if cuda else _status("VmRSS") or 0)

    def peak() -> float:
        return float(torch.cuda.max_memory_allocated() if cuda else _status("VmHWM") or 0)

    def reset() -> None:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")

    collect, train_step = collect_mod.BatchCollector.collect, trainer_mod.Trainer.train_step

    def measured_collect(self, *args, **kwargs):
        got = collect(self, *args, **kwargs)
        marks["collect"] = peak() - marks["base"]
        reset()
        return got

    def measured_step(self, step):
        _trim()
        marks["base"] = now()
        reset()
        row = train_step(self, step)
        marks["update"] = peak() - marks["base"]
        return row

    out = spec.get("out") or tempfile.mkdtemp(prefix="step-memory-")
    flags = {
        "prompts": spec.get("prompts") or PROMPTS.get(spec["model"], "prompts/shapeworld_train.txt"),
        "model": spec["model"],
        "steps": 1,
        "seed": 0,
        "report_to": "none",
        "out": str(Path(out) / "run"),
    }
    job = prepare(algo=spec["algo"], flags=flags, overrides=(*FLOAT32, *spec.get("set", [])))
    estimate = job.plan.memory
    collect_mod.BatchCollector.collect = measured_collect
    trainer_mod.Trainer.train_step = measured_step
    trainer_mod.Trainer._report = lambda self: None
    run(job)
    measured = max(marks["collect"], marks["update"])
    return {
        "estimate_mb": estimate.bytes / 2**20,
        "measured_mb": measured / 2**20,
        "collect_mb": marks["collect"] / 2**20,
        "update_mb": marks["update"] / 2**20,
        "largest": estimate.largest,
        "parts_mb": {k: v / 2**20 for k, v in estimate.parts.items()},
        "samples": job.plan.cost.samples,
    }


def measure_in_a_process(spec: dict, timeout: float = 1800) -> dict:
    """`measure(spec)` in a fresh process (nothing an earlier path allocated counts)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.suite.step_memory", json.dumps(spec)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"step_memory {spec}: exit {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(lines[-1])


def run(ctx: Context) -> dict:
    load = load_average()
    rows = []
    for path, (algo, model, overrides) in PATHS.items():
        got = measure_in_a_process({"algo": algo, "model": model, "set": overrides})
        rows.append(
            {
                "path": path,
                "algo": algo,
                "model": model,
                "samples": got["samples"],
                "estimate_mb": got["estimate_mb"],
                "measured_mb": got["measured_mb"],
                "ratio": got["estimate_mb"] / max(got["measured_mb"], 1e-9),
                "largest": got["largest"],
            }
        )
    worst = max(rows, key=lambda r: max(r["ratio"], 1 / r["ratio"]))
    reading = (
        "Before a run, the plan measures a profile of the run's model — a rollout of one group of 2 and of 4 "
        "samples from the first prompt (after one of 1, not counted), their decoding, a continuation of each "
        "from half-way where the scheme branches, and an update's forward and backward — as fixed bytes plus "
        "bytes per row, and puts a step together from the counts it draws (train/draws.py): held = trained "
        "rows × (an output + its record); sampling = the rows of a rollout pass; decoding = the outputs "
        "decoded at once; continuing = a continuation pass (every root's n from one point) + the round's "
        "continuations held; update = the P·G trained rows (tree groups: every leaf) / optim.minibatches; "
        "peak = (held + the largest of the others) × 1.3, the resident memory measured over the tensor "
        "bytes. A step above rollout.max_step_memory (null: the memory the process has free at the start) is "
        f"refused before the run. The estimate is within {max(worst['ratio'], 1 / worst['ratio']):.2f}× of "
        f"the measured peak on every path (the furthest: {worst['path']}, {worst['ratio']:.2f}×); "
        f"tests/train/test_draws.py holds it within 2× at tiny shapes. A reward's own memory (a model "
        f"reward's activations) is not in the estimate. " + shared_cpu_note(load)
    )
    return {
        "title": TITLE,
        "timing": "one step per path, each in a fresh process; float32",
        "columns": [
            ("path", "path"),
            ("algo", "algo"),
            ("model", "model"),
            ("samples", "samples a step"),
            ("estimate_mb", "estimate MB"),
            ("measured_mb", "measured peak MB"),
            ("ratio", "estimate / measured"),
            ("largest", "largest part"),
        ],
        "rows": rows,
        "summary": {"worst_ratio": worst["ratio"]},
        "reading": reading,
    }


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))))
