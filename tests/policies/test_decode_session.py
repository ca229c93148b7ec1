"""The static decode loop kept for a run (policies/decode_loop.DecodeSession), on the CPU with the stand-in
for torch.cuda's graphs of tests/policies/test_decode_loop_regressions.py: one capture per span a run, not per
pass; the weight copies refreshed in place after an optimizer step; a bigger pass allocates and captures
again. And the fused decoder's fast path: LoRA adapters merged into its copies (tokens equal peft's own
layers), its attention's scores formed in float32 from bf16 inputs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from t2i_gcpo.policies.base import SamplingParams
from t2i_gcpo.policies.fused_llama import FusedLlamaDecoder
from t2i_gcpo.policies.registry import load_policy

from decode_fixtures import CFG, JANUS, SHAPES, assert_same, install_fake_cuda, roll
from tiny_models import build_tiny_janus, tiny_policy_dir


@pytest.fixture
def prior(tmp_path):
    """A fresh tiny prior of 4×4 tokens (its weights are stepped here)."""
    return load_policy(str(tiny_policy_dir(tmp_path))).eval()


@pytest.fixture(scope="module")
def janus_dir(tmp_path_factory):
    return build_tiny_janus(tmp_path_factory.mktemp("janus") / "ckpt")


def optimizer_step(policy, rollout) -> None:
    """One AdamW step on the rollout's log-probs: every trainable weight changes in place."""
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    loss = -policy.logprobs(rollout, "guided").mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def test_one_capture_a_run_two_passes_with_an_optimizer_step_between(prior, monkeypatch):
    """Pass 1 captures each span once (5 spans of 4 slots); pass 2, after an optimizer step, captures nothing,
    replays every step and draws what a fresh eager pass of the new weights draws; a smaller pass runs
    padded in the same buffers; a bigger one allocates anew and captures again."""
    fake = install_fake_cuda(monkeypatch, None)  # a fresh prior: a fresh session
    monkeypatch.setattr("t2i_gcpo.policies.ar.resolve_mode", lambda *args: "graph")
    session, T = prior.decode_session, prior.num_tokens
    first = roll(prior, SHAPES, 2, CFG, "graph")
    assert fake.captures == 5 and session.stats["captures"] == 5 and session.stats["allocations"] == 1
    buffers = [t.data_ptr() for t in session.current.decoder.layers[0] + (session.current.tokens,)]

    optimizer_step(prior, first)
    second = roll(prior, SHAPES, 2, CFG, "graph", seed=1)
    assert fake.captures == 5, "no capture in the second pass"
    assert prior.last_decode["replays"] == T - 1 and session.stats["refreshes"] == 1
    assert [t.data_ptr() for t in session.current.decoder.layers[0] + (session.current.tokens,)] == buffers
    monkeypatch.undo()  # the eager reference, with the new weights, from the same seeds
    assert_same(roll(prior, SHAPES, 2, CFG, "eager", seed=1), second)

    fake = install_fake_cuda(monkeypatch, None)  # the session stays
    monkeypatch.setattr("t2i_gcpo.policies.ar.resolve_mode", lambda *args: "graph")
    smaller = roll(prior, SHAPES[:1], 2, CFG, "graph", seed=2)
    assert fake.captures == 0 and session.stats["allocations"] == 1
    bigger = roll(prior, SHAPES * 2, 2, CFG, "graph", seed=3)
    assert fake.captures == 5 and session.stats["allocations"] == 2
    monkeypatch.undo()
    assert_same(roll(prior, SHAPES[:1], 2, CFG, "eager", seed=2), smaller)
    assert_same(roll(prior, SHAPES * 2, 2, CFG, "eager", seed=3), bigger)


def test_bf16_weight_copies_are_refreshed_in_place(prior):
    """Under bf16 autocast the decoder holds bf16 copies of the fused weights: after an optimizer step the
    next pass copies the new weights into the same tensors."""
    sampling = dataclasses.replace(CFG, decode="static")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ro = roll(prior, SHAPES, 2, sampling, "static")
    decoder = prior.decode_session.current.decoder
    qkv, gate_up = decoder.layers[0][1], decoder.layers[0][4]
    assert qkv.dtype == torch.bfloat16
    ptrs = (qkv.data_ptr(), gate_up.data_ptr())
    optimizer_step(prior, ro)
    attn = prior.llama.layers[0].self_attn
    want = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).to(torch.bfloat16)
    assert not torch.equal(qkv, want)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        roll(prior, SHAPES, 2, sampling, "static")
    assert prior.decode_session.current.decoder is decoder and (qkv.data_ptr(), gate_up.data_ptr()) == ptrs
    assert torch.equal(qkv, want)


