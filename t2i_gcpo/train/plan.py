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
- the cost: the samples a step decodes and scores (train/draws.step_draws, the counts the collector then
  charges its draws against), bounded by ``rollout.max_step_samples``; once the prompts are read, the memory
  the step holds (train/draws.step_memory, from a profile measured on the model), bounded by
  ``rollout.max_step_memory`` (null: the memory this process has free at the start: `plan_memory`).

Any failure is one `UserError` line; nothing has been written."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from t2i_gcpo.errors import UserError
from t2i_gcpo.train.draws import MemoryEstimate, StepDraws, decision_steps_of, decisions, step_draws

if TYPE_CHECKING:
    from t2i_gcpo.config import TrainConfig
    from t2i_gcpo.policies.base import Policy, PromptRecord


@dataclass(frozen=True)
class Plan:
    """What a checked run will do: its trackers (each checked to start), what a step draws and the memory it
    holds (train/draws.py)."""

    trackers: list[str]
    cost: StepDraws | None  # None: a count the model's samples do not fix (a text model of no set length)
    memory: MemoryEstimate | None = None  # set once the run's prompts are read (`plan_memory`)


def plan_config(cfg: TrainConfig, trackers: list[str] | None = None) -> list[str]:
    """What the plan decides before any model is loaded (a refusal then takes a fraction of a second): the
    trackers `report_to` resolves to, each checked to start ('all' included), and a step's cost where the
    config alone fixes it (everything but the decision steps of branching and stepwise schemes). Returns the
    trackers; `trackers` given: already checked (compare's arms share them)."""
    from t2i_gcpo.train.tracking import resolve_report_to

    if trackers is None:
        trackers = resolve_report_to(cfg.report_to)
    check_reward_norm(cfg)
    cost = step_draws(cfg, None)
    if cost is not None:
        check_cost(cfg, cost)
    return trackers


def check_reward_norm(cfg: TrainConfig) -> None:
    """GDPO (advantage.reward_norm=per_reward) with a scheme of the user's that reads the rewards (its needs
    name rewards, branches, leaves or step_rewards): refused. The shipped schemes then read GDPO's decoupled
    rewards r̂ (docs/concepts/algorithms.md#gdpo-and-credit-schemes), normalised per reward — values whose
    meaning a scheme must be written for; whether a user's is cannot be known."""
    from t2i_gcpo.core.schemes import CREDIT_SCHEMES, REWARD_NEEDS, get_scheme

    scheme = cfg.credit.scheme
    if cfg.advantage.reward_norm != "per_reward" or scheme in CREDIT_SCHEMES:
        return
    reads = sorted(get_scheme(scheme).needs & REWARD_NEEDS)
    if reads:
        raise UserError(
            f"config key 'advantage.reward_norm': per_reward (GDPO) would hand credit scheme "
            f"'{scheme}', which reads {', '.join(reads)}, each reward normalised within its group instead of "
            f"the rewards it was written for: use advantage.reward_norm=sum with it, or a shipped scheme"
        )


def plan_run(cfg: TrainConfig, policy: Policy, trackers: list[str] | None = None) -> Plan:
    """The whole plan of a run of `cfg` on `policy` checked (see the module docstring; `plan_config`, then
    what needs the model); a one-line UserError for the first problem."""
    trackers = plan_config(cfg, trackers)
    cost = step_draws(cfg, policy)
    check_model(cfg, policy, cost)
    return Plan(trackers, cost)


def check_model(cfg: TrainConfig, policy: Policy, cost: StepDraws | None) -> None:
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
            f"config key 'branching.rule': boundary branches where a task's line or row starts, which "
            f"needs a model that decides its tokens in order (AR images, text); this {type(policy).__name__} "
            f"reveals them in steps: use every_k or entropy"
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
            f"decision steps (the first is the prompt's), so k must be below {steps}, got "
            f"{cfg.branching.k}{hint}"
        )


def check_cost(cfg: TrainConfig, cost: StepDraws) -> None:
    """A step that would decode and score more than ``rollout.max_step_samples`` samples is refused,
    naming the product and the cap (a typo's 64 × 64 fills the machine's memory and is killed)."""
    cap = cfg.rollout.max_step_samples
    if cost.samples <= cap:
        return
    what = "a step of each process" if int(os.environ.get("WORLD_SIZE", 1)) > 1 else "a step"
    raise UserError(
        f"{what} would decode and score {cost.formula} = {cost.samples:,} samples, "
        f"more than config key 'rollout.max_step_samples' = {cap:,}: lower those counts, or raise "
        f"rollout.max_step_samples if the machine holds it"
    )


def plan_memory(cfg: TrainConfig, policy: Policy, plan: Plan, prompt: PromptRecord) -> Plan:
    """The plan with the memory a step holds, estimated by the memory model measured on `policy` from the
    run's first prompt (train/draws.py), and checked against ``rollout.max_step_memory`` (null: the memory
    this process has free now); a one-line UserError naming the product, the estimate and the setting."""
    from t2i_gcpo.hardware import free_memory, local_device
    from t2i_gcpo.train.draws import check_memory, measure_profile, step_memory

    if plan.cost is None:  # a count the samples decide (text of no set length): nothing to estimate
        return plan
    estimate = step_memory(cfg, plan.cost, measure_profile(cfg, policy, prompt))
    device = local_device()
    free, source = free_memory(device)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if free is not None and local > 1 and not device.startswith("cuda"):  # the machine's memory is shared
        free, source = free / local, f"{source}, shared by this machine's {local} processes"
    check_memory(cfg, plan.cost, estimate, (free, source))
    return dataclasses.replace(plan, memory=estimate)
