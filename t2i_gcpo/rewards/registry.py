"""Resolve a ``--reward`` string to a reward object.

Forms:
- ``shapeworld[:flow_grpo]``                  the embedded world's detector-based GenEval reward
- ``clip:CKPT_PATH[:MODEL_NAME]``             CLIPScore, open_clip weights from a local file or
                                              local-dir folder (MODEL_NAME default ViT-L-14)
- ``geneval:DETECTOR_DIR,CLIP_CKPT[,MODEL][,flow_grpo]``
                                              GenEval partial-credit reward: Mask2Former + CLIP colours
- ``arithmetic[:format=W][,overlong=L_MAX/L_CACHE]``
                                              the arithmetic world's answer correctness (1/0), plus
                                              W × format reward, plus DAPO's overlong penalty
- ``module:function`` / ``file.py:function``  a user function f(images, prompts, metadata) — user
                                              code, imported and run (on ``--resume`` only when named again or trusted)
- ``0.7*clip:CKPT+0.3*shapeworld``            a weighted sum of any of the above

The GenEval-style rewards score partial credit by docs/evaluation/geneval.md#geneval-as-a-reward, kept in [0, 1], by default; the
``flow_grpo`` option scores it exactly as flow_grpo's code does (an over-count goes negative, a failed
position scores 0 then 1: `t2i_gcpo.scoring.geneval_rules.reward_detections`). ``shapeworld:flow_grpo``
takes it after a colon, ``geneval:…,flow_grpo`` as the last comma field.

Every reward returned is wrapped so that an exception or a NaN score raises `RewardError` naming it.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

from t2i_gcpo.errors import UserError
from t2i_gcpo.rewards.combine import CallableReward, Checked, WeightedSum
from t2i_gcpo.usercode import PYTHON_OBJECT, canonical_spec

FORMS = (
    "'shapeworld[:flow_grpo]', 'clip:CKPT_PATH[:MODEL_NAME]', "
    "'geneval:DETECTOR_DIR,CLIP_CKPT[,MODEL_NAME][,flow_grpo]', "
    "'arithmetic[:format=W][,overlong=L_MAX/L_CACHE]', "
    "'module:function', or a weighted sum such as '0.7*clip:CKPT+0.3*shapeworld'"
)
FLOW_GRPO = "flow_grpo"  # the option that picks flow_grpo's exact partial credit
DEFAULT_CLIP_MODEL = "ViT-L-14"
_WEIGHTED = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*\*\s*(.+?)\s*$")


def _accepted(fn: Any, ctx: dict) -> dict:
    """The entries of `ctx` that callable `fn` takes as keyword arguments."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(ctx)
    return {k: v for k, v in ctx.items() if k in params}


def _split_clip(rest: str) -> tuple[str, str]:
    """'CKPT[:MODEL]' → (ckpt, model); a path that exists as written wins over a ':' split."""
    if Path(rest).expanduser().exists() or ":" not in rest:
        return rest, DEFAULT_CLIP_MODEL
    ckpt, model = rest.rsplit(":", 1)
    return ckpt, model or DEFAULT_CLIP_MODEL


# what each built-in form scores; `build_reward(…, output=policy.output)` refuses a mismatch up front
SCORES = {"shapeworld": "image", "clip": "image", "geneval": "image", "arithmetic": "text"}
PLURAL = {"image": "images", "text": "text"}


