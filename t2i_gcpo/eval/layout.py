"""GenEval's folder layout for generated images (docs/evaluation/geneval.md), readable by the official scorer.

    <root>/00000/metadata.jsonl      the prompt's metadata, one JSON line
    <root>/00000/generation.json     how the images were made (model, seed, CFG, …; ours, not GenEval's)
    <root>/00000/samples/0000.png    4 images per prompt by default
    <root>/00001/...

Writes are atomic (temporary name, then rename), so an interrupted generation leaves only whole
files behind and can resume from `existing_samples`. A generation resumes only into prompt folders
made for the same prompt and settings (`check_resumable`); anything else is refused, or cleared first
with `clear_layout` (``--overwrite``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from PIL import Image

from t2i_gcpo.errors import UserError

METADATA_NAME = "metadata.jsonl"
SETTINGS_NAME = "generation.json"
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


def atomic_save_image(
    image: Image.Image, path: str | os.PathLike, within: str | os.PathLike | None = None
) -> None:
    """Save `image` as PNG at `path` whole, never through a link (outdir.write_file; `within`: the output
    folder, whose subfolders down to `path` are checked)."""
    from t2i_gcpo.outdir import write_file

    write_file(path, lambda f: image.save(f, format="PNG"), within)


def atomic_write_json(path: str | os.PathLike, obj, within: str | os.PathLike | None = None) -> None:
    """Write `obj` as JSON at `path` the way `atomic_save_image` writes."""
    from t2i_gcpo.outdir import write_file

    write_file(path, json.dumps(obj, indent=1) + "\n", within)


# ---------------------------------------------------------------------------------------------
# output folders
# ---------------------------------------------------------------------------------------------


def generation_settings(
    model: str, *, seed: int, cfg_scale: float, temperature: float, top_k: int, n: int
) -> dict:
    """The settings recorded next to generated images; a folder resumes only with equal settings."""
    return {
        "model": model,
        "seed": int(seed),
        "cfg_scale": float(cfg_scale),
        "temperature": float(temperature),
        "top_k": int(top_k),
        "n": int(n),
    }


# the option that sets each recorded setting (named in the message that refuses a folder made otherwise)
SETTING_FLAGS = {
    "model": "--model",
    "seed": "--seed",
    "cfg_scale": "--cfg",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "n": "--n",
    "steps": "--steps",
    "reveal_order": "--reveal-order",
}


def settings_mismatch(recorded: Mapping, wanted: Mapping, complete: bool = False) -> str | None:
    """For the first setting `recorded` holds differently from `wanted`: "made with key=old, this run asks
    for key=new (FLAG old continues them)"; None when all agree. Only the keys of `wanted` are compared
    (a check before the model is loaded, when some settings are not known yet), or, `complete`, every key
    of either (a setting recorded but not asked for now, e.g. a masked model's --steps, differs too)."""
    from t2i_gcpo.outdir import settings_differences

    keys = [k for k in settings_differences(recorded, wanted) if complete or k in wanted]
    if not keys:
        return None
    key = keys[0]
    old = recorded.get(key, "(not recorded)")
    new = f"{key}={wanted[key]!r}" if key in wanted else f"the model's own {key}"
    again = f" ({SETTING_FLAGS[key]} {old} continues them)" if key in recorded and _accepted(key, old) else ""
    return f"made with {key}={old!r}, this run asks for {new}{again}"


# the config key each recorded setting's option is checked as (commands/options.py), for `_accepted`
SETTING_KEYS = {
    "cfg_scale": "rollout.cfg_scale",
    "temperature": "rollout.temperature",
    "top_k": "rollout.top_k",
    "n": "eval_images_per_prompt",
    "seed": "seed",
    "steps": "rollout.steps",
}


def _accepted(key: str, value: object) -> bool:
    """Whether the option that sets `key` takes `value` (a record edited to NaN, or to a value of another
    type, is never suggested back: the option would refuse it)."""
    from t2i_gcpo.config import check_value
    from t2i_gcpo.policies.maskgen import REVEAL_ORDERS

    if key not in SETTING_FLAGS:
        return False
    if key == "reveal_order":
        return value in REVEAL_ORDERS
    if key == "model":
        return isinstance(value, str) and bool(value.strip())
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not numeric or (key != "cfg_scale" and key != "temperature" and not isinstance(value, int)):
        return False
    try:
        check_value(SETTING_KEYS[key], value)
    except UserError:
        return False
    return True


def read_settings(folder: str | os.PathLike) -> dict | None:
    """The recorded generation settings of a prompt folder, or None when there are none."""
    from t2i_gcpo.outdir import read_json

    path = Path(folder) / SETTINGS_NAME
    if not path.exists() and not path.is_symlink():
        return None
    try:
        return read_json(path, dict[str, str | int | float | bool | None])
    except UserError as e:
        raise UserError(f"{e}; use --overwrite to regenerate") from None


def prompt_folders(root: str | os.PathLike) -> dict[int, Path]:
    """`<root>/<digits>/` folders keyed by index (empty when `root` does not exist)."""
    root = Path(root)
    if not root.is_dir():
        return {}
    return {int(p.name): p for p in root.iterdir() if p.is_dir() and _INDEX_RE.match(p.name)}


def folder_images(folder: str | os.PathLike) -> list[Path]:
    """The images of one prompt folder (`samples/*.png|jpg|…`, not hidden), sorted by name."""
    samples = Path(folder) / SAMPLES_DIR
    if not samples.is_dir():
        return []
    return sorted(
        p for p in samples.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".")
    )


