"""Costs bounded up front (issue 52, "a cost nobody bounds"): the samples a step decodes and scores are
computed before the run and refused above rollout.max_step_samples, naming the product and the cap (the tree
64 × 64 run that the kernel killed at 20.5 GB: refused in under 5 s); tree groups' k is bounded by the
samples' decision steps; knapsack's fractional budget is carried across rounds (and resumed bit for bit);
pods' draw_factor·G must be a whole number; stepwise's group normalisation gives a flat
group 0, as GRPO does."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import t2i_gcpo.train.trainer as trainer_mod
from t2i_gcpo.config import load_config
from t2i_gcpo.core.stepwise import stepwise_advantages
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.registry import load_policy
from t2i_gcpo.resources import PROMPTS_DIR
from t2i_gcpo.train.checkpoint import collector_checkpoint
from t2i_gcpo.train.collect import BatchCollector
from t2i_gcpo.train.data import PromptStream
from t2i_gcpo.train.draws import step_draws
from t2i_gcpo.train.plan import plan_run
from t2i_gcpo.train.run import ResumeOptions, prepare, run

from cli_helpers import cli, error_line
from tiny_models import build_tiny_masked, tiny_policy_dir
from train_fixtures import write_prompt_file


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("costs")
    return {
        "model": str(tiny_policy_dir(root)),
        "masked": "masked:" + build_tiny_masked(root),
        "prompts": str(write_prompt_file(root / "p.jsonl")),
    }


# ------------------------------------------------------------------ the samples a step decodes and scores


def test_the_tree_64_by_64_run_is_refused_in_under_5_seconds_naming_the_product_and_the_cap(tmp_path, capsys):
    """`--algo tree --set branching.k=64 --set branching.continuations=64` (each within its own bound) ran
    406 s and was killed by the kernel's OOM killer at 20.5 GB on a 23 GB machine."""
    out = tmp_path / "run"
    tic = time.perf_counter()
    code, _, err = cli(
        capsys,
        "train",
        "--prompts",
        PROMPTS_DIR / "shapeworld_train.txt",
        "--algo",
        "tree",
        "--set",
        "branching.k=64",
        "--set",
        "branching.continuations=64",
        "--out",
        out,
    )
    seconds = time.perf_counter() - tic
    line = error_line(err)
    assert code == 2 and seconds < 5, (code, seconds)
    assert "⌊draw_budget·P⌋·G₀·(1 + k·n) = ⌊1.5·8⌋·4·(1 + 64·64) = 196,656 samples, more" in line, line
    assert "more than config key 'rollout.max_step_samples' = 16,384" in line, line
    assert not out.exists()


def test_from_the_shell_too_without_importing_torch(tmp_path):
    """The refusal from a fresh process (what a user sees): the count needs the config alone, so neither
    torch nor a model is loaded before it."""
    import os
    import subprocess
    import sys

    out = tmp_path / "run"
    tic = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "t2i_gcpo.cli",
            "train",
            "--prompts",
            "prompts/shapeworld_train.txt",
            "--algo",
            "tree",
            "--set",
            "branching.k=64",
            "--set",
            "branching.continuations=64",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=60,
    )
    seconds = time.perf_counter() - tic
    lines = [ln for ln in done.stderr.splitlines() if not ln.startswith("import time:")]
    assert done.returncode == 2 and len(lines) == 1 and "= 196,656 samples" in lines[0], done.stderr[-500:]
    assert not [ln for ln in done.stderr.splitlines() if ln.rstrip().endswith("| torch")], (
        "torch was imported"
    )
    assert seconds < 5 and not out.exists(), seconds


