"""RewardOutput: per-term scores typed as a [B, K] tensor beside their names, kept through
select and concat."""

import pytest
import torch

from t2i_gcpo.errors import RewardError
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.rewards.combine import as_reward_output


def output(scores, terms=None, names=(), details=None):
    terms = None if terms is None else torch.tensor(terms)
    return RewardOutput(torch.tensor(scores), details or [], terms, names)


def test_select_and_concat_keep_terms_details_and_order():
    a = output([1.0, 2.0], [[1.0, 0.0], [2.0, 0.0]], ("x", "y"), [{"i": 0}, {"i": 1}])
    b = output([3.0], [[0.0, 3.0]], ("x", "y"), [{"i": 2}])
    both = RewardOutput.concat([a, b])
    assert both.scores.tolist() == [1.0, 2.0, 3.0] and both.term_names == ("x", "y")
    assert both.terms.tolist() == [[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]]
    picked = both.select([2, 0])
    assert picked.scores.tolist() == [3.0, 1.0] and picked.terms.tolist() == [[0.0, 3.0], [1.0, 0.0]]
    assert [d["i"] for d in picked.details] == [2, 0]


def test_concat_fills_missing_details_and_refuses_mixed_terms():
    plain = RewardOutput.concat([output([1.0], details=[{"k": 1}]), output([2.0])])
    assert plain.details == [{"k": 1}, {}] and plain.terms is None
    with pytest.raises(ValueError, match="different terms"):
        RewardOutput.concat([output([1.0], [[1.0]], ("x",)), output([2.0])])
    with pytest.raises(ValueError, match="different terms"):
        RewardOutput.concat([output([1.0], [[1.0]], ("x",)), output([2.0], [[2.0]], ("z",))])


def test_terms_must_be_one_column_per_name():
    with pytest.raises(ValueError, match=r"expected \[B, K\] = \[2, 2\]"):
        output([1.0, 2.0], [[1.0], [2.0]], ("x", "y"))


def test_a_users_output_with_nan_terms_is_a_reward_error():
    bad = output([1.0, 2.0], [[1.0, float("nan")], [2.0, 0.0]], ("x", "y"))
    with pytest.raises(RewardError, match="reward 'mine' returned terms"):
        as_reward_output(bad, 2, "mine")
    good = as_reward_output(output([1.0, 2.0], [[1, 0], [2, 0]], ("x", "y")), 2, "mine")
    assert good.terms.dtype == torch.float32 and good.details == [{}, {}]
