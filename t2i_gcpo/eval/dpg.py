"""DPG-Bench (Hu et al., 2024, ELLA: "Equip Diffusion Models with LLM for Enhanced Semantic
Alignment"), docs/evaluation/dpg-bench.md, with a transformers VQA model as a stated proxy.

Each of the 1,065 dense prompts gets 4 images tiled 2×2 into one PNG. The question file
``dpg_bench.csv`` (supplied by the user) holds yes/no questions per prompt with a dependency graph.
A VQA model answers every question on every tile: "yes" scores 1; a question whose parent was
answered "no" scores 0 (one level: the parent's own answer counts, not its zeroed score); tile score
= mean over the questions, prompt score = mean over the 4 tiles, DPG = mean over prompts × 100.
Category scores average the (tile, question) scores per category_broad / category_detailed, × 100.

The original VQA model (mPLUG-large) is not in transformers, so results are labelled
"DPG-Bench (proxy VQA: <model>)" and are not comparable with published DPG numbers.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm
from typing_extensions import TypedDict

from t2i_gcpo.errors import UserError
from t2i_gcpo.eval.geneval import generate_images, image_sampling, image_settings
from t2i_gcpo.eval.layout import (
    SETTINGS_NAME,
    atomic_save_image,
    atomic_write_json,
    settings_mismatch,
)
from t2i_gcpo.outdir import parse_json, read_json, write_file
from t2i_gcpo.policies.base import Policy, SamplingParams
from t2i_gcpo.tasks.loop import group_generators

DPG_COLUMNS = (
    "item_id",
    "text",
    "keywords",
    "proposition_id",
    "dependency",
    "category_broad",
    "category_detailed",
    "tuple",
    "question_natural_language",
)
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class DPGQuestion:
    """One row of dpg_bench.csv."""

    item_id: str
    proposition_id: str
    parents: tuple[str, ...]  # proposition ids this question depends on ("0" = none, dropped)
    category_broad: str
    category_detailed: str
    question: str
    tuple: str = ""
    keywords: str = ""
    text: str = ""
    line: int = 0  # line in the CSV, for error messages


def load_dpg_prompts() -> list[dict]:
    """The 1,065 DPG-Bench prompts `{"item_id", "prompt"}` (package data dpg_bench/prompts.jsonl)."""
    path = resources.files("t2i_gcpo") / "data" / "dpg_bench" / "prompts.jsonl"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"package data is missing: {path} (reinstall t2i-gcpo)") from None
    return [parse_json(line, f"{path}:{i + 1}") for i, line in enumerate(text.splitlines()) if line.strip()]


# ---------------------------------------------------------------------------------------------
# questions
# ---------------------------------------------------------------------------------------------


def _norm_id(value: str) -> str:
    value = value.strip()
    return str(int(value)) if value.isdigit() else value


def read_dpg_csv(path: str | os.PathLike) -> list[DPGQuestion]:
    """Parse DPG-Bench's question CSV; a malformed file raises UserError naming the line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: DPG-Bench question file not found")
    questions: list[DPGQuestion] = []
    seen: dict[tuple[str, str], int] = {}
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        missing = [c for c in DPG_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise UserError(
                f"{path}:1: missing column(s) {', '.join(missing)}; expected {','.join(DPG_COLUMNS)}"
            )
        try:
            for row in reader:
                line = reader.line_num
                if None in row or any(v is None for v in row.values()):
                    raise UserError(f"{path}:{line}: expected {len(reader.fieldnames)} fields")
                item, pid = row["item_id"].strip(), _norm_id(row["proposition_id"])
                question = row["question_natural_language"].strip()
                if not item or not pid or not question:
                    raise UserError(f"{path}:{line}: item_id, proposition_id and question must not be empty")
                deps = (
                    [_norm_id(d) for d in row["dependency"].split(",")] if row["dependency"].strip() else []
                )
                if any(not d for d in deps):
                    raise UserError(f"{path}:{line}: malformed dependency {row['dependency']!r}")
                if (item, pid) in seen:
                    raise UserError(
                        f"{path}:{line}: duplicate proposition {pid} of {item} (first on line "
                        f"{seen[item, pid]})"
                    )
                seen[item, pid] = line
                questions.append(
                    DPGQuestion(
                        item_id=item,
                        proposition_id=pid,
                        parents=tuple(d for d in deps if d != "0"),
                        category_broad=row["category_broad"].strip(),
                        category_detailed=row["category_detailed"].strip(),
                        question=question,
                        tuple=row["tuple"],
                        keywords=row["keywords"],
                        text=row["text"],
                        line=line,
                    )
                )
        except csv.Error as e:
            raise UserError(f"{path}:{reader.line_num}: {e}") from None
    if not questions:
        raise UserError(f"{path}: no questions")
    for q in questions:
        for p in q.parents:
            if (q.item_id, p) not in seen:
                raise UserError(f"{path}:{q.line}: dependency {p} is not a proposition of {q.item_id}")
    return questions


# ---------------------------------------------------------------------------------------------
# 2×2 grids
# ---------------------------------------------------------------------------------------------


def tile_2x2(images: Sequence[Image.Image]) -> Image.Image:
    """Four equal-size images → one grid [[0, 1], [2, 3]] (row-major), twice the width and height."""
    if len(images) != 4:
        raise ValueError(f"tile_2x2 needs 4 images, got {len(images)}")
    w, h = images[0].size
    if any(im.size != (w, h) for im in images):
        raise ValueError(f"tile_2x2 needs equal sizes, got {[im.size for im in images]}")
    grid = Image.new("RGB", (2 * w, 2 * h))
    for k, im in enumerate(images):
        grid.paste(im.convert("RGB"), ((k % 2) * w, (k // 2) * h))
    return grid


def split_2x2(image: Image.Image) -> list[Image.Image]:
    """Inverse of `tile_2x2`: the four tiles in row-major order (an odd last row/column is dropped)."""
    w, h = image.size[0] // 2, image.size[1] // 2
    return [image.crop((c * w, r * h, (c + 1) * w, (r + 1) * h)) for r in range(2) for c in range(2)]


# ---------------------------------------------------------------------------------------------
# VQA
# ---------------------------------------------------------------------------------------------


class VQA(Protocol):
    name: str

    def answer(self, image: Image.Image, question: str) -> str: ...


def is_yes(answer: str) -> bool:
    """DPG's scoring of a VQA answer: 1 for "yes" (case, spaces and punctuation ignored)."""
    words = re.findall(r"[a-z]+", answer.lower())
    return bool(words) and words[0] == "yes"


class VQAModel:
    """A transformers BLIP VQA model (`BlipForQuestionAnswering`) loaded from a local directory."""

    def __init__(self, model, processor, *, name: str, max_new_tokens: int = 10, batch_size: int = 16):
        self.model = model.eval()
        self.processor = processor
        self.name = name
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, *, device: str | torch.device = "cpu", **kwargs
    ) -> VQAModel:
        """Load e.g. a local copy of ``Salesforce/blip-vqa-base`` (config, weights, processor files)."""
        from transformers import BlipForQuestionAnswering, BlipProcessor

        path = Path(path)
        config_path = path / "config.json"
        if not config_path.is_file():
            raise UserError(f"{path}: not a model directory (no config.json)")
        config = read_json(config_path, dict[str, Any], follow=True)
        archs = config.get("architectures") or []
        if config.get("model_type") != "blip" or (archs and "BlipForQuestionAnswering" not in archs):
            raise UserError(
                f"{path}: unsupported VQA model ({config.get('model_type')}, {archs}); "
                "a BLIP VQA checkpoint (BlipForQuestionAnswering, e.g. Salesforce/blip-vqa-base) is required"
            )
        try:
            model = BlipForQuestionAnswering.from_pretrained(path, local_files_only=True)
            processor = BlipProcessor.from_pretrained(path, local_files_only=True)
        except OSError as e:
            raise UserError(f"{path}: cannot load the VQA model ({str(e).splitlines()[0]})") from None
        return cls(model.to(device), processor, name=path.name, **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def answer_batch(self, images: Sequence[Image.Image], questions: Sequence[str]) -> list[str]:
        """Answers for the pairs (images[i], questions[i]), in chunks of `batch_size`."""
        out: list[str] = []
        for s in range(0, len(images), self.batch_size):
            inputs = self.processor(
                images=[im.convert("RGB") for im in images[s : s + self.batch_size]],
                text=list(questions[s : s + self.batch_size]),
                return_tensors="pt",
                padding=True,
            ).to(self.device)
            ids = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens)
            out += [a.strip() for a in self.processor.batch_decode(ids, skip_special_tokens=True)]
        return out

    def answer(self, image: Image.Image, question: str) -> str:
        return self.answer_batch([image], [question])[0]


def _answers(vqa: VQA, images: list[Image.Image], questions: list[str]) -> list[str]:
    batch = getattr(vqa, "answer_batch", None)
    if callable(batch):
        return list(batch(images, questions))
    return [vqa.answer(im, q) for im, q in zip(images, questions)]


# ---------------------------------------------------------------------------------------------
# scoring
# ---------------------------------------------------------------------------------------------


def score_tile(answers_yes: dict[str, bool], questions: Sequence[DPGQuestion]) -> dict[str, float]:
    """Per-question scores of one tile: yes → 1, except 0 when any parent was answered "no"."""
    return {
        q.proposition_id: float(answers_yes[q.proposition_id] and all(answers_yes[p] for p in q.parents))
        for q in questions
    }


def score_dpg(
    images_by_item: Mapping[str, Image.Image | str | os.PathLike],
    questions: Sequence[DPGQuestion],
    vqa: VQA,
    *,
    progress: bool = True,
) -> dict:
    """DPG-Bench scores (docs/evaluation/dpg-bench.md) for 2×2 grids keyed by item_id (PIL
    images or paths to them).

    Returns {"label", "vqa_model", "score" (×100), "n_items", "n_missing" (items with questions but
    no image), "category_broad", "category_detailed" (×100), "per_item": {item: {"score" (×100),
    "tile_scores", "answers" [tile][question]}}}.
    """
    by_item: dict[str, list[DPGQuestion]] = {}
    for q in questions:
        by_item.setdefault(q.item_id, []).append(q)
    if not images_by_item:
        raise UserError("DPG-Bench: no images to score")
    unknown = sorted(set(images_by_item) - set(by_item))
    if unknown:
        raise UserError(
            f"DPG-Bench: {len(unknown)} image item(s) have no questions in the CSV (first: {unknown[0]})"
        )
    name = getattr(vqa, "name", type(vqa).__name__)
    per_item: dict[str, dict] = {}
    cat_broad: dict[str, list[float]] = {}
    cat_detailed: dict[str, list[float]] = {}
    for item in tqdm(sorted(images_by_item), desc="DPG-Bench score", unit="prompt", disable=not progress):
        grid = images_by_item[item]
        if not isinstance(grid, Image.Image):
            with Image.open(grid) as im:
                grid = im.convert("RGB")
        qs = by_item[item]
        tiles = split_2x2(grid)
        flat = _answers(vqa, [t for t in tiles for _ in qs], [q.question for _ in tiles for q in qs])
        tile_scores, answers = [], []
        for k in range(4):
            tile_answers = flat[k * len(qs) : (k + 1) * len(qs)]  # [Q] answers on tile k
            scores = score_tile({q.proposition_id: is_yes(a) for q, a in zip(qs, tile_answers)}, qs)
            tile_scores.append(float(np.mean(list(scores.values()))))
            answers.append(tile_answers)
            for q in qs:
                cat_broad.setdefault(q.category_broad, []).append(scores[q.proposition_id])
                cat_detailed.setdefault(q.category_detailed, []).append(scores[q.proposition_id])
        per_item[item] = {
            "score": 100 * float(np.mean(tile_scores)),
            "tile_scores": tile_scores,
            "answers": answers,
        }
    return {
        "label": f"DPG-Bench (proxy VQA: {name})",
        "vqa_model": name,
        "score": float(np.mean([v["score"] for v in per_item.values()])),
        "n_items": len(per_item),
        "n_missing": len(set(by_item) - set(per_item)),
        "category_broad": {c: 100 * float(np.mean(v)) for c, v in sorted(cat_broad.items())},
        "category_detailed": {c: 100 * float(np.mean(v)) for c, v in sorted(cat_detailed.items())},
        "per_item": per_item,
    }


def format_dpg_summary(result: dict) -> str:
    """A plain-text table of the overall and per-category scores."""
    lines = [result["label"], f"{'overall':<32}{result['score']:7.2f}  ({result['n_items']} prompts)"]
    if result.get("n_missing"):
        lines.append(f"{'':<32}({result['n_missing']} prompts of the CSV have no image)")
    for key in ("category_broad", "category_detailed"):
        lines.append(f"-- {key}")
        lines += [f"{c:<32}{s:7.2f}" for c, s in result[key].items()]
    return "\n".join(lines)


def dpg_image_paths(root: str | os.PathLike) -> dict[str, Path]:
    """`<root>/<item_id>.png` grids keyed by item_id."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root} is not a directory")
    return {p.stem: p for p in sorted(root.glob("*.png")) if not p.name.startswith(".")}


def score_dpg_folder(
    root: str | os.PathLike,
    csv_path: str | os.PathLike,
    vqa: VQA,
    out_dir: str | os.PathLike,
    *,
    items: Sequence[str] | None = None,
    progress: bool = True,
) -> dict:
    """Score `<root>/<item_id>.png` against `csv_path`; write results.jsonl (one row per prompt: ``key`` and
    ``item_id`` its item id, ``category`` "all", ``score`` ×100, ``tile_scores``,
    ``answers``), summary.txt/json.

    After a generation, pass its item ids as `items`: exactly those grids are scored, and a missing
    one or a stale grid of another run in `root` is a UserError."""
    questions = read_dpg_csv(csv_path)
    paths = dpg_image_paths(root)
    if items is not None:
        items = [str(i) for i in items]
        extra = sorted(set(paths) - set(items))
        if extra:
            raise UserError(
                f"{root} holds {len(extra)} grid(s) not of this run (first: {extra[0]}.png), left by another "
                "run; use --overwrite to regenerate, or another --out"
            )
        missing = [i for i in items if i not in paths]
        if missing:
            raise UserError(
                f"{root}: {missing[0]}.png is missing ({len(missing)} grid(s)); finish generation"
            )
        paths = {i: paths[i] for i in items}
    result = score_dpg(paths, questions, vqa, progress=progress)
    out_dir = Path(out_dir)
    # key, category and score: the fields every evaluation's rows share
    # (eval/records/paired.py); score ×100 as DPG's
    rows = "".join(
        json.dumps({"key": item, "category": "all", "item_id": item, **r}) + "\n"
        for item, r in result["per_item"].items()
    )
    write_file(out_dir / "results.jsonl", rows)
    summary = {k: v for k, v in result.items() if k != "per_item"}
    write_file(out_dir / "summary.txt", format_dpg_summary(result) + "\n")
    write_file(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return result


# ---------------------------------------------------------------------------------------------
# generation
# ---------------------------------------------------------------------------------------------


def _prompt_hash(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


class DpgRecord(TypedDict):
    """<root>/generation.json of DPG-Bench grids: the settings they were made with, each
    item's prompt hash."""

    settings: dict[str, str | int | float | bool | None]
    items: dict[str, str]


def check_dpg_resumable(
    root: str | os.PathLike, prompts: Sequence[dict], settings: dict | None, complete: bool = False
) -> None:
    """Refuse (UserError, one line) to generate into `root` unless its grids were made for this run's
    prompts (item id → same prompt text) with the same `settings` (only the keys given are compared;
    `complete`: the recorded ones too, `layout.settings_mismatch`), as recorded in
    `<root>/generation.json`, and no grid lies outside this run's items."""
    hint = "use --overwrite to regenerate, or another --out"
    grids = dpg_image_paths(root) if Path(root).is_dir() else {}
    record_path = Path(root) / SETTINGS_NAME
    if not record_path.is_file():
        if grids:
            raise UserError(
                f"{root} holds {len(grids)} grid(s) but no {SETTINGS_NAME} (written by another tool or an "
                f"older version), so how they were made is unknown; {hint}"
            )
        return
    try:
        record = read_json(record_path, DpgRecord)
    except UserError as e:
        raise UserError(f"{e}: not a generation record; {hint}") from None
    recorded, hashes = record["settings"], record["items"]
    why = settings_mismatch(recorded, settings or {}, complete)
    if why and grids:
        raise UserError(f"{root}: grids {why}; {hint}")
    wanted = {str(p["item_id"]): p["prompt"] for p in prompts}
    for item in sorted(set(grids) & set(wanted)):
        if hashes.get(item) != _prompt_hash(wanted[item]):
            raise UserError(f"{grids[item]} was made for another prompt than this run's {item}; {hint}")
    extra = sorted(set(grids) - set(wanted))
    if extra:
        raise UserError(
            f"{root} holds {len(extra)} grid(s) not among this run's {len(wanted)} prompt(s) "
            f"(first: {extra[0]}.png), left by another run; {hint}"
        )


def generate_dpg(
    policy: Policy,
    prompts: Sequence[dict],
    root: str | os.PathLike,
    sampling: SamplingParams | None = None,
    *,
    batch: int = 4,
    seed: int = 0,
    model: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> int:
    """Write 4 images per prompt as one 2×2 grid `<root>/<item_id>.png`; returns grids written.

    `prompts`: `{"item_id", "prompt"}` dicts (see `load_dpg_prompts`). `sampling`: as
    `geneval.image_sampling` builds it (None: the model's). `batch` prompts per
    ``policy.rollout`` call. `<root>/generation.json` records the settings (`model` identity, default
    the policy's class name; seed, CFG scale, temperature, top-k, and a masked model's steps / reveal
    order when given) and a hash of each item's prompt.
    Resumable: existing grids are kept when made for the same prompts and settings, else refused
    (UserError); ``overwrite=True`` removes the grids first. Prompt i samples from its own generator
    (seed, i), so a grid does not depend on `batch` or on its batch-mates.
    """
    if batch < 1:
        raise UserError(f"batch must be >= 1, got {batch}")
    for i, p in enumerate(prompts):
        if not isinstance(p, dict) or "item_id" not in p or "prompt" not in p:
            raise UserError(f"DPG prompt {i} needs 'item_id' and 'prompt'")
        if not _SAFE_ID.match(str(p["item_id"])):
            raise UserError(f"DPG item_id {p['item_id']!r} is not a safe file name")
    policy.check_prompts([p["prompt"] for p in prompts])
    root = Path(root)
    if sampling is None:
        sampling = image_sampling(policy)
    settings = image_settings(policy, model, seed, sampling, 4)
    if overwrite:
        for path in dpg_image_paths(root).values() if root.is_dir() else ():
            path.unlink()
    else:
        check_dpg_resumable(root, prompts, settings, complete=True)
    # recorded before any grid is written: this run's settings and prompts (a superset of the grids kept)
    atomic_write_json(
        root / SETTINGS_NAME,
        {"settings": settings, "items": {str(p["item_id"]): _prompt_hash(p["prompt"]) for p in prompts}},
    )
    written = 0
    bar = tqdm(total=len(prompts), desc="DPG-Bench generate", unit="prompt", disable=not progress)
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        paths = [root / f"{p['item_id']}.png" for p in chunk]
        todo = [not path.exists() for path in paths]
        bar.update(len(chunk) - sum(todo))
        if not any(todo):
            continue
        per_prompt = generate_images(
            policy,
            [p["prompt"] for p in chunk],
            4,
            sampling,
            group_generators(seed, "generate", range(start, start + len(chunk))),
        )
        for path, images, needed in zip(paths, per_prompt, todo):
            if needed:
                atomic_save_image(tile_2x2(images), path, within=root)
                written += 1
                bar.update(1)
    bar.close()
    return written


def dpg_protocol_fields(root: str | os.PathLike) -> dict[str, Any]:
    """The model, seeds and sampling the grids of `root` record in its generation.json (`protocol_record`'s
    fields; None each where the grids were made by another tool), 4 images per prompt."""
    path = Path(root) / SETTINGS_NAME
    record = None
    if path.is_file():
        try:
            record = read_json(path, DpgRecord)["settings"]
        except UserError:
            record = None
    out: dict[str, Any] = {"model": None, "seeds": None, "images_per_prompt": 4, "sampling": None}
    if record:
        from t2i_gcpo.eval.layout import SAMPLING_SETTINGS

        out["model"] = record.get("model")
        out["seeds"] = {"seed": record.get("seed"), "rule": "prompt i's images from (seed, 'generate', i)"}
        out["sampling"] = {k: record[k] for k in SAMPLING_SETTINGS if k in record}
    return out