def test_k_of_tree_groups_is_bounded_by_the_decision_steps(tiny, tmp_path, capsys):
    """`branching.k=100000` was accepted; below the cap, k must still find k distinct points."""
    base = [
        "train",
        "--prompts",
        tiny["prompts"],
        "--model",
        tiny["model"],
        "--algo",
        "tree",
        "--out",
        tmp_path / "run",
        "--set",
        "rollout.prompts_per_step=2",
    ]
    code, _, err = cli(capsys, *base, "--set", "branching.k=100000")
    assert code == 2 and "(1 + 100000·2)" in error_line(err)
    code, _, err = cli(capsys, *base, "--set", "branching.k=16", "--set", "branching.continuations=1")
    line = error_line(err)  # the tiny prior decides 4 × 4 tokens
    assert code == 2 and "16 decision steps" in line and "k must be below 16, got 16" in line, line
    assert not (tmp_path / "run").exists()


def test_the_cap_is_settable_and_counts_every_sample_a_step_scores(tiny):
    policy, masked = load_policy(tiny["model"]), load_policy(tiny["masked"])
    P8 = ["rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.cfg_scale=2"]
    cost = {}
    for algo, model, extra in [
        ("dapo", policy, ()),
        ("grpo", policy, ()),
        ("tree", policy, ("branching.k=3",)),
        ("vine", policy, ("branching.k=4",)),
        ("pods", policy, ()),
        ("knapsack", policy, ()),
        ("stepwise", masked, ()),
    ]:
        cost[algo] = step_draws(load_config(algo, overrides=[*P8, *extra]), model)
    assert (cost["grpo"].groups, cost["grpo"].per_group) == (8, 4)  # P·G, no dynamic sampling
    assert (cost["dapo"].groups, cost["dapo"].per_group) == (12, 4)  # ⌊1.5·8⌋ groups at most
    assert cost["tree"].per_group == 4 * (1 + 3 * 2)  # G₀·(1 + k·n)
    assert cost["vine"].per_group == 4 * (1 + 3 * 2)  # 16 tokens, every 4th: 3 points, 2 continuations
    assert cost["pods"].per_group == 8 and cost["knapsack"].per_group == 8  # draw_factor 2
    assert cost["stepwise"].per_group == 4 * 4  # every one of the 4 reveal steps' predictions scored
    cfg = load_config("tree", overrides=[*P8, "branching.k=15", "branching.continuations=64"])
    with pytest.raises(UserError, match="= 46,128 samples.*'rollout.max_step_samples' = 16,384"):
        plan_run(cfg, policy, trackers=[])
    cfg = load_config(
        "tree",
        overrides=[*P8, "branching.k=15", "branching.continuations=64", "rollout.max_step_samples=50000"],
    )
    assert plan_run(cfg, policy, trackers=[]).cost.samples == 46_128


# ------------------------------------------------------------------ the allocation's fractional budget


def collector(algo: str, *overrides: str) -> BatchCollector:
    cfg = load_config(algo, overrides=["rollout.cfg_scale=2", *overrides])
    return BatchCollector(cfg, PromptStream([], 0))


def test_knapsack_carries_the_fraction_of_a_group_it_cannot_draw():
    """One prompt a step at draw_factor 1.5 rounded its half group to zero (round-half-even): plain DAPO."""
    one = collector("knapsack", "rollout.prompts_per_step=1", "rollout.draw_factor=1.5")
    assert [one.extra_groups(1) for _ in range(6)] == [0, 1, 0, 1, 0, 1]
    three = collector("knapsack", "rollout.prompts_per_step=3", "rollout.draw_factor=1.5")
    assert [three.extra_groups(3) for _ in range(4)] == [1, 2, 1, 2]  # 1.5 groups a round, on average
    preset = collector("knapsack", "rollout.prompts_per_step=8")
    assert [preset.extra_groups(n) for n in (8, 5, 3)] == [8, 5, 3] and preset.owed == 0  # as before
    one.extra_groups(1)  # half a group owed: what a checkpoint keeps, per process
    state, _ = collector_checkpoint([one.state_dict()])
    assert state["owed"] == [0.5]
    other = collector("knapsack", "rollout.prompts_per_step=1", "rollout.draw_factor=1.5")
    other.load_state_dict({**one.state_dict(), "carry": None})
    assert other.owed == 0.5 and other.extra_groups(1) == 1


