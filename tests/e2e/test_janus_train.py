"""`t2i-gcpo train --model janus:DIR` on a tiny random Janus built in the test."""

from __future__ import annotations

import json

import pytest
import torch

from t2i_gcpo.cli import main

from tiny_models import build_tiny_janus


@pytest.mark.slow
def test_train_janus_from_the_cli_changes_and_saves_parameters(tmp_path):
    from transformers import JanusForConditionalGeneration

    ckpt = tmp_path / "janus"
    build_tiny_janus(ckpt)
    prompts = tmp_path / "p.txt"
    prompts.write_text(
        "a photo of a cat\na photo of two dogs\na photo of a red cat\na photo of a dog left of a cat\n"
    )
    out = tmp_path / "run"
    args = [
        "train",
        "--prompts",
        str(prompts),
        "--model",
        f"janus:{ckpt}",
        "--reward",
        "train_fixtures:redness",
        "--out",
        str(out),
        "--steps",
        "2",
        "--algo",
        "gcpo-official",
        "--set",
        "rollout.prompts_per_step=2",
        "--set",
        "rollout.group_size=4",
        "--set",
        "optim.lr=1e-3",
        "--set",
        "save_every=2",
        "--set",
        "sample_every=2",
        "--set",
        "eval_every=-1",
    ]
    try:
        main(args)
    except SystemExit as e:
        assert e.code in (0, None)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["loss/policy"] is not None for r in rows if r["groups_kept"])
    saved = JanusForConditionalGeneration.from_pretrained(out / "checkpoints" / "step_000002" / "model")
    base = JanusForConditionalGeneration.from_pretrained(ckpt)
    a, b = base.state_dict(), saved.state_dict()
    changed = [k for k in a if not torch.equal(a[k], b[k])]
    assert any("language_model" in k for k in changed), "the language model was trained"
    assert not any(k.startswith("model.vqmodel") for k in changed), "the VQ stays frozen"
    assert (out / "credit_maps" / "step_000002.png").is_file()
