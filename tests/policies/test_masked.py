"""The built-in masked prior as a Policy (policies/masked.py, policies/maskgen.py): reveal schedule and
each token revealed exactly once, recorded log-probs ≡ trajectory replay for every context (and under
a guidance schedule), CFG scale 1, bidirectional attention, per-prompt generators (a sample ignores
its batch-mates), the remask estimator's masks and values, a policy-gradient step raising the
log-probs of positive-advantage samples under both estimators, persistence, the pretraining loop."""

from __future__ import annotations

import math
import os

import pytest
import torch

from t2i_gcpo.core.losses import policy_loss
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import Policy, PromptRecord, Rollout, SamplingParams
from t2i_gcpo.policies.families.masked import SHIPPED
from t2i_gcpo.policies.masked import MaskedConfig, MaskedPolicy, load_masked_policy
from t2i_gcpo.policies.maskgen import (
    draw_remasks,
    guidance_scales,
    mask_ratio,
    reveal_counts,
    step_progress,
)
from t2i_gcpo.policies.sampling import GUIDANCE, ChunkedDists
from t2i_gcpo.tasks.loop import group_generators

from tiny_models import tiny_masked_policy

PROMPTS = ["a photo of a red circle", "a photo of two blue squares", "a photo of a cross above a circle"]
CONTEXTS = ("pos", "neg", "guided")
STEPS = 4
T, K = 16, 16


def tiny_policy(storage: str = "float32", seed: int = 0, **kw) -> MaskedPolicy:
    return tiny_masked_policy(PROMPTS, K, STEPS, storage, seed, **kw)


def records(texts: list[str]) -> list[PromptRecord]:
    return [PromptRecord(t) for t in texts]


def gens(seed: int, n: int) -> list[torch.Generator]:
    return group_generators(seed, "test", range(n))


def roll(policy: MaskedPolicy, texts: list[str], group_size: int, seed: int, **sampling) -> Rollout:
    return policy.rollout(records(texts), group_size, SamplingParams(**sampling), gens(seed, len(texts)))


@pytest.fixture(scope="module")
def policy() -> MaskedPolicy:
    return tiny_policy()


@pytest.fixture(scope="module")
def rollout(policy):
    return roll(policy, PROMPTS[:2], 3, seed=1, guidance_scale=2.5, temperature=0.7)


# ----------------------------------------------------------------------------- schedule and shapes


def test_reveal_counts_hand_computed():
    # after step s, floor(16·cos(π/2·(s+1)/4)) stay masked: 14, 11, 6, 0
    assert reveal_counts(16, 4) == [2, 3, 5, 6]
    assert reveal_counts(16, 4, "linear") == [4, 4, 4, 4]
    assert reveal_counts(16, 1) == [16]
    # more steps than tokens: each step reveals at least one while it can, the last reveals the rest
    assert reveal_counts(3, 5) == [1, 1, 0, 0, 1] and sum(reveal_counts(64, 12)) == 64
    with pytest.raises(UserError):
        reveal_counts(16, 0)


def test_guidance_schedules():
    p = step_progress(4)
    assert torch.allclose(p, torch.tensor([0, 1 / 3, 2 / 3, 1]))
    assert torch.equal(guidance_scales(3.0, "constant", p), torch.full((4,), 3.0))
    assert torch.allclose(guidance_scales(3.0, "linear", p), torch.linspace(1, 3, 4))
    with pytest.raises(UserError, match="constant"):
        guidance_scales(3.0, "cosine", p)


