"""Stepwise rewards for masked models (docs/concepts/tree_credit.md#stepwise-rewards): the gain maths against
hand-computed values, the samplers' recorded predictions x̂_s, the collector's scoring and budget counts, and
`train --algo stepwise` from the CLI on the shipped masked prior and a tiny aMUSEd (an autoregressive model
refused before its run directory exists)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from t2i_gcpo import metrics as M
from t2i_gcpo.config import TrainConfig
from t2i_gcpo.core.advantages import group_advantages
from t2i_gcpo.core.schemes import CreditInputs, CreditSchemeError, credit_weights
from t2i_gcpo.core.stepwise import step_gains, stepwise_advantages
from t2i_gcpo.policies.base import STEP_PREDICTIONS, STEP_REWARDS, PromptRecord, Rollout
from t2i_gcpo.policies.registry import load_policy
from t2i_gcpo.tasks.loop import group_generators
from t2i_gcpo.train.collect import BatchCollector
from t2i_gcpo.train.credit import scheme_weights, score_step_predictions
from t2i_gcpo.train.data import PromptStream

from cli_helpers import cli, error_line
from tiny_models import PROMPTS, PROMPTS_DIR, build_tiny_amused, build_tiny_masked
from train_fixtures import redness

R2 = math.sqrt(2)

# ---------------------------------------------------------------------------- the maths


def test_gains_start_from_the_group_mean_of_the_first_prediction():
    r = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.5, 0.5, 2.0], [0.5, 1.5, 1.0]])  # two groups of 2
    g = step_gains(r, 2)
    # r_{−1} = 0.5 for the first group (mean of 0 and 1), 0.5 for the second (mean of 0.5 and 0.5)
    want = torch.tensor([[-0.5, 1.0, 0.0], [0.5, -1.0, 0.0], [0.0, 0.0, 1.5], [0.0, 1.0, -0.5]])
    assert torch.allclose(g.float(), want)
    # the gains telescope: Σ_s g = r_{S−1} − r_{−1}
    assert torch.allclose(g.sum(1).float(), r[:, -1] - torch.tensor([0.5, 0.5, 0.5, 0.5]))


def test_tokens_revealed_at_step_s_get_that_steps_standardised_gain():
    """G = 2, S = 3: r = [0, 1, 1] and [1, 0, 0] → gains [−½, 1, 0] and [½, −1, 0]; each step's gains are
    centred across the group and divided by their std (√2/2 at step 0, √2 at step 1); step
    2's are equal: 0."""
    r = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    step = torch.tensor([[0, 1, 2, 1], [2, 0, 1, 1]])
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 1, 0]])  # the padded token gets nothing
    per_step = torch.tensor([[-1 / R2, 1 / R2, 0.0], [1 / R2, -1 / R2, 0.0]])  # A_{i,s}, "step"
    want = torch.tensor(
        [[per_step[0, 0], per_step[0, 1], 0, per_step[0, 1]], [0, per_step[1, 0], per_step[1, 1], 0]]
    )
    got = stepwise_advantages(r, 2, step, mask, "step", eps=0.0)
    assert torch.allclose(got, want, atol=1e-6)
    none = stepwise_advantages(r, 2, step, mask, "none")
    assert torch.allclose(none, torch.tensor([[-0.5, 1.0, 0.0, 1.0], [0.0, 0.5, -1.0, 0.0]]))
    # "group": the centred gains over the std of the final rewards (1, 0: √2/2)
    group = stepwise_advantages(r, 2, step, mask, "group", eps=0.0)
    assert torch.allclose(group, none * R2, atol=1e-6)


def test_group_normalised_step_advantages_sum_to_the_grpo_advantage():
    gen = torch.Generator().manual_seed(0)
    G, S = 4, 5
    r = torch.rand(3 * G, S, generator=gen)
    step = torch.arange(S).expand(3 * G, -1)  # one token per step
    adv = stepwise_advantages(r, G, step, torch.ones(3 * G, S), "group")
    assert torch.allclose(adv.sum(1), group_advantages(r[:, -1], G), atol=1e-5)
    centred = stepwise_advantages(r, G, step, torch.ones(3 * G, S), "none")
    assert torch.allclose(centred.sum(1), group_advantages(r[:, -1], G, scale="none"), atol=1e-5)


