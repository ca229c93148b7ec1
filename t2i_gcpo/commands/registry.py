"""The commands of ``t2i-gcpo`` (and of its ``eval`` group): a `Registry` of `Command` records, one table row
each, and `LazyGroup`, the click group that lists them from the table and imports a command's module only
when it runs, so that ``--help`` stays fast (torch, transformers and diffusers take seconds to import)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import click

from t2i_gcpo.extensions import Registry


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, the click command it runs (``"module:attribute"``, imported when it runs)
    and the one-line summary ``--help`` shows without importing it."""

    name: str
    target: str
    doc: str


class LazyGroup(click.Group):
    """A click group whose subcommands are the rows of `commands` (a `Registry` of `Command`)."""

    commands_table: Registry[Command]

    def list_commands(self, ctx: click.Context) -> list[str]:
        return self.commands_table.names(plugins=True)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands_table:
            return None
        module, _, attr = self.commands_table[name].target.partition(":")
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = self.commands_table.rows(plugins=True)
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def lazy_group(table: Registry[Command]) -> type[LazyGroup]:
    """The `LazyGroup` class of `table` (click builds the group from its class)."""
    return type(f"LazyGroup_{table.kind.replace(' ', '_')}", (LazyGroup,), {"commands_table": table})


# installed packages add theirs under the t2i_gcpo.commands entry point (docs/guides/commands.md)
COMMANDS: Registry[Command] = Registry("command", plugins="t2i_gcpo.commands")
for _row in (
    Command(
        "train",
        "t2i_gcpo.commands.train:train_cmd",
        "Train a policy: an algorithm preset, any credit scheme (the main job).",
    ),
    Command(
        "sample",
        "t2i_gcpo.commands.sample:sample_cmd",
        "Write images for a prompt file in GenEval's folder layout.",
    ),
    Command(
        "credit-map",
        "t2i_gcpo.commands.credit_map:credit_map_cmd",
        "Draw where each credit scheme puts a sample's credit.",
    ),
    Command(
        "eval",
        "t2i_gcpo.commands.eval:eval_cmd",
        "Evaluate on GenEval, DPG-Bench or ShapeWorld (PyPI-only scorers).",
    ),
    Command(
        "compare",
        "t2i_gcpo.commands.compare:compare_cmd",
        "Train several algorithms × seeds; table and curves.",
    ),
    Command(
        "pretrain",
        "t2i_gcpo.commands.pretrain:pretrain_cmd",
        "Rebuild a shipped model from scratch (ShapeWorld AR or masked prior, arithmetic LM).",
    ),
    Command(
        "reward-server",
        "t2i_gcpo.commands.reward_server:reward_server_cmd",
        "Serve a reward over HTTP for runs that name it remote:http://HOST:PORT.",
    ),
):
    COMMANDS.add(_row)
