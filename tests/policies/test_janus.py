"""JanusPolicy on a tiny random Janus checkpoint (tests/tiny_models.py), offline.

What is checked: the prompt format equals the JanusProcessor's; the null branch follows
transformers' CFG rule with the checkpoint's pad id; the KV-cache CFG sampler's recorded log-probs
equal teacher-forced ones; the cond/null logits equal those transformers' own CFG `generate`
computes at every step; padding does not change a sample; train step, LoRA, save → reload.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import Policy, PromptRecord, Rollout, SamplingParams
from t2i_gcpo.policies.sampling import GUIDANCE, ChunkedDists

from tiny_models import JANUS_CODEBOOK as CODEBOOK
from tiny_models import JANUS_GRID as GRID
from tiny_models import build_tiny_janus

PROMPTS = ["a red circle", "two blue squares left of a green cat"]  # different lengths → left padding
TOL = 1e-4
CONTEXTS = ("pos", "neg", "guided")


def roll(policy, texts, group_size, seed, **sampling):
    """Rollout with fresh per-prompt generators seeded seed·100 + i (generators are stateful)."""
    gens = [torch.Generator().manual_seed(100 * seed + i) for i in range(len(texts))]
    return policy.rollout([PromptRecord(t) for t in texts], group_size, SamplingParams(**sampling), gens)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return build_tiny_janus(tmp_path_factory.mktemp("janus") / "tiny")


@pytest.fixture(scope="module")
def policy(ckpt):
    from t2i_gcpo.policies.janus import JanusPolicy

    return JanusPolicy.from_pretrained(ckpt)


@pytest.fixture(scope="module")
def rollout(policy):
    return roll(policy, PROMPTS, 2, seed=0, guidance_scale=5.0, temperature=0.8)


def _fresh(ckpt, **kw):
    from t2i_gcpo.policies.janus import JanusPolicy

    return JanusPolicy.from_pretrained(ckpt, **kw)


# ----------------------------------------------------------------------------- prompts, null branch
def test_protocol_and_grid(policy, rollout):
    assert isinstance(policy, Policy)
    assert policy.output == "image" and policy.default_task == "geneval"
    assert policy.guidance == "u + s(c − u)" and policy.guidance in GUIDANCE
    assert policy.default_sampling().guidance_scale == 5.0  # the Janus-Pro recipe
    assert policy.grid_shape == (GRID, GRID) and policy.layout.grid == (GRID, GRID)
    assert rollout.tokens.shape == (4, GRID * GRID)
    assert rollout.texts == [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[1]]  # grouped by prompt
    assert all(isinstance(p, PromptRecord) for p in rollout.prompts)
    assert rollout.group_size == 2 and rollout.max_len == GRID * GRID
    assert torch.equal(rollout.step, torch.arange(GRID * GRID).expand(4, -1))
    assert torch.equal(rollout.mask, torch.ones(4, GRID * GRID))
    assert set(rollout.logp) == set(CONTEXTS)
    assert all(v.shape == (4, GRID * GRID) for v in rollout.logp.values())
    assert rollout.state["prompt_ids"] == [i for i in policy.prompt_ids(PROMPTS) for _ in range(2)]
    assert rollout.sampling == SamplingParams(guidance_scale=5.0, temperature=0.8)
    assert int(rollout.tokens.max()) < CODEBOOK


def test_prompt_ids_equal_janus_processor(policy, ckpt, tmp_path):
    from transformers import JanusProcessor

    proc = JanusProcessor.from_pretrained(ckpt)
    for p in PROMPTS:
        text = proc.apply_chat_template(
            [{"role": "user", "content": [{"type": "text", "text": p}]}], add_generation_prompt=True
        )
        want = proc(text=text, generation_mode="image")["input_ids"][0].tolist()
        assert policy.prompt_ids([p])[0] == want
        assert want[0] == policy.bos_id and want[-1] == policy.boi_id
    # a checkpoint with only a tokenizer (no processor files) formats identically via its chat template
    bare = build_tiny_janus(tmp_path / "bare", with_processor=False)
    assert _fresh(bare).prompt_ids(PROMPTS) == policy.prompt_ids(PROMPTS)


def test_null_branch_rule_uses_checkpoint_pad_id(ckpt, tmp_path):
    # a checkpoint whose generation-config pad id differs from the tokenizer's: the former is used
    other = tmp_path / "pad"
    shutil.copytree(ckpt, other)
    gen = json.loads((other / "generation_config.json").read_text())
    gen["pad_token_id"] = 3
    (other / "generation_config.json").write_text(json.dumps(gen))
    pol = _fresh(other)
    assert pol.pad_id == 3 and pol.tokenizer.pad_token_id != 3
    bos, boi = pol.bos_id, pol.boi_id
    ids = torch.tensor([[3, 3, bos, 7, 12, 29, boi], [bos, 7, 9, 40, bos, 8, boi]])
    want = torch.tensor([[3, 3, bos, 3, 3, 3, boi], [bos, 3, 3, 3, bos, 3, boi]])
    assert torch.equal(pol.null_ids(ids), want)
    _, mask = pol.pad_left([[bos, 7, boi], [bos, 7, 9, 9, boi]])
    assert mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]


# ----------------------------------------------------------------------------- log-probs
@pytest.mark.parametrize("context", CONTEXTS)
def test_rollout_logprobs_equal_teacher_forced(policy, rollout, context):
    with torch.no_grad():
        lp, dists = policy.logprobs_and_dists(rollout, context)
    assert isinstance(dists, ChunkedDists)
    logits = dists.full()
    recorded = rollout.logp[context]
    assert (lp - recorded).abs().max().item() < TOL
    assert logits.shape == (4, GRID * GRID, CODEBOOK)
    # the dists are temperature-scaled logits: log_softmax of them at the token is the log-prob
    assert torch.allclose(logits.log_softmax(-1).gather(-1, rollout.tokens[..., None]).squeeze(-1), lp)
    assert torch.equal(policy(rollout, context), policy.logprobs(rollout, context))  # forward = logprobs


def test_contexts_differ_and_cfg_scale_one_is_cond(policy, rollout):
    # the null branch is really different
    assert (rollout.logp["pos"] - rollout.logp["neg"]).abs().mean() > 0.1
    with torch.no_grad():  # the guided dists are the guidance formula applied to pos and neg
        z = {c: policy.logprobs_and_dists(rollout, c)[1].full() * 0.8 for c in CONTEXTS}
    assert torch.allclose(z["guided"], z["neg"] + 5.0 * (z["pos"] - z["neg"]), atol=1e-4)
    r1 = roll(policy, PROMPTS, 2, seed=1, guidance_scale=1.0)
    assert (r1.logp["guided"] - r1.logp["pos"]).abs().max().item() < 1e-5  # ℓ_u + 1·(ℓ_c − ℓ_u) = ℓ_c


def test_seeded_rollout_reproducible(policy):
    a = roll(policy, PROMPTS, 2, seed=7, guidance_scale=5.0)
    b = roll(policy, PROMPTS, 2, seed=7, guidance_scale=5.0)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logp["guided"], b.logp["guided"])
    assert not torch.equal(a.tokens, roll(policy, PROMPTS, 2, seed=8, guidance_scale=5.0).tokens)
    policy.max_rollout_batch = 3  # chunked sampling: each row's uniforms come from its prompt's generator
    try:
        c = roll(policy, PROMPTS, 2, seed=7, guidance_scale=5.0)
    finally:
        policy.max_rollout_batch = None
    assert torch.equal(a.tokens, c.tokens)
    # a sample does not depend on its batch-mates: the second prompt alone, with its own generator
    gen = torch.Generator().manual_seed(701)  # roll(seed=7) gave prompt 1 the seed 7·100 + 1
    alone = policy.rollout([PromptRecord(PROMPTS[1])], 2, SamplingParams(guidance_scale=5.0), [gen])
    assert torch.equal(alone.tokens, a.tokens[2:])


def test_left_padding_does_not_change_a_sample(policy, rollout):
    """Row 0 (short prompt, left-padded next to the long one) scores the same alone."""
    alone = rollout.select([0])
    assert alone.state["prompt_ids"] == [rollout.state["prompt_ids"][0]]  # select keeps only row 0's ids
    assert policy.pad_left(alone.state["prompt_ids"])[1].all()  # alone, nothing is padded
    assert not policy.pad_left(rollout.state["prompt_ids"])[1][0].all()  # in the batch, row 0 is
    with torch.no_grad():
        for ctx in CONTEXTS:
            d = policy.logprobs(alone, ctx)[0] - policy.logprobs(rollout, ctx)[0]
            assert d.abs().max().item() < TOL


def test_null_branch_and_sampler_match_transformers_cfg_generate(policy):
    """transformers' `generate(generation_mode="image")` hides per-step logits and returns only the
    last step's scores. A spy logits processor sees, at EVERY step, the raw generation-head logits
    of its doubled batch (rows :B conditional, B: its null branch) before its CFG processor runs.
    Teacher-forcing the same (greedy) tokens through our cond / null contexts must give those
    logits, and our sampler with top_k=1 must pick the same tokens."""
    from transformers import LogitsProcessor, LogitsProcessorList

    seen = []

    class Spy(LogitsProcessor):
        def __call__(self, input_ids, scores):
            seen.append(scores.detach().clone())
            return scores

    prompts = ["a red circle", "a blue square"]  # equal lengths: no padding, positions agree
    ids, mask = policy.pad_left(policy.prompt_ids(prompts))
    assert mask.all()
    scale = 5.0
    tokens = policy.model.generate(
        input_ids=ids,
        attention_mask=mask,
        generation_mode="image",
        do_sample=False,
        guidance_scale=scale,
        logits_processor=LogitsProcessorList([Spy()]),
    )
    steps = GRID * GRID
    assert tokens.shape == (2, steps) and len(seen) == steps
    raw = torch.stack(seen, dim=1).float()  # [2B, T, K]
    cond_hf, null_hf = raw[:2], raw[2:]
    # the spy really saw raw [cond; null] logits: their CFG combination's argmax is what generate chose
    assert torch.equal((null_hf + scale * (cond_hf - null_hf)).argmax(-1), tokens)

    r = Rollout(
        tokens=tokens,
        mask=torch.ones(2, steps),
        step=torch.arange(steps).expand(2, -1),
        logp={c: torch.zeros(2, steps) for c in CONTEXTS},
        prompts=[PromptRecord(p) for p in prompts],
        group_size=1,
        sampling=SamplingParams(guidance_scale=scale, temperature=1.0),
        state={"prompt_ids": policy.prompt_ids(prompts)},
    )
    with torch.no_grad():
        cond = policy.logprobs_and_dists(r, "pos")[1].full()
        null = policy.logprobs_and_dists(r, "neg")[1].full()
        guided = policy.logprobs_and_dists(r, "guided")[1].full()
    assert (cond - cond_hf).abs().max().item() < TOL
    assert (null - null_hf).abs().max().item() < TOL
    assert (guided - (null_hf + scale * (cond_hf - null_hf))).abs().max().item() < 10 * TOL

    ours = roll(policy, prompts, 1, seed=0, guidance_scale=scale, top_k=1)
    assert torch.equal(ours.tokens, tokens)


# ----------------------------------------------------------------------------- images and codes
def test_decode_and_token_features(policy, rollout):
    images = policy.decode(rollout)
    assert images.shape == (4, 3, 2 * GRID, 2 * GRID)
    assert images.min() >= 0 and images.max() <= 1
    with torch.no_grad():
        ref = policy.model.decode_image_tokens(rollout.tokens).permute(0, 3, 1, 2)  # [-1, 1]
    assert torch.allclose(images, ((ref + 1) / 2).clamp(0, 1))
    codes = policy.token_features(rollout)
    table = policy.model.model.vqmodel.quantize.embedding.weight
    assert codes.shape == (4, GRID * GRID, table.shape[1])
    assert torch.allclose(codes[1, 5], torch.nn.functional.normalize(table[rollout.tokens[1, 5]], dim=0))


# ----------------------------------------------------------------------------- errors
def test_user_errors(tmp_path, ckpt, policy):
    from t2i_gcpo.policies.janus import JanusPolicy

    with pytest.raises(UserError, match="does not exist"):
        JanusPolicy.from_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no config.json"):
        JanusPolicy.from_pretrained(tmp_path / "empty")
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UserError, match="model_type 'llama'"):
        JanusPolicy.from_pretrained(llama)
    (llama / "config.json").write_text(json.dumps({"model_type": "multi_modality"}))
    with pytest.raises(UserError, match="convert"):
        JanusPolicy.from_pretrained(llama)
    with pytest.raises(UserError, match="dtype"):
        JanusPolicy.from_pretrained(ckpt, dtype="fp8")
    with pytest.raises(UserError, match="freeze"):
        JanusPolicy.from_pretrained(ckpt, freeze=("vision", "everything"))
    with pytest.raises(UserError, match="non-empty"):
        policy.check_prompts(["a red circle", "  "])
    with pytest.raises(UserError, match="zebra"):
        policy.check_prompts(["a red zebra"])


# ----------------------------------------------------------------------------- training, saving
def _pg_step(pol, r, opt):
    """One policy-gradient step with advantage +1 on every token (loss −mean log π(y | prompt))."""
    loss = -pol(r, "pos").mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def _trainable(pol):
    return [p for p in pol.parameters() if p.requires_grad]


def test_freezing_and_train_step_then_save_reload(ckpt, tmp_path):
    from transformers import JanusForConditionalGeneration

    pol = _fresh(ckpt)
    m = pol.model.model
    assert not any(p.requires_grad for p in m.vision_model.parameters())
    assert not any(p.requires_grad for p in m.vqmodel.parameters())
    assert all(p.requires_grad for p in m.language_model.parameters())
    assert all(p.requires_grad for p in m.generation_head.parameters())

    r = roll(pol, PROMPTS, 2, seed=3, guidance_scale=5.0)
    vq_before = m.vqmodel.quantize.embedding.weight.clone()
    with torch.no_grad():
        before = pol.logprobs(r, "pos")
    pol.train()
    loss0 = _pg_step(pol, r, torch.optim.SGD(_trainable(pol), lr=1e-3))
    assert m.vision_model.embeddings.patch_embedding.weight.grad is None
    with torch.no_grad():
        after = pol.logprobs(r, "pos")
    assert after.mean() > before.mean() + 0.02, (before.mean(), after.mean(), loss0)  # measured +0.06
    assert torch.equal(m.vqmodel.quantize.embedding.weight, vq_before)

    out = tmp_path / "saved"
    pol.save_pretrained(out)
    plain = JanusForConditionalGeneration.from_pretrained(out)  # loads as a plain transformers Janus
    assert torch.equal(plain.model.generation_head.vision_head.weight, m.generation_head.vision_head.weight)
    again = _fresh(out)
    with torch.no_grad():
        assert (again.logprobs(r, "pos") - after).abs().max().item() < 1e-5
    assert again.pad_id == pol.pad_id and again.boi_id == pol.boi_id


def test_lora_and_gradient_checkpointing(ckpt, tmp_path):
    pol = _fresh(ckpt, lora={"r": 4}, gradient_checkpointing=True)
    lm = pol.model.model.language_model
    trainable = {n for n, p in lm.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert all(p.requires_grad for p in pol.model.model.generation_head.parameters())
    q_base = lm.layers[0].self_attn.q_proj.base_layer.weight.clone()

    pol.train()  # rollout must still use the KV cache with checkpointing on in train mode
    r = roll(pol, PROMPTS, 2, seed=4, guidance_scale=5.0)
    assert pol.training
    assert (pol.logprobs(r, "guided").detach() - r.logp["guided"]).abs().max().item() < TOL
    opt = torch.optim.Adam(_trainable(pol), lr=1e-2)
    for _ in range(2):  # B starts at 0: the first step moves B, the second moves A too
        _pg_step(pol, r, opt)
    assert torch.equal(lm.layers[0].self_attn.q_proj.base_layer.weight, q_base)  # base frozen
    with torch.no_grad():
        tuned = pol.logprobs(r, "pos")
    out = tmp_path / "lora_merged"
    pol.save_pretrained(out)
    assert torch.equal(
        lm.layers[0].self_attn.q_proj.base_layer.weight, q_base
    )  # saving does not merge in place
    merged = _fresh(out)
    assert not any("lora" in n for n, _ in merged.model.named_parameters())
    q_merged = merged.model.model.language_model.layers[0].self_attn.q_proj.weight
    assert (q_merged - q_base).abs().max().item() > 1e-4  # ΔW = s·B·A was folded in
    with torch.no_grad():
        assert (merged.logprobs(r, "pos") - tuned).abs().max().item() < 1e-4


def test_bfloat16_close_to_float32(ckpt, rollout, policy):
    bf = _fresh(ckpt, dtype="bfloat16")
    assert bf.model.model.generation_head.proj_out.weight.dtype == torch.bfloat16
    with torch.no_grad():
        lp = bf.logprobs(rollout, "pos")
    assert lp.dtype == torch.float32
    assert (lp - rollout.logp["pos"]).abs().max().item() < 0.1  # bf16 rounding; measured 0.022
