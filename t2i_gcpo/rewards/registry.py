"""The reward registry (docs/guides/rewards.md#spec): every form ``--reward`` takes is one file of
t2i_gcpo/rewards/forms/ that registers itself, and `build_reward` turns a spec into the reward it names.

A spec is one term or a weighted sum of terms, ``0.7*pickscore:/models/PickScore_v1+0.3*shapeworld``
(r = Σ_k w_k r_k; a term without a weight has weight 1). A term is

- ``NAME[:FIELD,FIELD,…]`` — a registered reward. Its FIELDs are, in any order: its positional arguments
  in order (weights folders and files, a URL), bare flags (a value of one of its choice options, e.g.
  ``flow_grpo``) and ``key=value`` options — its own, and the two every form takes (`PLACEMENT`):
  ``device=`` (where its model runs and its images go) and ``batch_size=`` (images per call). A field may be
  quoted ('…' or "…") to hold a comma, a plus or a colon
  (``aesthetic:CLIP,'/models/sac+logos+ava1-l14-linearMSE.pth'``; a '+' that does not start another term
  needs no quotes either);
- ``module:function`` / ``file.py:function`` — a user function f(images, prompts, metadata): user code,
  imported and run (on ``--resume`` only when named again or trusted).

`forms()` lists the registered forms (``t2i-gcpo train --help`` shows them); every reward returned is
wrapped so that an exception or a NaN score raises `RewardError` naming it (rewards/combine.py).

A registration (one per reward file; the registry imports every module of t2i_gcpo/rewards/forms/ but
private ``_…`` ones, so a new reward is a new file there and nothing else):

    @register_reward("pickscore", scores="image", doc="…", weights="…", source="…", licence="…")
    def load(folder: Annotated[str, Arg("a PickScore_v1 folder", kind="dir", needs=("config.json",))], *,
             batch_size: Annotated[int, Option("images per forward pass", low=1)] = 16,
             device: str = "cpu") -> Reward: ...

The signature is the declaration. Positional parameters are the spec's positional fields (``Arg``: what
it is, its kind — ``dir`` and ``file`` are checked to exist, with the files a folder ``needs``, before
anything loads and before a run folder exists; ``path`` is the loader's to check; ``text`` is taken as
written — and its metavar, by default the name in capitals). Keyword-only parameters are its options,
typed by their annotations and bounded by their ``Option`` (the same `Option` as a credit scheme's:
documentation, low/high); a ``Literal`` option's values may be written bare, as flags. Keyword-only
parameters named in `CONTEXT` are not options: the run supplies them (the policy's device, its token
grid). The module imports torch and its model code inside ``load``, so that ``--help`` lists the
registry without importing torch (tests/commands/test_help_fast.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

from t2i_gcpo.config import DEVICE, Bounds
from t2i_gcpo.core.schemes.registry import Option, option_types
from t2i_gcpo.errors import UserError, not_a_file, shorten
from t2i_gcpo.extensions import Registry
from t2i_gcpo.usercode import PYTHON_OBJECT, canonical_spec, is_function_spec

KINDS = ("dir", "file", "local", "path", "url", "text")
# keyword parameters a loader takes from the run, never from the spec: the device its model goes to (the
# policy's, or reward_options.device, or the term's device=), the policy's token grid, a
# text policy's tokenizer
CONTEXT = ("device", "grid", "tokenizer")
SCORES = ("image", "text")
PLURAL = {"image": "images", "text": "text"}
SUM_EXAMPLE = "0.7*clip:CKPT+0.3*shapeworld"


@dataclass(frozen=True)
class Arg:
    """A positional field of a reward spec, attached to its parameter with ``Annotated``.

    kind: ``dir`` (a folder that must exist, holding each of `needs`: a file name, or a tuple of names
    one of which must be there), ``file`` (a file that must exist), ``local`` (a file or a folder that
    must exist), ``path`` (a file or folder its loader checks), ``url`` (an http(s) URL), ``text`` (taken
    as written: a model name). Paths are recorded absolute in a run's config (`canonical_reward`)."""

    doc: str
    kind: str = "text"
    metavar: str | None = None
    needs: tuple[str | tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Arg kind must be one of {KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class RewardArg:
    """One positional argument of a form, read from its loader's signature."""

    name: str
    info: Arg
    default: Any  # inspect.Parameter.empty: it must be given

    @property
    def required(self) -> bool:
        return self.default is inspect.Parameter.empty

    @property
    def metavar(self) -> str:
        return self.info.metavar or self.name.upper()


@dataclass(frozen=True)
class RewardOption:
    """One keyword option of a form, read from its loader's signature."""

    name: str
    type: Any  # the annotation without Annotated; Any when there is none
    default: Any
    info: Option | None = None

    @property
    def choices(self) -> tuple[str, ...]:
        """The values of a ``Literal`` option (each may be written bare, as a flag)."""
        tp = self.type
        if typing.get_origin(tp) in (Union, types.UnionType):
            tp = next((a for a in typing.get_args(tp) if typing.get_origin(a) is Literal), None)
        return tuple(str(v) for v in typing.get_args(tp)) if typing.get_origin(tp) is Literal else ()

    @property
    def bounds(self) -> Bounds | None:
        info = self.info
        if info is None or (info.low is None and info.high is None):
            return None
        return Bounds(info.low, info.high, info.low_open, info.high_open, info.why)


# the options every form takes, besides its own (docs/guides/rewards.md#at-scale); a form that declares its
# own batch_size (images per forward pass) gets that one, and its loader the value
PLACEMENT = (
    RewardOption(
        "device", str, None, Option("where this term's model runs and its images go: cpu, cuda, cuda:N")
    ),
    RewardOption(
        "batch_size",
        int,
        None,
        Option("images per call of this term (all at once by default)", low=1, high=4096),
    ),
)


@dataclass(frozen=True)
class RewardForm:
    """A registered reward form: what a spec ``NAME:…`` builds and everything its help and checks need."""

    name: str
    scores: str  # "image" or "text": what the policy must write
    load: Callable[..., Any]  # load(*args, **options, **context) → a reward
    doc: str  # one line: what it measures
    args: tuple[RewardArg, ...] = ()
    options: tuple[RewardOption, ...] = ()
    context: tuple[str, ...] = ()  # the CONTEXT names `load` takes
    weights: str = ""  # the weights it reads and where its users get them
    source: str = ""  # the reference implementation it follows (repository, file, commit)
    licence: str = ""  # the weights' licence
    usage_text: str | None = None  # a usage line of its own (the forms older than this registry)
    example: str | None = None  # a complete spec, shown in errors and help
    # FIELD strings of what follows ``NAME:``, and the inverse (canonical_reward); None: comma-separated
    split: Callable[[str], list[str]] | None = None
    join: Callable[[list[str]], str] | None = None
    requires: tuple[str, ...] = ()  # modules it imports that are not dependencies of the package
    install: str = ""  # how to get them (an optional extra)
    check: Callable[[Any], None] | None = None  # check(term): more to check before the model loads (a server)

    @property
    def usage(self) -> str:
        """``name:ARG,ARG[,OPTIONAL][,flag]`` (options by name are listed apart)."""
        if self.usage_text:
            return self.usage_text
        flags = [c for o in self.options for c in o.choices if c != str(o.default)]
        fields = [(a.metavar, a.required) for a in self.args] + [(c, False) for c in flags]
        out = self.name
        for i, (text, required) in enumerate(fields):
            lead = ":" if i == 0 else ","
            out += f"{lead}{text}" if required else f"[{lead}{text}]"
        return out

    def describe_options(self) -> str:
        own = [o.name for o in self.options]
        return ", ".join(own + [o.name for o in PLACEMENT if o.name not in own])

    @property
    def all_options(self) -> dict[str, RewardOption]:
        """Its own options and the `PLACEMENT` ones it does not declare itself, by name."""
        return {**{o.name: o for o in PLACEMENT}, **{o.name: o for o in self.options}}

    @property
    def flags(self) -> dict[str, str]:
        """Flag → the option it sets."""
        return {c: o.name for o in self.options for c in o.choices}


# every form, one module each in t2i_gcpo/rewards/forms/ (its machinery stays in rewards/):
# t2i_gcpo/extensions.py
REWARDS: Registry[RewardForm] = Registry("reward form", builtins="t2i_gcpo.rewards.forms")


# ----------------------------------------------------------------------------- registering
def register_reward(
    name: str,
    *,
    scores: str,
    doc: str,
    weights: str = "",
    source: str = "",
    licence: str = "",
    usage: str | None = None,
    example: str | None = None,
    split: Callable | None = None,
    join: Callable | None = None,
    requires: tuple[str, ...] = (),
    install: str = "",
    check: Callable | None = None,
    replace: bool = False,
) -> Callable:
    """Decorator: add the loader `fn` to `REWARDS` as the form `name` (module docstring: the signature
    declares its arguments and options; `scores` is "image" or "text"; `requires`: modules beyond the
    package's dependencies, checked before anything loads, with `install` saying how to get them; `check`, a
    function of the read `Term` that raises a UserError, runs with the other checks before
    the model loads)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"reward name {name!r}: lower-case letters, digits and underscores")
    if scores not in SCORES:
        raise ValueError(f"reward {name!r}: scores must be one of {SCORES}, got {scores!r}")

    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        args, options, context = _read_signature(name, fn)
        REWARDS.add(
            RewardForm(
                name,
                scores,
                fn,
                doc,
                args,
                options,
                context,
                weights,
                source,
                licence,
                usage,
                example,
                split,
                join,
                tuple(requires),
                install,
                check,
            ),
            replace=replace,
        )
        return fn

    return add


def unregister_reward(name: str) -> None:
    """Remove a registered form (tests register toy ones)."""
    REWARDS.remove(name)


def _read_signature(
    name: str, fn: Callable
) -> tuple[tuple[RewardArg, ...], tuple[RewardOption, ...], tuple[str, ...]]:
    """The positional arguments, options and context names of loader `fn` (module docstring)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise ValueError(f"reward {name!r}: its loader's signature cannot be read") from None
    hints = option_types(fn, [p.name for p in params])
    args, options, context = [], [], []
    for p in params:
        tp, extras = hints.get(p.name, Any), ()
        if typing.get_origin(tp) is typing.Annotated:
            tp, *extras = typing.get_args(tp)
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ValueError(f"reward {name!r}: its loader takes no *args or **kwargs (declare each)")
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            if p.name in CONTEXT:
                context.append(p.name)
            else:
                info = next((e for e in extras if isinstance(e, Option)), None)
                options.append(RewardOption(p.name, tp, p.default, info))
            continue
        info = next((e for e in extras if isinstance(e, Arg)), None) or Arg("")
        if args and args[-1].default is not inspect.Parameter.empty and p.default is inspect.Parameter.empty:
            raise ValueError(f"reward {name!r}: a required argument follows an optional one")
        args.append(RewardArg(p.name, info, p.default))
    return tuple(args), tuple(options), tuple(context)


def forms() -> dict[str, RewardForm]:
    """Every registered form by name (the built-in ones in name order, then any registered later)."""
    return {name: REWARDS[name] for name in REWARDS.names()}


def forms_text(output: str | None = None) -> str:
    """The forms `--reward` takes, for help texts and errors (those scoring `output` only, when given)."""
    usages = [f"'{f.usage}'" for f in forms().values() if output in (None, f.scores)]
    return ", ".join(usages + ["'module:function'"]) + f", or a weighted sum such as '{SUM_EXAMPLE}'"


# ----------------------------------------------------------------------------- reading a spec
_QUOTES = ("'", '"')
_OPTION = re.compile(r"^\s*([A-Za-z_]\w*)\s*=(.*)$", re.S)
_WEIGHT = re.compile(r"^\s*([^\s*:/'\"]+)\s*\*\s*(\S.*?)\s*$", re.S)


def split_outside_quotes(text: str, sep: str) -> list[str]:
    """`text` split at each `sep` that is not inside a quoted stretch ('…' or "…")."""
    parts, current, quote = [], [], None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in _QUOTES:
            quote = ch
        elif ch == sep:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    if quote:
        raise UserError(f"reward '{shorten(text)}': unmatched quote {quote}")
    parts.append("".join(current))
    return parts


def unquote(field: str) -> str:
    field = field.strip()
    if len(field) >= 2 and field[0] in _QUOTES and field[-1] == field[0]:
        return field[1:-1]
    return field


def _starts_term(piece: str) -> bool:
    """Whether the text after a '+' begins a term of its own: a weight, a registered name, or a user
    function (``module:function``); else the '+' belongs to the term before (a file name such as
    ``sac+logos+ava1-l14-linearMSE.pth``)."""
    piece = piece.strip()
    if not piece:
        return True  # an empty term: an error of its own
    m = _WEIGHT.match(piece)
    if m:
        return True
    head = unquote(piece).split(":", 1)[0].strip()
    if head in forms():
        return True
    return (
        ":" in piece
        and re.fullmatch(r"[\w./~-]+", head or "-") is not None
        and is_function_spec(unquote(piece))
    )


def _pieces(spec: str) -> list[tuple[str | None, str]]:
    """(weight as written or None, term) of each term of `spec`."""
    pieces: list[str] = []
    for piece in split_outside_quotes(spec, "+"):
        if pieces and not _starts_term(piece):
            pieces[-1] += "+" + piece
        else:
            pieces.append(piece)
    out = []
    for piece in pieces:
        m = _WEIGHT.match(piece)
        out.append((m.group(1), m.group(2).strip()) if m else (None, piece.strip()))
    return out


def terms(spec: str) -> list[tuple[float | None, str]]:
    """(weight, term) of each term of `spec` (weight None: written without one); a one-line UserError
    for a weight that is not a finite number."""
    out = []
    for written, term in _pieces(spec):
        weight = None
        if written is not None:
            try:
                weight = float(written)
            except ValueError:
                raise UserError(
                    f"reward term '{shorten(written)}*{shorten(term)}': the weight "
                    f"{written!r} is not a number"
                ) from None
            if not math.isfinite(weight):
                raise UserError(
                    f"reward term '{shorten(written)}*{shorten(term)}': the weight must be a finite "
                    f"number, got {written}"
                )
            if weight == 0 and re.search(r"[1-9]", written.lower().split("e")[0]):  # 1e-400: 0.0 as a float
                raise UserError(
                    f"reward term '{shorten(written)}*{shorten(term)}': the weight {written} is 0 in "
                    f"floating point (below 5e-324, the smallest float): the term would count for nothing; "
                    f"write a larger weight, or 0 to log the term without training on it"
                )
        out.append((weight, term))
    if out and all(w == 0 for w, _ in out):
        raise UserError(
            f"reward '{shorten(spec)}': every term has weight 0, so every sample would score 0 and no "
            f"step would learn anything: give a term a weight (a term of weight 0 beside others is "
            f"logged, not trained on)"
        )
    return out


@dataclass(frozen=True)
class Term:
    """A registered form's term, read: its form, positional arguments and typed options."""

    text: str
    form: RewardForm
    args: tuple[str, ...]
    options: dict[str, Any]


def form_of(term: str) -> RewardForm | None:
    """The registered form a term names (None: a user function or unknown)."""
    return forms().get(unquote(term).split(":", 1)[0].strip())


def is_user_function(term: str) -> bool:
    """Whether a reward term names a user function (``module:function`` / ``file.py:function``)."""
    term = unquote(term)
    return form_of(term) is None and ":" in term and not term.startswith(":")


def _fields(form: RewardForm, rest: str) -> list[str]:
    fields = form.split(rest) if form.split else split_outside_quotes(rest, ",")
    return [f.strip() for f in fields if f.strip()]


def read_term(term: str) -> Term:
    """The form, arguments and options of a registered form's `term`; a one-line UserError for anything
    it does not take (the message shows its usage and options)."""
    text = unquote(term)
    form = form_of(text)
    if form is None:
        raise UserError(f"unknown reward '{shorten(text)}': use {forms_text()}")
    _, _, rest = text.partition(":")
    write = f"write {form.usage}" + (
        f", e.g. {form.example}" if form.example and form.example != form.usage else ""
    )
    write += f"; its options: {form.describe_options()}"

    def bad(what: str) -> UserError:
        return UserError(f"reward '{shorten(text, 200)}': {what} ({write})")

    positional: list[str] = []
    raw: dict[str, str] = {}
    by_name = form.all_options
    for field in _fields(form, rest):
        quoted = field[0] in _QUOTES
        m = None if quoted else _OPTION.match(field)
        if m:
            key = m.group(1)
            if key not in by_name:
                raise bad(f"no option '{key}'")
            if key in raw:
                raise bad(f"option {key} given twice")
            raw[key] = unquote(m.group(2))
        elif not quoted and field in form.flags:
            key = form.flags[field]
            if key in raw:
                raise bad(f"option {key} given twice")
            raw[key] = field
        else:
            positional.append(unquote(field))
    if len(positional) > len(form.args):
        extra = positional[len(form.args)]
        hint = (
            f"; a user module named {form.name}: give its file, ./{form.name}.py:function"
            if not form.args
            else ""
        )
        raise bad(f"'{shorten(extra)}' is not one of its fields{hint}")
    missing = [a.metavar for a in form.args[len(positional) :] if a.required]
    if missing:
        raise bad(f"{', '.join(missing)} missing")
    options = {key: _option_value(form, by_name[key], value, bad) for key, value in raw.items()}
    return Term(text, form, tuple(positional), options)


def _option_value(form: RewardForm, option: RewardOption, raw: str, bad: Callable[[str], UserError]) -> Any:
    try:
        value = coerce(raw, option.type)
    except ValueError as e:
        raise bad(f"option {option.name}: expected {e}, got {raw!r}") from None
    bounds = option.bounds
    problem = bounds.problem(value) if bounds is not None and isinstance(value, (int, float)) else None
    if problem:
        raise bad(f"option {option.name} {problem}, got {raw}")
    return value


def coerce(raw: str, tp: Any) -> Any:
    """`raw` (a spec's text) as a value of the annotation `tp`; ValueError naming what was expected."""
    origin = typing.get_origin(tp)
    if tp is Any or tp is inspect.Parameter.empty:
        return raw
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if type(None) in args and raw.strip().lower() in ("none", "null"):
            return None
        wanted = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(raw, arg)
            except ValueError as e:
                wanted.append(str(e))
        raise ValueError(" or ".join(wanted + (["null"] if type(None) in args else [])))
    if origin is Literal:
        for value in typing.get_args(tp):
            if raw == str(value):
                return value
        raise ValueError("one of " + ", ".join(str(v) for v in typing.get_args(tp)))
    if tp is bool:
        words = {
            "true": True,
            "yes": True,
            "1": True,
            "on": True,
            "false": False,
            "no": False,
            "0": False,
            "off": False,
        }
        if raw.strip().lower() in words:
            return words[raw.strip().lower()]
        raise ValueError("true or false")
    if tp is int:
        try:
            return int(raw.strip())
        except ValueError:
            raise ValueError("an integer") from None
    if tp is float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ValueError("a finite number") from None
        if not math.isfinite(value):
            raise ValueError("a finite number")
        return value
    return raw


# ----------------------------------------------------------------------------- checking and building
def check_paths(term: Term) -> None:
    """The weights a term names are there: each ``dir`` argument a folder holding what it `needs`, each
    ``file`` argument a file, each ``local`` one either, each ``url`` an http(s) URL; a one-line UserError
    naming the reward otherwise."""
    for arg, value in zip(term.form.args, term.args):
        kind, path = arg.info.kind, Path(value).expanduser()
        label = f"reward '{term.form.name}': {arg.metavar} {value}"
        want = f" ({arg.info.doc})" if arg.info.doc else ""
        if kind == "dir":
            if not path.exists():
                raise UserError(f"{label} does not exist{want}")
            if not path.is_dir():
                raise UserError(f"{label} is a file, expected a folder{want}")
            for need in arg.info.needs:
                names = (need,) if isinstance(need, str) else tuple(need)
                if not any((path / n).is_file() for n in names):
                    raise UserError(f"{label} holds no {' or '.join(names)}{want}")
        elif kind == "url" and not re.match(r"^https?://[^/\s]+", value):
            raise UserError(f"{label} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)")
        elif kind == "local" and not path.exists():
            raise UserError(f"{label} does not exist{want}")
        elif kind == "file":
            if path.is_dir():
                raise UserError(f"{label} is a folder, expected a file{want}")
            if not path.is_file():
                raise UserError(f"{label} does not exist{want}")


def check_requirements(form: RewardForm) -> None:
    """The modules `form` needs beyond the package's dependencies are installed; else one line saying how."""
    for module in form.requires:
        if importlib.util.find_spec(module) is None:
            raise UserError(f"reward '{form.name}' needs the package {module}, not installed: {form.install}")


def check_reward_spec(spec: str | None, output: str | None = None) -> None:
    """Everything about `spec` that can be known without loading a model: each registered term's
    fields, options (typed, bounded) and weights paths, and that it scores what the policy writes
    (`output`). A one-line UserError otherwise. User functions are imported later, by `build_reward`."""
    if spec is None or spec.split(":", 1)[0] == PYTHON_OBJECT:
        return
    for _, term in _spec_terms(spec):
        if is_user_function(term):
            module = unquote(term).rpartition(":")[0]
            problem = not_a_file(Path(module).expanduser()) if module.endswith(".py") else None
            if problem:  # before the model loads (the file is imported, and checked again, by build_reward)
                raise UserError(f"reward file '{module}' {problem}")
            continue
        read = read_term(term)
        _check_output(read, output)
        check_requirements(read.form)
        check_paths(read)
        if read.options.get("device") is not None:
            check_device(read.options["device"], f"reward '{shorten(read.text)}': device")
        if read.form.check is not None:
            read.form.check(read)


def check_device(device: str, what: str) -> None:
    """`device` names a device this machine has (cpu, cuda, cuda:N, mps); else a one-line UserError naming
    `what` (the option or config key that set it)."""
    if not DEVICE.match(device):
        raise UserError(f"{what} {device!r} is not a device: write cpu, cuda, cuda:N or mps")
    if device == "cpu":
        return
    import torch

    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if index >= count:
            have = f"{count} CUDA device(s)" if count else "no CUDA device"
            raise UserError(f"{what} {device}: this machine has {have}")
    elif not torch.backends.mps.is_available():
        raise UserError(f"{what} mps: this machine has no MPS device")


def _spec_terms(spec: str) -> list[tuple[float | None, str]]:
    if not spec or not spec.strip():
        raise UserError(f"empty reward: use {forms_text()}")
    found = terms(spec)
    if len(found) > 1 and any(not t for _, t in found):
        raise UserError(f"empty term in reward sum '{shorten(spec)}'")
    if not found[0][1]:
        raise UserError(f"empty reward: use {forms_text()}")
    for _, term in found:
        text = unquote(term)
        head, comma, rest = text.partition(",")
        if comma and form_of(text) is None and head.strip() in forms():  # 'shapeworld,device=cuda:99'
            raise UserError(
                f"reward '{shorten(text)}': a reward's arguments and options follow a ':' after its name, "
                f"not a ',': write '{head.strip()}:{rest.strip()}'"
            )
        if re.match(r"^https?://", text):
            raise UserError(
                f"reward '{shorten(unquote(term))}' is an address: write remote:URL for a t2i-gcpo "
                f"reward-server, or judge:URL for a chat VLM behind an OpenAI-compatible server"
            )
    return found


def _check_output(term: Term, output: str | None) -> None:
    if output is not None and term.form.scores != output:
        fits = " or ".join(
            f"'{f.name}'" for f in forms().values() if f.scores == output
        )  # `--help` has their usage
        raise UserError(
            f"reward '{shorten(term.text)}' scores {PLURAL[term.form.scores]}, but the model writes "
            f"{PLURAL[output]}: use {fits} (or a module:function of your own)"
        )


class Named:
    """A loaded reward that has no name of its own, under its form's name (for messages and logs)."""

    wraps_reward = True  # rewards.combine: its inner reward is what the sum, bounds and probes look at

    def __init__(self, reward: Any, name: str):
        self.inner, self.name = reward, name
        for attr in ("bounds", "check_prompts", "probe"):
            if hasattr(reward, attr):
                setattr(self, attr, getattr(reward, attr))

    def __call__(self, images: Any, prompts: list[str], metadata: list[dict]) -> Any:
        return self.inner(images, prompts, metadata)


def _build_one(term: str, ctx: dict) -> Any:
    """One term's reward, placed (`rewards.combine.Placed`) where its device or batch size asks for it: the
    term's ``device=`` / ``batch_size=``, else the run's ``reward_device`` / ``batch_size``."""
    from t2i_gcpo.rewards.combine import CallableReward, Placed

    device, batch_size = ctx.get("reward_device"), ctx.get("batch_size")
    if is_user_function(term):
        reward = CallableReward(unquote(term))
    else:
        read = read_term(term)
        _check_output(read, ctx.get("output"))
        check_requirements(read.form)
        check_paths(read)
        form, options = read.form, dict(read.options)
        device = options.pop("device", None) or device
        if device is not None:
            check_device(device, f"reward '{shorten(read.text)}': device")
        if any(o.name == "batch_size" for o in form.options):  # its own: images per forward pass
            if "batch_size" not in options and batch_size is not None:
                options["batch_size"] = batch_size
            batch_size = None  # the loader batches
        else:
            batch_size = options.pop("batch_size", None) or batch_size
        context = {k: v for k, v in ctx.items() if k in form.context}
        if device is not None and "device" in form.context:
            context["device"] = device
        reward = form.load(*read.args, **options, **context)
        reward = reward if getattr(reward, "name", None) else Named(reward, form.name)
    return reward if device is None and batch_size is None else Placed(reward, device, batch_size)


def build_reward(spec: str, **ctx: Any) -> Any:
    """The reward named by `spec` (module docstring), checked for errors and NaN.

    `ctx` holds what the run supplies (`CONTEXT`: ``device``, ``grid``, ``tokenizer``); each form takes
    those its loader declares. ``output`` ("image" or "text", the policy's) refuses a form of the other kind.
    ``reward_device`` (reward_options.device; None: the run's ``device``, images where they are) and
    ``batch_size`` (reward_options.batch_size) place every term that does not say its own.
    """
    from t2i_gcpo.rewards.combine import Checked, WeightedSum

    found = _spec_terms(spec)
    if ctx.get("reward_device") is not None:
        check_device(ctx["reward_device"], "config key 'reward_options.device':")
    if len(found) == 1 and found[0][0] is None:
        return Checked(_build_one(found[0][1], ctx))
    return WeightedSum([(_build_one(term, ctx), 1.0 if w is None else w) for w, term in found])


def spec_context(spec: str) -> set[str]:
    """The `CONTEXT` names the registered forms of `spec` take (a reward server asks its clients for them)."""
    return {
        name
        for _, term in _spec_terms(spec)
        if not is_user_function(term)
        for name in read_term(term).form.context
    }


def spec_outputs(spec: str) -> set[str]:
    """What the registered forms of `spec` score ("image", "text"); a user function's is not known."""
    return {read_term(term).form.scores for _, term in _spec_terms(spec) if not is_user_function(term)}


# ----------------------------------------------------------------------------- recording a spec
def user_code_specs(spec: str | None) -> list[str]:
    """The user functions (``module:function`` / ``file.py:function``) a reward spec calls."""
    if not spec or spec.split(":", 1)[0] == PYTHON_OBJECT:
        return []
    return [unquote(term) for _, term in terms(spec) if is_user_function(term)]


def record_reward(spec: str | None, reward: Any) -> str | None:
    """`spec` with what each built term asks to record added to it (its ``recorded()`` fields, e.g. the
    spec and version a reward server serves), so that the run's config.yaml says what scored it and a resume
    checks it is the same; `reward` is `build_reward(spec)`."""
    from t2i_gcpo.rewards.combine import WeightedSum, _inner

    if not spec or spec.split(":", 1)[0] == PYTHON_OBJECT:
        return spec
    parts = [r for r, _ in reward.parts] if isinstance(reward, WeightedSum) else [_inner(reward)]
    pieces = _pieces(spec)
    if len(parts) != len(pieces):
        return spec
    out = []
    for (written, term), part in zip(pieces, parts):
        while _inner(part) is not None and not hasattr(part, "recorded"):
            part = _inner(part)
        fields = part.recorded() if hasattr(part, "recorded") else {}
        if fields and form_of(term) is not None:
            term = _with_fields(read_term(term), fields)
        out.append(f"{written}*{term}" if written is not None else term)
    return "+".join(out)


def _with_fields(term: Term, fields: dict[str, str]) -> str:
    """`term`'s text with the options `fields` set (replacing those of the same names)."""
    name, _, rest = term.text.partition(":")
    kept = [
        f for f in _fields(term.form, rest) if not (_OPTION.match(f) and _OPTION.match(f).group(1) in fields)
    ]
    kept += [f"{key}={_quote(value)}" for key, value in fields.items()]
    return f"{name}:{term.form.join(kept) if term.form.join else ','.join(kept)}"


def _quote(field: str) -> str:
    if any(c in field for c in ",+'\"") or field != field.strip():
        return f'"{field}"' if '"' not in field else f"'{field}'"
    return field


def canonical_reward(spec: str | None) -> str | None:
    """`spec` as a run records it: a user file (``file.py:function``) and every weights path of a
    registered form by its absolute path, so that a resume from another directory reads the same files;
    the rest as written (weights too: 0.70 stays 0.70)."""
    if not spec or spec.split(":", 1)[0] == PYTHON_OBJECT:
        return spec
    out = []
    for written, term in _pieces(spec):
        if is_user_function(term):
            term = canonical_spec(unquote(term))
        elif form_of(term) is not None and ":" in term:
            term = _canonical_term(form_of(term), unquote(term))
        out.append(f"{written}*{term}" if written is not None else term)
    return "+".join(out)


def _canonical_term(form: RewardForm, term: str) -> str:
    name, _, rest = term.partition(":")
    fields = _fields(form, rest)
    index = 0
    for i, field in enumerate(fields):
        if field[0] not in _QUOTES and (_OPTION.match(field) or field in form.flags):
            continue
        if index < len(form.args) and form.args[index].info.kind in ("dir", "file", "local", "path"):
            p = Path(unquote(field)).expanduser()
            if p.exists():
                fields[i] = _quote(str(p.resolve()))
        index += 1
    return f"{name}:{form.join(fields) if form.join else ','.join(fields)}"


__all__ = [
    "Arg",
    "Option",
    "RewardForm",
    "REWARDS",
    "register_reward",
    "unregister_reward",
    "forms",
    "forms_text",
    "build_reward",
    "check_reward_spec",
    "canonical_reward",
    "user_code_specs",
    "terms",
    "read_term",
    "record_reward",
    "check_device",
    "spec_context",
    "spec_outputs",
    "PLACEMENT",
]
