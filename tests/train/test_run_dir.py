"""Run directories that can always be continued, never executed, never shared (issue 38, items 3, 4, 7,
10, 11): no pickle is read from a run directory, one command at a time holds an output folder, a run
stopped before its first checkpoint resumes from step 0, a folder that is not a run is never written
over, and a stop signal in the final evaluation leaves the resume line and the report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import t2i_gcpo.train.trainer as trainer_mod
from t2i_gcpo.errors import UserError, one_line
from t2i_gcpo.outdir import LOCK_NAME, lock_output
from t2i_gcpo.policies.base import PromptRecord, Rollout, SamplingParams
from t2i_gcpo.rewards.base import RewardOutput
from t2i_gcpo.train.batch import Batch
from t2i_gcpo.train.checkpoint import carry_types, latest_checkpoint, load_carry
from t2i_gcpo.train.run import ResumeOptions, prepare, run
from t2i_gcpo.train.tensor_tree import load_tree, save_tree

from cli_helpers import cli, error_line
from repo_paths import TESTS
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file

FAST = (
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.cfg_scale=2",
    "optim.lr=3e-3",
    "sample_every=0",
    "eval_every=-1",
)

# a reward that is slow (a step lasts long enough to be interrupted) or NaN when the test asks
FLAKY = """
import os, time
from train_fixtures import redness

def flaky(images, prompts, metadata):
    if os.environ.get("T2I_TEST_NAN_REWARD") and len(images) > 2:  # past the dry sample (a group of 2)
        out = redness(images, prompts, metadata)
        out.scores[:] = float("nan")
        return out
    if os.environ.get("T2I_TEST_SLOW_REWARD"):
        time.sleep(float(os.environ["T2I_TEST_SLOW_REWARD"]))
    return redness(images, prompts, metadata)
"""

# a process that holds an output folder's lock until it is killed
HOLD_LOCK = """
import sys, time
from t2i_gcpo.outdir import lock_output
lock = lock_output(sys.argv[1], sys.argv[2])  # held while referenced
print("locked", flush=True)
time.sleep(300)
"""

TRUST = ResumeOptions(trust_run_code=True)  # these runs' rewards are test modules of ours


class Payload:
    """An object whose unpickling writes a marker file: what a crafted run directory could hold."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    (root / "flakyfix.py").write_text(FLAKY)
    return {
        "root": root,
        "model": str(tiny_policy_dir(root)),
        "prompts": str(write_prompt_file(root / "p.jsonl")),
        "eval": str(write_prompt_file(root / "eval.jsonl", n=2)),
    }


@pytest.fixture(autouse=True)
def setup(tiny, monkeypatch):
    monkeypatch.syspath_prepend(str(tiny["root"]))
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)  # matplotlib: seconds per run


def flags(tiny, out, steps):
    return dict(
        prompts=tiny["prompts"],
        model=tiny["model"],
        reward="flakyfix:flaky",
        out=str(out),
        steps=steps,
        seed=0,
    )


def train(tiny, out, steps, extra=()):
    return run(prepare(algo="gcpo", flags=flags(tiny, out, steps), overrides=(*FAST, *extra)))


def cli_args(tiny, out, steps, extra=()):
    args = [
        "train",
        "--prompts",
        tiny["prompts"],
        "--model",
        tiny["model"],
        "--reward",
        "flakyfix:flaky",
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--seed",
        "0",
    ]
    for s in (*FAST, *extra):
        args += ["--set", s]
    return args


def subprocess_env(tiny, **extra) -> dict:
    path = os.pathsep.join([str(tiny["root"]), str(TESTS), os.environ.get("PYTHONPATH", "")])
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": str(torch.get_num_threads()),
        "PYTHONPATH": path,
        **extra,
    }


