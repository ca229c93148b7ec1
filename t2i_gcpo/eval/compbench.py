"""T2I-CompBench(++) (Huang et al., NeurIPS 2023; TPAMI 2025; Karine-Huang/T2I-CompBench),
docs/evaluation/compbench.md: attribute binding (colour, shape, texture) by BLIP-VQA, non-spatial relations
by CLIPScore, and — with this toolkit's detector in place of UniDet — 2-D spatial relations and numeracy.

The prompts are the user's copy of the reference's ``examples/dataset/`` folder (``--data DIR``):
``<category>_val.txt`` (300 prompts each, the evaluation split), ``<category>.txt`` (all), and for numeracy
``new_objects.txt`` ("singular - plural" a line). The score rules are the reference's (commit 1b70949):

- BLIP-VQA (BLIPvqa_eval/BLIP_vqa.py, models/blip_vqa.py ``vqa_prob``): the prompt's noun phrases (spaCy's
  ``en_core_web_sm`` noun chunks, at most 8, without "top", "the side", "the left", "the right"), each asked
  as the question "<noun phrase>?" (lower-cased, ``.!"()*#:;~`` removed); the answer's probability is read
  from the first decoded token, P(yes) / (P(yes) + P(no)); the image's score is the product over its noun
  phrases (1 without any). The question starts with BLIP's [ENC] token in place of [CLS], as the reference
  encodes it.
- CLIPScore (CLIPScore_eval/CLIP_similarity.py): the plain cosine of OpenAI CLIP ViT-B/32's image and prompt
  embeddings — not scaled (no 2.5 ×, no 100 ×) and not clipped at 0.
- spatial (UniDet_eval/2D_spatial_eval.py): the relation is the first of "on side of", "next to", "near",
  "on the left of", "on the right of", "on the bottom of", "on the top of", "on top of" found in the prompt,
  the two objects its first and last noun (girl, boy, man, woman read as person); with both detected (their
  highest-confidence instance, confidence ≥ 0.5): 0.25 s₁ + 0.25 s₂ + position / 2 (`position_score`), with
  one: 0.25 s, with none 0; a score below 0.5 counts 0.
- numeracy (UniDet_eval/numeracy_eval.py): each "<number> <object>" of the prompt (a, an, one … eight;
  objects from new_objects.txt), instances of one class overlapping by IoU > 0.9 (or either's area > 90 %
  inside the other) counted once; each object weighs 1/K: half for being detected, half for its count.

UniDet (a 700-class detector) has no PyPI build; the detector here is GenEval's Mask2Former on COCO's 80
classes (scoring/detector_mask2former.py), which misses objects UniDet knows. Spatial and numeracy scores
are therefore labelled `DETECTOR_LABEL` in every output that holds them."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from t2i_gcpo.errors import UserError
from t2i_gcpo.scoring.detections import Detection

DETECTOR_LABEL = "detector substitute, not the official number"
SOURCE = "Karine-Huang/T2I-CompBench 1b70949"
# category → the scorer of the reference that scores it
SCORERS = {
    "color": "blip-vqa",
    "shape": "blip-vqa",
    "texture": "blip-vqa",
    "non_spatial": "clipscore",
    "spatial": "detector",
    "numeracy": "detector",
}
CATEGORIES = tuple(SCORERS)
SPLITS = ("val", "train", "all")
MAX_NOUN_PHRASES = 8  # BLIP_vqa.py --np_num
EXCLUDED_PHRASES = ("top", "the side", "the left", "the right")
SPATIAL_WORDS = (
    "on side of",
    "next to",
    "near",
    "on the left of",
    "on the right of",
    "on the bottom of",
    "on the top of",
    "on top of",
)
PERSON = ("girl", "boy", "man", "woman")
NUMBERS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
}
# numeracy_eval.py's renames of prompt objects to detector labels
NUMERACY_RENAMES = {
    "boy": "person",
    "girl": "person",
    "man": "person",
    "woman": "person",
    "ship": "boat",
    "telivision": "tv",
    "goldfish": "fish",
    "painting": "picture",
}
CONFIDENCE = 0.5  # UniDet's --confidence-threshold in the reference


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------


def prompt_file(data: str | os.PathLike, category: str, split: str = "val") -> Path:
    """`<data>/<category>_<split>.txt` (`split` "all": `<category>.txt`)."""
    name = f"{category}.txt" if split == "all" else f"{category}_{split}.txt"
    return Path(data) / name


def read_prompts(data: str | os.PathLike, category: str, split: str = "val") -> list[str]:
    """A category's prompts, one a line (blank lines skipped); a one-line UserError naming the file."""
    if category not in SCORERS:
        raise UserError(f"unknown T2I-CompBench category {category!r}; one of {', '.join(CATEGORIES)}")
    if split not in SPLITS:
        raise UserError(f"--split must be one of {', '.join(SPLITS)}, got {split!r}")
    path = prompt_file(data, category, split)
    if not path.is_file():
        raise UserError(
            f"{path}: not found; --data is T2I-CompBench's examples/dataset folder (<category>_val.txt …)"
        )
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    prompts = [line.strip() for line in lines if line.strip()]
    if not prompts:
        raise UserError(f"{path}: holds no prompts")
    return prompts