def _build_one(spec: str, ctx: dict) -> Any:
    spec = spec.strip()
    form, output = spec.split(":")[0], ctx.get("output")
    if output is not None and SCORES.get(form, output) != output:
        fits = " or ".join(f"'{f}'" for f, o in SCORES.items() if o == output)
        raise UserError(
            f"reward '{spec}' scores {PLURAL[SCORES[form]]}, but the model writes {PLURAL[output]}: use {fits} "
            "(or a module:function of your own)"
        )
    ctx = {k: v for k, v in ctx.items() if k != "output"}
    if spec == "shapeworld" or spec.startswith("shapeworld:"):
        from t2i_gcpo.rewards.shapeworld import ShapeWorldReward

        option = spec[len("shapeworld:") :].strip() if ":" in spec else ""
        if option not in ("", FLOW_GRPO):
            raise UserError(
                f"reward '{spec}': write shapeworld or shapeworld:{FLOW_GRPO} "
                "(a user module named shapeworld: give its file, ./shapeworld.py:function)"
            )
        kwargs = {k: v for k, v in _accepted(ShapeWorldReward, ctx).items() if k != "variant"}
        return ShapeWorldReward(variant=option or "spec", **kwargs)
    if spec.startswith("clip:"):
        from t2i_gcpo.rewards.clip_score import ClipScoreReward

        ckpt, model = _split_clip(spec[len("clip:") :])
        if not ckpt:
            raise UserError(f"reward '{spec}': write clip:CKPT_PATH[:MODEL_NAME]")
        return ClipScoreReward(ckpt, model, **_accepted(ClipScoreReward, ctx))
    if spec.startswith("geneval:"):
        from t2i_gcpo.rewards.geneval_reward import GenEvalReward

        fields = [f.strip() for f in spec[len("geneval:") :].split(",")]
        variant = "spec"
        if fields[-1] == FLOW_GRPO:
            variant, fields = FLOW_GRPO, fields[:-1]
        if len(fields) not in (2, 3) or not all(fields):
            raise UserError(
                f"reward '{spec}': write geneval:DETECTOR_DIR,CLIP_CKPT[,MODEL_NAME][,{FLOW_GRPO}]"
            )
        model = fields[2] if len(fields) == 3 else DEFAULT_CLIP_MODEL
        kwargs = {k: v for k, v in _accepted(GenEvalReward.from_paths, ctx).items() if k != "variant"}
        return GenEvalReward.from_paths(fields[0], fields[1], model, variant=variant, **kwargs)
    if spec == "arithmetic" or spec.startswith("arithmetic:"):
        from t2i_gcpo.rewards.arithmetic import ArithmeticReward

        return ArithmeticReward.from_spec(spec[len("arithmetic:") :] if ":" in spec else "", **ctx)
    if ":" in spec and not spec.startswith(":"):
        return CallableReward(spec)
    raise UserError(f"unknown reward '{spec}': use {FORMS}")


def _terms(spec: str) -> list[tuple[str, str]]:
    """(weight as written, e.g. '0.7' or '' for none; the term) of each term of a reward spec."""
    if "+" not in spec and not _WEIGHTED.match(spec):
        return [("", spec)]
    terms = []
    for term in spec.split("+"):
        m = _WEIGHTED.match(term)
        terms.append((m.group(1), m.group(2)) if m else ("", term))
    return terms


def _is_user_function(term: str) -> bool:
    """Whether a reward term names a user function (``module:function`` / ``file.py:function``)."""
    term = term.strip()
    builtin = term in SCORES or term.split(":")[0] in SCORES
    return not builtin and ":" in term and not term.startswith(":")


def user_code_specs(spec: str | None) -> list[str]:
    """The user functions (``module:function`` / ``file.py:function``) a reward spec calls."""
    if not spec or spec.split(":", 1)[0] == PYTHON_OBJECT:
        return []
    return [term.strip() for _, term in _terms(spec) if _is_user_function(term)]


def canonical_reward(spec: str | None) -> str | None:
    """`spec` as a run records it: a user file (``file.py:function``) and a CLIP or detector checkpoint
    by its absolute path, so that a resume from another directory reads the same files; the rest as
    written (what a string names is otherwise unchanged)."""
    if not spec or spec.split(":", 1)[0] == PYTHON_OBJECT:
        return spec

    def absolute(path: str) -> str:
        p = Path(path).expanduser()
        return str(p.resolve()) if p.exists() else path

    out = []
    for weight, term in _terms(spec):
        term = term.strip()
        if term.startswith("clip:"):
            ckpt, model = _split_clip(term[len("clip:") :])
            explicit = term != f"clip:{ckpt}"
            term = f"clip:{absolute(ckpt)}" + (f":{model}" if explicit else "")
        elif term.startswith("geneval:"):
            fields = [f.strip() for f in term[len("geneval:") :].split(",")]
            term = "geneval:" + ",".join([absolute(f) for f in fields[:2]] + fields[2:])
        elif _is_user_function(term):
            term = canonical_spec(term)
        out.append(f"{weight}*{term}" if weight else term)
    return "+".join(out)


def build_reward(spec: str, **ctx: Any) -> Any:
    """The reward named by `spec` (forms in the module docstring), checked for errors and NaN.

    `ctx` holds optional constructor arguments (e.g. ``device``); each reward takes the ones it
    accepts. ``output`` ("image" or "text", the policy's) refuses a built-in reward of the other kind.
    """
    if not spec or not spec.strip():
        raise UserError(f"empty reward: use {FORMS}")
    terms = _terms(spec)
    if len(terms) == 1 and not terms[0][0]:
        return Checked(_build_one(spec, ctx))
    parts = []
    for weight, sub in terms:
        if not sub.strip():
            raise UserError(f"empty term in reward sum '{spec}'")
        parts.append((_build_one(sub, ctx), float(weight) if weight else 1.0))
    return WeightedSum(parts)