def start_train(tiny, out, steps, extra=(), **env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "t2i_gcpo.cli", *cli_args(tiny, out, steps, extra)],
        env=subprocess_env(tiny, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition, p: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.time() + seconds
    while not condition():
        assert p.poll() is None, p.communicate()
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    ckpt = run_dir / "checkpoints" / f"step_{step:06d}" / "model" / "prior" / "model.safetensors"
    return load_file(str(ckpt))


def assert_same_run(a: Path, b: Path, step: int) -> None:
    ra, rb = rows(a), rows(b)
    assert [r["step"] for r in ra] == [r["step"] for r in rb]
    for x, y in zip(ra, rb):
        for k in x:
            if not k.startswith("time/"):
                if y[k] is None:  # e.g. a paired interval over a single prompt: none in either run
                    assert x[k] is None, (x["step"], k)
                else:
                    assert x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-7), (x["step"], k)
    wa, wb = weights(a, step), weights(b, step)
    assert all(torch.equal(wa[k], wb[k]) for k in wa), "the resumed run's weights are bit-identical"


# ------------------------------------------------------------------------------- item 3: no pickle


def test_carried_groups_round_trip_through_safetensors_and_json(tmp_path):
    rollout = Rollout(
        tokens=torch.arange(6).reshape(2, 3),
        mask=torch.ones(2, 3, dtype=torch.bool),
        step=torch.zeros(2, 3, dtype=torch.long),
        logp={"pos": torch.randn(2, 3, dtype=torch.bfloat16)},
        prompts=[PromptRecord("a", meta={"tag": "x", "include": [{"count": 1}]}), PromptRecord("b")],
        group_size=2,
        sampling=SamplingParams(temperature=0.5),
        max_len=7,
        state={"prompt_ids": [[1, 2], [3]], "remask": torch.ones(2, 1, 3)},
    )
    details = [
        {"strict": True, "partial": 0.1 + 0.2, "box": (1.5, 2.0), "grid": torch.eye(2).bool(), 3: None},
        {"strict": False, "partial": float("nan"), "__odd": "x", "np": __import__("numpy").float32(0.25)},
    ]
    batch = Batch(
        rollout,
        torch.tensor([0.5, -0.5]),
        RewardOutput(torch.tensor([1.0, 0.0]), details),
        torch.rand(2, 3, 4, 4),
    )
    save_tree(tmp_path, "carry", [None, batch])
    none, back = load_tree(tmp_path, "carry", "the carried groups", carry_types())
    assert none is None and isinstance(back, Batch) and isinstance(back.rollout, Rollout)
    for a, b in (
        (back.rollout.tokens, rollout.tokens),
        (back.rollout.logp["pos"], rollout.logp["pos"]),
        (back.outputs, batch.outputs),
        (back.rollout.state["remask"], rollout.state["remask"]),
    ):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert back.rollout.prompts == rollout.prompts and back.rollout.sampling == rollout.sampling
    assert back.rollout.max_len == 7 and back.rollout.state["prompt_ids"] == [[1, 2], [3]]
    d0, d1 = back.reward.details
    assert (
        d0["partial"] == 0.1 + 0.2 and d0["box"] == (1.5, 2.0) and d0[3] is None
    )  # exact float, tuple, int key
    assert torch.equal(d0["grid"], torch.eye(2).bool()) and d1["__odd"] == "x" and d1["np"] == 0.25
    assert d1["partial"] != d1["partial"]  # NaN kept
    # only the allow-listed types are ever built
    tree = json.loads((tmp_path / "carry.json").read_text())
    tree[1]["__dataclass__"] = "Popen"
    (tmp_path / "carry.json").write_text(json.dumps(tree))
    with pytest.raises(UserError, match="'Popen' is not a type this file may hold"):
        load_tree(tmp_path, "carry", "the carried groups", carry_types())
    (tmp_path / "carry.safetensors").unlink()  # half of a carry is an error, not "no carried groups"
    with pytest.raises(UserError, match="cannot read the carried groups"):
        load_carry(tmp_path)


