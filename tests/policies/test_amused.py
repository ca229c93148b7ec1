"""The aMUSEd adapter (policies/amused.py) on a tiny random aMUSEd pipeline folder (tests/tiny_models.py:
UVit2DModel + VQModel + CLIPTextModelWithProjection + a CLIP tokenizer written offline from a tiny
vocab.json / merges.txt): the pipeline's conventions (its guided logits at step 0, its scheduler's
reveal counts), each token revealed once, CFG scale 1, negative prompts, the
remask estimator, a policy-gradient step, a kept reveal order, the import guard (the Policy contract:
tests/policies/test_policy_contract.py)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from t2i_gcpo.core.losses import policy_loss
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import Policy, PromptRecord, SamplingParams
from t2i_gcpo.policies.maskgen import reveal_counts
from t2i_gcpo.policies.sampling import GUIDANCE, ChunkedDists
from t2i_gcpo.tasks.loop import group_generators

from tiny_models import AMUSED_K as K
from tiny_models import AMUSED_MASK_ID as MASK_ID
from tiny_models import AMUSED_SIDE as SIDE
from tiny_models import AMUSED_T as T
from tiny_models import build_tiny_amused

PROMPTS = ["a red circle", "two blue squares", "a cross"]
CONTEXTS = ("pos", "neg", "guided")
LR = 1e-4  # a first-order step: the tiny random model is far from linear at larger ones


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("amused") / "tiny")
    build_tiny_amused(path)
    return path


@pytest.fixture(scope="module")
def policy(folder):
    from t2i_gcpo.policies.amused import AmusedPolicy

    return AmusedPolicy.from_pretrained(folder)


def gens(seed: int, n: int) -> list[torch.Generator]:
    return group_generators(seed, "test", range(n))


def roll(policy, texts, group_size, seed, negatives=None, **sampling):
    negatives = negatives or [None] * len(texts)
    recs = [PromptRecord(t, negative=n) for t, n in zip(texts, negatives)]
    return policy.rollout(recs, group_size, SamplingParams(**sampling), gens(seed, len(texts)))


@pytest.fixture(scope="module")
def rollout(policy):
    return roll(policy, PROMPTS[:2], 2, seed=1, guidance_scale=3.0, steps=4)


# ----------------------------------------------------------------------------- conventions


def test_is_a_policy_with_the_pipeline_defaults(policy, rollout):
    assert isinstance(policy, Policy)
    assert policy.guidance == "u + s(c − u)" and policy.guidance in GUIDANCE
    assert policy.default_sampling() == SamplingParams(
        guidance_scale=10.0, steps=12, reveal_order="confidence"
    )
    assert policy.mask_id == MASK_ID and policy.codebook_size == K and policy.layout.grid == (SIDE, SIDE)
    assert policy.image_size == 8  # sample_size 4 × VQ scale factor 2: micro-conditioning [8, 8, 0, 0, 6]
    assert policy.micro_conds(1, torch.float32).tolist() == [[8.0, 8.0, 0.0, 0.0, 6.0]]
    assert not any(p.requires_grad for p in policy.text_encoder.parameters())
    assert not any(p.requires_grad for p in policy.vqvae.parameters())
    assert rollout.tokens.shape == (4, T) and int(rollout.tokens.max()) < K
    assert rollout.sampling.steps == 4 and set(rollout.logp) == set(CONTEXTS)


def test_each_token_revealed_exactly_once(rollout):
    assert int(rollout.step.min()) >= 0 and int(rollout.step.max()) < 4
    for row in rollout.step:
        assert torch.bincount(row, minlength=4).tolist() == reveal_counts(T, 4)


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
@pytest.mark.parametrize("tokens,steps", [(16, 4), (16, 12), (64, 8), (256, 12)])
def test_reveal_counts_match_the_amused_scheduler(schedule, tokens, steps):
    from diffusers import AmusedScheduler

    sched = AmusedScheduler(mask_token_id=K, masking_schedule=schedule)
    sched.set_timesteps(steps, (2, 0))
    gen = torch.Generator().manual_seed(0)
    sample = torch.full((1, tokens), K)
    counts = []
    for t in sched.timesteps:
        logits = torch.randn(1, tokens, K, generator=gen)
        out = sched.step(model_output=logits, timestep=t, sample=sample, generator=gen).prev_sample
        counts.append(int((sample == K).sum() - (out == K).sum()))
        sample = out
    assert counts == reveal_counts(tokens, steps, schedule)


def test_guided_logits_of_step_zero_equal_the_pipelines(folder, policy):
    """The logits AmusedPipeline hands its scheduler at step 0 (empty negative prompt, micro-
    conditioning, uncond + s(cond − uncond)) equal this adapter's guided logits on the all-masked canvas."""
    from diffusers import AmusedScheduler
    from diffusers.pipelines import AmusedPipeline

    pipe = AmusedPipeline(
        vqvae=policy.vqvae,
        tokenizer=policy.tokenizer,
        text_encoder=policy.text_encoder,
        transformer=policy.transformer,
        scheduler=AmusedScheduler(mask_token_id=MASK_ID),
    )
    pipe.set_progress_bar_config(disable=True)
    seen = []
    step = pipe.scheduler.step

    def spy(model_output, *args, **kwargs):
        seen.append(model_output.detach().clone())
        return step(model_output, *args, **kwargs)

    pipe.scheduler.step = spy
    pipe(
        prompt=PROMPTS[:2],
        num_inference_steps=2,
        guidance_scale=3.0,
        output_type="latent",
        generator=torch.Generator().manual_seed(0),
    )
    want = seen[0].flatten(2).transpose(1, 2)  # [B, T, K]
    hidden_fn = policy._hidden_fn(policy.text_ids(PROMPTS[:2]), policy.text_ids(["", ""]))
    canvas = torch.full((2, T), MASK_ID)
    rows = torch.arange(2)
    with torch.no_grad():
        c = policy.head(hidden_fn(canvas, rows, torch.zeros(2, dtype=torch.bool)))
        u = policy.head(hidden_fn(canvas, rows, torch.ones(2, dtype=torch.bool)))
    assert torch.allclose(u + 3.0 * (c - u), want, atol=1e-4)
    assert not torch.allclose(c, want, atol=1e-2)