def read_objects(data: str | os.PathLike) -> tuple[list[str], list[str]]:
    """new_objects.txt's (singulars, plurals), lower-cased: "apple - apples" a line."""
    path = Path(data) / "new_objects.txt"
    if not path.is_file():
        raise UserError(
            f"{path}: not found (numeracy reads its objects from T2I-CompBench's new_objects.txt)"
        )
    singular, plural = [], []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        if " - " not in line:
            raise UserError(f"{path}:{i + 1}: expected 'singular - plural', got {line.strip()!r}")
        s, p = line.split(" - ", 1)
        singular.append(s.strip().lower())
        plural.append(p.strip().lower())
    return singular, plural


# ---------------------------------------------------------------------------------------------
# prompt parsing: spaCy where it is installed (the reference), else a rule for the benchmark's templates
# ---------------------------------------------------------------------------------------------

CHUNKERS = ("auto", "spacy", "simple")


def load_spacy() -> Any | None:
    """spaCy's en_core_web_sm (the reference's parser), or None where it is not installed."""
    try:
        import spacy

        return spacy.load("en_core_web_sm")
    except (ImportError, OSError):
        return None


class PromptParser:
    """Noun phrases (BLIP-VQA), the spatial objects and the tokens of a prompt: spaCy's ``en_core_web_sm`` as
    the reference parses (`kind` "spacy"), or "simple": the prompt split at commas and "and" into noun
    phrases, its words as tokens, a phrase's last word as its noun — the same as spaCy on the benchmark's
    template prompts ("a green bench and a blue bowl", "a girl next to a cow", "three pillows"), not on its
    free-form sentences ("The glass bottle and metallic opener hold the wooden beer …"), whose questions
    then differ from the reference's. Which one ran is in the protocol."""

    def __init__(self, kind: str = "auto"):
        if kind not in CHUNKERS:
            raise UserError(f"--noun-phrases must be one of {', '.join(CHUNKERS)}, got {kind!r}")
        self.nlp = load_spacy() if kind in ("auto", "spacy") else None
        if kind == "spacy" and self.nlp is None:
            raise UserError(
                "--noun-phrases spacy: spaCy with en_core_web_sm is not installed "
                "(pip install spacy, then its en_core_web_sm model); or use --noun-phrases simple"
            )
        self.kind = "spacy" if self.nlp is not None else "simple"

    def name(self) -> str:
        if self.nlp is None:
            return "simple (split at commas and 'and'; spaCy's questions may differ on free-form prompts)"
        import spacy

        return f"spacy {spacy.__version__} en_core_web_sm {self.nlp.meta.get('version')}"

    def noun_phrases(self, prompt: str) -> list[str]:
        if self.nlp is not None:
            phrases = [c.text for c in self.nlp(prompt).noun_chunks]
        else:
            text = prompt.strip().rstrip(".!?")
            phrases = [p.strip() for p in re.split(r",\s*(?:and\s+)?|\s+and\s+", text) if p.strip()]
        return [p for p in phrases if p not in EXCLUDED_PHRASES]

    def tokens(self, prompt: str) -> list[str]:
        if self.nlp is not None:
            return [t.text for t in self.nlp(prompt)]
        return re.findall(r"\w+|[^\w\s]", prompt)

    def spatial_objects(self, prompt: str, relation: str | None) -> tuple[str | None, str | None]:
        """The first and the last noun of the prompt (2D_spatial_eval.py's simple structure)."""
        if self.nlp is not None:
            nouns = [t.text for t in self.nlp(prompt) if t.pos_ == "NOUN"]
            return (nouns[0], nouns[-1]) if nouns else (None, None)
        text = prompt.strip().rstrip(".!?")
        if relation is None or relation not in text:
            return (None, None)
        before, after = text.split(relation, 1)
        first, last = before.split(), after.split()
        return (first[-1] if first else None, last[-1] if last else None)


