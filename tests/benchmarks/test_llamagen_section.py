"""Section `llamagen` of ``python -m benchmarks`` (benchmarks/suite/llamagen.py) at the tiny shape on the CPU:
every loop gives a row, and the port of the reference's sampling loop agrees with ours — the same prefill
logits and the same greedy tokens — so the comparison the section prints is between two
samplers of one model."""

from __future__ import annotations

import torch

from benchmarks.suite import llamagen
from benchmarks.suite.common import Context


def test_section_runs_tiny_and_the_reference_port_agrees_with_ours():
    sec = llamagen.run(Context(quick=True, threads=1, device="cpu"))
    assert sec["summary"]["shape"] == "tiny"
    assert [r["loop"] for r in sec["rows"]] == ["ours eager", "ours static", "reference loop"]
    for r in sec["rows"]:
        assert (
            r["tokens"] == llamagen.CPU_TOKENS and 0 < r["prefill_s"] < r["seconds"] and r["ms_per_step"] > 0
        )
    agree = sec["summary"]["agreement"]
    assert agree["prefill_max_abs_diff"] < 1e-5 and agree["greedy_equal"] == agree["greedy_tokens"]
    assert "reference port" in sec["reading"]


def test_the_reference_port_samples_what_generate_py_samples():
    """Top-k 1 is greedy in both; with sampling the port draws with torch.multinomial from its own generator,
    so the same seed gives the same tokens and another seed others."""
    policy = llamagen.build("tiny", "cpu", torch.float32)
    feats, mask = policy.captions(llamagen.PROMPTS[:2])
    a, first = llamagen.reference_generate(policy.gpt, feats, mask, 6, seed=1)
    b, _ = llamagen.reference_generate(policy.gpt, feats, mask, 6, seed=1)
    c, _ = llamagen.reference_generate(policy.gpt, feats, mask, 6, seed=2)
    assert a.shape == (2, 6) and torch.equal(a, b) and not torch.equal(a, c)
    assert first.shape == (2, policy.codebook_size)
