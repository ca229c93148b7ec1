"""What a step draws has one owner (train/draws.py; issue 59, item 2): the plan's counts are the counts the
collector charges every draw against (a draw beyond them raises), the memory model the plan bounds a step
with is within 2× of the peak a real step reaches on each path, and a step the machine cannot hold is refused
before the run in one line naming the product, the estimate and the setting — the tree groups at k = 63,
n = 64 on one prompt (8,066 samples) that ran out of an 8 GB limit with a traceback and a folder left."""

from __future__ import annotations

import dataclasses
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from t2i_gcpo.config import ALGORITHMS, load_config
from t2i_gcpo.policies.registry import load_policy
from t2i_gcpo.rewards.registry import build_reward
from t2i_gcpo.tasks.prompts import read_prompts
from t2i_gcpo.train.collect import BatchCollector
from t2i_gcpo.train.data import PromptStream
from t2i_gcpo.train.draws import COUNTS, Ledger, StepDraws, step_draws
from t2i_gcpo.train.run_settings import sampling_params

from cli_helpers import cli, error_line
from tiny_models import build_tiny_masked, tiny_policy_dir
from train_fixtures import write_prompt_file

REPO = Path(__file__).resolve().parents[2]
SMALL = ["rollout.prompts_per_step=2", "rollout.group_size=4", "rollout.cfg_scale=2", "rollout.autocast=none"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("draws")
    return {
        "ar": load_policy(str(tiny_policy_dir(root))).eval(),
        "masked": load_policy("masked:" + build_tiny_masked(root)).eval(),
        "prompts": read_prompts(write_prompt_file(root / "p.jsonl")),
    }


def extra(algo: str) -> list[str]:
    """Settings that put every scheme's branching within the tiny prior's 16 tokens."""
    if algo in ("vine",):
        return ["branching.k=5"]
    if algo in ("tree",):
        return ["branching.k=2"]
    return []


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_the_collector_never_draws_more_than_the_plan_allowed(algo, tiny):
    """Every preset, two steps (dynamic sampling's rounds, carry-over, knapsack's carried fraction): what the
    collector charged is within what the plan's counts allow, and is what it reports it spent (budget/*)."""
    policy = tiny["masked"] if algo == "stepwise" else tiny["ar"]
    cfg = load_config(algo, overrides=[*SMALL, *extra(algo)])
    reward = build_reward("train_fixtures:redness")
    collector = BatchCollector(cfg, PromptStream(tiny["prompts"], 0))
    plan = step_draws(cfg, policy)
    for step in (1, 2):
        got = collector.collect(step, policy, reward, sampling_params(cfg))
        spent, allowed = collector.ledger.spent, collector.ledger.allowed()
        assert all(spent[k] <= allowed[k] for k in COUNTS), (algo, spent, allowed)
        assert collector.draws == plan  # the plan's own counts
        budget = got.budget
        assert spent["samples"] == budget["budget/samples"] + budget["budget/step_predictions"], (
            spent,
            budget,
        )
        assert (
            spent["reward_calls"] == budget["budget/reward_calls"]
            and spent["tokens"] == budget["budget/tokens"]
        )
    if algo == "grpo":  # nothing random in what plain groups draw: all of it
        assert spent["samples"] == allowed["samples"] == 8


def test_a_collector_that_draws_more_than_its_plan_stops(tiny, monkeypatch):
    """The check is a check: a plan of fewer groups than the collector draws (the drift the hand-kept copy
    could have) stops the step naming the count and the plan."""
    cfg = load_config("grpo", overrides=SMALL)
    small = dataclasses.replace(step_draws(cfg, tiny["ar"]), groups=1)
    collector = BatchCollector(cfg, PromptStream(tiny["prompts"], 0))
    collector.draws = small
    with pytest.raises(
        RuntimeError, match=r"would draw 8 samples this step \(a round's groups\), more than the plan's 4"
    ):
        collector.collect(1, tiny["ar"], build_reward("train_fixtures:redness"), sampling_params(cfg))
    ledger = Ledger(small)
    ledger.charge("x", samples=4)
    assert ledger.spent["samples"] == 4 and isinstance(ledger.draws, StepDraws)


def test_the_tree_repro_is_refused_up_front_in_one_line(tmp_path, capsys):
    """Tree groups at k = 63, n = 64 on one prompt: 8,066 samples, under max_step_samples; it ran out of an 8
    GB limit in 40 s with a traceback and a folder left. Now the plan estimates the step and refuses it."""
    out = tmp_path / "run"
    code, _, err = cli(
        capsys,
        "train",
        "--prompts",
        "prompts/shapeworld_train.txt",
        "--algo",
        "tree",
        "--out",
        out,
        "--set",
        "rollout.prompts_per_step=1",
        "--set",
        "rollout.group_size=2",
        "--set",
        "branching.k=63",
        "--set",
        "branching.continuations=64",
        "--set",
        "rollout.max_step_memory=8",
    )
    line = error_line(err)
    assert code == 2 and "·G₀·(1 + k·n) = 1·2·(1 + 63·64) = 8,066 samples, ≈ " in line, line
    assert "GB by the memory model (mostly the update's 8,066 trained rows" in line, line  # ≈ 100 GB
    assert (
        "more than config key 'rollout.max_step_memory' = 8 GB" in line and "raise optim.minibatches" in line
    )
    assert not out.exists()


@pytest.mark.slow  # loads the shipped prior and measures it in a fresh process: ≈ 30 s beside other jobs
def test_under_an_8_gb_limit_the_default_cap_is_the_limit(tmp_path):
    """The repro as it was met: the same command under an 8 GB address-space limit (ulimit -v), the cap left
    at its default (the free memory read at the start): refused in one line naming the limit, no folder."""
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "t2i_gcpo.cli",
        "train",
        "--prompts",
        "prompts/shapeworld_train.txt",
        "--algo",
        "tree",
        "--out",
        str(out),
        "--set",
        "rollout.prompts_per_step=1",
        "--set",
        "rollout.group_size=2",
        "--set",
        "branching.k=63",
        "--set",
        "branching.continuations=64",
    ]

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        preexec_fn=limit,
        timeout=600,
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "8,066 samples" in lines[0] and "address-space limit (ulimit -v)" in lines[0], lines[0]
    assert not out.exists()