def _folder_metadata(folder: Path) -> dict | None:
    from t2i_gcpo.outdir import read_jsonl

    path = folder / METADATA_NAME
    if not path.is_file():
        return None
    try:
        rows = read_jsonl(path)
    except UserError:
        return None
    return rows[0] if rows else None


def metadata_mismatch(folder: Path, found: dict | None, wanted: dict) -> str | None:
    """Why prompt folder `folder` (metadata `found`) does not hold prompt `wanted`, or None."""
    wanted = json.loads(json.dumps(wanted))
    if found == wanted:
        return None
    if not isinstance(found, dict) or "prompt" not in found:
        return f"{folder} holds no readable {METADATA_NAME}"
    if found.get("prompt") != wanted.get("prompt"):
        return (
            f"{folder} holds prompt {found.get('prompt')!r}, this run's prompt {folder.name} is "
            f"{wanted.get('prompt')!r}"
        )
    return f"{folder} holds {found.get('prompt')!r} with other metadata than this run's"


def check_resumable(
    root: str | os.PathLike,
    metadata_list: Sequence[dict],
    settings: Mapping | None = None,
    complete: bool = False,
) -> None:
    """Refuse (UserError, one line) to generate into `root` unless every existing prompt folder was made
    for this run's prompt at that index (same metadata) with the same `settings` (only the keys given
    are compared, None compares none; `complete`: every recorded key too, see `settings_mismatch`), no
    folder lies beyond this run's prompts, and (when `settings` give the images per prompt "n") no folder
    holds an image this run would not make: checked before anything is generated, so a refused folder
    gets no new image."""
    hint = "use --overwrite to regenerate, or another --out"
    folders = prompt_folders(root)
    n = (settings or {}).get("n")
    made = {f"{k:04d}.png" for k in range(n)} if isinstance(n, int) else None
    for i, folder in sorted(folders.items()):
        if i >= len(metadata_list):
            break
        images = folder_images(folder)
        meta = _folder_metadata(folder)
        if meta is None and not images and not (folder / SETTINGS_NAME).exists():
            continue  # an empty folder: nothing to trust or to lose
        why = metadata_mismatch(folder, meta, metadata_list[i])
        if why:
            raise UserError(f"{why}; {hint}")
        if not images:
            continue  # settings are (re)written before its first image
        stray = [p.name for p in images if made is not None and p.name not in made]
        if stray:
            raise UserError(f"{folder} holds {stray[0]}, which this run (n={n}) does not make; {hint}")
        recorded = read_settings(folder)
        if recorded is None:
            raise UserError(
                f"{folder} holds images but no {SETTINGS_NAME} (written by another tool or an older "
                f"version), so how they were made is unknown; {hint}"
            )
        why = settings_mismatch(recorded, settings or {}, complete)
        if why:
            raise UserError(f"{folder}: images {why}; {hint}")
    extra = sorted(i for i in folders if i >= len(metadata_list))
    if extra:
        raise UserError(
            f"{root} holds {len(extra)} prompt folder(s) beyond this run's {len(metadata_list)} prompt(s) "
            f"(first: {folders[extra[0]].name}), left by another run; {hint}"
        )


_PROMPT_FOLDER_FILES = {METADATA_NAME, SETTINGS_NAME, SAMPLES_DIR, "grid.png", "grid.jpg"}


