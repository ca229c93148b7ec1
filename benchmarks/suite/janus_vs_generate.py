"""Section `janus_vs_generate`: our Janus rollout against transformers' own CFG image ``generate``.

A tiny random Janus checkpoint (tests/tiny_models.py `build_tiny_janus`: Llama d = 64, 2 layers,
an 8×8 grid of image tokens, K = 64) written to a temporary folder. Ours: ``JanusPolicy.rollout`` of B
images (B/4 prompts × 4 samples) with CFG 5, recording the pos, neg and guided log-prob of every
token. Theirs: ``JanusForConditionalGeneration.generate(generation_mode="image", do_sample=True,
guidance_scale=5, top_k=0, top_p=1, temperature=1)`` on the same prompt ids, which doubles the batch
for CFG the same way, samples the same number of image tokens and records nothing. Neither decodes to
pixels. One warm-up each, then best of the repeats, the two interleaved.
"""

from __future__ import annotations

import sys
import tempfile

import torch

from benchmarks.suite.common import REPO, Context, race, race_row, race_section

TITLE = "Janus rollout vs transformers `generate` (`janus_vs_generate`)"
GRID = 8  # image tokens per side: T = 64
GROUP = 4
PROMPT = "a photo of a red circle"
SCALE = 5.0


def build_tiny_janus(directory: str) -> str:
    """tests/tiny_models.py's builder (the tests' own tiny checkpoint, at an 8×8 token grid)."""
    if str(REPO / "tests") not in sys.path:
        sys.path.insert(0, str(REPO / "tests"))
    from tiny_models import build_tiny_janus as build

    return str(build(directory, grid=GRID))


def run(ctx: Context) -> dict:
    from transformers.utils import logging as hf_logging

    from t2i_gcpo.policies.base import PromptRecord, SamplingParams
    from t2i_gcpo.policies.janus import JanusPolicy
    from t2i_gcpo.policies.text import quiet_hub_bars
    from t2i_gcpo.tasks.loop import group_generators

    hf_logging.set_verbosity_error()
    batches = ctx.pick([4, 16], [4, 16, 64])
    repeats = ctx.pick(2, 3)
    sampling = SamplingParams(guidance_scale=SCALE)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        with quiet_hub_bars():
            policy = JanusPolicy.from_pretrained(build_tiny_janus(f"{tmp}/janus")).eval().to(ctx.device)
        steps = policy.num_image_tokens
        for batch in batches:
            prompts = [PromptRecord(PROMPT)] * (batch // GROUP)
            ids, mask = policy.pad_left(policy.prompt_ids([PROMPT] * batch))

            def ours(seed: int, prompts=prompts, batch=batch) -> None:
                gens = group_generators(seed, "bench", range(len(prompts)))
                ro = policy.rollout(prompts, GROUP, sampling, gens)
                assert ro.tokens.shape == (batch, steps)

            def theirs(seed: int, ids=ids, mask=mask, batch=batch) -> None:
                torch.manual_seed(seed)
                out = policy.model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    generation_mode="image",
                    do_sample=True,
                    guidance_scale=SCALE,
                    top_k=0,
                    top_p=1.0,
                    temperature=1.0,
                )
                assert out.shape == (batch, steps)

            rows.append(race_row(batch, race(ours, theirs, repeats, ctx), batch, "ips"))
    ratios = [r["speed_ratio"] for r in rows]
    wins = sum(x >= 1 for x in ratios)
    reading = (
        f"Our Janus rollout runs at {min(ratios):.2f}–{max(ratios):.2f}× the speed of transformers' CFG "
        f"`generate` over batches {', '.join(str(b) for b in batches)} ({wins} of {len(rows)} at or "
        f"above 1×), for {steps} image tokens per image, while recording the pos, neg and guided log-prob "
        f"of every token (what the RL update and GCPO's credit need), which `generate` does not return. Both "
        f"run one doubled [cond; null] batch through a static KV cache; the model is tiny, so what is "
        f"measured is the per-step overhead of each loop, not FLOPs."
    )
    return race_section(TITLE, rows, repeats, "images", "ips", "images/s", reading, image_tokens=steps)