# ----------------------------------------------------------------------------- log-probs


def test_dists_and_forward(policy, rollout):
    logp, d = policy.logprobs_and_dists(rollout, "guided")
    assert isinstance(d, ChunkedDists)
    z = d.full()
    assert z.shape == (4, T, K)
    assert torch.allclose(
        logp, z.log_softmax(-1).gather(-1, rollout.tokens[..., None]).squeeze(-1), atol=1e-5
    )
    assert torch.allclose(policy(rollout, "guided"), logp, atol=1e-6)


def test_cfg_scale_one_is_conditional_only(policy):
    r = roll(policy, PROMPTS[:2], 2, seed=3, guidance_scale=1.0, steps=3)
    assert torch.allclose(r.logp["guided"], r.logp["pos"], atol=1e-6)
    assert torch.allclose(policy.logprobs(r, "guided"), policy.logprobs(r, "pos"), atol=1e-5)
    assert not torch.allclose(r.logp["guided"], r.logp["neg"], atol=1e-3)


def test_negative_prompt_is_honoured(policy):
    plain = roll(policy, PROMPTS[:1], 2, seed=5, guidance_scale=3.0, steps=3)
    other = roll(policy, PROMPTS[:1], 2, seed=5, negatives=["blue"], guidance_scale=3.0, steps=3)
    assert torch.equal(plain.state["negative_ids"], policy.text_ids(["", ""]))
    assert not torch.equal(other.state["negative_ids"], plain.state["negative_ids"])
    assert (policy.logprobs(other, "neg") - other.logp["neg"]).abs().max().item() < 1e-4
    # the same tokens scored under the two negatives differ
    swapped = dataclasses.replace(plain, state={**plain.state, "negative_ids": other.state["negative_ids"]})
    with torch.no_grad():
        assert (policy.logprobs(plain, "neg") - policy.logprobs(swapped, "neg")).abs().max().item() > 1e-3


