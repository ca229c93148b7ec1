"""Output folders: one command at a time per folder (`lock_output`), and what counts as a run.

The lock is an exclusive `flock` on ``<folder>/.t2i-gcpo.lock``, taken without waiting. The kernel
drops it when its process ends, however it ends (kill -9 included), so a lock left by a dead process
is never mistaken for a live one: the next command takes the file over (and says whose it was). The
file records the holder (pid, host, command) so that a refused command can name it. On release the
file is removed; a holder checks after locking that the file it locked is still the one at the path,
so a command racing with a release never locks a removed file.

(fcntl directly rather than the `filelock` package: filelock gives a lock but no record of who holds
it, and naming the holder means writing that record into the locked file and reading it from the
refused process, which is most of the code here around the one `flock` call.)
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from t2i_gcpo.errors import UserError, shorten

LOCK_NAME = ".t2i-gcpo.lock"
RUN_MARKER = ".t2i-gcpo-run"  # written into a run directory before its config.yaml


class OutputLock:
    """An exclusive lock on one output folder; `release()` (or leaving the `with` block) frees it."""

    def __init__(self, folder: Path, fd: int, created: list[Path]) -> None:
        self.folder, self._fd, self._created = folder, fd, created

    def release(self) -> None:
        if self._fd is None:
            return
        (self.folder / LOCK_NAME).unlink(missing_ok=True)  # while still held: no one locks a removed file
        os.close(self._fd)
        self._fd = None
        _remove_empty(self._created)

    def __del__(self) -> None:  # a lock nobody holds any more (a prepared run never started) frees its folder
        try:
            self.release()
        except Exception:  # at interpreter exit: the kernel frees the lock anyway
            pass

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _remove_empty(created: list[Path]) -> None:
    """Remove the folders made only to hold the lock, innermost first, while empty (a refused command
    leaves no trace)."""
    for folder in created:
        try:
            folder.rmdir()
        except OSError:
            break


def _holder(text: str) -> str:
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']} ({shorten(str(info['command']), 120)})"
    except (ValueError, KeyError, TypeError):
        return "another process"


def lock_output(folder: str | os.PathLike, command: str | None = None) -> OutputLock:
    """Lock `folder` (created if missing) for this process, or raise a UserError naming the process
    that holds it. `command` is recorded for that message (default: this process's command line)."""
    import fcntl

    folder = Path(folder)
    created = []
    missing = folder
    while not missing.exists():
        created.append(missing)
        missing = missing.parent
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command or " ".join(["t2i-gcpo", *sys.argv[1:]]),
    }
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            text = os.read(fd, 4096).decode("utf-8", "replace")
            os.close(fd)
            _remove_empty(created)
            raise UserError(
                f"{folder} is in use by {_holder(text)}; wait for it to end or stop it, or choose another folder"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file between our open and our lock: try again
    stale = os.read(fd, 4096).decode("utf-8", "replace").strip()
    if stale:  # a holder that ended without releasing (killed): its lock is ours now
        print(f"note: took over the lock of {_holder(stale)}, which no longer runs", file=sys.stderr)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    return OutputLock(folder, fd, created)


def is_run_dir(folder: Path) -> bool:
    """A folder `t2i-gcpo train` made: its saved config.yaml, with the run marker or (runs of earlier
    versions) metrics or checkpoints beside it."""
    return (folder / "config.yaml").is_file() and any(
        (folder / name).exists() for name in (RUN_MARKER, "metrics.jsonl", "checkpoints")
    )


def foreign_entries(folder: Path) -> list[str]:
    """Names in `folder` that no t2i-gcpo command wrote there before any work (the lock, the run
    marker, and the train.log `compare` opens before it starts a run there)."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.name not in (LOCK_NAME, RUN_MARKER, "train.log"))


# ------------------------------------------------------------------------ the settings that made a folder

SETTINGS_RECORD = ".t2i-gcpo-settings.json"  # {"command": "compare", "settings": {"--steps": 200, …}}


def flat_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`settings` canonicalised for comparison: as JSON reads it back (tuples as lists, keys as strings),
    one level of mappings flattened to (option, key) pairs — `{"--set": {"optim.lr": 1e-3}}` holds the
    pair ("--set", "optim.lr") — so that the order in which options were given never matters."""
    data = json.loads(json.dumps(dict(settings), default=str))
    flat: dict[Any, Any] = {}
    for name, value in data.items():
        if isinstance(value, dict):
            flat.update({(name, key): v for key, v in value.items()})
        else:
            flat[name] = value
    return flat


def settings_differences(recorded: Mapping[str, Any], wanted: Mapping[str, Any]) -> list:
    """The settings (names, or (option, key) pairs of a mapping) whose values differ, in `wanted`'s order."""
    a, b = flat_settings(recorded), flat_settings(wanted)
    missing = object()
    return [k for k in dict.fromkeys([*b, *a]) if a.get(k, missing) != b.get(k, missing)]


def _setting(name: Any, flat: dict[Any, Any]) -> str:
    if name not in flat:
        return f"no {' '.join(name) if isinstance(name, tuple) else name}"
    value = flat[name]
    shown = (
        "(default)" if value is None else shorten(value if isinstance(value, str) else json.dumps(value), 80)
    )
    return f"{name[0]} {name[1]}={shown}" if isinstance(name, tuple) else f"{name} {shown}"


def describe_differences(recorded: Mapping[str, Any], wanted: Mapping[str, Any]) -> str:
    """ "--steps 200, --set optim.lr=0.001 (this command: --steps 100, no --set optim.lr)"."""
    keys = settings_differences(recorded, wanted)
    a, b = flat_settings(recorded), flat_settings(wanted)
    return (
        f"{', '.join(_setting(k, a) for k in keys)} (this command: {', '.join(_setting(k, b) for k in keys)})"
    )


def read_settings_record(folder: Path) -> dict | None:
    """The record a command left in `folder` ({"command", "settings"}), None when there is none."""
    path = Path(folder) / SETTINGS_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        record = None
    if not (isinstance(record, dict) and isinstance(record.get("command"), str)
            and isinstance(record.get("settings"), dict)):  # fmt: skip
        raise UserError(f"{path} is not a settings record t2i-gcpo wrote; choose another --out")
    return record


def check_settings_record(folder: Path, command: str, settings: Mapping[str, Any], redo: str | None = None,
                          redoing: bool = False) -> bool:  # fmt: skip
    """Whether `folder` holds work of `command` made with these `settings` (True: continue or redo it
    there) or no record at all (False; a record alone, of a command that stopped before its first
    output, counts as none). A training run's folder, a record of another command, or one of other
    settings is a UserError naming what differs and what to do (`redo`: the flag that redoes the work
    anyway; `redoing`: it was given, and other settings of the same command pass)."""
    if is_run_dir(folder):
        raise UserError(f"{folder} holds a training run (t2i-gcpo train); choose another --out")
    record = read_settings_record(folder)
    if record is None or not [p for p in folder.iterdir() if p.name not in (LOCK_NAME, SETTINGS_RECORD)]:
        return False
    if record["command"] != command:
        raise UserError(f"{folder} holds the output of `t2i-gcpo {record['command']}`, not `{command}`; "
                        "choose another --out")  # fmt: skip
    if settings_differences(record["settings"], settings):
        if redoing:
            return False
        todo = f"give {redo} to redo it there, or choose another --out" if redo else (
            f"choose another --out, or remove {folder} to start again")  # fmt: skip
        raise UserError(
            f"{folder} was made by `{command}` with {describe_differences(record['settings'], settings)}; {todo}"
        )
    return True


def write_settings_record(folder: Path, command: str, settings: Mapping[str, Any]) -> None:
    """Record in `folder` that `command` works there with `settings` (before its first output, so that
    an interrupted command's work is recorded too). Written whole: a temporary file, then a rename."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{SETTINGS_RECORD}.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump({"command": command, "settings": dict(settings)}, f, indent=1, sort_keys=True, default=str)
    os.replace(tmp, folder / SETTINGS_RECORD)