def test_lora_samples_through_the_fused_decoder(janus_dir):
    """Janus with LoRA (model_options.lora_rank) samples through the fused decoder, the adapters' deltas
    merged into its weight copies: the static and eager fused loops draw the tokens of transformers' layers
    with peft's adapters; after the adapters change (an optimizer step) the next pass draws
    from the new ones."""
    from t2i_gcpo.policies.janus import JanusPolicy

    policy = JanusPolicy.from_pretrained(janus_dir, lora={"r": 4})
    with torch.no_grad():  # peft starts B at 0 (a zero delta): give the adapters a visible one
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    assert policy.samples_fused and policy.capabilities.bf16_sampling
    static = roll(policy, JANUS, 2, CFG, "static")
    eager = roll(policy, JANUS, 2, CFG, "eager")
    policy.fused_sampler = False  # peft's own layers in transformers' loop
    theirs = roll(policy, JANUS, 2, CFG, "eager")
    assert_same(theirs, static)
    assert_same(theirs, eager)
    base = JanusPolicy.from_pretrained(janus_dir)
    assert not torch.equal(roll(base, JANUS, 2, CFG, "static").tokens, static.tokens), "the deltas count"

    policy.fused_sampler = True
    optimizer_step(policy, static)  # only the adapters (and the generation modules) train
    again = roll(policy, JANUS, 2, CFG, "static", seed=1)
    assert policy.decode_session.stats["refreshes"] == 1
    policy.fused_sampler = False
    assert_same(roll(policy, JANUS, 2, CFG, "eager", seed=1), again)


def test_one_query_attention_forms_its_scores_in_float32():
    """bf16 keys and queries whose scores reach ≈ 30 (as real checkpoints'): the fused attention equals the
    float32 attention of the same bf16 values to about the output's own bf16 rounding. Scores rounded to bf16
    before the softmax (the decoder before this change) missed by ≈ 15× that."""
    from transformers import LlamaConfig, LlamaModel

    from t2i_gcpo.policies.janus import JanusPolicy  # noqa: F401 (transformers' Llama config below)

    cfg = LlamaConfig(
        vocab_size=16,
        hidden_size=256,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        dec = FusedLlamaDecoder(LlamaModel(cfg), rows=4, max_len=160)
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(4, 4, 1, 64, generator=g) * 3).bfloat16()
    kv = (
        torch.randn(2, 4, 2, 160, 64, generator=g) * torch.tensor([3.0, 1.0]).view(2, 1, 1, 1, 1)
    ).bfloat16()
    mask = torch.rand(4, 1, 1, 160, generator=g) > 0.3
    got = dec._attend(q, kv, mask, plain=True).float()  # the CPU eager loop's: plain matmuls
    fused = dec._attend(q, kv, mask).float()  # scaled_dot_product_attention (its CPU kernel here)
    keys, values = (x.float().repeat_interleave(2, dim=1) for x in kv)
    scores = (q.float() @ keys.transpose(-1, -2)) / 8
    assert scores.abs().max() > 20
    want = (
        F.scaled_dot_product_attention(q.float(), keys, values, attn_mask=mask)
        .transpose(1, 2)
        .reshape(4, 1, -1)
    )
    rounding = (want.bfloat16().float() - want).abs().max()  # the output's own bf16 rounding
    for x in (got, fused):  # (both round the probabilities to bf16 for p·v)
        assert (x - want).abs().max() < 2 * rounding
    rounded = (
        scores.bfloat16().float().masked_fill(~mask, float("-inf")).softmax(-1).bfloat16().float() @ values
    )
    assert (rounded.transpose(1, 2).reshape(4, 1, -1) - want).abs().max() > 5 * rounding


def test_decoder_refuses_what_it_cannot_merge(janus_dir):
    """Plain LoRA is merged; DoRA (a magnitude vector on top) is not: such a model samples through
    transformers' layers."""
    from t2i_gcpo.policies.fused_llama import supports_model
    from t2i_gcpo.policies.janus import JanusPolicy

    policy = JanusPolicy.from_pretrained(janus_dir, lora={"r": 2})
    lm = policy.model.model.language_model
    assert supports_model(lm)
    layer = lm.layers[0].self_attn.q_proj
    layer.use_dora["default"] = True
    try:
        assert not supports_model(lm) and not policy.samples_fused
    finally:
        layer.use_dora["default"] = False


def test_eager_default_keeps_no_session(prior):
    """rollout.decode auto on the CPU is the eager loop as before: nothing is kept between passes."""
    roll(prior, SHAPES, 2, SamplingParams(guidance_scale=3.0), "auto")
    assert prior.decode_session.current is None and prior.decode_session.stats["passes"] == 0


def test_lora_added_after_a_pass_is_copied_into_the_kept_decoder(janus_dir):
    """The kept decoder owns a copy of every weight its step reads (float32, no adapters: the o / down
    projections too), so adapters added after a pass are merged into those copies in place, and the base
    weights stay untouched (before it kept the o / down weights themselves, and had to build a new one)."""
    from t2i_gcpo.policies.janus import JanusPolicy

    policy = JanusPolicy.from_pretrained(janus_dir)
    roll(policy, JANUS, 2, CFG, "static")
    attn = policy.model.model.language_model.layers[0].self_attn
    base = attn.o_proj.weight.detach().clone()
    policy._add_lora({"r": 2})
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    ours = roll(policy, JANUS, 2, CFG, "static")
    assert policy.decode_session.stats["allocations"] == 1 and policy.decode_session.stats["refreshes"] == 1
    assert torch.equal(attn.o_proj.base_layer.weight, base)
    policy.fused_sampler = False
    assert_same(roll(policy, JANUS, 2, CFG, "eager"), ours)
