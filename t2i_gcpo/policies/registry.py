"""Model families, one registration each, and the `--model` strings they resolve.

A family (t2i_gcpo/policies/families/<name>.py for the built-in ones) declares its prefix, how it
recognises one of its checkpoint directories, the names it ships, the ``model_options`` keys it
reads and its loader; `register_family` adds one (docs/guides/new_family.md). A `--model` string is

- ``NAME``          a shipped model ("shapeworld", "shapeworld-masked", "arithmetic", …)
- ``FAMILY:PATH``   a local checkpoint of that family ("janus:PATH", "amused:PATH", …)
- ``PATH``          a directory whose own files say which family it is (a run's checkpoint of any
                    family); one no family recognises is read as an AR checkpoint (``ar``)

Nothing here imports torch, transformers or diffusers: the help texts are derived from the registry.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from t2i_gcpo.errors import UserError
from t2i_gcpo.extensions import Registry

ASSETS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets")
# a directory no family recognises is tried as an AR checkpoint (its loader says what is missing)
FALLBACK = "ar"
ENTRY_POINT_GROUP = "t2i_gcpo.families"  # installed packages may register families here


@dataclass(frozen=True)
class Family:
    """One model family: everything `--model` needs to know about it."""

    name: str  # the prefix of ``NAME:PATH``
    load: Callable[[str, Any], Any]  # (shipped name or path, ModelOptions) → the policy
    doc: str = ""  # one line: what it loads (`--help`, docs/guides/new_family.md)
    detect: Callable[[Path], bool] | None = None  # whether a directory's own files are this family's
    shipped: Mapping[str, str] = field(default_factory=dict)  # shipped name → its folder
    options: frozenset[str] = frozenset()  # the ModelOptions keys it reads; others must keep their defaults
    task: str | None = None  # the task every model of the family serves (None: it depends on the model)
    shipped_task: str | None = None  # the task of its shipped models, when `task` is None


# every family, the built-in ones one module each in policies/families/ (t2i_gcpo/extensions.py)
FAMILIES: Registry[Family] = Registry(
    "model family", builtins="t2i_gcpo.policies.families", plugins=ENTRY_POINT_GROUP
)


def register_family(family: Family | str, *, replace: bool = False, **fields: Any) -> Any:
    """Add a family. As a decorator over its loader, the way built-in families register::

        @register_family("mine", detect=lambda path: (path / "mine.json").is_file(), options={"dtype"})
        def load(target: str, options: ModelOptions) -> Policy: ...

    or with its record, ``register_family(Family(name="mine", load=load, …))`` (``replace=True`` overwrites
    one of the same name). A name that is not an identifier, a second family of the same name, or a shipped
    name another family ships is a one-line UserError."""
    if isinstance(family, str):
        name = family

        def add(load: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
            register_family(Family(name=name, load=load, **fields), replace=replace)
            return load

        return add
    if not family.name.isidentifier():
        raise UserError(f"family name {family.name!r}: use letters, digits and underscores")
    if family.name in FAMILIES and not replace:
        raise UserError(f"model family {family.name!r} is already registered")
    for other in FAMILIES.values():
        taken = set(family.shipped) & set(other.shipped) if other.name != family.name else set()
        if taken:
            raise UserError(
                f"model family {family.name!r}: {', '.join(sorted(taken))} ships with {other.name!r}"
            )
    return FAMILIES.add(dataclasses.replace(family, options=frozenset(family.options)), replace=True)


def unregister_family(name: str) -> None:
    """Remove a registered family (tests register toy ones)."""
    FAMILIES.remove(name)


def families(plugins: bool = True) -> dict[str, Family]:
    """Every registered family by name: the built-in ones in name order, then the others in the order
    they were registered (``plugins=False``: without scanning installed packages, for help texts)."""
    return {name: FAMILIES[name] for name in FAMILIES.names(plugins)}


def get_family(name: str) -> Family:
    return FAMILIES.lookup(name)


def shipped_folder(name: str) -> str | None:
    """The folder of a shipped model ("shapeworld", "arithmetic", …), None for any other name."""
    for fam in families(plugins=False).values():
        if name in fam.shipped:
            return fam.shipped[name]
    return None


def models_help(plugins: bool = False) -> str:
    """The models `--model` takes, for help texts and errors (derived from the registry)."""
    fams = families(plugins).values()
    shipped = [f"'{name}'" for fam in fams for name in fam.shipped]
    prefixed = [f"'{fam.name}:PATH'" for fam in fams]
    return ", ".join(shipped + ["a checkpoint dir"] + prefixed[:-1]) + f" or {prefixed[-1]}"


def read_json(path: Path) -> dict:
    """A JSON object file's content; {} when it is missing or not a JSON object (for `detect`)."""
    from t2i_gcpo.outdir import read_json as read_checked

    try:
        data = read_checked(path, follow=True) if path.is_file() else {}
    except UserError:  # unreadable, malformed, nested too deeply: not this family's file
        return {}
    return data if isinstance(data, dict) else {}


