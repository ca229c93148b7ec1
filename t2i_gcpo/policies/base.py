"""What every generator adapter provides: the `Rollout` container and the `Policy` protocol.

One contract for the three families (autoregressive images, masked images, text). Adapters (ar.py,
janus.py, …) implement `Policy` without inheriting from each other. Each adapter is a
``torch.nn.Module`` whose ``forward`` is its differentiable ``logprobs`` (`LogprobsForward`), so
accelerate/DDP wrapping synchronises gradients (DDP only hooks ``__call__``/``forward``).

Contexts (the keys of `Rollout.logp`):
- ``pos``    — the prompt (c⁺; the conditional branch of CFG)
- ``neg``    — the negative context (c⁻): the CFG null branch for images, an empty or "answer
               wrongly" prompt for text; GCPO's contrast is pos against neg
- ``guided`` — the distribution that was sampled, when it combines pos and neg (CFG)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import torch

from t2i_gcpo.core.tree import Tree

# `Rollout.state` keys of stepwise credit (docs/concepts/tree_credit.md#stepwise-rewards): x̂_s [B, S, T] long,
# the canvas after reveal step s with every still-masked position filled by that step's sampled prediction
# (recorded by the masked samplers when `SamplingParams.record_predictions`), and r(x̂_s) [B, S]
# float (the train step)
STEP_PREDICTIONS = "step_predictions"
STEP_REWARDS = "step_rewards"
Context = Literal["pos", "neg", "guided"]
CONTEXTS: tuple[str, ...] = ("pos", "neg", "guided")
Output = Literal["image", "text"]
Decoded = torch.Tensor | list[str]  # what `Policy.decode` returns: images [B, 3, H, W] or B strings


@dataclass
class PromptRecord:
    """One prompt as the task knows it."""

    text: str  # what the model is conditioned on
    negative: str | None = None  # negative context; None = the adapter's own (null prompt, empty question)
    meta: dict[str, Any] = field(default_factory=dict)  # task metadata (GenEval include/exclude, answer, …)


@dataclass(frozen=True)
class SamplingParams:
    """How a rollout samples. Fields an adapter does not use are ignored by it."""

    temperature: float = 1.0  # T: every recorded log-prob is of softmax(ℓ/T)
    top_k: int = 0  # sample from the k most likely tokens only (0: off); log-probs stay untruncated
    top_p: float = 1.0  # nucleus sampling (1: off)
    guidance_scale: float = 1.0  # s in the adapter's guidance formula (1: the positive branch alone)
    guidance_schedule: str = "constant"  # how s varies over the steps (masked models)
    steps: int | None = None  # decoding steps (masked models); None = the adapter's default
    reveal_order: str | None = None  # masked models: "confidence" or "random"; None = the adapter's default
    max_new_tokens: int | None = None  # text: the length limit; None = the adapter's default
    # text without guidance: score the completions under c⁻ after sampling (one teacher-forced pass over
    # every token: a third of the rollout at batch 128); False where nothing reads logp["neg"]
    # (held-out evaluation, schemes without a contrast): the rollout then has no "neg" entry
    score_negative: bool = True
    # "bf16": sample under torch.autocast in bfloat16 (the matmuls and KV caches; the sample step and the
    # recorded log-probs stay float32). Faster only where the hardware has native bf16
    autocast: str = "none"
    # masked models: keep each reveal step's full prediction x̂_s in ``Rollout.state[STEP_PREDICTIONS]``
    # (stepwise credit, docs/concepts/tree_credit.md#stepwise-rewards); changes nothing else of the sample
    record_predictions: bool = False
    # the autoregressive decode loop (policies/decode_loop.py): "auto" (CUDA graphs on CUDA where the model
    # supports them, else the eager loop), "eager", "static", "graph" or "compile"; masked models ignore it
    decode: str = "auto"
    # keep the sampler's KV cache after the rollout, so continuations of its samples (`Policy.branch`) start
    # from it instead of a second prefill (families that cache; the train step asks when its scheme branches)
    keep_cache: bool = False


@dataclass
class Rollout:
    """A batch of sampled token sequences with what was recorded while sampling.

    B = samples (prompts × group size, prompt i's samples in rows i·G … i·G+G−1), T = tokens per
    sample (padded). Every per-sample field has B first; `select` and `concat` handle all of them.
    """

    tokens: torch.Tensor  # [B, T] long — image tokens (raster order) or text tokens
    mask: torch.Tensor  # [B, T] float — 1 for valid tokens, 0 for padding; nothing else
    step: torch.Tensor  # [B, T] long — the step that decided each token (AR / text: t; masked: reveal step)
    logp: dict[str, torch.Tensor]  # context → [B, T] log-prob of the sampled token at temperature T
    prompts: list[PromptRecord]  # [B]
    group_size: int  # G
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_len: int = 0  # the longest T the sampler can produce (Dr. GRPO's constant normaliser)
    state: dict[str, Any] = field(default_factory=dict)  # adapter state: tensors / lists with B first
    # [B, T] float — the valid tokens the log-prob estimator scores, where it scores fewer than `mask`
    # (the masked models' remask estimator); None: every valid token. Read through `loss_mask`
    scored: torch.Tensor | None = None

    PER_SAMPLE = ("tokens", "mask", "step", "logp", "prompts", "state", "scored")

    def __post_init__(self) -> None:
        if not self.max_len:
            self.max_len = int(self.tokens.shape[1])

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def texts(self) -> list[str]:
        return [p.text for p in self.prompts]

    @property
    def loss_mask(self) -> torch.Tensor:
        """[B, T]: the tokens whose log-probs mean something — what the loss, the credit weights and
        the log-prob metrics cover (`scored` where set, else `mask`). `mask` stays "valid token"."""
        return self.mask if self.scored is None else self.scored

    def select(self, index: torch.Tensor | Sequence[int]) -> Rollout:
        """Rows `index` of every per-sample field."""
        ids = torch.as_tensor(index, dtype=torch.long).flatten().tolist()
        b = len(self)
        changes = {name: _pick(getattr(self, name), ids, b) for name in self.PER_SAMPLE}
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device | str) -> Rollout:
        """The same rollout with every tensor on `device` (the trainer's metrics run on the CPU)."""
        changes = {name: _move(getattr(self, name), device) for name in self.PER_SAMPLE}
        return dataclasses.replace(self, **changes)

    @staticmethod
    def concat(rollouts: Sequence[Rollout]) -> Rollout:
        """Rows of every rollout, in order (tensors are right-padded to the longest T)."""
        if not rollouts:
            raise ValueError("nothing to concatenate")
        first = rollouts[0]
        if len(rollouts) == 1:
            return first
        if any(r.scored is not None for r in rollouts):  # every row's scored tokens, or all its valid ones
            rollouts = [
                r if r.scored is not None else dataclasses.replace(r, scored=r.mask) for r in rollouts
            ]
        changes = {name: _join([getattr(r, name) for r in rollouts]) for name in first.PER_SAMPLE}
        return dataclasses.replace(first, **changes, max_len=max(r.max_len for r in rollouts))


def _pick(value: Any, ids: list[int], b: int) -> Any:
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == b:
        return value[torch.as_tensor(ids, dtype=torch.long, device=value.device)]
    if isinstance(value, list) and len(value) == b:
        return [value[i] for i in ids]
    if isinstance(value, dict):
        return {k: _pick(v, ids, b) for k, v in value.items()}
    return value  # not per-sample (a scalar, a shared tensor)


def _move(value: Any, device: torch.device | str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _move(v, device) for k, v in value.items()}
    return value


def _join(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, torch.Tensor) and first.dim() > 0:
        if first.dim() >= 2 and len({v.shape[1] for v in values}) > 1:  # right-pad the token axis
            width = max(v.shape[1] for v in values)
            values = [
                torch.nn.functional.pad(v, (0, 0) * (v.dim() - 2) + (0, width - v.shape[1])) for v in values
            ]
        return torch.cat(values)
    if isinstance(first, list):
        return [x for v in values for x in v]
    if isinstance(first, dict):
        return {k: _join([v[k] for v in values]) for k in first if all(k in v for v in values)}
    return first


@dataclass(frozen=True)
class TokenLayout:
    """How the T tokens of a sample are arranged, for visualisations and grid-aware credit."""

    kind: Literal["grid", "sequence"]
    grid: tuple[int, int] | None = None  # (rows, cols) for an image's token grid

    @staticmethod
    def image(rows: int, cols: int) -> TokenLayout:
        return TokenLayout("grid", (rows, cols))


class TokenDists(Iterable):
    """An adapter's full next-token distributions, produced chunk by chunk and without gradient:
    iterating yields (token slice, temperature-scaled logits [B, t, V])."""

    def __iter__(self) -> Iterator[tuple[slice, torch.Tensor]]: ...


@dataclass
class Branches:
    """N continuations of a rollout: row j continues root row ``root[j]`` from step ``point[j]`` (the
    value in column ``slot[j]`` of the points it was asked for). Rows are ordered root by root, then by
    slot, then continuation; each (root, point)'s n rows are contiguous, so ``rollout.group_size = n``."""

    rollout: Rollout  # [N]: the root's prefix, then the continuation's draws
    root: torch.Tensor  # [N] long
    point: torch.Tensor  # [N] long
    slot: torch.Tensor  # [N] long
    n: int

    def tree(self, points: torch.Tensor, rewards: torch.Tensor) -> Tree:
        """The roots' `Tree` from the continuations' rewards [N]: the points [B, K] they were asked for,
        rewards [B, K, n] float64 (NaN where none) and exists [B, K, n] (core/tree.py)."""
        B, K = points.shape
        out = torch.full((B, K, self.n), float("nan"), dtype=torch.float64)
        exists = torch.zeros((B, K, self.n), dtype=torch.bool)
        c = torch.arange(len(self.root)) % self.n
        out[self.root, self.slot, c] = rewards.detach().double().cpu()
        exists[self.root, self.slot, c] = True
        return Tree(points.cpu(), out, exists)


@dataclass(frozen=True)
class PolicyCapabilities:
    """What a family can do beyond the common contract, declared rather than probed."""

    full_dists: bool = True  # `logprobs_and_dists` gives full next-token distributions (entropy, critical)
    # rollout.autocast='auto' samples under bf16 autocast where the hardware is native: only for
    # samplers checked to train as float32 does
    bf16_sampling: bool = False
    branching: bool = False  # `Policy.branch`: continuations from a sample's prefixes (tree credit)
    reveal_order: bool = False  # masked models: sampling takes a reveal order (`keep_reveal_order`)
    # masked models: `SamplingParams.record_predictions` records x̂_s, the full prediction of every reveal step
    step_predictions: bool = False


@runtime_checkable
class Policy(Protocol):
    """A generator adapter. Images are float tensors [B, 3, H, W] in [0, 1]; texts are strings.

    Every adapter is also a ``torch.nn.Module`` (parameters, ``train``/``eval``, ``to``, state dicts);
    its ``forward(rollout, context, dists=False)`` is `logprobs`, or `logprobs_and_dists` with
    ``dists=True``, so that a DDP/FSDP-wrapped policy is called as ``policy(rollout, context=…)``."""

    output: Output  # what `decode` returns
    layout: TokenLayout
    default_task: str  # the task its prompts belong to unless the config names one
    guidance: str  # its guidance formula, e.g. "u + s(c − u)"
    # the family's own tokenizer (a `PromptTokenizer`, a transformers tokenizer): tasks that map
    # reward spans of text to tokens read it (arithmetic's step lift)
    tokenizer: Any
    # the decode loop kept for the run (policies/decode_loop.DecodeSession) of a family that samples through
    # one: the trainer reads its captures and fallbacks. None for the others (masked families); a family that
    # does not declare it gets None (`MEMBER_DEFAULTS`)
    decode_session: Any

    @property
    def capabilities(self) -> PolicyCapabilities: ...

    @property
    def device(self) -> torch.device:
        """Where its trained weights live (rollouts run there)."""

    def default_sampling(self) -> SamplingParams:
        """The sampling settings this checkpoint recommends (e.g. its guidance scale)."""

    def check_prompts(self, prompts: list[str]) -> None:
        """Raise UserError naming any words (or inputs) this model cannot take."""

    def rollout(
        self,
        prompts: Sequence[PromptRecord],
        group_size: int,
        sampling: SamplingParams,
        generators: Sequence[torch.Generator],
    ) -> Rollout:
        """Sample `group_size` outputs per prompt. `generators[i]` drives prompt i's group alone, so a
        sample does not depend on its batch-mates, the batch size or the number of processes."""

    def logprobs(self, rollout: Rollout, context: Context = "pos") -> torch.Tensor:
        """Teacher-forced log-probs [B, T] of `rollout.tokens` under `context`, with gradient, computed
        in chunks over T (0 outside `rollout.loss_mask`)."""

    def logprobs_and_dists(
        self, rollout: Rollout, context: Context = "pos"
    ) -> tuple[torch.Tensor, TokenDists]:
        """`logprobs` and the same forward's full distributions, recomputed chunk by chunk without
        gradient when iterated (where `capabilities.full_dists`)."""

    def token_features(self, rollout: Rollout) -> torch.Tensor:
        """Per-token embeddings [B, T, D] (the VQ code vectors for images), for STAGE / critical."""

    def decode(self, rollout: Rollout) -> Decoded:
        """Images [B, 3, H, W] in [0, 1] (output "image") or a list of B strings (output "text")."""

    def branch(
        self, rollout: Rollout, points: torch.Tensor, n: int, generators: Sequence[torch.Generator]
    ) -> Branches:
        """`n` continuations of every row of `rollout` from each of its branch points (points [B, K] long,
        −1 padding; one generator per continuation, keyed by policies/branching.continuation_keys): where
        `capabilities.branching` (each adapter's own sampling from a prefix, laid out by
        policies/branching.branched); others raise TypeError. A continuation fed the root's own uniforms from
        step t reproduces the root (docs/concepts/tree_credit.md#branched-rollouts)."""

    def keep_reveal_order(self, order: str) -> None:
        """Make `order` the default reveal order, saved with the model (where
        `capabilities.reveal_order`; others raise ValueError)."""

    def keep_full_precision(self) -> None:
        """Save later checkpoints without rounding the weights (a run's checkpoints must be lossless
        for an exact resume); a no-op for families that save in the weights' own dtype."""

    def save_pretrained(self, path: str) -> None: ...


class LogprobsForward:
    """The ``forward`` every family's ``nn.Module`` has (listed before ``nn.Module`` among its bases):
    `logprobs`, or with ``dists`` `logprobs_and_dists` — what a DDP/FSDP-wrapped policy calls, as
    ``policy(rollout, context=…)`` (DDP hooks only ``__call__``/``forward``)."""

    def forward(
        self, rollout: Rollout, context: Context = "pos", dists: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, TokenDists]:
        return self.logprobs_and_dists(rollout, context) if dists else self.logprobs(rollout, context)


# the members a family may leave out, and the value the trainer reads for them then (`with_member_defaults`)
MEMBER_DEFAULTS: dict[str, Any] = {"decode_session": None}


def policy_members() -> list[str]:
    """The members every `Policy` declares (attributes and methods), in declaration order."""
    names = list(getattr(Policy, "__annotations__", {}))
    names += [
        n
        for n, v in vars(Policy).items()
        if not n.startswith("_") and (callable(v) or isinstance(v, property))
    ]
    return list(dict.fromkeys(names))


def missing_members(obj: Any) -> list[str]:
    """The members of `Policy` that `obj` lacks and that have no default (`MEMBER_DEFAULTS`)."""
    return [m for m in policy_members() if m not in MEMBER_DEFAULTS and not hasattr(obj, m)]


def with_member_defaults(policy: Any) -> Any:
    """`policy` with each member it does not declare set to its default (`MEMBER_DEFAULTS`), so that callers
    read every member of the protocol directly."""
    for name, default in MEMBER_DEFAULTS.items():
        if not hasattr(policy, name):
            setattr(policy, name, default)
    return policy
