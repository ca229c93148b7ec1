"""`kill -9` mid-run, then `--resume`, ends where the run that was never stopped ends — bit for bit, for every
preset, with scoring overlapped with sampling (reward_options.overlap), and with the reward scored by a reward
server (`remote:`; issue 59). At the level of the command line: a `t2i-gcpo train` process killed with SIGKILL
once a checkpoint is on disk, resumed with `t2i-gcpo train --resume`, against the same command run through."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from t2i_gcpo.config import ALGORITHMS
from t2i_gcpo.train.checkpoint import latest_checkpoint

from reward_fixtures import free_port
from tiny_models import build_tiny_masked, tiny_policy_dir
from train_fixtures import write_prompt_file

TESTS = Path(__file__).resolve().parents[1]
STEPS = 3
FAST = [
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.cfg_scale=2",
    "optim.lr=3e-3",
    "sample_every=0",
    "save_every=1",
    "eval_every=-1",
    "rollout.autocast=none",
    "optim.autocast=none",
]
EXTRA = {
    "vine": ["branching.k=5"],
    "tree": ["branching.k=2"],
}  # branch points within the tiny prior's 16 tokens


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("kill")
    return {
        "ar": str(tiny_policy_dir(root)),
        "masked": "masked:" + build_tiny_masked(root),
        "prompts": str(write_prompt_file(root / "p.jsonl")),
    }


def environment(slow: bool) -> dict:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": str(torch.get_num_threads()),
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    if slow:
        env["T2I_TEST_SLOW_REWARD"] = "1"
    else:
        env.pop("T2I_TEST_SLOW_REWARD", None)
    return env


def cli(*args: str, slow: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "t2i_gcpo.cli", *args],
        env=environment(slow),
        capture_output=True,
        text=True,
        timeout=900,
    )


def killed(args: list[str], out: Path, after: int) -> None:
    """`t2i-gcpo train ARGS`, killed with SIGKILL once the checkpoint of step `after` is complete."""
    p = subprocess.Popen(
        [sys.executable, "-m", "t2i_gcpo.cli", "train", *args],
        env=environment(slow=True),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 600
    while time.time() < deadline and p.poll() is None:
        saved = latest_checkpoint(out) if out.exists() else None
        if saved is not None and int(saved.name[5:]) >= after:
            break
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)  # no handler, no last save: what is on disk is all there is
    _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL, err[-2000:]
    done = int(latest_checkpoint(out).name[5:])
    assert after <= done < STEPS, done


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_same(full: Path, part: Path) -> None:
    a, b = rows(full), rows(part)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1))
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if not k.startswith("time/")} == {
            k: v for k, v in y.items() if not k.startswith("time/")
        }, x["step"]
    last = f"checkpoints/step_{STEPS:06d}/model"
    files = sorted(p.relative_to(full / last) for p in (full / last).rglob("*.safetensors"))
    assert files
    for f in files:
        wa, wb = load_file(str(full / last / f)), load_file(str(part / last / f))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), f


def kill_and_resume(tmp_path: Path, args: list[str], resume_args: tuple[str, ...] = ()) -> None:
    full, part = tmp_path / "full", tmp_path / "part"
    done = cli("train", *args, "--out", str(full), "--steps", str(STEPS))
    assert done.returncode == 0, done.stderr[-2000:]
    killed([*args, "--out", str(part), "--steps", str(STEPS)], part, after=1)
    done = cli("train", "--resume", str(part), *resume_args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_same(full, part)


def base_args(tiny: dict, algo: str, reward: str = "repro_fixtures:slow_redness") -> list[str]:
    model = tiny["masked"] if algo == "stepwise" else tiny["ar"]
    args = [
        "--algo",
        algo,
        "--prompts",
        tiny["prompts"],
        "--model",
        model,
        "--reward",
        reward,
        "--seed",
        "0",
        "--report-to",
        "none",
    ]
    for kv in (*FAST, *EXTRA.get(algo, [])):
        args += ["--set", kv]
    return args


@pytest.mark.slow  # three processes a preset, a killed one among them
@pytest.mark.parametrize("algo", ALGORITHMS)
def test_every_preset_resumes_bit_identically_after_kill_9(algo, tiny, tmp_path):
    kill_and_resume(tmp_path, base_args(tiny, algo), ("--trust-run-code",))


@pytest.mark.slow
def test_overlapped_scoring_resumes_bit_identically_after_kill_9(tiny, tmp_path):
    """Scoring in a thread while the next chunk samples (one-group chunks)."""
    args = [
        *base_args(tiny, "dapo"),
        "--set",
        "reward_options.overlap=true",
        "--set",
        "reward_options.chunk=4",
    ]
    kill_and_resume(tmp_path, args, ("--trust-run-code",))


@pytest.mark.slow
def test_a_run_scored_by_a_reward_server_resumes_bit_identically_after_kill_9(tiny, tmp_path):
    """`t2i-gcpo reward-server` serving the slow reward in its own process; the runs name it `remote:URL`, the
    killed one and its resume the same server, overlapped with sampling as well."""
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "t2i_gcpo.cli",
            "reward-server",
            "--reward",
            "repro_fixtures:slow_redness",
            "--port",
            str(port),
            "--device",
            "cpu",
            "--quiet",
        ],
        env=environment(slow=True),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail(
                f"the reward server did not answer: "
                f"{server.stderr.read()[-2000:] if server.poll() is not None else ''}"
            )
        args = [*base_args(tiny, "dapo", reward=f"remote:{url}"), "--set", "reward_options.overlap=true"]
        kill_and_resume(tmp_path, args)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
