"""The one loading check every family's checkpoint goes through: each safetensors file is read whole
(structure: a truncated or damaged file cannot be read), each tensor must hold a number type
(floating, integer or bool: dtype) and every floating value must be finite. A failure is a
`UserError` naming the file (and tensor), before a model is built from it; a run never trains on a
damaged checkpoint, and sampling never fails later with a NaN traceback.

The ShapeWorld priors and their VQ read their files with `read_weights`; the families loaded through
transformers / diffusers (text, Janus, aMUSEd) check their folders with `check_weight_files` first.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import torch

from t2i_gcpo.errors import UserError, check_file


def _one_line(e: BaseException, limit: int = 300) -> str:
    return " ".join(str(e).split())[:limit]


def check_tensor(path: str | os.PathLike, name: str, tensor: torch.Tensor) -> None:
    """The dtype and finiteness check of one tensor read from `path`."""
    if not (tensor.is_floating_point() or tensor.dtype in (torch.bool, torch.uint8, torch.int8, torch.int16,
                                                            torch.int32, torch.int64)):  # fmt: skip
        raise UserError(f"{path}: tensor {name} has dtype {tensor.dtype}, not a weight type (damaged file?)")
    if tensor.is_floating_point():
        finite = torch.isfinite(tensor.float() if tensor.dtype.itemsize == 1 else tensor)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            raise UserError(f"{path}: tensor {name} holds {bad} NaN/inf values (damaged weights?)")


def _tensors(path: str | os.PathLike) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, tensor) of a safetensors file one at a time; structure errors as `UserError`."""
    from safetensors import SafetensorError, safe_open

    check_file(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise UserError(
            f"{path}: cannot read the weights (truncated or damaged file?): {_one_line(e)}"
        ) from None


def read_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The checked tensors of a safetensors file, floating ones upcast to float32."""
    state = {}
    for name, tensor in _tensors(path):
        check_tensor(path, name, tensor)
        state[name] = tensor.float() if tensor.is_floating_point() else tensor
    return state


def check_weight_files(folder: str | os.PathLike) -> None:
    """Check every ``*.safetensors`` file under `folder` (a transformers / diffusers checkpoint),
    tensor by tensor, so memory holds one tensor at a time."""
    for path in sorted(Path(folder).rglob("*.safetensors")):
        for name, tensor in _tensors(path):
            check_tensor(path, name, tensor)