# ------------------------------------------------------------------------------ the model against a real step
def paths(root: Path) -> dict[str, dict]:
    """Each path at a tiny shape whose step holds some hundred MB: the tiny AR and masked priors, the shipped
    arithmetic model (small already)."""
    ar, masked = str(tiny_policy_dir(root)), "masked:" + build_tiny_masked(root)
    prompts = str(write_prompt_file(root / "p.jsonl"))
    big = ["rollout.prompts_per_step=16", "rollout.group_size=32", "rollout.cfg_scale=2"]
    mid = ["rollout.prompts_per_step=8", "rollout.group_size=8", "rollout.cfg_scale=2"]
    return {
        "AR groups": {"algo": "grpo", "model": ar, "prompts": prompts, "set": big},
        "AR allocation": {
            "algo": "pods",
            "model": ar,
            "prompts": prompts,
            "set": [*big[:1], "rollout.group_size=16", big[2]],
        },
        "AR continuations": {"algo": "vine", "model": ar, "prompts": prompts, "set": [*mid, "branching.k=5"]},
        "AR tree groups": {"algo": "tree", "model": ar, "prompts": prompts, "set": [*mid, "branching.k=2"]},
        "masked groups": {"algo": "grpo", "model": masked, "prompts": prompts, "set": big},
        "masked step predictions": {"algo": "stepwise", "model": masked, "prompts": prompts, "set": mid},
        "text groups": {"algo": "grpo", "model": "arithmetic", "set": mid},
        "text tree groups": {
            "algo": "tree",
            "model": "arithmetic",
            "set": ["rollout.prompts_per_step=4", "rollout.group_size=4"],
        },
    }


@pytest.mark.slow  # eight fresh processes, each a plan and one step: ≈ 4 min beside other jobs
def test_the_memory_model_is_within_2x_of_a_measured_peak_on_each_path(tmp_path_factory):
    sys.path.insert(0, str(REPO))
    from benchmarks.suite.step_memory import measure_in_a_process

    root = tmp_path_factory.mktemp("paths")
    ratios = {}
    for name, spec in paths(root).items():
        got = measure_in_a_process({**spec, "out": str(root / name.replace(" ", "-"))})
        assert got["measured_mb"] > 20, (name, got)  # a step that holds something to measure
        ratios[name] = got["estimate_mb"] / got["measured_mb"]
    assert all(0.5 <= r <= 2.0 for r in ratios.values()), ratios


def test_the_default_cap_is_this_machines_free_memory(tmp_path, monkeypatch, capsys):
    """rollout.max_step_memory null (the default): the free memory `hardware.free_memory` reads at the start
    is the cap; a machine of 10 MB free refuses a step the tiny prior holds in more, naming where the number
    came from."""
    import t2i_gcpo.hardware as hardware

    monkeypatch.setattr(hardware, "free_memory", lambda device: (10e6, "the machine's available memory"))
    model, prompts = tiny_policy_dir(tmp_path), write_prompt_file(tmp_path / "p.jsonl")
    out = tmp_path / "run"
    code, _, err = cli(
        capsys,
        "train",
        "--prompts",
        prompts,
        "--model",
        model,
        "--out",
        out,
        "--set",
        "rollout.prompts_per_step=8",
        "--set",
        "rollout.group_size=64",
        "--set",
        "rollout.cfg_scale=2",
    )
    line = error_line(err)
    assert code == 2 and "= 768 samples, ≈ " in line and " MB by the memory model" in line, line
    assert "more than the 10 MB this process has free (the machine's available memory; config key " in line, (
        line
    )
    assert "'rollout.max_step_memory' = null)" in line and not out.exists()