def test_an_unscored_group_gets_no_credit_and_bad_steps_are_refused():
    r = torch.tensor([[0.0, 1.0], [1.0, 0.0], [float("nan")] * 2, [float("nan")] * 2])
    step, mask = torch.tensor([[0, 1]] * 4), torch.ones(4, 2)
    adv = stepwise_advantages(r, 2, step, mask)
    assert torch.equal(adv[2:], torch.zeros(2, 2)) and (adv[:2] != 0).all()
    with pytest.raises(ValueError, match="outside 0 … 1"):
        stepwise_advantages(r[:2], 2, torch.tensor([[0, 2], [0, 1]]), torch.ones(2, 2))
    assert stepwise_advantages(
        r[:2], 2, torch.tensor([[0, 2], [0, 1]]), torch.tensor([[1.0, 0], [1, 1]])
    ).shape == (2, 2)
    with pytest.raises(ValueError, match="multiple of group_size"):
        step_gains(torch.zeros(3, 2), 2)


def test_the_scheme_needs_step_rewards_and_returns_the_core_advantages():
    r = torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    step, mask = torch.tensor([[0, 1, 2], [2, 0, 1]]), torch.ones(2, 3)
    with pytest.raises(CreditSchemeError, match="step_rewards"):
        credit_weights("stepwise", CreditInputs(mask=mask, step=step, group_size=2))
    inp = CreditInputs(mask=mask, step=step, group_size=2, step_rewards=r)
    for norm in ("step", "group", "none"):
        got = credit_weights("stepwise", inp, {"normalisation": norm})
        assert torch.equal(got, stepwise_advantages(r, 2, step, mask, norm))


# ---------------------------------------------------------------------------- the samplers


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("stepwise")
    build_tiny_amused(str(root / "amused"))
    return {"masked": build_tiny_masked(str(root)), "amused": str(root / "amused"), "root": root}


def _load(tiny, family):
    return load_policy(f"{family}:{tiny[family]}").eval()


@pytest.mark.parametrize("family", ["masked", "amused"])
@pytest.mark.parametrize("estimator", ["trajectory", "remask"])
def test_recorded_predictions_hold_the_revealed_tokens_and_end_on_the_sample(tiny, family, estimator):
    policy = _load(tiny, family)
    policy.set_estimator(estimator)
    prompts = [PromptRecord(p) for p in PROMPTS[:2]]
    sampling = dataclasses.replace(policy.default_sampling(), steps=4)
    plain = policy.rollout(prompts, 3, sampling, group_generators(0, "t", [0, 1]))
    rec = policy.rollout(
        prompts, 3, dataclasses.replace(sampling, record_predictions=True), group_generators(0, "t", [0, 1])
    )
    # recording changes nothing of the sample
    assert STEP_PREDICTIONS not in plain.state
    assert torch.equal(plain.tokens, rec.tokens) and torch.equal(plain.step, rec.step)
    assert all(torch.equal(plain.logp[c], rec.logp[c]) for c in plain.logp)
    x = rec.state[STEP_PREDICTIONS]
    assert x.shape == (6, 4, rec.tokens.shape[1]) and x.dtype == torch.long
    assert torch.equal(x[:, -1], rec.tokens), "x̂_{S−1} is the sample"
    assert (x != policy.mask_id).all(), "a full prediction: no masked position left"
    for s in range(4):
        revealed = rec.step <= s
        assert torch.equal(x[:, s][revealed], rec.tokens[revealed]), s
    assert (x[:, 0] != rec.tokens).any(), "the first prediction is not the sample (a vacuous check otherwise)"
    # rows follow select / concat, and a continuation does not inherit its root's predictions
    assert torch.equal(rec.select([4, 1]).state[STEP_PREDICTIONS], x[[4, 1]])
    branched = policy.branch(rec, torch.tensor([[2]] * 6), 1, group_generators(0, "b", range(6)))
    assert STEP_PREDICTIONS not in branched.rollout.state


# ---------------------------------------------------------------------------- the collector


class CountingReward:
    """`redness`, remembering how many images each call scored."""

    def __init__(self):
        self.calls: list[int] = []

    def __call__(self, images, prompts, metadata):
        self.calls.append(len(images))
        return redness(images, prompts, metadata)


