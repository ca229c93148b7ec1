"""GenEval prompt text ↔ metadata (docs/evaluation/geneval.md schema), for ShapeWorld shapes or
the 80 COCO classes.

GenEval's six templates parse exactly as worded in its evaluation_metadata.jsonl; compositional prompts
("a photo of two red circles left of a square") parse into the same schema, scored by the same rules,
and are tagged by what they test (`EXTENDED_TAGS`). Grammar and rules:
docs/worlds/shapeworld.md#prompt-grammar.
"""

from __future__ import annotations

import re
from functools import lru_cache

from t2i_gcpo.errors import UserError, shorten
from t2i_gcpo.scoring.geneval_classes import geneval_classes  # noqa: F401  (old path, kept for callers)
from t2i_gcpo.worlds.shapeworld.constants import COLORS, NUMBER_WORDS, RELATIONS, SHAPES, TAGS

# Tags of prompts beyond GenEval's six templates (module docstring), and every tag metadata may carry.
EXTENDED_TAGS: list[str] = [
    "multi_object",
    "multi_color",
    "multi_count",
    "multi_position",
    "color_count",
    "color_position",
    "count_position",
    "color_count_position",
]
ALL_TAGS: list[str] = [*TAGS, *EXTENDED_TAGS]

SHAPEWORLD_MAX_OBJECTS = 6  # objects a ShapeWorld scene holds (render.sample_scene)


def longest_prompt_words(n_classes: int = len(SHAPES)) -> int:
    """Words (a comma counts as one, as the prompt tokenizer splits it) of the longest prompt the
    grammar accepts with `n_classes` classes, each named once: "a photo of" then every class as
    "a red circle" (3 words), the classes joined by ", and " (2 words), or the last by a relation of
    2 words ("left of"): 3 + 3n + 2(n − 1) — 26 for ShapeWorld's 5 shapes."""
    return 3 + 3 * n_classes + 2 * (n_classes - 1)


GRAMMAR = (
    '"a photo of <object> [(,|and) <object>]… [left of|right of|above|below <object>]" '
    "where <object> = (a|an|two|three|four) [colour] class"
)

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


def _object_phrase(clause: dict) -> str:
    """The phrase of one include clause: "a red circle", "two red circles"."""
    colour = f"{clause['color']} " if clause.get("color") else ""
    count = clause["count"]
    if count == 1:
        return _a(colour + clause["class"])
    return f"{NUMBER_WORDS[count]} {colour}{geneval_plural(clause['class'])}"


def _join(phrases: list[str]) -> str:
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]


def _extended_prompt(metadata: dict) -> str:
    """The grammar's text for metadata of an extended tag (module docstring)."""
    inc = metadata["include"]
    subjects = [c for c in inc if "position" in c]
    if not subjects:
        return f"a photo of {_join([_object_phrase(c) for c in inc])}"
    relations = {(c["position"][0], c["position"][1]) for c in subjects}
    if len(relations) != 1 or next(iter(relations))[1] != 0 or len(subjects) != len(inc) - 1:
        raise KeyError("position: every object but include[0] must stand in one relation to include[0]")
    rel = next(iter(relations))[0]
    return f"a photo of {_join([_object_phrase(c) for c in subjects])} {rel} {_object_phrase(inc[0])}"


def metadata_to_prompt(metadata: dict) -> str:
    """The GenEval template text for metadata (the inverse of `parse_prompt`); the grammar's text
    (module docstring) for the extended tags."""
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
        if tag in EXTENDED_TAGS:
            return _extended_prompt(metadata)
    except (KeyError, IndexError, TypeError) as e:
        raise UserError(
            f"metadata {shorten(str(metadata), 160)} does not fit the {tag} template ({e})"
        ) from None
    raise UserError(f"unknown GenEval tag {tag!r}: expected one of {', '.join(ALL_TAGS)}")


def _alt(words) -> str:
    """A regex alternation, longest first so "hot dog" wins over a hypothetical "hot"."""
    return "|".join(re.escape(w) for w in sorted(set(words), key=len, reverse=True))


def _plurals(classes: tuple[str, ...]) -> list[str]:
    return [geneval_plural(c) for c in classes] + [english_plural(c) for c in classes]


@lru_cache(maxsize=8)
def _patterns(classes: tuple[str, ...]) -> list[tuple[str, re.Pattern]]:
    """Compiled full-match regexes of the six templates for a class vocabulary."""
    obj, col, rel = _alt(classes), _alt(COLORS), _alt(RELATIONS)
    plurals = _alt(_plurals(classes))
    num = _alt(NUMBER_WORDS.values())
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