def test_a_crafted_pickle_in_a_run_directory_never_runs(tiny, tmp_path, capsys):
    """A run directory is something people download: its carry.pt or optimizer.pt (earlier versions
    wrote both with torch.save) must not run code on --resume, nor in `compare`."""
    comparison = tmp_path / "cmp"
    run_dir = comparison / "gcpo" / "seed0"
    train(tiny, run_dir, steps=1)
    ckpt = latest_checkpoint(run_dir)
    assert not list(ckpt.glob("*.pt")), "nothing in a checkpoint is a pickle"
    marker = tmp_path / "payload-ran"
    torch.save(Payload(marker), tmp_path / "probe.pt")
    torch.load(tmp_path / "probe.pt", weights_only=False)  # the payload is real: unpickled, it runs
    assert marker.exists()
    marker.unlink()

    torch.save(Payload(marker), ckpt / "carry.pt")
    code, _, err = cli(capsys, "train", "--resume", run_dir, "--steps", 2, "--trust-run-code")
    line = error_line(err)
    assert code == 2 and "carry.pt is a pickle" in line and "delete it to resume" in line, line
    code, _, err = cli(
        capsys,
        "compare",
        "--algos",
        "gcpo",
        "--seeds",
        1,
        "--steps",
        2,
        "--model",
        tiny["model"],
        "--prompts",
        tiny["prompts"],
        "--reward",
        "flakyfix:flaky",
        "--out",
        comparison,
    )
    assert code == 2 and "carry.pt is a pickle" in error_line(err)
    assert not marker.exists(), "the payload never ran"

    (ckpt / "carry.pt").unlink()  # an earlier version's optimizer.pt: read weights-only, refused
    for name in ("optimizer.safetensors", "optimizer.json"):
        (ckpt / name).unlink()
    torch.save(Payload(marker), ckpt / "optimizer.pt")
    code, _, err = cli(capsys, "train", "--resume", run_dir, "--steps", 2, "--trust-run-code")
    assert code == 2 and "optimizer.pt: cannot read the optimizer state" in error_line(err)
    assert not marker.exists(), "the payload never ran"


# ----------------------------------------------------------------------------- item 4: one at a time


@pytest.mark.slow  # a real second process, training until it is stopped
def test_a_second_train_on_the_same_out_is_refused_naming_the_first(tiny, tmp_path, capsys):
    out = tmp_path / "run"
    first = start_train(tiny, out, 40, ("save_every=1",), T2I_TEST_SLOW_REWARD="0.3")
    try:
        wait_for(lambda: (out / "metrics.jsonl").is_file(), first)
        code, _, err = cli(capsys, *cli_args(tiny, out, 40))
        line = error_line(err)
        assert code == 2 and f"in use by pid {first.pid} on " in line and "t2i-gcpo train" in line, line
        code, _, err = cli(capsys, "train", "--resume", out)
        assert code == 2 and f"in use by pid {first.pid}" in error_line(err)
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=300)
    assert first.returncode == 143, err[-2000:]
    steps = [r["step"] for r in rows(out)]
    assert steps == list(range(1, len(steps) + 1)), "one run wrote the metrics, no row twice"
    assert not (out / LOCK_NAME).exists(), "released on exit"


def test_every_output_command_is_refused_while_another_holds_the_folder_and_a_dead_holder_is_taken_over(
    tiny, tmp_path, capsys
):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(out), "t2i-gcpo sample --out somewhere"],
        env=subprocess_env(tiny),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        for args in (
            ["sample", "--prompts", TESTS.parent / "prompts" / "shapeworld_test.txt", "--out", out],
            ["eval", "shapeworld", "--out", out],
            ["credit-map", "--prompt", "a photo of a red circle", "--out", out],
            ["compare", "--algos", "gcpo", "--seeds", 1, "--out", out],
            ["train", "--resume", out],
        ):
            code, _, err = cli(capsys, *args)
            line = error_line(err)
            assert code == 2 and f"in use by pid {holder.pid} on " in line, (args[0], line)
            assert "(t2i-gcpo sample --out somewhere)" in line
    finally:
        holder.kill()  # kill -9: no clean-up; the lock file stays behind
        holder.wait()
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == holder.pid
    with lock_output(out, "t2i-gcpo eval") as lock:
        assert json.loads((out / LOCK_NAME).read_text())["command"] == "t2i-gcpo eval"
        with pytest.raises(UserError, match=f"in use by pid {os.getpid()} .*t2i-gcpo eval"):
            lock_output(out)  # a second lock from anywhere, this process included, is refused
    assert f"took over the lock of pid {holder.pid}" in capsys.readouterr().err
    assert not (out / LOCK_NAME).exists() and lock._fd is None
    # a lock file naming a process that no longer runs (and holding no lock) is taken over too
    (out / LOCK_NAME).write_text(
        json.dumps({"pid": 2**22 + 7, "host": "elsewhere", "command": "t2i-gcpo train"})
    )
    with lock_output(out):
        pass
    assert "took over the lock of pid 4194311 on elsewhere (t2i-gcpo train)" in capsys.readouterr().err


