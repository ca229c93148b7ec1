"""Free-text prompts scored by the reward alone (docs/guides/rewards.md#prompts-task): the task for
rewards that read a prompt's text rather than GenEval metadata — PickScore, HPS, the aesthetic
predictor, VQAScore, a VLM judge, and the OCR reward with its quoted phrases (the shipped
``text_rendering_train.txt`` / ``text_rendering_test.txt``). Chosen with ``--set task=prompts``.

Prompt files: ``.txt``, one prompt a line (blank lines and lines starting with "#" skipped), or ``.jsonl``,
one object a line with a "prompt" string and any other keys, handed to the reward as the prompt's
metadata. No default reward (give ``--reward``), no step metrics beyond the reward's own, no credit metric.
Held-out score: the mean reward over the held-out samples and its standard error over prompts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from t2i_gcpo import metrics as M
from t2i_gcpo.errors import UserError, shorten
from t2i_gcpo.policies.base import Policy, PromptRecord, Rollout, SamplingParams
from t2i_gcpo.rewards.base import Reward
from t2i_gcpo.tasks.base import shipped_file
from t2i_gcpo.tasks.loop import Scored, held_out_rows, item_keys, item_rows

if TYPE_CHECKING:
    import numpy as np
    import torch

    from t2i_gcpo.viz.text_heatmap import TextSample


PROMPT_ENDINGS = {".txt": "one prompt a line", ".jsonl": 'an object with a "prompt" a line'}


def read_prompts(path: str | Path) -> list[PromptRecord]:
    """The prompts of a .txt or .jsonl file (module docstring); a one-line UserError naming the file and
    line for anything else."""
    from t2i_gcpo.outdir import parse_json, read_lines
    from t2i_gcpo.resources import prompt_file

    path, lines = read_lines(prompt_file(path), "prompt file", PROMPT_ENDINGS)
    out = []
    for lineno, line in lines:
        if path.suffix == ".txt":
            out.append(PromptRecord(line.strip()))
            continue
        try:
            row = parse_json(line, "")  # malformed or nested too deeply: one line
        except UserError as e:
            raise UserError(f"{path}:{lineno}: {e}") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            raise UserError(
                f'{path}:{lineno}: expected an object with a non-empty "prompt", got {shorten(line)!r}'
            )
        out.append(PromptRecord(row["prompt"].strip(), meta=dict(row)))
    if not out:
        raise UserError(f"prompt file {path} holds no prompts")
    return out


@dataclass
class PromptsTask:
    name: str = "prompts"
    default_reward: str | None = None
    eval_file: str | None = None
    train_file: str | None = None
    lays_out_text: ClassVar[bool] = False

    def bind(self, policy: Policy) -> None:
        """Nothing to learn of the policy."""

    def load_prompts(self, path: str | Path) -> list[PromptRecord]:
        return read_prompts(path)

    def parse(self, text: str) -> PromptRecord:
        if not text.strip():
            raise UserError("empty prompt")
        return PromptRecord(text.strip())

    def default_eval_prompts(self) -> str | None:
        return shipped_file(self.eval_file)

    def default_train_prompts(self) -> str | None:
        return shipped_file(self.train_file)

    def step_metrics(self, details: list[dict]) -> dict[str, float]:
        return {}

    def credit_metrics(
        self, weights: torch.Tensor, rollout: Rollout, details: list[dict]
    ) -> dict[str, float]:
        return {}

    def sample_lifts(self, weights: torch.Tensor, rollout: Rollout, details: list[dict]) -> np.ndarray:
        raise ValueError(f"task '{self.name}' has no marked tokens to lift")

    def text_samples(
        self,
        rollout: Rollout,
        weights: dict[str, torch.Tensor],
        details: list[dict],
        scores: Any = None,
        advantages: Any = None,
    ) -> list[TextSample]:
        raise ValueError(f"task '{self.name}' has no text samples")

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
        """The mean reward of `samples_per_prompt` samples per held-out prompt, prompt i seeded by
        (seed, "eval", i) alone; ``{"reward", "reward_se", "samples", "metrics", "headline"}``."""

        def rows_of(chunk: list[int], scored: Scored) -> list[tuple[int, float]]:
            return [(chunk[b // samples_per_prompt], s) for b, s in enumerate(scored.reward.scores.tolist())]

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


def summarize(rows: list[tuple[int, float]]) -> dict[str, Any]:
    """Mean reward of (prompt index, reward) rows and its standard error over the prompts' means; "rows"
    the result rows each sample is paired by (`loop.item_rows`, one category "all")."""
    if not rows:
        raise UserError("held-out evaluation: no samples to score")
    by_prompt: dict[int, list[float]] = {}
    for p, s in rows:
        by_prompt.setdefault(p, []).append(s)
    means = [sum(v) / len(v) for v in by_prompt.values()]
    mean = sum(s for _, s in rows) / len(rows)
    n = len(means)
    se = math.sqrt(sum((m - sum(means) / n) ** 2 for m in means) / (n - 1) / n) if n > 1 else math.nan
    metrics = {M.EVAL_REWARD: mean}
    if math.isfinite(se):
        metrics[M.EVAL_REWARD_SE] = se
    items = item_rows(item_keys(p for p, _ in rows), ["all"] * len(rows), [s for _, s in rows])
    return {
        "reward": mean,
        "reward_se": se,
        "samples": len(rows),
        "metrics": metrics,
        "headline": f"held-out reward {mean:.4g}",
        "rows": items,
        "aggregate": "items",
    }
