"""A new evaluation suite is one file: the one docs/guides/eval-suites.md prints, dropped into the suites'
package, runs as `t2i-gcpo eval judge --suite yesno` on a judge on loopback, and the names and errors come
from the registry."""

from __future__ import annotations

import json
import re
import sys

import pytest

import t2i_gcpo.eval.suites as suites_package
from t2i_gcpo.config import EVAL_SUITES

from cli_helpers import cli, error_line
from judge_fixtures import LoopbackJudge, completion, message_text
from repo_paths import REPO
from tiny_models import tiny_policy_dir


def guide_code() -> str:
    page = (REPO / "docs" / "guides" / "eval-suites.md").read_text()
    block = re.search(r"```python\n(# t2i_gcpo/eval/suites/yesno\.py\n.*?)```", page, re.S)
    assert block, "the guide's one-file suite"
    return block.group(1)


@pytest.fixture
def yesno(tmp_path, monkeypatch):
    folder = tmp_path / "more_suites"
    folder.mkdir()
    (folder / "yesno.py").write_text(guide_code())
    monkeypatch.setattr(suites_package, "__path__", [*suites_package.__path__, str(folder)])
    monkeypatch.setitem(EVAL_SUITES._loaded, "builtins", False)  # the package is read again
    yield folder
    EVAL_SUITES.remove("yesno")
    sys.modules.pop("t2i_gcpo.eval.suites.yesno", None)


def answer(body: dict) -> dict:
    """'yes' to questions about circles, 'no' to the rest."""
    return completion("Yes." if "circle" in message_text(body) else "no")


def test_the_guides_suite_runs_from_one_file(yesno, tmp_path, capsys):
    assert "yesno" in EVAL_SUITES.names() and EVAL_SUITES["yesno"].doc.startswith("one yes/no question")
    data = tmp_path / "q.csv"
    data.write_text(
        "prompt,question,category\n"
        "a photo of a red circle,Is there a circle?,shapes\n"
        "a photo of a blue square,Is there a square?,shapes\n"
        "a photo of two green triangles,Are there two triangles?,counting\n"
    )
    model = str(tiny_policy_dir(tmp_path / "model"))
    out = tmp_path / "eval"
    with LoopbackJudge(answer) as judge:
        code, printed, err = cli(
            capsys,
            "eval",
            "judge",
            "--suite",
            "yesno",
            "--data",
            str(data),
            "--judge",
            judge.url,
            "--model",
            model,
            "--n",
            "2",
            "--out",
            str(out),
        )
        assert code == 0, err
        assert len(judge.bodies) == 6  # one request per image: 3 prompts × 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["categories"] == {"counting": 0.0, "shapes": 0.5} and summary["overall"] == 0.25
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["key"] for r in rows) == [
        "00000/0000",
        "00000/0001",
        "00001/0000",
        "00001/0001",
        "00002/0000",
        "00002/0001",
    ]
    assert json.loads((out / "protocol.json").read_text())["suite"] in ("yesno", "judge:yesno")


def test_the_guides_suite_names_the_file_line_and_field(yesno, tmp_path, capsys):
    data = tmp_path / "bad.csv"
    data.write_text("prompt,question,category\na red circle,,shapes\n")
    code, _, err = cli(
        capsys,
        "eval",
        "judge",
        "--suite",
        "yesno",
        "--data",
        str(data),
        "--judge",
        "http://127.0.0.1:9/v1",
        "--model",
        "shapeworld",
        "--out",
        str(tmp_path / "e"),
    )
    assert code == 2 and f"{data}:2: field 'question' is missing or empty" in error_line(err)
    assert not (tmp_path / "e").exists()


def test_an_unknown_suite_lists_the_registered_ones(capsys, tmp_path):
    code, _, err = cli(
        capsys,
        "eval",
        "judge",
        "--suite",
        "nope",
        "--data",
        "x",
        "--judge",
        "http://x/v1",
        "--out",
        str(tmp_path / "e"),
    )
    assert code == 2 and all(name in err for name in ("tiif", "unigenbench", "wise"))
    assert not (tmp_path / "e").exists()