def stepwise_collector(P=2, G=4, dynamic=False) -> BatchCollector:
    cfg = TrainConfig()
    cfg.rollout.prompts_per_step, cfg.rollout.group_size, cfg.rollout.steps = P, G, 4
    cfg.advantage.dynamic_sampling = dynamic
    cfg.credit.scheme = "stepwise"
    return BatchCollector(cfg, PromptStream([PromptRecord(p) for p in PROMPTS[:6]], 0))


def test_the_collector_scores_every_prediction_and_counts_it_in_the_budget(tiny):
    policy = _load(tiny, "masked")
    reward, c = CountingReward(), stepwise_collector()
    got = c.collect(1, policy, reward, dataclasses.replace(policy.default_sampling(), steps=4))
    ro = got.batch.rollout
    B, S = len(ro), 4
    assert reward.calls == [B] * S, "the samples, then x̂_0 … x̂_{S−2}: one call of B images each"
    assert got.budget[M.BUDGET_REWARD_CALLS] == S and got.budget[M.BUDGET_STEP_PREDICTIONS] == B * (S - 1)
    assert got.budget[M.BUDGET_SAMPLES] == B, "a prediction is scored, never sampled"
    metrics = got.metrics()
    assert metrics[M.BUDGET_TOTAL.format(key=M.BUDGET_STEP_PREDICTIONS)] == B * (S - 1)
    r = ro.state[STEP_REWARDS]
    assert r.shape == (B, S) and torch.equal(r[:, -1], got.batch.reward.scores.float())
    x = ro.state[STEP_PREDICTIONS]
    for s in range(S - 1):  # each column is the reward of that step's decoded prediction
        images = policy.decode(dataclasses.replace(ro, tokens=x[:, s]))
        assert torch.allclose(r[:, s], redness(images, ro.texts, [{}] * B).scores.float())
    assert not torch.equal(r[:, 0], r[:, -1])
    # the stand-in of a process without signal: unscored (NaN), so its credit is 0
    stand_in = got.stand_in()
    assert torch.isnan(stand_in.rollout.state[STEP_REWARDS]).all()
    w = scheme_weights(
        c.cfg.credit, stand_in.rollout, stand_in.advantages, policy, None, "pos", ("stepwise",)
    )
    assert torch.equal(w["stepwise"], torch.ones_like(w["stepwise"])), "credit share of all-zero advantages"


def test_the_stepwise_rewards_equal_a_direct_scoring():
    """`score_step_predictions` reuses the sample's own score for the last step and makes S − 1 calls (a
    policy whose decode is the identity on the tokens, a reward that is their mean)."""
    x = torch.tensor([[[0, 2], [2, 2], [4, 4]], [[1, 1], [3, 1], [5, 1]]])  # [B=2, S=3, T=2]
    ro = Rollout(
        tokens=x[:, -1],
        mask=torch.ones(2, 2),
        step=torch.zeros(2, 2).long(),
        logp={},
        prompts=[PromptRecord("a")] * 2,
        group_size=2,
        state={STEP_PREDICTIONS: x},
    )

    class Identity(torch.nn.Module):
        def decode(self, rollout):
            return rollout.tokens.float()

    calls = []

    def mean(images, prompts, metadata):
        calls.append(len(images))
        return images.mean(1)

    rewards, n, outputs = score_step_predictions(
        Identity(), mean, ro, torch.tensor([9.0, 7.0]), keep_outputs=True
    )
    assert n == 2 and calls == [2, 2] and len(outputs) == 2
    assert torch.equal(rewards, torch.tensor([[1.0, 2.0, 9.0], [1.0, 2.0, 7.0]]))


# ---------------------------------------------------------------------------- from the CLI

# without dynamic sampling every step keeps its P = 2 groups of 4 and carries none: exact budget counts
FAST = [
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.steps=4",
    "advantage.dynamic_sampling=false",
    "sample_every=2",
    "save_every=2",
    "eval_every=-1",
    "rollout.autocast=none",
    "optim.autocast=none",
]


def _train(capsys, model, prompts, out, reward=()):
    args = [
        "train",
        "--prompts",
        prompts,
        "--model",
        model,
        "--algo",
        "stepwise",
        "--out",
        out,
        "--steps",
        "2",
        "--seed",
        "0",
        *reward,
    ]
    for kv in FAST:
        args += ["--set", kv]
    return cli(capsys, *args)


