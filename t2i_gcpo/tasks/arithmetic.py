"""The arithmetic task (docs/worlds/arithmetic.md): the text-reasoning path's prompts, reward,
metrics and held-out score.

Prompts are problem files (GSM8K-style .jsonl or .txt); step metrics are accuracy, format rate and
length; the credit metric is step lift, the share of credit on the first wrong step's tokens over their
share (docs/worlds/arithmetic.md#step-lift), with token offsets taken from decoding the sampled ids.
Held-out: pass@1, pass@k and format rate. Details: docs/worlds/arithmetic.md#task.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.metrics import (  # noqa: F401  (re-exported for callers of this task)
    ACCURACY,
    EVAL_ACCURACY,
    EVAL_ACCURACY_SE,
    EVAL_FORMAT_RATE,
    EVAL_LENGTH_MEAN,
    EVAL_PASS_K,
    FORMAT_RATE,
    LENGTH_MEAN,
    STEP_LIFT,
    STEP_LIFT_N,
)
from t2i_gcpo.policies.base import Policy, PromptRecord, Rollout, SamplingParams
from t2i_gcpo.resources import PROMPTS_DIR, prompt_file
from t2i_gcpo.rewards.base import Reward
from t2i_gcpo.rewards.forms.arithmetic import problem_meta
from t2i_gcpo.stats import proportions_se
from t2i_gcpo.tasks.base import shipped_file
from t2i_gcpo.tasks.loop import Scored, held_out_rows, item_keys, item_rows
from t2i_gcpo.viz.lift import credit_lift, mean_credit_lift

if TYPE_CHECKING:
    from t2i_gcpo.viz.text_heatmap import TextSample


# The shipped prompt files (`write_prompt_files`).
TRAIN_FILE, TEST_FILE = "arithmetic_train.jsonl", "arithmetic_test.jsonl"
N_TRAIN, N_TEST, SPLIT_SEED = 2000, 200, 0


def write_prompt_files(
    directory: str | Path = PROMPTS_DIR, n_train: int = N_TRAIN, n_test: int = N_TEST, seed: int = SPLIT_SEED
) -> tuple[Path, Path]:
    """Write `TRAIN_FILE` and `TEST_FILE` (GSM8K-style rows with worked solutions) into `directory`:
    `make_splits(n_train, n_test, seed)`, disjoint by question. The shipped files are
    ``write_prompt_files()`` (python -c "from t2i_gcpo.tasks.arithmetic import write_prompt_files as
    w; w()")."""
    from t2i_gcpo.worlds.arithmetic import make_splits, write_problems

    train, test = make_splits(n_train, n_test, seed)
    directory = Path(directory)
    write_problems(train, directory / TRAIN_FILE)
    write_problems(test, directory / TEST_FILE)
    return directory / TRAIN_FILE, directory / TEST_FILE


def _get(detail: dict, key: str) -> Any:
    """detail[key], or the value of "<reward name>/key" (a weighted sum of rewards prefixes them)."""
    if key in detail:
        return detail[key]
    return next((v for k, v in detail.items() if k.endswith("/" + key)), None)


# ---------------------------------------------------------------------------- token offsets


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def token_offsets(tokenizer: Any, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """(decoded completion, one (start, end) character span per token) for sampled ids, by decoding
    (module docstring): pieces when they concatenate to the text, else prefixes. Special tokens (and
    a byte that completes no character yet) get an empty span at their position."""
    text = tokenizer.batch_decode([ids], skip_special_tokens=True)[0]
    pieces = tokenizer.batch_decode([[t] for t in ids], skip_special_tokens=True)
    if "".join(pieces) == text:
        ends = np.cumsum([len(p) for p in pieces]).tolist()
    else:
        prefixes = tokenizer.batch_decode([ids[: k + 1] for k in range(len(ids))], skip_special_tokens=True)
        ends, prev = [], 0
        for p in prefixes:
            prev = max(prev, _common_prefix(p, text))
            ends.append(prev)
    starts = [0] + ends[:-1]
    return text, list(zip(starts, ends))


def step_token_indices(tokenizer: Any, ids: list[int], detail: dict) -> list[int] | None:
    """Indices into `ids` (a completion's valid tokens) of its first wrong step's tokens; None when
    undefined: correct, no span, the tokens do not decode to the scored completion, or no token."""
    span = _get(detail, "first_wrong_span")
    if _get(detail, "correct") or span is None or not ids:
        return None
    lo, hi = int(span[0]), int(span[1])
    text, offsets = token_offsets(tokenizer, ids)
    completion = _get(detail, "completion")
    if completion is not None and completion != text:
        return None  # another tokenizer's ids: refuse rather than guess
    if lo == hi:  # no answer line: the wrong decision was to stop — the special token(s) after the text
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        idx = [k for k, (t, (s, e)) in enumerate(zip(ids, offsets)) if t in special and s == e == len(text)]
        return idx if lo == len(text) and idx else None
    idx = [k for k, (s, e) in enumerate(offsets) if s < e and s < hi and e > lo]
    return idx or None


def first_wrong_step_mask(tokenizer: Any, rollout: Rollout, details: list[dict]) -> torch.Tensor:
    """[B, T] bool: the tokens of each failed sample's first wrong step (all False where undefined)."""
    mask = rollout.mask.detach().cpu() > 0  # [B, T]: the valid tokens, which decode to the completion
    out = torch.zeros_like(mask)
    tokens = rollout.tokens.detach().cpu()
    for i, d in enumerate(details):
        pos = mask[i].nonzero().flatten()  # positions of the valid tokens
        idx = step_token_indices(tokenizer, tokens[i, pos].tolist(), d)
        if idx:
            out[i, pos[idx]] = True
    return out


def step_lift(weights: torch.Tensor, rollout: Rollout, details: list[dict], tokenizer: Any) -> np.ndarray:
    """Step lift per sample, float64 [B]; nan where undefined (module docstring)."""
    if len(details) != len(rollout):
        raise UserError(f"step lift: {len(details)} reward details for {len(rollout)} samples")
    steps = first_wrong_step_mask(tokenizer, rollout, details)
    return credit_lift(weights, steps, rollout.loss_mask)  # over the tokens that can carry credit


def heatmap_samples(
    tokenizer: Any,
    rollout: Rollout,
    weights: dict[str, torch.Tensor],
    details: list[dict],
    scores: Any = None,
    advantages: Any = None,
) -> list[TextSample]:
    """`viz.text_heatmap.TextSample`s of a scored text rollout: each sample's valid tokens as text
    (special tokens by name), each scheme's weights [B, T] on them, the first wrong step outlined."""
    from t2i_gcpo.viz.text_heatmap import TextSample  # matplotlib: only when drawing

    mask = rollout.mask.detach().cpu() > 0  # the valid tokens: the completion as text
    tokens = rollout.tokens.detach().cpu()
    out = []
    for i in range(len(rollout)):
        pos = mask[i].nonzero().flatten()
        ids = tokens[i, pos].tolist()
        text, offsets = token_offsets(tokenizer, ids)
        pieces = [
            text[s:e] if e > s else tokenizer.convert_ids_to_tokens(t) for t, (s, e) in zip(ids, offsets)
        ]
        d = details[i] if details else {}
        answer, target = _get(d, "answer"), _get(d, "target")
        notes = [f"answer {answer} (target {target})"] if target is not None else []
        out.append(
            TextSample(
                tokens=pieces,
                weights={k: w[i].detach().float().cpu()[pos] for k, w in weights.items()},
                prompt=rollout.prompts[i].text,
                reward=None if scores is None else float(scores[i]),
                advantage=None if advantages is None else float(advantages[i]),
                highlight=step_token_indices(tokenizer, ids, d) or (),
                title=f"sample {i} (prompt {i // rollout.group_size}{_verdict(d)})",
                notes=notes,
            )
        )
    return out


def _verdict(detail: dict) -> str:
    correct = _get(detail, "correct")
    return "" if correct is None else ", correct" if correct else ", wrong"


# ---------------------------------------------------------------------------- the task


@dataclass
class ArithmeticTask:
    name: str = "arithmetic"
    default_reward: str | None = "arithmetic"
    eval_file: str | None = None  # default held-out problems
    train_file: str | None = None  # shipped training prompts
    tokenizer: Any = None  # the policy's tokenizer, for step lift (module docstring)
    _builtin: Any = field(default=None, init=False, repr=False)  # the world's, built on first need
    lays_out_text: ClassVar[bool] = True

    def bind(self, policy: Policy) -> None:
        """Read step lift's token spans with `policy`'s tokenizer."""
        self.tokenizer = policy.tokenizer

    def _tokenizer(self) -> Any:
        if self.tokenizer is not None:
            return self.tokenizer
        if self._builtin is None:  # the built-in model's; a mismatch is detected per sample
            from t2i_gcpo.worlds.arithmetic import build_tokenizer

            self._builtin = build_tokenizer()
        return self._builtin

    def sample_lifts(self, weights: torch.Tensor, rollout: Rollout, details: list[dict]) -> np.ndarray:
        """Step lift of every sample [B] (NaN where undefined: correct, or no first wrong step)."""
        return step_lift(weights, rollout, details, self._tokenizer())

    def text_samples(
        self,
        rollout: Rollout,
        weights: dict[str, torch.Tensor],
        details: list[dict],
        scores: Any = None,
        advantages: Any = None,
    ) -> list[TextSample]:
        """Token heatmap samples (`viz.text_heatmap.TextSample`) with the first wrong step outlined."""
        return heatmap_samples(self._tokenizer(), rollout, weights, details, scores, advantages)

    def load_prompts(self, path: str | Path) -> list[PromptRecord]:
        from t2i_gcpo.worlds.arithmetic import read_problem_file

        problems = read_problem_file(prompt_file(path))  # the user's file, else the shipped one it names
        return [PromptRecord(p.question, meta=problem_meta(p)) for p in problems]

    def parse(self, text: str) -> PromptRecord:
        """A typed question: an expression of this world ("12+7*3=?") gets its answer and steps;
        other text is free text without an answer (it can be sampled, not rewarded)."""
        from t2i_gcpo.worlds.arithmetic import Problem, parse_question

        if not text.strip():
            raise UserError("empty arithmetic question")
        problem = parse_question(text) or Problem(text.strip(), None)
        return PromptRecord(problem.question, meta=problem_meta(problem))

    def default_eval_prompts(self) -> str | None:
        return shipped_file(self.eval_file)

    def default_train_prompts(self) -> str | None:
        return shipped_file(self.train_file)

    def step_metrics(self, details: list[dict]) -> dict[str, float]:
        """Accuracy, format rate and mean length of the step's samples (those the reward reports)."""
        out = {}
        for name, key in ((ACCURACY, "correct"), (FORMAT_RATE, "format"), (LENGTH_MEAN, "length")):
            vals = [float(v) for v in (_get(d, key) for d in details) if v is not None]
            if vals:
                out[name] = sum(vals) / len(vals)
        return out

    def credit_metrics(
        self, weights: torch.Tensor, rollout: Rollout, details: list[dict]
    ) -> dict[str, float]:
        """Step lift of the credit weights [B, T] and how many failed samples define it."""
        lifts = step_lift(weights, rollout, details, self._tokenizer())
        lift = mean_credit_lift(lifts)
        if not math.isfinite(lift):
            return {}
        return {STEP_LIFT: lift, STEP_LIFT_N: float(np.isfinite(lifts).sum())}

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
        """Sample `samples_per_prompt` completions per prompt and score them; prompts are split across
        processes, prompt i seeded by (seed, "eval", i) alone. Correctness is the reward's "correct"
        detail (its score for a reward without one).

        Returns ``{"accuracy", "pass_at_k", "k", "format_rate", "length", "samples", "prompts",
        "metrics": {eval/… keys}, "headline": str}``.
        """
        if self.tokenizer is None:
            self.bind(policy)
        sampling = dataclasses.replace(sampling, score_negative=False)  # only the completions are scored

        def rows_of(chunk: list[int], scored: Scored) -> list[tuple[int, float, float, float]]:
            rows = []  # (prompt index, correct, format, length) per sample
            for b, (d, s) in enumerate(zip(scored.reward.details, scored.reward.scores.tolist())):
                correct, fmt, length = (_get(d, k) for k in ("correct", "format", "length"))
                rows.append(
                    (
                        chunk[b // samples_per_prompt],
                        float(s if correct is None else correct),
                        math.nan if fmt is None else float(fmt),
                        math.nan if length is None else float(length),
                    )
                )
            return rows

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
        return summarize(rows, samples_per_prompt)


def summarize(rows: list[tuple[int, float, float, float]], k: int) -> dict[str, Any]:
    """Held-out accuracy (pass@1 over samples), pass@k, format rate and mean length of
    (prompt index, correct, format, length) rows, one per sample; "rows" the result rows each sample is
    paired by (`loop.item_rows`: score its correctness, one category "all")."""
    if not rows:
        raise UserError("arithmetic evaluation: no samples to score")
    a = np.asarray(rows, dtype=np.float64)  # [N, 4]
    by_prompt: dict[int, float] = {}
    for p, c in zip(a[:, 0].astype(int).tolist(), a[:, 1].tolist()):
        by_prompt[p] = max(by_prompt.get(p, 0.0), float(c >= 1.0))
    acc = float(a[:, 1].mean())
    pass_k = sum(by_prompt.values()) / len(by_prompt)
    fmt = float(np.nanmean(a[:, 2])) if np.isfinite(a[:, 2]).any() else math.nan
    length = float(np.nanmean(a[:, 3])) if np.isfinite(a[:, 3]).any() else math.nan
    metrics = {EVAL_ACCURACY: acc, EVAL_ACCURACY_SE: proportions_se([(acc, len(rows))]), EVAL_PASS_K: pass_k}
    metrics.update(
        {k_: v for k_, v in ((EVAL_FORMAT_RATE, fmt), (EVAL_LENGTH_MEAN, length)) if math.isfinite(v)}
    )
    items = item_rows(item_keys(int(r[0]) for r in rows), ["all"] * len(rows), [float(r[1]) for r in rows])
    return {
        "accuracy": acc,
        "pass_at_k": pass_k,
        "k": k,
        "format_rate": fmt,
        "length": length,
        "samples": len(rows),
        "prompts": len(by_prompt),
        "metrics": metrics,
        "headline": f"held-out accuracy {acc:.3f} (pass@{k} {pass_k:.3f})",
        "rows": items,
        "aggregate": "items",
    }