def blip_question(noun_phrase: str) -> str:
    """The reference's question of a noun phrase: "<phrase>?", lower-cased, ``.!"()*#:;~`` removed, trailing
    spaces dropped, at most 50 words (BLIP's ``pre_question``)."""
    q = re.sub(r"([.!\"()*#:;~])", "", f"{noun_phrase}?".lower()).rstrip(" ")
    return " ".join(q.split(" ")[:50])


# ---------------------------------------------------------------------------------------------
# BLIP-VQA
# ---------------------------------------------------------------------------------------------


class BlipVQAScorer:
    """P(yes) / (P(yes) + P(no)) of a transformers BLIP VQA model (`BlipForQuestionAnswering`, from a
    local folder: Salesforce/blip-vqa-capfilt-large holds the reference's weights), read from the first
    token the answer decoder gives after its BOS ([DEC]), the question encoded over the image with [ENC]
    in place of [CLS]. Questions are batched only with questions of their own length, unpadded (BLIP's
    text layers in transformers 5 drop the cross-attention's padding mask: rewards/forms/vqa.py)."""

    def __init__(self, model, image_processor, tokenizer, *, name: str, batch_size: int = 16):
        self.model, self.image_processor, self.tokenizer = model, image_processor, tokenizer
        self.name, self.batch_size = name, int(batch_size)
        vocab = tokenizer.get_vocab()
        text = model.config.text_config
        missing = [w for w in ("yes", "no") if w not in vocab]
        if missing:
            raise UserError(
                f"{name}: the tokenizer has no {' or '.join(missing)} token: not a BLIP VQA tokenizer"
            )
        self.yes, self.no = vocab["yes"], vocab["no"]
        self.bos = int(text.bos_token_id)
        # BLIP's tokenizer adds [DEC] (the decoder's BOS, 30522) and then [ENC] (30523); transformers'
        # copies keep bert-base-uncased's vocabulary, so [ENC] is the id after BOS where the model has it
        enc = vocab.get("[ENC]", self.bos + 1)
        self.enc = enc if enc < int(text.vocab_size) else None

    @classmethod
    def from_pretrained(
        cls, folder: str | os.PathLike, *, device: str | torch.device = "cpu", batch_size: int = 16
    ) -> BlipVQAScorer:
        from t2i_gcpo.rewards.forms.vqa import load_blip_vqa

        return cls(*load_blip_vqa(str(folder), device), name=Path(folder).name, batch_size=batch_size)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def question_ids(self, question: str) -> torch.Tensor:
        ids = self.tokenizer(question, truncation=True, max_length=35, return_tensors="pt")["input_ids"][0]
        if self.enc is not None:
            ids = ids.clone()
            ids[0] = self.enc
        return ids

    @torch.no_grad()
    def yes_probability(self, images: Sequence[Image.Image], questions: Sequence[str]) -> list[float]:
        """P(yes) / (P(yes) + P(no)) for each (image, question) pair."""
        ids = [self.question_ids(q) for q in questions]
        out = [math.nan] * len(ids)
        by_length: dict[int, list[int]] = {}
        for i, q in enumerate(ids):
            by_length.setdefault(len(q), []).append(i)
        m = self.model
        for rows in by_length.values():
            for s in range(0, len(rows), self.batch_size):
                which = rows[s : s + self.batch_size]
                pix = self.image_processor(
                    images=[images[i].convert("RGB") for i in which], return_tensors="pt"
                )
                image_embeds = m.vision_model(pixel_values=pix["pixel_values"].to(self.device))[0]
                q = torch.stack([ids[i] for i in which]).to(self.device)
                states = m.text_encoder(
                    input_ids=q, attention_mask=torch.ones_like(q), encoder_hidden_states=image_embeds
                )[0]
                bos = torch.full((len(which), 1), self.bos, dtype=torch.long, device=self.device)
                logits = m.text_decoder(input_ids=bos, encoder_hidden_states=states).logits[:, 0].float()
                prob = torch.softmax(logits, dim=-1)
                p = (prob[:, self.yes] / (prob[:, self.yes] + prob[:, self.no])).cpu().tolist()
                for i, v in zip(which, p):
                    out[i] = float(v)
        return out


