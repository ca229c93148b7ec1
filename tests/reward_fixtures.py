"""What the tests of rewards placed elsewhere share (tests/rewards/test_server.py, test_placement.py,
tests/train/test_reward_overlap.py, test_gdpo.py): a reward server on loopback in a thread, a tiny two-step
ShapeWorld run through `t2i-gcpo train`, its metrics and final weights, and rewards that are slow or
count their calls."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

TINY = [
    "--set",
    "rollout.prompts_per_step=2",
    "--set",
    "rollout.group_size=4",
    "--set",
    "rollout.cfg_scale=2",
    "--set",
    "optim.lr=3e-3",
    "--set",
    "sample_every=0",
    "--set",
    "eval_every=-1",
    "--report-to",
    "none",
]
TINY_GRID = (4, 4)  # the tiny prior's token grid (tests/tiny_models.py)


@contextmanager
def serving(spec: str = "shapeworld", port: int = 0, **options) -> Iterator[str]:
    """A reward server (t2i_gcpo/rewards/server.py) for `spec` on a loopback port (0: a free one), in a
    thread: its URL."""
    from t2i_gcpo.rewards.server import RewardService, make_server

    server = make_server(RewardService(spec, device="cpu", **options), "127.0.0.1", port, quiet=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(out: Path, model: str, prompts: str, *args: str, steps: int = 2) -> int:
    """`t2i-gcpo train` of the tiny prior into `out` in this process, without the HTML
    report: its exit code."""
    argv = ["--prompts", prompts, "--model", model, "--out", str(out), "--steps", str(steps), *TINY, *args]
    return command("train", *argv)


def resume(run: Path, steps: int) -> int:
    """`t2i-gcpo train --resume RUN --steps N` in this process, without the HTML report: its exit code."""
    return command("train", "--resume", str(run), "--steps", str(steps))


def command(*argv: str) -> int:
    import t2i_gcpo.train.trainer as trainer_mod
    from t2i_gcpo.cli import main

    report = trainer_mod.Trainer._report
    trainer_mod.Trainer._report = lambda self: None
    try:
        main(list(argv))
    except SystemExit as e:
        return int(e.code or 0)
    finally:
        trainer_mod.Trainer._report = report
    return 0


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    step = max(r["step"] for r in rows(run))
    return load_file(str(run / "checkpoints" / f"step_{step:06d}" / "model" / "prior" / "model.safetensors"))


def assert_same_run(one: Path, two: Path) -> None:
    """Metric for metric (timings aside) and tensor for tensor: the same run."""
    a, b = rows(one), rows(two)
    assert len(a) == len(b) and a, (len(a), len(b))
    for ra, rb in zip(a, b):
        same = {k: v for k, v in ra.items() if not k.startswith("time/")}
        assert same == {k: v for k, v in rb.items() if not k.startswith("time/")}, (ra, rb)
    wa, wb = final_weights(one), final_weights(two)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def slow_shapeworld(images, prompts, metadata):
    """The ShapeWorld reward on the tiny prior's grid, after SLOW_REWARD_SECONDS (default 0.3) of sleep."""
    from t2i_gcpo.rewards.forms.shapeworld import ShapeWorldReward

    time.sleep(float(os.environ.get("SLOW_REWARD_SECONDS", "0.3")))
    return ShapeWorldReward(grid=TINY_GRID)(images, prompts, metadata)


CALLS: list[int] = []  # the batch size of each call of `counted`


def counted(images, prompts, metadata):
    """Mean red per image; records each call's batch size in CALLS."""
    CALLS.append(len(prompts))
    return torch.as_tensor(images)[:, 0].mean((1, 2))


def scaled_red(images, prompts, metadata):
    """100 × the mean red of each image: a reward on another scale (GDPO's case)."""
    return 100 * torch.as_tensor(images)[:, 0].mean((1, 2))


def green(images, prompts, metadata):
    return torch.as_tensor(images)[:, 1].mean((1, 2))