def test_a_refused_lock_leaves_no_folder_behind(tmp_path):
    with lock_output(tmp_path / "a"):
        with pytest.raises(UserError):
            lock_output(tmp_path / "a")
        with lock_output(tmp_path / "b" / "c"):
            assert (tmp_path / "b" / "c").is_dir()
    assert (tmp_path / "a").is_dir() is False and not (tmp_path / "b").exists(), "made only for the lock"


# ------------------------------------------------------------------- item 7: resume before the first save


EVALS = ("eval_every=2", "eval_images_per_prompt=2")


def stopped_early_extra(tiny) -> tuple[str, ...]:
    return ("save_every=50", *EVALS, f"eval_prompts={tiny['eval']}")


@pytest.fixture(scope="module")
def uninterrupted(tiny, tmp_path_factory) -> Path:
    """The 3-step run that runs stopped in step 1 or 2 must become once resumed (no checkpoint before the
    end: save_every 50): base evaluation, steps, final evaluation."""
    full = tmp_path_factory.mktemp("uninterrupted") / "full"
    with pytest.MonkeyPatch.context() as m:
        m.syspath_prepend(str(tiny["root"]))
        m.setattr(trainer_mod.Trainer, "_report", lambda self: None)
        train(tiny, full, 3, stopped_early_extra(tiny))
    assert [r["step"] for r in rows(full)] == [0, 1, 2, 3, 3]
    return full


def test_a_run_stopped_before_its_first_checkpoint_resumes_from_step_0(
    tiny, uninterrupted, tmp_path, monkeypatch, capsys
):
    """A crash or a NaN reward in step 1 or 2: no checkpoint yet (save_every 50). A fresh start points at
    --resume, and --resume starts over from the saved config: the same run as one never interrupted (base
    evaluation at step 0 included, once). A double Ctrl-C: the slow test below."""
    extra = stopped_early_extra(tiny)
    crashed = tmp_path / "crashed"
    real_step = trainer_mod.Trainer.train_step

    def crash_at_2(t, step):
        if step == 2:
            raise RuntimeError("simulated crash")
        return real_step(t, step)

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", crash_at_2)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(tiny, crashed, 3, extra)
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", real_step)
    assert latest_checkpoint(crashed) is None
    code, _, err = cli(capsys, *cli_args(tiny, crashed, 3, extra))
    assert code == 2 and f"continue it with t2i-gcpo train --resume {crashed} --reward" in error_line(err)
    run(prepare(resume_options=TRUST, resume_dir=crashed))
    assert_same_run(uninterrupted, crashed, 3)

    nan = tmp_path / "nan"  # NaN from the first training step on: the dry sample before the run passes
    monkeypatch.setenv("T2I_TEST_NAN_REWARD", "1")
    code, _, err = cli(capsys, *cli_args(tiny, nan, 3, extra))
    assert code == 2 and "error:" in err and latest_checkpoint(nan) is None
    monkeypatch.delenv("T2I_TEST_NAN_REWARD")
    run(prepare(resume_options=TRUST, resume_dir=nan))
    assert_same_run(uninterrupted, nan, 3)


