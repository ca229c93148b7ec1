"""Rollout vs update log-probs: the mismatch metrics, `rollout.old_logprobs=recompute` and truncated
importance sampling (`loss.tis_cap`), against hand-computed values and on a tiny run."""

from __future__ import annotations

import json
import math

import pytest
import torch

from t2i_gcpo.config import load_config
from t2i_gcpo.core.losses import policy_loss, rollout_mismatch, tis_weights
from t2i_gcpo.errors import UserError
from t2i_gcpo.train.run import prepare, run

from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file

FAST = [
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.cfg_scale=2",
    "optim.lr=3e-3",
    "sample_every=0",
    "save_every=5",
    "eval_every=-1",
    "advantage.dynamic_sampling=false",
]
FP32 = ["rollout.autocast=none", "optim.autocast=none"]
BF16 = ["rollout.autocast=bf16", "optim.autocast=bf16"]


def test_rollout_mismatch_hand_computed():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.7, -0.9]])
    recorded = torch.tensor([[-1.1, -2.0, -2.5], [-0.5, -0.4, float("nan")]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # the 0.5 gap and the NaN sit in padding
    k3, gap = rollout_mismatch(logp, recorded, mask)
    # q = recorded − logp on the valid tokens: −0.1, 0, 0, +0.3; k3 = e^q − q − 1
    want = ((math.exp(-0.1) + 0.1 - 1) + (math.exp(0.3) - 0.3 - 1)) / 4
    assert k3.item() == pytest.approx(want, rel=1e-6)  # float32 inputs
    assert gap.item() == pytest.approx(0.3, rel=1e-6)
    zero_k3, zero_gap = rollout_mismatch(logp, logp.clone(), mask)
    assert zero_k3.item() == 0 and zero_gap.item() == 0
    none_k3, none_gap = rollout_mismatch(logp, recorded, torch.zeros_like(mask))
    assert none_k3.item() == 0 and none_gap.item() == 0


def test_tis_weights_hand_computed_and_capped():
    old = torch.tensor([[-1.0, -2.0, -0.3]])
    rollout = torch.tensor([[-1.5, -1.0, -0.3]])
    w = tis_weights(old, rollout, cap=1.5)
    # π_old/π_rollout = e^0.5 = 1.6487 (capped at 1.5), e^−1 = 0.3679, 1
    assert w[0].tolist() == pytest.approx([1.5, math.exp(-1.0), 1.0], rel=1e-6)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="cap"):
        tis_weights(old, rollout, cap=0.0)


def test_is_weights_multiply_the_surrogate_and_its_gradient():
    """ρ = 1, A = 2, token-mean over two tokens: L = −(2·0.5 + 2·1.5)/2 = −2; ∂L/∂log π = −A·w/N."""
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = logp.detach().clone()
    loss, _ = policy_loss(
        logp,
        old,
        torch.tensor([2.0]),
        torch.ones(1, 2),
        aggregation="token-mean",
        is_weights=torch.tensor([[0.5, 1.5]]),
    )
    assert loss.item() == pytest.approx(-2.0)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.5, -1.5])
    with pytest.raises(ValueError, match="shape"):
        policy_loss(logp, old, torch.tensor([2.0]), torch.ones(1, 2), is_weights=torch.ones(1, 3))


def test_tis_needs_recompute_and_a_positive_cap():
    with pytest.raises(UserError, match="'loss.tis_cap': needs rollout.old_logprobs=recompute"):
        load_config(overrides=["loss.tis_cap=2"])
    with pytest.raises(UserError, match="'loss.tis_cap': must be > 0"):
        load_config(overrides=["loss.tis_cap=0", "rollout.old_logprobs=recompute"])
    cfg = load_config(overrides=["loss.tis_cap=2", "rollout.old_logprobs=recompute"])
    assert cfg.loss.tis_cap == 2.0


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {"model": str(tiny_policy_dir(root)), "prompts": str(write_prompt_file(root / "p.jsonl"))}


