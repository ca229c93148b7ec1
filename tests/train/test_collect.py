"""The batch collector (train/collect.py) apart from a run: its prompt-slot layout, its saved state
through a checkpoint, and the zero-loss stand-in of a process whose groups all lacked signal."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from t2i_gcpo import metrics as M
from t2i_gcpo.config import TrainConfig
from t2i_gcpo.errors import UserError
from t2i_gcpo.policies.base import PromptRecord, Rollout
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.train.batch import Batch
from t2i_gcpo.train.checkpoint import collector_checkpoint, load_collector_state, save_checkpoint
from t2i_gcpo.train.collect import BatchCollector, Collected
from t2i_gcpo.train.data import PromptStream

PROMPTS = [PromptRecord(f"prompt {i}") for i in range(10)]


def collector(P=4, processes=1, rank=0, dynamic=True, seed=0) -> BatchCollector:
    cfg = TrainConfig()
    cfg.seed, cfg.rollout.prompts_per_step, cfg.advantage.dynamic_sampling = seed, P, dynamic
    return BatchCollector(cfg, PromptStream(PROMPTS, seed), rank, processes)


def batch(groups: int, G: int = 2, first: int = 0) -> Batch:
    """`groups` groups of G samples whose scores, advantages and tokens count up from `first`."""
    n = groups * G
    rows = torch.arange(first, first + n, dtype=torch.float32)
    ro = Rollout(
        tokens=rows.long()[:, None].repeat(1, 3),
        mask=torch.ones(n, 3),
        step=torch.zeros(n, 3).long(),
        logp={"pos": torch.zeros(n, 3)},
        prompts=[PROMPTS[0]] * n,
        group_size=G,
    )
    return Batch(ro, rows + 1, RewardOutput(rows, [{"row": int(r)} for r in rows]), torch.zeros(n, 3, 2, 2))


@pytest.mark.parametrize("dynamic", [True, False])
def test_a_slot_is_the_same_whatever_the_number_of_processes(dynamic):
    """Process k of n draws the slots the one-process run draws at positions k·p … k·p + p − 1 of each
    block of P (resume across process counts and the paired-seed comparison rest on it); no two rounds
    share a slot."""
    one = collector(dynamic=dynamic)
    capacity = one.blocks * one.local_prompts  # a round's slots
    seen = set()
    for step in (1, 2):
        for round_ in range(one.rounds):
            slots, _ = one.prompts_for(step, round_, capacity)
            assert not seen & set(slots) and len(set(slots)) == capacity, (step, round_)
            seen |= set(slots)
            for n in (2, 4):
                p = one.local_prompts // n
                for k in range(n):
                    part = collector(processes=n, rank=k, dynamic=dynamic)
                    got, _ = part.prompts_for(step, round_, part.blocks * p)
                    assert got == [s for j, s in enumerate(slots) if (j % one.local_prompts) // p == k], (
                        n,
                        k,
                    )


def test_prompts_per_step_must_split_over_the_processes():
    with pytest.raises(Exception, match="must be divisible by the 3 processes"):
        collector(P=4, processes=3)


def test_over_sampling_follows_the_running_share_without_signal():
    c = collector()
    assert c.groups_to_draw(3) == 3, "no estimate yet: no over-sampling"
    c.observe_zero_std(0.5)
    c.observe_zero_std(0.0)
    assert c.zero_std_estimate == pytest.approx(0.4)  # 0.8 · 0.5 + 0.2 · 0
    assert c.groups_to_draw(3) == 5  # ⌈3 / 0.6⌉
    off = collector(dynamic=False)
    off.observe_zero_std(0.5)
    assert off.zero_std_estimate is None and off.groups_to_draw(3) == 3


class _Saved:
    def save_pretrained(self, path: str) -> None:
        os.makedirs(path)
        Path(path, "model_index.json").write_text("{}")


def _optimizer_state() -> dict:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1).state_dict()


def test_saved_state_comes_back_to_each_process_and_is_dropped_for_another_count(tmp_path, capsys):
    """The checkpoint keeps r̂ in trainer_state.json and one carry entry per process; each process gets
    its own back, and a run resumed on another number of processes drops the carried groups."""
    ranks = [collector(processes=2, rank=k) for k in range(2)]
    for k, c in enumerate(ranks):
        c.observe_zero_std(0.25)
        c.carry = batch(1, first=10 * k) if k == 1 else None  # only process 1 carried a group
        c.spent = {
            M.BUDGET_SAMPLES: 8.0 + k,
            M.BUDGET_TOKENS: 100.0 * (k + 1),
            M.BUDGET_REWARD_CALLS: 2.0,
            M.BUDGET_STEP_PREDICTIONS: 24.0 * k,
        }
    entries, carry = collector_checkpoint([c.state_dict() for c in ranks])
    ckpt = save_checkpoint(
        tmp_path, 3, _Saved(), _optimizer_state(), {"algo": "dapo", **entries}, carry=carry
    )
    for k, c in enumerate(ranks):
        back = collector(processes=2, rank=k)
        back.load_state_dict(load_collector_state(ckpt, k, 2))
        assert back.zero_std_estimate == 0.25
        assert back.spent == c.spent  # each process's budget spent so far
        if c.carry is None:
            assert back.carry is None
        else:
            assert torch.equal(back.carry.rollout.tokens, c.carry.rollout.tokens)
            assert back.carry.reward.details == c.carry.reward.details
    # one process now: it gets the carried groups' drop and the run's budget totals
    summed = {
        M.BUDGET_SAMPLES: 17.0,
        M.BUDGET_TOKENS: 300.0,
        M.BUDGET_REWARD_CALLS: 4.0,
        M.BUDGET_STEP_PREDICTIONS: 24.0,
    }
    assert load_collector_state(ckpt, 0, 1) == {
        "carry": None,
        "zero_std_estimate": 0.25,
        "budget": summed,
        "history": {},
    }
    assert "note: 2 processes carried groups into step 4; dropped them" in capsys.readouterr().out
    _, none = collector_checkpoint([collector().state_dict()])
    assert none is None, "no process carried groups: no carry file"


def test_allocation_history_comes_back_to_each_process_and_is_pooled_for_another_count(tmp_path):
    """Budget allocation's per-prompt reward history ([sum, count]) is saved per process; a run resumed
    on another number of processes gives every process the pooled history; a damaged one is refused."""
    states = [
        {"carry": None, "zero_std_estimate": None, "budget": {}, "history": {"a": [1.0, 2.0]}},
        {
            "carry": None,
            "zero_std_estimate": None,
            "budget": {},
            "history": {"a": [0.5, 1.0], "b": [1.0, 4.0]},
        },
    ]
    entries, carry = collector_checkpoint(states)
    ckpt = save_checkpoint(
        tmp_path, 3, _Saved(), _optimizer_state(), {"algo": "knapsack", **entries}, carry=carry
    )
    assert [load_collector_state(ckpt, k, 2)["history"] for k in range(2)] == [s["history"] for s in states]
    pooled = {"a": [1.5, 3.0], "b": [1.0, 4.0]}
    assert [load_collector_state(ckpt, k, 3)["history"] for k in range(3)] == [pooled] * 3
    state = json.loads((ckpt / "trainer_state.json").read_text())
    (ckpt / "trainer_state.json").write_text(json.dumps({**state, "history": [{"a": [1.0, "x"]}]}))
    with pytest.raises(UserError, match=r"'history.0.a.1': input should be a valid number, got 'x'"):
        load_collector_state(ckpt, 0, 1)


def test_the_stand_in_is_one_group_of_the_last_round_with_zero_advantages():
    last = batch(3, G=2, first=4)
    got = Collected(None, 0, last, last.reward.scores, groups_drawn=3, groups_without_signal=3)
    stand_in = got.stand_in()
    assert torch.equal(stand_in.rollout.tokens, last.rollout.tokens[:2])
    assert torch.equal(stand_in.advantages, torch.zeros(2))
    assert torch.equal(last.advantages, torch.arange(5, 11, dtype=torch.float32)), "the round is unchanged"
    metrics = got.metrics()
    assert metrics[M.GROUPS_KEPT] == 0 and metrics[M.ZERO_STD_RATIO] == 1.0 and metrics[M.REWARD_MEAN] == 6.5