def _foreign_entries(folder: Path) -> list[Path]:
    """Entries of a prompt folder that generation did not write (hidden temporary files count as ours)."""
    foreign = [
        p for p in folder.iterdir() if p.name not in _PROMPT_FOLDER_FILES and not p.name.startswith(".")
    ]
    samples = folder / SAMPLES_DIR
    if samples.is_dir():
        foreign += [
            p
            for p in samples.iterdir()
            if not p.name.startswith(".") and not (p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        ]
    elif samples.exists():
        foreign.append(samples)
    return foreign


def clear_layout(root: str | os.PathLike) -> int:
    """Remove every prompt folder `<root>/<digits>/` (``--overwrite``); other entries of `root` are kept.
    Refuses (UserError, before removing anything) when a prompt folder holds files generation does not
    write, so a mistyped --out cannot wipe unrelated numbered folders. Returns the folders removed."""
    folders = prompt_folders(root)
    for folder in sorted(folders.values()):
        if folder.is_symlink():  # rmtree refuses links, and what it points to is not ours to remove
            raise UserError(
                f"--overwrite: {folder} is a symbolic link (to {os.readlink(folder)}); "
                "remove it yourself or choose another --out"
            )
        foreign = _foreign_entries(folder)
        if foreign:
            raise UserError(
                f"--overwrite: {folder} is not only generated images (it holds {foreign[0].name}); "
                "remove it yourself or choose another --out"
            )
    for folder in folders.values():
        shutil.rmtree(folder)
    return len(folders)


def write_prompt_folder(
    root: str | os.PathLike,
    index: int,
    metadata: dict,
    images: list[Image.Image],
    *,
    start: int = 0,
    settings: Mapping | None = None,
) -> list[Path]:
    """Write one prompt's folder: its generation `settings` (when given), its metadata line and `images`
    as samples start, start+1, ….

    Samples that already exist are left untouched (resumable generation; `check_resumable` says whether
    they may be trusted). Returns the paths of all samples written or kept, in order.
    """
    if index < 0:
        raise ValueError(f"prompt index must be >= 0, got {index}")
    from t2i_gcpo.outdir import real_dir, write_file

    folder = prompt_dir(root, index)
    real_dir(folder / SAMPLES_DIR, within=root)  # a folder of ours, not a link: checked again at each write
    if settings is not None and read_settings(folder) != json.loads(json.dumps(dict(settings))):
        if folder_images(folder):  # the record describes the images there: never rewritten under them
            why = settings_mismatch(read_settings(folder) or {}, settings, complete=True)
            raise UserError(f"{folder}: images {why}; use --overwrite to regenerate, or another --out")
        atomic_write_json(folder / SETTINGS_NAME, dict(settings), within=root)  # before any image
    meta_path = folder / METADATA_NAME
    if not meta_path.exists():
        write_file(meta_path, json.dumps(metadata) + "\n", within=root)
    paths = []
    for offset, image in enumerate(images):
        path = sample_path(root, index, start + offset)
        if not path.exists():
            atomic_save_image(image.convert("RGB"), path, within=root)
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


def read_metadata(folder: Path, keys: Sequence[str] = ("tag", "prompt", "include")) -> dict:
    """The metadata dict of one prompt folder (first non-empty line of metadata.jsonl), holding `keys`
    (GenEval's by default; another suite's prompts hold their own)."""
    from t2i_gcpo.outdir import read_jsonl

    path = folder / METADATA_NAME
    if not path.is_file():
        raise UserError(f"{folder} is not a GenEval prompt folder: {METADATA_NAME} is missing")
    rows = read_jsonl(path)
    metadata = rows[0] if rows else None
    if not isinstance(metadata, dict) or not set(keys) <= metadata.keys():
        names = [f"'{k}'" for k in keys]
        listed = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
        kind = (
            "a GenEval metadata object"
            if tuple(keys) == ("tag", "prompt", "include")
            else "a metadata object"
        )
        raise UserError(f"{path}: expected {kind} with {listed}")
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
        yield index, read_metadata(folder), folder_images(folder)


# settings of a recorded generation that change the images (the protocol's "sampling")
SAMPLING_SETTINGS = ("cfg_scale", "temperature", "top_k", "steps", "reveal_order")


def layout_protocol(root: str | os.PathLike) -> dict:
    """What the images of the GenEval-layout folder `root` were made for and with, as `protocol_record`
    takes it: ``data`` (the prompts' metadata, hashed in index order: `protocol.content_record`), ``model``,
    ``seeds`` (the generation seed and how each prompt's is derived), ``images_per_prompt`` (the most any
    folder holds) and ``sampling`` (CFG scale, temperature, top-k, a masked model's steps and reveal order),
    the last four from the folders' generation.json where every folder records the same settings, else
    None (images made by another tool: their seeds are unknown, and two such folders compare only as
    their scores)."""
    from t2i_gcpo.eval.records.protocol import content_record

    folders = sorted(prompt_folders(root).items())
    metadata = [_folder_metadata(folder) for _, folder in folders]
    records = [read_settings(folder) for _, folder in folders]
    shared = records[0] if records and all(r == records[0] for r in records) else None
    n = max((len(folder_images(folder)) for _, folder in folders), default=0)
    out: dict = {
        "data": [content_record("prompt metadata of the images scored", metadata)],
        "model": None,
        "seeds": None,
        "images_per_prompt": n,
        "sampling": None,
    }
    if shared:
        out["model"] = shared.get("model")
        out["seeds"] = {"seed": shared.get("seed"), "rule": "prompt i's images from (seed, 'generate', i)"}
        out["sampling"] = {k: shared[k] for k in SAMPLING_SETTINGS if k in shared}
    return out