def train(tiny, out, extra=(), steps=1) -> list[dict]:
    flags = dict(
        prompts=tiny["prompts"],
        model=tiny["model"],
        reward="train_fixtures:redness",
        out=str(out),
        steps=steps,
        seed=0,
    )
    run(prepare(algo="gcpo", flags=flags, overrides=(*FAST, *extra)))
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_float32_update_reproduces_the_recorded_log_probs(tiny, tmp_path):
    """In float32 the KV-cache sampler and the teacher-forced forward agree to float rounding: the logged
    mismatch is ≈ 0, and the first update's ratio to the recorded log-probs is ≈ 1."""
    (row,) = train(tiny, tmp_path / "fp32", FP32)
    assert 0 <= row["mismatch/k3_pos"] < 1e-10 and row["mismatch/max_abs_pos"] < 1e-5, row
    assert row["ratio/mean"] == pytest.approx(1.0, abs=1e-6)


def test_bf16_mismatch_is_measured_and_recompute_removes_it_from_the_ratio(tiny, tmp_path):
    """bf16 sampling and a bf16 update round differently: the mismatch is logged (> 0) and the ratio to
    the recorded log-probs is off 1. With recompute, π_old is the update's own first-pass forward: the
    ratio is exactly 1 and nothing is clipped; the mismatch is still logged, and the same (same samples,
    same weights)."""
    (rec,) = train(tiny, tmp_path / "recorded", BF16)
    (rep,) = train(tiny, tmp_path / "recompute", [*BF16, "rollout.old_logprobs=recompute"])
    assert rec["mismatch/max_abs_pos"] > 1e-4 and rec["mismatch/k3_pos"] > 0, rec
    assert rep["mismatch/k3_pos"] == rec["mismatch/k3_pos"]
    assert rep["mismatch/max_abs_pos"] == rec["mismatch/max_abs_pos"]
    assert rec["ratio/mean"] != 1.0
    assert rep["ratio/mean"] == 1.0 and rep["clip_frac"] == 0.0


@pytest.mark.parametrize(
    "extra",
    [
        ["rollout.old_logprobs=recompute", "loss.tis_cap=2"],
        ["rollout.old_logprobs=recompute", "optim.update_epochs=2", "optim.minibatches=2"],
        ["rollout.old_logprobs=recompute", "optim.update_epochs=2", "loss.tis_cap=1.01"],
        ["rollout.train_logp=cfg"],
    ],
    ids=["tis", "recompute-epochs", "recompute-epochs-tis", "guided"],
)
def test_each_option_trains_a_step(tiny, tmp_path, extra):
    (row,) = train(tiny, tmp_path / "run", [*BF16, *extra])
    ctx = "guided" if "rollout.train_logp=cfg" in extra else "pos"
    assert math.isfinite(row[f"mismatch/k3_{ctx}"]) and math.isfinite(row["grad_norm"]), row
    if "loss.tis_cap=2" in extra:  # bf16 gaps are far below log 2: nothing reaches the cap
        assert row["tis/capped_frac"] == 0 and row["tis/weight_mean"] == pytest.approx(1.0, abs=0.05)
    if "loss.tis_cap=1.01" in extra:
        assert 0 < row["tis/weight_mean"] <= 1.01
    if "optim.update_epochs=2" in extra:  # the second epoch's ratio is to the recomputed π_old
        assert row["ratio/mean"] != 1.0


@pytest.mark.parametrize("autocast", ["none", "bf16"])
def test_the_recompute_pass_equals_the_first_pass_forward(tiny, autocast):
    """Why recompute with one update epoch costs nothing: a separate no-grad forward (what update_epochs
    > 1 runs) gives exactly the numbers the first pass's forward with gradient gives, in either precision."""
    from types import SimpleNamespace

    from t2i_gcpo.policies.base import PromptRecord, SamplingParams
    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.train.update import precision, recompute_old_logprobs

    policy = load_policy(tiny["model"])
    prompts = [PromptRecord(json.loads(line)["prompt"]) for line in open(tiny["prompts"]).readlines()[:2]]
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    ro = policy.rollout(prompts, 4, SamplingParams(guidance_scale=2.0, autocast=autocast), gens)
    cfg = load_config(overrides=[f"optim.autocast={autocast}", "optim.minibatches=2"])
    acc = SimpleNamespace(device=torch.device("cpu"))
    chunks = torch.tensor_split(torch.arange(len(ro)), 2)
    old = recompute_old_logprobs(cfg, ro, chunks, policy, acc, "pos")
    for idx in chunks:
        with precision(cfg, acc):
            logp = policy(ro.select(idx), context="pos")
        assert logp.requires_grad and torch.equal(logp.detach().float(), old[idx])
