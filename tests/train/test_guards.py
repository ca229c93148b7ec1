"""Nothing silently wrong (issue 38): every config value checked by type and range before any work,
the NaN guard in training, one loading check for every family's checkpoint, everything a run needs
checked before its directory exists, and the inputs that used to end in a traceback."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import t2i_gcpo.train.trainer as trainer_mod
from t2i_gcpo.cli import main
from t2i_gcpo.config import load_config
from t2i_gcpo.errors import UserError
from t2i_gcpo.train.checkpoint import latest_checkpoint

import train_fixtures
from tiny_models import tiny_policy_dir
from train_fixtures import write_prompt_file

FAST = [
    "rollout.prompts_per_step=2",
    "rollout.group_size=4",
    "rollout.cfg_scale=2",
    "optim.lr=3e-3",
    "sample_every=0",
    "save_every=1",
    "eval_every=-1",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {"model": str(tiny_policy_dir(root)), "prompts": str(write_prompt_file(root / "p.jsonl"))}


@pytest.fixture(autouse=True)
def no_html_report(monkeypatch):
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)


def cli(*args: str) -> tuple[int, str]:
    """Run the console script in process: (exit status, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, err.getvalue()


def one_line_error(code: int, err: str, needle: str, status: int = 2) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip() and "%|" not in ln]  # tqdm bars aside
    assert code == status and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err


def train_args(tiny, out, steps=1, reward="train_fixtures:redness", sets=()):
    args = [
        "train",
        "--prompts",
        tiny["prompts"],
        "--model",
        tiny["model"],
        "--reward",
        reward,
        "--out",
        str(out),
        "--steps",
        str(steps),
    ]
    for s in (*FAST, *sets):
        args += ["--set", s]
    return args


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt / "model" / "prior" / "model.safetensors"))


# ----------------------------------------------------------------- 1, 8. config values: type and range


@pytest.mark.parametrize(
    "override, needle",
    [
        ("optim.grad_clip=-1", "config key 'optim.grad_clip': must be ≥ 0"),  # reversed the update
        ("optim.grad_clip=-inf", "config key 'optim.grad_clip'"),  # NaN weights
        ("advantage.eps=0", "config key 'advantage.eps': must be ≥ 1e-12"),  # NaN weights, exit 0
        ("rollout.top_k=-1", "config key 'rollout.top_k': must be ≥ 0"),  # traceback in topk
        ("optim.minibatches=0", "config key 'optim.minibatches': must be ≥ 1"),  # ZeroDivisionError
        ("optim.minibatches=3", "config key 'optim.minibatches': must divide"),
        ("optim.weight_decay=-0.1", "config key 'optim.weight_decay': must be ≥ 0"),  # torch's ValueError
        ("optim.lr=1e300", "config key 'optim.lr': must be in (0, 1]"),  # overflow inside AdamW
        ("optim.weight_decay=1e5", "optim.lr × optim.weight_decay must be ≤ 1"),
        ("rollout.temperature=1e-300", "config key 'rollout.temperature'"),  # logits / T overflow
        ("rollout.cfg_scale=1e300", "config key 'rollout.cfg_scale': must be in [0, 1000]"),
        ("credit.dgpo.kappa=-1", "config key 'credit.dgpo.kappa': must be ≥ 0"),
        ("seed=-1", "config key 'seed'"),
        ("seed=36893488147419103232", "config key 'seed'"),  # 2**65: torch.manual_seed overflows
        ("credit.critical.first_fraction=0", None),  # alone it is fine ...
    ],
)
def test_out_of_range_values_are_one_line_naming_the_key_before_any_work(tmp_path, override, needle):
    if needle is None:
        load_config(overrides=[override])
        return
    code, err = cli("train", "--prompts", "nowhere.txt", "--out", str(tmp_path / "run"), "--set", override)
    one_line_error(code, err, needle)  # the config is checked before the prompt file is even looked at
    assert not (tmp_path / "run").exists()


def test_a_cross_field_condition_names_its_section():
    sets = [f"credit.critical.{k}_fraction=0" for k in ("first", "entropy", "similarity")]
    with pytest.raises(UserError, match="config key 'credit.critical': at least one of"):
        load_config(overrides=sets)


