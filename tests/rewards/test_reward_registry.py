"""The reward registry (t2i_gcpo/rewards/registry.py): one file and one registration per reward, the spec
grammar (terms, weights, quoted fields, options typed and bounded from the loader's signature), the
one-line errors a bad spec gives from the command line before any run folder exists, a new reward added
as one file and trained with, and the free-text `prompts` task the text-rendering prompts need."""

from __future__ import annotations

import json
import pkgutil
import sys
import textwrap

import pytest
import torch
import yaml

import t2i_gcpo.rewards.forms as forms_package
from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards import registry
from t2i_gcpo.rewards.registry import (
    build_reward,
    canonical_reward,
    check_reward_spec,
    forms,
    read_term,
    terms,
    user_code_specs,
)

from cli_helpers import cli, error_line
from tiny_models import build_tiny_pickscore, tiny_policy_dir
from train_fixtures import write_prompt_file

NEW_FORMS = {"pickscore", "hps", "aesthetic", "ocr", "vqa", "judge"}


def test_every_reward_file_registers_one_form_and_help_lists_them():
    from click.testing import CliRunner

    from t2i_gcpo.cli import cli as group

    found = forms()
    modules = {m.name for m in pkgutil.iter_modules(forms_package.__path__)}
    assert {m for m in modules if not m.startswith("_")} == {
        f.load.__module__.rsplit(".", 1)[1] for f in found.values()
    }
    assert NEW_FORMS | {"shapeworld", "clip", "geneval", "arithmetic"} <= set(found)
    help_text = " ".join(CliRunner().invoke(group, ["train", "--help"], terminal_width=400).output.split())
    for form in found.values():
        assert form.usage in help_text, form.usage
        assert form.doc and form.weights and form.source and form.licence, form.name
    assert (
        found["pickscore"].usage == "pickscore:DIR" and found["aesthetic"].usage == "aesthetic:CLIP_CKPT,HEAD"
    )
    assert found["geneval"].usage == "geneval:DETECTOR_DIR,CLIP_CKPT[,MODEL_NAME][,flow_grpo]"
    assert found["judge"].context == () and found["pickscore"].context == ("device",)


def test_terms_weights_and_quotes():
    assert terms("0.7*my_rewards:length + 0.3*my_rewards:brightness") == [
        (0.7, "my_rewards:length"),
        (0.3, "my_rewards:brightness"),
    ]
    # a '+' that starts no term stays in its field: the aesthetic head's released file name
    head = "/m/sac+logos+ava1-l14-linearMSE.pth"
    assert terms(f"2*aesthetic:/m/clip.bin,{head}+shapeworld") == [
        (2.0, f"aesthetic:/m/clip.bin,{head}"),
        (None, "shapeworld"),
    ]
    read = read_term("judge:http://h:1/v1,template='Rate {prompt}, 1+1: ok',pattern=\"(\\d)\",retries=0")
    assert read.args == ("http://h:1/v1",)
    assert read.options == {"template": "Rate {prompt}, 1+1: ok", "pattern": "(\\d)", "retries": 0}
    assert terms("judge:http://h:1/v1,template='a+b'+0.5*ocr") == [
        (None, "judge:http://h:1/v1,template='a+b'"),
        (0.5, "ocr"),
    ]
    for spec, match in [
        ("nan*shapeworld", "weight must be a finite number, got nan"),
        ("inf*shapeworld", "weight must be a finite number"),
        ("abc*shapeworld", "the weight 'abc' is not a number"),
        ("shapeworld+", "empty term"),
        ("judge:http://h/v1,template='open", "unmatched quote"),
        ("", "empty reward"),
    ]:
        with pytest.raises(UserError, match=match):
            terms(spec) if "quote" in match else check_reward_spec(spec)


def test_options_are_typed_and_bounded_from_the_signature(tmp_path):
    cases = [
        ("arithmetic:format=x", "option format: expected a finite number, got 'x'"),
        ("arithmetic:bogus=1", "no option 'bogus'"),
        ("arithmetic:format=1,format=2", "option format given twice"),
        ("ocr:text_score=1.5", r"option text_score must be in \[0, 1\], got 1.5"),
        ("ocr:threads=two", "option threads: expected an integer or null"),
        ("judge:http://h/v1,retries=-1", r"retries must be in \[0, 100\]"),
        ("shapeworld:variant=exact", "expected one of spec, flow_grpo"),
        ("shapeworld:flowgrpo", "'flowgrpo' is not one of its fields; a user module named shapeworld"),
        (f"hps:{tmp_path}", "FILE .* is a folder, expected a file"),
        (f"pickscore:{tmp_path}/nope", "DIR .* does not exist"),
        ("vqa", "DIR missing"),
        ("judge:127.0.0.1:8000/v1", "URL 127.0.0.1:8000/v1 is not an http"),
    ]
    for spec, match in cases:
        with pytest.raises(UserError, match=match) as e:
            check_reward_spec(spec)
        assert "\n" not in str(e.value) and str(e.value).startswith("reward")  # one line, naming the reward
    read = read_term("shapeworld:flow_grpo")
    assert read.options == {"variant": "flow_grpo"}  # a Literal option's value written bare
    assert read_term("ocr:text_score=0.7,threads=null").options == {"text_score": 0.7, "threads": None}
    with pytest.raises(UserError, match="scores images, but the model writes text: use 'arithmetic"):
        check_reward_spec("0.5*arithmetic+0.5*ocr", output="text")


