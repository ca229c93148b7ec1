"""The built-in AR prior as a Policy: sampler log-probs ≡ teacher-forced log-probs, CFG maths,
KV-cache ≡ no-cache sampling, prompt vocabulary errors, persistence."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.ar import SHIPPED, ARConfig, ARPolicy, load_policy, resolve_checkpoint
from t2i_gcpo.policies.base import Policy
from t2i_gcpo.policies.prompt_tokenizer import PromptTokenizer
from t2i_gcpo.tokenizers.vq import VQConfig, VQTokenizer

torch.set_num_threads(2)

PROMPTS = ["a photo of a red circle", "a photo of two blue squares", "a photo of a cross above a circle"]


def tiny_policy(storage: str = "float32", seed: int = 0) -> ARPolicy:
    torch.manual_seed(seed)
    vq = VQTokenizer(
        VQConfig(image_size=16, channels=(8, 8), codebook_size=16, code_dim=4, storage_dtype=storage)
    )
    tok = PromptTokenizer.build(PROMPTS, max_len=8)
    cfg = ARConfig(
        prompt_len=8, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, storage_dtype=storage
    )
    policy = ARPolicy(cfg, tok, vq).eval()
    with torch.no_grad():  # larger logits than the default init so distributions are far from uniform
        policy.head.weight.mul_(5)
    return policy


@pytest.fixture(scope="module")
def policy() -> ARPolicy:
    return tiny_policy()


@pytest.fixture(scope="module")
def rollout(policy):
    return policy.rollout(
        PROMPTS[:2], 3, cfg_scale=2.5, temperature=0.7, generator=torch.Generator().manual_seed(1)
    )


def test_is_a_policy_and_rollout_layout(policy, rollout):
    assert isinstance(policy, Policy)
    assert policy.grid_shape == (4, 4)
    assert rollout.tokens.shape == (6, 16) and rollout.tokens.dtype == torch.long
    assert rollout.prompts == [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3  # groups contiguous
    assert torch.equal(rollout.mask, torch.ones(6, 16))
    pid = rollout.extras["prompt_ids"]
    assert pid.shape == (6, 8) and torch.equal(pid[0], pid[2]) and not torch.equal(pid[0], pid[3])
    assert int(rollout.tokens.max()) < 16
    assert (
        (rollout.logp_cond <= 0).all() and (rollout.logp_uncond <= 0).all() and (rollout.logp_cfg <= 0).all()
    )
    assert rollout.cfg_scale == 2.5 and rollout.temperature == 0.7


@pytest.mark.parametrize("context", ["cond", "uncond", "cfg"])
def test_sampler_logprobs_equal_teacher_forced(policy, rollout, context):
    recomputed = policy.logprobs(rollout, context)
    assert recomputed.shape == (6, 16)
    assert (recomputed - rollout.recorded_logp(context)).abs().max().item() < 1e-4
    # the three distributions really differ, so the test can tell contexts apart
    other = {"cond": "uncond", "uncond": "cond", "cfg": "cond"}[context]
    assert (recomputed - rollout.recorded_logp(other)).abs().max().item() > 1e-2


def test_full_dist_is_temperature_scaled_logits(policy, rollout):
    logp, z = policy.logprobs(rollout, "cond", full_dist=True)
    assert z.shape == (6, 16, 16)
    raw = policy.context_logits(rollout, "cond")
    assert torch.allclose(z, raw / 0.7, atol=1e-5)
    assert torch.allclose(logp, z.log_softmax(-1).gather(-1, rollout.tokens[..., None]).squeeze(-1))
    assert torch.allclose(policy(rollout, "cond"), logp)  # forward = logprobs (DDP syncs grads)


def test_cfg_logits_combine_cond_and_uncond(policy, rollout):
    lc = policy.context_logits(rollout, "cond")
    lu = policy.context_logits(rollout, "uncond")
    lg = policy.context_logits(rollout, "cfg")
    assert torch.allclose(lg, lu + 2.5 * (lc - lu), atol=1e-4)


def test_sample_step_hand_computed():
    lc = torch.tensor([[2.0, 0.0, 0.0]])
    lu = torch.tensor([[0.0, 1.0, 0.0]])
    # s = 2: ℓ_cfg = ℓ_u + 2(ℓ_c − ℓ_u) = [4, -1, 0]; T = 2 → z = [2, -0.5, 0]
    tok, lp = ARPolicy.sample_step(torch.cat([lc, lu]), cfg_scale=2.0, temperature=2.0, top_k=1)
    assert tok.tolist() == [0]  # top-1 = argmax of the CFG logits
    import math

    def logsm(v, i):
        return v[i] - math.log(sum(math.exp(x) for x in v))

    assert lp[0, 0].item() == pytest.approx(logsm([1.0, 0.0, 0.0], 0), abs=1e-6)
    assert lp[1, 0].item() == pytest.approx(logsm([0.0, 0.5, 0.0], 0), abs=1e-6)
    assert lp[2, 0].item() == pytest.approx(logsm([2.0, -0.5, 0.0], 0), abs=1e-6)  # untruncated


def test_cfg_scale_one_is_conditional_only(policy):
    r = policy.rollout(PROMPTS[:2], 2, cfg_scale=1.0, generator=torch.Generator().manual_seed(3))
    assert torch.allclose(r.logp_cfg, r.logp_cond, atol=1e-6)
    assert torch.allclose(policy.logprobs(r, "cfg"), policy.logprobs(r, "cond"), atol=1e-5)
    assert not torch.allclose(r.logp_cfg, r.logp_uncond, atol=1e-3)


def test_top_k_one_is_greedy_on_cfg_logits(policy):
    r = policy.rollout(PROMPTS[:2], 2, cfg_scale=3.0, top_k=1, generator=torch.Generator().manual_seed(4))
    assert torch.equal(r.tokens, policy.context_logits(r, "cfg").argmax(-1))
    assert torch.equal(r.tokens[0], r.tokens[1])  # greedy: the group is identical


@pytest.mark.parametrize("cache", ["dynamic", "none"])
def test_kv_cache_and_recompute_sample_identical_tokens(policy, cache):
    pid = policy.encode_prompts(PROMPTS)
    tok_s, lp_s = policy.generate(pid, 3.0, 1.0, generator=torch.Generator().manual_seed(7), cache="static")
    tok_o, lp_o = policy.generate(pid, 3.0, 1.0, generator=torch.Generator().manual_seed(7), cache=cache)
    assert torch.equal(tok_s, tok_o)
    assert (lp_s - lp_o).abs().max().item() < 1e-4


def test_seeded_rollout_is_reproducible_and_seed_matters(policy):
    a = policy.rollout(PROMPTS, 2, 3.0, generator=torch.Generator().manual_seed(5))
    b = policy.rollout(PROMPTS, 2, 3.0, generator=torch.Generator().manual_seed(5))
    c = policy.rollout(PROMPTS, 2, 3.0, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)


def test_null_prompt_is_all_pads(policy):
    pid = policy.encode_prompts(PROMPTS[:1])
    t = policy.tokenizer
    assert policy.prefix(pid, null=True).tolist() == [[t.bos_id] + [t.pad_id] * 8 + [t.boi_id]]
    words = [t.index[w] for w in PROMPTS[0].split()]
    assert policy.prefix(pid).tolist() == [[t.bos_id] + words + [t.pad_id] * (8 - len(words)) + [t.boi_id]]


def test_gradients_reach_prior_not_vq(policy, rollout):
    policy.zero_grad(set_to_none=True)
    policy.logprobs(rollout, "cfg").sum().backward()
    assert policy.head.weight.grad is not None and policy.head.weight.grad.abs().sum() > 0
    assert policy.llama.embed_tokens.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in policy.vq.parameters())
    policy.zero_grad(set_to_none=True)


def test_unknown_words_error_names_them_and_lists_vocabulary(policy):
    with pytest.raises(UserError) as e:
        policy.check_prompts(["a photo of a purple dog", "a photo of a red hexagon"])
    msg = str(e.value)
    assert "'dog'" in msg and "'hexagon'" in msg and "'purple'" in msg
    assert "circle" in msg and "squares" in msg  # the known vocabulary is listed
    with pytest.raises(UserError, match="dog"):
        policy.rollout(["a photo of a dog"], 1, 3.0)


def test_too_long_prompt_is_user_error(policy):
    with pytest.raises(UserError, match="longer than 8 words"):
        policy.check_prompts(["a photo of a red circle a photo of a"])


def test_save_load_round_trip(tmp_path, rollout):
    policy = tiny_policy("float32")
    r = policy.rollout(PROMPTS, 2, 2.0, generator=torch.Generator().manual_seed(9))
    policy.save_pretrained(str(tmp_path))
    assert {"model_index.json", "prior", "vq"} <= set(os.listdir(tmp_path))
    assert {"config.json", "model.safetensors", "vocab.json"} <= set(os.listdir(tmp_path / "prior"))
    back = load_policy(str(tmp_path))
    assert back.tokenizer.vocab == policy.tokenizer.vocab
    assert back.config == policy.config
    for ctx in ("cond", "uncond", "cfg"):
        assert torch.equal(back.logprobs(r, ctx), policy.logprobs(r, ctx))
    r2 = back.rollout(PROMPTS, 2, 2.0, generator=torch.Generator().manual_seed(9))
    assert torch.equal(r2.tokens, r.tokens)
    assert torch.equal(back.decode(r), policy.decode(r))


def test_fp16_storage_halves_size_and_stays_close(tmp_path):
    p32, p16 = tiny_policy("float32"), tiny_policy("float16")
    p32.save_pretrained(str(tmp_path / "a"))
    p16.save_pretrained(str(tmp_path / "b"))
    s32 = os.path.getsize(tmp_path / "a" / "prior" / "model.safetensors")
    s16 = os.path.getsize(tmp_path / "b" / "prior" / "model.safetensors")
    assert s16 < 0.55 * s32
    back = ARPolicy.from_pretrained(str(tmp_path / "b"))
    assert back.head.weight.dtype == torch.float32
    r = p16.rollout(PROMPTS, 1, 2.0, generator=torch.Generator().manual_seed(2))
    assert (back.logprobs(r, "cond") - r.logp_cond).abs().max().item() < 0.05


def test_load_policy_errors_name_the_path(tmp_path):
    with pytest.raises(UserError, match="no such directory"):
        load_policy(str(tmp_path / "missing"))
    with pytest.raises(UserError, match=str(tmp_path)):
        load_policy(str(tmp_path))  # exists but is not a checkpoint
    assert SHIPPED["shapeworld"].endswith(os.path.join("t2i_gcpo", "assets", "shapeworld"))
    assert resolve_checkpoint(str(tmp_path)) == str(tmp_path)


def test_code_embeddings_come_from_the_vq_codebook(policy, rollout):
    emb = policy.code_embeddings(rollout)
    assert emb.shape == (6, 16, 4)
    assert torch.equal(emb[2, 3], policy.vq.quantizer.embed[rollout.tokens[2, 3]])
    assert policy.decode(rollout).shape == (6, 3, 16, 16)