def blip_vqa_scores(
    scorer: BlipVQAScorer, images: Sequence[Image.Image], prompts: Sequence[str], parser: PromptParser
) -> list[dict[str, Any]]:
    """Each image's BLIP-VQA score (the product of its noun phrases' answers) with its
    questions and answers."""
    questions = [[blip_question(p) for p in parser.noun_phrases(t)[:MAX_NOUN_PHRASES]] for t in prompts]
    flat = [(i, q) for i, qs in enumerate(questions) for q in qs]
    answers = scorer.yes_probability([images[i] for i, _ in flat], [q for _, q in flat]) if flat else []
    out = [{"score": 1.0, "questions": qs, "answers": []} for qs in questions]
    for (i, _), a in zip(flat, answers):
        out[i]["answers"].append(a)
        out[i]["score"] *= a
    return out


# ---------------------------------------------------------------------------------------------
# detector rules
# ---------------------------------------------------------------------------------------------


def position_score(
    relation: str | None,
    box1: Sequence[float],
    box2: Sequence[float],
    iou_threshold: float = 0.1,
    distance_threshold: float = 150.0,
) -> float:
    """2D_spatial_eval.py's ``determine_position`` of object 1 (box1) against object 2 (box2), boxes
    (x0, y0, x1, y1) in pixels, y down: "next to" / "near" / "on side of" 1 within 150 px on either axis
    (else 150 / the larger distance); left / right / top / bottom 1 where the centres' offset is mostly
    along that axis on the right side and the boxes' IoU is under 0.1 (else 0.1 / IoU), 0 otherwise; "on top
    of" and any other relation 0 (the reference scores only "on the top of")."""
    c1 = ((box1[0] + box1[2]) / 2, (box1[1] + box1[3]) / 2)
    c2 = ((box2[0] + box2[2]) / 2, (box2[1] + box2[3]) / 2)
    dx, dy = c2[0] - c1[0], c2[1] - c1[1]
    ix = max(0.0, min(box1[2], box2[2]) - max(box1[0], box2[0]))
    iy = max(0.0, min(box1[3], box2[3]) - max(box1[1], box2[1]))
    inter = ix * iy
    union = (box1[2] - box1[0]) * (box1[3] - box1[1]) + (box2[2] - box2[0]) * (box2[3] - box2[1]) - inter
    iou = inter / union if union > 0 else 0.0

    def along(main: float, other: float, side_ok: bool) -> float:
        if not side_ok or abs(main) <= abs(other):
            return 0.0
        return 1.0 if iou < iou_threshold else iou_threshold / iou

    if relation in ("next to", "on side of", "near"):
        if abs(dx) < distance_threshold or abs(dy) < distance_threshold:
            return 1.0
        return distance_threshold / max(abs(dx), abs(dy))
    if relation == "on the right of":
        return along(dx, dy, dx < 0)
    if relation == "on the left of":
        return along(dx, dy, dx > 0)
    if relation == "on the bottom of":
        return along(dy, dx, dy < 0)
    if relation == "on the top of":
        return along(dy, dx, dy > 0)
    return 0.0


def _class_of(word: str | None, names: set[str]) -> str | None:
    """The detector's class name of a prompt's object word (COCO's spelling: sofa → couch), or the word."""
    from t2i_gcpo.scoring.detector_mask2former import to_geneval_name

    if word is None:
        return None
    word = "person" if word in PERSON else word
    return to_geneval_name(word, names) or word


def spatial_score(
    prompt: str, detections: Sequence[Detection], parser: PromptParser, names: set[str]
) -> dict[str, Any]:
    """One image's spatial score (module docstring) with the relation and objects it read."""
    relation = next((w for w in SPATIAL_WORDS if w in prompt), None)
    word1, word2 = parser.spatial_objects(prompt, relation)
    obj1, obj2 = _class_of(word1, names), _class_of(word2, names)
    kept = [d for d in detections if d.score >= CONFIDENCE]

    def best(cls: str | None) -> Detection | None:
        found = [d for d in kept if d.cls == cls]
        return max(found, key=lambda d: d.score) if found else None

    d1, d2 = best(obj1), best(obj2)
    if d1 is not None and d2 is not None:
        score = 0.25 * d1.score + 0.25 * d2.score + position_score(relation, d1.box, d2.box) / 2
    elif d1 is not None or d2 is not None:
        score = 0.25 * (d1 or d2).score
    else:
        score = 0.0
    score = 0.0 if score < 0.5 else score
    return {
        "score": float(score),
        "relation": relation,
        "objects": [obj1, obj2],
        "detected": [d is not None for d in (d1, d2)],
    }


