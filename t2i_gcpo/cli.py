"""The console script ``t2i-gcpo``.

Subcommands live in ``t2i_gcpo/commands/*.py``, listed in the table of commands/registry.py and imported
only when invoked, so ``--help`` stays fast (torch, transformers and diffusers take seconds to import). A
`UserError` anywhere becomes a one-line ``error: …`` and exit code 2.
"""

from __future__ import annotations

import errno
import os
import sys

import click

from t2i_gcpo.commands.registry import COMMANDS, lazy_group
from t2i_gcpo.errors import UserError, one_line
from t2i_gcpo.version import __version__


@click.group(cls=lazy_group(COMMANDS), context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="t2i-gcpo")
def cli() -> None:
    """RL for discrete-token text-to-image generators with token-level credit assignment.

    \b
    Examples:
      t2i-gcpo train --prompts prompts/shapeworld_train.txt
      t2i-gcpo train --prompts prompts/shapeworld_train.jsonl --algo dapo --steps 200 \\
          --set rollout.group_size=16
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
