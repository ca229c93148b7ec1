"""ShapeWorld prompt sets in GenEval's schema (docs/worlds/shapeworld.md, docs/evaluation/geneval.md), and
prompt-file reading/writing.

With 5 shapes and 10 colours the unique prompts per tag are few for some tags (single_object 5,
counting 15, two_object 20, colors 50, position 80, color_attr 2 000), so:
- the held-out test set takes an equal share per tag but at most 40 % (and at least 1) of a tag's
  unique prompts — 76 unique prompts by default (2 / 8 / 6 / 20 / 20 / 20 by tag);
- the train set is the rest, drawn tag-balanced: `n_train` rows, an equal number per tag, each tag
  cycling through its remaining prompts (small tags repeat). Train and test share no prompt text.

Compositional prompts (the grammar of parse.py, `EXTENDED_TAGS`) are drawn at random
(`random_compositional`): every drawn prompt parses to the tag asked for and ShapeWorld can draw it.
The held-out compositional set (`compositional_test`) takes `per_tag` unique prompts per extended tag;
pretraining drops every draw that asks for the same content (`content_key`).

Regenerate the shipped files with `python -m t2i_gcpo.worlds.shapeworld` (into t2i_gcpo/prompts/).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np

from t2i_gcpo.errors import UserError
from t2i_gcpo.outdir import parse_json, read_lines
from t2i_gcpo.worlds.shapeworld.constants import COLORS, NUMBER_WORDS, RELATIONS, SHAPES, TAGS
from t2i_gcpo.worlds.shapeworld.parse import (
    ALL_TAGS,
    EXTENDED_TAGS,
    SHAPEWORLD_MAX_OBJECTS,
    article,
    describe,
    geneval_plural,
    metadata_conflict,
    metadata_to_prompt,
    parse_prompt,
    validate_metadata,
)

TEST_MAX_FRACTION = 0.4  # at most this share of a tag's unique prompts is held out


def _record(tag: str, include: list[dict], exclude: list[dict] | None = None) -> dict:
    """A metadata dict with GenEval's key order (tag, include, exclude?, prompt)."""
    meta: dict = {"tag": tag, "include": include}
    if exclude is not None:
        meta["exclude"] = exclude
    meta["prompt"] = metadata_to_prompt(meta)
    return meta


def all_metadata(tag: str, classes: list[str] | None = None) -> list[dict]:
    """Every distinct GenEval prompt of `tag` over `classes` (default SHAPES), in a fixed order.

    Like GenEval: the two objects of two_object / position / color_attr differ, and so do the two
    colours of color_attr.
    """
    cls = list(SHAPES if classes is None else classes)
    pairs = list(itertools.permutations(cls, 2))
    if tag == "single_object":
        return [_record(tag, [{"class": c, "count": 1}]) for c in cls]
    if tag == "two_object":
        return [_record(tag, [{"class": a, "count": 1}, {"class": b, "count": 1}]) for a, b in pairs]
    if tag == "counting":
        return [
            _record(tag, [{"class": c, "count": n}], [{"class": c, "count": n + 1}])
            for c in cls
            for n in NUMBER_WORDS
        ]
    if tag == "colors":
        return [_record(tag, [{"class": c, "count": 1, "color": k}]) for c in cls for k in COLORS]
    if tag == "position":
        return [
            _record(tag, [{"class": target, "count": 1}, {"class": obj, "count": 1, "position": [rel, 0]}])
            for target, obj in pairs
            for rel in RELATIONS
        ]
    if tag == "color_attr":
        return [
            _record(tag, [{"class": a, "count": 1, "color": ka}, {"class": b, "count": 1, "color": kb}])
            for a, b in pairs
            for ka, kb in itertools.permutations(COLORS, 2)
        ]
    raise UserError(f"unknown GenEval tag {tag!r}: expected one of {', '.join(TAGS)}")


def _check_tags(tags: list[str] | None) -> list[str]:
    tags = list(TAGS if tags is None else tags)
    bad = [t for t in tags if t not in ALL_TAGS]
    if bad or not tags:
        raise UserError(f"unknown GenEval tag(s) {bad}: expected some of {', '.join(ALL_TAGS)}")
    return tags


# The features each extended tag asks for (parse._structural_tag names a tag by them).
_FEATURES = {tag: set(tag.split("_")) - {"multi", "object"} for tag in EXTENDED_TAGS}
_SEPARATORS = (", ", " and ", ", and ")  # every separator the grammar accepts between objects
# With a relation, `render.sample_scene` places 3 objects in 10 of 10 tries, 4 in 9–10 of 10, 5 or 6 in at
# most 5 of 10 and some (two targets right of four subjects) never: the 8×8 canvas has too few cells on
# one side of a target, so relation prompts are drawn with at most 4 objects in all.
RELATION_MAX_OBJECTS = 4


