"""User-facing errors, and the checks of user-given paths that raise them.

Anything raised as `UserError` is printed by the CLI as one line (``error: …``) with exit code 2,
never as a traceback. Raise it for bad input: wrong paths, malformed files, unknown words or keys.

This module is the floor of the package (it imports nothing from t2i_gcpo), so every layer can use:

- `check_writable_dir(path, what)`: refuse an output folder that is a file or cannot be written,
  before any work is done;
- `check_file(path, what)`: an expected file that is a directory ("is a directory"), not a regular
  file, or missing.

Reading and writing the files themselves: `t2i_gcpo.outdir` (one reader, one writer).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class UserError(Exception):
    """Bad input from the user; the message is shown as is, on one line."""


class RewardError(UserError):
    """A reward failed (raised, returned NaN/inf, or returned the wrong number of scores)."""


def not_a_file(path: str | os.PathLike) -> str | None:
    """Why `path` is not a regular file to read ("does not exist", "is a directory, not a file", "is a named
    pipe (FIFO), not a regular file" …), or None where it is one."""
    import stat

    p = Path(path)
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        return "is a broken symbolic link" if p.is_symlink() else "does not exist"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    except ValueError:  # a NUL byte: no file system takes the name
        return "is not a path (it holds a NUL byte)"
    if stat.S_ISREG(mode):
        return None
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    kind = next((name for test, name in kinds if test(mode)), "not a plain file")
    return f"is {kind}, not a file" if kind == "a directory" else f"is {kind}, not a regular file"


def check_writable_dir(path: str | os.PathLike, what: str) -> Path:
    """Raise `UserError` unless `path` is a directory this process can create files in, or can be
    created as one (`what` names it in the message, e.g. "--out"). Leaves nothing behind: a probe
    folder is made in the nearest existing directory and removed at once (permission bits alone do
    not tell: root, read-only mounts, /proc)."""
    p = Path(path)
    existing = p
    while not existing.exists():
        if existing.is_symlink():
            raise UserError(f"{what} {p}: {existing} is a broken symbolic link")
        existing = existing.parent
    if not existing.is_dir():
        where = f"{what} {p}" if existing == p else f"{what} {p}: {existing}"
        raise UserError(f"{where} is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".t2i-gcpo-write-test-", dir=existing))
    except OSError as e:
        where = "" if existing == p else f" (cannot create folders in {existing})"
        raise UserError(f"{what} {p} is not writable{where}: {e.strerror or e}") from None
    return p


def check_file(path: str | os.PathLike, what: str = "") -> Path:
    """`path` as a Path if it is a file; else a `UserError` saying it is a directory, something other than
    a regular file (a FIFO, a device: reading it could block) or not found."""
    p = Path(path)
    label = f"{what} {p}" if what else str(p)
    problem = not_a_file(p)
    if problem == "does not exist":
        raise UserError(f"{label} not found")
    if problem:
        raise UserError(f"{label} {problem}")
    return p


TOKEN_CHARS = 200  # an error line shows at most this many characters of one word (a path fits)


def one_line(message: str) -> str:
    """`message` as the one line the CLI prints: whitespace collapsed, every word longer than
    TOKEN_CHARS cut (an unknown 10 MB word is not echoed whole), whatever raised it."""
    return " ".join(shorten(word, TOKEN_CHARS) for word in message.split())


ECHO_CHARS = 80  # error messages show at most this many characters of user text (a prompt)


def shorten(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` cut to `limit` characters, ending in "…" when cut (for error messages)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
