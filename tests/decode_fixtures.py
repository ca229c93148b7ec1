"""What the decode-loop tests share (tests/policies/test_decode_loop_regressions.py, test_decode_session.py):
prompts of each family, a guided sampling, a rollout in a given decode mode, the equality of two rollouts,
and the stand-in for torch.cuda's capture (tests/capture_standin.py) installed with fresh decode sessions."""

from __future__ import annotations

import dataclasses

import torch

from t2i_gcpo.policies import decode_loop
from t2i_gcpo.policies.base import PromptRecord, SamplingParams
from t2i_gcpo.tasks.loop import group_generators

from capture_standin import StandInCuda

SHAPES = ["a photo of a red circle", "a photo of two blue squares"]
JANUS = ["a red circle", "two blue squares left of a green cat"]  # different lengths: left padding
SUMS = ["4*14*10=?", "16*7+12*12=?"]
CFG = SamplingParams(guidance_scale=3.0, top_k=20, top_p=0.9)


def roll(policy, texts, group, sampling, mode, seed=0):
    records = [PromptRecord(t) for t in texts]
    return policy.rollout(
        records,
        group,
        dataclasses.replace(sampling, decode=mode),
        group_generators(seed, "test", range(len(texts))),
    )


def assert_same(a, b, atol=1e-4):
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(a.mask, b.mask)
    assert sorted(a.logp) == sorted(b.logp)
    for c in a.logp:
        torch.testing.assert_close(a.logp[c], b.logp[c], atol=atol, rtol=0, msg=c)


def install_fake_cuda(monkeypatch, fail_at, *policies):
    """The stand-in on torch.cuda (tests/capture_standin.py), spans of 4 slots, and fresh decode sessions (no
    graph nor fallback of an earlier test) for `policies`."""
    for policy in policies:  # (before the fix there was no session: every pass captured anew)
        if hasattr(decode_loop, "DecodeSession"):
            monkeypatch.setattr(policy, "decode_session", decode_loop.DecodeSession(), raising=False)
    fake = StandInCuda(fail_at)
    for owner, name, value in fake.patches(span=4):
        monkeypatch.setattr(owner, name, value)
    return fake
