"""Rewards for the repros of issue 59 (importable as `repro_fixtures:NAME` by the runs the tests start)."""

from __future__ import annotations

import torch

from train_fixtures import redness


def overflowing(images, prompts, metadata):
    """Finite rewards of ±3e38 from the first call: the group mean overflows float32, the advantages and the
    loss are NaN at step 1 (groups of 4) (the trainer's NaN guard stops it before any checkpoint)."""
    out = redness(images, prompts, metadata)
    out.scores[:] = 3e38
    out.scores[1::4] = -3e38
    return out


def constant(images, prompts, metadata):
    """The same score for every sample."""
    return [0.5] * len(prompts)


def red(images, prompts, metadata):
    """Mean red of each image, in [0, 1]."""
    return torch.as_tensor(images)[:, 0].mean((1, 2))


def blue_hundred(images, prompts, metadata):
    """100 × the mean blue of each image: a term whose scale would drown `red` in a plain sum."""
    return 100 * torch.as_tensor(images)[:, 2].mean((1, 2))


def slow_redness(images, prompts, metadata):
    """`redness`, after 0.3 s of sleep where T2I_TEST_SLOW_REWARD is set (a step long enough for a kill to
    land in it)."""
    import os
    import time

    if os.environ.get("T2I_TEST_SLOW_REWARD"):
        time.sleep(0.3)
    return redness(images, prompts, metadata)
