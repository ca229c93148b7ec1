"""The built-in AR prior as a Policy: sampler log-probs ≡ teacher-forced log-probs for every context,
CFG maths, KV-cache ≡ no-cache sampling, per-prompt generators (a sample ignores its batch-mates),
chunked log-probs ≡ one-chunk log-probs (values and gradients), the shared `sample_step`
(inverse CDF, top-k, top-p, guidance formulas), prompt vocabulary errors, persistence."""

from __future__ import annotations

import math
import os

import pytest
import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.policies import sampling as sampling_mod
from t2i_gcpo.policies.ar import ARPolicy, load_policy, resolve_checkpoint
from t2i_gcpo.policies.base import Policy, PromptRecord, Rollout, SamplingParams
from t2i_gcpo.policies.families.ar import SHIPPED
from t2i_gcpo.policies.sampling import GUIDANCE, ChunkedDists, chunk_size, filter_logits, sample_step
from t2i_gcpo.tasks.loop import group_generators

from tiny_models import tiny_ar_policy

PROMPTS = ["a photo of a red circle", "a photo of two blue squares", "a photo of a cross above a circle"]
CONTEXTS = ("pos", "neg", "guided")


def tiny_policy(storage: str = "float32", seed: int = 0) -> ARPolicy:
    return tiny_ar_policy(PROMPTS, storage, seed)


def records(texts: list[str]) -> list[PromptRecord]:
    return [PromptRecord(t) for t in texts]


def gens(seed: int, n: int) -> list[torch.Generator]:
    """Fresh per-prompt generators (generators are stateful: every rollout needs new ones)."""
    return group_generators(seed, "test", range(n))


def roll(policy: ARPolicy, texts: list[str], group_size: int, seed: int, **sampling) -> Rollout:
    return policy.rollout(records(texts), group_size, SamplingParams(**sampling), gens(seed, len(texts)))


def raw_logits(policy: ARPolicy, r: Rollout, context: str) -> torch.Tensor:
    """Unscaled logits [B, T, K] of `context`, computed directly (head on the teacher-forced hidden
    states, the guidance formula applied by hand)."""
    pid, tok = r.state["prompt_ids"], r.tokens
    lc = policy.head(policy.teacher_forced_hidden(pid, tok))
    lu = policy.head(policy.teacher_forced_hidden(pid, tok, null=True))
    s = r.sampling.guidance_scale
    return {"pos": lc, "neg": lu, "guided": lu + s * (lc - lu)}[context]


@pytest.fixture(scope="module")
def policy() -> ARPolicy:
    return tiny_policy()


@pytest.fixture(scope="module")
def rollout(policy):
    return roll(policy, PROMPTS[:2], 3, seed=1, guidance_scale=2.5, temperature=0.7)


