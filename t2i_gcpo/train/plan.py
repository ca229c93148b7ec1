"""The plan of a run, checked whole before anything is written (docs/errors.md#the-plan).

A run's config is checked field by field and across fields when it is built (`TrainConfig.validate`:
types, ranges, the scheme against the loss and the branching rule, the allocation's budget). What needs the
model, the machine or the world outside is checked here, once the model is loaded and before the run
directory, its config.yaml or any training exists — by `train` (a new run, and `--resume` with its `--steps`
applied) and by `compare` for every arm before its first run:

- the trackers: each one `report_to` resolves to (``all`` included) must start (`tracking.resolve_report_to`);
- the decode loop: `rollout.decode` on this machine (policies/decode_loop.resolve_mode: ``graph`` needs CUDA);
- the scheme against the model: what it needs the family can give (`credit.check_capabilities`), its branch
  points exist in the model's samples (``boundary`` needs tokens decided in order; ``every_k``'s spacing, tree
  groups' ``k`` below the samples' decision steps);
- the cost: the samples a step decodes and scores (`step_cost`), bounded by ``rollout.max_step_samples``.

Any failure is one `UserError` line; nothing has been written."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from t2i_gcpo.errors import UserError

if TYPE_CHECKING:
    from t2i_gcpo.config import TrainConfig
    from t2i_gcpo.policies.base import Policy

# the memory a step's samples take, per sampled token: what the 64 × 64 tree run (131,104 samples of 64
# tokens a step on ShapeWorld-32 AR) held when the kernel killed it, 20.5 GB; a larger model holds more
BYTES_PER_TOKEN = 2_400


@dataclass(frozen=True)
class Plan:
    """What a checked run will do: its trackers (each checked to start) and the cost of a step."""

    trackers: list[str]
    cost: StepCost | None  # None: a count the model's samples do not fix (a text model of no set length)


@dataclass(frozen=True)
class StepCost:
    """The samples one process decodes and scores in one step, at most: `groups` groups drawn (P, or the
    dynamic-sampling draw budget ⌊draw_budget·P⌋) × `per_group` samples each, as the `formula` says."""

    groups: int
    per_group: int
    formula: str  # e.g. "P·G₀·(1 + k·n) = 8·4·(1 + 2·2)"
    tokens: int | None  # tokens each sample decides (its decision steps; text: its longest); None: unknown

    @property
    def samples(self) -> int:
        return self.groups * self.per_group

    @property
    def memory_gb(self) -> float | None:
        """An estimate of the memory the step's samples take (`BYTES_PER_TOKEN` per sampled token); None
        before the model says how many tokens a sample decides."""
        return None if self.tokens is None else self.samples * self.tokens * BYTES_PER_TOKEN / 1e9


def plan_config(cfg: TrainConfig, trackers: list[str] | None = None) -> list[str]:
    """What the plan decides before any model is loaded (a refusal then takes a fraction of a second): the
    trackers `report_to` resolves to, each checked to start ('all' included), and a step's cost where the
    config alone fixes it (everything but the decision steps of branching and stepwise schemes). Returns the
    trackers; `trackers` given: already checked (compare's arms share them)."""
    from t2i_gcpo.train.tracking import resolve_report_to

    if trackers is None:
        trackers = resolve_report_to(cfg.report_to)
    check_reward_norm(cfg)
    cost = step_cost(cfg, None)
    if cost is not None:
        check_cost(cfg, cost)
    return trackers


def check_reward_norm(cfg: TrainConfig) -> None:
    """GDPO (advantage.reward_norm=per_reward) with a scheme of the user's that reads the rewards (its needs name
    rewards, branches, leaves or step_rewards): refused. The shipped schemes then read GDPO's decoupled rewards
    r̂ (docs/concepts/algorithms.md#gdpo-and-credit-schemes), normalised per reward — values whose meaning a
    scheme must be written for; whether a user's is cannot be known."""
    from t2i_gcpo.core.schemes import CREDIT_SCHEMES, REWARD_NEEDS, get_scheme

    scheme = cfg.credit.scheme
    if cfg.advantage.reward_norm != "per_reward" or scheme in CREDIT_SCHEMES:
        return
    reads = sorted(get_scheme(scheme).needs & REWARD_NEEDS)
    if reads:
        raise UserError(
            f"config key 'advantage.reward_norm': per_reward (GDPO) would hand credit scheme '{scheme}', which "
            f"reads {', '.join(reads)}, each reward normalised within its group instead of the rewards it was "
            "written for: use advantage.reward_norm=sum with it, or a shipped scheme"
        )


def plan_run(cfg: TrainConfig, policy: Policy, trackers: list[str] | None = None) -> Plan:
    """The whole plan of a run of `cfg` on `policy` checked (see the module docstring; `plan_config`, then
    what needs the model); a one-line UserError for the first problem."""
    trackers = plan_config(cfg, trackers)
    cost = step_cost(cfg, policy)
    check_model(cfg, policy, cost)
    return Plan(trackers, cost)


def check_model(cfg: TrainConfig, policy: Policy, cost: StepCost | None) -> None:
    """The config against the loaded model and this machine: the decode loop, what the credit scheme
    needs, the step's `cost` against its cap, and where the scheme branches."""
    import torch

    from t2i_gcpo.core.schemes import get_scheme
    from t2i_gcpo.hardware import local_device
    from t2i_gcpo.policies.decode_loop import resolve_mode
    from t2i_gcpo.train.branches import check_spacing
    from t2i_gcpo.train.credit import check_capabilities

    if not policy.capabilities.reveal_order:  # the autoregressive samplers run the decode loop
        resolve_mode(cfg.rollout.decode, torch.device(local_device()), True)
    scheme = cfg.credit.scheme
    check_capabilities(scheme, policy)
    needs = get_scheme(scheme).needs
    sampling = decisions(cfg)
    if "branches" in needs and cfg.branching.rule == "boundary" and policy.capabilities.reveal_order:
        raise UserError(
            f"config key 'branching.rule': boundary branches where a task's line or row starts, which needs a "
            f"model that decides its tokens in order (AR images, text); this {type(policy).__name__} reveals "
            "them in steps: use every_k or entropy"
        )
    if cost is not None:  # before the branch points: a typo's 64 × 64 is named by what it costs
        check_cost(cfg, cost)
    if "branches" in needs:
        check_spacing(policy, cfg.branching, sampling)
    steps = decision_steps_of(policy, sampling)
    if "leaves" in needs and steps is not None and cfg.branching.k >= steps:
        hint = (
            f": e.g. --set branching.k={min(2, steps - 1)}" if steps > 1 else " (this model's cannot branch)"
        )
        raise UserError(
            f"config key 'branching.k': tree groups branch each sample at k distinct points of its {steps} "
            f"decision steps (the first is the prompt's), so k must be below {steps}, got {cfg.branching.k}{hint}"
        )


def step_cost(cfg: TrainConfig, policy: Policy | None) -> StepCost | None:
    """The samples one process decodes and scores in one step, at most (every sampled group, its
    allocation's extra draws, its continuations and the scored predictions of every reveal step); None
    without a `policy` where the count depends on its samples' decision steps."""
    from t2i_gcpo.core.schemes import get_scheme

    r, adv, br = cfg.rollout, cfg.advantage, cfg.branching
    P = r.prompts_per_step // max(1, int(os.environ.get("WORLD_SIZE", 1)))
    groups = int(adv.draw_budget * P) if adv.dynamic_sampling else P
    steps = decision_steps_of(policy, decisions(cfg)) if policy is not None else None  # torch: with a model
    needs = get_scheme(cfg.credit.scheme).needs
    if steps is None and needs & {"branches", "step_rewards"}:
        return None
    G, n = r.group_size, br.continuations
    g_name = "⌊draw_budget·P⌋" if adv.dynamic_sampling else "P"
    shown = f"{groups}" if groups == P or not adv.dynamic_sampling else f"⌊{adv.draw_budget:g}·{P}⌋"
    if "leaves" in needs:
        return StepCost(
            groups, G * (1 + br.k * n), f"{g_name}·G₀·(1 + k·n) = {shown}·{G}·(1 + {br.k}·{n})", steps
        )
    if "branches" in needs:
        points = branch_points(policy, br, steps)
        return StepCost(groups, G * (1 + points * n),
                        f"{g_name}·G·(1 + points·n) = {shown}·{G}·(1 + {points}·{n})", steps)  # fmt: skip
    if r.allocation == "pods":
        drawn = round(r.draw_factor * G)
        return StepCost(groups, drawn, f"{g_name}·draw_factor·G = {shown}·{drawn}", steps)
    if r.allocation == "knapsack":
        drawn = G + math.ceil((r.draw_factor - 1) * G - 1e-9)  # G, and (draw_factor − 1)·G more on average
        return StepCost(groups, drawn, f"{g_name}·draw_factor·G = {shown}·{drawn}", steps)
    if "step_rewards" in needs:  # every reveal step's prediction decoded and scored
        return StepCost(groups, G * steps, f"{g_name}·G·S = {shown}·{G}·{steps}", steps)
    return StepCost(groups, G, f"{g_name}·G = {shown}·{G}", steps)


def decision_steps_of(policy: Policy, sampling: Any) -> int | None:
    """train/branches.decision_steps_of (imported with its torch only once there is a model)."""
    from t2i_gcpo.train.branches import decision_steps_of as steps_of

    return steps_of(policy, sampling)


def decisions(cfg: TrainConfig) -> Any:
    """The sampling settings that decide how many steps a sample takes (masked steps, text length)."""
    from t2i_gcpo.policies.base import SamplingParams

    return SamplingParams(steps=cfg.rollout.steps, max_new_tokens=cfg.rollout.max_new_tokens)


def branch_points(policy: Policy, branching: Any, steps: int) -> int:
    """The most branch points a sample of `steps` decision steps gets under `branching.rule`."""
    if branching.rule == "every_k":
        return max(0, (steps - 1) // branching.k)
    if branching.rule == "boundary" and policy.layout.kind == "grid":
        return policy.layout.grid[0] - 1  # each token row but the first
    return max(0, min(branching.k, steps - 1)) if branching.rule == "entropy" else max(0, steps - 1)


def check_cost(cfg: TrainConfig, cost: StepCost) -> None:
    """A step that would decode and score more than ``rollout.max_step_samples`` samples is refused,
    naming the product and the cap (a typo's 64 × 64 fills the machine's memory and is killed)."""
    cap = cfg.rollout.max_step_samples
    if cost.samples <= cap:
        return
    what = "a step of each process" if int(os.environ.get("WORLD_SIZE", 1)) > 1 else "a step"
    memory = "" if cost.memory_gb is None else f" (≈ {cost.memory_gb:.1f} GB)"
    raise UserError(
        f"{what} would decode and score {cost.formula} = {cost.samples:,} samples{memory}, "
        f"more than config key 'rollout.max_step_samples' = {cap:,}: lower those counts, or raise "
        f"rollout.max_step_samples if the machine holds it"
    )
