"""MkDocs hook: fills the generated reference pages at build time, so they cannot drift from the code.

- `<!-- config-keys -->` (docs/reference/config.md): one table per config section, from
  `t2i_gcpo.config.describe()` — the rows `t2i-gcpo train --help-config` prints.
- `<!-- cli-help -->` (docs/reference/cli.md): every command's `--help`, exactly as a terminal shows
  it, examples included. (mkdocs-click renders click's options but not the epilogs our examples live
  in, and its table style prints click 8.3's unset defaults as "Sentinel.UNSET".)
"""

from __future__ import annotations

import sys
from pathlib import Path

# the checkout's t2i_gcpo, installed or not: `pip install --group docs` installs the tools, not the package
# (nor torch: the config and the CLI's help import none, tests/commands/test_help_fast.py)
CHECKOUT = str(Path(__file__).resolve().parents[2])

CONFIG_MARKER = "<!-- config-keys -->"
CLI_MARKER = "<!-- cli-help -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_tables() -> str:
    from t2i_gcpo.config import describe, preset_names

    sections: dict[str, list[tuple[str, str, str]]] = {}
    for key, default, text in describe():
        section = key.split(".")[0] if "." in key else "run"
        sections.setdefault(section, []).append((key, default, text))
    out = [f"Presets (`--algo`): {', '.join(f'`{p}`' for p in preset_names())}.", ""]
    for section, rows in sections.items():
        out += [f"## `{section}` {{#{section}}}" if section != "run" else "## Run {#run}", ""]
        out += ["| key | default | meaning |", "|---|---|---|"]
        out += [f"| `{key}` | `{_cell(default)}` | {_cell(text)} |" for key, default, text in rows]
        out.append("")
    return "\n".join(out)


def _help(args: list[str]) -> str:
    from click.testing import CliRunner

    from t2i_gcpo.cli import cli

    result = CliRunner().invoke(cli, [*args, "--help"], prog_name="t2i-gcpo", terminal_width=100)
    if result.exit_code != 0:
        raise RuntimeError(f"t2i-gcpo {' '.join(args)} --help failed: {result.output}")
    return result.output.rstrip()


def cli_pages() -> str:
    import click

    from t2i_gcpo.cli import COMMANDS, cli

    out = ["## t2i-gcpo {#t2i-gcpo}", "", "```text", _help([]), "```", ""]
    for name in COMMANDS:
        command = cli.get_command(click.Context(cli), name)
        out += [f"## t2i-gcpo {name} {{#{name}}}", "", "```text", _help([name]), "```", ""]
        for sub in getattr(command, "commands", {}):
            out += [
                f"### t2i-gcpo {name} {sub} {{#{name}-{sub}}}",
                "",
                "```text",
                _help([name, sub]),
                "```",
                "",
            ]
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs hook signature)
    if CHECKOUT not in sys.path:  # here, not at import: mkdocstrings resets sys.path between pages
        sys.path.insert(0, CHECKOUT)
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_tables())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_pages())
    return markdown