def test_is_a_policy_and_rollout_layout(policy, rollout):
    assert isinstance(policy, Policy)
    assert policy.output == "image" and policy.default_task == "shapeworld"
    assert policy.guidance == "u + s(c − u)" and policy.guidance in GUIDANCE
    assert policy.layout.grid == (4, 4) and policy.layout.kind == "grid"
    assert policy.default_sampling() == SamplingParams(
        guidance_scale=3.0, steps=STEPS, reveal_order="confidence"
    )
    assert rollout.tokens.shape == (6, T) and rollout.tokens.dtype == torch.long
    assert int(rollout.tokens.max()) < K  # no [MASK] left, only codes
    assert rollout.texts == [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3
    assert rollout.group_size == 3 and rollout.max_len == T
    assert rollout.sampling.steps == STEPS  # the resolved number of steps is recorded
    assert torch.equal(rollout.mask, torch.ones(6, T))
    assert set(rollout.logp) == set(CONTEXTS)
    assert all(v.shape == (6, T) and (v <= 0).all() for v in rollout.logp.values())
    assert rollout.state["estimator"] == "trajectory"


def test_each_token_revealed_exactly_once(policy, rollout):
    step = rollout.step
    assert step.dtype == torch.long and int(step.min()) >= 0 and int(step.max()) < STEPS
    counts = reveal_counts(T, STEPS)
    for row in step:  # every row reveals the schedule's number of tokens at each step
        assert torch.bincount(row, minlength=STEPS).tolist() == counts
    # several steps, a different order per sample
    assert len({tuple(r.tolist()) for r in step}) > 1


def test_mask_ratio_schedules():
    r = torch.tensor([0.0, 0.5, 1.0])
    assert torch.allclose(mask_ratio(r), torch.tensor([1.0, math.cos(math.pi / 4), 0.0]), atol=1e-6)
    assert torch.allclose(mask_ratio(r, "linear"), torch.tensor([1.0, 0.5, 0.0]))


# ----------------------------------------------------------------------------- log-probs


def test_replay_one_step_per_forward_equals_stacked(policy, rollout):
    policy.replay_rows = 1  # one step per forward instead of all steps stacked along the batch
    try:
        one = policy.logprobs(rollout, "guided")
    finally:
        policy.replay_rows = 512
    assert (one - policy.logprobs(rollout, "guided")).abs().max().item() < 1e-5


def test_replay_by_hand_scores_each_token_at_its_reveal_step(policy, rollout):
    """Token t's log-prob comes from the canvas of its reveal step: tokens revealed earlier in
    place, everything else [MASK]."""
    pid, tok, step = rollout.state["prompt_ids"], rollout.tokens, rollout.step
    want = torch.zeros(6, T)
    with torch.no_grad():
        for s in range(STEPS):
            canvas = torch.where(step < s, tok, policy.mask_id)
            lp = (policy.logits(pid, canvas) / 0.7).log_softmax(-1).gather(-1, tok[..., None]).squeeze(-1)
            want = torch.where(step == s, lp, want)
    assert (want - rollout.logp["pos"]).abs().max().item() < 1e-4


def test_linear_guidance_schedule_replays(policy):
    r = roll(policy, PROMPTS[:2], 2, seed=8, guidance_scale=4.0, guidance_schedule="linear")
    assert (policy.logprobs(r, "guided") - r.logp["guided"]).abs().max().item() < 1e-4
    # step 0 is guided with s = 1: its tokens' guided log-prob is the conditional one
    first = r.step == 0
    assert torch.allclose(r.logp["guided"][first], r.logp["pos"][first], atol=1e-5)
    assert not torch.allclose(r.logp["guided"][~first], r.logp["pos"][~first], atol=1e-3)


def test_dists_are_temperature_scaled_logits_of_the_reveal_step(policy, rollout):
    logp, d = policy.logprobs_and_dists(rollout, "pos")
    assert isinstance(d, ChunkedDists)
    z = d.full()
    assert z.shape == (6, T, K) and not z.requires_grad
    assert torch.allclose(
        logp, z.log_softmax(-1).gather(-1, rollout.tokens[..., None]).squeeze(-1), atol=1e-6
    )
    assert torch.allclose(policy(rollout, "pos"), logp)  # forward = logprobs (DDP syncs grads)
    zg = policy.logprobs_and_dists(rollout, "guided")[1].full() * 0.7
    zn = policy.logprobs_and_dists(rollout, "neg")[1].full() * 0.7
    assert torch.allclose(zg, zn + 2.5 * (z * 0.7 - zn), atol=1e-4)


def test_cfg_scale_one_is_conditional_only(policy):
    r = roll(policy, PROMPTS[:2], 2, seed=3, guidance_scale=1.0)
    assert torch.allclose(r.logp["guided"], r.logp["pos"], atol=1e-6)
    assert torch.allclose(policy.logprobs(r, "guided"), policy.logprobs(r, "pos"), atol=1e-5)
    assert not torch.allclose(r.logp["guided"], r.logp["neg"], atol=1e-3)


def test_attention_is_bidirectional(policy):
    """The prediction at an early position changes when a later image token changes."""
    pid = policy.encode_prompts(PROMPTS[:1])
    canvas = torch.full((1, T), policy.mask_id)
    other = canvas.clone()
    other[0, -1] = 3
    with torch.no_grad():
        a, b = policy.logits(pid, canvas), policy.logits(pid, other)
    assert (a[0, 0] - b[0, 0]).abs().max().item() > 1e-4


def test_null_prompt_is_all_pads(policy):
    pid = policy.encode_prompts(PROMPTS[:1])
    t = policy.tokenizer
    assert policy.prefix(pid, null=True).tolist() == [[t.bos_id] + [t.pad_id] * 8 + [t.boi_id]]


# ----------------------------------------------------------------------------- noise


def test_rollout_needs_one_generator_per_prompt(policy):
    with pytest.raises(ValueError, match="one generator per prompt"):
        policy.rollout(records(PROMPTS[:2]), 2, SamplingParams(), gens(0, 1))


def test_steps_override_and_bad_values(policy):
    r = roll(policy, PROMPTS[:1], 2, seed=2, steps=2)
    assert r.sampling.steps == 2 and int(r.step.max()) == 1
    assert (policy.logprobs(r, "guided") - r.logp["guided"]).abs().max().item() < 1e-4
    with pytest.raises(UserError):
        roll(policy, PROMPTS[:1], 1, seed=2, steps=0)
    with pytest.raises(UserError):
        roll(policy, PROMPTS[:1], 1, seed=2, temperature=0.0)
    with pytest.raises(UserError, match="estimator"):
        policy.set_estimator("bogus")


def test_random_reveal_order_does_not_depend_on_the_weights(policy):
    """Under ``random`` the positions each step reveals come from the prompt's noise alone: two models
    with different weights reveal the same positions in the same steps (and the replay still equals the
    record); under ``confidence`` the weights choose, so the orders differ."""
    other = tiny_policy(seed=5)
    same = [
        roll(m, PROMPTS[:2], 3, seed=4, guidance_scale=2.0, reveal_order="random") for m in (policy, other)
    ]
    assert torch.equal(same[0].step, same[1].step) and not torch.equal(same[0].tokens, same[1].tokens)
    assert same[0].sampling.reveal_order == "random"
    assert (policy.logprobs(same[0], "guided") - same[0].logp["guided"]).abs().max().item() < 1e-4
    assert ((same[0].step >= 0).sum(-1) == T).all()  # each token still revealed exactly once
    conf = [
        roll(m, PROMPTS[:2], 3, seed=4, guidance_scale=2.0, reveal_order="confidence")
        for m in (policy, other)
    ]
    assert not torch.equal(conf[0].step, conf[1].step)
    # the default order is the checkpoint's
    assert roll(policy, PROMPTS[:1], 1, seed=4).sampling.reveal_order == "confidence"
    shuffled = tiny_policy()
    shuffled.config.reveal_order = "random"
    assert shuffled.default_sampling().reveal_order == "random"
    assert torch.equal(roll(shuffled, PROMPTS[:2], 3, seed=4, guidance_scale=2.0).step, same[0].step)
    with pytest.raises(UserError, match="reveal order"):
        roll(policy, PROMPTS[:1], 1, seed=4, reveal_order="bogus")


# ----------------------------------------------------------------------------- remask estimator


@pytest.fixture(scope="module")
def remask_policy():
    return tiny_policy(estimator="remask", remask_count=3)


def test_draw_remasks_counts_and_times():
    u = torch.rand(5, 4, T + 1, generator=torch.Generator().manual_seed(0))
    masks, times = draw_remasks(u)
    assert masks.shape == (5, 4, T) and masks.dtype == torch.bool and times.shape == (5, 4)
    k = torch.arange(4)[None]
    assert ((times >= k / 4) & (times < (k + 1) / 4)).all()  # stratified: one time per quarter
    n = (torch.cos(times * math.pi / 2) * T).round().clamp(1, T)
    assert torch.equal(masks.sum(-1), n.long())


def test_remask_rollout_records_masks_and_estimates(policy, remask_policy):
    remask_policy.load_state_dict(policy.state_dict())
    sp = dict(guidance_scale=2.0, temperature=0.9)
    ro = roll(remask_policy, PROMPTS[:2], 3, seed=4, **sp)
    traj = roll(policy, PROMPTS[:2], 3, seed=4, **sp)
    # the same samples: the re-masks are drawn after the sampler's noise, from the same generators
    assert torch.equal(ro.tokens, traj.tokens) and torch.equal(ro.step, traj.step)
    assert ro.state["estimator"] == "remask"
    masks = ro.state["remask"]
    assert masks.shape == (6, 3, T) and ro.state["remask_t"].shape == (6, 3)
    # the sampler's reveal-step values are kept; logp holds the remask estimates
    for c in CONTEXTS:
        assert torch.allclose(ro.state["sampled_logp"][c], traj.logp[c])
    hit = masks.any(1)
    assert not hit.all()  # some positions were never re-masked here …
    assert torch.equal(ro.scored, hit.float())  # … they are not scored …
    assert torch.equal(ro.loss_mask, ro.scored) and torch.equal(ro.mask, torch.ones(6, T))  # … yet valid
    for c in CONTEXTS:
        assert (ro.logp[c][~hit] == 0).all() and (ro.logp[c][hit] < 0).all()
        again = remask_policy.logprobs(ro, c)
        assert (again - ro.logp[c]).abs().max().item() < 1e-4  # the ratio starts at exactly 1


def test_remask_value_by_hand(remask_policy):
    """log π(y_t) = mean over the re-masks that masked t of the log-prob on that re-masked canvas."""
    ro = roll(remask_policy, PROMPTS[:1], 2, seed=9, guidance_scale=2.0)
    pid, tok, masks = ro.state["prompt_ids"], ro.tokens, ro.state["remask"]
    total, count = torch.zeros(2, T), masks.sum(1)
    with torch.no_grad():
        for k in range(masks.shape[1]):
            canvas = torch.where(masks[:, k], remask_policy.mask_id, tok)
            lp = remask_policy.logits(pid, canvas).log_softmax(-1).gather(-1, tok[..., None]).squeeze(-1)
            total += torch.where(masks[:, k], lp, torch.zeros_like(lp))
    want = torch.where(count > 0, total / count.clamp_min(1), torch.zeros_like(total))
    assert (want - ro.logp["pos"]).abs().max().item() < 1e-4


def test_remask_positions_never_masked_get_no_gradient():
    remask_policy = tiny_policy(estimator="remask", remask_count=1)  # one re-mask: many never masked
    ro = roll(remask_policy, PROMPTS[:2], 2, seed=4)
    assert (~ro.state["remask"].any(1)).sum() >= 2
    hit = ro.state["remask"].any(1)
    logp, d = remask_policy.logprobs_and_dists(ro, "pos")
    assert d.full().shape == (4, T, K)
    grads = []
    for pos in (~hit).nonzero()[:2].tolist() + hit.nonzero()[:1].tolist():
        remask_policy.zero_grad(set_to_none=True)
        lp = remask_policy.logprobs(ro, "pos")
        lp[pos[0], pos[1]].backward()
        g = remask_policy.head.weight.grad
        grads.append(0.0 if g is None else g.abs().sum().item())
    remask_policy.zero_grad(set_to_none=True)
    assert grads[0] == 0 and grads[1] == 0 and grads[2] > 0


def test_remask_mask_still_marks_every_valid_token_and_credit_reads_the_scored_ones(policy):
    """`Rollout.mask` has one meaning, valid tokens, under either estimator; the tokens the remask
    estimator scores are `scored`, and what covers log-probs (credit, loss) reads `loss_mask`."""
    from t2i_gcpo.config import CreditConfig
    from t2i_gcpo.train.credit import compute_weights

    remask_policy = tiny_policy(estimator="remask", remask_count=1)  # one re-mask: many never masked
    ro = roll(remask_policy, PROMPTS[:2], 2, seed=4)
    hit = ro.state["remask"].any(1).float()
    assert not hit.all()
    assert torch.equal(ro.mask, torch.ones(4, T))  # every image token is valid …
    assert torch.equal(ro.scored, hit) and torch.equal(ro.loss_mask, hit)  # … fewer are scored
    w = compute_weights(CreditConfig(scheme="uniform"), ro, torch.ones(4), remask_policy, None, "pos")
    assert torch.equal(w, hit)  # uniform credit over the scored tokens, none on the others
    # select, device moves and concatenation keep the two apart
    part = ro.select([2, 0]).to("cpu")
    assert torch.equal(part.mask, torch.ones(2, T)) and torch.equal(part.scored, hit[[2, 0]])
    traj = roll(policy, PROMPTS[:1], 2, seed=1)
    assert traj.scored is None and traj.loss_mask is traj.mask
    both = Rollout.concat([traj, ro])
    assert torch.equal(both.mask, torch.ones(6, T))
    assert torch.equal(both.scored, torch.cat([torch.ones(2, T), hit]))  # the trajectory rows: all valid


# ----------------------------------------------------------------------------- learning


@pytest.mark.parametrize("estimator", ["trajectory", "remask"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_policy_gradient_step_moves_logprobs_with_the_advantage(estimator, sign):
    """One clipped policy-gradient step (core.losses.policy_loss, token-mean) on a positive advantage
    raises the samples' mean token log-prob (the quantity the loss ascends); a negative one lowers it."""
    policy = tiny_policy(seed=1, estimator=estimator, remask_count=2)
    ro = roll(policy, PROMPTS[:2], 2, seed=7, guidance_scale=2.0)
    # a small step: the tiny random model (embeddings of std 0.02) is far from linear at larger ones
    opt = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=2e-4)
    logp = policy(ro, "pos")
    assert (logp.detach() - ro.logp["pos"]).abs().max().item() < 1e-4
    loss, _ = policy_loss(logp, ro.logp["pos"], torch.full((4,), sign), ro.loss_mask)
    opt.zero_grad()
    loss.backward()
    assert all(p.grad is None for p in policy.vq.parameters())  # the VQ stays frozen
    opt.step()
    with torch.no_grad():
        new = policy.logprobs(ro, "pos")
    gain = ((new - ro.logp["pos"]) * ro.loss_mask).sum() / ro.loss_mask.sum()
    assert sign * gain > 1e-3, gain


# ----------------------------------------------------------------------------- persistence


def test_save_load_round_trip(tmp_path, rollout):
    policy = tiny_policy()
    ro = roll(policy, PROMPTS[:2], 2, seed=1, guidance_scale=2.0)
    policy.save_pretrained(str(tmp_path / "m"))
    assert sorted(os.listdir(tmp_path / "m")) == ["model_index.json", "prior", "vq"]
    back = MaskedPolicy.from_pretrained(str(tmp_path / "m"))
    for c in CONTEXTS:
        assert torch.allclose(back.logprobs(ro, c), ro.logp[c], atol=1e-4)
    again = roll(back, PROMPTS[:2], 2, seed=1, guidance_scale=2.0)
    assert torch.equal(again.tokens, ro.tokens)
    remask = load_masked_policy(str(tmp_path / "m"), estimator="remask", remask_count=1)
    assert remask.estimator == "remask" and remask.remask_count == 1


def test_load_errors_name_the_path(tmp_path):
    with pytest.raises(UserError, match="no such directory"):
        load_masked_policy(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="not a masked policy checkpoint"):
        MaskedPolicy.from_pretrained(str(tmp_path / "empty"))


def test_shipped_checkpoint_loads_and_replays():
    policy = load_masked_policy(SHIPPED["shapeworld-masked"])
    assert policy.layout.grid == (8, 8)
    ro = policy.rollout(records([PROMPTS[0]]), 2, policy.default_sampling(), gens(0, 1))
    assert (policy.logprobs(ro, "guided") - ro.logp["guided"]).abs().max().item() < 1e-3
    assert policy.decode(ro).shape == (2, 3, 32, 32)


# ----------------------------------------------------------------------------- pretraining


def test_mask_batch_masks_cosine_share():
    from t2i_gcpo.pretrain.shapeworld_masked import mask_batch

    y = torch.randint(0, K, (200, T), generator=torch.Generator().manual_seed(0))
    canvas, masked = mask_batch(y, K, torch.Generator().manual_seed(1))
    assert torch.equal(canvas[masked], torch.full((int(masked.sum()),), K))
    assert torch.equal(canvas[~masked], y[~masked])
    assert (masked.sum(-1) >= 1).all()
    # E[cos(πt/2)] = 2/π of the tokens are masked on average
    assert abs(masked.float().mean().item() - 2 / math.pi) < 0.06


def test_pretrain_masked_writes_a_loadable_checkpoint(tmp_path):
    from t2i_gcpo.pretrain.shapeworld_masked import MaskedPretrainConfig, pretrain_masked

    cfg = MaskedPretrainConfig(
        n_scenes=150,
        steps=3,
        batch=8,
        warmup=1,
        model=MaskedConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
    )
    seen = {}

    def evaluate(policy, test, n, seed):
        seen["n"] = n
        ro = policy.rollout(records([test[0]["prompt"]]), 1, policy.default_sampling(), gens(seed, 1))
        return {"strict": float(ro.tokens.numel() > 0)}

    stats = pretrain_masked(str(tmp_path / "m"), cfg, evaluate=evaluate)
    assert stats["prior"]["steps"] == 3 and stats["eval"]["strict"] == 1.0 and seen["n"] == 4
    assert os.path.isfile(tmp_path / "m" / "pretrain.json")
    back = MaskedPolicy.from_pretrained(str(tmp_path / "m"))
    assert back.config.prompt_len == back.tokenizer.max_len and back.layout.grid == (8, 8)