def _phrase(cls: str, count: int, colour: str | None) -> str:
    words = f"{colour} " if colour else ""
    if count == 1:
        return f"{article(words + cls)} {words}{cls}"
    return f"{NUMBER_WORDS[count]} {words}{geneval_plural(cls)}"


def random_compositional(tag: str, rng: np.random.Generator) -> dict:
    """One random prompt of the compositional grammar with extended tag `tag`, parsed into metadata.

    The tag's features (colour, count, position) are each on for at least one object and off
    otherwise: 1–5 distinct classes, counts 1–4 (2–4 for a counted object, half the objects when
    the tag counts), a colour on half the objects when the tag has colour, any relation, and any of
    the grammar's separators (", ", " and ", ", and "). Draws until the text parses to `tag` with at
    most 6 objects, 4 with a relation (`RELATION_MAX_OBJECTS`)."""
    if tag not in EXTENDED_TAGS:
        raise UserError(f"{tag!r} is not a compositional tag: expected one of {', '.join(EXTENDED_TAGS)}")
    features = _FEATURES[tag]
    while True:
        n = int(rng.integers(1, len(SHAPES) + 1))
        classes = [SHAPES[i] for i in rng.permutation(len(SHAPES))[:n]]
        counted = rng.random(n) < 0.5 if "count" in features else np.zeros(n, bool)
        coloured = rng.random(n) < 0.5 if "color" in features else np.zeros(n, bool)
        counts = [int(rng.integers(2, 5)) if c else 1 for c in counted]
        colours = [COLORS[int(rng.integers(len(COLORS)))] if c else None for c in coloured]
        phrases = [_phrase(c, k, col) for c, k, col in zip(classes, counts, colours)]
        seps = [_SEPARATORS[int(rng.integers(len(_SEPARATORS)))] for _ in range(n)]
        if "position" in features:
            if n < 2:
                continue
            relation = RELATIONS[int(rng.integers(len(RELATIONS)))]
            subjects = phrases[:-1]
            text = "".join(p + s for p, s in zip(subjects, seps))[: -len(seps[len(subjects) - 1])]
            text += f" {relation} {phrases[-1]}"
        else:
            text = "".join(p + s for p, s in zip(phrases, seps))[: -len(seps[n - 1])]
        if sum(counts) > (RELATION_MAX_OBJECTS if "position" in features else SHAPEWORLD_MAX_OBJECTS):
            continue
        meta = parse_prompt(f"a photo of {text}")
        if meta["tag"] == tag:
            return meta


def content_key(meta: dict) -> str:
    """What a prompt asks for, independent of wording (separators) and clause order."""
    return describe(meta)


def compositional_test(per_tag: int = 10, seed: int = 0) -> list[dict]:
    """The held-out compositional prompts: `per_tag` prompts of distinct content per extended tag,
    grouped by tag in `EXTENDED_TAGS` order. Deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    out: list[dict] = []
    for tag in EXTENDED_TAGS:
        seen: set[str] = set()
        while len(seen) < per_tag:
            meta = random_compositional(tag, rng)
            if content_key(meta) not in seen:
                seen.add(content_key(meta))
                out.append(meta)
    return out


def generate_metadata(n: int, seed: int, tags: list[str] | None = None) -> list[dict]:
    """`n` random ShapeWorld prompts (with replacement): a uniform tag from `tags` (default GenEval's
    six; any of `ALL_TAGS`), then a uniform prompt of a template tag or a `random_compositional`
    prompt of an extended one. Deterministic in `seed`."""
    tags = _check_tags(tags)
    rng = np.random.default_rng(seed)
    pools = {t: all_metadata(t) for t in tags if t in TAGS}
    out = []
    for _ in range(n):
        tag = tags[int(rng.integers(len(tags)))]
        if tag in pools:
            pool = pools[tag]
            out.append(json.loads(json.dumps(pool[int(rng.integers(len(pool)))])))  # independent copies
        else:
            out.append(random_compositional(tag, rng))
    return out


def make_splits(n_train: int = 1200, n_test: int = 120, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train, test) metadata lists, deterministic in `seed`, disjoint by prompt text.

    test: unique prompts, `n_test / 6` per tag capped at 40 % of the tag's unique prompts (≥ 1),
    grouped by tag in GenEval's tag order. train: `n_train` rows, tag-balanced, shuffled, each tag
    cycling through its prompts not in test (so small tags repeat).
    """
    if n_train < 0 or n_test < 0:
        raise UserError(f"split sizes must be ≥ 0, got n_train={n_train}, n_test={n_test}")
    rng = np.random.default_rng(seed)
    train: list[dict] = []
    test: list[dict] = []
    for k, tag in enumerate(TAGS):
        pool = all_metadata(tag)
        order = rng.permutation(len(pool))
        quota = n_test // len(TAGS) + (1 if k < n_test % len(TAGS) else 0)
        n_held = min(quota, max(1, int(TEST_MAX_FRACTION * len(pool)))) if quota else 0
        test.extend(pool[i] for i in order[:n_held])
        rest = [pool[i] for i in order[n_held:]]
        n_tag = n_train // len(TAGS) + (1 if k < n_train % len(TAGS) else 0)
        picked: list[dict] = []
        while len(picked) < n_tag:  # cycle through fresh permutations of the remaining prompts
            picked.extend(rest[i] for i in rng.permutation(len(rest))[: n_tag - len(picked)])
        train.extend(json.loads(json.dumps(m)) for m in picked)
    train = [train[i] for i in rng.permutation(len(train))]
    return train, test


