"""The `Task` protocol: everything train/ needs to know about a kind of prompt, and nothing more."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from t2i_gcpo.policies.base import Policy, PromptRecord, Rollout, SamplingParams
from t2i_gcpo.rewards.base import Reward

if TYPE_CHECKING:
    from t2i_gcpo.viz.text_heatmap import TextSample


def shipped_file(path: str | None) -> str | None:
    """`path` where that file exists (a task's shipped prompt file), else None."""
    return path if path and Path(path).is_file() else None


class Task(Protocol):
    name: str
    default_reward: str | None  # reward spec used when the config names none (None: one must be given)
    # whether its samples are text with per-token marks: `text_samples` and `sample_lifts` work (token
    # heatmaps, `credit-map` for text); False: they raise ValueError
    lays_out_text: bool

    def bind(self, policy: Policy) -> None:
        """Learn what the task needs of the policy it scores (arithmetic: the tokenizer that maps a
        reward's text spans to tokens); a no-op for most tasks."""

    def load_prompts(self, path: str | Path) -> list[PromptRecord]:
        """Read a prompt file; a one-line UserError for anything this task cannot take."""

    def parse(self, text: str) -> PromptRecord:
        """One prompt typed by a user."""

    def default_eval_prompts(self) -> str | None:
        """The held-out prompt file scored during training when the config names none."""

    def default_train_prompts(self) -> str | None:
        """The shipped training prompt file of the task's world (`compare` and the gradient-signal
        benchmark default to it), None where the repository ships none."""

    def step_metrics(self, details: list[dict]) -> dict[str, float]:
        """Metrics of one step's samples from the reward's per-sample details (e.g. strict score per tag)."""

    def credit_metrics(
        self, weights: torch.Tensor, rollout: Rollout, details: list[dict]
    ) -> dict[str, float]:
        """Metrics of the credit weights [B, T] against what the task knows (e.g. credit lift)."""

    def sample_lifts(self, weights: torch.Tensor, rollout: Rollout, details: list[dict]) -> np.ndarray:
        """Per-sample credit lift [B] of weights [B, T] (NaN where undefined); `lays_out_text` tasks."""

    def text_samples(
        self,
        rollout: Rollout,
        weights: dict[str, torch.Tensor],
        details: list[dict],
        scores: Any = None,
        advantages: Any = None,
    ) -> list[TextSample]:
        """Token heatmap samples of a scored text rollout under each scheme's weights; `lays_out_text`
        tasks."""

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
        """Held-out score; the result's "metrics" are logged, its "headline" printed. A prompt's
        samples must not depend on `prompts_per_batch` or the number of processes. Optionally "rows", one
        per sample (`loop.item_rows`: "key" — prompt and sample index, `loop.item_keys` —, "category",
        "score"), and "aggregate" ("categories": the headline is the mean of the category means; "items":
        the mean over every row): the trainer then writes them to eval/step_NNNNNN.jsonl and logs each
        category's paired change from step 0 (eval/records/paired.py)."""
