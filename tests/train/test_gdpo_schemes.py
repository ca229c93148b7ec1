"""GDPO (advantage.reward_norm=per_reward) says what it does with every credit scheme (issue 59, item 3): a
scheme that reads the rewards (vine and tree credit: its continuations'; tree groups: its leaves'; tempo: its
group's; stepwise: its step predictions') reads GDPO's decoupled rewards r̂ = Σ_k w_k (r_k − mean_g r_k) /
(std_g r_k + ε), each term normalised over every reward scored for the group; a scheme of the user's that
reads the rewards is refused in one line (nothing tells what it expects of them); the others read GDPO's
sequence advantage as before (tests/test_gdpo.py)."""

from __future__ import annotations

import math

import pytest
import torch

import t2i_gcpo.train.branches as branches_mod
from t2i_gcpo.config import load_config
from t2i_gcpo.core.advantages import decoupled_rewards
from t2i_gcpo.core.schemes import CREDIT_SCHEMES, REWARD_NEEDS, get_scheme
from t2i_gcpo.core.tree import Tree
from t2i_gcpo.core.tree_credit import segment_advantages
from t2i_gcpo.policies.registry import load_policy
from t2i_gcpo.rewards.registry import build_reward
from t2i_gcpo.tasks.prompts import read_prompts
from t2i_gcpo.train.collect import BatchCollector
from t2i_gcpo.train.credit import CREDIT_REWARDS
from t2i_gcpo.train.data import PromptStream
from t2i_gcpo.train.run_settings import sampling_params

from cli_helpers import cli, error_line
from tiny_models import build_tiny_masked, tiny_policy_dir
from train_fixtures import write_prompt_file

EPS = 1e-4


def by_hand(parts: list[list[float]], weights: list[float], groups: list[int]) -> list[float]:
    """r̂ of each row, from the formula, in plain Python."""
    out = [0.0] * len(parts)
    for g in set(groups):
        rows = [j for j, h in enumerate(groups) if h == g]
        for k, w in enumerate(weights):
            x = [parts[j][k] for j in rows]
            mean = sum(x) / len(x)
            std = math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) - 1)) if len(x) > 1 else 0.0
            for j, v in zip(rows, x):
                out[j] += 0.0 if max(x) == min(x) else w * (v - mean) / (std + EPS)
    return out


def test_vine_on_a_two_reward_tree_by_hand():
    """One prompt, G = 2 samples of 4 tokens, each branched after token 2 into two continuations; two rewards,
    `a` in [0, 1] and `b` in [0, 100]. GRPO's sum a + b is all b; GDPO's r̂ weighs each in its own spread. The
    vine advantages of the decoupled tree, against values worked out here."""
    # rows: sample 0, sample 1, then sample 0's continuations, sample 1's
    a = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    b = [0.0, 100.0, 100.0, 0.0, 0.0, 100.0]
    r_hat = decoupled_rewards(
        torch.tensor([a, b]).T, torch.tensor([1.0, 1.0]), torch.zeros(6, dtype=torch.long)
    )
    want = by_hand([[x, y] for x, y in zip(a, b)], [1.0, 1.0], [0] * 6)
    torch.testing.assert_close(r_hat, torch.tensor(want, dtype=torch.float64))
    # each term: mean ½ (a) or 50 (b), unbiased std √0.3 or √3000, so every ±½ or ±50 is ±0.9129 σ
    z = 0.5 / (math.sqrt(0.3) + EPS)
    assert r_hat[0].item() == pytest.approx(z - 50 / (math.sqrt(3000) + EPS))  # a high, b low: ≈ 0
    assert r_hat[2].item() == pytest.approx(z + 50 / (math.sqrt(3000) + EPS))  # both high

    points = torch.tensor([[2], [2]])
    tree = Tree(points, r_hat[2:].view(2, 1, 2))
    mask, step = torch.ones(2, 4), torch.arange(4).expand(2, 4)
    got = segment_advantages(r_hat[:2], 2, tree, mask, step, include_root=True, scale="none")
    v0 = (r_hat[0] + r_hat[1]) / 2  # the group's value: its samples' mean
    v1 = [(r_hat[0] + r_hat[2] + r_hat[3]) / 3, (r_hat[1] + r_hat[4] + r_hat[5]) / 3]  # include_root
    for i in range(2):
        assert got[i, :2].tolist() == pytest.approx([float(v1[i] - v0)] * 2, abs=1e-6)  # before the point
        assert got[i, 2:].tolist() == pytest.approx([float(r_hat[i] - v1[i])] * 2, abs=1e-6)  # after it
    summed = torch.tensor(a) + torch.tensor(b)
    raw = segment_advantages(
        summed[:2], 2, Tree(points, summed[2:].double().view(2, 1, 2)), mask, step, True, "none"
    )
    assert raw[1, 2:].abs().min() > 30  # in reward units of b: a does not count