@lru_cache(maxsize=8)
def _grammar(classes: tuple[str, ...]) -> tuple[re.Pattern, re.Pattern, re.Pattern]:
    """(object phrase, separator, relation) regexes of the extended grammar, on lower-cased text."""
    rel = _alt(RELATIONS)
    nouns = _alt([c.lower() for c in classes] + [p.lower() for p in _plurals(classes)])
    det = _alt(["a", "an", *NUMBER_WORDS.values()])
    obj = re.compile(
        rf"(?P<det>{det}) (?:(?P<col>{_alt(COLORS)}) )?(?P<noun>{nouns})(?=$|, | and | (?:{rel}) )"
    )
    return obj, re.compile(r", and |, | and "), re.compile(rf" (?P<rel>{rel}) ")


def _singular(plural: str, classes: tuple[str, ...]) -> str:
    for c in classes:
        if plural in (geneval_plural(c).lower(), english_plural(c).lower()):
            return c
    raise AssertionError(plural)  # unreachable: the regex only matches known plurals


def _canon(word: str, vocab: tuple[str, ...]) -> str:
    """The vocabulary spelling of a case-insensitively matched word."""
    return next((v for v in vocab if v.lower() == word), word)


def _structural_tag(include: list[dict], relation: str | None) -> str:
    """The tag of parsed metadata: a template's tag when it has that template's shape, else the
    extended tag naming what it tests (module docstring)."""
    n = len(include)
    coloured = ["color" in c for c in include]
    counted = any(c["count"] > 1 for c in include)
    if relation is None and not counted:
        if n == 1:
            return "colors" if coloured[0] else "single_object"
        if n == 2 and not any(coloured):
            return "two_object"
        if n == 2 and all(coloured):
            return "color_attr"
    if relation is None and n == 1 and counted and not coloured[0]:
        return "counting"
    if relation is not None and n == 2 and not any(coloured) and not counted:
        return "position"
    features = [f for f, on in (("color", any(coloured)), ("count", counted), ("position", relation)) if on]
    return "_".join(features) if len(features) > 1 else "multi_" + (features[0] if features else "object")


class _NoParse(Exception):
    """The text is outside the grammar; the message (if any) says why more precisely."""


def _parse_extended(norm: str, vocab: tuple[str, ...], max_objects: int | None) -> tuple[str, list, list]:
    """(tag, include, exclude) of lower-cased, space-normalised text in the extended grammar."""
    obj_re, sep_re, rel_re = _grammar(vocab)
    head = "a photo of "
    if not norm.startswith(head):
        raise _NoParse()
    singular = {c.lower() for c in vocab}
    plural = {p.lower() for p in _plurals(vocab)}
    numbers = {w: k for k, w in NUMBER_WORDS.items()}
    pos, phrases, relation, target = len(head), [], None, None
    while True:
        m = obj_re.match(norm, pos)
        if m is None:
            raise _NoParse()
        det, noun = m["det"], m["noun"]
        if det in ("a", "an"):
            if noun not in singular:
                raise _NoParse(f"'{m[0]}' needs a singular class name after '{det}'")
            clause = {"class": _canon(noun, vocab), "count": 1}
        else:
            if noun not in plural:
                raise _NoParse(f"'{m[0]}' needs a plural after '{det}' (e.g. '{geneval_plural(noun)}')")
            clause = {"class": _singular(noun, vocab), "count": numbers[det]}
        if m["col"]:
            clause["color"] = m["col"]
        pos = m.end()
        if relation is not None:  # this was the relation's target: it must end the prompt
            if pos != len(norm):
                raise _NoParse("a relation takes one object after it, at the end of the prompt")
            target = clause
            break
        phrases.append(clause)
        if pos == len(norm):
            break
        if (s := sep_re.match(norm, pos)) is not None:
            pos = s.end()
        elif (r := rel_re.match(norm, pos)) is not None:
            relation, pos = r["rel"], r.end()
        else:
            raise _NoParse()
    if target is not None:
        include = [target] + [{**c, "position": [relation, 0]} for c in phrases]
    else:
        include = phrases
    names = [c["class"] for c in include]
    dup = next((c for c in names if names.count(c) > 1), None)
    if dup is not None:
        raise _NoParse(
            f"{dup!r} is named twice; GenEval's rules count objects per class, so name each class once"
        )
    total = sum(c["count"] for c in include)
    if max_objects is not None and total > max_objects:
        raise _NoParse(f"it asks for {total} objects; a ShapeWorld scene holds at most {max_objects}")
    exclude = [{"class": c["class"], "count": c["count"] + 1} for c in include if c["count"] > 1]
    return _structural_tag(include, relation), include, exclude


def _grammar_error(prompt: str, vocab: tuple[str, ...], why: str | None = None) -> UserError:
    if why:
        return UserError(f"cannot parse prompt {shorten(prompt)!r}: {why}")
    hint = ", ".join(vocab) if len(vocab) <= 12 else f"{len(vocab)} classes such as {', '.join(vocab[:3])}"
    return UserError(
        f"cannot parse prompt {shorten(prompt)!r}: expected {GRAMMAR}; classes: {hint}; "
        f"colours: {', '.join(COLORS)}"
    )


