"""The Python API (t2i_gcpo.api): training with a Python reward on a prompt list, what the reward sees,
bad rewards, resume, and the same results as the command line."""

from __future__ import annotations

import json
import math
import traceback

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner
from PIL import Image

from t2i_gcpo import api
from t2i_gcpo.cli import cli
from t2i_gcpo.errors import RewardError, UserError
from t2i_gcpo.worlds.shapeworld import parse_prompt

from tiny_models import tiny_policy_dir
from train_fixtures import redness, write_prompt_file

FAST = {
    "rollout.prompts_per_step": 2,
    "rollout.group_size": 4,
    "rollout.cfg_scale": 2,
    "optim.lr": 3e-3,
    "sample_every": 0,
    "save_every": 1,
    "eval_every": -1,
    "rollout.autocast": "none",
    "optim.autocast": "none",
}
PROMPTS = ["a photo of a red circle", "a photo of two blue squares", "a photo of a cross left of a bar"]
G, P = FAST["rollout.group_size"], FAST["rollout.prompts_per_step"]


def untimed(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


class Recorder:
    """A reward that records what it is called with; its score is the images' mean red."""

    def __init__(self):
        self.calls = []

    def __call__(self, images, prompts, metadata):
        scores = images[:, 0].mean((1, 2))
        self.calls.append(
            {
                "images": images.clone(),
                "prompts": list(prompts),
                "metadata": metadata,
                "scores": scores.tolist(),
            }
        )
        return scores


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {
        "model": str(tiny_policy_dir(root)),
        "prompts": str(write_prompt_file(root / "p.jsonl")),
        "root": root,
    }


@pytest.fixture(scope="module")
def two_steps(tiny):
    """Two GRPO steps (no dynamic sampling: one reward call per step) with a recording reward."""
    reward = Recorder()
    out = tiny["root"] / "two-steps"
    result = api.train(tiny["model"], PROMPTS, reward, "grpo", overrides=FAST, steps=2, seed=0, out=out)
    return result, reward


def test_train_on_a_prompt_list_with_a_python_reward_writes_the_run(two_steps):
    result, _ = two_steps
    run = result.run_dir
    assert [r["step"] for r in result.metrics] == [1, 2]
    assert result.metrics == [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert (run / "prompts.txt").read_text().splitlines() == PROMPTS  # the list, kept for resume
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["prompts"] == str(run / "prompts.txt") and saved["algo"] == "grpo"
    assert saved["reward"] == "<python>:Recorder"  # no module:function can load it again
    assert saved["rollout"]["group_size"] == G and saved["optim"]["lr"] == 3e-3  # the dict overrides
    assert result.checkpoint == run / "checkpoints" / "step_000002" / "model"
    assert result.eval == {}  # a user reward: no held-out ShapeWorld score
    # the returned policy is the trained one: the same weights as the last checkpoint
    saved_policy = api.load_policy(str(result.checkpoint))
    for (name, a), (_, b) in zip(result.policy.state_dict().items(), saved_policy.state_dict().items()):
        assert torch.equal(a, b), name


def test_the_reward_sees_images_and_each_groups_prompt_and_metadata(two_steps):
    result, reward = two_steps
    dry, *steps = reward.calls  # the dry sample before the run (a group of 2 of the first prompt), then
    assert len(steps) == 2  # one per step: P groups of G
    assert dry["images"].shape == (2, 3, 16, 16) and dry["prompts"] == [PROMPTS[0]] * 2
    for call, row in zip(steps, result.metrics):
        images, prompts, metadata = call["images"], call["prompts"], call["metadata"]
        assert images.shape == (P * G, 3, 16, 16) and images.dtype == torch.float32
        assert 0 <= images.min() and images.max() <= 1
        assert len(prompts) == len(metadata) == P * G
        for g in range(P):  # a group's G samples share their prompt, next to each other
            group = prompts[g * G : (g + 1) * G]
            assert len(set(group)) == 1 and group[0] in PROMPTS
        for text, meta in zip(prompts, metadata):  # GenEval metadata parsed from the prompt
            assert meta == parse_prompt(text)
            assert (
                meta["tag"] == {PROMPTS[0]: "colors", PROMPTS[1]: "color_count", PROMPTS[2]: "position"}[text]
            )
        # the logged reward is the mean of what the function returned
        assert row["reward/mean"] == pytest.approx(sum(call["scores"]) / len(call["scores"]), rel=1e-6)


def test_a_run_of_a_policy_object_with_a_python_reward_resumes_exactly(tiny, two_steps, tmp_path):
    out = tmp_path / "run"
    policy = api.load_policy(tiny["model"])
    reward = Recorder()
    cfg = api.load_config("grpo", overrides=FAST)
    api.train(policy, PROMPTS, reward, cfg, steps=1, seed=0, out=out)
    # the policy object's weights before training: the run's model, so the KL reference survives a resume
    assert yaml.safe_load((out / "config.yaml").read_text())["model"] == str(out / "initial_model")
    initial = api.load_policy(tiny["model"]).state_dict()
    for name, w in api.load_policy(str(out / "initial_model")).state_dict().items():
        assert torch.equal(w, initial[name]), name

    with pytest.raises(UserError, match="resume it from Python with the same function"):
        api.train(resume=out, steps=2)
    r = CliRunner().invoke(cli, ["train", "--resume", str(out), "--steps", "2"])
    assert r.exit_code != 0 and "Python reward 'Recorder'" in str(r.exception)
    with pytest.raises(UserError, match="not prompts"):
        api.train(prompts=PROMPTS, resume=out, steps=2, reward=reward)

    resumed = api.train(resume=out, steps=2, reward=reward)
    assert untimed(resumed.metrics) == untimed(two_steps[0].metrics)  # = the uninterrupted 2-step run
    assert resumed.metrics[1]["kl_k3"] > 0  # GRPO's KL term, against the initial policy


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda images, prompts, metadata: 1 / 0, r"reward '<lambda>' failed: ZeroDivisionError"),
        (lambda images, prompts, metadata: torch.full((len(prompts),), math.nan), r"returned NaN/inf"),
        (lambda images, prompts, metadata: [0.0, 1.0, 2.0], r"returned \(3,\) scores for 2 samples"),
    ],
    ids=["raises", "nan", "wrong-shape"],
)
def test_a_bad_reward_raises_a_reward_error_at_the_api(tiny, tmp_path, bad, message):
    out = tmp_path / "run"
    with pytest.raises(RewardError, match=message + ".*on a dry sample, before the run started") as info:
        api.train(tiny["model"], PROMPTS, bad, "grpo", overrides=FAST, steps=1, out=out)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-1].filename.endswith("api.py"), [f.filename for f in frames]  # not deep in the trainer
    assert not out.exists()  # the dry sample failed before the run directory was made