def _check_run(out, code, stdout):
    assert code == 0
    assert (
        "note: credit scheme 'stepwise' scores the model's prediction after each of the 4 reveal steps"
        in stdout
    )
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r[M.STEP] for r in rows] == [1, 2]
    for r in rows:  # 8 samples; x̂_0 … x̂_2 of each scored in 3 more calls
        assert (r[M.BUDGET_SAMPLES], r[M.BUDGET_STEP_PREDICTIONS], r[M.BUDGET_REWARD_CALLS]) == (8, 24, 4)
        assert math.isfinite(r[M.LOSS_POLICY])
    assert rows[-1][M.BUDGET_TOTAL.format(key=M.BUDGET_STEP_PREDICTIONS)] == 48
    config = (out / "config.yaml").read_text()
    assert "scheme: stepwise" in config and "normalisation: step" in config
    assert (out / "credit_maps" / "step_000002.png").is_file()


@pytest.mark.slow  # a long end-to-end run (the default tier keeps its lighter siblings)
def test_train_stepwise_on_the_shipped_masked_prior(tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, _ = _train(capsys, "shapeworld-masked", str(PROMPTS_DIR / "shapeworld_train.txt"), out)
    _check_run(out, code, stdout)


def test_train_stepwise_on_a_tiny_amused(tiny, tmp_path, capsys):
    prompts = tiny["root"] / "geneval.txt"
    prompts.write_text("a photo of a cat\na photo of two dogs\na photo of a red car\na photo of a bench\n")
    out = tmp_path / "run"
    code, stdout, _ = _train(
        capsys, f"amused:{tiny['amused']}", str(prompts), out, ("--reward", "train_fixtures:redness")
    )
    _check_run(out, code, stdout)


def test_an_autoregressive_model_is_refused_before_its_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = _train(capsys, "shapeworld", str(PROMPTS_DIR / "shapeworld_train.txt"), out)
    assert code == 2 and not out.exists()
    assert "credit scheme 'stepwise' needs a full prediction at every reveal step" in error_line(err)


# ---------------------------------------------------------------------------- credit maps


def test_credit_maps_draw_each_samples_reward_trajectory(tiny, tmp_path, capsys):
    out = tmp_path / "maps"
    code, stdout, _ = cli(
        capsys,
        "credit-map",
        "--model",
        f"masked:{tiny['masked']}",
        "--schemes",
        "stepwise,uniform",
        "--prompt",
        PROMPTS[0],
        "--group",
        "3",
        "--out",
        out,
        "--reward",
        "train_fixtures:redness",
    )
    assert code == 0
    steps = load_policy(f"masked:{tiny['masked']}").default_sampling().steps
    assert f"stepwise: {3 * (steps - 1)} predictions over the reveal steps scored" in stdout
    assert (out / "00000.png").is_file() and (out / "00000_steps.png").is_file()
    page = (out / "credit_maps.html").read_text()
    assert "r(x̂_s) over the reveal steps" in page and page.count(" → ") >= 3 * (steps - 1)
    assert "predictions over the reveal steps" in page, "the figure of the predictions is in the page"
    # an autoregressive model has no reveal steps: refused in one line when the scheme is named
    code, _, err = cli(
        capsys,
        "credit-map",
        "--model",
        "shapeworld",
        "--schemes",
        "stepwise",
        "--prompt",
        "a photo of a red circle",
        "--out",
        tmp_path / "ar",
    )
    assert code == 2 and "needs a full prediction at every reveal step" in error_line(
        err, ignore="credit maps"
    )


def test_the_trajectory_column_and_table():
    from t2i_gcpo.viz.credit_map import STEP_REWARD_COLUMN, _columns, _group_table, trajectory_range

    samples = [{"reward": 1.0, "step_rewards": [0.0, 0.5, 1.0]}, {"reward": 0.0}]
    assert _columns(samples, ["stepwise"]) == ["stepwise", STEP_REWARD_COLUMN]
    assert trajectory_range(samples) == pytest.approx((-0.05, 1.05))
    assert trajectory_range([{"step_rewards": [0.25, 0.25]}]) == (-0.25, 0.75)
    table = _group_table(samples, [])
    assert "<td>0.000 → 0.500 → 1.000</td>" in table and "<td>–</td>" in table
