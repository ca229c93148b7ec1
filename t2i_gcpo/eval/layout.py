"""GenEval's folder layout for generated images (SPEC §8), readable by the official scorer.

    <root>/00000/metadata.jsonl      the prompt's metadata, one JSON line
    <root>/00000/samples/0000.png    4 images per prompt by default
    <root>/00001/...

Writes are atomic (temporary name, then rename), so an interrupted generation leaves only whole
files behind and can resume from `existing_samples`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from PIL import Image

from t2i_gcpo.errors import UserError

METADATA_NAME = "metadata.jsonl"
SAMPLES_DIR = "samples"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
_INDEX_RE = re.compile(r"^\d+$")
_SAMPLE_RE = re.compile(r"^(\d{4,})\.png$")


def prompt_dir(root: str | os.PathLike, index: int) -> Path:
    """`<root>/<index:05d>`."""
    return Path(root) / f"{index:05d}"


def sample_path(root: str | os.PathLike, index: int, sample: int) -> Path:
    """`<root>/<index:05d>/samples/<sample:04d>.png`."""
    return prompt_dir(root, index) / SAMPLES_DIR / f"{sample:04d}.png"


def atomic_save_image(image: Image.Image, path: str | os.PathLike) -> None:
    """Save `image` as PNG at `path` through a temporary file and a rename (no half-written PNGs)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    image.save(tmp, format="PNG")
    os.replace(tmp, path)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_prompt_folder(
    root: str | os.PathLike,
    index: int,
    metadata: dict,
    images: list[Image.Image],
    *,
    start: int = 0,
) -> list[Path]:
    """Write one prompt's folder: its metadata line and `images` as samples start, start+1, ….

    Samples that already exist are left untouched (resumable generation). Returns the paths of
    all samples written or kept, in order.
    """
    if index < 0:
        raise ValueError(f"prompt index must be >= 0, got {index}")
    folder = prompt_dir(root, index)
    (folder / SAMPLES_DIR).mkdir(parents=True, exist_ok=True)
    meta_path = folder / METADATA_NAME
    if not meta_path.exists():
        _atomic_write_text(meta_path, json.dumps(metadata) + "\n")
    paths = []
    for offset, image in enumerate(images):
        path = sample_path(root, index, start + offset)
        if not path.exists():
            atomic_save_image(image.convert("RGB"), path)
        paths.append(path)
    return paths


def existing_samples(root: str | os.PathLike, index: int) -> int:
    """Number of consecutive samples 0000.png, 0001.png, … already written for prompt `index`."""
    samples = prompt_dir(root, index) / SAMPLES_DIR
    if not samples.is_dir():
        return 0
    present = {int(m.group(1)) for p in samples.iterdir() if (m := _SAMPLE_RE.match(p.name))}
    count = 0
    while count in present:
        count += 1
    return count


def read_metadata(folder: Path) -> dict:
    """The metadata dict of one prompt folder (first non-empty line of metadata.jsonl)."""
    path = folder / METADATA_NAME
    if not path.is_file():
        raise UserError(f"{folder} is not a GenEval prompt folder: {METADATA_NAME} is missing")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    try:
        metadata = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e.msg})") from None
    if not isinstance(metadata, dict) or not {"tag", "prompt", "include"} <= metadata.keys():
        raise UserError(f"{path}: expected a GenEval metadata object with 'tag', 'prompt' and 'include'")
    return metadata


def iter_layout(root: str | os.PathLike) -> Iterator[tuple[int, dict, list[Path]]]:
    """Yield `(index, metadata, [image paths])` for each prompt folder under `root`, by index.

    Image paths are sorted by name; a prompt folder without images yields an empty list. Entries
    whose name is not all digits are ignored. Raises UserError when `root` is not GenEval layout.
    """
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root} is not a directory")
    folders = sorted((int(p.name), p) for p in root.iterdir() if p.is_dir() and _INDEX_RE.match(p.name))
    if not folders:
        raise UserError(
            f"{root} is not a GenEval layout folder: expected <root>/00000/{METADATA_NAME} and "
            f"<root>/00000/{SAMPLES_DIR}/0000.png"
        )
    for index, folder in folders:
        metadata = read_metadata(folder)
        samples = folder / SAMPLES_DIR
        images = (
            sorted(
                p
                for p in samples.iterdir()
                if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".")
            )
            if samples.is_dir()
            else []
        )
        yield index, metadata, images
