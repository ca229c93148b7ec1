"""Output folders: one command at a time per folder (`lock_output`), what counts as a run, and the
writes into them, none of which follows a link.

A folder the tool writes may come from someone else (a downloaded run) or sit where others can write
(/tmp). Its entries must be plain files and folders: `lock_output` refuses a folder holding a symbolic
link, a FIFO, a socket or a device anywhere inside it (one line, before any work), and the writes
themselves never follow a link at the last step of their path: the lock is opened with ``O_NOFOLLOW``
(and ``O_NONBLOCK``: a FIFO there cannot hang it), `atomic_write_text` writes a fresh temporary file and
renames it over the name (a rename replaces a link, never writes through it), `open_append` opens with
``O_NOFOLLOW``, and `real_dir` checks a folder about to be written is a folder, not a link to one. The
folder named on the command line may itself be a link: the user chose it.

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

import errno
import json
import os
import socket
import stat
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

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


def lock_output(folder: str | os.PathLike, command: str | None = None, check_tree: bool = True) -> OutputLock:
    """Lock `folder` (created if missing) for this process, or raise a UserError naming the process
    that holds it. `command` is recorded for that message (default: this process's command line).
    `check_tree`: refuse a folder holding a link or a special file (`check_plain_tree`); a caller that
    first checks the folder is its own (a new run's is empty) passes False and checks it then."""
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
        fd = _open_lock(path, created)
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
            same = os.fstat(fd).st_ino == os.lstat(path).st_ino
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
    lock = OutputLock(folder, fd, created)
    if check_tree:
        try:
            check_plain_tree(folder)
        except BaseException:
            lock.release()
            raise
    return lock


def _open_lock(path: Path, created: list[Path]) -> int:
    """The lock file's descriptor: created if missing, never through a link, never blocking on a FIFO;
    anything but a plain file there is a one-line UserError."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as e:
        _remove_empty(created)
        raise UserError(_unwritable(path, e)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        _remove_empty(created)
        raise UserError(_unwritable(path))
    return fd


def _unwritable(path: Path, e: OSError | None = None) -> str:
    """The message for a file the tool writes that it cannot open as a plain file."""
    if e is not None and e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EEXIST):
        return f"cannot write {path}: {e.strerror or e}"
    return f"{path} is {_not_plain(path)}, where t2i-gcpo writes a file of its own; remove it"


def _not_plain(path: Path) -> str:
    """What `path` is, for a message about an entry that should be a plain file or folder."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "unreadable"
    if stat.S_ISLNK(mode):
        return f"a symbolic link (to {os.readlink(path)})"
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):  # fmt: skip
        if test(mode):
            return name
    return "not a plain file"


def check_plain_tree(folder: Path) -> None:
    """Refuse (one-line UserError) an output folder holding, anywhere inside, an entry the tool would
    write through or into elsewhere: a symbolic link, a FIFO, a socket or a device."""
    for root, dirs, files in os.walk(folder):  # never descends through a link
        for name in (*dirs, *files):
            path = Path(root) / name
            mode = os.lstat(path).st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise UserError(
                    f"{path} is {_not_plain(path)}: t2i-gcpo writes only plain files and folders in {folder} "
                    "and does not write through links; remove it or choose another folder"
                )


def real_dir(path: Path) -> Path:
    """`path` as a folder about to be written: created if missing; a link or a file there is a one-line
    UserError (a link would send the writes, and the pruning of old checkpoints, elsewhere)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        pass
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        raise UserError(f"{path} is {_not_plain(path)}, where t2i-gcpo writes a folder of its own; remove it")
    return path


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and `os.replace`: a reader
    sees the old content or the new one, never a part, and a link at `path` is replaced, never written
    through."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def open_append(path: Path) -> IO[str]:
    """`path` opened to append text (created if missing), never through a link (a one-line UserError)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     0o644)  # fmt: skip
    except OSError as e:
        raise UserError(_unwritable(path, e)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(_unwritable(path))
    return os.fdopen(fd, "a", encoding="utf-8")


SIDE_FILE_BYTES = 64 << 20  # a run folder's JSON/YAML side files are small; more is not one of ours


def read_side_text(path: Path) -> str:
    """The text of a small side file the tool wrote in a folder (trainer_state.json, eval.json, …): a
    plain file, read without following a link or blocking on a FIFO, UTF-8; else a one-line UserError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        what = _not_plain(path) if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO) else e.strerror
        raise UserError(f"cannot read {path}: {what}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"cannot read {path}: it is {_not_plain(path)}")
        if info.st_size > SIDE_FILE_BYTES:
            raise UserError(
                f"{path} holds {info.st_size} bytes, too many for a file t2i-gcpo wrote (damaged?)"
            )
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text (damaged file?)") from None


def parse_json(text: str, where: str) -> Any:
    """`text` parsed as JSON; malformed or absurdly nested JSON is a one-line UserError naming `where`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{where} is not valid JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise UserError(f"{where} is nested too deeply to be a file t2i-gcpo wrote (damaged?)") from None


def read_side_json(path: Path) -> Any:
    """A side file's JSON (see `read_side_text`), or a one-line UserError naming it."""
    return parse_json(read_side_text(path), str(path))


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
