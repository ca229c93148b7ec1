"""A resume loses no metrics row (issue 59): the last row of metrics.jsonl, torn (a crash while the disk
held half of it) or lost, although its step's checkpoint exists, was dropped on resume and never written
again. Each checkpoint now keeps its step's row (trainer_state.json) and the rows before it are synced to the
disk first; a resume puts the row back where the file lost it."""

from __future__ import annotations

import json

import pytest

import t2i_gcpo.train.trainer as trainer_mod
from t2i_gcpo.train.checkpoint import load_trainer_state
from t2i_gcpo.train.run import ResumeOptions, prepare, run

from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file

FAST = (
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.cfg_scale=2",
    "optim.lr=3e-3",
    "sample_every=0",
    "save_every=1",
    "eval_every=-1",
)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A run of 2 steps, a checkpoint at each."""
    root = tmp_path_factory.mktemp("rows")
    flags = dict(
        prompts=str(write_prompt_file(root / "p.jsonl")),
        model=str(tiny_policy_dir(root)),
        reward="train_fixtures:redness",
        out=str(root / "run"),
        steps=2,
        seed=0,
        report_to="none",
    )
    with pytest.MonkeyPatch.context() as m:
        m.setattr(trainer_mod.Trainer, "_report", lambda self: None)
        run(prepare(algo="grpo", flags=flags, overrides=FAST))
    return root / "run"


def rows(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("damage", ["torn", "lost"])
def test_the_checkpoints_row_is_put_back_on_resume(finished, tmp_path, monkeypatch, damage):
    import shutil

    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    before = rows(out)
    assert [r["step"] for r in before] == [1, 2]
    assert load_trainer_state(out / "checkpoints" / "step_000002")["metrics_row"] == before[1]
    text = (out / "metrics.jsonl").read_text()
    last = text.rstrip("\n").rpartition("\n")[2]
    cut = text[: len(text) - len(last) - 1] + ("\n" + last[: len(last) // 2] if damage == "torn" else "\n")
    (out / "metrics.jsonl").write_text(cut)  # step 2's row half written, or never on the disk
    run(prepare(resume_options=ResumeOptions(trust_run_code=True), resume_dir=out, steps=3))
    after = rows(out)
    assert [r["step"] for r in after] == [1, 2, 3]
    assert after[:2] == before, "the rows up to the checkpoint are the run's own, none lost"
