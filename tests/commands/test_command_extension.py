"""A new command is one file: the one docs/guides/commands.md prints, declared under the t2i_gcpo.commands
entry point (a stand-in for an installed package's), is listed by `t2i-gcpo --help` and runs."""

from __future__ import annotations

import importlib.metadata
import re
import sys

import pytest

from t2i_gcpo.commands.registry import COMMANDS

from cli_helpers import cli, error_line
from repo_paths import REPO


def guide_code() -> str:
    page = (REPO / "docs" / "guides" / "commands.md").read_text()
    block = re.search(r"```python\n(# my_package/count_prompts\.py\n.*?)```", page, re.S)
    assert block, "the guide's one-file command"
    return block.group(1)


@pytest.fixture
def installed(tmp_path, monkeypatch):
    (tmp_path / "count_prompts.py").write_text(guide_code())
    monkeypatch.syspath_prepend(str(tmp_path))
    point = importlib.metadata.EntryPoint("count-prompts", "count_prompts", "t2i_gcpo.commands")
    real = importlib.metadata.entry_points
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda **kw: [point] if kw.get("group") == "t2i_gcpo.commands" else real(**kw),
    )
    monkeypatch.setitem(COMMANDS._loaded, "plugins", False)  # the entry points are read again
    yield
    COMMANDS.remove("count-prompts")
    sys.modules.pop("count_prompts", None)


def test_the_guides_command_is_listed_and_runs(installed, capsys, tmp_path):
    code, out, _ = cli(capsys, "--help")
    assert code == 0 and "count-prompts" in out and "Count the prompts of a prompt file." in out
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red circle\n# a comment\na blue square\n")
    code, out, err = cli(capsys, "count-prompts", str(prompts))
    assert code == 0 and out.strip() == "2 prompts", err
    code, _, err = cli(capsys, "count-prompts", str(tmp_path / "missing.txt"))
    assert code == 2 and "prompt file" in error_line(err) and "does not exist" in error_line(err)


def test_the_built_in_commands_come_from_the_table():
    assert COMMANDS.names()[:3] == ["train", "sample", "credit-map"]
    assert all(COMMANDS[name].target.startswith("t2i_gcpo.commands.") for name in COMMANDS.names())