def detect_family(path: str) -> str:
    """The family of a checkpoint directory, from its own files (``ar`` when nothing says)."""
    folder = Path(path)
    for fam in families().values():
        if fam.detect is not None and fam.detect(folder):
            return fam.name
    return FALLBACK


def is_shipped(name: str) -> bool:
    """Whether `name` is a model the package ships ("shapeworld", "shapeworld-masked", "arithmetic", …)."""
    return shipped_folder(name) is not None


def family_prefix(spec: str) -> tuple[str, str] | None:
    """(family, rest) when `spec` starts with a registered family's ``NAME:``, else None."""
    head, sep, rest = spec.partition(":")
    return (head, rest) if sep and head in families() else None


def split_spec(spec: str) -> tuple[str, str]:
    """``family:PATH`` or a name / path → (family, name or path)."""
    prefixed = family_prefix(spec)
    if prefixed is not None:
        return prefixed
    for fam in families().values():
        if spec in fam.shipped:
            return fam.name, spec
    return detect_family(spec), spec


def model_task(spec: str) -> str | None:
    """The task a model's prompts belong to, known without loading it (None: it depends on the model)."""
    name, target = split_spec(spec)
    fam = get_family(name)
    return fam.task or (fam.shipped_task if target in fam.shipped else None)


def check_options(fam: Family, spec: str, options: Any) -> None:
    """A one-line UserError for a model option set (not at its default) that `fam` does not read."""
    from t2i_gcpo.config import ModelOptions

    default = ModelOptions()
    unknown = sorted(set(fam.options) - {f.name for f in dataclasses.fields(ModelOptions)})
    if unknown:  # checked here, not at registration: the config module is slow to import for --help
        raise UserError(
            f"model family {fam.name!r} declares unknown model_options keys: {', '.join(unknown)}"
        )
    for f in dataclasses.fields(ModelOptions):
        value = getattr(options, f.name, getattr(default, f.name))
        if f.name in fam.options or value == getattr(default, f.name):
            continue
        readers = [other.name for other in families().values() if f.name in other.options]
        names = ", ".join(readers[:-1]) + " and " + readers[-1] if len(readers) > 1 else "".join(readers)
        where = f"{names} models only" if readers else "no model family"
        raise UserError(
            f"model_options.{f.name}={value!r} applies to {where}, not to the {fam.name} model '{spec}'"
        )


def load_policy(spec: str, options: Any = None) -> Any:
    """The policy a `--model` string names; `options` (``TrainConfig.model_options``, None for the
    defaults) sets e.g. the dtype, LoRA and checkpointing of real checkpoints or the log-prob estimator
    of masked models — each family reads the keys it declares."""
    from t2i_gcpo.config import ModelOptions

    name, target = split_spec(spec)
    fam = get_family(name)
    check_options(fam, spec, options)
    if family_prefix(spec) is None and not is_shipped(spec) and not os.path.exists(os.path.expanduser(spec)):
        raise UserError(f"model '{spec}' not found: expected {models_help(plugins=True)}")
    from t2i_gcpo.policies.base import with_member_defaults

    return with_member_defaults(fam.load(target, options if options is not None else ModelOptions()))


def model_identity(spec: str) -> str:
    """A `--model` spec as recorded with generated images: shipped names ("shapeworld",
    "shapeworld-masked", …) as given, paths made absolute (keeping a family prefix such as "janus:"), so
    the same checkpoint reached by another path compares equal. (A checkpoint rewritten in place keeps
    its identity: use --overwrite after retraining.)"""
    prefixed = family_prefix(spec)
    prefix, target = (prefixed[0] + ":", prefixed[1]) if prefixed else ("", spec)
    if is_shipped(target):
        return spec
    return prefix + os.path.realpath(os.path.expanduser(target))
