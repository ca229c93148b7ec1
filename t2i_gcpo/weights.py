"""The one loading check every family's checkpoint goes through: each safetensors file is read whole
(structure: a truncated or damaged file cannot be read), each tensor must hold a number type
(floating, integer or bool: dtype) and every floating value must be finite. A failure is a
`UserError` naming the file (and tensor), before a model is built from it; a run never trains on a
damaged checkpoint, and sampling never fails later with a NaN traceback.

The ShapeWorld priors and their VQ read their files with `read_weights`; the families loaded through
transformers / diffusers (text, Janus, aMUSEd, Meissonic) check their folders with `check_weight_files` first.
Their ``config.json`` files are checked against the config dataclass they build (`check_config_types`):
a key of the wrong type is a `UserError` naming the file and the key, not a traceback from deep inside
the model's constructor.
"""

from __future__ import annotations

import math
import os
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import torch

from t2i_gcpo.errors import UserError, check_file


def _one_line(e: BaseException, limit: int = 300) -> str:
    return " ".join(str(e).split())[:limit]


def check_tensor(path: str | os.PathLike, name: str, tensor: torch.Tensor) -> None:
    """The dtype and finiteness check of one tensor read from `path`."""
    if not (
        tensor.is_floating_point()
        or tensor.dtype in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
    ):
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


PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt")  # torch.save files: reading one can run code


def check_weight_files(folder: str | os.PathLike) -> None:
    """Check every ``*.safetensors`` file under `folder` (a transformers / diffusers checkpoint),
    tensor by tensor, so memory holds one tensor at a time. A folder whose weights are only pickles
    (``pytorch_model.bin``) is refused: the loaders read safetensors only (``use_safetensors=True``)."""
    for pattern in PICKLED_WEIGHTS:
        for path in sorted(Path(folder).rglob(pattern)):
            if not any(path.parent.glob("*.safetensors")):
                raise UserError(
                    f"{path}: weights saved as a pickle (torch.save), which t2i-gcpo does not read "
                    f"(reading one can run code); save them as safetensors (save_pretrained(…, "
                    f"safe_serialization=True))"
                )
    for path in sorted(Path(folder).rglob("*.safetensors")):
        for name, tensor in _tensors(path):
            check_tensor(path, name, tensor)


# the entries a training script's torch.save file keeps its state dict under, in the order LlamaGen's sample
# scripts look for them (DDP, DeepSpeed, Lightning); a file holding the state dict itself has none
STATE_DICT_ENTRIES = ("model", "module", "state_dict")
KEY_PREFIXES = ("module.", "_orig_mod.")  # DDP's and torch.compile's wrappers, dropped from the keys


def read_torch_weights(path: str | os.PathLike, what: str) -> dict[str, torch.Tensor]:
    """The checked tensors (`check_tensor`) of one weights file, in their stored dtypes: a safetensors file,
    or a ``torch.save`` pickle read with ``weights_only=True`` — plain containers, numbers, strings and
    tensors, plus ``argparse.Namespace`` (the training arguments LlamaGen's scripts save beside the weights:
    an attribute bag rebuilt without running anything). A pickle naming any other class or function is refused
    before anything in it is built, so nothing in the file runs. The state dict is the file's first
    `STATE_DICT_ENTRIES` entry (else the file itself), with `KEY_PREFIXES` dropped. Any failure is one
    `UserError` naming `what`."""
    import argparse

    p = check_file(path, what)
    try:
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file

            data: Any = load_file(str(p))
        else:
            import zipfile

            with torch.serialization.safe_globals([argparse.Namespace]):  # mmap: a 3 GB file is not copied
                data = torch.load(p, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(p))
    except Exception as e:  # torch's unpickler, a truncated zip, safetensors' header: all one line
        text = str(e)
        found = [ln.strip() for ln in text.splitlines() if "GLOBAL" in ln]
        if found:  # the unpickler names what the file asked to build: say that, not torch's advice
            raise UserError(
                f"{what} {p} holds more than weights ({_one_line(found[0], 160)}); t2i-gcpo reads tensors "
                f"only and never runs a file's code"
            ) from None
        raise UserError(f"cannot read {what} {p} (truncated or damaged file?): {_one_line(e)}") from None
    if isinstance(data, dict):
        data = next((data[k] for k in STATE_DICT_ENTRIES if isinstance(data.get(k), dict)), data)
    if not isinstance(data, dict) or not data:
        raise UserError(f"{what} {p} holds no state dict (found {type(data).__name__})")
    state = {}
    for name, tensor in data.items():
        if not torch.is_tensor(tensor):
            raise UserError(f"{what} {p}: entry {name!r} is a {type(tensor).__name__}, not a tensor")
        for prefix in KEY_PREFIXES:
            name = name.removeprefix(prefix)
        check_tensor(p, name, tensor)
        state[name] = tensor
    return state


STORAGE_DTYPES = ("float16", "bfloat16", "float32")  # what a built-in checkpoint stores its weights in


def _fits(value: Any, tp: Any) -> bool:
    """Whether a JSON `value` is of the annotated type `tp` (a tuple field takes a JSON list)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if tp is str:
        return isinstance(value, str)
    if origin is Literal:
        return value in args
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_fits(v, args[0]) for v in value)
        return len(value) == len(args) and all(_fits(v, a) for v, a in zip(value, args))
    return True  # a type this check does not know: the constructor checks it


def check_config_types(raw: dict, schema: type, path: str | os.PathLike) -> dict:
    """`raw` (a checkpoint's config.json) if every key is a field of the dataclass `schema` holding a
    value of its type (and ``storage_dtype`` a weight dtype); else a `UserError` naming `path` and the key."""
    hints = typing.get_type_hints(schema)
    for key, value in raw.items():
        if key not in hints:
            raise UserError(f"{path}: unknown config key '{key}' (a damaged file, or another model's?)")
        ok = _fits(value, hints[key]) and (key != "storage_dtype" or value in STORAGE_DTYPES)
        if not ok:
            tp = hints[key]
            want = (
                str(tp) if typing.get_args(tp) else getattr(tp, "__name__", str(tp))
            )  # tuple[int, int], int
            want = " | ".join(STORAGE_DTYPES) if key == "storage_dtype" else want
            raise UserError(f"{path}: config key '{key}' must be {want}, got {_one_line(repr(value), 80)}")
    return raw


def custom_code_refusal(path: str | os.PathLike, e: BaseException) -> UserError | None:
    """The one-line error for transformers refusing, under ``trust_remote_code=False``, a checkpoint whose
    config files (``auto_map``) name Python code of its own; None for any other error."""
    if "trust_remote_code" not in str(e) and "custom code" not in str(e):
        return None
    return UserError(
        f"'{path}' needs Python code of its own to load (auto_map in its config files), and t2i-gcpo never "
        "runs a checkpoint's code: use a checkpoint of a model transformers implements"
    )
