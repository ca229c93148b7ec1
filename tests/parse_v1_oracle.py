"""Frozen oracle: `parse_prompt` exactly as it was before the compositional grammar (commit aba2342),
for tests/worlds/shapeworld/test_shapeworld_parse_compat.py. Do not edit: it is the reference the new parser
must reproduce on every prompt the old one accepted.
"""

from __future__ import annotations

import re
from functools import lru_cache

from t2i_gcpo.errors import UserError
from t2i_gcpo.worlds.shapeworld.constants import COLORS, NUMBER_WORDS, RELATIONS, SHAPES

_IRREGULAR = {
    "person": "people",
    "sheep": "sheep",
    "mouse": "mice",
    "knife": "knives",
    "skis": "skis",
    "scissors": "scissors",
}


def geneval_plural(name: str) -> str:
    """The plural GenEval's prompts use: "es" after a final "s", else "s" (no other irregulars)."""
    return name + "es" if name.endswith("s") else name + "s"


def english_plural(name: str) -> str:
    """A proper English plural of the last word (accepted when parsing, never generated)."""
    head, _, last = name.rpartition(" ")
    if last in _IRREGULAR:
        word = _IRREGULAR[last]
    elif re.search(r"(s|x|z|ch|sh)$", last):
        word = last + "es"
    elif re.search(r"[^aeiou]y$", last):
        word = last[:-1] + "ies"
    elif last.endswith("fe"):
        word = last[:-2] + "ves"
    else:
        word = last + "s"
    return f"{head} {word}" if head else word


@lru_cache(maxsize=8)
def _patterns(classes: tuple[str, ...]) -> list[tuple[str, re.Pattern]]:
    """Compiled full-match regexes of the six templates for a class vocabulary."""

    def alt(words) -> str:  # longest first so "hot dog" wins over a hypothetical "hot"
        return "|".join(re.escape(w) for w in sorted(set(words), key=len, reverse=True))

    obj, col, rel = alt(classes), alt(COLORS), alt(RELATIONS)
    plurals = alt([geneval_plural(c) for c in classes] + [english_plural(c) for c in classes])
    num = alt(NUMBER_WORDS.values())
    a = r"an?"
    templates = [
        ("single_object", rf"a photo of {a} (?P<o1>{obj})"),
        ("two_object", rf"a photo of {a} (?P<o1>{obj}) and {a} (?P<o2>{obj})"),
        ("counting", rf"a photo of (?P<n>{num}) (?P<pl>{plurals})"),
        ("colors", rf"a photo of {a} (?P<c1>{col}) (?P<o1>{obj})"),
        ("position", rf"a photo of {a} (?P<o2>{obj}) (?P<rel>{rel}) {a} (?P<o1>{obj})"),
        ("color_attr", rf"a photo of {a} (?P<c1>{col}) (?P<o1>{obj}) and {a} (?P<c2>{col}) (?P<o2>{obj})"),
    ]
    return [(tag, re.compile(p, re.IGNORECASE)) for tag, p in templates]


def _singular(plural: str, classes: tuple[str, ...]) -> str:
    for c in classes:
        if plural in (geneval_plural(c).lower(), english_plural(c).lower()):
            return c
    raise AssertionError(plural)  # unreachable: the regex only matches known plurals


def _canon(word: str, vocab: tuple[str, ...]) -> str:
    """The vocabulary spelling of a case-insensitively matched word."""
    return next((v for v in vocab if v.lower() == word), word)


def parse_prompt(text: str, classes: list[str] | None = None) -> dict:
    """GenEval metadata from prompt text alone.

    `classes` defaults to ShapeWorld's SHAPES; pass `geneval_classes()` (t2i_gcpo.scoring) for
    GenEval's COCO names.
    Matching ignores case and surrounding whitespace; the returned "prompt" is the stripped text.
    Raises UserError when the text fits none of the six templates.
    """
    if not isinstance(text, str):
        raise UserError(f"cannot parse prompt {text!r}: expected a string")
    vocab = tuple(SHAPES if classes is None else classes)
    prompt = text.strip()
    norm = re.sub(r"\s+", " ", prompt).lower()
    for tag, pattern in _patterns(vocab):
        m = pattern.fullmatch(norm)
        if m is None:
            continue
        g = {k: (_canon(v, vocab) if k.startswith("o") else v) for k, v in m.groupdict().items()}
        if tag == "single_object":
            include = [{"class": g["o1"], "count": 1}]
        elif tag == "two_object":
            include = [{"class": g["o1"], "count": 1}, {"class": g["o2"], "count": 1}]
        elif tag == "counting":
            count = {w: k for k, w in NUMBER_WORDS.items()}[g["n"]]
            cls = _singular(g["pl"], vocab)
            return {
                "tag": tag,
                "include": [{"class": cls, "count": count}],
                "exclude": [{"class": cls, "count": count + 1}],
                "prompt": prompt,
            }
        elif tag == "colors":
            include = [{"class": g["o1"], "count": 1, "color": g["c1"]}]
        elif tag == "position":
            include = [
                {"class": g["o1"], "count": 1},
                {"class": g["o2"], "count": 1, "position": [g["rel"], 0]},
            ]
        else:  # color_attr
            include = [
                {"class": g["o1"], "count": 1, "color": g["c1"]},
                {"class": g["o2"], "count": 1, "color": g["c2"]},
            ]
        return {"tag": tag, "include": include, "prompt": prompt}
    hint = ", ".join(vocab) if len(vocab) <= 12 else f"{len(vocab)} classes such as {', '.join(vocab[:3])}"
    raise UserError(
        f"cannot parse prompt {prompt!r}: expected one of GenEval's six templates "
        f"(e.g. 'a photo of a red {vocab[0] if vocab else 'object'}') with classes: {hint}"
    )