def test_help_config_states_each_range(tmp_path):
    from t2i_gcpo.config import describe

    docs = dict((k, text) for k, _, text in describe())
    assert docs["optim.grad_clip"].endswith("Accepts: ≥ 0.")
    assert docs["rollout.top_p"].endswith("Accepts: in (0, 1].")


def test_a_binary_config_file_is_one_line(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_bytes(bytes(range(256)) * 4)
    code, err = cli("train", "--prompts", "p.txt", "--config", str(f))
    one_line_error(code, err, "not a YAML file")


# --------------------------------------------------------------------------- 6. --cfg nan | inf


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
@pytest.mark.parametrize(
    "command",
    [
        ["sample", "--prompts", "prompts/shapeworld_test.txt"],
        ["eval", "shapeworld"],
        ["credit-map", "--prompt", "a photo of a red circle"],
    ],
    ids=["sample", "eval", "credit-map"],
)
def test_cfg_nan_or_inf_is_refused_before_any_work(tmp_path, command, value):
    out = tmp_path / "out"
    code, err = cli(*command, "--out", str(out), f"--cfg={value}")
    one_line_error(code, err, "--cfg must be")
    assert not out.exists()


# ------------------------------------------------------------------------------------ 2. NaN guard


def test_a_nan_loss_stops_the_run_keeping_the_last_good_checkpoint(tiny, tmp_path, monkeypatch):
    """Rewards of ±3e38 at step 3 overflow the group mean: NaN advantages, NaN loss. The run stops
    there with one line and exit 1, writes no NaN weights, and resumes from step 2."""
    monkeypatch.setitem(train_fixtures.HUGE_FROM_CALL, "call", 0)
    monkeypatch.setitem(train_fixtures.HUGE_FROM_CALL, "from", 4)  # call 1 scores the dry sample
    out = tmp_path / "run"
    code, err = cli(*train_args(tiny, out, steps=4, reward="train_fixtures:huge_from_call"))
    one_line_error(code, err, "step 3: the loss became NaN or inf", status=1)
    assert "last good checkpoint (step 2)" in err
    assert f"t2i-gcpo train --resume {out} --steps 2 --reward train_fixtures:huge_from_call" in err
    assert latest_checkpoint(out).name == "step_000002"
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    for ckpt in (out / "checkpoints").glob("step_*"):
        assert all(torch.isfinite(t).all() for t in weights(ckpt).values()), ckpt
    code, err = cli(
        "train", "--resume", str(out), "--steps", "2", "--trust-run-code"
    )  # ends it at its good step
    assert code == 0, err


def test_non_finite_weights_after_a_step_are_never_saved(tiny, tmp_path, monkeypatch):
    """Weights that an update turns to inf (injected into AdamW's step) stop the run at that step."""
    step = torch.optim.AdamW.step

    def overflowing_step(self, *args, **kwargs):
        result = step(self, *args, **kwargs)
        self.param_groups[0]["params"][0].data.view(-1)[0] = float("inf")
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", overflowing_step)
    out = tmp_path / "run"
    code, err = cli(*train_args(tiny, out, steps=2))
    one_line_error(code, err, "step 1: the updated weights became NaN or inf", status=1)
    kept = latest_checkpoint(out)  # none, or the base model's at step 0
    assert ("no checkpoint was written" in err and kept is None) or "(step 0)" in err, err
    assert kept is None or all(torch.isfinite(t).all() for t in weights(kept).values())


# ------------------------------------------------------------- 5. one loading check for every family


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _nan(p: Path) -> None:
    from safetensors.torch import save_file

    state = load_file(str(p))
    state[sorted(state)[0]].view(-1)[0] = float("nan")
    save_file(state, str(p), metadata={"format": "pt"})


def _int_weights(p: Path) -> None:
    from safetensors.torch import save_file

    state = load_file(str(p))
    name = sorted(state)[0]
    state[name] = torch.zeros(state[name].shape, dtype=torch.complex64)
    save_file(state, str(p), metadata={"format": "pt"})


@pytest.mark.parametrize(
    "damage, needle",
    [(_truncate, "cannot read the weights"), (_nan, "NaN/inf values"), (_int_weights, "not a weight type")],
    ids=["truncated", "nan", "dtype"],
)
def test_text_checkpoints_get_the_check_image_ones_get(tmp_path, damage, needle):
    """A truncated model.safetensors was a traceback and NaN weights were trained on: now the same
    one-line error as a ShapeWorld checkpoint, before any run directory exists."""
    from t2i_gcpo.policies.registry import shipped_folder

    model = tmp_path / "model"
    shutil.copytree(shipped_folder("arithmetic"), model)
    damage(model / "model.safetensors")
    out = tmp_path / "run"
    code, err = cli(
        "train",
        "--model",
        f"text:{model}",
        "--prompts",
        "prompts/arithmetic_train.jsonl",
        "--out",
        str(out),
        "--steps",
        "1",
    )
    one_line_error(code, err, f"{model / 'model.safetensors'}: ")
    assert needle in err and not out.exists()


def test_every_family_goes_through_the_same_check():
    """One function reads the ShapeWorld priors' and VQ's files; the transformers / diffusers families
    check their folders with its streaming twin before loading; LlamaGen's torch files pass
    its tensor check."""
    import inspect

    from t2i_gcpo.policies import amused, janus, meissonic, prior_folder, text
    from t2i_gcpo.tokenizers import vq

    assert "read_weights" in inspect.getsource(vq.load_weights)
    assert "load_weights" in inspect.getsource(prior_folder.load_prior_folder)
    for family in (text.TextPolicy, janus.JanusPolicy, amused.AmusedPolicy, meissonic.MeissonicPolicy):
        assert "check_weight_files(path)" in inspect.getsource(family.from_pretrained), family
    # LlamaGen's torch files go through the same per-tensor check, its T5 folder through the folder check
    from t2i_gcpo import weights
    from t2i_gcpo.policies import llamagen

    assert "read_torch_weights" in inspect.getsource(llamagen.LlamaGenPolicy.from_pretrained)
    assert "check_tensor(" in inspect.getsource(weights.read_torch_weights)
    assert "check_weight_files(folder)" in inspect.getsource(llamagen.load_t5)


# --------------------------------------------------------------- 8. what used to be a traceback


def test_a_reward_of_the_other_kind_is_one_line(tmp_path):
    out = tmp_path / "run"
    code, err = cli(
        "train",
        "--model",
        "arithmetic",
        "--reward",
        "shapeworld",
        "--prompts",
        "prompts/arithmetic_train.jsonl",
        "--out",
        str(out),
    )
    one_line_error(
        code, err, "reward 'shapeworld' scores images, but the model writes text: use 'arithmetic'"
    )
    code, err = cli(
        "train", "--reward", "arithmetic", "--prompts", "prompts/shapeworld_train.txt", "--out", str(out)
    )
    one_line_error(code, err, "reward 'arithmetic' scores text, but the model writes images")
    code, err = cli(
        "credit-map",
        "--model",
        "arithmetic",
        "--reward",
        "shapeworld",
        "--prompt",
        "1+2=?",
        "--out",
        str(out),
    )
    one_line_error(code, err, "reward 'shapeworld' scores images")
    assert not out.exists()


def test_a_question_with_a_thousand_operators_is_one_line(tmp_path):
    from t2i_gcpo.worlds.arithmetic import parse_question

    prompts = tmp_path / "long.txt"
    prompts.write_text("+".join(["1"] * 1001) + "=?\n")
    code, err = cli(
        "credit-map", "--model", "arithmetic", "--prompts", str(prompts), "--out", str(tmp_path / "o")
    )
    one_line_error(code, err, "has 1000 operators, more than this world's 200")
    assert parse_question("+".join(["1"] * 201)).answer == 201  # the limit itself still parses


def test_overwrite_refuses_a_prompt_folder_that_is_a_symbolic_link(tmp_path):
    from t2i_gcpo.eval.layout import clear_layout

    target = tmp_path / "elsewhere"
    (target / "samples").mkdir(parents=True)
    (target / "samples" / "0000.png").write_bytes(b"")
    out = tmp_path / "out"
    out.mkdir()
    (out / "00000").symlink_to(target)
    with pytest.raises(UserError, match="00000 is a symbolic link"):
        clear_layout(out)
    assert (target / "samples" / "0000.png").exists() and (out / "00000").is_symlink()


# ---------------------------------------------- 9. everything checked before the run directory exists

BROKEN_REWARDS = """
def raises(images, prompts, metadata):
    raise ValueError("my reward is broken")

def nan(images, prompts, metadata):
    return [float("nan")] * len(prompts)
"""


@pytest.mark.parametrize("name, needle", [("raises", "my reward is broken"), ("nan", "returned NaN/inf")])
def test_a_failing_user_reward_leaves_no_run_directory(tiny, tmp_path, name, needle):
    module = tmp_path / "broken_rewards.py"
    module.write_text(BROKEN_REWARDS)
    out = tmp_path / "run"
    code, err = cli(*train_args(tiny, out, reward=f"{module}:{name}"))
    one_line_error(code, err, needle)
    assert "on a dry sample, before the run started" in err and not out.exists()


def test_text_prompts_without_answers_leave_no_run_directory(tmp_path):
    prompts = tmp_path / "q.txt"
    prompts.write_text("3*4=?\nWhat is two plus two?\n")  # the world's expressions carry their answer
    out = tmp_path / "run"
    code, err = cli("train", "--model", "arithmetic", "--prompts", str(prompts), "--out", str(out))
    one_line_error(code, err, f"{prompts}: question 'What is two plus two?' has no answer")
    assert not out.exists()


def test_prompts_the_model_cannot_read_leave_no_run_directory(tiny, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("a photo of a zebra\n")
    out = tmp_path / "run"
    code, err = cli("train", "--prompts", str(prompts), "--model", tiny["model"], "--out", str(out))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert not out.exists()


# --------------------------------------------------------------- 13. answers and impossible metadata


def test_the_arithmetic_reward_reads_thousands_commas_as_problem_files_do():
    from t2i_gcpo.rewards.forms.arithmetic import ArithmeticReward
    from t2i_gcpo.worlds.arithmetic.files import answer_from_text

    assert answer_from_text("#### 2,000") == 2000
    meta = [{"question": "How many?", "answer": 2000, "steps": None}] * 3
    out = ArithmeticReward()(["#### 2,000", "#### 2000", "#### 2,00"], ["How many?"] * 3, meta)
    assert out.scores.tolist() == [1.0, 1.0, 0.0]


@pytest.mark.parametrize(
    "row, needle",
    [
        (
            {"tag": "counting", "include": [{"class": "circle", "count": 10**9}], "prompt": "circles"},
            "requires 1000000000 objects; a scene holds at most 6",
        ),
        (
            {
                "tag": "two_object",
                "include": [{"class": "circle", "count": 1}, {"class": "square", "count": 1}],
                "exclude": [{"class": "circle", "count": 1}],
                "prompt": "a photo of a circle and a square",
            },
            "include[0] requires 1 circle and exclude[0] allows fewer than 1",
        ),
    ],
    ids=["count-1e9", "required-and-excluded"],
)
def test_impossible_shapeworld_metadata_is_refused(tmp_path, row, needle):
    from t2i_gcpo.tasks.registry import get_task

    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(UserError, match=None) as e:
        get_task("shapeworld", None).load_prompts(path)
    assert f"{path}:1: " in str(e.value) and needle in str(e.value), e.value
    counting = {
        "tag": "counting",
        "include": [{"class": "circle", "count": 2}],
        "exclude": [{"class": "circle", "count": 3}],
        "prompt": "a photo of two circles",
    }
    path.write_text(json.dumps(counting) + "\n")  # exactly two: possible
    assert get_task("shapeworld", None).load_prompts(path)[0].meta["include"][0]["count"] == 2


# ------------------------------------------------- property: random values for every config key


def _annotations(obj=None, prefix: str = "") -> dict[str, object]:
    """Dotted config key → its type annotation, for every leaf of the config tree."""
    import dataclasses
    import typing

    from t2i_gcpo.config import TrainConfig

    obj = obj if obj is not None else TrainConfig()
    hints, out = typing.get_type_hints(type(obj)), {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out.update(_annotations(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = hints[f.name]
    return out


KEYS = _annotations()
# integer keys whose valid values set a run's cost: the training property draws them small
COST = {
    "steps",
    "rollout.prompts_per_step",
    "rollout.group_size",
    "rollout.steps",
    "rollout.max_new_tokens",
    "advantage.max_resample",
    "optim.update_epochs",
    "optim.minibatches",
    "model_options.remask_count",
    "eval_images_per_prompt",
    "sample_every",
    "save_every",
    "eval_every",
    "model_options.lora_rank",
}


def _values(key: str, small: bool = False):
    """A hypothesis strategy of values for `key`: of its type (edges included) and of other types."""
    import typing

    from hypothesis import strategies as st

    tp = KEYS[key]
    args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
    if typing.get_origin(tp) is typing.Literal:
        own = st.sampled_from(typing.get_args(tp))
    elif int in args:
        own = st.integers(-3, 8) if small and key in COST else st.integers(-(2**70), 2**70)
    elif float in args:
        edges = st.sampled_from(
            [0.0, -0.0, 1e-300, 1e-13, 1e-6, 0.5, 1.0, 2.0, 999.0, 1e4, 1e38, 1e300, -1.0]
        )
        own = st.one_of(edges, st.floats(allow_nan=True, allow_infinity=True))
    elif bool in args:
        own = st.booleans()
    else:
        own = st.text(max_size=6)
    other = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(-10, 10), st.text(max_size=4))
    return st.one_of(own, own, own, other)


def _setting(key: str, value) -> str:
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return f"{key}={text.removesuffix('...').strip()}"


def test_random_values_for_every_key_are_valid_or_one_line_naming_it():
    """Every key, random values of its type and of others (NaN, ±inf, huge, negative, wrong type):
    the config is either accepted whole, or refused with one line that names the key."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from t2i_gcpo.config import parse_set

    @settings(max_examples=600, deadline=None, derandomize=True)
    @given(st.sampled_from(sorted(KEYS)).flatmap(lambda k: st.tuples(st.just(k), _values(k))))
    def check(pair):
        key, value = pair
        setting = _setting(key, value)
        try:
            cfg = load_config(overrides=[setting])
        except UserError as e:
            message = str(e)
            assert "\n" not in message and key.split(".")[-1] in message, (setting, message)
            return
        got = cfg
        for part in key.split("."):
            got = getattr(got, part)
        want = parse_set(setting)[1]
        if isinstance(want, str) and isinstance(got, float):  # a float key reads YAML's "5e-6" (a string)
            want = float(want)
        assert got == want or (got != got and want != want), setting  # accepted as given (NaN: as NaN)

    check()


@pytest.fixture(scope="module")
def property_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("property")
    return root, str(write_prompt_file(root / "eval.jsonl", n=2))


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(KEYS))
def test_random_values_either_stop_before_any_work_or_train_finite_weights(tiny, property_root, key):
    """Through the CLI, a few random values of `key` on a one-step run of the tiny model: exit 2 with
    one line and no run directory, exit 1 with the NaN guard's line, or a run; every checkpoint
    written holds finite weights. No traceback (main lets anything but a UserError through)."""
    import itertools
    import os

    from hypothesis import HealthCheck, given, settings

    root, evals = property_root
    counter = itertools.count()

    @settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(_values(key, small=True))
    def check(value):
        work = root / f"{key}-{next(counter)}"
        work.mkdir()
        out = work / "run"
        cwd = os.getcwd()
        os.chdir(work)  # a random 'out' or relative path stays inside this example's folder
        try:
            code, err = cli(
                *train_args(tiny, out, steps=1, sets=[f"eval_prompts={evals}", _setting(key, value)])
            )
        finally:
            os.chdir(cwd)
        lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
        assert code in (0, 1, 2), (value, err)
        if code == 2:
            assert len(lines) == 1 and not out.exists(), (value, err)
        if code == 1:
            assert len(lines) == 1 and "became NaN or inf" in lines[0], (value, err)
        for ckpt in work.rglob("checkpoints/step_*"):
            for path in ckpt.rglob("*.safetensors"):
                assert all(torch.isfinite(t).all() for t in load_file(str(path)).values()), (value, path)

    check()


def test_values_that_were_silently_ignored_are_refused(tiny):
    """--set algo=dapo kept the gcpo preset; model_options.lora_rank on a ShapeWorld model trained
    every weight."""
    from t2i_gcpo.config import ModelOptions
    from t2i_gcpo.policies.registry import load_policy

    with pytest.raises(UserError, match="config key 'algo': give the algorithm with --algo dapo"):
        load_config("gcpo", overrides=["algo=dapo"])
    assert load_config("dapo", overrides=["algo=dapo"]).algo == "dapo"
    with pytest.raises(
        UserError, match="lora_rank=4 applies to janus, llamagen, meissonic and showo models only"
    ):
        load_policy(tiny["model"], ModelOptions(lora_rank=4))
