"""Prompt-level budget allocation (docs/concepts/algorithms.md#budget-allocation): PODS's max-variance subset,
the knapsack's spread probability and greedy allocation against hand-computed values, and a run that draws
more than it trains on, with the budget metrics counting both."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

import t2i_gcpo.train.trainer as trainer_mod
from t2i_gcpo.config import load_config
from t2i_gcpo.core.allocation import allocate, max_variance_subset, spread_probability, success_estimate
from t2i_gcpo.errors import UserError

from cli_helpers import cli
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file


def test_the_max_variance_subset_is_the_extremes():
    r = torch.tensor([0.5, 0.0, 1.0, 0.2, 0.9, 0.1])
    # of size 4: the two smallest (0.0, 0.1) with the two largest (1.0, 0.9) beat any other split
    assert max_variance_subset(r, 4).tolist() == [1, 2, 4, 5]
    # of size 3: as good as the best of all 20 subsets
    picked = max_variance_subset(r, 3)
    best = max(float(r[list(c)].var(unbiased=False)) for c in itertools.combinations(range(6), 3))
    assert math.isclose(float(r[picked].var(unbiased=False)), best)
    assert max_variance_subset(torch.ones(5), 2).tolist() == [0, 1]  # all equal: the first ones
    with pytest.raises(ValueError, match="1 <= m <= n"):
        max_variance_subset(r, 7)


def test_spread_probability_and_the_greedy_allocation_by_hand():
    p = torch.tensor([0.5, 0.9, 0.0])
    # 1 − pⁿ − (1 − p)ⁿ: p = ½, n = 2 → ½; p = 0.9, n = 2 → 0.18; p = 0 → never spread
    torch.testing.assert_close(
        spread_probability(p, torch.tensor([2, 2, 2])), torch.tensor([0.5, 0.18, 0.0], dtype=torch.float64)
    )
    # from 2 samples each, units of 2: p = ½ gains 0.875 − 0.5 = 0.375, p = 0.9 gains 0.3439 − 0.18 = 0.1639;
    # after one unit to p = ½ its next gains 0.9688 − 0.875 = 0.094 < 0.1639: the second unit goes to p = 0.9
    assert allocate(p, base=2, units=2, unit=2).tolist() == [1, 1, 0]
    assert allocate(p, base=2, units=3, unit=2, most=1).tolist() == [
        1,
        1,
        1,
    ]  # the rest where it gains nothing
    est = success_estimate(torch.tensor([3.0]), torch.tensor([4.0]), torch.tensor([1.0]), torch.tensor([2.0]))
    assert est.tolist() == [(1 + 3 + 1) / (2 + 4 + 2)]


@pytest.fixture(autouse=True)
def no_report(monkeypatch):
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)


FAST = (
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.cfg_scale=2",
    "sample_every=0",
    "eval_every=-1",
    "save_every=1",
    "rollout.autocast=none",
    "optim.autocast=none",
    "advantage.dynamic_sampling=false",
)


@pytest.mark.parametrize("allocation", ["pods", "knapsack"])
def test_a_run_draws_more_than_it_trains_on_and_counts_both(allocation, tmp_path, capsys, monkeypatch):
    model = str(tiny_policy_dir(tmp_path))
    prompts = write_prompt_file(tmp_path / "p.jsonl")
    batches = []
    real = trainer_mod.update_policy

    def spy(cfg, batch, *args, **kwargs):
        batches.append(batch)
        return real(cfg, batch, *args, **kwargs)

    monkeypatch.setattr(trainer_mod, "update_policy", spy)

    def run(out, *sets):
        args = [
            "train",
            "--prompts",
            prompts,
            "--model",
            model,
            "--reward",
            "train_fixtures:redness",
            "--algo",
            "gcpo",
            "--out",
            out,
            "--steps",
            "2",
            "--seed",
            "0",
        ]
        for s in (*FAST, *sets):
            args += ["--set", s]
        code, _, err = cli(capsys, *args)
        assert code == 0, err
        return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]

    plain = run(tmp_path / "plain")
    batches.clear()
    rows = run(tmp_path / "alloc", f"rollout.allocation={allocation}", "rollout.draw_factor=2")
    for r, base in zip(rows, plain):
        assert r["budget/samples"] == 2 * base["budget/samples"] == 16, r  # drawn: twice the P·G trained on
        assert r["budget/samples_kept"] == 8  # kept: P·G
        assert "budget/samples_kept" not in base
    for batch in batches:  # every trained group: G = 4 samples, from the prompt's draws
        assert batch.rollout.group_size == 4 and len(batch.rollout) == 8


def test_allocation_refuses_tree_groups():
    with pytest.raises(UserError, match="rollout.allocation"):
        load_config("tree", overrides=["rollout.allocation=pods"])
