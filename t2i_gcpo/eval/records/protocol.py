"""What an evaluation was, recorded beside its scores: the suite, the hashes of the data it read, the model
that made the images, the scorer (detector, VQA model, judge) and its revision, the seeds, the images per
prompt and the sampling settings. Two score files compare only when their protocols agree on what must
be equal (`protocol_mismatch`); published numbers that cannot be reproduced are usually two protocols
that differ in one of these fields.

The record is plain JSON: ``protocol.json`` beside an evaluation's ``summary.json`` and ``results.jsonl``,
and a run's ``eval/protocol.json`` beside its held-out items (train/trainer.py). This module imports
nothing of the package at import time, so training uses it too."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from t2i_gcpo.version import __version__

PROTOCOL_NAME = "protocol.json"
# files whose bytes identify a checkpoint folder's revision (the weights are identified by name and size:
# hashing gigabytes of weights for every evaluation would cost more than the evaluation of a few prompts)
_CONFIG_SUFFIXES = (".json", ".yaml", ".yml", ".txt", ".model")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")
_CHUNK = 1 << 20
# the fields two evaluations must share for their scores to be compared prompt by prompt
COMPARABLE = ("suite", "data", "seeds", "images_per_prompt", "scorer")


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def content_record(what: str, lines: Iterable[Any]) -> dict[str, Any]:
    """Data that is not one file, recorded by content: `what` it is, how many items, and the SHA-256 over
    their JSON (keys sorted), one a line, in order — the prompts a folder of images was made for, whoever
    made it, hash the same."""
    digest, count = hashlib.sha256(), 0
    for item in lines:
        digest.update((json.dumps(item, sort_keys=True) + "\n").encode())
        count += 1
    return {"what": what, "items": count, "sha256": digest.hexdigest()}


def data_record(path: str | os.PathLike) -> dict[str, Any]:
    """A data file (or a folder of them) as recorded: its absolute path, size and SHA-256 (a folder's
    hash is over its files' relative names and hashes, in name order)."""
    p = Path(path).expanduser()
    if p.is_dir():
        digest = hashlib.sha256()
        files = sorted(f for f in p.rglob("*") if f.is_file())
        for f in files:
            digest.update(f"{f.relative_to(p).as_posix()}\0{file_sha256(f)}\n".encode())
        size = sum(f.stat().st_size for f in files)
        return {"path": str(p.resolve()), "files": len(files), "bytes": size, "sha256": digest.hexdigest()}
    return {"path": str(p.resolve()), "bytes": p.stat().st_size, "sha256": file_sha256(p)}


def folder_revision(path: str | os.PathLike) -> str | None:
    """A checkpoint folder's revision: the Hub snapshot's commit where the folder is one
    (``…/snapshots/<commit>/``), else a SHA-256 over its configuration files' bytes and its weight files'
    names and sizes; None where `path` is not a folder (a shipped model's name, a URL)."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return None
    resolved = p.resolve()
    if resolved.parent.name == "snapshots" and len(resolved.name) == 40:
        return resolved.name
    digest = hashlib.sha256()
    for f in sorted(x for x in resolved.rglob("*") if x.is_file()):
        name = f.relative_to(resolved).as_posix()
        if f.suffix in _CONFIG_SUFFIXES and f.stat().st_size <= 16 * _CHUNK:
            digest.update(f"{name}\0{file_sha256(f)}\n".encode())
        elif f.suffix in _WEIGHT_SUFFIXES:
            digest.update(f"{name}\0{f.stat().st_size}\n".encode())
    return "sha256:" + digest.hexdigest()


def weights_revision(path: str | os.PathLike) -> str | None:
    """A scorer's weights as recorded: a folder's `folder_revision`, a single weights file by its name and
    size ("open_clip_pytorch_model.bin:1710540580"), None for what is not on disk (a URL, a built-in)."""
    p = Path(path).expanduser()
    if p.is_file():
        return f"{p.name}:{p.stat().st_size}"
    return folder_revision(p)


def model_record(spec: str | None) -> dict[str, Any] | None:
    """A `--model` string as recorded: the spec (family prefix kept, the path made absolute) and the
    folder's revision (`folder_revision`)."""
    if spec is None:
        return None
    if spec.startswith("<"):  # a Python object given to the API ("<python>:Class:checksum"): as recorded
        return {"spec": spec, "revision": None}
    from t2i_gcpo.policies.registry import model_identity

    identity = model_identity(spec)
    target = identity.partition(":")[2] if ":" in identity and not os.path.exists(identity) else identity
    return {"spec": identity, "revision": folder_revision(target)}


def scorer_record(kind: str, name: str, revision: str | None = None, **settings: Any) -> dict[str, Any]:
    """What scored the images: `kind` ("detector", "vqa", "judge", "clip", "exact", …), its name (a folder,
    a URL and model name, a built-in scorer), its revision (`folder_revision` of a folder when not given)
    and any settings that change its answers (a prompt template, a threshold, a temperature)."""
    if revision is None:
        revision = weights_revision(name)
    return {"kind": kind, "name": name, "revision": revision, **settings}


def protocol_record(
    suite: str,
    *,
    data: Iterable[str | os.PathLike | Mapping[str, Any]] = (),
    model: str | None = None,
    scorer: Mapping[str, Any] | None = None,
    seeds: Any = None,
    images_per_prompt: int | None = None,
    sampling: Mapping[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The protocol of one evaluation: `suite` ("geneval", "geneval2", "dpg", "compbench", "judge:wise",
    "shapeworld", …), the `data` files it read (hashed), the `model` that made the images (None when the
    images were given), the `scorer` (`scorer_record`), the `seeds` (a base seed, or how each prompt's seed
    is derived), the images per prompt, the `sampling` settings (guidance scale, temperature, top-k, steps),
    this toolkit's version, and any `extra` field of the suite's own."""
    return {
        "suite": suite,
        "data": [dict(d) if isinstance(d, Mapping) else data_record(d) for d in data],
        "model": model_record(model),
        "scorer": dict(scorer) if scorer is not None else None,
        "seeds": seeds,
        "images_per_prompt": images_per_prompt,
        "sampling": dict(sampling) if sampling is not None else None,
        "t2i_gcpo": __version__,
        **extra,
    }


def protocol_mismatch(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """The first field of `COMPARABLE` on which two protocols differ, said in one line ("suite: geneval2
    against dpg"); None when every one agrees. Data files compare by hash, not by path, and a scorer with a
    revision by its revision, not by the folder it was read from."""

    def by_revision(value: Any) -> Any:  # a scorer found by its revision, wherever its folder lies
        if isinstance(value, Mapping):
            known = value.get("revision") is not None
            return {k: by_revision(v) for k, v in value.items() if not (known and k == "name")}
        return value

    def comparable(record: Mapping[str, Any], key: str) -> Any:
        value = record.get(key)
        if key == "data" and value is not None:
            return sorted(d.get("sha256") for d in value)
        if key == "scorer":
            return by_revision(value)
        return value

    for key in COMPARABLE:
        left, right = comparable(a, key), comparable(b, key)
        if left != right:
            return f"{key}: {left!r} against {right!r}"
    return None


def write_protocol(folder: str | os.PathLike, record: Mapping[str, Any]) -> Path:
    """`folder`/protocol.json, written whole (outdir.write_file)."""
    from t2i_gcpo.outdir import write_file

    return write_file(Path(folder) / PROTOCOL_NAME, json.dumps(dict(record), indent=1) + "\n", within=folder)


def read_protocol(path: str | os.PathLike) -> dict[str, Any]:
    """A protocol.json as written by `write_protocol`; a one-line UserError for a file that is not one."""
    from t2i_gcpo.errors import UserError
    from t2i_gcpo.outdir import read_json

    record = read_json(path)
    if not isinstance(record, dict) or not isinstance(record.get("suite"), str):
        raise UserError(f"{path}: not an evaluation protocol (no 'suite')")
    return record
