"""t2i-gcpo: RL for discrete-token text-to-image generators with token-level credit assignment.

The Python API is `t2i_gcpo.api` (``from t2i_gcpo import api; api.train(...)``). It is a module of its
own, not names re-exported here: ``t2i_gcpo.train`` is the training package, and ``import t2i_gcpo``
stays fast (torch is imported when an API function first runs)."""

from typing import Any

from t2i_gcpo.version import __version__

__all__ = ["__version__"]


def __getattr__(name: str) -> Any:
    if name == "api":  # `import t2i_gcpo; t2i_gcpo.api.train(...)` without importing it first
        import importlib

        return importlib.import_module("t2i_gcpo.api")
    if name == "credit_scheme":  # the decorator of a user's credit scheme (docs/guides/custom-credit.md)
        import importlib

        return importlib.import_module("t2i_gcpo.core.schemes").credit_scheme
    raise AttributeError(f"module 't2i_gcpo' has no attribute {name!r}")