def test_canonical_reward_records_weights_paths_absolute(tmp_path, monkeypatch):
    (tmp_path / "PickScore_v1").mkdir()
    (tmp_path / "sac+logos.pth").write_text("x")
    (tmp_path / "clip.bin").write_text("x")
    monkeypatch.chdir(tmp_path)
    spec = "0.70*pickscore:PickScore_v1,batch_size=4+0.30*aesthetic:clip.bin,sac+logos.pth+ocr"
    got = canonical_reward(spec)
    assert got == (
        f"0.70*pickscore:{tmp_path}/PickScore_v1,batch_size=4+0.30*aesthetic:{tmp_path}/clip.bin,"
        f'"{tmp_path}/sac+logos.pth"+ocr'
    )
    assert terms(got)[1] == (0.3, f'aesthetic:{tmp_path}/clip.bin,"{tmp_path}/sac+logos.pth"')
    assert canonical_reward(got) == got
    assert (
        canonical_reward("clip:clip.bin:ViT-B-32,batch_size=2")
        == f"clip:{tmp_path}/clip.bin:ViT-B-32,batch_size=2"
    )
    assert canonical_reward("judge:http://h:8000/v1,model=m") == "judge:http://h:8000/v1,model=m"
    assert user_code_specs("0.5*ocr+0.5*my_rewards:length") == ["my_rewards:length"]


# ----------------------------------------------------------------------------- from the command line
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("registry_train")
    return {
        "model": str(tiny_policy_dir(root)),
        "prompts": str(write_prompt_file(root / "p.jsonl")),
        "pickscore": str(build_tiny_pickscore(root / "PickScore_v1")),
    }


def train(capsys, tiny, out, reward, model=None):
    return cli(
        capsys,
        "train",
        "--prompts",
        tiny["prompts"],
        "--model",
        model or tiny["model"],
        "--reward",
        reward,
        "--out",
        out,
        "--steps",
        "1",
        "--report-to",
        "none",
        "--set",
        "rollout.prompts_per_step=2",
        "--set",
        "rollout.group_size=2",
        "--set",
        "sample_every=0",
        "--set",
        "eval_every=-1",
    )


@pytest.mark.parametrize(
    "reward, match",
    [
        ("0.5*shapeworld+nan*ocr", "the weight must be a finite number, got nan"),
        ("0.5*shapeworld+0.5*ocr:text_scor=0.5", "no option 'text_scor'"),
        ("pickscore:{file}", "is a file, expected a folder"),
        ("0.5*shapeworld+0.5*hps:{folder}", "is a folder, expected a file"),
    ],
)
def test_bad_specs_are_one_line_exit_2_and_no_run_folder(capsys, tmp_path, tiny, reward, match):
    (tmp_path / "weights.bin").write_text("x")
    out = tmp_path / "run"
    spec = reward.format(file=tmp_path / "weights.bin", folder=tmp_path)
    # before the model loads: a model folder that does not exist is not what the line says
    code, _, err = train(capsys, tiny, out, spec, model=str(tmp_path / "no_model"))
    assert code == 2 and match in error_line(err) and not out.exists()


def test_a_shapeworld_run_trains_with_pickscore_in_a_sum(capsys, tmp_path, tiny):
    out = tmp_path / "run"
    code, _, err = train(capsys, tiny, out, f"0.5*shapeworld+0.5*pickscore:{tiny['pickscore']},batch_size=3")
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1 and "reward/mean" in rows[-1]
    saved = yaml.safe_load((out / "config.yaml").read_text())["reward"]
    assert saved == f"0.5*shapeworld+0.5*pickscore:{tiny['pickscore']},batch_size=3"


TOY = '''
"""A toy reward: the images' mean brightness times a gain (tests/rewards/test_reward_registry.py)."""

from typing import Annotated

from t2i_gcpo.rewards.registry import Option, register_reward


@register_reward("toy_brightness", scores="image", doc="mean brightness × gain", weights="none",
                 source="this test", licence="none")
def load(*, gain: Annotated[float, Option("the factor", low=0)] = 1.0, device: str = "cpu"):
    return Brightness(gain)


class Brightness:
    name = "toy_brightness"

    def __init__(self, gain):
        self.gain = gain

    def __call__(self, images, prompts, metadata):
        CALLS.append(len(prompts))
        return [self.gain * float(x.mean()) for x in images]


CALLS = []
'''


