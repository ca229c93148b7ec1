"""Nested values holding tensors, saved as a safetensors file plus a JSON file, never as a pickle.

A run directory is something people download and share; a pickle in it (`torch.save`) runs code when
read. Here tensors go to ``NAME.safetensors`` (raw bytes, dtype and shape), everything else to
``NAME.json``: numbers, strings, lists, dicts, tuples, and the dataclasses named in `classes` (an
allow-list given by the caller: reading builds nothing else). A value of another type is stored as its
``repr`` string (a reward's odd detail value must not crash a checkpoint), so a round trip is exact for
the types above only.

JSON objects with a single key starting with "__" are markers: ``{"__tensor__": "3"}``,
``{"__tuple__": [...]}``, ``{"__items__": [[k, v], ...]}`` (a dict whose keys are not all plain
strings), ``{"__dataclass__": "Rollout", "fields": {...}}``, ``{"__ndarray__": "4"}``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from t2i_gcpo.errors import UserError


def _plain_key(key: Any) -> bool:
    return isinstance(key, str) and not key.startswith("__")


def encode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """`value` as JSON-ready data; its tensors are added to `tensors` under fresh keys."""
    import numpy as np

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if torch.is_tensor(value):
        key = str(len(tensors))
        tensors[key] = value.detach().cpu().contiguous().clone()  # safetensors refuses shared storage
        return {"__tensor__": key}
    if isinstance(value, np.ndarray):
        key = str(len(tensors))
        tensors[key] = torch.from_numpy(np.ascontiguousarray(value)).clone()
        return {"__ndarray__": key}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list):
        return [encode(v, tensors) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [encode(v, tensors) for v in value]}
    if isinstance(value, Mapping):
        if all(_plain_key(k) for k in value):
            return {k: encode(v, tensors) for k, v in value.items()}
        return {"__items__": [[encode(k, tensors), encode(v, tensors)] for k, v in value.items()]}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: encode(getattr(value, f.name), tensors) for f in dataclasses.fields(value) if f.init
        }
        return {"__dataclass__": type(value).__name__, "fields": fields}
    return repr(value)


def decode(node: Any, tensors: Mapping[str, torch.Tensor], classes: Mapping[str, type], device: Any) -> Any:
    """The value `encode` turned into `node`. Raises ValueError on anything it did not write."""
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [decode(v, tensors, classes, device) for v in node]
    if not isinstance(node, dict):
        raise ValueError(f"unexpected {type(node).__name__}")
    marker = next(iter(node), "") if len(node) <= 2 else ""
    if marker == "__tensor__":
        return tensors[node[marker]].to(device)
    if marker == "__ndarray__":
        return tensors[node[marker]].numpy()
    if marker == "__tuple__":
        return tuple(decode(v, tensors, classes, device) for v in node[marker])
    if marker == "__items__":
        return {
            decode(k, tensors, classes, device): decode(v, tensors, classes, device) for k, v in node[marker]
        }
    if marker == "__dataclass__":
        name = node[marker]
        if name not in classes:
            raise ValueError(f"'{name}' is not a type this file may hold")
        fields = {k: decode(v, tensors, classes, device) for k, v in node["fields"].items()}
        return classes[name](**fields)
    if any(not _plain_key(k) for k in node):
        raise ValueError(f"unknown marker {next(k for k in node if not _plain_key(k))!r}")
    return {k: decode(v, tensors, classes, device) for k, v in node.items()}


def save_tree(folder: Path, name: str, value: Any, within: Path | None = None) -> None:
    """Write `value` to folder/NAME.safetensors and folder/NAME.json (outdir.write_file: never through a
    link; `within`: the folder whose subfolders down to `folder` are checked)."""
    from safetensors.torch import save_file

    from t2i_gcpo.outdir import write_file

    tensors: dict[str, torch.Tensor] = {}
    tree = encode(value, tensors)
    write_file(folder / f"{name}.safetensors", b"", within, by_name=lambda tmp: save_file(tensors, tmp))
    write_file(folder / f"{name}.json", json.dumps(tree), within)


def tree_files(folder: Path, name: str) -> tuple[Path, Path]:
    return folder / f"{name}.safetensors", folder / f"{name}.json"


def load_tree(
    folder: Path, name: str, what: str, classes: Mapping[str, type] | None = None, device: Any = "cpu"
) -> Any:
    """The value `save_tree` wrote; a damaged or foreign file is a UserError naming `what` it held."""
    from safetensors.torch import load_file

    from t2i_gcpo.outdir import read_json

    weights, tree = tree_files(folder, name)
    node = read_json(tree)  # malformed or nested too deeply: one line naming the file
    try:
        tensors = load_file(str(weights))
        return decode(node, tensors, classes or {}, device)
    except Exception as e:  # safetensors, JSON, a missing tensor key, a constructor refusing its fields
        message = " ".join(str(e).split())[:200]
        raise UserError(
            f"{folder / name}.{{safetensors,json}}: cannot read {what} (damaged file?): {message}"
        ) from None
