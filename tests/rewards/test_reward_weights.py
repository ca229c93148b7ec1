"""Reward weights that train on nothing (issue 59): `0*shapeworld` and `1e-400*shapeworld` trained on a
constant reward without a word. A sum whose every weight is 0 is refused (every sample scores 0: no step
learns anything), as is a weight written non-zero that is 0 as a float (1e-400 underflows); a 0 beside other
terms is kept: that term is logged (its reward/<name>/mean), not trained on — what a user writing it means."""

from __future__ import annotations

import pytest

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards.combine import WeightedSum
from t2i_gcpo.rewards.registry import check_reward_spec, terms

from cli_helpers import cli, error_line


@pytest.mark.parametrize(
    "spec, says",
    [
        ("0*shapeworld", "every term has weight 0, so every sample would score 0"),
        ("0.0*shapeworld+-0*repro_fixtures:constant", "every term has weight 0"),
        ("1e-400*shapeworld", "the weight 1e-400 is 0 in floating point"),
        ("0.5*shapeworld+1e-400*repro_fixtures:constant", "the weight 1e-400 is 0 in floating point"),
    ],
)
def test_weights_that_train_on_nothing_are_refused_before_the_run(spec, says, tmp_path, capsys):
    out = tmp_path / "run"
    code, _, err = cli(
        capsys, "train", "--prompts", "prompts/shapeworld_train.txt", "--reward", spec, "--out", out
    )
    line = error_line(err)
    assert code == 2 and says in line, line
    assert not out.exists()


def test_a_zero_weight_beside_others_is_kept_and_the_api_refuses_an_all_zero_sum():
    assert terms("0*shapeworld+shapeworld:flow_grpo") == [(0.0, "shapeworld"), (None, "shapeworld:flow_grpo")]
    check_reward_spec("0*shapeworld+1*shapeworld:flow_grpo", "image")
    assert terms("1e-300*shapeworld") == [(1e-300, "shapeworld")]  # small, not zero: a weight like any other
    with pytest.raises(UserError, match="every term of the reward sum has weight 0"):
        WeightedSum([(lambda *a: [0.0], 0.0), (lambda *a: [1.0], -0.0)])