def _same_object(b1: Sequence[float], b2: Sequence[float]) -> bool:
    """numeracy_eval.py's ``calculate_iou``: IoU > 0.9, or more than 90 % of either box inside the other
    (areas with the +1 pixel convention)."""
    ix = max(0.0, min(b1[2], b2[2]) - max(b1[0], b2[0]) + 1)
    iy = max(0.0, min(b1[3], b2[3]) - max(b1[1], b2[1]) + 1)
    inter = ix * iy
    a1 = (b1[2] - b1[0] + 1) * (b1[3] - b1[1] + 1)
    a2 = (b2[2] - b2[0] + 1) * (b2[3] - b2[1] + 1)
    return inter / (a1 + a2 - inter) > 0.9 or inter / a1 > 0.9 or inter / a2 > 0.9


def counted_objects(
    prompt: str, parser: PromptParser, singular: Sequence[str], plural: Sequence[str]
) -> list[tuple[str, int]]:
    """The (object, count) pairs of a numeracy prompt as numeracy_eval.py reads them: a number word followed
    by a one- or two-word object of new_objects.txt (a plural names its singular)."""
    t = parser.tokens(prompt)
    out: list[tuple[str, int]] = []
    for i, word in enumerate(t):
        if word not in NUMBERS or i + 1 >= len(t):
            continue
        two = f"{t[i + 1]} {t[i + 2]}" if i + 2 < len(t) else None
        if two is not None and (two in singular or two in plural):
            if two in plural and word not in ("a", "an", "one"):
                out.append((singular[plural.index(two)], NUMBERS[word]))
            else:
                out.append((two, 1))
        elif t[i + 1] in singular or t[i + 1] in plural:
            if t[i + 1] in singular and word in ("a", "an", "one"):
                out.append((t[i + 1], 1))
            else:
                noun = singular[plural.index(t[i + 1])] if t[i + 1] in plural else t[i + 1]
                out.append((noun, NUMBERS[word]))
    return out


def numeracy_score(
    prompt: str,
    detections: Sequence[Detection],
    parser: PromptParser,
    objects: tuple[Sequence[str], Sequence[str]],
    names: set[str],
) -> dict[str, Any]:
    """One image's numeracy score (module docstring) with the objects and counts it read and found."""
    kept = [d for d in detections if d.score >= CONFIDENCE]
    found: list[str] = []
    boxes: list[Sequence[float]] = []
    for d in sorted(kept, key=lambda d: -d.score):
        if not any(c == d.cls and _same_object(d.box, b) for c, b in zip(found, boxes)):
            found.append(d.cls)
            boxes.append(d.box)
    wanted = counted_objects(prompt, parser, *objects)
    if not wanted:
        return {"score": 0.0, "objects": [], "found": found}
    weight, score, counts = 1.0 / len(wanted), 0.0, []
    for word, count in wanted:
        obj = NUMERACY_RENAMES.get(word, word)
        obj = _class_of(obj, names) if obj not in found else obj
        if obj not in found:  # the reference's substring rule: "table" is in "dining table"
            found = [obj if obj in f else f for f in found]
        n = found.count(obj)
        counts.append(n)
        if n:
            score += 0.5 * weight + (0.5 * weight if n == count else 0.0)
    return {"score": float(score), "objects": [[w, c] for w, c in wanted], "counted": counts}


# ---------------------------------------------------------------------------------------------
# the evaluation
# ---------------------------------------------------------------------------------------------


def category_metadata(category: str, prompts: Sequence[str]) -> list[dict]:
    """The GenEval-layout metadata of a category's prompts (eval/layout.py): prompt, tag (the category)."""
    return [{"prompt": p, "tag": category, "include": []} for p in prompts]