def test_remask_estimator(folder):
    from t2i_gcpo.policies.amused import AmusedPolicy

    pol = AmusedPolicy.from_pretrained(folder, estimator="remask", remask_count=2)
    ro = roll(pol, PROMPTS[:2], 2, seed=2, guidance_scale=3.0, steps=4)
    masks = ro.state["remask"]
    assert masks.shape == (4, 2, T) and torch.equal(ro.scored, masks.any(1).float())
    assert torch.equal(ro.mask, torch.ones(4, T)) and ro.loss_mask is ro.scored  # mask: every valid token
    for c in CONTEXTS:
        assert (ro.logp[c][~masks.any(1)] == 0).all()
        assert (pol.logprobs(ro, c) - ro.logp[c]).abs().max().item() < 1e-4


@pytest.mark.parametrize("estimator", ["trajectory", "remask"])
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_policy_gradient_step_moves_logprobs_with_the_advantage(folder, estimator, sign):
    """One clipped policy-gradient step (token-mean) on a positive advantage raises the samples' mean
    token log-prob; a negative one lowers it. Only the transformer (its codebook head included) learns."""
    from t2i_gcpo.policies.amused import AmusedPolicy

    pol = AmusedPolicy.from_pretrained(folder, estimator=estimator)
    ro = roll(pol, PROMPTS[:2], 2, seed=7, guidance_scale=3.0, steps=4)
    params = [p for p in pol.parameters() if p.requires_grad]
    assert params and all(any(p is q for q in pol.transformer.parameters()) for p in params)
    opt = torch.optim.SGD(params, lr=LR)
    loss, _ = policy_loss(pol(ro, "pos"), ro.logp["pos"], torch.full((4,), sign), ro.loss_mask)
    opt.zero_grad()
    loss.backward()
    assert pol.transformer.mlm_layer.conv2.weight.grad is not None  # the head is trained
    opt.step()
    with torch.no_grad():
        new = pol.logprobs(ro, "pos")
    gain = ((new - ro.logp["pos"]) * ro.loss_mask).sum() / ro.loss_mask.sum()
    assert sign * gain > 1e-3, gain


# ----------------------------------------------------------------------------- images, persistence, errors


def test_decode_and_features(policy, rollout):
    img = policy.decode(rollout)
    assert img.shape == (4, 3, 8, 8) and img.min() >= 0 and img.max() <= 1
    assert policy.token_features(rollout).shape == (4, T, 4)


def test_a_kept_reveal_order_is_the_default_and_survives_save_and_load(folder, tmp_path):
    from t2i_gcpo.policies.amused import SAMPLING_FILE, AmusedPolicy

    fresh = AmusedPolicy.from_pretrained(folder)
    assert fresh.default_sampling().reveal_order == "confidence"  # the pipeline's order
    fresh.keep_reveal_order("random")  # what training under rollout.reveal_order=random does
    named = roll(fresh, PROMPTS[:2], 2, seed=1, guidance_scale=3.0, steps=4, reveal_order="random")
    unnamed = roll(fresh, PROMPTS[:2], 2, seed=1, guidance_scale=3.0, steps=4)
    assert unnamed.sampling.reveal_order == "random" and torch.equal(unnamed.tokens, named.tokens)
    fresh.save_pretrained(tmp_path / "trained")
    back = AmusedPolicy.from_pretrained(tmp_path / "trained")
    assert back.default_sampling().reveal_order == "random"
    with pytest.raises(UserError, match="unknown reveal order"):
        back.keep_reveal_order("raster")
    (tmp_path / "trained" / SAMPLING_FILE).write_text('{"reveal_order": "raster"}')
    with pytest.raises(UserError, match="unknown reveal order"):
        AmusedPolicy.from_pretrained(tmp_path / "trained")


def test_load_errors(tmp_path):
    from t2i_gcpo.policies.amused import AmusedPolicy

    with pytest.raises(UserError, match="not a directory"):
        AmusedPolicy.from_pretrained(tmp_path / "nope")
    (tmp_path / "half" / "transformer").mkdir(parents=True)
    with pytest.raises(UserError, match="missing vqvae/"):
        AmusedPolicy.from_pretrained(tmp_path / "half")


def test_import_guard_names_working_versions(monkeypatch):
    from t2i_gcpo.policies import amused

    monkeypatch.setitem(sys.modules, "diffusers", None)  # `import diffusers` raises ImportError
    with pytest.raises(UserError, match="0.42.1"):
        amused.import_amused()