def test_is_a_policy_and_rollout_layout(policy, rollout):
    assert isinstance(policy, Policy)
    assert policy.output == "image" and policy.default_task == "shapeworld"
    assert policy.guidance == "u + s(c − u)" and policy.guidance in GUIDANCE
    assert policy.grid_shape == (4, 4) and policy.layout.grid == (4, 4) and policy.layout.kind == "grid"
    assert policy.default_sampling() == SamplingParams(guidance_scale=3.0)  # ARConfig.default_cfg_scale
    assert rollout.tokens.shape == (6, 16) and rollout.tokens.dtype == torch.long
    assert rollout.texts == [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3  # groups contiguous
    assert all(isinstance(p, PromptRecord) for p in rollout.prompts)
    assert rollout.group_size == 3 and rollout.max_len == 16 and len(rollout) == 6
    assert torch.equal(rollout.mask, torch.ones(6, 16))
    assert torch.equal(rollout.step, torch.arange(16).expand(6, -1))  # AR: token t is decided at step t
    pid = rollout.state["prompt_ids"]
    assert pid.shape == (6, 8) and torch.equal(pid[0], pid[2]) and not torch.equal(pid[0], pid[3])
    assert int(rollout.tokens.max()) < 16
    assert set(rollout.logp) == set(CONTEXTS)
    assert all(v.shape == (6, 16) and (v <= 0).all() for v in rollout.logp.values())
    assert rollout.sampling.guidance_scale == 2.5 and rollout.sampling.temperature == 0.7


def test_select_and_concat_keep_rows_together(rollout):
    part = rollout.select([4, 1])
    assert part.texts == [PROMPTS[1], PROMPTS[0]]
    assert torch.equal(part.tokens, rollout.tokens[[4, 1]])
    assert torch.equal(part.state["prompt_ids"], rollout.state["prompt_ids"][[4, 1]])
    assert all(torch.equal(part.logp[k], rollout.logp[k][[4, 1]]) for k in CONTEXTS)
    back = Rollout.concat([rollout.select([0, 1, 2]), rollout.select([3, 4, 5])])
    assert back.texts == rollout.texts and torch.equal(back.tokens, rollout.tokens)
    assert all(torch.equal(back.logp[k], rollout.logp[k]) for k in CONTEXTS)


def test_dists_are_temperature_scaled_logits(policy, rollout):
    logp, d = policy.logprobs_and_dists(rollout, "pos")
    assert isinstance(d, ChunkedDists)
    z = d.full()
    assert z.shape == (6, 16, 16) and not z.requires_grad
    with torch.no_grad():
        raw = policy.teacher_forced_logits(rollout.state["prompt_ids"], rollout.tokens)
    assert torch.allclose(z, raw / 0.7, atol=1e-5)
    assert torch.allclose(logp, z.log_softmax(-1).gather(-1, rollout.tokens[..., None]).squeeze(-1))
    assert torch.equal(logp, policy.logprobs(rollout, "pos"))  # the dists change nothing else
    assert torch.equal(policy(rollout, "pos", dists=True)[0], logp)  # forward(dists=True): the pair
    assert torch.allclose(policy(rollout, "pos"), logp)  # forward = logprobs (DDP syncs grads)


def test_guided_dists_combine_pos_and_neg(policy, rollout):
    z = {c: policy.logprobs_and_dists(rollout, c)[1].full() * 0.7 for c in CONTEXTS}  # unscaled
    assert torch.allclose(z["guided"], z["neg"] + 2.5 * (z["pos"] - z["neg"]), atol=1e-4)


def test_cfg_scale_one_is_conditional_only(policy):
    r = roll(policy, PROMPTS[:2], 2, seed=3, guidance_scale=1.0)
    assert torch.allclose(r.logp["guided"], r.logp["pos"], atol=1e-6)
    assert torch.allclose(policy.logprobs(r, "guided"), policy.logprobs(r, "pos"), atol=1e-5)
    assert not torch.allclose(r.logp["guided"], r.logp["neg"], atol=1e-3)


def test_top_k_one_is_greedy_on_guided_logits(policy):
    r = roll(policy, PROMPTS[:2], 2, seed=4, guidance_scale=3.0, top_k=1)
    with torch.no_grad():
        assert torch.equal(r.tokens, raw_logits(policy, r, "guided").argmax(-1))
    assert torch.equal(r.tokens[0], r.tokens[1])  # greedy: the group is identical


@pytest.mark.parametrize("cache", ["fused", "dynamic", "none"])
def test_kv_cache_and_recompute_sample_identical_tokens(policy, cache):
    """Every sampling loop (ours with fused projections, transformers' caches, full recompute) draws
    the same tokens and records the same log-probs as transformers' StaticCache loop."""
    pid = policy.encode_prompts(PROMPTS)
    sp = SamplingParams(guidance_scale=3.0)
    u = torch.rand(3, 16, generator=torch.Generator().manual_seed(7))
    tok_s, lp_s = policy.generate(pid, sp, u, cache="static")
    tok_o, lp_o = policy.generate(pid, sp, u, cache=cache)
    assert lp_s.shape == (3, 3, 16)  # pos, neg, guided
    assert torch.equal(tok_s, tok_o)
    assert (lp_s - lp_o).abs().max().item() < 1e-4


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_fused_decoder_matches_llama_forward(kv_heads):
    """Prefill then one token at a time through FusedLlamaDecoder gives, at every position, the final
    hidden state of one full LlamaModel forward over the whole sequence (also with grouped-query
    attention, and with rows left-padded: positions and key mask as the text adapter passes them)."""
    from transformers import LlamaConfig, LlamaModel

    from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
    )
    llama = LlamaModel(cfg).eval()
    seq = torch.randint(0, 50, (4, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = llama(input_ids=seq).last_hidden_state  # [4, 20, D]
        dec = FusedLlamaDecoder(llama, rows=4, max_len=20)
        got = [dec.forward(seq[:, :8], 0)] + [dec.forward(seq[:, t : t + 1], t) for t in range(8, 20)]
        assert torch.allclose(got[0], want[:, 7], atol=1e-5)
        assert torch.allclose(torch.stack(got[1:], 1), want[:, 8:], atol=1e-5)
        # row 0 left-padded by 3: it must give what its unpadded sequence gives alone
        keep = torch.ones(4, 20, dtype=torch.bool)
        keep[0, :3] = False
        pos = (keep.long().cumsum(-1) - 1).clamp(min=0)
        dec = FusedLlamaDecoder(llama, rows=4, max_len=20)
        dec.forward(seq[:, :8], 0, positions=pos[:, :8], key_mask=keep[:, :8])
        last = [dec.forward(seq[:, t : t + 1], t, pos[:, t : t + 1], keep[:, : t + 1]) for t in range(8, 20)]
        alone = llama(input_ids=seq[:1, 3:]).last_hidden_state[0, -12:]
    assert torch.allclose(torch.stack(last, 1)[0], alone, atol=1e-5)
    with pytest.raises(ValueError, match="start at position 0"):
        dec.forward(seq[:, :2], 3)


def test_fused_decoder_refuses_configs_it_does_not_reproduce():
    from transformers import LlamaConfig, LlamaModel, Qwen2Config

    from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder, supports

    kw = dict(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
    assert supports(LlamaConfig(**kw)) and supports(LlamaConfig(**kw, num_key_value_heads=2))
    llama3_rope = {
        "rope_type": "llama3",
        "rope_theta": 5e5,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    for cfg in (
        LlamaConfig(**kw, attention_bias=True),
        LlamaConfig(**kw, mlp_bias=True),
        LlamaConfig(**kw, rope_parameters=llama3_rope),
    ):
        assert not supports(cfg)
        with pytest.raises(ValueError, match="unsupported"):
            FusedLlamaDecoder(LlamaModel(cfg), rows=1, max_len=4)
    assert not supports(Qwen2Config(**kw))  # q/k/v biases


def test_rollout_needs_one_generator_per_prompt(policy):
    with pytest.raises(ValueError, match="one generator per prompt"):
        policy.rollout(records(PROMPTS[:2]), 2, SamplingParams(), gens(0, 1))


def test_null_prompt_is_all_pads(policy):
    pid = policy.encode_prompts(PROMPTS[:1])
    t = policy.tokenizer
    assert policy.prefix(pid, null=True).tolist() == [[t.bos_id] + [t.pad_id] * 8 + [t.boi_id]]
    words = [t.index[w] for w in PROMPTS[0].split()]
    assert policy.prefix(pid).tolist() == [[t.bos_id] + words + [t.pad_id] * (8 - len(words)) + [t.boi_id]]


def test_gradients_reach_prior_not_vq(policy, rollout):
    policy.zero_grad(set_to_none=True)
    policy.logprobs(rollout, "guided").sum().backward()
    assert policy.head.weight.grad is not None and policy.head.weight.grad.abs().sum() > 0
    assert policy.llama.embed_tokens.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in policy.vq.parameters())
    policy.zero_grad(set_to_none=True)


# ----------------------------------------------------------------------------- chunking over T
SMALL_BUDGET = 6 * 16 * 3  # B·K·3 elements: chunks of 3 tokens → 6 chunks over T = 16


def _grads(policy: ARPolicy, r: Rollout, context: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    params = [
        policy.head.weight,
        policy.llama.embed_tokens.weight,
        policy.llama.layers[0].self_attn.q_proj.weight,
        policy.llama.layers[1].mlp.down_proj.weight,
    ]
    policy.zero_grad(set_to_none=True)
    logp = policy.logprobs(r, context)
    # a weighted sum, so every position's gradient counts differently
    (logp * torch.linspace(-1.0, 2.0, logp.numel()).view_as(logp)).sum().backward()
    grads = [p.grad.clone() for p in params]
    policy.zero_grad(set_to_none=True)
    return logp.detach(), grads


@pytest.mark.parametrize("context", CONTEXTS)
def test_chunked_logprobs_equal_one_chunk_values_and_gradients(policy, rollout, context, monkeypatch):
    assert chunk_size(6, 16, 16) == 16  # the default budget: one chunk
    one, g_one = _grads(policy, rollout, context)
    calls = []
    real = sampling_mod.checkpoint

    def counting_checkpoint(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sampling_mod, "LOGIT_BUDGET", SMALL_BUDGET)
    monkeypatch.setattr(sampling_mod, "checkpoint", counting_checkpoint)
    assert chunk_size(6, 16, 16) == 3
    many, g_many = _grads(policy, rollout, context)
    assert len(calls) == 6  # six chunks, each under activation checkpointing
    assert torch.allclose(many, one, atol=1e-6)
    assert (many - rollout.logp[context]).abs().max().item() < 1e-4
    for a, b in zip(g_many, g_one):
        assert b.abs().sum() > 0
        err = ((a - b).abs().max() / b.abs().max()).item()
        assert err < 1e-5  # float rounding only (the chunks' sums are summed in another order)


@pytest.mark.parametrize("context", CONTEXTS)
def test_chunked_dists_join_to_the_full_logits(policy, rollout, context, monkeypatch):
    monkeypatch.setattr(sampling_mod, "LOGIT_BUDGET", SMALL_BUDGET)
    logp, d = policy.logprobs_and_dists(rollout, context)
    chunks = list(d)
    assert len(chunks) == 6
    assert [(s.start, s.stop) for s, _ in chunks] == [(0, 3), (3, 6), (6, 9), (9, 12), (12, 15), (15, 16)]
    assert all(z.shape == (6, s.stop - s.start, 16) and not z.requires_grad for s, z in chunks)
    with torch.no_grad():
        want = raw_logits(policy, rollout, context) / 0.7
    assert torch.allclose(torch.cat([z for _, z in chunks], dim=1), want, atol=1e-5)
    assert torch.allclose(d.full(), want, atol=1e-5)
    for s, z in chunks:  # each chunk's log-softmax at the sampled tokens is that chunk of logp
        got = z.log_softmax(-1).gather(-1, rollout.tokens[:, s, None]).squeeze(-1)
        assert torch.allclose(got, logp[:, s].detach(), atol=1e-6)


# ----------------------------------------------------------------------------- sample_step
def _logsm(v: list[float], i: int) -> float:
    return v[i] - math.log(sum(math.exp(x) for x in v))


def test_sample_step_hand_computed():
    lc = torch.tensor([[2.0, 0.0, 0.0]])
    lu = torch.tensor([[0.0, 1.0, 0.0]])
    # s = 2: ℓ_guided = ℓ_u + 2(ℓ_c − ℓ_u) = [4, -1, 0]; T = 2 → z = [2, -0.5, 0]
    sp = SamplingParams(guidance_scale=2.0, temperature=2.0, top_k=1)
    for u in (0.0, 0.5, 0.999):  # top-1: every uniform picks the argmax of the guided logits
        tok, lp = sample_step(lc, lu, sp, torch.tensor([u]))
        assert tok.tolist() == [0]
    assert set(lp) == set(CONTEXTS)
    assert lp["pos"].item() == pytest.approx(_logsm([1.0, 0.0, 0.0], 0), abs=1e-6)
    assert lp["neg"].item() == pytest.approx(_logsm([0.0, 0.5, 0.0], 0), abs=1e-6)
    assert lp["guided"].item() == pytest.approx(_logsm([2.0, -0.5, 0.0], 0), abs=1e-6)  # untruncated

    # no truncation: inverse CDF over softmax([2, -0.5, 0]) = [0.8214, 0.0674, 0.1112]
    p = torch.tensor([2.0, -0.5, 0.0]).softmax(-1).tolist()
    sp = SamplingParams(guidance_scale=2.0, temperature=2.0)
    for u, want in ((0.5, 0), (p[0] + 0.5 * p[1], 1), (0.95, 2)):
        tok, lp = sample_step(lc, lu, sp, torch.tensor([u]))
        assert tok.tolist() == [want]
        assert lp["guided"].item() == pytest.approx(math.log(p[want]), abs=1e-6)

    # the other guidance formula: (1 + s)c − s·u = [6, -2, 0] at s = 2
    tok, lp = sample_step(lc, lu, sp, torch.tensor([0.5]), guidance="(1 + s)c − s·u")
    assert lp["guided"].item() == pytest.approx(_logsm([3.0, -1.0, 0.0], tok.item()), abs=1e-6)

    # without a negative branch the guided distribution is the positive one
    tok, lp = sample_step(lc, None, SamplingParams(temperature=2.0), torch.tensor([0.5]))
    assert set(lp) == {"pos", "guided"} and lp["guided"].item() == lp["pos"].item()


def test_sample_step_top_p_hand_computed():
    probs = torch.tensor([0.15, 0.50, 0.10, 0.25])  # sorted: 0.50 (1), 0.25 (3), 0.15 (0), 0.10 (2)
    z = probs.log()[None]
    # top-p 0.7: mass before each sorted token is 0, 0.5, 0.75, 0.9 → keep tokens 1 and 3 (0.75 ≥ 0.7)
    kept = filter_logits(z, top_p=0.7).softmax(-1)[0]
    assert torch.allclose(kept, torch.tensor([0.0, 2 / 3, 0.0, 1 / 3]), atol=1e-6)
    # top-p 0.4: the most likely token alone
    assert torch.allclose(filter_logits(z, top_p=0.4).softmax(-1)[0], torch.tensor([0.0, 1.0, 0.0, 0.0]))
    # top-p 0.8: three tokens (mass before token 0 is 0.75 < 0.8)
    assert torch.allclose(
        filter_logits(z, top_p=0.8).softmax(-1)[0], torch.tensor([0.15, 0.5, 0.0, 0.25]) / 0.9, atol=1e-6
    )

    # sampling with top-p 0.7 by inverse CDF: the kept CDF is [0, 2/3, 2/3, 1]
    sp = SamplingParams(top_p=0.7)
    u = torch.tensor([0.0, 0.3, 0.66, 0.67, 0.9, 0.9999])
    tok, lp = sample_step(z.expand(len(u), -1), None, sp, u)
    assert tok.tolist() == [1, 1, 1, 3, 3, 3]
    # the recorded log-probs are of the untruncated distribution
    assert torch.allclose(lp["pos"], probs[tok].log(), atol=1e-6)
    # top-p off: u = 0.7 falls in token 2's slice [0.65, 0.75) of the full CDF
    tok, _ = sample_step(z, None, SamplingParams(), torch.tensor([0.7]))
    assert tok.tolist() == [2]
    # many draws never pick a truncated token
    tok, _ = sample_step(
        z.expand(1000, -1), None, sp, torch.rand(1000, generator=torch.Generator().manual_seed(0))
    )
    assert set(tok.tolist()) == {1, 3}


# ----------------------------------------------------------------------------- errors, persistence
def test_unknown_words_error_names_them_and_lists_vocabulary(policy):
    with pytest.raises(UserError) as e:
        policy.check_prompts(["a photo of a purple dog", "a photo of a red hexagon"])
    msg = str(e.value)
    assert "'dog'" in msg and "'hexagon'" in msg and "'purple'" in msg
    assert "circle" in msg and "squares" in msg  # the known vocabulary is listed
    with pytest.raises(UserError, match="dog"):
        roll(policy, ["a photo of a dog"], 1, seed=0, guidance_scale=3.0)


def test_too_long_prompt_is_user_error(policy):
    with pytest.raises(UserError, match="longer than 8 words"):
        policy.check_prompts(["a photo of a red circle a photo of a"])


def test_save_load_round_trip(tmp_path, rollout):
    policy = tiny_policy("float32")
    r = roll(policy, PROMPTS, 2, seed=9, guidance_scale=2.0)
    policy.save_pretrained(str(tmp_path))
    assert {"model_index.json", "prior", "vq"} <= set(os.listdir(tmp_path))
    assert {"config.json", "model.safetensors", "vocab.json"} <= set(os.listdir(tmp_path / "prior"))
    back = load_policy(str(tmp_path))
    assert back.tokenizer.vocab == policy.tokenizer.vocab
    assert back.config == policy.config
    for ctx in CONTEXTS:
        assert torch.equal(back.logprobs(r, ctx), policy.logprobs(r, ctx))
    r2 = roll(back, PROMPTS, 2, seed=9, guidance_scale=2.0)
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
    r = roll(p16, PROMPTS, 1, seed=2, guidance_scale=2.0)
    assert (back.logprobs(r, "pos") - r.logp["pos"]).abs().max().item() < 0.05


def test_load_policy_errors_name_the_path(tmp_path):
    with pytest.raises(UserError, match="no such directory"):
        load_policy(str(tmp_path / "missing"))
    with pytest.raises(UserError, match=str(tmp_path)):
        load_policy(str(tmp_path))  # exists but is not a checkpoint
    assert SHIPPED["shapeworld"].endswith(os.path.join("t2i_gcpo", "assets", "shapeworld"))
    assert resolve_checkpoint(str(tmp_path)) == str(tmp_path)


def test_token_features_come_from_the_vq_codebook(policy, rollout):
    emb = policy.token_features(rollout)
    assert emb.shape == (6, 16, 4)
    assert torch.equal(emb[2, 3], policy.vq.quantizer.embed[rollout.tokens[2, 3]])
    assert policy.decode(rollout).shape == (6, 3, 16, 16)