def score_images(
    category: str,
    items: Sequence[tuple[str, str, Path]],
    *,
    blip: BlipVQAScorer | None = None,
    clip: Any = None,
    detector: Callable[[Image.Image], list[Detection]] | None = None,
    parser: PromptParser | None = None,
    objects: tuple[Sequence[str], Sequence[str]] | None = None,
    batch: int = 16,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Result rows of one category's images, `items` (key, prompt, path): ``key``, ``category``, ``score``,
    ``prompt``, ``filename``, ``scorer`` and what the scorer read (questions and answers, relation and
    objects, objects and counts; the detector's rows say `DETECTOR_LABEL`)."""
    from tqdm.auto import tqdm

    from t2i_gcpo.scoring.geneval_classes import geneval_classes

    parser = parser or PromptParser("simple")
    scorer = SCORERS[category]
    names = set(geneval_classes())
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=len(items), desc=f"CompBench {category}", unit="img", disable=not progress)
    for s in range(0, len(items), batch):
        part = items[s : s + batch]
        images = []
        for _, _, path in part:
            with Image.open(path) as im:
                images.append(im.convert("RGB"))
        prompts = [p for _, p, _ in part]
        if scorer == "blip-vqa":
            scored = blip_vqa_scores(blip, images, prompts, parser)
        elif scorer == "clipscore":
            from torchvision.transforms.functional import pil_to_tensor

            tensors = torch.stack([pil_to_tensor(im).float() / 255 for im in images])
            scored = [{"score": float(c)} for c in clip.cosine(tensors, prompts).tolist()]
        elif category == "spatial":
            scored = [
                spatial_score(p, detector(im), parser, names) | {"label": DETECTOR_LABEL}
                for p, im in zip(prompts, images)
            ]
        else:
            scored = [
                numeracy_score(p, detector(im), parser, objects, names) | {"label": DETECTOR_LABEL}
                for p, im in zip(prompts, images)
            ]
        for (key, prompt, path), r in zip(part, scored):
            rows.append(
                {
                    "key": key,
                    "category": category,
                    "score": r.pop("score"),
                    "prompt": prompt,
                    "filename": str(path),
                    "scorer": scorer,
                    **r,
                }
            )
        bar.update(len(part))
    bar.close()
    return rows


def summarize(rows: Sequence[dict[str, Any]], scorer_names: dict[str, str]) -> dict[str, Any]:
    """summary.json: per category its mean score, images, scorer (and `DETECTOR_LABEL` for the detector's),
    and the mean of the categories ("overall": not a number CompBench reports; labelled too when a detector
    category is in it)."""
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(r["category"], []).append(float(r["score"]))
    cats = {}
    for c in [c for c in CATEGORIES if c in by]:
        entry = {"score": sum(by[c]) / len(by[c]), "images": len(by[c]), "scorer": scorer_names[SCORERS[c]]}
        if SCORERS[c] == "detector":
            entry["label"] = DETECTOR_LABEL
        cats[c] = entry
    overall = sum(v["score"] for v in cats.values()) / max(len(cats), 1)
    label = "mean of the categories (not a CompBench number)"
    if any(SCORERS[c] == "detector" for c in cats):
        label += f"; spatial / numeracy: {DETECTOR_LABEL}"
    return {"suite": "T2I-CompBench", "categories": cats, "overall": overall, "overall_label": label}


def format_summary(summary: dict[str, Any]) -> str:
    """The per-category table: score, images, scorer, and the detector's label beside its scores."""
    w = max(12, *(len(c) for c in summary["categories"]))
    lines = [
        f"T2I-CompBench (reference rules, {SOURCE})",
        f"{'category':<{w}} {'score':>7} {'images':>7}  scorer",
    ]
    for c, e in summary["categories"].items():
        note = f"  ({e['label']})" if "label" in e else ""
        lines.append(f"{c:<{w}} {e['score']:>7.4f} {e['images']:>7}  {e['scorer']}{note}")
    lines.append(f"{'overall':<{w}} {summary['overall']:>7.4f}          {summary['overall_label']}")
    return "\n".join(lines)


_REFERENCE_NAME = re.compile(r"^(?P<prompt>.+)_(?P<index>\d{6})\.(?:png|jpg|jpeg|webp)$", re.IGNORECASE)


def folder_items(
    root: str | os.PathLike, category: str, prompts: Sequence[str] | None = None
) -> list[tuple[str, str, Path]]:
    """(key, prompt, path) of a category's images under `root/<category>/`: GenEval layout (this toolkit's
    generation: key "category/PPPPP/SSSS"; with `prompts`, the folders must hold exactly those, in order),
    or the reference's ``samples/<prompt>_<NNNNNN>.png`` (key "category/NNNNNN")."""
    from t2i_gcpo.eval.layout import iter_layout, prompt_folders

    folder = Path(root) / category
    if not folder.is_dir():
        raise UserError(
            f"{folder}: no images of category {category} (expected {folder}/00000/samples/0000.png "
            f"or {folder}/samples/<prompt>_000000.png)"
        )
    if prompt_folders(folder):
        items = []
        for index, metadata, paths in iter_layout(folder):
            if prompts is not None and (index >= len(prompts) or metadata["prompt"] != prompts[index]):
                raise UserError(
                    f"{folder}/{index:05d} holds prompt {metadata['prompt']!r}, not this run's "
                    "(use --overwrite to regenerate, or another --out)"
                )
            items += [(f"{category}/{index:05d}/{p.stem}", metadata["prompt"], p) for p in paths]
        if prompts is not None and len(prompt_folders(folder)) != len(prompts):
            raise UserError(
                f"{folder}: {len(prompt_folders(folder))} prompt folders, this run has {len(prompts)}"
            )
        return items
    samples = folder / "samples"
    found = (
        [(m, p) for p in sorted(samples.iterdir()) if (m := _REFERENCE_NAME.match(p.name))]
        if samples.is_dir()
        else []
    )
    if not found:
        raise UserError(
            f"{folder}: no images (expected {folder}/00000/samples/0000.png or "
            f"{folder}/samples/<prompt>_000000.png)"
        )
    return [(f"{category}/{m['index']}", m["prompt"], p) for m, p in found]


def write_outputs(out: Path, rows: Sequence[dict[str, Any]], summary: dict[str, Any]) -> None:
    """results.jsonl (one row per image), summary.json and summary.txt in `out`."""
    import json

    from t2i_gcpo.outdir import write_file

    write_file(out / "results.jsonl", "".join(json.dumps(r) + "\n" for r in rows), within=out)
    write_file(out / "summary.json", json.dumps(summary, indent=2) + "\n", within=out)
    write_file(out / "summary.txt", format_summary(summary) + "\n", within=out)


def run_compbench(
    data: str | os.PathLike,
    out: str | os.PathLike,
    *,
    model: str | None = None,
    score_only: str | os.PathLike | None = None,
    categories: str | Sequence[str] | None = None,
    split: str = "val",
    vqa: str | None = None,
    clip: str | None = None,
    clip_model: str = "ViT-B-32",
    detector: str | None = None,
    noun_phrases: str = "auto",
    n: int = 10,
    batch: int = 4,
    cfg_scale: float | None = None,
    steps: int | None = None,
    reveal_order: str | None = None,
    seed: int = 0,
    device: str = "cpu",
    overwrite: bool = False,
    check_out: Callable | None = None,
    load_policy: Callable | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """``t2i-gcpo eval compbench``: every check first (the data files, the scorers each category needs, a
    folder of other prompts or settings to resume into), then generation into out/images/<category>/
    (resumable, GenEval layout), then scoring; writes results.jsonl, summary.json/txt and protocol.json.
    Returns the summary (`summarize`)."""
    from t2i_gcpo.eval.geneval import generate_geneval, image_sampling, masked_asked
    from t2i_gcpo.eval.layout import check_resumable, layout_protocol
    from t2i_gcpo.eval.records.protocol import protocol_record, scorer_record, write_protocol
    from t2i_gcpo.outdir import check_settings_record, write_settings_record
    from t2i_gcpo.policies.registry import model_identity

    if (model is None) == (score_only is None):
        raise UserError("give either --model (generate, then score) or --score-only DIR")
    if overwrite and model is None:
        raise UserError("--overwrite regenerates images: it needs --model, not --score-only")
    if batch < 1:
        raise UserError(f"--batch must be >= 1 (got {batch})")
    given = {"blip-vqa": vqa, "clipscore": clip, "detector": detector}
    flags = {"blip-vqa": "--vqa", "clipscore": "--clip", "detector": "--detector"}
    if categories is None:
        chosen = [c for c in CATEGORIES if given[SCORERS[c]]]
        if not chosen:
            raise UserError(
                "give a scorer: --vqa (color, shape, texture), --clip (non_spatial) or --detector "
                "(spatial, numeracy)"
            )
        if score_only is not None:  # the categories of the folder that a scorer given scores
            present = [c for c in chosen if (Path(score_only) / c).is_dir()]
            if not present:
                raise UserError(
                    f"{score_only} holds no folder of {', '.join(chosen)} (the categories the "
                    "scorers given score): expected <DIR>/<category>/"
                )
            chosen = present
    else:
        chosen = [c.strip() for c in (categories.split(",") if isinstance(categories, str) else categories)]
        chosen = [c for c in chosen if c]
        unknown = [c for c in chosen if c not in SCORERS]
        if unknown or not chosen:
            raise UserError(
                f"--categories: unknown {unknown[0] if unknown else '(none given)'!r}; "
                f"of {', '.join(CATEGORIES)}"
            )
        for c in chosen:
            if not given[SCORERS[c]]:
                raise UserError(f"category {c} is scored by {SCORERS[c]}: give {flags[SCORERS[c]]}")
    prompts = {c: read_prompts(data, c, split) for c in chosen}
    objects = read_objects(data) if "numeracy" in chosen else None
    parser = PromptParser(noun_phrases)
    out = Path(check_out(out) if check_out else out)
    source = {"--score-only": score_only and os.path.realpath(score_only), "--data": os.path.realpath(data)}
    check_settings_record(out, "eval compbench", source, redo="--overwrite", redoing=overwrite)
    root = Path(score_only) if score_only is not None else out / "images"
    if (
        model is not None and not overwrite
    ):  # refuse a folder of other prompts or settings before any model loads
        known = {
            "model": model_identity(model),
            "seed": seed,
            "temperature": 1.0,
            "top_k": 0,
            "n": n,
            **({"cfg_scale": cfg_scale} if cfg_scale is not None else {}),
            **masked_asked(steps, reveal_order),
        }
        for c in chosen:
            check_resumable(root / c, category_metadata(c, prompts[c]), known)
    if score_only is not None:  # the images to score, read before any scorer loads
        scored = {c: folder_items(root, c) for c in chosen}
    needed = {SCORERS[c] for c in chosen}
    blip = BlipVQAScorer.from_pretrained(vqa, device=device) if "blip-vqa" in needed else None
    clip_scorer = None
    if "clipscore" in needed:
        from t2i_gcpo.rewards.forms.clip_score import ClipScoreReward

        clip_scorer = ClipScoreReward(clip, clip_model, True, device)
    det = None
    if "detector" in needed:
        from t2i_gcpo.scoring.detector_mask2former import Mask2FormerDetector

        det = Mask2FormerDetector.from_pretrained(detector, device=device)
    write_settings_record(out, "eval compbench", source)
    if model is not None:
        policy = load_policy(model)
        sampling = image_sampling(policy, cfg_scale=cfg_scale, steps=steps, reveal_order=reveal_order)
        for c in chosen:
            generate_geneval(
                policy,
                category_metadata(c, prompts[c]),
                root / c,
                sampling,
                n=n,
                batch=batch,
                seed=seed,
                model=model_identity(model),
                overwrite=overwrite,
                progress=progress,
            )
    rows: list[dict[str, Any]] = []
    for c in chosen:
        items = folder_items(root, c, prompts[c]) if model is not None else scored[c]
        rows += score_images(
            c,
            items,
            blip=blip,
            clip=clip_scorer,
            detector=det,
            parser=parser,
            objects=objects,
            progress=progress,
        )
    names = {
        "blip-vqa": f"BLIP-VQA ({Path(vqa).name})" if vqa else "",
        "clipscore": f"CLIPScore ({clip_model})",
        "detector": f"Mask2Former ({Path(detector).name})" if detector else "",
    }
    summary = summarize(rows, names)
    write_outputs(out, rows, summary)
    scorer: dict[str, Any] = {"kind": "compbench", "categories": chosen, "noun_phrases": parser.name()}
    if blip is not None:
        scorer["blip-vqa"] = scorer_record(
            "vqa", os.path.realpath(vqa), question_start="[ENC]" if blip.enc is not None else "[CLS]"
        )
    if clip_scorer is not None:
        scorer["clipscore"] = scorer_record("clip", os.path.realpath(clip), model=clip_model)
    if det is not None:
        scorer["detector"] = scorer_record(
            "detector", os.path.realpath(detector), label=DETECTOR_LABEL, confidence=CONFIDENCE
        )
    first = root / chosen[0]
    from t2i_gcpo.eval.layout import prompt_folders

    fields = layout_protocol(first) if prompt_folders(first) else {}  # the reference's layout records nothing
    files = [prompt_file(data, c, split) for c in chosen] + (
        [Path(data) / "new_objects.txt"] if objects else []
    )
    write_protocol(
        out,
        protocol_record(
            "compbench",
            data=files,
            model=fields.get("model"),
            scorer=scorer,
            seeds=fields.get("seeds"),
            images_per_prompt=fields.get("images_per_prompt"),
            sampling=fields.get("sampling"),
            aggregate="categories",
            split=split,
            images=str(root.resolve()),
            reference=SOURCE,
            **({"label": f"spatial / numeracy: {DETECTOR_LABEL}"} if det is not None else {}),
        ),
    )
    return summary
