"""`t2i-gcpo train` under `accelerate launch` with two real CPU processes (gloo): DDP and FSDP2.

Every run asserts processes.json says 2 processes and the expected `distributed_type`: accelerate
falls back silently (`--cpu --num_processes 2` runs ONE process; FSDP on CPU processes would run plain
DDP: the trainer refuses that launch, and `allow_fsdp_on_cpu` lets these tests run FSDP2 on CPU).

Two processes must train like one process on the same global batch: samples are seeded per prompt
slot (tasks/loop.py), so both see the same samples, and the loss normaliser is the global batch's
(train/distributed.global_denominator), so DDP's gradient average is the one-process gradient.
Tolerances (`assert_same_training`): float32 sums taken in another order (each process sums half the
tokens, gloo adds the halves) differ by ~1e-7 relative; AdamW divides by √v, which magnifies that
noise on near-zero gradient entries. Measured here: gradient norms agree to ≤ 2e-6, final weights to
≤ 4e-6 absolute (≤ 2e-5 of the update's norm). Asserted: grad norm 1e-4, reward mean 1e-6 (the same
samples), weights 1e-4 of the largest weight and 1e-3 of the update's norm. A per-process normaliser
(the bug this guards against) moved the text run's first grad norm by 1.1 %.

Run as a module (`python -m test_distributed train …`, tests/train/ and tests/ on PYTHONPATH) this file is
the CLI with accelerate's FSDP allowed on CPU processes.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from t2i_gcpo.resources import CONFIG_DIR, PROMPTS_DIR
from t2i_gcpo.train.tensor_tree import load_tree

from repo_paths import TESTS
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file

TINY = ["--reward", "train_fixtures:redness", "--set", "rollout.group_size=4", "--set", "optim.lr=3e-3"]
# the shipped arithmetic LM: completions of different lengths, so each process's token count differs
TEXT = [
    "--model",
    "arithmetic",
    "--prompts",
    str(PROMPTS_DIR / "arithmetic_train.jsonl"),
    "--reward",
    "arithmetic",
    "--algo",
    "dapo",
    "--set",
    "rollout.group_size=8",
    "--set",
    "optim.lr=3e-4",
]
COMMON = [
    "--steps",
    "3",
    "--set",
    "rollout.prompts_per_step=4",
    "--set",
    "advantage.dynamic_sampling=false",
    "--set",
    "eval_every=-1",
    "--set",
    "sample_every=0",
]
DDP = ["--multi_gpu"]
FSDP = ["--config_file", str(CONFIG_DIR / "accelerate" / "fsdp.yaml")]  # the shipped file


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment() -> dict[str, str]:
    return {
        **os.environ,
        "ACCELERATE_USE_CPU": "1",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent), str(TESTS), os.environ.get("PYTHONPATH", "")]
        ),
    }


def train(args: list[str], launch: list[str] | None = None) -> None:
    """`t2i-gcpo train ARGS` in one plain process, or under `accelerate launch LAUNCH` in two (in float32:
    bf16 rounds by batch shape, and 1 process ≡ 2 processes is asserted to float32 tolerances)."""
    if "--resume" not in args:  # a resumed run keeps its saved config
        args = [*args, "--set", "rollout.autocast=none", "--set", "optim.autocast=none"]
    if launch is None:
        cmd = [sys.executable, "-m", "t2i_gcpo.cli", "train", *args]
    else:
        cmd = launch_command(args, launch)
    proc = subprocess.run(cmd, env=environment(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def processes(run: Path, kind: str) -> dict:
    info = json.loads((run / "processes.json").read_text())
    assert info["num_processes"] == 2, "two processes really ran"
    assert info["distributed_type"] == kind, info
    assert info["replicas_equal"], info
    return info


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def final_weights(run: Path) -> dict:
    from t2i_gcpo.policies.registry import load_policy

    step = max(r["step"] for r in rows(run))
    return load_policy(str(run / "checkpoints" / f"step_{step:06d}" / "model")).state_dict()


def assert_same_training(one: Path, two: Path, initial: dict) -> None:
    """Same reward means and gradient norms per step, same final weights, within the tolerances above."""
    a, b = rows(one), rows(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
    for ra, rb in zip(a, b):
        assert math.isclose(ra["reward/mean"], rb["reward/mean"], rel_tol=1e-6, abs_tol=1e-9), (ra, rb)
        step, norms = ra["step"], (ra["grad_norm"], rb["grad_norm"])
        assert math.isclose(*norms, rel_tol=1e-4), f"step {step}: grad norms {norms}"
    wa, wb = final_weights(one), final_weights(two)
    keys = [k for k in wa if wa[k].is_floating_point()]
    diff = max((wa[k] - wb[k]).abs().max().item() for k in keys)
    scale = max(wa[k].abs().max().item() for k in keys)
    assert diff <= 1e-4 * scale, f"final weights differ by {diff:.2e} (largest weight {scale:.2f})"
    moved = sum(((wa[k] - initial[k]).double() ** 2).sum() for k in keys) ** 0.5
    apart = sum(((wa[k] - wb[k]).double() ** 2).sum() for k in keys) ** 0.5
    assert moved > 0 and apart <= 1e-3 * moved, f"updates differ by {apart / moved:.2e} of their norm"


def initial_weights(spec: str) -> dict:
    from t2i_gcpo.policies.registry import load_policy

    return load_policy(spec).state_dict()


@pytest.mark.slow
def test_two_process_ddp_run_keeps_replicas_equal(tmp_path):
    model = tiny_policy_dir(tmp_path)
    prompts = write_prompt_file(tmp_path / "p.jsonl")
    out = tmp_path / "run"
    train(
        [
            "--prompts",
            str(prompts),
            "--model",
            str(model),
            "--reward",
            "train_fixtures:redness",
            "--out",
            str(out),
            "--steps",
            "3",
            "--algo",
            "gcpo",
            "--set",
            "rollout.prompts_per_step=2",
            "--set",
            "rollout.group_size=4",
            "--set",
            "eval_every=-1",
            "--set",
            "optim.lr=3e-3",
            "--set",
            "sample_every=0",
        ],
        DDP,
    )
    processes(out, "MULTI_CPU")
    assert [r["step"] for r in rows(out)] == [1, 2, 3]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["image", "text"])
def test_two_ddp_processes_train_like_one_on_the_global_batch(tmp_path, case):
    """image: the tiny prior with the official GCPO loss (credit-weighted token mean, k3 KL to the
    frozen reference). text: DAPO's token mean over completions of different lengths, in two
    gradient-accumulation minibatches: each process's token count differs, so a per-process
    normaliser would not average to the global one."""
    if case == "image":
        model = tiny_policy_dir(tmp_path)
        args = [
            "--model",
            str(model),
            "--prompts",
            str(write_prompt_file(tmp_path / "p.jsonl")),
            *TINY,
            "--algo",
            "gcpo-official",
        ]
        initial = initial_weights(str(model))
    else:
        args = [*TEXT, "--set", "optim.minibatches=2"]
        initial = initial_weights("arithmetic")
    train([*args, *COMMON, "--out", str(tmp_path / "one")])
    train([*args, *COMMON, "--out", str(tmp_path / "two")], DDP)
    processes(tmp_path / "two", "MULTI_CPU")
    assert_same_training(tmp_path / "one", tmp_path / "two", initial)


@pytest.mark.slow
def test_fsdp2_two_processes_train_resume_and_match_one_process(tmp_path):
    """accelerate's FSDP2 with the shipped configs/accelerate/fsdp.yaml (one shard unit per Llama
    decoder layer; bf16 replaced by fp32 on CPU): DGPO with a per-step rollout reference (a full
    state dict every step), two minibatches, credit maps drawn by the main process alone (a forward
    on one rank), a checkpoint after step 2 and --resume to step 3 (sharded optimizer state gathered,
    saved, re-sharded). The result must equal one plain process training 3 steps."""
    model = tiny_policy_dir(tmp_path)
    prompts = write_prompt_file(tmp_path / "p.jsonl")
    args = [
        "--model",
        str(model),
        "--prompts",
        str(prompts),
        *TINY,
        "--algo",
        "dgpo",
        "--set",
        "credit.reference=rollout",
        "--set",
        "optim.minibatches=2",
        *COMMON,
    ]
    run = tmp_path / "fsdp"
    train([*args, "--steps", "2", "--set", "sample_every=1", "--out", str(run)], FSDP)
    processes(run, "FSDP")
    assert sorted(p.name for p in (run / "credit_maps").iterdir()) == ["step_000001.png", "step_000002.png"]
    train(["--resume", str(run), "--steps", "3", "--trust-run-code"], FSDP)
    processes(run, "FSDP")
    assert [r["step"] for r in rows(run)] == [1, 2, 3]
    initial = initial_weights(str(model))
    final = final_weights(run)  # the checkpoint loads with load_policy
    assert any((final[k] - initial[k]).abs().max() > 0 for k in final), "training changed the weights"
    train([*args, "--out", str(tmp_path / "one")])
    assert_same_training(tmp_path / "one", run, initial)


@pytest.mark.slow  # a process of its own each (accelerate reads the launch's variables once per process)
@pytest.mark.parametrize("asked", ["ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED"])
def test_a_strategy_accelerate_did_not_give_is_refused_in_one_line(tmp_path, asked):
    """What `accelerate launch --config_file fsdp.yaml|deepspeed.yaml` tells each process, in one plain
    process: FSDP asked for but not set up (here NO; on CPU processes MULTI_CPU, the slow test below),
    and DeepSpeed (never run with this trainer). One line, exit 2, no run directory."""
    model = tiny_policy_dir(tmp_path)
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "t2i_gcpo.cli",
        "train",
        "--prompts",
        str(write_prompt_file(tmp_path / "p.jsonl")),
        "--model",
        str(model),
        "--reward",
        "train_fixtures:redness",
        "--steps",
        "1",
        "--out",
        str(out),
    ]
    proc = subprocess.run(
        cmd, env={**environment(), asked: "true"}, capture_output=True, text=True, timeout=300
    )
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    want = (
        "the launch asked for FSDP but accelerate set up NO"
        if "FSDP" in asked
        else "DeepSpeed launches are not"
    )
    assert lines[0].startswith(f"error: {want}"), lines
    assert not out.exists()


@pytest.mark.slow
def test_fsdp_config_on_cpu_processes_is_refused_not_trained_as_ddp(tmp_path):
    """The shipped fsdp.yaml under a real 2-process launch on CPU, without `allow_fsdp_on_cpu`: accelerate
    sets up MULTI_CPU (plain DDP); the trainer stops before any work, the main process saying so once."""
    model = tiny_policy_dir(tmp_path)
    out = tmp_path / "run"
    args = [
        "--prompts",
        str(write_prompt_file(tmp_path / "p.jsonl")),
        "--model",
        str(model),
        "--reward",
        "train_fixtures:redness",
        "--steps",
        "1",
        "--out",
        str(out),
    ]
    cmd = launch_command(args, FSDP, module="t2i_gcpo.cli")  # the real CLI: it must refuse
    proc = subprocess.run(cmd, env=environment(), capture_output=True, text=True, timeout=600)
    ours = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("error:")]
    assert proc.returncode != 0
    assert ours == [
        "error: the launch asked for FSDP but accelerate set up MULTI_CPU (it selects FSDP only on "
        "GPUs and other accelerators, not on CPU processes); for data parallel on CPU launch with "
        "--multi_gpu"
    ], proc.stdout + proc.stderr
    assert not out.exists()


def launch_command(args: list[str], launch: list[str], module: str | None = None) -> list[str]:
    """`accelerate launch` of 2 processes running `module train ARGS` (default: this file's CLI under FSDP,
    which allows FSDP on CPU processes, else t2i_gcpo.cli)."""
    module = module or ("test_distributed" if launch == FSDP else "t2i_gcpo.cli")
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *launch,
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--main_process_port",
        str(free_port()),
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        module,
        "train",
        *args,
    ]


def kill_after_checkpoint(args: list[str], launch: list[str], run: Path, step: int) -> None:
    """Launch two processes, and kill -9 the launcher and both workers once the checkpoint of `step` is
    complete: the kill lands in the next step (its rollout, update, or checkpoint write)."""
    import signal
    import time

    from t2i_gcpo.train.checkpoint import latest_checkpoint

    proc = subprocess.Popen(
        launch_command(args, launch),
        env=environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        ckpt = latest_checkpoint(run) if (run / "checkpoints").is_dir() else None
        if ckpt is not None and int(ckpt.name.split("_")[1]) >= step:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.stderr.read()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its workers: one process group
    proc.wait(timeout=60)


STEPS = 8  # room for the kill: a tiny step can take well under the poll interval on a quiet machine


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_kill_9_and_resume_under_each_strategy_is_bit_identical(tmp_path, strategy):
    """A 2-process run killed with SIGKILL after step 2's checkpoint (before its last step) and resumed ends
    exactly as the same launch uninterrupted: every logged metric but the timings, and the final weights and
    optimizer state, bit for bit. DDP: --multi_gpu; FSDP2: the shipped fsdp.yaml with `allow_fsdp_on_cpu`
    (sharded optimizer state gathered at each checkpoint, re-sharded on resume). Float32, as `train`."""
    import torch

    launch = FSDP if strategy == "fsdp" else DDP
    model = tiny_policy_dir(tmp_path)
    args = [
        "--model",
        str(model),
        "--prompts",
        str(write_prompt_file(tmp_path / "p.jsonl")),
        *TINY,
        "--algo",
        "gcpo",
        *COMMON,
        "--steps",
        str(STEPS),
        "--set",
        "save_every=1",
        "--set",
        "rollout.autocast=none",
        "--set",
        "optim.autocast=none",
    ]
    full, part = tmp_path / "full", tmp_path / "part"
    train([*args, "--out", str(full)], launch)
    kill_after_checkpoint([*args, "--out", str(part)], launch, part, step=2)
    killed_at = len(rows(part))
    assert 2 <= killed_at < STEPS, f"killed after step {killed_at}"
    train(["--resume", str(part), "--trust-run-code"], launch)
    kind = "FSDP" if strategy == "fsdp" else "MULTI_CPU"
    assert processes(full, kind)["param_checksums"] == processes(part, kind)["param_checksums"]
    a, b = rows(full), rows(part)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1))
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if not k.startswith("time/")} == {
            k: v for k, v in rb.items() if not k.startswith("time/")
        }
    wa, wb = final_weights(full), final_weights(part)
    assert all(torch.equal(wa[k], wb[k]) for k in wa), "resumed weights are bit-identical"
    oa, ob = (
        load_tree(r / "checkpoints" / f"step_{STEPS:06d}", "optimizer", "the optimizer state")
        for r in (full, part)
    )

    def group(g: dict) -> dict:  # FSDP's optimizer state dict round trip turns the betas tuple into a list
        return {k: tuple(v) if isinstance(v, list) else v for k, v in g.items()}

    assert [group(g) for g in oa["param_groups"]] == [group(g) for g in ob["param_groups"]]
    assert oa["state"].keys() == ob["state"].keys()
    for key in oa["state"]:
        assert all(torch.equal(oa["state"][key][n], ob["state"][key][n]) for n in oa["state"][key]), key


def allow_fsdp_on_cpu() -> None:
    """Let accelerate hand the model to FSDP2 on CPU processes (gloo), for these tests.

    accelerate 1.15 selects FSDP only on accelerator devices: `AcceleratorState.__init__` sets
    `DistributedType.FSDP` inside the branch for MULTI_GPU / MULTI_NPU / MULTI_XPU / … and leaves
    MULTI_CPU alone, so `--use_fsdp` (or an FSDP config file) on CPU processes silently trains with
    plain DDP. torch's FSDP2 itself runs on CPU with gloo. This sets the distributed type that
    accelerate would have set on GPUs, with the plugin it built from the launch's settings; the rest
    (fully_shard via `Accelerator.prepare`, no_sync, clip_grad_norm_, the state dicts, gloo
    collectives) is accelerate's and torch's own FSDP2 path."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    init = AcceleratorState.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        plugin = kwargs.get("fsdp_plugin")
        if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = __init__


if __name__ == "__main__":
    allow_fsdp_on_cpu()
    from t2i_gcpo.cli import main

    main()
