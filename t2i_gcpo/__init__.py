"""t2i-gcpo: RL for discrete-token text-to-image generators with token-level credit assignment.

The Python API (`t2i_gcpo.api`) is exported here and imported on first use, so ``import t2i_gcpo``
stays fast (torch is loaded only when a function runs)."""

from typing import Any

__version__ = "0.1.0"

_API = ("train", "generate", "sample", "evaluate_shapeworld", "evaluate_geneval", "credit_maps", "load_policy",
        "load_config", "TrainResult", "SampleResult")  # fmt: skip
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        from t2i_gcpo import api

        return getattr(api, name)
    raise AttributeError(f"module 't2i_gcpo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_API))
