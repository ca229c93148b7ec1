"""Output folders and the files the tool writes and reads: one command at a time per folder
(`lock_output`), what counts as a run, one writer that never follows a link (`write_file`, `append_text`)
and one reader that trusts nothing it reads (`read_json`, `read_jsonl`, `read_yaml`).

A folder the tool writes may come from someone else (a downloaded run) or sit where others can write
(/tmp). Its entries must be plain files and folders: `lock_output` refuses a folder holding a symbolic
link, a FIFO, a socket or a device anywhere inside it (one line, before any work), and every write goes
through `write_file` or `append_text`, which check again at the moment of writing: the folders from the
one named on the command line down to the file are opened one by one without following a link (a link
planted there while a run trains is one line, its target untouched), the content goes to a fresh
temporary file in that folder (``O_EXCL | O_NOFOLLOW``), is synced and renamed over the name (a rename
replaces a link, never writes through it); an append opens with ``O_NOFOLLOW`` and refuses a file with
another hard link (it would write into the other name's file), as the lock does. A write that fails (a full
disk, a read-only folder) removes what it had written and is one line (`WriteError`, exit status 1). The
folder named on the command line may itself be a link: the user chose it.

Every JSON, JSONL and YAML file the tool reads goes through `read_json` / `read_jsonl` / `read_yaml`: a
plain file, read without following a link or blocking on a FIFO, of a bounded size and nesting depth, and,
where the caller gives a `schema`, of the types it declares (pydantic, strict): anything else is one line
naming the file and the field.

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
import functools
import json
import os
import secrets
import socket
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from typing_extensions import TypedDict

from t2i_gcpo.errors import UserError, not_a_file, shorten

LOCK_NAME = ".t2i-gcpo.lock"
RUN_MARKER = ".t2i-gcpo-run"  # written into a run directory before its config.yaml


class LockRecord(TypedDict):
    """The lock file's record of its holder."""

    pid: int
    host: str
    command: str


class SettingsRecord(TypedDict):
    """`SETTINGS_RECORD`: the command that made a folder and the options that decide what it holds."""

    command: str
    settings: dict[str, Any]


class WriteError(UserError):
    """A file could not be written (a full disk, a read-only folder): what was written is removed. Not a
    usage error: exit status 1."""

    exit_code = 1


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
        info = parse_json(text, LOCK_NAME, LockRecord)
    except UserError:
        return "another process"
    return f"pid {info['pid']} on {info['host']} ({shorten(info['command'], 120)})"


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
                f"{folder} is in use by {_holder(text)}; wait for it to end or stop it, or "
                f"choose another folder"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.lstat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file between our open and our lock: try again
    stale = os.read(fd, 4096).decode("utf-8", "replace").strip()
    lock = OutputLock(folder, fd, created)
    try:  # rewritten in place: a full disk is one line, and the folder made for it goes again
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
    except OSError as e:
        lock.release()
        raise WriteError(f"cannot write the lock file {path}: {e.strerror or e}") from None
    if stale:  # a holder that ended without releasing (killed): its lock is ours now
        print(f"note: took over the lock of {_holder(stale)}, which no longer runs", file=sys.stderr)
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
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        _remove_empty(created)
        raise UserError(_unwritable(path, hard_link=stat.S_ISREG(info.st_mode)))
    return fd


def _unwritable(path: Path, e: OSError | None = None, hard_link: bool = False) -> str:
    """The message for a file the tool writes that it cannot open as a plain file of its own."""
    if e is not None and e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EEXIST):
        return f"cannot write {path}: {e.strerror or e}"
    if hard_link:  # rewritten in place, it would change the other name's file too
        return (
            f"{path} is a hard link (one file under two names), where t2i-gcpo writes a file of its own; "
            "remove it"
        )
    return f"{path} is {_not_plain(path)}, where t2i-gcpo writes a file of its own; remove it"