def parse_prompt(text: str, classes: list[str] | None = None) -> dict:
    """GenEval metadata from prompt text alone.

    `classes` defaults to ShapeWorld's SHAPES (and then at most 6 objects in all); pass
    `geneval_classes()` (t2i_gcpo.scoring) for GenEval's COCO names.
    Text matching one of GenEval's six templates is parsed by the template; other text by the
    grammar of the module docstring, tagged as described there.
    Matching ignores case and surrounding whitespace; the returned "prompt" is the stripped text.
    Raises UserError (one line, the prompt cut to 80 characters) when the text fits neither.
    """
    if not isinstance(text, str):
        raise UserError(f"cannot parse prompt {shorten(repr(text))}: expected a string")
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
    max_objects = SHAPEWORLD_MAX_OBJECTS if classes is None else None
    try:
        tag, include, exclude = _parse_extended(re.sub(r"\s*,\s*", ", ", norm), vocab, max_objects)
    except _NoParse as e:
        raise _grammar_error(prompt, vocab, str(e) or None) from None
    meta: dict = {"tag": tag, "include": include}
    if exclude:
        meta["exclude"] = exclude
    meta["prompt"] = prompt
    return meta


def _content(metadata: dict) -> tuple[list, list]:
    """What metadata asks for, independent of clause order: sorted (class, count, colour) objects
    and (class, relation, target class) relations."""
    inc = metadata.get("include", [])
    objects = sorted((c["class"], int(c.get("count", 1)), c.get("color") or "") for c in inc)
    relations = sorted(
        (c["class"], c["position"][0], inc[c["position"][1]]["class"]) for c in inc if "position" in c
    )
    return objects, relations


def describe(metadata: dict) -> str:
    """A short text of what metadata asks for: "1 red circle, 2 square; circle left of square"."""
    objects, relations = _content(metadata)
    text = ", ".join(f"{n} {col + ' ' if col else ''}{cls}" for cls, n, col in objects)
    if relations:
        text += "; " + ", ".join(f"{a} {rel} {b}" for a, rel, b in relations)
    return text


def metadata_conflict(metadata: dict, classes: list[str] | None = None) -> str | None:
    """Why `metadata["prompt"]` contradicts the metadata's include clauses, or None.

    The prompt is parsed (`classes` as in `parse_prompt`) and the objects (class, count, colour)
    and relations it asks for are compared with the metadata's, in any clause order. Tags and
    excludes are not compared, and a prompt that does not parse contradicts nothing: the metadata
    is the ground truth (real GenEval metadata is authoritative; prompts may be free text).
    Call on validated metadata.
    """
    try:
        parsed = parse_prompt(metadata["prompt"], classes)
    except UserError:
        return None
    if _content(parsed) == _content(metadata):
        return None
    return (
        f"prompt {shorten(metadata['prompt'].strip())!r} asks for {describe(parsed)}, "
        f"but its metadata asks for {shorten(describe(metadata), 160)}"
    )


def validate_metadata(
    metadata: object, classes: list[str] | None = None, max_objects: int | None = None
) -> dict:
    """Check one GenEval metadata record (docs/evaluation/geneval.md schema); return it or raise
    UserError (one line).

    `classes=None` accepts any class name (GenEval's COCO names, ShapeWorld shapes, others). The tag
    is one of GenEval's six or of `EXTENDED_TAGS`. A record no image can satisfy is refused too: a
    class required at least n times and excluded from n on (exclude count ≤ include count), or, with
    `max_objects` (a ShapeWorld scene's 6), more objects required in all than a scene holds.
    """

    def fail(why: str):
        raise UserError(f"invalid GenEval metadata ({why}): {shorten(str(metadata), 160)}")

    if not isinstance(metadata, dict):
        fail("expected a JSON object")
    if metadata.get("tag") not in ALL_TAGS:
        fail(f"'tag' must be one of {', '.join(ALL_TAGS)}")
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
    for j, ex in enumerate(metadata.get("exclude", [])):  # "fewer than count" of a class (in a colour)
        for i, c in enumerate(include):
            same = c["class"] == ex["class"] and ex.get("color") in (None, c.get("color"))
            if same and c["count"] >= ex["count"]:
                fail(
                    f"impossible: include[{i}] requires {c['count']} {c['class']} and exclude[{j}] allows "
                    f"fewer than {ex['count']}"
                )
    total = sum(c["count"] for c in include)
    if max_objects is not None and total > max_objects:
        fail(f"impossible: it requires {total} objects; a scene holds at most {max_objects}")
    return metadata
