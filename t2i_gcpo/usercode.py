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
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from t2i_gcpo.errors import UserError

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


def _module_file(module: str) -> Path | None:
    """The file a dotted module name imports from (its package's ``__init__.py``), without running the
    module itself (parent packages of a dotted name are imported to find it); None if there is none."""
    loaded = sys.modules.get(module)
    origin = getattr(loaded, "__file__", None)
    if origin is None:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            found = None
        origin = found.origin if found is not None and found.has_location else None
    return Path(origin).resolve() if origin else None


def _read(path: Path | None) -> bytes | None:
    try:
        return path.read_bytes() if path is not None else None
    except OSError:
        return None


def code_file(spec: str) -> Path | None:
    """The file holding the code of a ``file.py:function`` or ``module:function`` spec (resolved);
    None for anything else."""
    module, sep, func = spec.rpartition(":")
    if not (sep and module and func):
        return None
    if module.endswith(".py"):
        path = Path(module).expanduser()
        return path.resolve() if path.is_file() else None
    return _module_file(module)


def _admit(guard: RunCodeGuard | None, spec: str, what: str, path: Path | None, data: bytes | None) -> None:
    """Raise a one-line UserError unless `guard` lets the `what` `spec` (from `path`, holding `data`) run."""
    if guard is None or what in guard.named:
        return
    option = f"{OPTIONS.get(what, '--' + what.replace(' ', '-'))} {spec}"
    if not guard.trust:
        raise UserError(
            f"{guard.source} names the {what} '{spec}', code that a resumed run does not run unless you "
            f"name it: add {option} (or --trust-run-code to run the code the run started with)"
        )
    if guard.recorded is None:  # a run from before runs recorded their files: trusted as it is
        return
    sha = guard.recorded.get(str(path)) if path is not None else None
    if sha is None:
        raise UserError(
            f"{guard.source} names the {what} '{spec}', which is not code the run started with "
            f"(--trust-run-code runs only that); name it to run it: add {option}"
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
        if not path.is_file():
            raise UserError(f"{what} file '{module}' does not exist")
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
    if guard is not None and guard.trust and what not in guard.named:
        path = _module_file(module)
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
