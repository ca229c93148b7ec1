"""Small helpers around accelerate / torch.distributed that several train/ modules share."""

from __future__ import annotations

from typing import Any


def unwrap(model: Any) -> Any:
    """The adapter inside a DDP / accelerate wrapper (or the model itself)."""
    return getattr(model, "module", model)


def leave_process_group() -> None:
    """Destroy the distributed process group, if there is one, before the process exits: a process
    that exits with a live gloo group can abort in C++ teardown ("terminate called without an active
    exception"). Call it once per process, after the last run, when every rank got there."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
