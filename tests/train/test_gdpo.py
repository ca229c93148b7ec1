"""GDPO (advantage.reward_norm=per_reward; core/advantages.decoupled_advantages, arXiv 2601.05242 §3): each
reward normalised within its group, the weighted sum, normalised over the batch — against a hand
computation on two rewards whose scales differ 100×, through the step's collector, and in a run's metrics."""

from __future__ import annotations

import math

import pytest
import torch

from t2i_gcpo.core.advantages import decoupled_advantages, group_advantages
from t2i_gcpo.rewards.base import RewardOutput

from cli_helpers import cli, error_line
from reward_fixtures import rows, train
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file

EPS = 1e-4


def mean(xs):
    return sum(xs) / len(xs)


def std(xs):  # unbiased
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def normalised(xs):
    m, s = mean(xs), std(xs)
    return [(x - m) / (s + EPS) for x in xs]


# two groups of 4: a 0/1 reward and one on a 100× larger scale; in the second group the first reward is flat
R1 = [0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
R2 = [100.0, 300.0, 200.0, 0.0, 50.0, 250.0, 150.0, 350.0]
W = [0.5, 2.0]


def hand() -> list[float]:
    a1 = normalised(R1[:4]) + [0.0] * 4  # a flat group: no signal from that reward
    a2 = normalised(R2[:4]) + normalised(R2[4:])
    total = [W[0] * x + W[1] * y for x, y in zip(a1, a2)]
    return normalised(total)


def test_gdpo_advantages_equal_a_hand_computation():
    parts = torch.tensor([R1, R2]).T  # [B, K]
    adv, terms = decoupled_advantages(parts, torch.tensor(W), group_size=4, eps=EPS)
    assert adv.tolist() == pytest.approx(hand(), abs=1e-5)
    assert terms[:4, 0].tolist() == pytest.approx([W[0] * x for x in normalised(R1[:4])], abs=1e-6)
    assert terms[4:, 0].tolist() == [0.0] * 4


def test_the_small_reward_counts_under_gdpo_and_is_drowned_under_the_sum():
    """Sample 1 succeeds at the 0/1 reward and is a little below its group at the 100× larger one: GRPO's
    sum ranks the group by the large reward alone (its advantages are the large reward's, to 1 %) and pushes
    sample 1 down; GDPO weighs the 0/1 reward as much and pushes it up."""
    small, large = [0.0, 1.0, 0.0, 1.0], [100.0, 190.0, 210.0, 300.0]
    summed = group_advantages(torch.tensor(small) + torch.tensor(large), 4, eps=EPS)
    assert torch.allclose(summed, group_advantages(torch.tensor(large), 4, eps=EPS), atol=0.01)
    gdpo, _ = decoupled_advantages(torch.tensor([small, large]).T, torch.ones(2), 4, eps=EPS)
    by_hand = normalised([x + y for x, y in zip(normalised(small), normalised(large))])
    assert gdpo.tolist() == pytest.approx(by_hand, abs=1e-5)
    assert summed[1] < 0 < gdpo[1]


def test_a_flat_batch_and_bad_shapes():
    adv, terms = decoupled_advantages(torch.ones(4, 2), torch.ones(2), 2)
    assert adv.tolist() == [0.0] * 4 and terms.abs().sum() == 0
    with pytest.raises(ValueError, match="parts must be"):
        decoupled_advantages(torch.ones(4), torch.ones(2), 2)


def test_the_collector_reads_each_terms_score_from_a_sums_details():
    from t2i_gcpo.config import AdvantageConfig
    from t2i_gcpo.rewards.combine import FunctionReward, WeightedSum, reward_terms
    from t2i_gcpo.train.scoring import sequence_advantages

    scores = {"small": torch.tensor(R1), "large": torch.tensor(R2)}
    reward = WeightedSum(
        [(FunctionReward(lambda i, p, m, k=k: scores[k], name=k), w) for k, w in zip(scores, W)]
    )
    out = reward(torch.zeros(8, 3, 2, 2), ["p"] * 8, [{}] * 8)
    terms = reward_terms(reward)
    assert terms == [("small", 0.5), ("large", 2.0)]
    adv, per_term = sequence_advantages(AdvantageConfig(reward_norm="per_reward"), out, 4, terms)
    assert adv.tolist() == pytest.approx(hand(), abs=1e-5) and set(per_term) == {"small", "large"}
    summed, none = sequence_advantages(AdvantageConfig(), out, 4, terms)
    assert torch.equal(summed, group_advantages(out.scores, 4)) and none == {}
    single, _ = sequence_advantages(
        AdvantageConfig(reward_norm="per_reward"), RewardOutput(torch.tensor(R2)), 4, None
    )
    assert single.tolist() == pytest.approx(normalised(normalised(R2[:4]) + normalised(R2[4:])), abs=1e-5)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("gdpo")
    return {"model": str(tiny_policy_dir(root)), "prompts": str(write_prompt_file(root / "p.jsonl"))}


SUM = "0.5*reward_fixtures:scaled_red+0.5*reward_fixtures:green"


def test_a_gdpo_run_logs_each_terms_reward_and_advantage(tiny, tmp_path):
    assert (
        train(
            tmp_path / "gdpo",
            tiny["model"],
            tiny["prompts"],
            "--reward",
            SUM,
            "--set",
            "advantage.reward_norm=per_reward",
            steps=1,
        )
        == 0
    )
    row = rows(tmp_path / "gdpo")[0]
    for name in ("scaled_red", "green"):
        assert math.isfinite(row[f"reward/{name}/mean"]) and row[f"advantage/{name}/mean_abs"] > 0, row
    assert row["reward/scaled_red/mean"] > 10 * row["reward/green/mean"]  # two scales
    assert row["advantage/scaled_red/mean_abs"] < 3 * row["advantage/green/mean_abs"]  # comparable shares
    assert train(tmp_path / "sum", tiny["model"], tiny["prompts"], "--reward", SUM, steps=1) == 0
    row = rows(tmp_path / "sum")[0]
    assert "reward/green/mean" in row and not any(k.startswith("advantage/") for k in row)


def test_gdpo_needs_the_groups_std(tiny, tmp_path, capsys):
    code, _, err = cli(
        capsys,
        "train",
        "--prompts",
        tiny["prompts"],
        "--model",
        tiny["model"],
        "--out",
        tmp_path / "run",
        "--set",
        "advantage.reward_norm=per_reward",
        "--set",
        "advantage.scale=none",
    )
    assert code == 2 and "it needs advantage.scale=group" in error_line(err)
    assert not (tmp_path / "run").exists()
