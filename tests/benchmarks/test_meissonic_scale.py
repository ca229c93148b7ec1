"""Section meissonic_scale (benchmarks/suite/meissonic_scale.py) at a tiny shape on the CPU: its rows, the
activation count it reports (checkpointing keeps less; the per-block scaling equals a count of the whole
model), and its reading (what CI keeps alive; its real-shape figures come from `python -m benchmarks --only
meissonic_scale`)."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.suite import meissonic_scale as ms
from benchmarks.suite.common import Context
from t2i_gcpo.policies.meissonic_transformer import MeissonicTransformerConfig

TINY = MeissonicTransformerConfig(
    attention_head_dim=16,
    axes_dims_rope=(4, 6, 6),
    num_attention_heads=2,
    num_layers=2,
    num_single_layers=3,
    joint_attention_dim=24,
    pooled_projection_dim=32,
    codebook_size=16,
    vocab_size=20,
)


def test_the_section_runs_tiny_on_the_cpu():
    ctx = Context(quick=True, threads=1, device="cpu")
    rows, summary = ms.measure(ctx, TINY, 8, [1, 2])
    assert [(r["what"], r["rows"]) for r in rows] == [
        ("reveal step", 2),
        ("reveal step", 4),
        ("update row", 1),
    ]
    for r in rows:
        assert r["seconds"] > 0
    assert rows[0]["rollout_s_per_image"] == pytest.approx(ms.STEPS * rows[0]["seconds"])
    assert rows[2]["checkpointing"] is True and rows[2]["update_s_per_sample"] == pytest.approx(
        6 * rows[2]["seconds"]
    )
    act = summary["activations_gib_per_row"]
    assert 0 < act["True"] < act["False"]
    assert summary["sequence"] == 77 + 16 and summary["parameters"] > 0
    sec = ms.section(ctx, rows, summary, None)
    assert "pending a GPU run" in sec["reading"] and {c[0] for c in sec["columns"]} >= {
        "what",
        "seconds",
        "peak_mb",
    }


def test_the_per_block_activation_count_equals_the_whole_models():
    """activation_gib counts models of one and two blocks of each kind and extends them: equal to counting a
    model of that depth."""
    deep = dataclasses.replace(TINY, num_layers=3, num_single_layers=2)
    for checkpointing in (False, True):
        model = ms.build(deep, "cpu")
        model.gradient_checkpointing = checkpointing
        model.train()
        whole = ms.saved_bytes(model, ms.inputs(deep, 8, 1, "cpu")) / 2**30
        assert ms.activation_gib(deep, 8, "cpu", checkpointing) == pytest.approx(whole, rel=1e-6)
