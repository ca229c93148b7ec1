"""Scoring overlapped with sampling (reward_options.overlap, t2i_gcpo/train/scoring.py): the same run, metric
for metric and weight for weight, with the reward in process or behind a reward server; the chunks' samples,
images and rewards put back in order; a chunk is scored while the next one samples (shown by order of
events, not by timing); a failing reward stops the round with its error."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from t2i_gcpo.errors import RewardError
from t2i_gcpo.tasks.loop import group_generators, sample_and_score
from t2i_gcpo.train.scoring import chunk_groups, sample_and_score_chunked

from reward_fixtures import TINY_GRID, assert_same_run, serving, train
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("overlap")
    model, prompts = str(tiny_policy_dir(root)), str(write_prompt_file(root / "p.jsonl"))
    assert train(root / "plain", model, prompts) == 0
    return {"root": root, "model": model, "prompts": prompts, "base": root / "plain"}


@pytest.mark.parametrize("where", ["in process", "remote", "chunks without overlap"])
def test_an_overlapped_run_is_the_plain_run(tiny, tmp_path, where):
    chunks = ["--set", "reward_options.chunk=4"]  # one group a chunk
    overlap = [*chunks, "--set", "reward_options.overlap=true"]
    if where == "remote":
        with serving("shapeworld") as url:
            code = train(
                tmp_path / "run", tiny["model"], tiny["prompts"], "--reward", f"remote:{url}", *overlap
            )
    else:
        code = train(
            tmp_path / "run", tiny["model"], tiny["prompts"], *(overlap if where == "in process" else chunks)
        )
    assert code == 0
    assert_same_run(tiny["base"], tmp_path / "run")


@pytest.fixture(scope="module")
def policy(tiny):
    from t2i_gcpo.config import ModelOptions
    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.tasks.registry import get_task

    policy = load_policy(tiny["model"], ModelOptions())
    prompts = get_task("shapeworld", policy).load_prompts(tiny["prompts"])[:5]
    sampling = dataclasses.replace(policy.default_sampling(), guidance_scale=2.0)
    return policy, prompts, sampling


def test_chunks_are_put_back_in_order(policy):
    from t2i_gcpo.rewards.forms.shapeworld import ShapeWorldReward

    policy, prompts, sampling = policy
    reward = ShapeWorldReward(grid=TINY_GRID)
    whole = sample_and_score(policy, reward, prompts, 3, sampling, group_generators(0, "train", range(5)))
    inline = sample_and_score_chunked(
        policy, reward, prompts, 3, sampling, group_generators(0, "train", range(5)), chunk=6, overlap=False
    )
    assert torch.equal(whole.reward.scores, inline.reward.scores) and torch.equal(
        whole.outputs, inline.outputs
    )
    parts = sample_and_score_chunked(
        policy, reward, prompts, 3, sampling, group_generators(0, "train", range(5)), chunk=6
    )  # 2 groups a chunk: 2 + 2 + 1
    assert torch.equal(whole.rollout.tokens, parts.rollout.tokens) and torch.equal(
        whole.outputs, parts.outputs
    )
    assert all(torch.equal(whole.rollout.logp[k], parts.rollout.logp[k]) for k in whole.rollout.logp)
    assert parts.rollout.texts == whole.rollout.texts and parts.rollout.group_size == 3
    assert torch.equal(whole.reward.scores, parts.reward.scores)
    assert [d["partial"] for d in whole.reward.details] == [d["partial"] for d in parts.reward.details]
    assert set(parts.seconds) == {"rollout", "reward"}


def test_chunk_sizes_are_whole_groups():
    assert chunk_groups(None, 4, 8) == 2  # a quarter of the round's groups
    assert chunk_groups(None, 4, 1) == 1
    assert chunk_groups(10, 4, 8) == 2  # 10 samples → 2 groups of 4
    assert chunk_groups(3, 4, 8) == 1  # at least one group


class Events:
    """A policy whose second chunk's rollout waits for the first chunk's reward to start, and a reward that
    waits for that rollout to start: both finish only if scoring runs beside sampling."""

    def __init__(self, policy):
        self.policy, self.log, self.lock = policy, [], threading.Lock()
        self.rollout_started = [threading.Event() for _ in range(3)]
        self.calls = 0

    def rollout(self, prompts, *args, **kwargs):
        k = self.calls
        self.calls += 1
        self.rollout_started[k].set()
        self.note(f"rollout {k}")
        return self.policy.rollout(prompts, *args, **kwargs)

    def reward(self, images, prompts, metadata):
        with self.lock:
            k = sum(1 for e in self.log if e.startswith("reward"))
        self.note(f"reward {k}")
        nxt = self.rollout_started[min(k + 1, 2)]
        assert k == 2 or nxt.wait(timeout=10), "the next chunk did not sample while this one was scored"
        return torch.zeros(len(prompts))

    def note(self, what):
        with self.lock:
            self.log.append(what)

    def __getattr__(self, name):
        return getattr(self.policy, name)


def test_a_chunk_is_scored_while_the_next_one_samples(policy):
    from t2i_gcpo.rewards.combine import FunctionReward

    policy, prompts, sampling = policy
    events = Events(policy)
    scored = sample_and_score_chunked(
        events,
        FunctionReward(events.reward, name="waits"),
        prompts[:3],
        2,
        sampling,
        group_generators(0, "train", range(3)),
        chunk=2,
    )
    assert (
        len(scored.reward.scores) == 6
    )  # each reward waited for the next chunk's rollout to start, and got it


def test_without_overlap_the_same_waits_would_never_end(policy):
    """The check above has teeth: scored after sampling, a chunk's reward waits in vain for
    the next rollout."""
    from t2i_gcpo.rewards.combine import FunctionReward

    policy, prompts, sampling = policy
    events = Events(policy)
    events.rollout_started[1].wait = lambda timeout: False  # what a 10 s wait would end with
    with pytest.raises(RewardError, match="did not sample while this one was scored"):
        sample_and_score(
            events,
            FunctionReward(events.reward, name="waits"),
            prompts[:1],
            2,
            sampling,
            group_generators(0, "train", range(1)),
        )


def test_a_failing_chunk_raises_its_reward_error(policy):
    from t2i_gcpo.rewards.combine import FunctionReward

    policy, prompts, sampling = policy
    calls = []

    def fails_second(images, prompts, metadata):
        calls.append(len(prompts))
        if len(calls) == 2:
            raise ValueError("the detector crashed")
        return torch.zeros(len(prompts))

    with pytest.raises(RewardError, match="reward 'fails_second' failed: ValueError: the detector crashed"):
        sample_and_score_chunked(
            policy,
            FunctionReward(fails_second),
            prompts[:3],
            2,
            sampling,
            group_generators(0, "train", range(3)),
            chunk=2,
        )