def test_a_knapsack_run_with_a_fractional_budget_resumes_bit_identically(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)
    common = (
        "rollout.prompts_per_step=1",
        "rollout.group_size=4",
        "rollout.cfg_scale=2",
        "optim.lr=3e-3",
        "sample_every=0",
        "eval_every=-1",
        "save_every=1",
        "rollout.draw_factor=1.5",
    )

    def flags(out, steps):
        return dict(
            prompts=tiny["prompts"],
            model=tiny["model"],
            reward="train_fixtures:redness",
            out=str(out),
            steps=steps,
            seed=0,
            report_to="none",
        )

    full, part = tmp_path / "full", tmp_path / "part"
    run(prepare(algo="knapsack", flags=flags(full, 2), overrides=common))
    run(prepare(algo="knapsack", flags=flags(part, 1), overrides=common))
    state = json.loads((part / "checkpoints" / "step_000001" / "trainer_state.json").read_text())
    assert state["owed"] == [0.5]  # half a group a step: none drawn at step 1, half owed
    run(prepare(resume_options=ResumeOptions(trust_run_code=True), resume_dir=part, steps=2))
    rows = [[json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()] for d in (full, part)]
    drawn = [r["budget/samples"] for r in rows[0]]
    assert drawn == [4, 8], drawn  # the extra group drawn at the second step
    for a, b in zip(*rows):
        assert {k: v for k, v in a.items() if not k.startswith("time/")} == pytest.approx(
            {k: v for k, v in b.items() if not k.startswith("time/")}, rel=1e-6
        )
    weights = [
        load_file(str(d / "checkpoints" / "step_000002" / "model" / "prior" / "model.safetensors"))
        for d in (full, part)
    ]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0]), "resumed bit for bit"


def test_pods_draws_a_whole_number_of_samples_above_the_group():
    with pytest.raises(UserError, match=r"rollout.draw_factor': pods draws .* 1.3 × 8 = 10.4"):
        load_config("pods", overrides=["rollout.draw_factor=1.3"])
    with pytest.raises(UserError, match=r"1.1 × 2 = 2.2 \(e.g. --set rollout.draw_factor=1.5\)"):
        load_config("pods", overrides=["rollout.draw_factor=1.1", "rollout.group_size=2"])  # round(2.2) = 2
    assert (
        load_config("pods", overrides=["rollout.draw_factor=1.5", "rollout.group_size=2"]).rollout.draw_factor
        == 1.5
    )
    assert load_config("pods", overrides=["rollout.draw_factor=1.25"]).rollout.draw_factor == 1.25  # 10 of 8


# ------------------------------------------------------------------ stepwise's group normalisation


def test_stepwise_group_normalisation_gives_a_flat_group_zero():
    """Final rewards all equal, intermediate predictions not: divided by ε alone, about ±5,000."""
    step_rewards = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [0.5, 0.5, 1.0], [0.0, 0.0, 1.0]])
    step, mask = torch.tensor([[0, 1, 2, 2]] * 4), torch.ones(4, 4)
    flat = stepwise_advantages(step_rewards, 4, step, mask, normalisation="group")
    assert torch.equal(flat, torch.zeros(4, 4))
    varied = step_rewards.clone()
    varied[0, 2] = 0.0  # one sample ends lower: the group has signal again
    a = stepwise_advantages(varied, 4, step, mask, normalisation="group")
    assert a.abs().max() < 10 and a[0].sum() < 0
    step_wise = stepwise_advantages(step_rewards, 4, step, mask, normalisation="step")  # per step: unchanged
    assert step_wise.abs().sum() > 0


def test_every_preset_plans_within_the_cap_at_its_defaults(tiny):
    """The cap refuses typos, not the shipped presets (each at its defaults on an 8 × 8-token prior)."""
    from t2i_gcpo.config import ALGORITHMS

    policy = load_policy("shapeworld")
    for algo in ALGORITHMS:
        if algo == "stepwise":
            continue  # a masked model's scheme
        cost = step_draws(load_config(algo), policy)
        assert cost.samples <= 16_384, (algo, cost)
    assert Path(PROMPTS_DIR).is_dir()
