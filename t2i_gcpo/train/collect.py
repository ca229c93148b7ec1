"""One step's training groups: rollout → decode → reward → group advantages, round by round, until
this process holds P groups with signal (docs/concepts/algorithms.md#sequence-advantages, "Dynamic
sampling").

With `advantage.dynamic_sampling`, groups whose rewards are all equal are dropped and further rounds
draw more; a round over-samples by the running share of groups without signal r̂, a step draws at
most `draw_budget`·P groups, and groups with signal beyond P are carried into the next step. The
collector's state (the carried groups and r̂) is what a checkpoint saves for it (`state_dict`).

Prompt slots are pure functions of (seed, step, round, process): resume and the paired-seed
comparison of runs depend on them (`prompts_for`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from t2i_gcpo import metrics as M
from t2i_gcpo.config import TrainConfig
from t2i_gcpo.core.advantages import decoupled_rewards, dynamic_sampling_filter
from t2i_gcpo.core.allocation import allocate, max_variance_subset, success_estimate
from t2i_gcpo.core.schemes import REWARD_NEEDS, get_scheme
from t2i_gcpo.core.tree import Tree
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import STEP_PREDICTIONS, STEP_REWARDS, PromptRecord, Rollout, SamplingParams
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.combine import reward_terms
from t2i_gcpo.tasks.loop import Scored, group_generators
from t2i_gcpo.train.batch import Batch
from t2i_gcpo.train.branches import grow, grow_leaves, per_term_scores
from t2i_gcpo.train.credit import (
    CREDIT_REWARDS,
    TRAIN_CONTEXT,
    needs_step_rewards,
    score_step_predictions,
)
from t2i_gcpo.train.data import PromptStream
from t2i_gcpo.train.draws import Ledger, StepDraws, step_draws
from t2i_gcpo.train.scoring import round_scorer, sequence_advantages, term_metrics


@dataclass
class Collected:
    """What one process drew in one step."""

    batch: Batch | None  # ≤ P groups with signal, the carried-over ones first; None: none had signal
    carried: int  # groups at the head of `batch` carried over from the previous step (older weights)
    last_round: Batch  # every group of the step's last round, with or without signal
    scores: torch.Tensor  # [n] the score of every sample drawn this step
    details: list[dict] = field(default_factory=list)  # their per-sample reward details
    groups_drawn: int = 0
    groups_without_signal: int = 0
    seconds: dict[str, float] = field(default_factory=dict)  # time/rollout, time/reward
    budget: dict[str, float] = field(default_factory=dict)  # this step's budget/* counts
    budget_total: dict[str, float] = field(default_factory=dict)  # the same, summed over the run so far
    # a weighted sum's per-term metrics (train/scoring.py term_metrics)
    terms: dict[str, float] = field(default_factory=dict)
    decode_fallbacks: int | None = None  # failed decode-step captures this step; None where nothing captures

    def stand_in(self) -> Batch:
        """One group of the last round with zero advantages: a process whose groups all lacked signal
        trains on it with a zero loss, to join the other processes' gradient all-reduce."""
        last = self.last_round
        G = last.rollout.group_size
        return Batch(
            last.rollout, torch.zeros(len(last.advantages)), last.reward, last.outputs, last.tree
        ).select(torch.arange(G))

    def metrics(self) -> dict[str, float]:
        scores = self.scores
        return {
            M.REWARD_MEAN: scores.mean().item(),
            M.REWARD_STD: scores.std().item() if len(scores) > 1 else 0.0,
            M.ZERO_STD_RATIO: self.groups_without_signal / max(self.groups_drawn, 1),
            M.GROUPS_KEPT: groups_in([self.batch]) if self.batch is not None else 0,
            M.GROUPS_DRAWN: self.groups_drawn,
            M.GROUPS_CARRIED: self.carried,
            **self.budget,
            **{M.BUDGET_TOTAL.format(key=k): v for k, v in self.budget_total.items()},
            **self.terms,
            **({M.DECODE_FALLBACK: self.decode_fallbacks} if self.decode_fallbacks is not None else {}),
        }


