"""GenEval on real images (docs/evaluation/geneval.md): generate into GenEval's folder layout, then
score any such folder.

GenEval (Ghosh et al., 2023) asks 553 prompts (6 tags) for 4 images each, detects objects with
Mask2Former, classifies colours with CLIP, and checks counts, colours and positions against each
prompt's metadata. Scoring here takes any detector (PIL image → list[Detection]) and any colour
classifier with ``color_of(image)``; the rules live in t2i_gcpo/scoring/geneval_rules.py.

Outputs of `score_geneval_folder` (in ``out_dir``):
  results.jsonl   one line per image, fields as GenEval's results.jsonl (filename, tag, prompt,
                  correct, reason, metadata, details) plus ``partial``, the RL reward's partial
                  credit (docs/evaluation/geneval.md#geneval-as-a-reward, as training's held-out evaluation
                  reports it), and the fields every evaluation's rows share (eval/records/paired.py): ``key``
                  (prompt folder and sample, "00012/0003"), ``category`` (the tag) and ``score``
                  (1.0 correct, else 0.0)
  summary.txt     GenEval's per-tag table and the overall score
  summary.json    the same numbers as JSON
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import torch
from PIL import Image
from tqdm.auto import tqdm

from t2i_gcpo.errors import UserError
from t2i_gcpo.eval.layout import (
    check_resumable,
    clear_layout,
    existing_samples,
    folder_images,
    generation_settings,
    iter_layout,
    metadata_mismatch,
    prompt_folders,
    read_metadata,
    write_prompt_folder,
)
from t2i_gcpo.outdir import parse_json, write_file
from t2i_gcpo.policies.base import Policy, PromptRecord, SamplingParams
from t2i_gcpo.policies.maskgen import check_reveal_order
from t2i_gcpo.policies.sampling import resolve_guidance_scale
from t2i_gcpo.scoring import geneval_rules
from t2i_gcpo.scoring.detections import Detection
from t2i_gcpo.tasks.loop import group_generators, sample_and_decode

Detector = Callable[[Image.Image], list[Detection]]


class ColorClassifier(Protocol):
    def color_of(self, image: Image.Image) -> Callable[[Detection], str]: ...


def load_geneval_prompts() -> list[dict]:
    """The 553 official GenEval prompts with metadata (package data geneval/evaluation_metadata.jsonl)."""
    path = resources.files("t2i_gcpo") / "data" / "geneval" / "evaluation_metadata.jsonl"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"package data is missing: {path} (reinstall t2i-gcpo)") from None
    return [parse_json(line, f"{path}:{i + 1}") for i, line in enumerate(text.splitlines()) if line.strip()]


# ---------------------------------------------------------------------------------------------
# generation
# ---------------------------------------------------------------------------------------------


def tensor_to_pil(images: torch.Tensor) -> list[Image.Image]:
    """[B, 3, H, W] floats in [0, 1] → B RGB PIL images."""
    arr = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    arr = arr.permute(0, 2, 3, 1).cpu().numpy()  # [B, H, W, 3]
    return [Image.fromarray(a) for a in arr]


@torch.no_grad()
def generate_images(
    policy: Policy,
    prompts: list[str],
    n: int,
    sampling: SamplingParams,
    generators: Sequence[torch.Generator],
) -> list[list[Image.Image]]:
    """`n` images per prompt from one rollout: result[i] holds prompt i's images, drawn with
    generators[i] (see `t2i_gcpo.tasks.loop`: a prompt's images do not depend on its batch-mates)."""
    _, outputs = sample_and_decode(policy, [PromptRecord(p) for p in prompts], n, sampling, generators)
    images = tensor_to_pil(outputs)  # rows grouped: prompt 0's n samples first
    if len(images) != n * len(prompts):
        raise RuntimeError(f"policy returned {len(images)} images for {len(prompts)} prompts × {n}")
    return [images[i * n : (i + 1) * n] for i in range(len(prompts))]


def masked_asked(steps: int | None, reveal_order: str | None) -> dict[str, Any]:
    """The masked-decoding settings asked for, only those given (--steps, --reveal-order)."""
    return {k: v for k, v in (("steps", steps), ("reveal_order", reveal_order)) if v is not None}


def masked_sampling(
    policy: Policy, steps: int | None = None, reveal_order: str | None = None
) -> dict[str, Any]:
    """The decoding steps and reveal order asked of a masked model, only those given (SamplingParams
    fields, also recorded with the images); UserError for a model that does not decode in steps."""
    asked = masked_asked(steps, reveal_order)
    if asked and policy.default_sampling().steps is None:
        flags = " and ".join("--" + k.replace("_", "-") for k in asked)
        verb = "apply" if len(asked) > 1 else "applies"
        raise UserError(
            f"{flags} {verb} to masked models only (MaskGIT, aMUSEd); this model decodes token by token"
        )
    if steps is not None and steps < 1:
        raise UserError(f"steps must be >= 1, got {steps}")
    if reveal_order is not None:
        check_reveal_order(reveal_order)
    return asked


def image_sampling(
    policy: Policy,
    *,
    cfg_scale: float | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    steps: int | None = None,
    reveal_order: str | None = None,
) -> SamplingParams:
    """How `generate`, `sample` and the eval commands sample images, built once from the flags: for the
    ones left out (`cfg_scale`, `steps`, `reveal_order` None), the model's (its guidance scale; its own
    steps and reveal order, left None) — never a resumed folder's: one made otherwise is refused, naming
    the flag that continues it (`layout.settings_mismatch`). UserError for steps or a reveal order asked
    of a model that does not decode in steps."""
    return SamplingParams(
        temperature=temperature,
        top_k=top_k,
        guidance_scale=resolve_guidance_scale(policy, cfg_scale),
        **masked_sampling(policy, steps, reveal_order),
    )


def image_settings(policy: Policy, model: str | None, seed: int, sampling: SamplingParams, n: int) -> dict:
    """The settings recorded with generated images (see `generation_settings`), a masked model's steps
    and reveal order when they were asked for. `model` defaults to the policy's class name."""
    settings = generation_settings(
        model or type(policy).__name__,
        seed=seed,
        cfg_scale=sampling.guidance_scale,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        n=n,
    )
    return settings | masked_asked(sampling.steps, sampling.reveal_order)


def generate_geneval(
    policy: Policy,
    metadata_list: Sequence[dict],
    root: str | os.PathLike,
    sampling: SamplingParams | None = None,
    *,
    n: int = 4,
    batch: int = 4,
    seed: int = 0,
    model: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> int:
    """Generate `n` images per prompt into GenEval's layout under `root`; returns images written.

    `sampling`: as `image_sampling` builds it (None: the model's). `batch` prompts go to one
    ``policy.rollout`` call (batch × n images). Each prompt folder records the settings (`model`, an identity
    such as `layout.model_identity(--model)`, default the policy's class name; seed, CFG scale, temperature,
    top-k, n, and a masked model's steps / reveal order when given) in generation.json. Resumable: prompts
    that already have `n` samples are skipped, and a partly written batch is regenerated with the same
    generators (prompt i's is seeded by (seed, "generate", i)), only its missing files being written. Resuming
    is refused (UserError) when a folder under `root` holds another prompt or was made with other settings,
    or lies beyond this run's prompts; ``overwrite=True`` removes all prompt folders first instead.
    """
    if n < 1 or batch < 1:
        raise UserError(f"n and batch must be >= 1 (got n={n}, batch={batch})")
    for i, m in enumerate(metadata_list):
        if not isinstance(m, dict) or "prompt" not in m:
            raise UserError(f"GenEval metadata {i} has no 'prompt'")
    policy.check_prompts([m["prompt"] for m in metadata_list])
    if sampling is None:
        sampling = image_sampling(policy)
    settings = image_settings(policy, model, seed, sampling, n)
    if overwrite:
        clear_layout(root)
    else:
        check_resumable(root, metadata_list, settings, complete=True)
    written = 0
    bar = tqdm(total=len(metadata_list) * n, desc="GenEval generate", unit="img", disable=not progress)
    for start in range(0, len(metadata_list), batch):
        idx = list(range(start, min(start + batch, len(metadata_list))))
        have = {i: existing_samples(root, i) for i in idx}
        todo = [i for i in idx if have[i] < n]
        bar.update(sum(min(have[i], n) for i in idx))
        if not todo:
            continue
        per_prompt = generate_images(
            policy,
            [metadata_list[i]["prompt"] for i in idx],
            n,
            sampling,
            group_generators(seed, "generate", idx),
        )
        for i, images in zip(idx, per_prompt):
            if i in todo:
                write_prompt_folder(
                    root, i, metadata_list[i], images[have[i] :], start=have[i], settings=settings
                )
                written += n - have[i]
                bar.update(n - have[i])
    bar.close()
    return written


# ---------------------------------------------------------------------------------------------
# scoring
# ---------------------------------------------------------------------------------------------


def _details(detections: list[Detection], colors: dict[int, str]) -> dict[str, list[dict]]:
    """Per class: the detections' boxes, scores and (when it was classified) colour."""
    out: dict[str, list[dict]] = {}
    for d in detections:
        item = {"bbox": [round(float(v), 2) for v in d.box], "score": round(float(d.score), 4)}
        color = colors.get(id(d), d.color)
        if color is not None:
            item["color"] = color
        out.setdefault(d.cls, []).append(item)
    return out


def score_image(
    image: Image.Image, metadata: dict, detector: Detector, color_classifier: ColorClassifier | None
) -> tuple[geneval_rules.ImageResult, float, dict[str, list[dict]]]:
    """GenEval's verdict on one image, its partial credit (docs/evaluation/geneval.md#geneval-as-a-reward),
    and the detections (with the colours asked for) as details."""
    detections = detector(image)
    colors: dict[int, str] = {}  # id(detection) → colour, for the details of the colours asked for
    classify = color_classifier.color_of(image) if color_classifier is not None else None

    def classify_once(d: Detection) -> str:  # one classification per object for both rule sets
        if id(d) not in colors:
            colors[id(d)] = classify(d)
        return colors[id(d)]

    color_of = classify_once if classify else None
    result = geneval_rules.evaluate_detections(metadata, detections, color_of)
    partial = geneval_rules.reward_detections(metadata, detections, color_of).partial
    return result, float(partial), _details(detections, colors)


def run_entries(
    root: str | os.PathLike,
    metadata_list: Sequence[dict],
    n: int | None,
    keys: Sequence[str] = ("tag", "prompt", "include"),
) -> list[tuple[int, dict, list[Path]]]:
    """`iter_layout` restricted to, and checked against, one run's prompts (whose metadata hold `keys`)."""
    folders = prompt_folders(root)
    extra = sorted(i for i in folders if i >= len(metadata_list))
    if extra:
        raise UserError(
            f"{root} holds {len(extra)} prompt folder(s) beyond this run's {len(metadata_list)} prompt(s) "
            f"(first: {folders[extra[0]].name}); use --overwrite to regenerate, or another --out"
        )
    entries = []
    for i, wanted in enumerate(metadata_list):
        folder = folders.get(i)
        if folder is None:
            raise UserError(f"{root}: prompt folder {i:05d} is missing; finish generation")
        metadata = read_metadata(folder, keys)
        why = metadata_mismatch(folder, metadata, wanted)
        if why:
            raise UserError(f"{why}; use --overwrite to regenerate, or another --out")
        images = folder_images(folder)
        if n is not None and images and len(images) != n:
            raise UserError(f"{folder} holds {len(images)} image(s), this run makes {n} per prompt")
        entries.append((i, metadata, images))
    return entries


def score_geneval_folder(
    root: str | os.PathLike,
    detector: Detector,
    color_classifier: ColorClassifier | None,
    out_dir: str | os.PathLike,
    *,
    metadata_list: Sequence[dict] | None = None,
    n: int | None = None,
    progress: bool = True,
) -> dict:
    """Score every image of the GenEval-layout folder `root`; write results and summary to `out_dir`.

    `detector`: PIL image → list[Detection] (e.g. `Mask2FormerDetector`); `color_classifier`: has
    ``color_of(image)`` (e.g. `ClipColorClassifier`), or None to use `Detection.color`. Returns the
    summary dict of `geneval_rules.summarize` (per-tag scores and the overall mean of the tags).

    After a generation, pass its `metadata_list` (and images per prompt `n`): the folder must then hold
    exactly those prompts, in order (and `n` images each); anything else is a UserError, so a stale
    folder left by another run is never scored.
    """
    entries = list(iter_layout(root)) if metadata_list is None else run_entries(root, metadata_list, n)
    empty = [f"{i:05d}" for i, _, paths in entries if not paths]
    if empty:
        raise UserError(
            f"{root}: {len(empty)} prompt folder(s) have no images (first: {empty[0]}); finish generation"
        )
    out_dir = Path(out_dir)
    by_tag: dict[str, list[bool]] = {}
    rows: list[str] = []
    n_images = sum(len(paths) for _, _, paths in entries)
    with tqdm(total=n_images, desc="GenEval score", unit="img", disable=not progress) as bar:
        for index, metadata, paths in entries:
            for path in paths:
                with Image.open(path) as im:
                    image = im.convert("RGB")
                result, partial, details = score_image(image, metadata, detector, color_classifier)
                by_tag.setdefault(metadata["tag"], []).append(bool(result.correct))
                record = {
                    # the prompt and sample: the same in every model's folder
                    "key": f"{index:05d}/{path.stem}",
                    "category": metadata["tag"],
                    "score": float(bool(result.correct)),
                    "filename": str(path),
                    "tag": metadata["tag"],
                    "prompt": metadata["prompt"],
                    "correct": bool(result.correct),
                    "partial": partial,
                    "reason": result.reason,
                    "metadata": json.dumps(metadata),
                    "details": json.dumps(details),
                }
                rows.append(json.dumps(record) + "\n")
                bar.update(1)
    write_file(out_dir / "results.jsonl", "".join(rows))  # whole, never through a link
    summary = geneval_rules.summarize(by_tag)
    write_file(out_dir / "summary.txt", geneval_rules.format_summary(summary) + "\n")
    write_file(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary
