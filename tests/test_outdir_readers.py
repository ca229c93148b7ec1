"""One reader for every file the tool reads (issue 52, "a reader that trusts its file"): JSON and JSONL
through outdir.read_json / read_jsonl (YAML through read_yaml), with a depth bound and typed validation —
one line naming the file and the field on any problem, never a TypeError or a RecursionError; nothing is
written by a command refused so."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import t2i_gcpo.train.trainer as trainer_mod
from t2i_gcpo.errors import UserError

from cli_helpers import cli, error_line
from tiny_models import tiny_policy_dir
from train_fixtures import copy_run, train_tiny_run, write_prompt_file

DEEP = "[" * 200_000 + "]" * 200_000  # JSON nested 200,000 deep
DEEP_ROW = '{"prompt": "a photo of a circle", "tag": "single_object", "include": ' + DEEP + "}"


@pytest.fixture(autouse=True)
def no_report(monkeypatch):
    monkeypatch.setattr(trainer_mod.Trainer, "_report", lambda self: None)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    return train_tiny_run(tmp_path_factory.mktemp("readers"))


def ckpt(run: Path) -> Path:
    return run / "checkpoints" / "step_000001"


def tree(root: Path) -> set[Path]:
    return set(root.rglob("*"))


# ------------------------------------------------------------------ trainer_state.json: typed, then read


@pytest.mark.parametrize("entry", ["budget", "history"])
def test_a_trainer_state_entry_of_the_wrong_type_is_one_line_naming_it(finished, tmp_path, capsys, entry):
    """`"budget": 5` or `"history": 5`: the problem was recorded, then the entry iterated
    anyway (TypeError)."""
    run = copy_run(finished["base"], tmp_path)
    state = json.loads((ckpt(run) / "trainer_state.json").read_text())
    (ckpt(run) / "trainer_state.json").write_text(json.dumps({**state, entry: 5}))
    before = tree(run)
    code, _, err = cli(capsys, "train", "--resume", run, "--steps", 2)
    line = error_line(err)
    assert code == 2 and f"trainer_state.json: '{entry}': input should be a valid list, got 5" in line, line
    assert tree(run) == before


# ------------------------------------------------------------------ nested 200,000 deep, in every reader


def test_a_deep_jsonl_prompt_file_is_one_line_for_train_sample_and_eval(finished, tmp_path, capsys):
    prompts = tmp_path / "deep.jsonl"
    prompts.write_text(DEEP_ROW + "\n")
    model = finished["model"]
    for args in (
        ["train", "--prompts", prompts, "--model", model, "--out", tmp_path / "run"],
        ["sample", "--prompts", prompts, "--model", model, "--out", tmp_path / "samples"],
        ["eval", "shapeworld", "--prompts", prompts, "--model", model, "--out", tmp_path / "eval"],
    ):
        before = tree(tmp_path)
        code, _, err = cli(capsys, *args)
        line = error_line(err)
        assert code == 2 and f"{prompts}:1: nested too deeply" in line, (args[0], line)
        assert tree(tmp_path) == before, args[0]


def deep_file(path: Path, text: str = DEEP) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_every_record_reader_refuses_deep_json_in_one_line(tmp_path):
    from t2i_gcpo.eval.layout import check_resumable, read_settings
    from t2i_gcpo.outdir import read_settings_record
    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.studies import compare
    from t2i_gcpo.train.checkpoint import load_trainer_state
    from t2i_gcpo.train.input_files import read_record
    from t2i_gcpo.train.run_dir import truncate_metrics

    def refuses(call, path: Path) -> None:
        with pytest.raises(UserError) as e:
            call()
        assert str(path) in str(e.value) and "nested too deeply" in str(e.value) and "\n" not in str(e.value)

    folder = deep_file(tmp_path / "settings" / ".t2i-gcpo-settings.json").parent  # a settings record
    refuses(lambda: read_settings_record(folder), folder / ".t2i-gcpo-settings.json")
    out = tmp_path / "cmp"  # compare's budget.json and its runs' files
    deep_file(out / "budget.json")
    refuses(lambda: compare.shared_runs(out, ["dapo"], {}), out / "budget.json")
    run = out / "dapo" / "seed0"
    refuses(
        lambda: compare.read_metrics(run), deep_file(run / "metrics.jsonl", '{"step": 1, "x": ' + DEEP + "}")
    )
    refuses(lambda: compare.final_scores(run), deep_file(run / "eval.json"))
    images = tmp_path / "images" / "00000"  # a sample's records
    deep_file(images / "samples" / "0000.png", "not a png")
    refuses(lambda: read_settings(images), deep_file(images / "generation.json"))
    meta = {"prompt": "a photo of a circle", "tag": "t", "include": []}
    deep_file(images / "metadata.jsonl", json.dumps(meta) + "\n")
    refuses(lambda: check_resumable(images.parent, [meta], {"n": 1}), images / "generation.json")
    side = tmp_path / "run"  # a run's side files
    refuses(lambda: load_trainer_state(side), deep_file(side / "trainer_state.json"))
    refuses(lambda: read_record(side), deep_file(side / "input_files.json"))
    truncate = deep_file(side / "metrics.jsonl", '{"step": 1, "x": ' + DEEP + "}\n" + '{"step": 2}\n')
    with pytest.raises(UserError, match=r"metrics.jsonl:1: not a metrics row"):
        truncate_metrics(truncate, 2)
    model = tiny_policy_dir(tmp_path)  # a checkpoint's config.json
    deep_file(model / "prior" / "config.json")
    refuses(lambda: load_policy(str(model)), model / "prior" / "config.json")


def test_a_deep_settings_record_is_one_line_from_the_command_line(finished, tmp_path, capsys):
    prompts = write_prompt_file(tmp_path / "p.jsonl", n=1)
    out = tmp_path / "samples"
    deep_file(out / ".t2i-gcpo-settings.json")
    before = tree(tmp_path)
    code, _, err = cli(capsys, "sample", "--prompts", prompts, "--model", finished["model"], "--out", out)
    line = error_line(err)
    assert (
        code == 2
        and ".t2i-gcpo-settings.json is nested too deeply" in line
        and "choose another --out" in line
    )
    assert tree(tmp_path) == before


def test_a_deep_yaml_config_or_set_value_is_one_line(tmp_path, capsys):
    config = tmp_path / "deep.yaml"
    config.write_text("optim: " + "[" * 100_000 + "]" * 100_000 + "\n")
    code, _, err = cli(
        capsys,
        "train",
        "--prompts",
        "prompts/shapeworld_train.txt",
        "--config",
        config,
        "--out",
        tmp_path / "run",
    )
    line = error_line(err)
    assert code == 2 and f"config file {config} is nested too deeply" in line, line
    code, _, err = cli(
        capsys,
        "train",
        "--prompts",
        "prompts/shapeworld_train.txt",
        "--set",
        "optim.lr=" + "[" * 5_000 + "]" * 5_000,
        "--out",
        tmp_path / "run",
    )
    assert code == 2 and "is nested too deeply" in error_line(err)
    assert not (tmp_path / "run").exists()


def test_a_received_config_yaml_is_read_without_following_a_link(finished, tmp_path, capsys):
    run = copy_run(finished["base"], tmp_path)
    elsewhere = tmp_path / "elsewhere.yaml"
    shutil.move(run / "config.yaml", elsewhere)
    (run / "config.yaml").symlink_to(elsewhere)
    code, _, err = cli(capsys, "train", "--resume", run, "--steps", 2)
    line = error_line(err)
    assert code == 2 and "config.yaml is a symbolic link" in line, line


def test_the_lock_record_of_another_holder_is_read_safely(tmp_path):
    from t2i_gcpo.outdir import _holder

    assert _holder(DEEP[:4000]) == "another process"
    assert _holder('{"pid": true, "host": "h", "command": "c"}') == "another process"
    assert _holder('{"pid": 7, "host": "h", "command": "t2i-gcpo train"}') == "pid 7 on h (t2i-gcpo train)"