def test_which_schemes_read_the_decoupled_rewards():
    """The shipped schemes that read rewards are the continuation- and value-based ones; the rest read the
    sequence advantage (GDPO's already)."""
    reads = {name for name in CREDIT_SCHEMES if get_scheme(name).needs & REWARD_NEEDS}
    assert reads == {"vine", "tree", "tempo", "stepwise"}, reads


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("gdpo")
    return {"model": str(tiny_policy_dir(root)), "prompts": write_prompt_file(root / "p.jsonl")}


def test_the_collector_hands_vine_the_decoupled_rewards_of_samples_and_continuations(tiny, monkeypatch):
    """A vine step on the tiny prior with r = red + blue_hundred under per_reward: the rewards the credit
    reads (the samples' in the rollout's state, the continuations' in the tree) are r̂ of every sample and
    continuation of the group, recomputed here from what the reward returned for each."""
    calls = []
    real = branches_mod.call_reward

    def spy(reward, outputs, texts, metadata):
        out = real(reward, outputs, texts, metadata)
        calls.append(out)
        return out

    monkeypatch.setattr(branches_mod, "call_reward", spy)
    spec = "1*repro_fixtures:red+1*repro_fixtures:blue_hundred"
    cfg = load_config(
        "vine",
        overrides=[
            "rollout.prompts_per_step=2",
            "rollout.group_size=2",
            "branching.k=6",
            "rollout.cfg_scale=2",
            "rollout.autocast=none",
            "branching.continuations=2",
            "advantage.reward_norm=per_reward",
            "advantage.dynamic_sampling=false",
            f"reward={spec}",
        ],
    )
    policy, reward = load_policy(tiny["model"]).eval(), build_reward(spec)
    collector = BatchCollector(cfg, PromptStream(read_prompts(tiny["prompts"]), 0))
    batch = collector.collect(1, policy, reward, sampling_params(cfg)).batch
    (cont,) = calls
    G, B = 2, len(batch.rollout)
    assert batch.reward.term_names == cont.term_names == ("red", "blue_hundred")
    roots, conts = batch.reward.terms.tolist(), cont.terms.tolist()  # each sample's score under each term
    tree = batch.tree
    root_of = [
        b for b in range(B) for k in range(tree.points.shape[1]) for c in range(2) if tree.exists[b, k, c]
    ]
    want = by_hand(roots + conts, [1.0, 1.0], [i // G for i in range(B)] + [b // G for b in root_of])
    torch.testing.assert_close(
        batch.rollout.state[CREDIT_REWARDS], torch.tensor(want[:B], dtype=torch.float64)
    )
    got = tree.rewards[tree.exists]  # row by row, point by point, continuation by continuation
    torch.testing.assert_close(got, torch.tensor(want[B:], dtype=torch.float64))
    assert torch.tensor([s for s in batch.reward.scores]).abs().max() > 5  # the raw rewards stay as scored


@pytest.mark.parametrize("algo", ["vine", "tree", "tempo", "stepwise"])
def test_every_scheme_that_reads_rewards_trains_under_gdpo(algo, tiny, tmp_path, capsys, monkeypatch):
    import t2i_gcpo.train.trainer as trainer_mod

    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)
    model = "masked:" + build_tiny_masked(tmp_path) if algo == "stepwise" else tiny["model"]
    code, _, err = cli(
        capsys,
        "train",
        "--algo",
        algo,
        "--prompts",
        tiny["prompts"],
        "--model",
        model,
        "--reward",
        "1*repro_fixtures:red+1*repro_fixtures:blue_hundred",
        "--steps",
        "1",
        "--report-to",
        "none",
        "--out",
        tmp_path / "run",
        "--set",
        "advantage.reward_norm=per_reward",
        "--set",
        "rollout.prompts_per_step=2",
        "--set",
        "rollout.group_size=2",
        "--set",
        "eval_every=-1",
        "--set",
        "branching.k=2" if algo != "vine" else "branching.k=6",
    )
    assert code == 0, err


def test_stepwise_reads_the_decoupled_rewards_of_its_step_predictions(tmp_path, monkeypatch):
    """Stepwise on the tiny masked prior under per_reward: r(x̂_s) of every step's prediction, per term, each
    group's steps and samples pooled — recomputed here from what the reward returned at every step."""
    from t2i_gcpo.rewards import combine

    calls = []  # the step predictions' calls (train/credit imports call_reward when it scores them)
    real = combine.call_reward

    def spy(reward, outputs, texts, metadata):
        out = real(reward, outputs, texts, metadata)
        calls.append(out)
        return out

    monkeypatch.setattr(combine, "call_reward", spy)
    spec = "1*repro_fixtures:red+1*repro_fixtures:blue_hundred"
    cfg = load_config(
        "stepwise",
        overrides=[
            "rollout.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.cfg_scale=2",
            "rollout.autocast=none",
            "advantage.reward_norm=per_reward",
            "advantage.dynamic_sampling=false",
            f"reward={spec}",
        ],
    )
    policy, reward = load_policy("masked:" + build_tiny_masked(tmp_path)).eval(), build_reward(spec)
    prompts = read_prompts(write_prompt_file(tmp_path / "p.jsonl"))
    batch = (
        BatchCollector(cfg, PromptStream(prompts, 0)).collect(1, policy, reward, sampling_params(cfg)).batch
    )
    calls = [
        out for out in calls if out.term_names == ("red", "blue_hundred")
    ]  # the sum's, not each term's own
    steps = [out.terms.tolist() for out in calls]  # the S − 1 step calls
    finals = batch.reward.terms.tolist()
    B, S = len(batch.rollout), len(steps) + 1
    rows = [steps[s][b] if s < S - 1 else finals[b] for b in range(B) for s in range(S)]
    want = torch.tensor(by_hand(rows, [1.0, 1.0], [b // 2 for b in range(B) for _ in range(S)])).view(B, S)
    torch.testing.assert_close(batch.rollout.state["step_rewards"], want.float())


def test_a_scheme_of_the_users_that_reads_rewards_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "mine.py").write_text(
        "from t2i_gcpo import credit_scheme\n\n@credit_scheme(needs=('rewards',))\n"
        "def by_reward(inputs):\n    return (inputs.rewards > 0.5).float()[:, None] * inputs.mask\n"
    )
    out = tmp_path / "run"
    code, _, err = cli(
        capsys,
        "train",
        "--prompts",
        "prompts/shapeworld_train.txt",
        "--credit",
        f"{tmp_path / 'mine.py'}:by_reward",
        "--set",
        "advantage.reward_norm=per_reward",
        "--out",
        out,
    )
    line = error_line(err)
    assert code == 2 and "per_reward (GDPO)" in line and "mine.py:by_reward', which reads rewards" in line, (
        line
    )
    assert "advantage.reward_norm=sum" in line and not out.exists()
