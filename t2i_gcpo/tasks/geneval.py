"""GenEval-style text-to-image tasks (docs/worlds/shapeworld.md, docs/evaluation/geneval.md): prompts in
GenEval's templates or metadata schema, scored by the GenEval rules; `shapeworld` parses against ShapeWorld's
shapes, `geneval` against GenEval's 80 COCO classes.

Step metrics: strict GenEval correctness per tag and overall, partial credit
(docs/evaluation/geneval.md#geneval-as-a-reward). Credit metric: credit lift against the object masks the
ShapeWorld reward reports (docs/worlds/shapeworld.md#credit-lift). Held-out score: per-tag strict and partial,
overall as the unweighted mean of the tag scores (GenEval's convention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from t2i_gcpo import metrics as M
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import Policy, PromptRecord, Rollout, SamplingParams
from t2i_gcpo.rewards.base import Reward
from t2i_gcpo.stats import proportions_se
from t2i_gcpo.tasks.base import shipped_file
from t2i_gcpo.tasks.loop import Scored, held_out_rows, item_keys, item_rows
from t2i_gcpo.viz.lift import credit_lift, mean_credit_lift

if TYPE_CHECKING:
    from t2i_gcpo.viz.text_heatmap import TextSample

TAG_ORDER = ("single_object", "two_object", "counting", "colors", "position", "color_attr")


@dataclass
class GenEvalTask:
    name: str
    classes: str  # "shapeworld" (ShapeWorld's shapes) or "coco" (GenEval's 80 classes)
    default_reward: str | None
    eval_file: str | None = None  # default held-out prompts
    train_file: str | None = None  # shipped training prompts
    lays_out_text: ClassVar[bool] = False  # images: no text samples

    def bind(self, policy: Policy) -> None:
        """Nothing to learn of the policy."""

    def sample_lifts(self, weights: torch.Tensor, rollout: Rollout, details: list[dict]) -> np.ndarray:
        raise ValueError(f"task '{self.name}' scores images: it has no text samples")

    def text_samples(
        self,
        rollout: Rollout,
        weights: dict[str, torch.Tensor],
        details: list[dict],
        scores: Any = None,
        advantages: Any = None,
    ) -> list[TextSample]:
        raise ValueError(f"task '{self.name}' scores images: it has no text samples")

    def _classes(self) -> list[str] | None:
        if self.classes == "shapeworld":
            return None  # the parser's default: ShapeWorld's shapes
        from t2i_gcpo.worlds.shapeworld import geneval_classes

        return geneval_classes()

    def load_prompts(self, path: str | Path) -> list[PromptRecord]:
        from t2i_gcpo.resources import prompt_file
        from t2i_gcpo.worlds.shapeworld import read_prompt_file
        from t2i_gcpo.worlds.shapeworld.parse import SHAPEWORLD_MAX_OBJECTS

        path = prompt_file(path)  # the user's file, else the shipped one it names
        limit = SHAPEWORLD_MAX_OBJECTS if self.classes == "shapeworld" else None  # a scene's objects
        metadata = read_prompt_file(path, classes=self._classes(), max_objects=limit)
        if not metadata:
            raise UserError(f"prompt file {path} holds no prompts")
        return [PromptRecord(m["prompt"], meta=m) for m in metadata]

    def parse(self, text: str) -> PromptRecord:
        from t2i_gcpo.worlds.shapeworld import parse_prompt

        m = parse_prompt(text, self._classes())
        return PromptRecord(m["prompt"], meta=m)

    def default_eval_prompts(self) -> str | None:
        return shipped_file(self.eval_file)

    def default_train_prompts(self) -> str | None:
        return shipped_file(self.train_file)

    def step_metrics(self, details: list[dict]) -> dict[str, float]:
        """Strict correctness per tag and overall, and mean partial credit, of the step's samples."""
        by_tag: dict[str, list[float]] = {}
        partial = [d["partial"] for d in details if "partial" in d]
        for d in details:
            if "strict" in d and "tag" in d:
                by_tag.setdefault(d["tag"], []).append(float(d["strict"]))
        out = {M.STRICT_TAG.format(tag=k): sum(v) / len(v) for k, v in sorted(by_tag.items())}
        if by_tag:
            flat = [x for v in by_tag.values() for x in v]
            out[M.STRICT] = sum(flat) / len(flat)
        if partial:
            out[M.PARTIAL] = sum(partial) / len(partial)
        return out

    def credit_metrics(
        self, weights: torch.Tensor, rollout: Rollout, details: list[dict]
    ) -> dict[str, float]:
        grids = object_grids(details, rollout.tokens.shape[1])
        if grids is None:
            return {}
        lift = mean_credit_lift(credit_lift(weights, grids, rollout.loss_mask))  # over creditable tokens
        return {M.CREDIT_LIFT: lift} if math.isfinite(lift) else {}

    @torch.no_grad()
    def evaluate(
        self,
        policy: Policy,
        reward: Reward,
        prompts: list[PromptRecord],
        samples_per_prompt: int,
        sampling: SamplingParams,
        seed: int,
        accelerator: Any = None,
        progress: bool = False,
        prompts_per_batch: int = 16,
    ) -> dict[str, Any]:
        """Sample `samples_per_prompt` images per prompt and score them; prompts are split across
        processes. Prompt i's samples come from its own generator (seed, "eval", i): the result does
        not depend on the batch size or the number of processes.

        Returns ``{"per_tag": {tag: {"strict", "partial", "images"}}, "strict", "partial", "images",
        "metrics": {eval/… keys}, "headline": str, "rows": [{"key", "category" (the tag), "score" (strict),
        "partial"}], "aggregate": "categories"}`` (`summarize`).
        """

        def rows_of(chunk: list[int], scored: Scored) -> list[tuple[str, float, float, int]]:
            # (tag, strict, partial, prompt index) per image; a prompt's images are consecutive rows
            out, n = scored.reward, samples_per_prompt
            return [
                (
                    p.meta.get("tag", "all"),
                    float(d.get("strict", s)),
                    float(d.get("partial", s)),
                    chunk[b // n],
                )
                for b, (d, s, p) in enumerate(zip(out.details, out.scores.tolist(), scored.rollout.prompts))
            ]

        rows = held_out_rows(
            policy,
            reward,
            prompts,
            samples_per_prompt,
            sampling,
            seed,
            rows_of,
            accelerator,
            progress,
            prompts_per_batch,
        )
        return summarize(rows)


def summarize(rows: list[tuple[str, float, float] | tuple[str, float, float, int]]) -> dict[str, Any]:
    """Per-tag and overall (unweighted mean of the tags) strict and partial scores of (tag, strict,
    partial[, prompt index]) rows, one per image; with the prompt index, the result rows each image is
    paired by (`loop.item_rows`: key "PPPPP/SSSS", category its tag, score its strict 0/1, partial)."""
    tags = [t for t in TAG_ORDER if any(r[0] == t for r in rows)] + sorted(
        {r[0] for r in rows} - set(TAG_ORDER)
    )
    per_tag = {}
    for t in tags:
        mine_t = [r for r in rows if r[0] == t]
        per_tag[t] = {
            "strict": sum(r[1] for r in mine_t) / len(mine_t),
            "partial": sum(r[2] for r in mine_t) / len(mine_t),
            "images": len(mine_t),
        }
    n = max(len(per_tag), 1)
    strict = sum(v["strict"] for v in per_tag.values()) / n
    partial = sum(v["partial"] for v in per_tag.values()) / n
    metrics = {M.EVAL_STRICT_TAG.format(tag=k): v["strict"] for k, v in per_tag.items()}
    metrics.update({M.EVAL_STRICT: strict, M.EVAL_PARTIAL: partial})
    metrics[M.EVAL_STRICT_SE] = proportions_se((v["strict"], v["images"]) for v in per_tag.values())
    items = []
    if rows and all(len(r) > 3 for r in rows):
        items = item_rows(
            item_keys(r[3] for r in rows),
            [r[0] for r in rows],
            [r[1] for r in rows],
            partial=[r[2] for r in rows],
        )
    return {
        "per_tag": per_tag,
        "strict": strict,
        "partial": partial,
        "images": len(rows),
        "metrics": metrics,
        "headline": f"held-out strict {strict:.3f}",
        "rows": items,
        "aggregate": "categories",
    }


def format_table(result: dict[str, Any]) -> str:
    """A plain-text per-tag table of an `evaluate` result."""
    w = max([14, *map(len, result["per_tag"])])  # compositional tags run to 20 characters
    lines = [f"{'tag':<{w}} {'strict':>7} {'partial':>8} {'images':>7}"]
    for tag, r in result["per_tag"].items():
        lines.append(f"{tag:<{w}} {r['strict']:>7.3f} {r['partial']:>8.3f} {r['images']:>7d}")
    lines.append(
        f"{'overall':<{w}} {result['strict']:>7.3f} {result['partial']:>8.3f} {result['images']:>7d}"
    )
    return "\n".join(lines)


def object_grids(details: list[dict], num_tokens: int) -> torch.Tensor | None:
    """Tokens covering prompt objects [B, T] bool, from the reward's details (ShapeWorld reports them)."""
    if not details or not all("object_grid" in d for d in details):
        return None
    grids = [torch.as_tensor(d["object_grid"]).reshape(-1) for d in details]
    if not all(g.numel() == num_tokens for g in grids):
        return None
    return torch.stack(grids).bool()


def evaluate_shapeworld(
    policy: Policy,
    metadata: list[dict],
    images_per_prompt: int = 4,
    cfg_scale: float | None = None,
    seed: int = 0,
    prompts_per_batch: int = 16,
    progress: bool = False,
) -> dict[str, Any]:
    """GenEval-style score of a policy on ShapeWorld prompts (GenEval metadata dicts) with the
    ShapeWorld reward at the checkpoint's own sampling settings (`cfg_scale` overrides its guidance).
    Adds ``cfg_scale`` to the result."""
    import dataclasses

    from t2i_gcpo.policies.sampling import resolve_guidance_scale
    from t2i_gcpo.rewards.forms.shapeworld import ShapeWorldReward

    sampling = dataclasses.replace(
        policy.default_sampling(), guidance_scale=resolve_guidance_scale(policy, cfg_scale)
    )
    task = GenEvalTask("shapeworld", "shapeworld", default_reward="shapeworld")
    prompts = [PromptRecord(m["prompt"], meta=m) for m in metadata]
    reward = ShapeWorldReward(grid=tuple(policy.layout.grid))
    result = task.evaluate(
        policy, reward, prompts, images_per_prompt, sampling, seed, None, progress, prompts_per_batch
    )
    return {**result, "cfg_scale": sampling.guidance_scale}
