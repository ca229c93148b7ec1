"""Importing a function of the user's named ``path/to/file.py:function`` or ``module:function`` (a
credit scheme given with ``--credit``, a reward with ``--reward``), with every failure a one-line
UserError; and the guard that keeps a run folder from running code of its own.

A run folder's config.yaml names code (``credit.scheme``, ``reward``), and a run folder may come from
someone else. While `run_code_guard` is active (``train --resume``, ``compare`` continuing its runs),
`import_function` imports only code of a kind the user named again on the command line or, with
``--trust-run-code``, the code the run recorded when it started, byte for byte (its sha256). Anything
else is a one-line UserError saying how to opt in; nothing of the file runs (docs/errors.md#run-code).
A ``.py`` file is executed from the very bytes whose hash was checked, and no ``__pycache__`` is
written next to it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from t2i_gcpo.errors import UserError, not_a_file

# what a run records for a function given as a Python object that no string can import again
PYTHON_OBJECT = "<python>"


def is_function_spec(spec: str) -> bool:
    """Whether `spec` reads as ``module:function`` or ``file.py:function`` (both parts non-empty)."""
    module, sep, func = spec.rpartition(":")
    return bool(sep and module and func)


def canonical_spec(spec: str) -> str:
    """A ``file.py:function`` spec with the file's absolute path (resumable from another directory);
    anything else as it is."""
    module, sep, func = spec.rpartition(":")
    if sep and module.endswith(".py"):
        return f"{Path(module).expanduser().resolve()}:{func}"
    return spec


# the command-line option that names each kind of user code again on --resume
OPTIONS = {"credit scheme": "--credit", "reward": "--reward"}


@dataclass(frozen=True)
class RunCodeGuard:
    """What a resumed run may import of the code its folder names (see the module docstring)."""

    source: str  # the file that names the code (the run's config.yaml), for the messages
    named: frozenset[str] = frozenset()  # kinds named again on the command line ("credit scheme", "reward")
    trust: bool = False  # --trust-run-code: the code the run recorded at its start, unchanged
    # absolute path → sha256 of each file the run read at its start (None: a run from before records)
    recorded: Mapping[str, str] | None = None
    allow_changed: bool = False  # --allow-changed-inputs: a recorded file's new content is accepted
    specs: Mapping[str, str] = field(default_factory=dict)  # kind → the whole spec the run records (a sum)
    folder: Path | None = None  # the run folder: code inside it is named as such
    remedy: str | None = None  # what to do instead of naming the code ({folder}: the run folder; compare)


_GUARD: ContextVar[RunCodeGuard | None] = ContextVar("t2i_gcpo_run_code_guard", default=None)


@contextmanager
def run_code_guard(guard: RunCodeGuard) -> Iterator[RunCodeGuard]:
    """Import user code only as `guard` allows while the block runs (this thread and its tasks)."""
    token = _GUARD.set(guard)
    try:
        yield guard
    finally:
        _GUARD.reset(token)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def module_files(module: str) -> list[Path] | None:
    """The source files importing the dotted `module` runs — each package's ``__init__.py`` on the way,
    then the module's own file (resolved) — found without importing anything: from the modules already
    imported, else by walking sys.path as Python's path finder does for source files (a regular package
    before a module file before a namespace folder). None where it is not found that way (a compiled
    module, a zip, a namespace package spread over several entries)."""
    parts = module.split(".")
    if not all(part.isidentifier() for part in parts):
        return None
    loaded = [sys.modules.get(".".join(parts[: i + 1])) for i in range(len(parts))]
    if all(m is not None for m in loaded):
        files = [getattr(m, "__file__", None) for m in loaded]
        return [Path(f).resolve() for f in files if f] or None
    for entry in sys.path:
        found = _walk(Path(entry or "."), parts)
        if found is not None:
            return found
    return None


def _walk(folder: Path, parts: list[str]) -> list[Path] | None:
    """`module_files` within one sys.path entry `folder`."""
    files: list[Path] = []
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        package, source = folder / part, folder / f"{part}.py"
        if (package / "__init__.py").is_file():
            files.append((package / "__init__.py").resolve())
            if last:
                return files
            folder = package
        elif source.is_file():
            return [*files, source.resolve()] if last else None
        elif package.is_dir() and not last:  # a namespace package: no file of its own runs
            folder = package
        else:
            return None
    return None


def _read(path: Path | None) -> bytes | None:
    try:
        return path.read_bytes() if path is not None else None
    except OSError:
        return None


def code_files(spec: str) -> list[Path]:
    """The files holding the code of a ``file.py:function`` or ``module:function`` spec (resolved; for a
    module, every package ``__init__.py`` on the way too: importing it runs them); [] for anything else."""
    module, sep, func = spec.rpartition(":")
    if not (sep and module and func):
        return []
    if module.endswith(".py"):
        path = Path(module).expanduser()
        return [path.resolve()] if path.is_file() else []
    return module_files(module) or []


def code_file(spec: str) -> Path | None:
    """The file holding the function of a spec (`code_files`' last), None when there is none."""
    files = code_files(spec)
    return files[-1] if files else None


def _inside(path: Path | None, folder: Path | None) -> bool:
    return path is not None and folder is not None and path.is_relative_to(folder.resolve())


def _refusal(
    guard: RunCodeGuard, spec: str, what: str, path: Path | None, why: str, option: str
) -> UserError:
    """The line that refuses to run `spec`: what names it, where its file lies (inside the run folder: said
    so, it may come from whoever made the folder) and the one step that runs it (`guard.remedy` for a
    command that cannot name code)."""
    where = code_file(spec) if path is None else path
    inside = (
        f" (a file inside the run folder {guard.folder}, which may come from someone else: read it "
        f"before you run it)"
        if _inside(where, guard.folder)
        else ""
    )
    if guard.remedy is not None:  # a command that cannot name code (compare) says what it can do instead
        remedy = guard.remedy.format(folder=guard.folder)
        return UserError(
            f"{guard.source} names the {what} '{spec}'{inside}, code this command does not run: {remedy}"
        )
    return UserError(f"{guard.source} names the {what} '{spec}'{inside}, {why}: {option}")


def _admit(guard: RunCodeGuard | None, spec: str, what: str, path: Path | None, data: bytes | None) -> None:
    """Raise a one-line UserError unless `guard` lets the `what` `spec` (from `path`, holding `data`) run."""
    if guard is None or what in guard.named:
        return
    flag = OPTIONS.get(what, "--" + what.replace(" ", "-"))
    option = f"{flag} {shlex.quote(guard.specs.get(what) or spec)}"
    if not guard.trust:
        raise _refusal(
            guard,
            spec,
            what,
            path,
            "code that a resumed run does not run unless you name it",
            f"add {option} (or --trust-run-code to run the code the run started with)",
        )
    if guard.recorded is None:  # a run from before runs recorded their files: trusted as it is
        return
    sha = guard.recorded.get(str(path)) if path is not None else None
    if sha is None:
        raise _refusal(
            guard,
            spec,
            what,
            path,
            "which is not code the run started with (--trust-run-code runs only that)",
            f"name it to run it: add {option}",
        )
    if data is None or sha != sha256_bytes(data):
        if not guard.allow_changed:
            raise UserError(
                f"{path} changed since the run started (the {what} of {guard.source}); continue on its new "
                f"content with {option} or --allow-changed-inputs, or restore the file"
            )


def import_module(module: str, what: str, spec: str | None = None) -> Any:
    """The module `module` (a dotted name on sys.path, or a ``.py`` file, executed afresh on each call),
    as the active `run_code_guard` allows (`spec`: the whole spec, for its messages)."""
    guard, spec = _GUARD.get(), spec or module
    if guard is not None and not guard.trust:
        _admit(guard, spec, what, None, None)  # refused unless named again, whatever the file holds
    if module.endswith(".py"):
        path = Path(module).expanduser()
        problem = not_a_file(path)
        if problem:
            raise UserError(f"{what} file '{module}' {problem}")
        path = path.resolve()
        try:
            data = path.read_bytes()
        except OSError as e:
            raise UserError(f"cannot read {what} file '{module}': {e.strerror or e}") from None
        _admit(guard, spec, what, path, data)
        name = f"t2i_gcpo_user_{what.replace(' ', '_')}_{path.stem}"
        mod = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, path))
        try:  # the very bytes checked above; no bytecode cache written beside the file
            exec(compile(data, str(path), "exec", dont_inherit=True), mod.__dict__)
        except Exception as e:
            raise UserError(f"cannot import {what} file '{module}': {type(e).__name__}: {e}") from None
        return mod
    if guard is not None and guard.trust and what not in guard.named:  # every file importing it runs
        for path in module_files(module) or [None]:
            _admit(guard, spec, what, path, _read(path))
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        hint = " (is it on PYTHONPATH?)" if e.name == module.split(".")[0] else ""
        raise UserError(f"cannot import {what} module '{module}': {e}{hint}") from None
    except Exception as e:
        raise UserError(f"cannot import {what} module '{module}': {type(e).__name__}: {e}") from None


def import_function(spec: str, what: str) -> Callable[..., Any]:
    """The function `spec` names (``module:function`` or ``path/to/file.py:function``)."""
    module, sep, func = spec.rpartition(":")
    if not sep or not module or not func:
        raise UserError(f"a {what} is written 'path/to/file.py:function' or 'module:function', got '{spec}'")
    mod = import_module(module, what, spec)
    fn = getattr(mod, func, None)
    if fn is None:
        raise UserError(
            f"{what} {'file' if module.endswith('.py') else 'module'} '{module}' has no function '{func}'"
        )
    if not callable(fn):
        raise UserError(f"{what} '{spec}' is not a function (it is a {type(fn).__name__})")
    return fn
