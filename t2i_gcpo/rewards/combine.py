"""Combining rewards and calling user rewards, with every failure turned into a named `RewardError`.

- `call_reward`: call any reward, coerce its output to `RewardOutput` and check it: an exception
  inside the reward, a wrong number of scores, or a NaN/inf score raises `RewardError` naming the
  reward (a NaN reward would silently poison the group advantages of
  docs/concepts/algorithms.md#sequence-advantages).
- `WeightedSum([(reward, weight), …])`: r = Σ_k w_k r_k.
- `FunctionReward(fn)`: a Python callable (the API's ``reward=``), checked the same way.
- `CallableReward("module:function")`: a user function ``f(images, prompts, metadata)`` returning
  ``list[float] | Tensor | RewardOutput`` (``path/to/file.py:function`` works too).
- `Placed(reward, device, batch_size)`: a reward called `batch_size` images at a time, each batch moved to
  `device` first, the results put back in order (``reward_options.device`` / ``batch_size``, or a term's
  ``device=`` / ``batch_size=``: docs/guides/rewards.md#at-scale).
- `reward_terms(reward)`: the (name, weight) of each term of a weighted sum, wherever it is scored (a sum
  served by a reward server included): the per-reward advantages of GDPO read them.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from t2i_gcpo.errors import RewardError, UserError
from t2i_gcpo.rewards.base import Reward, RewardOutput
from t2i_gcpo.usercode import import_function


def reward_name(reward: Any) -> str:
    return str(getattr(reward, "name", None) or type(reward).__name__)


def as_reward_output(value: Any, n: int, name: str) -> RewardOutput:
    """RewardOutput from a RewardOutput, tensor, array or sequence of numbers; checks length and finiteness
    (of the terms too, where a sum gives them)."""
    terms, term_names = None, ()
    if isinstance(value, RewardOutput):
        scores, details = value.scores, list(value.details)
        terms, term_names = value.terms, value.term_names
    else:
        scores, details = value, []
    scores = _as_scores(scores, name, type(value).__name__)
    if scores.numel() == n:
        scores = scores.reshape(-1)  # accept [B, 1]
    if scores.dim() != 1 or scores.numel() != n:
        raise RewardError(f"reward '{name}' returned {tuple(scores.shape)} scores for {n} samples")
    bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
    if bad:
        raise RewardError(
            f"reward '{name}' returned NaN/inf for sample(s) {bad[:8]} (scores {scores[bad[:4]].tolist()})"
        )
    if terms is not None:
        terms = _as_scores(terms, name, "terms")
        if terms.shape != (n, len(term_names)) or not bool(torch.isfinite(terms).all()):
            raise RewardError(
                f"reward '{name}' returned terms {tuple(terms.shape)} for {n} samples and "
                f"{len(term_names)} term names, or NaN/inf among them"
            )
    if not details:
        details = [{} for _ in range(n)]
    if len(details) != n:
        raise RewardError(f"reward '{name}' returned {len(details)} detail entries for {n} samples")
    return RewardOutput(scores=scores, details=details, terms=terms, term_names=term_names)


def _as_scores(scores: Any, name: str, what: str) -> torch.Tensor:
    """`scores` (a tensor, array or sequence of numbers) as a float32 CPU tensor; RewardError otherwise."""
    if scores.is_complex() if torch.is_tensor(scores) else np.iscomplexobj(scores):  # .float() drops it
        raise RewardError(f"reward '{name}' returned complex scores, expected real numbers")
    try:
        if torch.is_tensor(scores):
            return scores.detach().float().cpu()
        return torch.as_tensor(np.asarray(scores, dtype=np.float64)).float()
    except (TypeError, ValueError) as e:
        raise RewardError(f"reward '{name}' returned {what}, not numbers ({e})") from None


def call_reward(reward: Any, images: Any, prompts: list[str], metadata: list[dict]) -> RewardOutput:
    """``reward(images, prompts, metadata)`` with failures raised as `RewardError` naming the reward."""
    name = reward_name(reward)
    try:
        out = reward(images, prompts, metadata)
    except RewardError:
        raise
    except Exception as e:
        raise RewardError(f"reward '{name}' failed: {type(e).__name__}: {e}") from e
    return as_reward_output(out, len(prompts), name)


class Checked:
    """Wraps a reward so every call goes through `call_reward` (same name)."""

    wraps_reward = True

    def __init__(self, reward: Reward):
        self.inner = reward
        self.name = reward_name(reward)

    def __call__(self, images: Any, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        return call_reward(self.inner, images, prompts, metadata)

    def check_prompts(self, prompts: list[str], metadata: list[dict]) -> None:
        check_prompts(self.inner, prompts, metadata)


class WeightedSum:
    """r_i = Σ_k w_k · r_k,i, with each part's own score r_k,i in the output's ``terms`` [B, K] under the
    part's name (a repeated name gets a ``#2`` suffix), and its details as ``{"name/key": value, …}``.
    """

    def __init__(self, parts: Sequence[tuple[Reward, float]]):
        if not parts:
            raise UserError("a weighted reward sum needs at least one term")
        self.parts = [(r, float(w)) for r, w in parts]
        for r, w in self.parts:
            if not math.isfinite(w):
                raise UserError(f"reward weight for '{reward_name(r)}' must be finite, got {w}")
        if all(w == 0 for _, w in self.parts):  # a constant reward: nothing to learn
            raise UserError("every term of the reward sum has weight 0: give a term a weight")
        self.names: list[str] = []
        for r, _ in self.parts:
            base, k = reward_name(r), 2
            name = base
            while name in self.names:
                name, k = f"{base}#{k}", k + 1
            self.names.append(name)
        self.name = "+".join(f"{w:g}*{n}" for (_, w), n in zip(self.parts, self.names))

    def __call__(self, images: Any, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        total = torch.zeros(len(prompts))
        details: list[dict] = [{} for _ in prompts]
        columns = []
        for (reward, weight), name in zip(self.parts, self.names):
            out = call_reward(reward, images, prompts, metadata)
            total += weight * out.scores
            columns.append(out.scores)
            for d, extra in zip(details, out.details):
                d.update({f"{name}/{k}": v for k, v in extra.items()})
        return RewardOutput(total, details, torch.stack(columns, dim=1), tuple(self.names))

    def check_prompts(self, prompts: list[str], metadata: list[dict]) -> None:
        for reward, _ in self.parts:
            check_prompts(reward, prompts, metadata)


class Placed:
    """A reward called on `device`, `batch_size` images at a time (None: where they are / all at once):
    each batch is moved there, scored through `call_reward`, and the scores and details are put back in
    the order of the samples. Its name, bounds and probe are the inner reward's."""

    wraps_reward = True

    def __init__(self, reward: Any, device: str | None = None, batch_size: int | None = None):
        self.inner, self.device, self.batch_size = reward, device, batch_size
        self.name = reward_name(reward)
        for attr in ("bounds", "probe"):
            if hasattr(reward, attr):
                setattr(self, attr, getattr(reward, attr))

    def __call__(self, images: Any, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        n = len(prompts)
        size = self.batch_size or max(n, 1)
        outputs = []
        for start in range(0, n, size):
            part = slice(start, min(start + size, n))
            batch = images[part]
            if self.device is not None and torch.is_tensor(batch):
                batch = batch.to(self.device, non_blocking=True)
            outputs.append(call_reward(self.inner, batch, prompts[part], metadata[part] if metadata else []))
        if not outputs:
            return call_reward(self.inner, images, prompts, metadata)
        return RewardOutput.concat(outputs)

    def check_prompts(self, prompts: list[str], metadata: list[dict]) -> None:
        check_prompts(self.inner, prompts, metadata)


def _inner(reward: Any) -> Any:
    """The reward a wrapper (`Checked`, `Placed`, the registry's `Named`: ``wraps_reward``) holds; None for
    any other."""
    return reward.inner if getattr(type(reward), "wraps_reward", False) else None


def reward_terms(reward: Any) -> list[tuple[str, float]] | None:
    """(name, weight) of each term of `reward` when it is a weighted sum — built here or served by a
    reward server (its ``terms``) — in the order of its outputs' ``terms`` columns; None for a single
    reward."""
    inner = _inner(reward)
    if inner is not None:
        return reward_terms(inner)
    if isinstance(reward, WeightedSum):
        return [(name, w) for name, (_, w) in zip(reward.names, reward.parts)]
    terms = getattr(reward, "terms", None)
    return [(str(n), float(w)) for n, w in terms] if terms else None


def requests_in_flight(reward: Any) -> int:
    """How many calls of `reward` may run at once (its ``in_flight``: a reward server's client takes several;
    1 for any other, and a sum's least): the overlapped scorer's threads (train/scoring.py)."""
    inner = _inner(reward)
    if inner is not None:
        return requests_in_flight(inner)
    if isinstance(reward, WeightedSum):
        return min(requests_in_flight(r) for r, _ in reward.parts)
    return max(1, int(getattr(reward, "in_flight", 1)))


def check_prompts(reward: Any, prompts: list[str], metadata: list[dict]) -> None:
    """A `UserError` if `reward` cannot score these prompts whatever the samples (e.g. the arithmetic
    reward needs each question's answer), through the reward's optional ``check_prompts`` method:
    before a run, not at its first step."""
    check = getattr(reward, "check_prompts", None)
    if check is not None:
        check(prompts, metadata)


def reward_bounds(reward: Any) -> tuple[float, float] | None:
    """The range [low, high] every score of `reward` lies in, where it declares one (its ``bounds``);
    a weighted sum's from its parts'; None where any part's is unknown (a user function, CLIPScore). The
    run report clips the reward's ± std band to it."""
    if _inner(reward) is not None:
        return reward_bounds(_inner(reward))
    if isinstance(reward, WeightedSum):
        parts = [(reward_bounds(r), w) for r, w in reward.parts]
        if any(b is None for b, _ in parts):
            return None
        return (
            sum(min(w * b[0], w * b[1]) for b, w in parts),
            sum(max(w * b[0], w * b[1]) for b, w in parts),
        )
    bounds = getattr(reward, "bounds", None)
    return (float(bounds[0]), float(bounds[1])) if bounds is not None else None


def probes(reward: Any) -> bool:
    """Whether `reward` (alone or a part of a sum) asks to score a dry sample before a run starts
    (its ``probe``: a judge behind a server that may be down, stalled or answering garbage)."""
    if _inner(reward) is not None:
        return probes(_inner(reward))
    if isinstance(reward, WeightedSum):
        return any(probes(r) for r, _ in reward.parts)
    return bool(getattr(reward, "probe", False))


def runs_user_code(reward: Any) -> bool:
    """Whether `reward` calls a user function (``module:function`` or an API callable), alone or in a sum."""
    if _inner(reward) is not None:
        return runs_user_code(_inner(reward))
    if isinstance(reward, WeightedSum):
        return any(runs_user_code(r) for r, _ in reward.parts)
    return isinstance(reward, FunctionReward)  # CallableReward is one


class FunctionReward:
    """A user function ``f(images, prompts, metadata)`` as a reward (the Python API's reward callables).

    Called with images [B, 3, H, W] in [0, 1] (or B strings for a text model), the B prompts and their
    B metadata dicts; returns ``list[float] | Tensor [B] | RewardOutput``. An exception, NaN/inf or a
    wrong number of scores raises `RewardError` naming the reward (`name`, default the function's)."""

    def __init__(self, fn: Any, name: str | None = None, origin: str | None = None):
        if not callable(fn):
            raise UserError(f"a reward must be callable, got {type(fn).__name__}")
        try:  # the arity, checked now rather than at the first step
            inspect.signature(fn).bind(None, None, None)
        except TypeError as e:
            raise UserError(
                f"reward function {_fn_name(fn)} must take (images, prompts, metadata): {e}"
            ) from None
        except ValueError:  # no signature to read (some builtins): checked when called
            pass
        self.fn = fn
        self.name = name or _fn_name(fn)
        self.origin = origin  # where it came from, shown in errors ("module:function")

    def __call__(self, images: Any, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        where = f" ({self.origin})" if self.origin else ""
        try:
            out = self.fn(images, prompts, metadata)
        except Exception as e:
            raise RewardError(f"reward '{self.name}'{where} failed: {type(e).__name__}: {e}") from e
        return as_reward_output(out, len(prompts), self.name)


def _fn_name(fn: Any) -> str:
    return str(getattr(fn, "name", None) or getattr(fn, "__name__", None) or type(fn).__name__)


class CallableReward(FunctionReward):
    """A user reward given as ``module:function`` (or ``path/to/file.py:function``): see
    `FunctionReward`; its name is the function name."""

    def __init__(self, spec: str):
        fn = import_function(spec, "reward")
        super().__init__(fn, name=spec.rpartition(":")[2], origin=spec)
        self.spec = spec


__all__ = [
    "RewardError",
    "Checked",
    "WeightedSum",
    "Placed",
    "FunctionReward",
    "CallableReward",
    "call_reward",
    "as_reward_output",
    "check_prompts",
    "probes",
    "runs_user_code",
    "reward_terms",
    "requests_in_flight",
]
