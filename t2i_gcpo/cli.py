"""The console script ``t2i-gcpo``.

Subcommands live in ``t2i_gcpo/commands/*.py`` and are imported only when invoked, so ``--help``
stays fast (torch, transformers and diffusers take seconds to import). A `UserError` anywhere
becomes a one-line ``error: …`` and exit code 2.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys

import click

from t2i_gcpo.errors import UserError, one_line
from t2i_gcpo.version import __version__

# name -> ("module:attribute", one-line summary shown by --help without importing the module)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "t2i_gcpo.commands.train:train_cmd",
        "Train a policy: an algorithm preset, any credit scheme (the main job).",
    ),
    "sample": (
        "t2i_gcpo.commands.sample:sample_cmd",
        "Write images for a prompt file in GenEval's folder layout.",
    ),
    "credit-map": (
        "t2i_gcpo.commands.credit_map:credit_map_cmd",
        "Draw where each credit scheme puts a sample's credit.",
    ),
    "eval": (
        "t2i_gcpo.commands.eval:eval_cmd",
        "Evaluate on GenEval, DPG-Bench or ShapeWorld (PyPI-only scorers).",
    ),
    "compare": (
        "t2i_gcpo.commands.compare:compare_cmd",
        "Train several algorithms × seeds; table and curves.",
    ),
    "pretrain": (
        "t2i_gcpo.commands.pretrain:pretrain_cmd",
        "Rebuild a shipped model from scratch (ShapeWorld AR or masked prior, arithmetic LM).",
    ),
    "reward-server": (
        "t2i_gcpo.commands.reward_server:reward_server_cmd",
        "Serve a reward over HTTP for runs that name it remote:http://HOST:PORT.",
    ),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        target, _ = COMMANDS[name]
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, summary) for name, (_, summary) in COMMANDS.items()]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="t2i-gcpo")
def cli() -> None:
    """RL for discrete-token text-to-image generators with token-level credit assignment.

    \b
    Examples:
      t2i-gcpo train --prompts prompts/shapeworld_train.txt
      t2i-gcpo train --prompts prompts/shapeworld_train.jsonl --algo dapo --steps 200 --set rollout.group_size=16
    """


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        cli.main(args=argv, standalone_mode=False)
    except UserError as e:
        click.echo(f"error: {one_line(str(e))}", err=True)
        sys.exit(getattr(e, "exit_code", 2))  # 2: bad input; a run that diverged says 1
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except OSError as e:  # a full disk or a read-only folder under a library's own write: one line
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise
        where = f"cannot write {e.filename}" if e.filename else "cannot write"
        click.echo(f"error: {one_line(f'{where}: {e.strerror or e}')}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
