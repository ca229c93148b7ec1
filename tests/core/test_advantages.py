"""Unit and property tests for t2i_gcpo.core.advantages (docs/concepts/algorithms.md#sequence-advantages)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from t2i_gcpo.core.advantages import (
    PerPromptStatTracker,
    dynamic_sampling_filter,
    group_advantages,
    zero_std_groups,
)

FAST = settings(max_examples=40, deadline=None)


def test_group_advantages_hand_computed_group_of_four():
    # r = [1, 0, 0, 1]: mean 0.5, unbiased std = sqrt(4 · 0.25 / 3) = 0.57735
    # A = ±0.5 / (0.57735 + 1e-4) = ±0.86588
    a = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4)
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    torch.testing.assert_close(a, torch.tensor([expected, -expected, -expected, expected]))


def test_group_advantages_groups_are_contiguous():
    # groups (1, 0) and (0, 1): std = sqrt(0.5) each → ±0.5/(0.70711 + 1e-4)
    a = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=2)
    e = 0.5 / (math.sqrt(0.5) + 1e-4)
    torch.testing.assert_close(a, torch.tensor([e, -e, -e, e]))


def test_group_advantages_batch_and_none_scales():
    r = torch.tensor([3.0, 1.0, 10.0, 10.0])
    # none: centred per group → [1, -1, 0, 0]
    torch.testing.assert_close(group_advantages(r, 2, scale="none"), torch.tensor([1.0, -1.0, 0.0, 0.0]))
    # batch: divide by the unbiased std of all four rewards (torch.std), centre per group
    sigma = float(r.std())
    e = 1.0 / (sigma + 1e-4)
    torch.testing.assert_close(group_advantages(r, 2, scale="batch"), torch.tensor([e, -e, 0.0, 0.0]))


def test_group_size_one_gives_zero_advantages_without_nan():
    for scale in ("group", "batch", "none"):
        a = group_advantages(torch.tensor([0.3, 0.9, 0.1]), group_size=1, scale=scale)
        assert torch.equal(a, torch.zeros(3))
    assert torch.equal(group_advantages(torch.tensor([0.7]), 1, scale="batch"), torch.zeros(1))


def test_bad_shapes_and_options_raise():
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(2, 3), 3)
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(4), 0)
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(4), 2, scale="global")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        zero_std_groups(torch.zeros(5), 2)
    with pytest.raises(ValueError):
        dynamic_sampling_filter(torch.zeros(4, 1), 2)


def test_zero_std_groups_and_tolerance():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5005])
    assert zero_std_groups(r, 2).tolist() == [True, False, False]
    assert zero_std_groups(r, 2, tol=1e-3).tolist() == [True, False, True]


def test_dynamic_sampling_filter():
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])  # groups of 3: flat, mixed, flat
    keep, ratio = dynamic_sampling_filter(r, 3)
    assert keep.tolist() == [False] * 3 + [True] * 3 + [False] * 3
    assert ratio == pytest.approx(2 / 3)
    keep, ratio = dynamic_sampling_filter(torch.zeros(0), 4)
    assert keep.numel() == 0 and ratio == 0.0


@FAST
@given(
    value=st.floats(-100, 100, allow_nan=False),
    groups=st.integers(1, 4),
    g=st.integers(1, 6),
    scale=st.sampled_from(["group", "batch", "none"]),
)
def test_all_equal_rewards_zero_advantages_and_flags(value, groups, g, scale):
    r = torch.full((groups * g,), value)
    a = group_advantages(r, g, scale=scale)
    assert torch.equal(a, torch.zeros_like(a))
    assert zero_std_groups(r, g).all()
    keep, ratio = dynamic_sampling_filter(r, g)
    assert not keep.any() and ratio == 1.0


@FAST
@given(rewards=st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=8), shift=st.floats(-5, 5))
def test_advantages_zero_mean_and_shift_invariant(rewards, shift):
    r = torch.tensor(rewards, dtype=torch.float64)
    a = group_advantages(r, len(rewards))
    assert torch.isfinite(a).all()
    assert abs(float(a.sum())) < 1e-4 * len(rewards) * max(1.0, float(a.abs().max()))
    torch.testing.assert_close(group_advantages(r + shift, len(rewards)), a, atol=1e-4, rtol=1e-4)


def test_shuffling_within_a_group_permutes_advantages():
    r = torch.tensor([0.1, 0.9, 0.4, 0.7, 0.3, 0.2])
    perm = torch.tensor([2, 0, 1, 3, 5, 4])  # shuffles inside each group of 3
    torch.testing.assert_close(group_advantages(r[perm], 3), group_advantages(r, 3)[perm])


def test_per_prompt_stat_tracker():
    t = PerPromptStatTracker()
    a = t.update(["x", "x", "y"], torch.tensor([1.0, 0.0, 5.0]))
    e = 0.5 / (math.sqrt(0.5) + 1e-4)
    # "x": history [1, 0] → ±e;  "y": a single reward → no spread → 0
    torch.testing.assert_close(a, torch.tensor([e, -e, 0.0]))
    # second batch for "x": history [1, 0, 1]: mean 2/3, unbiased std sqrt(1/3)
    a = t.update(["x"], torch.tensor([1.0]))
    torch.testing.assert_close(a, torch.tensor([(1 / 3) / (math.sqrt(1 / 3) + 1e-4)]))
    assert t.stats() == {"prompts": 2.0, "mean_history": 2.0}
    t.clear()
    assert t.stats()["prompts"] == 0.0


def test_per_prompt_stat_tracker_history_window_and_checks():
    t = PerPromptStatTracker(history=2)
    t.update(["p"], torch.tensor([100.0]))
    a = t.update(["p", "p"], torch.tensor([1.0, 0.0]))  # window keeps [1, 0] only
    e = 0.5 / (math.sqrt(0.5) + 1e-4)
    torch.testing.assert_close(a, torch.tensor([e, -e]))
    with pytest.raises(ValueError):
        t.update(["p", "q"], torch.tensor([1.0]))
    with pytest.raises(ValueError):
        PerPromptStatTracker(history=0)
