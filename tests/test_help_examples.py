"""The examples printed by `--help` work as printed: a newcomer's first command must not be refused."""

from __future__ import annotations

import re
import shlex

from click.testing import CliRunner

from t2i_gcpo.cli import cli
from t2i_gcpo.commands.credit_map import EXAMPLES


def image_examples() -> list[list[str]]:
    """credit-map's examples on ShapeWorld (not the arithmetic ones), as argument lists."""
    joined = EXAMPLES.replace("\\\n", " ")
    lines = [ln.split("#")[0].strip() for ln in joined.splitlines() if ln.strip().startswith("t2i-gcpo")]
    return [shlex.split(ln)[2:] for ln in lines if "arithmetic" not in ln]


def test_every_shapeworld_prompt_in_credit_map_help_is_accepted_by_the_shipped_model():
    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.worlds.shapeworld.parse import parse_prompt

    prompts = [a[a.index("--prompt") + 1] for a in image_examples() if "--prompt" in a]
    assert prompts and re.search(r"left of|right of|above|below", prompts[0])
    policy = load_policy("shapeworld")
    for prompt in prompts:
        parse_prompt(prompt)  # raises UserError on a prompt outside the grammar or the classes
        policy.check_prompts([prompt])  # raises UserError on unknown words or a prompt longer than its length


def test_the_first_credit_map_example_runs(tmp_path):
    args = image_examples()[0]
    args = args[: args.index("--out")] + ["--out", str(tmp_path / "maps"), "--group", "2"]
    result = CliRunner().invoke(cli, ["credit-map", *args])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "maps" / "credit_maps.html").is_file() and (tmp_path / "maps" / "00000.png").is_file()
