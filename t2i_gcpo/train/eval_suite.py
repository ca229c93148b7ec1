"""A benchmark suite as a run's held-out evaluation (config ``eval_suite``;
docs/evaluation/judge-suites.md#during-training): the suite's prompts (``eval_suite_options.data``) are the
held-out prompts, sampled at every evaluation as the task's held-out loop samples them
(tasks/loop.held_out_rows: prompt i's images from its own generator (seed, "eval", i), the same at every
step), and scored by the suite exactly as ``t2i-gcpo eval geneval2|judge`` scores them (t2i_gcpo/eval/suites/)
— GenEval 2 by a VQA model or a judge's log-probabilities, the judge suites by one request per image.

`evaluate` returns what a task's ``evaluate`` returns — ``metrics`` (eval/<suite>/overall and
eval/<suite>/<category>), ``headline`` — plus ``rows``, one per image ({"key": "<prompt>/<image>", "category",
"score"}, the rows `t2i-gcpo eval` writes to results.jsonl) and the suite's ``summary``. A judge that stops
answering stops the run after its retries (a `RewardError`: the last checkpoint is kept, --resume continues).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from t2i_gcpo import metrics as M
from t2i_gcpo.config import TrainConfig
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import Policy, PromptRecord, SamplingParams
from t2i_gcpo.rewards.base import RewardOutput


def metric_name(category: str) -> str:
    """A category as a metric-name segment (letters, digits, _ . + -)."""
    return re.sub(r"[^\w.+-]+", "_", category).strip("_") or "_"


class SuiteScorer:
    """The suite behind the reward interface `held_out_rows` calls: (images, prompts, metadata) → one score
    per image, its row's fields as details (each sample's metadata names its prompt: ``suite_index``)."""

    def __init__(self, evaluation: SuiteEvaluation):
        self.evaluation = evaluation
        self.name = f"eval_suite:{evaluation.suite.name}"

    def __call__(self, images: Any, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        import torch

        from t2i_gcpo.rewards._common import images_to_pil

        ev, pil = self.evaluation, images_to_pil(images)
        entries = [
            (
                b,
                ev.items[m["suite_index"]].data if ev.suite.kind == "vqa" else ev.items[m["suite_index"]],
                [im],
            )
            for b, (m, im) in enumerate(zip(metadata, pil))
        ]
        opts = ev.options
        asking = dict(
            concurrency=opts.concurrency,
            retries=opts.retries,
            backoff=opts.backoff,
            progress=False,
            digest=lambda image: "",
        )
        if ev.suite.kind == "vqa":
            from t2i_gcpo.eval.suites.geneval2 import score_entries

            rows = score_entries(entries, ev.scorer, opts.method, **asking)
        else:
            from t2i_gcpo.eval.suites.driver import score_suite

            rows = score_suite(ev.suite, entries, ev.scorer, **asking)
        details = [{k: v for k, v in r.items() if k not in ("key", "category", "prompt")} for r in rows]
        return RewardOutput(
            scores=torch.tensor([r["score"] for r in rows], dtype=torch.float32), details=details
        )


class SuiteEvaluation:
    """The held-out evaluation by `cfg.eval_suite` (module docstring): its prompts and its
    scorer, loaded once."""

    def __init__(self, cfg: TrainConfig, device: str = "cpu"):
        from t2i_gcpo.eval.suites import get_suite

        self.suite, self.options = get_suite(cfg.eval_suite), cfg.eval_suite_options
        opts = self.options
        path = Path(opts.data).expanduser()
        if not path.exists():
            raise UserError(
                f"config key 'eval_suite_options.data': {path} does not exist ({self.suite.name} reads "
                f"{self.suite.data})"
            )
        self.items = self.suite.read(path)  # a wrong format: one line naming the file and the field
        if self.suite.kind == "vqa" and opts.vqa is not None:
            from t2i_gcpo.scoring.vlm import LocalVLM

            place = device if opts.device == "auto" else opts.device
            self.scorer = LocalVLM.from_pretrained(
                opts.vqa,
                device=place,
                dtype=opts.dtype,
                batch_size=opts.batch_size,
                what="config key 'eval_suite_options.vqa':",
            )
        else:
            import os

            from t2i_gcpo.eval.suites.judge_client import JudgeClient

            self.scorer = JudgeClient(
                opts.judge,
                model=opts.judge_model,
                timeout=opts.timeout,
                api_key=os.environ.get("OPENAI_API_KEY"),
            )
        self.prompts = [
            PromptRecord(it.prompt, meta={"suite_index": i, "id": it.id}) for i, it in enumerate(self.items)
        ]

    def probe(self, images: Any) -> None:
        """Score one image (the run's dry sample) as the suite's first prompt: a judge that is down, stalls or
        answers what the suite cannot read stops the run here, before its folder exists, in one line."""
        from t2i_gcpo.errors import RewardError

        try:
            SuiteScorer(self)(images[:1], [self.items[0].prompt], [{"suite_index": 0}])
        except UserError as e:
            raise RewardError(
                f"eval_suite {self.suite.name}: {e} (on a dry sample, before the run started)"
            ) from None

    def evaluate(
        self,
        policy: Policy,
        prompts: list[PromptRecord],
        samples_per_prompt: int,
        sampling: SamplingParams,
        seed: int,
        accelerator: Any = None,
        progress: bool = False,
    ) -> dict[str, Any]:
        """Sample `samples_per_prompt` images per prompt and score them by the suite (module docstring)."""
        from t2i_gcpo.stats import mean_ci95
        from t2i_gcpo.tasks.loop import Scored, held_out_rows

        def rows_of(chunk: list[int], scored: Scored) -> list[dict]:
            out, n = [], samples_per_prompt
            for j, (score, detail) in enumerate(zip(scored.reward.scores.tolist(), scored.reward.details)):
                i = chunk[j // n]
                out.append(
                    {
                        "key": f"{i:05d}/{j % n:04d}",
                        "category": self.items[i].category,
                        "score": float(score),
                        **{k: v for k, v in detail.items() if k != "score"},
                    }
                )
            return out

        rows = held_out_rows(
            policy,
            SuiteScorer(self),
            prompts,
            samples_per_prompt,
            sampling,
            seed,
            rows_of,
            accelerator,
            progress,
        )
        rows.sort(key=lambda r: r["key"])
        summary = self.suite.summarize(rows)
        name = self.suite.name
        by_prompt: dict[str, list[float]] = {}
        for r in rows:
            by_prompt.setdefault(r["key"].split("/")[0], []).append(r["score"])
        _, lo, hi, _ = mean_ci95(sum(v) / len(v) for v in by_prompt.values())
        metrics = {M.EVAL_SUITE.format(suite=name): float(summary["overall"])}
        metrics.update(
            {
                M.EVAL_SUITE_CATEGORY.format(suite=name, category=metric_name(c)): float(v)
                for c, v in summary["categories"].items()
            }
        )
        label = f" ({summary['label']})" if "label" in summary else ""
        return {
            "metrics": metrics,
            "headline": f"held-out {name}{label} {summary['overall']:.3f}",
            "rows": [{"key": r["key"], "category": r["category"], "score": r["score"]} for r in rows],
            "summary": {**summary, "mean_image_score_ci95": [lo, hi]},
        }
