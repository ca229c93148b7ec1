"""The files a run reads that its user supplies — the prompt files, the code of its credit scheme and of
its reward — fingerprinted (sha256) when the run starts, in ``<run>/input_files.json``, and checked when
it is resumed: a resume never continues silently on edited prompts or code (docs/errors.md#changed-inputs).

Prompt files are checked here, before anything is loaded; code files where they are imported
(`t2i_gcpo.usercode.run_code_guard`, which executes the very bytes it checked). A run resumed on purpose
with new content (``--allow-changed-inputs``, or its code named again with ``--credit`` / ``--reward``)
records the new fingerprints, so the next resume checks against what it trained on last.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typing_extensions import TypedDict

from t2i_gcpo.config import TrainConfig
from t2i_gcpo.errors import UserError
from t2i_gcpo.outdir import read_json, write_file
from t2i_gcpo.usercode import code_files, sha256_bytes

RECORD = "input_files.json"
CODE_ROLES = ("credit", "reward")  # checked where imported (usercode), not here


def user_files(cfg: TrainConfig) -> dict[str, str]:
    """{absolute path: role} of the user-supplied files `cfg` makes a run read: ``prompts``,
    ``eval_prompts`` (a shipped prompt file included: an upgrade that edits it is a change too),
    ``credit`` and ``reward`` (the file of each user function, and for a ``module:function`` every package
    ``__init__.py`` importing it runs)."""
    from t2i_gcpo.resources import prompt_file
    from t2i_gcpo.rewards.registry import user_code_specs

    files: dict[str, str] = {}
    for role, value in (("prompts", cfg.prompts), ("eval_prompts", cfg.eval_prompts)):
        if value:
            path = prompt_file(value)
            if path.is_file():
                files.setdefault(str(path.resolve()), role)
    data = cfg.eval_suite_options.data if cfg.eval_suite else None
    if (
        data and Path(data).expanduser().is_file()
    ):  # the eval_suite's data file (a folder's files are not tracked)
        files.setdefault(str(Path(data).expanduser().resolve()), "eval_suite")
    for role, specs in (("credit", [cfg.credit.scheme]), ("reward", user_code_specs(cfg.reward))):
        for spec in specs:
            for path in code_files(spec):  # a module's package __init__.py files too: importing runs them
                if path.is_file():
                    files.setdefault(str(path), role)
    return files


def fingerprints(cfg: TrainConfig) -> dict[str, Any]:
    """The record `cfg`'s user files have now (what `write_record` stores)."""
    files = []
    for path, role in user_files(cfg).items():
        try:
            files.append({"role": role, "path": path, "sha256": sha256_bytes(Path(path).read_bytes())})
        except OSError as e:
            raise UserError(f"cannot read the {role} file {path}: {e.strerror or e}") from None
    return {"files": files}


class InputFile(TypedDict):
    role: str
    path: str
    sha256: str


class InputRecord(TypedDict):
    """input_files.json: each file the run read, with its role and sha256."""

    files: list[InputFile]


def write_record(run_dir: Path, record: dict[str, Any]) -> None:
    write_file(run_dir / RECORD, json.dumps(record, indent=1) + "\n", within=run_dir)


def read_record(run_dir: Path) -> dict[str, dict] | None:
    """{absolute path: {"role", "sha256"}} as the run recorded them; None for a run from before runs
    recorded them. A damaged record is a one-line UserError."""
    path = run_dir / RECORD
    if not path.exists() and not path.is_symlink():
        return None
    try:
        data = read_json(path, InputRecord)
    except UserError as e:
        raise UserError(f"{e}; delete {path} to resume unchecked") from None
    return {e["path"]: {"role": e["role"], "sha256": e["sha256"]} for e in data["files"]}


def check_unchanged(cfg: TrainConfig, recorded: dict[str, dict] | None, allow_changed: bool) -> None:
    """The prompt files a resumed run reads hold what they held when it started, unless `allow_changed`
    (then a note says which changed); else a one-line UserError naming the file."""
    if recorded is None:
        return
    for path, role in user_files(cfg).items():
        entry = recorded.get(path)
        if role in CODE_ROLES or entry is None:
            continue
        try:
            same = sha256_bytes(Path(path).read_bytes()) == entry["sha256"]
        except OSError as e:
            raise UserError(f"cannot read the {role} file {path}: {e.strerror or e}") from None
        if same:
            continue
        if not allow_changed:
            raise UserError(
                f"{path} changed since the run started (its {role.replace('_', ' ')} file); resume on the "
                "new content with --allow-changed-inputs, or restore the file"
            )
        print(f"note: {path} changed since the run started; continuing on its new content")