@pytest.fixture
def toy_reward_file(tmp_path, monkeypatch):
    """toy_reward.py in a folder of the forms package's path, as a new reward file is added: nothing else."""
    folder = tmp_path / "more_rewards"
    folder.mkdir()
    (folder / "toy_reward.py").write_text(textwrap.dedent(TOY))
    monkeypatch.setattr(forms_package, "__path__", [*forms_package.__path__, str(folder)])
    monkeypatch.setitem(registry.REWARDS._loaded, "builtins", False)  # the package is read again
    yield folder
    registry.unregister_reward("toy_brightness")
    sys.modules.pop("t2i_gcpo.rewards.forms.toy_reward", None)


def test_adding_a_reward_is_one_file(capsys, tmp_path, tiny, toy_reward_file):
    assert "toy_brightness" in forms() and forms()["toy_brightness"].usage == "toy_brightness"
    toy = sys.modules["t2i_gcpo.rewards.forms.toy_reward"]
    out = tmp_path / "run"
    code, _, err = train(capsys, tiny, out, "0.5*shapeworld+0.5*toy_brightness:gain=2")
    assert code == 0, err and toy.CALLS
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 1
    code, _, err = train(capsys, tiny, tmp_path / "bad", "toy_brightness:gain=-1")
    assert code == 2 and "option gain must be ≥ 0, got -1" in error_line(err)
    images = torch.rand(2, 3, 8, 8)
    assert build_reward("toy_brightness:gain=3")(
        images, ["a", "b"], [{}, {}]
    ).scores.tolist() == pytest.approx([3 * float(x.mean()) for x in images])


def test_geneval_metadata_reaches_the_parts_of_a_sum_that_need_it(tiny, monkeypatch):
    from t2i_gcpo.errors import RewardError
    from t2i_gcpo.rewards.forms.geneval_reward import GenEvalReward
    from t2i_gcpo.scoring.detections import Detection

    dog = Detection(cls="dog", box=(0, 0, 4, 4), score=0.9, color="red")

    class Colors:
        def color_of(self, image):
            return lambda det: det.color

    fake = staticmethod(lambda *args, **kwargs: GenEvalReward(lambda image: [dog], Colors()))
    monkeypatch.setattr(GenEvalReward, "from_paths", fake)
    reward = build_reward(f"0.5*geneval:det,clip.pt+0.5*pickscore:{tiny['pickscore']}")
    one_dog = {"tag": "single_object", "include": [{"class": "dog", "count": 1}]}
    two_cats = {"tag": "counting", "include": [{"class": "cat", "count": 2}]}
    out = reward(torch.rand(2, 3, 40, 40), ["a photo of a dog", "a photo of two cats"], [one_dog, two_cats])
    assert out.term_names == ("geneval", "pickscore")
    assert out.terms[:, 0].tolist() == [1.0, 0.0]  # each sample scored against its own metadata
    assert [d["geneval/tag"] for d in out.details] == ["single_object", "counting"]
    assert torch.allclose(out.scores, 0.5 * torch.tensor([1.0, 0.0]) + 0.5 * out.terms[:, 1])
    with pytest.raises(RewardError, match="needs GenEval metadata"):
        reward(torch.rand(1, 3, 40, 40), ["a photo of a dog"], [{}])


def test_the_recipe_with_a_reward_sum_reads():
    from t2i_gcpo.config import load_config
    from t2i_gcpo.resources import config_file_path

    cfg = load_config(
        "gcpo-official", config_file=config_file_path("recipes/janus_pro_1b_pickscore_geneval.yaml")
    )
    parts = [(w, read_term(t)) for w, t in terms(cfg.reward)]
    assert [(w, r.form.name) for w, r in parts] == [(1.0, "geneval"), (0.04, "pickscore")]
    assert parts[1][1].args == ("/path/to/PickScore_v1",)


# ----------------------------------------------------------------------------- the prompts task
def test_the_prompts_task_reads_free_text_and_jsonl(tmp_path):
    from t2i_gcpo.tasks.prompts import summarize
    from t2i_gcpo.tasks.registry import get_task

    task = get_task("prompts")
    shipped = task.load_prompts("text_rendering_train.txt")
    assert len(shipped) == 40 and all(r.text.count('"') == 2 for r in shipped)
    assert len(task.load_prompts(task.default_eval_prompts())) == 16
    (tmp_path / "p.jsonl").write_text('{"prompt": "a sign", "text": "OPEN"}\n\n{"prompt": "b"}\n')
    rows = task.load_prompts(tmp_path / "p.jsonl")
    assert [(r.text, r.meta) for r in rows] == [
        ("a sign", {"prompt": "a sign", "text": "OPEN"}),
        ("b", {"prompt": "b"}),
    ]
    (tmp_path / "bad.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:1: expected an object with a non-empty \"prompt\""):
        task.load_prompts(tmp_path / "bad.jsonl")
    result = summarize([(0, 1.0), (0, 0.0), (1, 1.0), (1, 1.0)])
    assert result["reward"] == 0.75 and result["metrics"]["eval/reward_se"] == pytest.approx(0.25)