@pytest.mark.slow
def test_a_double_ctrl_c_in_step_1_stops_at_once_and_resumes_from_step_0(tiny, uninterrupted, tmp_path):
    """Ctrl-C twice in step 1 of a real process (its reward takes 3 s a call): it stops at once, before any
    checkpoint, says how to start again, and --resume gives the uninterrupted run."""
    stopped = tmp_path / "stopped"
    p = start_train(tiny, stopped, 3, stopped_early_extra(tiny), T2I_TEST_SLOW_REWARD="3")
    wait_for(lambda: (stopped / "metrics.jsonl").is_file(), p)  # the base evaluation's row: step 1 next
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert (
        f"interrupted before the first checkpoint; start it again from step 0 with: t2i-gcpo train "
        f"--resume {stopped}" in out
    )
    assert latest_checkpoint(stopped) is None
    run(prepare(resume_options=TRUST, resume_dir=stopped))
    assert_same_run(uninterrupted, stopped, 3)


def test_a_ctrl_c_before_the_loop_says_how_to_continue(tiny, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"

    def interrupted(self):
        raise KeyboardInterrupt  # Python's own handler: the loop has not installed its handlers yet

    monkeypatch.setattr(trainer_mod.Trainer, "fit", interrupted)
    code, stdout, err = cli(capsys, *cli_args(tiny, out, 2))
    assert code == 130 and "Traceback" not in err
    assert f"interrupted before training began; continue with: t2i-gcpo train --resume {out}" in stdout
    monkeypatch.undo()
    monkeypatch.syspath_prepend(str(tiny["root"]))
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)
    run(prepare(resume_options=TRUST, resume_dir=out))
    assert [r["step"] for r in rows(out)] == [1, 2]


# ------------------------------------------------------------------------ item 10: a folder of the user's


def test_out_at_a_folder_that_is_not_a_run_is_refused_and_left_alone(tiny, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    for name, text in (("config.yaml", "my: notes\n"), ("report.html", "<p>mine</p>"), ("eval.json", "{}")):
        (mine / name).write_text(text)
    before = {p.name: p.read_bytes() for p in mine.iterdir()}
    code, _, err = cli(capsys, *cli_args(tiny, mine, 1))
    line = error_line(err)
    assert code == 2 and "is not empty and not a run directory (it holds config.yaml and 2 more)" in line, (
        line
    )
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == before
    empty = tmp_path / "empty"
    empty.mkdir()
    job = prepare(algo="gcpo", flags=flags(tiny, empty, 1), overrides=FAST)  # an empty folder is fine
    job.lock.release()


# ---------------------------------------------------------------- item 11: a stop in the final evaluation


@pytest.mark.slow  # a real process stopped by signals in its final evaluation (its reward takes 2 s a call)
def test_a_stop_signal_in_the_final_evaluation_prints_the_resume_line_and_writes_the_report(tiny, tmp_path):
    out = tmp_path / "run"
    extra = ("eval_every=0", "eval_images_per_prompt=2", f"eval_prompts={tiny['eval']}", "save_every=1")
    p = start_train(tiny, out, 2, extra, T2I_TEST_SLOW_REWARD="2")
    wait_for(lambda: latest_checkpoint(out) is not None and latest_checkpoint(out).name == "step_000002", p)
    time.sleep(0.5)  # in the final evaluation (its reward takes 2 s a call)
    p.send_signal(signal.SIGINT)
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)  # a late second Ctrl-C, while the report is written
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    assert (
        f"interrupted during the final evaluation: checkpoint at step 2; continue with: t2i-gcpo "
        f"train --resume {out}" in stdout
    )
    assert (out / "report.html").is_file() and not (out / "eval.json").exists()
    run(prepare(resume_options=TRUST, resume_dir=out))
    assert [r["step"] for r in rows(out)] == [1, 2, 2] and (out / "eval.json").is_file()


# --------------------------------------------------------------------------- item 12: long words cut


def test_a_huge_word_is_not_echoed_whole_in_an_error_line(capsys, tmp_path):
    word = "x" * 10_000_000
    line = one_line(f"unknown word '{word}' in prompt 3")
    assert len(line) < 300 and line.endswith("in prompt 3") and "…" in line
    code, _, err = cli(
        capsys, "credit-map", "--prompt", f"a photo of a {word[:1_000_000]}", "--out", tmp_path
    )
    line = error_line(err)
    assert code == 2 and "xxxx…" in line and len(line) < 1000, line[:2000]