def write_prompts(metadata: list[dict], path: str | Path) -> None:
    """Write prompts: `.jsonl` → one GenEval metadata JSON per line; `.txt` → one prompt per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        text = "".join(json.dumps(m) + "\n" for m in metadata)
    elif path.suffix == ".txt":
        text = "".join(m["prompt"] + "\n" for m in metadata)
    else:
        raise UserError(f"prompt file {path} must end in .txt or .jsonl")
    path.write_text(text)


def read_prompt_file(
    path: str | Path, classes: list[str] | None = None, *, strict: bool = True, max_objects: int | None = None
) -> list[dict]:
    """Read a prompt file into GenEval metadata.

    `.txt`: one prompt a line, each parsed with `parse_prompt(line, classes)` (classes default
    SHAPES): GenEval's six templates or the compositional grammar of
    `t2i_gcpo.worlds.shapeworld.parse`; blank lines and lines starting with "#" are skipped. With
    `strict=False` a line that does not parse becomes `{"prompt": line}` (no tag) instead of an error.
    `.jsonl`: one GenEval metadata object a line, validated (any class name unless `classes` is
    given). A row whose prompt parses (with `classes`, default SHAPES) must ask for the same objects
    (class, count, colour) and relations as its include clauses, or it is refused; a row whose
    prompt does not parse is taken as it is — the metadata is the ground truth (GenEval's own rows
    are authoritative, and real prompts may be free text). Tags and excludes are not compared.
    A row no image can satisfy is refused (`validate_metadata`; `max_objects`: the most objects a
    scene holds). A UTF-8 byte-order mark is ignored. Raises UserError (one line, naming file and line) for a
    bad line, and for an empty, missing or unreadable file; prompts are echoed cut to 80 characters.
    """
    path, lines = read_lines(path, "prompt file", {".txt": "prompts", ".jsonl": "GenEval metadata"})
    out: list[dict] = []
    for lineno, line in lines:
        try:
            if path.suffix == ".txt":
                try:
                    out.append(parse_prompt(line, classes))
                except UserError:
                    if strict:
                        raise
                    out.append({"prompt": line.strip()})
            else:
                record = parse_json(line, "")  # malformed or nested too deeply: one line
                record = validate_metadata(record, classes, max_objects)
                conflict = metadata_conflict(record, classes)
                if conflict is not None:
                    raise UserError(f"{conflict}: fix the prompt or the metadata")
                out.append(record)
        except UserError as e:
            raise UserError(f"{path}:{lineno}: {e}") from None
    if not out:
        raise UserError(f"prompt file {path} has no prompts")
    return out


def main(argv: list[str] | None = None) -> None:
    """Write t2i_gcpo/prompts/shapeworld_{train,test,compositional_test}.{txt,jsonl} (the shipped files)."""
    from t2i_gcpo.resources import PROMPTS_DIR

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(PROMPTS_DIR), help="output folder [default: the shipped files]")
    ap.add_argument("--n-train", type=int, default=1200)
    ap.add_argument("--n-test", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    train, test = make_splits(args.n_train, args.n_test, args.seed)
    compositional = compositional_test(seed=args.seed)
    for name, data in (("train", train), ("test", test), ("compositional_test", compositional)):
        for ext in ("txt", "jsonl"):
            write_prompts(data, Path(args.out) / f"shapeworld_{name}.{ext}")
    print(
        f"wrote {len(train)} train, {len(test)} test and {len(compositional)} compositional test prompts "
        f"to {Path(args.out)}"
    )


if __name__ == "__main__":
    main()
