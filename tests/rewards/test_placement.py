"""Where a reward runs (reward_options.device / batch_size, a term's device= / batch_size=;
rewards/combine.Placed): the same run with the reward on the CPU or in batches of its own; each batch moved
and scored in order; a form with its own batch size gets the run's; a device this machine lacks is one line
before anything is written."""

from __future__ import annotations

from typing import Annotated

import pytest
import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards.combine import Placed, WeightedSum
from t2i_gcpo.rewards.registry import Option, build_reward, register_reward, unregister_reward

from cli_helpers import cli, error_line
from reward_fixtures import CALLS, assert_same_run, rows, train
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file

COUNTED = "reward_fixtures:counted"  # the module the tests import: its CALLS


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("placed")
    model, prompts = str(tiny_policy_dir(root)), str(write_prompt_file(root / "p.jsonl"))
    assert train(root / "plain", model, prompts) == 0
    return {"root": root, "model": model, "prompts": prompts, "base": root / "plain"}


@pytest.mark.parametrize(
    "args",
    [
        ["--set", "reward_options.device=cpu"],
        ["--set", "reward_options.batch_size=3"],
        ["--reward", "shapeworld:device=cpu,batch_size=5"],
    ],
    ids=["reward_options.device=cpu", "reward_options.batch_size=3", "term device=cpu,batch_size=5"],
)
def test_a_placed_reward_gives_the_same_run(tiny, tmp_path, args):
    assert train(tmp_path / "run", tiny["model"], tiny["prompts"], *args) == 0
    assert_same_run(tiny["base"], tmp_path / "run")


def test_a_run_calls_its_reward_batch_size_images_at_a_time(tiny, tmp_path):
    CALLS.clear()
    args = [
        "--reward",
        COUNTED,
        "--set",
        "reward_options.batch_size=3",
        "--set",
        "advantage.dynamic_sampling=false",
    ]
    assert train(tmp_path / "run", tiny["model"], tiny["prompts"], *args, steps=1) == 0
    assert CALLS == [2, 3, 3, 2]  # the dry sample's group of 2, then the step's 8 samples in 3 + 3 + 2
    assert len(rows(tmp_path / "run")) == 1


def test_placed_moves_each_batch_and_keeps_the_order():
    seen = []

    def fn(images, prompts, metadata):
        seen.append((images.device.type, len(prompts), [m["i"] for m in metadata]))
        return images.flatten(1).sum(1)

    from t2i_gcpo.rewards.combine import FunctionReward

    images = torch.rand(7, 3, 2, 2)
    out = Placed(FunctionReward(fn), device="cpu", batch_size=3)(
        images, ["p"] * 7, [{"i": i} for i in range(7)]
    )
    assert torch.allclose(out.scores, images.flatten(1).sum(1))
    assert seen == [("cpu", 3, [0, 1, 2]), ("cpu", 3, [3, 4, 5]), ("cpu", 1, [6])]


def test_a_form_with_its_own_batch_size_gets_the_runs():
    got = {}

    @register_reward("toy_batched", scores="image", doc="a toy with its own batch size")
    def load(
        *, batch_size: Annotated[int, Option("images per forward pass", low=1)] = 16, device: str = "cpu"
    ):
        got.update(batch_size=batch_size, device=device)
        return lambda images, prompts, metadata: torch.zeros(len(prompts))

    try:
        reward = build_reward("toy_batched", batch_size=5, device="cpu")
        assert got == {"batch_size": 5, "device": "cpu"} and not isinstance(reward.inner, Placed)
        build_reward("toy_batched:batch_size=2", batch_size=5)
        assert got["batch_size"] == 2  # the term's own wins
        sum_ = build_reward("0.5*toy_batched:device=cpu+0.5*shapeworld:batch_size=4")
        assert isinstance(sum_, WeightedSum) and got["device"] == "cpu"
        assert [type(r).__name__ for r, _ in sum_.parts] == ["Placed", "Placed"]
    finally:
        unregister_reward("toy_batched")


def test_every_form_lists_device_and_batch_size_among_its_options():
    with pytest.raises(UserError, match=r"its options: variant, device, batch_size"):
        build_reward("shapeworld:speed=3")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--set", "reward_options.device=cuda:7"], "cuda:7: this machine has"),
        (["--reward", "shapeworld:device=cuda:7"], "device cuda:7: this machine has"),
        (["--reward", "shapeworld:device=gpu"], "'gpu' is not a device"),
        (["--set", "reward_options.device=gpu"], "config key 'reward_options.device': must be auto, cpu"),
        (
            ["--set", "reward_options.batch_size=0"],
            "config key 'reward_options.batch_size': must be in [1, 4096]",
        ),
    ],
)
def test_a_device_this_machine_lacks_is_one_line_before_the_run_folder_exists(
    tiny, tmp_path, capsys, args, needle
):
    out = tmp_path / "run"
    code, _, err = cli(
        capsys, "train", "--prompts", tiny["prompts"], "--model", tiny["model"], "--out", out, *args
    )
    line = error_line(err)
    assert code == 2 and needle in line, line
    assert not out.exists()
