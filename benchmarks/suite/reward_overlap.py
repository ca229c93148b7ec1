"""Section `reward_overlap`: scoring overlapped with sampling, and what a reward server on loopback costs
(docs/guides/rewards.md#at-scale).

Overlap. DAPO steps (dynamic sampling off: one round of P prompts × G images a step) of the shipped ShapeWorld
AR prior with a deliberately slow reward, `SleepReward`: ``time.sleep(t)``, t the time the rollout call that
sampled its images took (`Mirror`), then the images' mean brightness as the score — scoring takes as long as
sampling, chunk by chunk, by construction (a constant calibrated once drifted with the load of a shared
machine). It stands in for a reward model on a device of its own: a sleep takes no CPU from the sampler and
releases the GIL. (A reward computed in Python on the CPU, ShapeWorld's detector, would compete with the
sampler for the GIL.) Three
trainers, their steps round-robin after one warm-up step each:

- ``whole``: the default, the round sampled in one rollout call, then scored;
- ``chunked``: ``reward_options.chunk = G`` (one group per rollout call, P calls), each chunk scored when it
  is sampled — a rollout split as model_options.max_rollout_batch splits a Janus one;
- ``overlapped``: the same chunks with ``reward_options.overlap``: each scored while the next samples.

Reported per trainer, the best of the timed steps (on a machine shared with other jobs a step sometimes
takes ten times another; the best is the step the others left alone): sampling (time/rollout; the sleep equals
it), sample + score (the step's wall time minus its update: what overlap acts on), the update, the whole step,
and the ratios to ``chunked`` (the same rollout calls: what overlap alone buys; ideally (1 + 1/P) /
2) and to ``whole``.

Server. Seconds per call of 64 rendered ShapeWorld scenes scored in process and through ``remote:`` to a
``t2i-gcpo reward-server`` in a process of its own on loopback: `shapeworld` on its 32 × 32 images, and at
384 × 384 (the scenes upscaled; Janus-Pro's size: what PNG encoding, base64 and HTTP cost) a reward that only
averages pixels (`brightness`), so the difference is the transport. Best of the repeats after a warm-up call.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

from benchmarks.suite.common import REPO, Context, load_average, shared_cpu_note

TITLE = "Rewards placed elsewhere: scoring overlapped with sampling, a reward server (`reward_overlap`)"
TARGET = 0.6  # overlapped sample + score / chunked, when scoring takes as long as sampling


class Mirror:
    """The slow reward's clock: the policy's rollout calls timed, in order (a FIFO: chunks are scored in the
    order they were sampled)."""

    def __init__(self, policy: Any):
        self.durations: collections.deque[float] = collections.deque()
        inner = policy.rollout

        def rollout(*args: Any, **kwargs: Any) -> Any:
            tic = time.perf_counter()
            out = inner(*args, **kwargs)
            self.durations.append(time.perf_counter() - tic)
            return out

        policy.rollout = rollout  # an instance attribute: this trainer's policy only


class SleepReward:
    """Sleeps as long as the rollout call that sampled its images took, then scores their `brightness`."""

    name = "sleep"

    def __init__(self, mirror: Mirror):
        self.mirror = mirror

    def __call__(self, images: Any, prompts: list[str], metadata: list[dict]) -> Any:
        time.sleep(self.mirror.durations.popleft())
        return brightness(images, prompts, metadata)


def brightness(images: Any, prompts: list[str], metadata: list[dict]) -> Any:
    """The mean of each image's pixels: a reward that costs nothing, to time the transport."""
    return torch.as_tensor(images).float().mean((1, 2, 3))


def overlap_rows(ctx: Context) -> tuple[list[dict], dict]:
    from benchmarks.bench_train_step import make_trainer, round_robin
    from t2i_gcpo.rewards.combine import Checked
    from t2i_gcpo.train.distributed import unwrap

    P, G, steps = 8, ctx.pick(4, 8), ctx.pick(3, 6)
    base = [f"rollout.prompts_per_step={P}", f"rollout.group_size={G}"]
    chunks = [*base, f"reward_options.chunk={G}"]
    configs = {"whole": base, "chunked": chunks, "overlapped": [*chunks, "reward_options.overlap=true"]}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {
            n: make_trainer("dapo", "shapeworld", 1 + steps, sets, tmp, n) for n, sets in configs.items()
        }
        for trainer in trainers.values():
            policy = unwrap(trainer.policy)
            trainer.reward = Checked(SleepReward(Mirror(policy)))
        by_trainer = round_robin(trainers, steps, warmup=1)
        precision = trainers["whole"].cfg.rollout.autocast
    rows = []
    for name, rs in by_trainer.items():
        best = {k: min(r[k] for r in rs) for k in ("time/rollout", "time/update", "time/step")}
        rows.append(
            {
                "trainer": name,
                "calls": 1 if name == "whole" else P,
                "images": P * G,
                "precision": precision,
                "rollout": best["time/rollout"],
                "update": best["time/update"],
                "step": best["time/step"],
                "sample_score": min(r["time/step"] - r["time/update"] for r in rs),
            }
        )
    by = {r["trainer"]: r for r in rows}
    for r in rows:
        r["vs_chunked"] = r["sample_score"] / by["chunked"]["sample_score"]
        r["vs_whole"] = r["sample_score"] / by["whole"]["sample_score"]
        r["step_vs_chunked"] = r["step"] / by["chunked"]["step"]
    return rows, {"steps": steps, "P": P, "G": G}