def test_a_reward_that_fails_only_in_training_raises_a_reward_error(tiny, tmp_path):
    def fails_past_the_dry_sample(images, prompts, metadata):
        if len(prompts) > 2:
            raise ValueError("bad batch")
        return redness(images, prompts, metadata)

    with pytest.raises(RewardError, match="reward 'fails_past_the_dry_sample' failed: ValueError: bad batch"):
        api.train(
            tiny["model"],
            PROMPTS,
            fails_past_the_dry_sample,
            "grpo",
            overrides=FAST,
            steps=1,
            out=tmp_path / "run",
        )


def test_bad_input_fails_before_anything_is_written(tiny, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(UserError, match=r"must take \(images, prompts, metadata\)"):
        api.train(tiny["model"], PROMPTS, lambda images: images, overrides=FAST, out=out)
    with pytest.raises(UserError, match=r"prompts\[1\]: cannot parse prompt 'a photo of circle circle'"):
        api.train(tiny["model"], ["a photo of a circle", "a photo of circle circle"], redness, out=out)
    with pytest.raises(UserError, match="unknown config key 'optim.nope'"):
        api.train(tiny["model"], PROMPTS, redness, overrides={"optim.nope": 1}, out=out)
    with pytest.raises(UserError, match="unknown algorithm 'ppo'"):
        api.train(tiny["model"], PROMPTS, redness, algo="ppo", out=out)
    with pytest.raises(UserError, match="list is empty"):
        api.train(tiny["model"], [], redness, out=out)
    with pytest.raises(UserError, match="'ppo' is neither a preset"):
        api.train(tiny["model"], PROMPTS, redness, config="ppo", out=out)
    with pytest.raises(UserError, match="unknown config key 'model_options.nope'"):
        api.load_policy(tiny["model"], nope=1)
    assert not out.exists()


def test_a_list_of_metadata_dicts_trains_as_a_jsonl_file_does(tiny, tmp_path):
    rows = [json.loads(line) for line in open(tiny["prompts"])]
    listed = api.train(tiny["model"], rows, redness, overrides=FAST, steps=1, seed=1, out=tmp_path / "list")
    from_file = api.train(
        tiny["model"], tiny["prompts"], redness, overrides=FAST, steps=1, seed=1, out=tmp_path / "file"
    )
    assert [json.loads(line) for line in open(listed.run_dir / "prompts.jsonl")] == rows
    assert untimed(listed.metrics) == untimed(from_file.metrics)


def test_cli_and_api_give_the_same_run_for_the_same_seed(tiny, tmp_path):
    sets = [x for k, v in FAST.items() for x in ("--set", f"{k}={v}")]
    r = CliRunner().invoke(
        cli,
        [
            "train",
            "--prompts",
            tiny["prompts"],
            "--model",
            tiny["model"],
            "--reward",
            "train_fixtures:redness",
            "--steps",
            "1",
            "--seed",
            "3",
            "--out",
            str(tmp_path / "cli"),
            *sets,
        ],
    )
    assert r.exit_code == 0, r.output
    result = api.train(
        tiny["model"], tiny["prompts"], redness, overrides=FAST, steps=1, seed=3, out=tmp_path / "api"
    )
    cli_rows = [json.loads(line) for line in (tmp_path / "cli" / "metrics.jsonl").read_text().splitlines()]
    assert untimed(result.metrics) == untimed(cli_rows) and len(cli_rows) == 1
    configs = [yaml.safe_load((tmp_path / d / "config.yaml").read_text()) for d in ("cli", "api")]
    for c in configs:
        c.pop("out")
    assert configs[0] == configs[1]  # an importable function is recorded as module:function
    assert configs[1]["reward"] == "train_fixtures:redness"


def test_train_takes_report_to_and_locks_its_run_directory(tiny, tmp_path):
    from t2i_gcpo.outdir import lock_output

    out = tmp_path / "run"
    with lock_output(out):  # another command holds the folder: refused before anything is loaded
        with pytest.raises(UserError, match="is in use by"):
            api.train(tiny["model"], PROMPTS, redness, overrides=FAST, steps=1, out=out)
    with pytest.raises(UserError, match="report_to"):
        api.train(tiny["model"], PROMPTS, redness, overrides=FAST, steps=1, out=out, report_to="nope")
    assert not out.exists()
    api.train(tiny["model"], PROMPTS, redness, overrides=FAST, steps=1, out=out, report_to="none")
    assert yaml.safe_load((out / "config.yaml").read_text())["report_to"] == "none"
    assert not (out / ".t2i-gcpo.lock").exists()  # released when the run ended
    with pytest.raises(UserError, match="already holds a run; continue it with t2i-gcpo train --resume"):
        api.train(tiny["model"], PROMPTS, redness, overrides=FAST, steps=1, out=out)


def test_generate_gives_the_images_sample_writes(tiny, tmp_path):
    images = api.generate(tiny["model"], PROMPTS[:2], n=2, seed=5, cfg_scale=2)
    assert images.shape == (2, 2, 3, 16, 16)
    written = api.sample(PROMPTS[:2], tmp_path / "s", model=tiny["model"], n=2, seed=5, cfg_scale=2)
    assert written.prompts == PROMPTS[:2] and written.grid.is_file()
    for i in range(2):
        for k, path in enumerate(written.image_paths(i)):
            png = np.asarray(Image.open(path).convert("RGB"))
            mine = (images[i, k].clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
            assert np.array_equal(png, mine), (i, k)
    other = api.generate(tiny["model"], PROMPTS[:2], n=2, seed=6, cfg_scale=2)
    assert not torch.equal(other, images)  # the seed matters


def test_sample_locks_its_folder_and_a_resumed_folder_continues_only_with_its_cfg(tiny, tmp_path):
    from t2i_gcpo.outdir import lock_output

    out = tmp_path / "s"
    with pytest.raises(UserError, match="cfg_scale"):
        api.sample(PROMPTS[:1], out, model=tiny["model"], n=2, cfg_scale=math.nan)
    with lock_output(out):
        with pytest.raises(UserError, match="is in use by"):
            api.sample(PROMPTS[:1], out, model=tiny["model"], n=2)
    assert not out.exists()  # the folder made only for the lock is gone with it
    api.sample(PROMPTS[:1], out, model=tiny["model"], n=2, seed=5, cfg_scale=2)
    with pytest.raises(UserError, match=r"made with cfg_scale=2.0, this run asks for cfg_scale="):
        api.sample(PROMPTS[:2], out, model=tiny["model"], n=2, seed=5)  # no cfg_scale: the model's, not 2
    resumed = api.sample(PROMPTS[:2], out, model=tiny["model"], n=2, seed=5, cfg_scale=2)
    assert resumed.written == 2
    assert json.loads((out / "00001" / "generation.json").read_text())["cfg_scale"] == 2
    images = api.generate(tiny["model"], PROMPTS[:2], n=2, seed=5, cfg_scale=2)
    for k, path in enumerate(resumed.image_paths(1)):
        mine = (images[1, k].clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        assert np.array_equal(np.asarray(Image.open(path).convert("RGB")), mine), k
    assert not (out / ".t2i-gcpo.lock").exists()


def test_importing_the_api_loads_no_torch():
    import subprocess
    import sys

    code = (
        "import sys, t2i_gcpo; t2i_gcpo.api.train; from t2i_gcpo.api import credit_maps; "
        "assert 'torch' not in sys.modules; print('ok')"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "ok"


@pytest.mark.slow
def test_a_janus_policy_object_generates_trains_and_resumes(tmp_path):
    """docs/real_checkpoints.md's API path on a tiny random Janus: its initial weights are saved and
    a resume loads them (another family's save_pretrained than the ShapeWorld prior's)."""
    from tiny_models import build_tiny_janus

    ckpt = build_tiny_janus(tmp_path / "janus")
    policy = api.load_policy(f"janus:{ckpt}", dtype="float32")
    prompts = ["a photo of a cat", "a photo of two dogs"]
    images = api.generate(policy, prompts, n=2, seed=0)
    assert images.shape == (2, 2, 3, 8, 8) and 0 <= images.min() and images.max() <= 1
    fast = {**FAST, "rollout.cfg_scale": 5.0}
    out = tmp_path / "run"
    api.train(policy, prompts, redness, "gcpo-official", overrides=fast, steps=1, out=out)
    initial = api.load_policy(str(out / "initial_model"))
    base = api.load_policy(f"janus:{ckpt}", dtype="float32")
    for (name, a), (_, b) in zip(initial.state_dict().items(), base.state_dict().items()):
        assert torch.equal(a, b), name
    resumed = api.train(resume=out, steps=2, reward=redness)
    assert [r["step"] for r in resumed.metrics] == [1, 2]


def test_credit_maps_draws_each_prompt_and_measures_lift(tmp_path):
    out = tmp_path / "maps"
    with pytest.raises(UserError, match="unknown scheme"):
        api.credit_maps(PROMPTS[:2], out, schemes=("gcpo", "nope"))
    assert not out.exists()
    table = api.credit_maps(PROMPTS[:2], out, model="shapeworld", schemes=("gcpo", "uniform"), group_size=2)
    assert (
        (out / "00000.png").is_file()
        and (out / "00001.png").is_file()
        and (out / "credit_maps.html").is_file()
    )
    lifts = json.loads((out / "lift.json").read_text())
    assert len(lifts["uniform"]) == len(lifts["gcpo"]) == 4  # 2 prompts × G = 2
    defined = [v for v in lifts["uniform"] if not math.isnan(v)]  # the shipped model draws the objects
    assert defined and all(v == pytest.approx(1.0) for v in defined)  # uniform credit lifts nothing
    assert "gcpo" in table and "wrote 2 figures" in table
    with pytest.raises(UserError, match=r"made by `credit-map` with --prompt .*give --overwrite"):
        api.credit_maps(PROMPTS[:1], out, model="shapeworld", schemes=("uniform",), group_size=2)
    api.credit_maps(PROMPTS[:1], out, model="shapeworld", schemes=("uniform",), group_size=2, overwrite=True)
    assert (out / "00000.png").is_file() and not (out / "00001.png").exists()  # the earlier run's figure


def test_a_python_object_that_is_not_a_policy_is_refused_naming_what_it_lacks():
    class Half(torch.nn.Module):  # a generator with rollout and decode, nothing else of the protocol
        def rollout(self, *a): ...

        def decode(self, *a): ...

    with pytest.raises(UserError, match=r"lacks output, layout, .*capabilities.*keep_full_precision"):
        api.generate(Half(), ["a photo of a red circle"], n=1)
