"""One registration idiom for every extension point (docs/guides/index.md): credit schemes, reward forms,
model families, decode modes, evaluation suites and commands are each a `Registry` of frozen records.

An extension is one record in one registry. The built-in ones live one module each in the registry's
package (``builtins``: importing every module of it registers them, a new one is a new file and nothing else
to edit); installed packages add theirs through an entry-point group (``plugins``); code adds one with
``REGISTRY.add(record)`` or the point's decorator (``@register_scheme``, ``@register_reward``,
``@register_family``, ``@register_suite``), which builds the record from the decorated function. The
names, the help texts and the one-line error for an unknown name all come from the registry:

    names()          the registered names, built-in ones first (in name order), then the others
    rows()           (name, one-line summary) of each, for ``--help``
    lookup(name)     the record, or a UserError "unknown <kind> 'x': choose from a, b or c"

Listing a registry imports the modules of its package, so those modules keep torch and model code inside
their functions (``--help`` stays fast: tests/commands/test_help_fast.py).

A record is any object with a ``name`` (the key) and a ``doc`` (its one-line summary).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from t2i_gcpo.errors import UserError

E = TypeVar("E")


def choices_text(names: list[str]) -> str:
    """'a', 'b' or 'c' — the names of a registry as a message lists them."""
    quoted = [f"'{n}'" for n in names]
    return ", ".join(quoted[:-1]) + f" or {quoted[-1]}" if len(quoted) > 1 else "".join(quoted) or "(none)"


class Registry(Mapping[str, E], Generic[E]):
    """Named records of one extension point (module docstring). Reads like a dict of name → record."""

    def __init__(
        self,
        kind: str,
        *,
        builtins: str | None = None,
        skip: tuple[str, ...] = (),
        plugins: str | None = None,
    ) -> None:
        self.kind = kind  # what one record is, in messages: "credit scheme", "reward form", …
        self.builtins = builtins  # the package whose every module registers one built-in record
        self.skip = frozenset(skip)  # the modules of that package that are machinery, not records
        self.plugins = plugins  # the entry-point group installed packages register under
        self._records: dict[str, E] = {}
        self._loaded = {"builtins": builtins is None, "plugins": plugins is None}

    # ------------------------------------------------------------------------------- registering
    def add(self, record: E, *, replace: bool = False) -> E:
        """Register `record` under its ``name``. A second record of the same name is a ValueError unless
        `replace`, or unless it comes from the same module (that module was imported again)."""
        name = getattr(record, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a name, got {name!r}")
        old = self._records.get(name)
        if old is not None and not replace and _origin(old) != _origin(record):
            raise ValueError(f"{self.kind} {name!r} is already registered (by {_origin(old)})")
        self._records[name] = record
        return record

    def remove(self, name: str) -> None:
        """Unregister `name` (tests register toy records); nothing happens when it is not there."""
        self._records.pop(name, None)

    def load(self, plugins: bool = True) -> None:
        """Import the built-in modules once (each registers its record), and the plugins' entry points when
        `plugins` (an entry point names a module that registers on import, or a record)."""
        if not self._loaded["builtins"]:
            self._loaded["builtins"] = True
            package = importlib.import_module(self.builtins)
            for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__)):
                if module not in self.skip and not module.startswith("_"):
                    importlib.import_module(f"{self.builtins}.{module}")
        if plugins and not self._loaded["plugins"]:
            self._loaded["plugins"] = True
            from importlib.metadata import entry_points

            for point in entry_points(group=self.plugins):
                record = point.load()
                if getattr(record, "name", None) and record.name not in self._records:
                    self.add(record)

    # ------------------------------------------------------------------------------- reading
    def __getitem__(self, name: str) -> E:
        self.load(plugins=False)
        if name not in self._records:
            self.load()
        return self._records[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names(plugins=False))

    def __len__(self) -> int:
        return len(self.names(plugins=False))

    def __contains__(self, name: object) -> bool:
        self.load(plugins=False)
        return name in self._records

    def names(self, plugins: bool = False) -> list[str]:
        """The registered names: the built-in ones in name order of their modules, then the others in the
        order they were registered (``plugins``: installed packages' too; help texts leave them out, so that
        ``--help`` imports no installed package)."""
        self.load(plugins)
        prefix = f"{self.builtins}."
        builtin = [n for n, r in self._records.items() if self.builtins and _origin(r).startswith(prefix)]
        builtin.sort(key=lambda n: _origin(self._records[n]))  # stable: a module's own order kept
        return builtin + [n for n in self._records if n not in builtin]

    def lookup(self, name: str, what: str | None = None) -> E:
        """The record `name`, or a one-line UserError naming the choices (`what`: how the message names the
        setting, default "unknown <kind>")."""
        if name in self:
            return self[name]
        self.load()
        if name in self._records:
            return self._records[name]
        lead = what or f"unknown {self.kind}"
        raise UserError(f"{lead} {name!r}: choose from {choices_text(self.names(plugins=True))}")

    def rows(self, plugins: bool = False) -> list[tuple[str, str]]:
        """(name, one-line summary) of every record, for help texts."""
        return [(name, str(getattr(self._records[name], "doc", "") or "")) for name in self.names(plugins)]

    def decorator(self, build: Callable[..., E]) -> Callable[..., Callable[[Callable], Callable]]:
        """The decorator form of `add`: ``register = REGISTRY.decorator(build)``, then
        ``@register(name, **fields)`` over a function registers ``build(name, function, **fields)`` and
        returns the function unchanged."""

        def register(name: str, *, replace: bool = False, **fields: Any) -> Callable[[Callable], Callable]:
            def add(fn: Callable) -> Callable:
                self.add(build(name, fn, **fields), replace=replace)
                return fn

            return add

        return register


def _origin(record: Any) -> str:
    """The module a record comes from: that of its first function field (a loader, a scheme, a suite's
    reader), or of the ``"module:attribute"`` it names (a command), else its own class's."""
    fields = getattr(record, "__dict__", None) or {}
    for value in fields.values():
        if callable(value) and isinstance(getattr(value, "__module__", None), str):
            return value.__module__
        if isinstance(value, str) and ":" in value and value.partition(":")[0].startswith("t2i_gcpo."):
            return value.partition(":")[0]
    return type(record).__module__


__all__ = ["Registry", "choices_text"]