def _not_plain(path: Path) -> str:
    """What `path` is, for a message about an entry that should be a plain file or folder."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "unreadable"
    if stat.S_ISLNK(mode):
        return f"a symbolic link (to {os.readlink(path)})"
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISREG, "a file"),
    ):
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


# ------------------------------------------------------------------------ writes: never through a link

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _open_folder(folder: Path, within: Path | None = None) -> int:
    """A descriptor of `folder`, about to be written: each folder below `within` (the folder the command
    was given, or one of its own above `folder`) down to `folder` opened without following a link, created
    where missing. A link, a file or anything else where a folder belongs is a one-line UserError (a link
    would send the writes elsewhere). `within` itself (default: `folder`) is opened as it is: the user named
    it, and it may be a link."""
    folder = Path(folder)
    base = Path(within) if within is not None else folder
    parts = folder.relative_to(base).parts if folder != base else ()
    try:
        base.mkdir(parents=True, exist_ok=True)
        fd = os.open(base, _DIR_FLAGS)
    except OSError as e:
        raise WriteError(f"cannot write in {base}: {e.strerror or e}") from None
    path = base
    for part in parts:
        path = path / part
        try:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            child = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EEXIST):
                raise UserError(
                    f"{path} is {_not_plain(path)}, where t2i-gcpo writes a folder of its own; remove it"
                ) from None
            raise WriteError(f"cannot write in {path}: {e.strerror or e}") from None
        os.close(fd)
        fd = child
    return fd


def real_dir(path: Path, within: Path | None = None) -> Path:
    """`path` as a folder about to be written (see `_open_folder`; default `within`: its parent, so `path`
    itself is checked): created if missing; a link or a file there is a one-line UserError (a link would
    send the writes, and the pruning of old checkpoints, elsewhere)."""
    path = Path(path)
    os.close(_open_folder(path, within if within is not None else path.parent))
    return path


Content = str | bytes | Callable[[IO[bytes]], Any]


def write_file(
    path: str | os.PathLike,
    content: Content,
    within: str | os.PathLike | None = None,
    by_name: Callable[[str], Any] | None = None,
) -> Path:
    """Write `path` whole, never through a link: its folders re-checked (`_open_folder`, from `within`
    down), `content` — text (UTF-8), bytes, or a function writing to a binary file object (a PIL image's
    ``save``, a figure's ``savefig``) — written to a fresh temporary file in the same folder, synced and
    renamed over `path`: a reader sees the old file or the new one, and a link at `path` is replaced, never
    written through. `by_name`: instead of `content`, a function given the temporary file's path, for a
    library that opens files by name (safetensors); the file is checked to be a plain file still before it
    is renamed. A failure (a full disk) removes the temporary file: a one-line `WriteError`."""
    path = Path(path)
    folder = _open_folder(path.parent, None if within is None else Path(within))
    tmp = f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder
        )
        try:
            with os.fdopen(fd, "wb") as f:
                if by_name is not None:
                    by_name(str(path.parent / tmp))
                elif callable(content):
                    content(f)
                else:
                    f.write(content.encode("utf-8") if isinstance(content, str) else content)
                f.flush()
                os.fsync(f.fileno())
            if by_name is not None:  # the library may have made the file again: a plain file, still
                info = os.stat(tmp, dir_fd=folder, follow_symlinks=False)
                if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
                    raise UserError(f"{path.parent / tmp} was replaced while t2i-gcpo wrote it")
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=folder)
            except OSError:
                pass
            raise
    except OSError as e:
        if e.errno == errno.EISDIR:
            raise UserError(_unwritable(path)) from None
        raise WriteError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        os.close(folder)
    return path


def atomic_write_text(path: Path, text: str, within: Path | None = None) -> Path:
    """`write_file` of a text."""
    return write_file(path, text, within)


def _open_plain_append(path: Path, within: Path | None = None) -> int:
    """A descriptor appending to `path` (created if missing), never through a link and never to a file
    with another name (a hard link); else a one-line UserError."""
    folder = _open_folder(path.parent, within)
    try:
        fd = os.open(
            path.name,
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            0o644,
            dir_fd=folder,
        )
    except OSError as e:
        raise UserError(_unwritable(path, e)) from None
    finally:
        os.close(folder)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        raise UserError(_unwritable(path, hard_link=stat.S_ISREG(info.st_mode)))
    return fd


def open_append(path: Path, within: Path | None = None, binary: bool = False) -> IO:
    """`path` opened to append (created if missing; see `_open_plain_append`), kept open by the caller (a
    log that a child process writes, TensorBoard's event file): a link planted at the name later changes
    nothing, the writes go to the file opened."""
    fd = _open_plain_append(Path(path), within)
    return os.fdopen(fd, "ab") if binary else os.fdopen(fd, "a", encoding="utf-8")


def append_text(path: Path, text: str, within: Path | None = None) -> None:
    """Append `text` to `path` (see `_open_plain_append`); a failed write (a full disk) cuts the file back
    to what it held, so no half line is left, and is a one-line `WriteError`."""
    path = Path(path)
    fd = _open_plain_append(path, within)
    size = os.fstat(fd).st_size
    try:
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data) :]
    except OSError as e:
        try:
            os.ftruncate(fd, size)
        except OSError:
            pass
        raise WriteError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def sync_file(path: Path) -> None:
    """What was appended to `path` (a plain file) written through to the disk (fsync); no file: nothing to do.
    The trainer syncs metrics.jsonl before each checkpoint, so every row up to it survives a crash."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------------ reads: bounded and typed

SIDE_FILE_BYTES = 64 << 20  # a run folder's JSON/YAML side files are small; more is not one of ours
MAX_DEPTH = 64  # nesting of a JSON or YAML value: the deepest the tool writes is a handful of levels


def read_side_text(path: Path, limit: int = SIDE_FILE_BYTES, follow: bool = False) -> str:
    """The text of a file the tool reads (a side file of a folder it wrote, a record, a prompt file): a plain
    file, read without blocking on a FIFO and (unless `follow`: a file the user named, a checkpoint's, which
    a model cache links) without following a link, at most `limit` bytes, UTF-8; else a one-line UserError."""
    data = read_bytes(path, limit, follow)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text (damaged file?)") from None


def read_bytes(path: Path, limit: int = SIDE_FILE_BYTES, follow: bool = False) -> bytes:
    """The bytes of a plain file (see `read_side_text`), at most `limit` of them."""
    try:
        fd = os.open(path, os.O_RDONLY | (0 if follow else os.O_NOFOLLOW) | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        what = _not_plain(path) if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO) else e.strerror
        raise UserError(f"cannot read {path}: {'not found' if e.errno == errno.ENOENT else what}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"cannot read {path}: it is {_not_plain(path)}")
        if info.st_size > limit:
            raise UserError(f"{path} holds {info.st_size} bytes, more than a file t2i-gcpo reads ({limit})")
        try:
            return f.read(limit + 1)
        except OSError as e:
            raise UserError(f"cannot read {path}: {e.strerror or e}") from None


def _too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` (parsed JSON or YAML) nests lists and mappings deeper than `limit` (no recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list, tuple)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return False


def _deep(where: str) -> UserError:
    what = f"{where} is nested" if where else "nested"
    return UserError(f"{what} too deeply (over {MAX_DEPTH} levels) to be what t2i-gcpo reads (damaged?)")


@functools.cache
def _adapter(schema: Any) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(schema)


def check_schema(data: Any, schema: Any, where: str) -> Any:
    """`data` validated against `schema` (a type pydantic checks: a TypedDict, a list of them …, strict),
    as pydantic returns it; else a one-line UserError naming `where` and the field."""
    from pydantic import ValidationError

    try:
        return _adapter(schema).validate_python(data, strict=True)
    except ValidationError as e:
        error = e.errors(include_url=False)[0]
        field = ".".join(str(p) for p in error["loc"])
        got = shorten(repr(error["input"]), 60)
        at = f"'{field}'" if field else "its content"
        prefix = f"{where}: " if where else ""
        raise UserError(f"{prefix}{at}: {error['msg'].lower()}, got {got} (damaged or edited?)") from None


def parse_json(text: str, where: str, schema: Any = None) -> Any:
    """`text` parsed as JSON (`where` names it in errors; "": the caller names it): malformed, nested deeper
    than MAX_DEPTH, or (with a `schema`) not of its types is a one-line UserError."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        at = f"line {e.lineno} column {e.colno}: {e.msg}"
        raise UserError(
            f"{where} is not valid JSON ({at})" if where else f"malformed JSON ({e.msg})"
        ) from None
    except RecursionError:
        raise _deep(where) from None
    if _too_deep(value):
        raise _deep(where)
    return value if schema is None else check_schema(value, schema, where)


def read_json(
    path: str | os.PathLike, schema: Any = None, limit: int = SIDE_FILE_BYTES, follow: bool = False
) -> Any:
    """A JSON file's value (see `read_side_text`, `parse_json`), or a one-line UserError naming it."""
    return parse_json(read_side_text(Path(path), limit, follow), str(path), schema)


def read_jsonl(
    path: str | os.PathLike,
    schema: Any = None,
    limit: int = SIDE_FILE_BYTES,
    skip_last_partial: bool = False,
    follow: bool = False,
) -> list:
    """The values of a JSON Lines file, one per non-empty line, each as `parse_json` checks it (an error
    names the file and line). `skip_last_partial`: a last line that does not parse is dropped (cut short
    by a crash while it was written)."""
    lines = read_side_text(Path(path), limit, follow).splitlines()
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(parse_json(line, f"{path}:{i + 1}", schema))
        except UserError:
            if skip_last_partial and i == len(lines) - 1:
                break
            raise
    return rows


def read_lines(
    path: str | os.PathLike, what: str, suffixes: Mapping[str, str]
) -> tuple[Path, list[tuple[int, str]]]:
    """(the file, its lines with their numbers) of the text file `path` a user gave — a prompt or problem
    file — leaving out blank lines and, in a ``.txt`` file, lines starting with "#". `what` names the file
    in messages ("prompt file"); `suffixes` maps each ending it takes to what a file of it holds
    (``{".txt": "prompts", ".jsonl": "GenEval metadata"}``). A folder, a missing file, something that is not
    a regular file (a FIFO, a device), another ending, text that is not UTF-8 or a file that cannot be read
    is a one-line UserError naming it; a UTF-8 byte-order mark is ignored."""
    p = Path(path)
    problem = not_a_file(p)
    if problem:
        raise UserError(f"{what} {p} {problem}")
    if p.suffix not in suffixes:
        endings = " or ".join(f"{end} ({holds})" for end, holds in suffixes.items())
        raise UserError(f"{what} {p} must end in {endings}")
    try:
        lines = p.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {p} is not UTF-8 text ({e.reason})") from None
    except OSError as e:
        raise UserError(f"cannot read {what} {p}: {e.strerror or e}") from None
    comments = p.suffix == ".txt"
    kept = [
        (n, line)
        for n, line in enumerate(lines, start=1)
        if line.strip() and not (comments and line.lstrip().startswith("#"))
    ]
    return p, kept


def read_yaml(
    path: str | os.PathLike, what: str = "config file", limit: int = SIDE_FILE_BYTES, follow: bool = False
) -> Any:
    """A YAML file's value, parsed the safe way without aliases (`yaml_value`), or a one-line UserError
    naming it (`what`: how the message names the file)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{what} {path} is a directory, expected a YAML file")
    if not path.exists() and not path.is_symlink():
        raise UserError(f"{what} not found: {path}")
    if not path.is_file() and not path.is_symlink():  # a FIFO, a socket, a device
        raise UserError(f"{what} {path} {not_a_file(path)}")
    try:
        text = read_side_text(path, limit, follow)
    except UserError as e:
        raise UserError(f"{what} {path}: {e}") from None
    return yaml_value(text, f"{what} {path}")


def yaml_value(text: str, where: str) -> Any:
    """`text` parsed as YAML with the safe loader, aliases refused (a few hundred bytes of nested aliases
    expand to gigabytes), nesting bounded; a one-line UserError naming `where` otherwise."""
    import yaml

    try:
        value = yaml.load(text, Loader=_no_alias_loader())  # noqa: S506 — a SafeLoader subclass
    except RecursionError:
        raise _deep(where) from None
    except yaml.YAMLError as e:
        raise UserError(f"{where} is not valid YAML: {' '.join(str(e).split())}") from None
    if _too_deep(value):
        raise _deep(where)
    return value


@functools.cache
def _no_alias_loader() -> type:
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        """YAML's safe loader without aliases (``*name``): a config has no use for them."""

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, "aliases (*name) are not accepted in a config: write the value out", mark
                )
            return super().compose_node(parent, index)

    return NoAliasLoader


def read_side_json(path: Path, schema: Any = None) -> Any:
    """`read_json` (the name the run-folder readers use)."""
    return read_json(path, schema)


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
    if not path.exists() and not path.is_symlink():
        return None
    try:
        return read_json(path, SettingsRecord)
    except UserError as e:
        raise UserError(f"{e}: not a settings record t2i-gcpo wrote; choose another --out") from None


def check_settings_record(
    folder: Path, command: str, settings: Mapping[str, Any], redo: str | None = None, redoing: bool = False
) -> bool:
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
        raise UserError(
            f"{folder} holds the output of `t2i-gcpo {record['command']}`, not `{command}`; "
            "choose another --out"
        )
    if settings_differences(record["settings"], settings):
        if redoing:
            return False
        todo = (
            f"give {redo} to redo it there, or choose another --out"
            if redo
            else (f"choose another --out, or remove {folder} to start again")
        )
        raise UserError(
            f"{folder} was made by `{command}` with {describe_differences(record['settings'], settings)}"
            f"; {todo}"
        )
    return True


def write_settings_record(folder: Path, command: str, settings: Mapping[str, Any]) -> None:
    """Record in `folder` that `command` works there with `settings` (before its first output, so that
    an interrupted command's work is recorded too). Written whole (`write_file`)."""
    text = json.dumps({"command": command, "settings": dict(settings)}, indent=1, sort_keys=True, default=str)
    write_file(Path(folder) / SETTINGS_RECORD, text)
