"""GenEval prompt text ↔ metadata (SPEC §8 schema), for ShapeWorld shapes or the 80 COCO classes.

GenEval's six templates, exactly as worded in its evaluation_metadata.jsonl:

    single_object  a photo of a {obj}
    two_object     a photo of a {obj1} and a {obj2}
    counting       a photo of {two|three|four} {plural}        (+ exclude {obj, count + 1})
    colors         a photo of a {color} {obj}
    position       a photo of a {obj2} {relation} a {obj1}     (include [obj1, obj2 + position [rel, 0]])
    color_attr     a photo of a {color1} {obj1} and a {color2} {obj2}

"a" becomes "an" before a vowel. GenEval's plural appends "es" to names ending in "s" (bus → buses)
and "s" otherwise (bench → benchs, knife → knifes, sheep → sheeps, person → persons); parsing also
accepts the English plural (benches, knives, sheep, people).
"""

from __future__ import annotations

import re
from functools import lru_cache

from t2i_gcpo.errors import UserError
from t2i_gcpo.scoring.geneval_classes import geneval_classes  # noqa: F401  (old path, kept for callers)
from t2i_gcpo.worlds.shapeworld.constants import COLORS, NUMBER_WORDS, RELATIONS, SHAPES, TAGS

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


def article(word: str) -> str:
    """GenEval's article: "an" before a vowel, "a" otherwise."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def _a(phrase: str) -> str:
    return f"{article(phrase)} {phrase}"


def metadata_to_prompt(metadata: dict) -> str:
    """The GenEval template text for metadata (the inverse of `parse_prompt`)."""
    tag, inc = metadata.get("tag"), metadata.get("include", [])
    try:
        if tag == "single_object":
            return f"a photo of {_a(inc[0]['class'])}"
        if tag == "two_object":
            return f"a photo of {_a(inc[0]['class'])} and {_a(inc[1]['class'])}"
        if tag == "counting":
            return f"a photo of {NUMBER_WORDS[inc[0]['count']]} {geneval_plural(inc[0]['class'])}"
        if tag == "colors":
            return f"a photo of {_a(inc[0]['color'] + ' ' + inc[0]['class'])}"
        if tag == "position":
            rel = inc[1]["position"][0]
            return f"a photo of {_a(inc[1]['class'])} {rel} {_a(inc[0]['class'])}"
        if tag == "color_attr":
            first, second = (_a(f"{c['color']} {c['class']}") for c in inc[:2])
            return f"a photo of {first} and {second}"
    except (KeyError, IndexError, TypeError) as e:
        raise UserError(f"metadata {metadata!r} does not fit GenEval's {tag} template ({e})") from None
    raise UserError(f"unknown GenEval tag {tag!r}: expected one of {', '.join(TAGS)}")


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


def validate_metadata(metadata: object, classes: list[str] | None = None) -> dict:
    """Check one GenEval metadata record (SPEC §8 schema); return it or raise UserError (one line).

    `classes=None` accepts any class name (GenEval's COCO names, ShapeWorld shapes, others).
    """

    def fail(why: str):
        raise UserError(f"invalid GenEval metadata ({why}): {str(metadata)[:200]}")

    if not isinstance(metadata, dict):
        fail("expected a JSON object")
    if metadata.get("tag") not in TAGS:
        fail(f"'tag' must be one of {', '.join(TAGS)}")
    if not isinstance(metadata.get("prompt"), str) or not metadata["prompt"].strip():
        fail("'prompt' must be a non-empty string")
    include = metadata.get("include")
    if not isinstance(include, list) or not include:
        fail("'include' must be a non-empty list")
    for key in ("include", "exclude"):
        clauses = metadata.get(key, [])
        if not isinstance(clauses, list):
            fail(f"'{key}' must be a list")
        for i, c in enumerate(clauses):
            if not isinstance(c, dict) or not isinstance(c.get("class"), str):
                fail(f"{key}[{i}] needs a 'class' string")
            if classes is not None and c["class"] not in classes:
                fail(f"unknown class {c['class']!r}")
            count = c.get("count")
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                fail(f"{key}[{i}] needs an integer 'count' ≥ 1")
            if "color" in c and c["color"] not in COLORS:
                fail(f"{key}[{i}] colour {c['color']!r} is not one of {', '.join(COLORS)}")
            if "position" in c:
                pos = c["position"]
                ok = (
                    isinstance(pos, list)
                    and len(pos) == 2
                    and pos[0] in RELATIONS
                    and isinstance(pos[1], int)
                    and 0 <= pos[1] < len(include)
                    and pos[1] != i
                )
                if key != "include" or not ok:
                    fail(f"{key}[{i}] 'position' must be [relation, index of another include]")
    return metadata
