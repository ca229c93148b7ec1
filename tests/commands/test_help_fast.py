"""`--help` of every command imports no torch (it took 1.7–2.2 s where torch came in through the config
schema; 0.1 s without), and the help the schema generates is still complete."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "transformers", "diffusers", "accelerate", "open_clip", "PIL", "numpy")

# in a fresh interpreter: one command line's help, then the heavy modules that loaded
PROBE = """
import sys
from t2i_gcpo.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    assert e.code in (0, None), e.code
print("loaded:", *(m for m in HEAVY if m in sys.modules))
"""


def help_lines() -> list[list[str]]:
    """Every command line whose help a user can ask for: the group, each command, each subcommand."""
    import click

    from t2i_gcpo.cli import COMMANDS, cli

    lines = [["--help"], ["train", "--help-config"]]
    for name in COMMANDS:
        lines.append([name, "--help"])
        command = cli.get_command(click.Context(cli), name)
        lines += [[name, sub, "--help"] for sub in getattr(command, "commands", {})]
    return lines


def test_no_help_imports_torch_or_the_model_libraries():
    lines = help_lines()
    # eval: geneval, geneval2, dpg, judge, shapeworld, compbench, compare
    assert ["eval", "shapeworld", "--help"] in lines and len(lines) == 2 + 7 + 7
    loaded = {}
    for args in lines:
        out = subprocess.run(
            [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{PROBE}", *args],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        loaded[" ".join(args)] = out.splitlines()[-1].removeprefix("loaded:").strip()
    assert {line: heavy for line, heavy in loaded.items() if heavy} == {}


def test_help_still_lists_every_scheme_and_its_options():
    """The registry read without torch is the whole registry: every scheme in `train --help` and
    `credit-map --help`, and each option's type, default and range in `--help-config`."""
    from click.testing import CliRunner

    from t2i_gcpo.cli import cli
    from t2i_gcpo.core.schemes import CREDIT_SCHEMES

    assert {"uniform", "gcpo", "dgpo", "stage", "critical", "eg_grpo", "tempo", "vine"} <= set(CREDIT_SCHEMES)
    for command in ("train", "credit-map"):
        help_text = " ".join(CliRunner().invoke(cli, [command, "--help"], terminal_width=400).output.split())
        assert all(name in help_text for name in CREDIT_SCHEMES), command
    gcpo = {o.name: o for o in CREDIT_SCHEMES["gcpo"].specs}
    assert gcpo["tau"].type is float and gcpo["tau"].info.low == 1e-6
    assert str(gcpo["normalization"].type) == "typing.Literal['hist', 'softmax', 'mean', 'none']"
    config_help = CliRunner().invoke(cli, ["train", "--help-config"]).output
    assert "branching.k" in config_help and "credit.vine.include_root" in config_help
    assert "credit.gcpo.top_fraction" in config_help


def test_an_option_whose_neighbour_cannot_be_resolved_keeps_its_type():
    """Options are typed one by one: a return or input annotation naming what the module does not
    import (torch under TYPE_CHECKING, as in the built-in schemes) no longer leaves every option untyped."""
    from t2i_gcpo.core.schemes import scheme_from_function

    namespace: dict = {}
    exec(
        "from __future__ import annotations\n"
        "def mine(inp: NotImported, power: float = 2.0, mode: str = 'a') -> AlsoNotImported: ...",
        namespace,
    )
    scheme = scheme_from_function("mine", namespace["mine"])
    assert [(o.name, o.type, o.default) for o in scheme.specs] == [("power", float, 2.0), ("mode", str, "a")]
