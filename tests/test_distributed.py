"""`t2i-gcpo train` under `accelerate launch` with two real CPU processes (gloo DDP)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from train_fixtures import tiny_policy_dir, write_prompt_file


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_ddp_run_keeps_replicas_equal(tmp_path):
    model = tiny_policy_dir(tmp_path)
    prompts = write_prompt_file(tmp_path / "p.jsonl")
    out = tmp_path / "run"
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--main_process_port", str(free_port()), "--mixed_precision", "no", "--dynamo_backend", "no",
        "-m", "t2i_gcpo.cli", "train", "--prompts", str(prompts), "--model", str(model),
        "--reward", "train_fixtures:redness", "--out", str(out), "--steps", "3", "--algo", "gcpo",
        "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=4", "--set", "eval_every=-1",
        "--set", "optim.lr=3e-3", "--set", "sample_every=0",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads((out / "processes.json").read_text())
    assert info["num_processes"] == 2, "two processes really ran"
    assert info["replicas_equal"], info
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
