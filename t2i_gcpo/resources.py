"""The files the package ships: algorithm presets, recipes and accelerate configs (``t2i_gcpo/configs``)
prompt files (``t2i_gcpo/prompts``) and the docs' example scripts (``t2i_gcpo/examples``, linked as
``examples/`` in a clone), found with importlib.resources so a wheel installed anywhere
finds them. With an editable install (a clone) they are the checkout's own files, edits included.

A path the user gives is used as it is when it exists; only a path that does not exist and names a
shipped file (``prompts/shapeworld_train.txt``, ``shapeworld_train.txt``,
``configs/recipes/janus_pro_1b_geneval.yaml``, ``recipes/janus_pro_1b_geneval.yaml``) falls back to
that file, so the commands of the docs run the same from a clone and from a wheel in an empty folder.

``python -m t2i_gcpo.resources accelerate/ddp.yaml`` prints a shipped file's path (for
``accelerate launch --config_file``); without an argument it lists them.
"""

from __future__ import annotations

import sys
from importlib.resources import files
from pathlib import Path

PACKAGE_DIR = Path(str(files("t2i_gcpo")))  # a wheel unpacks to disk: a plain folder
CONFIG_DIR = PACKAGE_DIR / "configs"  # presets <algo>.yaml, recipes/, accelerate/
PROMPTS_DIR = PACKAGE_DIR / "prompts"  # the worlds' prompt files
EXAMPLES_DIR = PACKAGE_DIR / "examples"  # the runnable scripts of the docs (examples/ in a clone)


def _shipped(path: str | Path, folder: Path) -> Path | None:
    """The shipped file under `folder` that `path` names, with or without the folder's name (or
    ``t2i_gcpo/<folder>``) in front; None if there is none."""
    parts = Path(path).parts
    for prefix in (("t2i_gcpo", folder.name), (folder.name,), ()):
        if parts[: len(prefix)] == prefix and len(parts) > len(prefix):
            candidate = folder.joinpath(*parts[len(prefix) :])
            if candidate.is_file():
                return candidate
    return None


def resolve(path: str | Path, folder: Path) -> Path:
    """`path` if it exists, else the shipped file under `folder` it names, else `path` unchanged (the
    caller's reader then reports it missing)."""
    if Path(path).exists():
        return Path(path)
    return _shipped(path, folder) or Path(path)


def prompt_file(path: str | Path) -> Path:
    """A prompt file given by the user: theirs if it exists, else the shipped one of that name."""
    return resolve(path, PROMPTS_DIR)


def config_file_path(path: str | Path) -> Path:
    """A ``--config`` file: the user's if it exists, else the shipped one it names (a recipe)."""
    return resolve(path, CONFIG_DIR)


def shipped_files() -> list[str]:
    """Every shipped config, prompt file and example, relative to its folder's parent
    (``configs/gcpo.yaml``)."""
    return sorted(
        str(p.relative_to(PACKAGE_DIR))
        for folder in (CONFIG_DIR, PROMPTS_DIR, EXAMPLES_DIR)
        for p in folder.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )


def main(argv: list[str]) -> int:
    if not argv:
        print("\n".join(shipped_files()))
        return 0
    for name in argv:
        found = _shipped(name, CONFIG_DIR) or _shipped(name, PROMPTS_DIR) or _shipped(name, EXAMPLES_DIR)
        if found is None:
            print(
                f"error: no shipped file '{name}' (python -m t2i_gcpo.resources lists them)", file=sys.stderr
            )
            return 2
        print(found)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