@dataclass
class Tally:
    """What one step has drawn so far: the rewards of its samples, groups, seconds and budget/* counts."""

    rewards: list[RewardOutput] = field(default_factory=list)  # every sample's scores, terms and details
    drawn: int = 0
    without_signal: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: {M.TIME_ROLLOUT: 0.0, M.TIME_REWARD: 0.0})
    spent: dict[str, float] = field(default_factory=lambda: dict.fromkeys(M.BUDGET, 0.0))
    term_advantages: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # GDPO: each round's w_k A_k

    def add_step_predictions(self, seconds: float, predictions: int, calls: int) -> None:
        """Intermediate predictions decoded and scored (stepwise credit) in `calls` reward calls: reward time
        and calls, nothing sampled."""
        self.seconds[M.TIME_REWARD] += seconds
        self.spent[M.BUDGET_STEP_PREDICTIONS] += predictions
        self.spent[M.BUDGET_REWARD_CALLS] += calls

    def add(self, seconds: dict[str, float], samples: int, tokens: float) -> None:
        """Samples sampled and scored in one reward call (none: no call), the tokens they sampled, and the
        seconds it took."""
        self.seconds[M.TIME_ROLLOUT] += seconds["rollout"]
        self.seconds[M.TIME_REWARD] += seconds["reward"]
        self.spent[M.BUDGET_SAMPLES] += samples
        self.spent[M.BUDGET_TOKENS] += tokens
        self.spent[M.BUDGET_REWARD_CALLS] += 1 if samples else 0