def start_server(spec: str) -> tuple[subprocess.Popen, str]:
    """`t2i-gcpo reward-server` for `spec` in a process of its own on a free loopback port: (process, URL)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        "-m",
        "t2i_gcpo.cli",
        "reward-server",
        "--reward",
        spec,
        "--port",
        "0",
        "--quiet",
        "--device",
        "cpu",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    line = proc.stdout.readline()
    if "serving" not in line:
        proc.kill()
        raise RuntimeError(f"the reward server did not start: {line} {proc.stderr.read()[-500:]}")
    return proc, line.split(" on ")[1].split(";")[0]


def server_rows(ctx: Context) -> list[dict]:
    import numpy as np

    from t2i_gcpo.rewards.registry import build_reward
    from t2i_gcpo.worlds.shapeworld import generate_metadata, render, sample_scene

    n, repeats = 64, ctx.pick(2, 3)
    meta, rng = generate_metadata(n, seed=0), np.random.default_rng(0)
    prompts = [m["prompt"] for m in meta]
    scenes = torch.stack(
        [torch.from_numpy(render(sample_scene(m, rng))).permute(2, 0, 1).float() / 255 for m in meta]
    )
    rows = []
    for spec, name, size in (("shapeworld", "shapeworld", 32), (f"{__file__}:brightness", "brightness", 384)):
        images = scenes if size == scenes.shape[-1] else torch.nn.functional.interpolate(scenes, size=size)
        proc, url = start_server(spec)
        try:
            timed = {}
            for where, reward in (
                ("in process", build_reward(spec, grid=(8, 8))),
                ("remote (loopback)", build_reward(f"remote:{url}", grid=(8, 8))),
            ):
                reward(images, prompts, meta)  # warm-up
                best = float("inf")
                for _ in range(repeats):
                    tic = time.perf_counter()
                    reward(images, prompts, meta)
                    best = min(best, time.perf_counter() - tic)
                timed[where] = best
        finally:
            proc.kill()
            proc.wait()
        extra = (timed["remote (loopback)"] - timed["in process"]) / n * 1000
        for where, seconds in timed.items():
            rows.append(
                {
                    "reward": name,
                    "image": f"{size} px",
                    "where": where,
                    "images": n,
                    "seconds": seconds,
                    "images_per_s": n / seconds,
                    "overhead_ms": extra if where != "in process" else 0.0,
                }
            )
    return rows


def run(ctx: Context) -> dict:
    load = load_average()
    overlap, info = overlap_rows(ctx)
    served = server_rows(ctx)
    by = {r["trainer"]: r for r in overlap}
    ratio, whole = by["overlapped"]["vs_chunked"], by["overlapped"]["vs_whole"]
    step, cost = by["overlapped"]["step_vs_chunked"], by["chunked"]["rollout"] / by["whole"]["rollout"]
    remote = {r["reward"]: r for r in served if r["where"] != "in process"}
    reading = (
        f"With a reward that takes as long as sampling (a sleep as long as the rollout call, in for a reward "
        f"model on a device of its own; sampling on {ctx.threads} torch thread(s)), scoring each of the "
        f"{info['P']} chunks while the next samples takes a step's sample + score to {ratio:.2f}× the same "
        f"chunks scored after each (target ≤ {TARGET}: {'pass' if ratio <= TARGET else 'fail'}; the ideal is "
        f"(1 + 1/{info['P']}) / 2 = {(1 + 1 / info['P']) / 2:.2f}), and the whole step, whose update overlap "
        f"does not touch, to {step:.2f}×. Against the default — the round sampled in one call — sample + "
        f"score is {whole:.2f}×: on this CPU the AR sampler pays a fixed cost per call, so {info['P']} calls "
        f"of {info['G']} images sample in {cost:.2f}× the time of one call of {info['P'] * info['G']}. "
        f"Overlap pays where the rollout is split anyway (model_options.max_rollout_batch, a GPU whose "
        f"memory does not hold the batch) or sampling is compute-bound, and where the reward takes no CPU "
        f"from the sampler (its own GPU, a server). Through a reward server on loopback an image costs "
        f"{remote['shapeworld']['overhead_ms']:.2f} ms more at 32 px and "
        f"{remote['brightness']['overhead_ms']:.2f} ms more at 384 px (PNG, base64, HTTP, decoding), against "
        "seconds per image for PickScore or HPS on this CPU (section rewards)." + shared_cpu_note(load)
    )
    return {
        "title": TITLE,
        "timing": f"best of {info['steps']} DAPO steps per trainer after a warm-up step, trainers "
        f"round-robin, the shipped ShapeWorld prior at its 'auto' precision; server (the summary's `server` "
        f"rows): best of the repeats of one call of 64 images after a warm-up call",
        "columns": [
            ("trainer", "trainer"),
            ("calls", "rollout calls"),
            ("images", "images"),
            ("precision", "sampling"),
            ("rollout", "sampling s = scoring s"),
            ("sample_score", "sample + score s"),
            ("update", "update s"),
            ("step", "step s"),
            ("vs_chunked", "sample + score / chunked"),
            ("vs_whole", "sample + score / whole"),
            ("step_vs_chunked", "step / chunked"),
        ],
        "rows": overlap,
        "summary": {
            "overlapped_vs_chunked": ratio,
            "overlapped_vs_whole": whole,
            "step_vs_chunked": step,
            "target": TARGET,
            "pass": ratio <= TARGET,
            "chunk_cost": cost,
            "server": served,
            "load_average": load,
        },
        "reading": reading,
    }
