"""Importing a function of the user's named ``path/to/file.py:function`` or ``module:function`` (a
credit scheme given with ``--credit``), with every failure a one-line UserError."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
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


def import_module(module: str, what: str) -> Any:
    """The module `module` (a dotted name on sys.path, or a ``.py`` file, executed afresh on each call)."""
    if module.endswith(".py"):
        path = Path(module).expanduser()
        if not path.is_file():
            raise UserError(f"{what} file '{module}' does not exist")
        name = f"t2i_gcpo_user_{what.replace(' ', '_')}_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except Exception as e:
            raise UserError(f"cannot import {what} file '{module}': {type(e).__name__}: {e}") from None
        return mod
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
    mod = import_module(module, what)
    fn = getattr(mod, func, None)
    if fn is None:
        raise UserError(
            f"{what} {'file' if module.endswith('.py') else 'module'} '{module}' has no function '{func}'"
        )
    if not callable(fn):
        raise UserError(f"{what} '{spec}' is not a function (it is a {type(fn).__name__})")
    return fn