class BatchCollector:
    """Draws one process's groups for each step: DAPO's dynamic sampling within a draw budget,
    over-sampling by r̂, carry-over of the surplus."""

    def __init__(
        self, cfg: TrainConfig, stream: PromptStream, process_index: int = 0, num_processes: int = 1
    ):
        P = cfg.rollout.prompts_per_step
        if P % num_processes:
            raise UserError(
                f"rollout.prompts_per_step={P} must be divisible by the {num_processes} processes"
            )
        self.cfg, self.stream, self.process_index = cfg, stream, process_index
        self.local_prompts = P // num_processes  # groups this process trains on per step
        # rounds per step, and how many groups a step may draw (a round's slots are `blocks` blocks of P,
        # so an over-sampled round never reuses another round's slots). The slot layout is the same
        # without dynamic sampling: runs with one seed draw their step's first groups from the same
        # slots (prompts and sampling seeds) whatever the algorithm
        dyn = cfg.advantage
        self.rounds = 1 + (dyn.max_resample if dyn.dynamic_sampling else 0)
        self.blocks = math.ceil(dyn.draw_budget)
        self.draw_budget = (
            int(dyn.draw_budget * self.local_prompts) if dyn.dynamic_sampling else self.local_prompts
        )
        self.zero_std_estimate: float | None = None  # r̂: running share of groups without signal
        self.carry: Batch | None = None  # groups with signal drawn beyond P, trained at the next step
        # a scheme that needs "branches": every kept group is branched at the run's `branching` settings
        needs = get_scheme(cfg.credit.scheme).needs
        self.branching = cfg.branching if "branches" in needs else None
        self.leaves = (
            cfg.branching if "leaves" in needs else None
        )  # tree groups: continuations are trained on
        self.branched_once = False  # the first branching checks that every_k's spacing finds branch points
        # stepwise rewards: the sampler records every reveal step's prediction, scored for the kept groups
        self.stepwise = needs_step_rewards(cfg.credit.scheme)
        # GDPO and a scheme that reads the rewards: it reads the decoupled rewards r̂ (`decouple`)
        self.decoupled = cfg.advantage.reward_norm == "per_reward" and bool(needs & REWARD_NEEDS)
        self.spent = self.budget_keys()  # the run's budget/* totals (this process)
        self.history: dict[str, list[float]] = {}  # budget allocation: prompt → [sum, count] of its rewards
        self.owed = 0.0  # knapsack: the fraction of a group of extra draws carried to the next round
        self.sample_and_score = round_scorer(cfg)  # tasks/loop.sample_and_score, or in chunks (overlapped)
        self.num_processes = num_processes
        self.draws: StepDraws | None = None  # what a step may draw (train/draws.py), once the policy is known
        self.ledger: Ledger | None = None  # this step's draws charged against it

    def collect(self, step: int, policy: Any, reward: Any, sampling: SamplingParams) -> Collected:
        """This process's groups for `step`: the last step's carried-over groups first, then rounds
        of fresh ones until P have signal, the round limit or the draw budget is reached; the kept groups
        up to what the step trains on and carries, branched when the scheme needs it; the surplus carried."""
        P = self.local_prompts
        tally = Tally(spent=self.budget_keys())
        if self.draws is None:  # the plan's counts (train/plan.py checked them): every draw is charged
            self.draws = step_draws(self.cfg, policy, self.num_processes)
        self.ledger = Ledger(self.draws) if self.draws is not None else None
        fallbacks = decode_fallbacks(policy)
        if self.stepwise:
            sampling = dataclasses.replace(sampling, record_predictions=True)
        if (
            self.branching is not None or self.leaves is not None
        ):  # continuations start from the rollout's cache
            sampling = dataclasses.replace(sampling, keep_cache=True)
        kept: list[Batch] = [self.carry] if self.carry is not None else []
        carried, self.carry = groups_in(kept), None
        fresh: dict[int, list[int]] = {}  # index in `kept` → the prompt slots of its groups (drawn this step)
        last_round: Batch | None = None
        budget = self.draw_budget  # groups this process may still draw this step
        for round_ in range(self.rounds):
            missing = P - groups_in(kept)
            if missing <= 0 or budget <= 0:
                break
            # over-sampled by the expected share without signal: one batched round usually fills the
            # step; each group is seeded by its stream slot
            slots, prompts = self.prompts_for(step, round_, min(self.groups_to_draw(missing), budget))
            budget -= len(prompts)
            last_round, keep = self.draw(policy, reward, prompts, slots, sampling, tally)
            idx = keep.nonzero().flatten()
            if len(idx):
                g = last_round.rollout.group_size  # G, or a tree group's leaves
                fresh[len(kept)] = [slots[i] for i in (idx[::g] // g).tolist()]
                kept.append(last_round.select(idx))
        kept = self.within_cap(kept)
        self.complete(kept, fresh, last_round, policy, reward, sampling, tally)
        batch = Batch.concat(kept)
        if batch is not None and groups_in([batch]) > P:  # the surplus of an over-sampled round
            rows = torch.arange(len(batch.rollout))
            cut = P * batch.rollout.group_size
            self.carry = batch.select(rows[cut:])
            batch = batch.select(rows[:cut])
        for key, value in tally.spent.items():
            self.spent[key] += value
        drawn = RewardOutput.concat(tally.rewards) if tally.rewards else RewardOutput(torch.zeros(0))
        terms = term_metrics(reward_terms(reward), drawn.terms, tally.term_advantages)
        after = decode_fallbacks(policy)
        return Collected(
            batch,
            carried,
            last_round,
            drawn.scores,
            drawn.details,
            groups_drawn=tally.drawn,
            groups_without_signal=tally.without_signal,
            seconds=tally.seconds,
            budget=tally.spent,
            budget_total=dict(self.spent),
            terms=terms,
            decode_fallbacks=None if after is None else after - (fallbacks or 0),
        )

    def complete(
        self,
        kept: list[Batch],
        fresh: dict[int, list[int]],
        last_round: Batch | None,
        policy: Any,
        reward: Any,
        sampling: SamplingParams,
        tally: Tally,
    ) -> None:
        """What the scheme needs beyond the groups, for the groups drawn this step (carried ones got theirs
        when they were drawn): continuations from their branch points (`branch`), the scores of every
        reveal step's prediction (`score_steps`)."""
        for i, part in enumerate(kept):
            if i not in fresh:
                continue
            if self.branching is not None:
                self.branch(part, fresh[i][: groups_in([part])], policy, reward, sampling, tally)
            if self.stepwise:
                self.score_steps(part, policy, reward, tally)
        if self.stepwise and last_round is not None:  # the stand-in's rows (`Collected.stand_in`): no credit
            unscored = torch.full(last_round.rollout.state[STEP_PREDICTIONS].shape[:2], float("nan"))
            last_round.rollout.state[STEP_REWARDS] = unscored

    def draw(
        self,
        policy: Any,
        reward: Any,
        prompts: list[PromptRecord],
        slots: list[int],
        sampling: SamplingParams,
        tally: Tally,
    ) -> tuple[Batch, torch.Tensor]:
        """One round: a group per prompt, sampled, decoded and scored, with its group advantages → (the
        round's groups, [B] bool: the rows of the groups with signal, all of them without
        dynamic sampling)."""
        adv_cfg, G = self.cfg.advantage, self.cfg.rollout.group_size
        scored = self.sample(policy, reward, prompts, slots, sampling, tally)
        r = scored.reward.scores  # NaN/raise → RewardError
        adv = self.advantages(scored.reward, G, reward, tally if self.leaves is None else None)
        tally.drawn += len(prompts)
        if self.decoupled and self.leaves is None:  # the samples' r̂; `branch` pools continuations in
            rows = torch.arange(len(r))
            scored.rollout.state[CREDIT_REWARDS] = self.decouple(
                [per_term_scores(reward, scored.reward)], [rows // G], reward
            )
        batch = Batch(scored.rollout, adv, scored.reward, scored.outputs)
        if self.leaves is not None:  # tree groups: every group grows into its prefix tree, every leaf kept
            batch = self.tree_groups(batch, slots, policy, reward, sampling, tally)
            r, G = batch.reward.scores, batch.rollout.group_size
        if self.branching is not None:  # continuations are grown for the kept groups (`branch`)
            batch.tree = Tree.empty(len(r), self.branching.continuations)
        keep = torch.ones(len(r), dtype=torch.bool)
        if adv_cfg.dynamic_sampling:  # DAPO: only groups with signal (a tree group's: among all its leaves)
            keep, _ = dynamic_sampling_filter(r, G)
        tally.without_signal += len(prompts) - int(keep.sum()) // G
        return batch, keep

    def sample(
        self,
        policy: Any,
        reward: Any,
        prompts: list[PromptRecord],
        slots: list[int],
        sampling: SamplingParams,
        tally: Tally,
    ) -> Scored:
        """The round's groups of G, sampled and scored; with rollout.allocation, more drawn and each prompt's
        draws down-sampled to the G whose rewards vary most (docs/concepts/algorithms.md#budget-allocation).
        A prompt's first G draws are the same samples with and without allocation (its own generator)."""
        rollout_cfg, G = self.cfg.rollout, self.cfg.rollout.group_size
        first = round(rollout_cfg.draw_factor * G) if rollout_cfg.allocation == "pods" else G
        self.charge("a round's groups", samples=len(prompts) * first, reward_calls=1)
        parts = [
            self.sample_and_score(
                policy, reward, prompts, first, sampling, group_generators(self.cfg.seed, "train", slots)
            )
        ]
        rows = [list(range(i * first, (i + 1) * first)) for i in range(len(prompts))]  # each prompt's draws
        if rollout_cfg.allocation == "knapsack":
            r = parts[0].reward.scores.view(len(prompts), G)
            past = torch.tensor([self.history.get(p.text, [0.0, 0.0]) for p in prompts], dtype=torch.float64)
            p_hat = success_estimate(past[:, 0], past[:, 1], r.sum(1), torch.full((len(prompts),), G))
            extra = allocate(p_hat, G, units=self.extra_groups(len(prompts)), unit=G)
            for units in sorted(set(extra.tolist()) - {0}):
                which = (extra == units).nonzero().flatten().tolist()
                self.charge("knapsack's extra draws", samples=len(which) * units * G, reward_calls=1)
                offset = sum(len(part.rollout) for part in parts)
                parts.append(
                    self.sample_and_score(
                        policy,
                        reward,
                        [prompts[i] for i in which],
                        units * G,
                        sampling,
                        group_generators(self.cfg.seed, "train-more", [slots[i] for i in which]),
                    )
                )
                for j, i in enumerate(which):
                    rows[i] += list(range(offset + j * units * G, offset + (j + 1) * units * G))
        for part in parts:
            self.charge("a round's tokens", tokens=float(part.rollout.mask.sum()))
            tally.add(part.seconds, samples=len(part.rollout), tokens=float(part.rollout.mask.sum()))
            tally.rewards.append(part.reward)
        if rollout_cfg.allocation == "none":
            return parts[0]
        scores = torch.cat([part.reward.scores for part in parts])
        for p, own in zip(prompts, rows):
            seen = self.history.setdefault(p.text, [0.0, 0.0])
            seen[0], seen[1] = seen[0] + float(scores[own].sum()), seen[1] + len(own)
        order = torch.cat([torch.tensor(own)[max_variance_subset(scores[own], G)] for own in rows])
        tally.spent[M.BUDGET_KEPT] += len(order)
        return select_scored(parts, order, G)

    def extra_groups(self, prompts: int) -> int:
        """Knapsack's extra groups for a round of `prompts` prompts: (draw_factor − 1) groups per prompt on
        average, the fraction a round cannot draw carried to the next (a step of one prompt at draw_factor 1.5
        draws an extra group every other step, never none)."""
        budget = (self.cfg.rollout.draw_factor - 1) * prompts + self.owed
        units = math.floor(budget + 1e-9)
        self.owed = min(max(budget - units, 0.0), 1.0 - 1e-12)
        return units

    def advantages(self, out: Any, group_size: int, reward: Any, tally: Tally | None) -> torch.Tensor:
        """A round's sequence advantages [B] (advantage.scale, advantage.reward_norm: train/scoring.py); under
        GDPO each term's w_k A_k is kept in `tally` for its metric (None: the roots of tree groups, whose
        advantages are those of the grown groups)."""
        adv, per_term = sequence_advantages(self.cfg.advantage, out, group_size, reward_terms(reward))
        if tally is not None:
            for name, values in per_term.items():
                tally.term_advantages.setdefault(name, []).append(values)
        return adv

    def tree_groups(
        self, roots: Batch, slots: list[int], policy: Any, reward: Any, sampling: SamplingParams, tally: Tally
    ) -> Batch:
        """The round's groups grown into tree groups (train/branches.grow_leaves): roots then continuations,
        the group advantages over every leaf."""
        cont = len(roots.rollout) * self.leaves.k * self.leaves.continuations
        self.charge("tree groups' continuations", samples=cont, continuations=cont, reward_calls=1)
        grown = grow_leaves(
            policy,
            reward,
            roots.rollout,
            roots.outputs,
            roots.reward,
            slots,
            self.leaves,
            self.cfg.seed,
            sampling,
            TRAIN_CONTEXT[self.cfg.rollout.train_logp],
        )
        self.charge("tree groups' tokens", tokens=grown.tokens)
        tally.add(grown.seconds, samples=grown.samples, tokens=grown.tokens)
        new = ~grown.leaves.is_root
        tally.rewards.append(grown.reward.select(new.nonzero().flatten()))
        G = grown.rollout.group_size
        adv = self.advantages(grown.reward, G, reward, tally)
        if self.decoupled:  # every leaf of a tree group pooled
            rows = torch.arange(len(grown.rollout))
            grown.rollout.state[CREDIT_REWARDS] = self.decouple(
                [per_term_scores(reward, grown.reward)], [rows // G], reward
            )
        return Batch(grown.rollout, adv, grown.reward, grown.outputs, leaves=grown.leaves)

    def within_cap(self, kept: list[Batch]) -> list[Batch]:
        """The kept groups up to what the step trains on and carries: P, plus P/2 with carry-over (a group
        past the cap is dropped, so `kept`'s first entries keep their places)."""
        room = self.local_prompts + (self.local_prompts // 2 if self.cfg.advantage.carry_over else 0)
        out = []
        for part in kept:
            n = min(groups_in([part]), room)
            if n:
                G = part.rollout.group_size
                out.append(part if n == groups_in([part]) else part.select(torch.arange(n * G)))
            room -= n
        return out

    def branch(
        self, part: Batch, slots: list[int], policy: Any, reward: Any, sampling: SamplingParams, tally: Tally
    ) -> None:
        """Sample and score the continuations of `part`'s groups (drawn from prompt `slots`) at the run's
        branch points: its `tree` (train/branches.grow)."""
        grown = grow(
            policy,
            reward,
            part.rollout,
            slots,
            self.branching,
            self.cfg.seed,
            sampling,
            TRAIN_CONTEXT[self.cfg.rollout.train_logp],
            strict=not self.branched_once,
        )
        self.branched_once = True
        # charged as drawn: where they branch is the samples' (pick_points)
        self.charge(
            "continuations",
            samples=grown.samples,
            continuations=grown.samples,
            tokens=grown.tokens,
            reward_calls=1 if grown.samples else 0,
        )
        part.tree = grown.tree
        if self.decoupled and grown.root is not None:  # a group's samples and their continuations pooled
            G = part.rollout.group_size
            rows = torch.arange(len(part.rollout))
            both = self.decouple(
                [per_term_scores(reward, part.reward), grown.terms], [rows // G, grown.root // G], reward
            )
            part.rollout.state[CREDIT_REWARDS] = both[: len(rows)]
            part.tree = grown.tree_of(both[len(rows) :])
        tally.add(grown.seconds, samples=grown.samples, tokens=grown.tokens)

    def budget_keys(self) -> dict[str, float]:
        """The budget/* counts this run keeps, at 0 (budget allocation also counts what it kept)."""
        keys = (*M.BUDGET, M.BUDGET_KEPT) if self.cfg.rollout.allocation != "none" else M.BUDGET
        return dict.fromkeys(keys, 0.0)

    def score_steps(self, part: Batch, policy: Any, reward: Any, tally: Tally) -> None:
        """Decode and score the prediction x̂_s every reveal step of `part`'s samples made (recorded by the
        sampler): r(x̂_s) [B, S] into their ``state[STEP_REWARDS]`` (train/credit.score_step_predictions;
        stepwise credit)."""
        tic = time.perf_counter()
        ro = part.rollout
        S = int(ro.state[STEP_PREDICTIONS].shape[1])
        self.charge(
            "step predictions", samples=len(ro) * (S - 1), predictions=len(ro) * (S - 1), reward_calls=S - 1
        )
        terms: list[torch.Tensor] | None = [] if self.decoupled else None
        rewards, calls = score_step_predictions(policy, reward, ro, part.reward.scores, terms=terms)[:2]
        if terms is not None:  # GDPO: r̂ of every step's prediction, each group's steps and samples pooled
            per_step = torch.stack([*terms, per_term_scores(reward, part.reward)], dim=1)  # [B, S, K]
            B, S, K = per_step.shape
            groups = (torch.arange(B) // ro.group_size)[:, None].expand(B, S).reshape(-1)
            rewards = self.decouple([per_step.reshape(B * S, K)], [groups], reward).view(B, S).float()
        ro.state[STEP_REWARDS] = rewards
        tally.add_step_predictions(time.perf_counter() - tic, predictions=len(ro) * calls, calls=calls)

    def charge(self, what: str, **counts: float) -> None:
        """Charge this step's ledger for a draw (train/draws.Ledger: more than the plan allows raises)."""
        if self.ledger is not None:
            self.ledger.charge(what, **counts)

    def decouple(self, parts: list[torch.Tensor], groups: list[torch.Tensor], reward: Any) -> torch.Tensor:
        """GDPO's decoupled rewards r̂ (core/advantages.decoupled_rewards) of the rows of `parts` ([N_i, K]
        per-term scores) laid end to end, each row's group in `groups`: what a scheme that reads the rewards
        gets under advantage.reward_norm=per_reward (docs/concepts/algorithms.md#gdpo-and-credit-schemes)."""
        terms = reward_terms(reward)
        weights = torch.tensor([w for _, w in terms] if terms and len(terms) > 1 else [1.0])
        return decoupled_rewards(
            torch.cat([p.float().cpu() for p in parts]),
            weights,
            torch.cat([g.long().cpu() for g in groups]),
            eps=self.cfg.advantage.eps,
        )

    def prompts_for(self, step: int, round_: int, count: int) -> tuple[list[int], list[PromptRecord]]:
        """This process's first `count` prompts for (step, round), with their positions in the prompt
        stream. A round owns `blocks` blocks of P slots; process k takes slots k·p … k·p + p − 1 of each
        block in turn (p = P / processes), so a slot is the same whatever the number of processes."""
        P, p = self.cfg.rollout.prompts_per_step, self.local_prompts
        if count > self.blocks * p:
            raise ValueError(f"a round holds at most {self.blocks * p} groups per process, asked for {count}")
        base = (step * (1 + self.cfg.advantage.max_resample) + round_) * self.blocks * P
        slots = [base + (j // p) * P + self.process_index * p + j % p for j in range(count)]
        return slots, [self.stream.take(slot, 1)[0] for slot in slots]

    def groups_to_draw(self, missing: int) -> int:
        """Groups to sample for `missing` groups with signal: missing / (1 − r̂), r̂ the running share
        of groups without signal (no over-sampling before the first step has measured it)."""
        r = self.zero_std_estimate
        if not self.cfg.advantage.dynamic_sampling or r is None:
            return missing
        return math.ceil(missing / max(1.0 - r, 0.05) - 1e-9)

    def observe_zero_std(self, ratio: float) -> None:
        """Update r̂ from a step's measured share (averaged over processes, so every rank agrees);
        without dynamic sampling r̂ is not kept."""
        if not self.cfg.advantage.dynamic_sampling:
            return
        r = self.zero_std_estimate
        self.zero_std_estimate = ratio if r is None else 0.8 * r + 0.2 * ratio

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint saves (train/checkpoint.py `collector_checkpoint`): the groups carried
        into the next step, r̂ and the budget spent so far."""
        state = {"carry": self.carry, "zero_std_estimate": self.zero_std_estimate, "budget": dict(self.spent)}
        if self.cfg.rollout.allocation != "none":
            state["history"] = {text: list(v) for text, v in self.history.items()}
            state["owed"] = self.owed
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.carry, self.zero_std_estimate = state["carry"], state["zero_std_estimate"]
        self.spent = {**self.budget_keys(), **(state.get("budget") or {})}  # older runs: none
        self.history = {text: list(v) for text, v in (state.get("history") or {}).items()}
        self.owed = float(state.get("owed") or 0.0)


def groups_in(batches: list[Batch]) -> int:
    return sum(len(b.rollout) // b.rollout.group_size for b in batches)


def select_scored(parts: list[Scored], order: torch.Tensor, group_size: int) -> Scored:
    """Rows `order` of the scored parts laid end to end, as groups of `group_size`."""
    rollout = Rollout.concat([part.rollout for part in parts]).select(order)
    outputs = [part.outputs for part in parts]
    if torch.is_tensor(outputs[0]):
        out = torch.cat(outputs)[order.to(outputs[0].device)]
    else:
        flat = [o for x in outputs for o in x]
        out = [flat[i] for i in order.tolist()]
    reward = RewardOutput.concat([part.reward for part in parts]).select(order)
    seconds = {k: sum(part.seconds.get(k, 0.0) for part in parts) for k in parts[0].seconds}
    return Scored(dataclasses.replace(rollout, group_size=group_size), out, reward, seconds)


def decode_fallbacks(policy: Any) -> int | None:
    """The failed decode-step captures of the policy's run so far (policies/decode_loop.DecodeSession), or
    None where its rollouts have captured nothing (eager or uncaptured loops, masked families)."""
    session = policy.decode_session
    if session is None or not (session.stats["captures"] or session.stats["fallbacks"]):
        return None
    return session.stats["fallbacks"]
