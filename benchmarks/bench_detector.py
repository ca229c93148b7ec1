"""How well does the ShapeWorld detector read scenes back (docs/worlds/shapeworld.md)?

Renders random scenes for all six GenEval tags and counts an image as right when the detections
above GenEval's 0.3 threshold are exactly the scene's objects (class + colour, with multiplicity).
Also reports GenEval's strict verdict per tag, the per-shape confusion, and ms per image (warm-up
excluded). Conditions: clean renders; optionally after a Gaussian blur + noise (`--blur SIGMA`, a
stand-in for a VQ round trip) and after a real VQ round trip (`--vq PATH`, a saved VQTokenizer).

    python benchmarks/bench_detector.py                        # clean, 1 000 scenes
    python benchmarks/bench_detector.py --vq t2i_gcpo/assets/shapeworld/vq --blur 1.0

Targets: ≥ 99 % images right on clean renders, ≥ 95 % after a VQ round trip.
Writes benchmarks/results/detector.json.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from t2i_gcpo.scoring.geneval_rules import evaluate_detections
from t2i_gcpo.worlds.shapeworld import SHAPES, TAGS, generate_metadata, render, sample_scene
from t2i_gcpo.worlds.shapeworld.detect import detect

RESULTS = Path(__file__).parent / "results" / "detector.json"


def blur_and_noise(images: np.ndarray, sigma: float, seed: int, noise: float = 5.0) -> np.ndarray:
    """Gaussian blur (σ px) + pixel noise + a global colour shift per image; uint8 [N, H, W, 3]."""
    rng = np.random.default_rng(seed)
    r = int(np.ceil(3 * sigma))
    k = np.exp(-(np.arange(-r, r + 1) ** 2) / (2 * sigma**2))
    k /= k.sum()
    N, H, W, _ = images.shape
    f = np.pad(images.astype(np.float64), ((0, 0), (r, r), (r, r), (0, 0)), mode="edge")
    f = sum(k[i] * f[:, i : i + H] for i in range(2 * r + 1))
    f = sum(k[i] * f[:, :, i : i + W] for i in range(2 * r + 1))
    f = f + rng.normal(0, noise, f.shape) + rng.normal(0, noise, (N, 1, 1, 3))
    return np.clip(np.round(f), 0, 255).astype(np.uint8)


def vq_round_trip(images: np.ndarray, path: str, batch: int = 64) -> np.ndarray:
    """encode → decode with a saved VQTokenizer; uint8 [N, H, W, 3] in and out."""
    import torch

    from t2i_gcpo.tokenizers.vq import VQTokenizer

    vq = VQTokenizer.from_pretrained(path).eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(images), batch):
            x = torch.from_numpy(images[i : i + batch]).permute(0, 3, 1, 2).float() / 255  # [B, 3, H, W]
            y = vq.decode(vq.encode(x)).clamp(0, 1)
            out.append((y * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy())
    return np.concatenate(out)


def measure(images: np.ndarray, scenes: list, metadata: list[dict], warmup: int = 10) -> dict:
    """Image accuracy, GenEval strict per tag, per-shape confusion and ms per image."""
    for img in images[:warmup]:
        detect(img)
    right, strict = Counter(), Counter()
    total = Counter(m["tag"] for m in metadata)
    confusion: dict[str, Counter] = defaultdict(Counter)  # true shape → detected class (nearest box)
    t0 = time.perf_counter()
    all_dets = [detect(img) for img in images]
    ms = (time.perf_counter() - t0) / len(images) * 1000
    for img_dets, objs, meta in zip(all_dets, scenes, metadata):
        kept = [d for d in img_dets if d.score > 0.3]
        tag = meta["tag"]
        right[tag] += sorted((d.cls, d.color) for d in kept) == sorted((o.shape, o.color) for o in objs)
        strict[tag] += evaluate_detections(meta, img_dets).correct
        for o in objs:
            cx, cy = o.cx * img.shape[1], o.cy * img.shape[0]
            near = [d for d in kept if d.box[0] <= cx <= d.box[2] and d.box[1] <= cy <= d.box[3]]
            confusion[o.shape][near[0].cls if near else "missed"] += 1
    return {
        "images": len(images),
        "images_right": sum(right.values()) / len(images),
        "images_right_per_tag": {t: right[t] / total[t] for t in TAGS if total[t]},
        "geneval_strict_per_tag": {t: strict[t] / total[t] for t in TAGS if total[t]},
        "geneval_strict_overall": float(np.mean([strict[t] / total[t] for t in TAGS if total[t]])),
        "confusion": {s: dict(confusion[s]) for s in SHAPES},
        "ms_per_image": ms,
    }


def table(name: str, r: dict) -> str:
    lines = [f"== {name}: {r['images']} images, {r['ms_per_image']:.1f} ms/image"]
    lines.append(f"{'tag':<14} {'right':>8} {'GenEval':>8}")
    for t in r["images_right_per_tag"]:
        lines.append(f"{t:<14} {r['images_right_per_tag'][t]:>8.2%} {r['geneval_strict_per_tag'][t]:>8.2%}")
    lines.append(f"{'all':<14} {r['images_right']:>8.2%} {r['geneval_strict_overall']:>8.2%}")
    for s, c in r["confusion"].items():
        n = sum(c.values())
        lines.append(f"  {s:<9} recall {c.get(s, 0) / max(n, 1):.2%}  {dict(c)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description="ShapeWorld detector accuracy")
    ap.add_argument("--n", type=int, default=1000, help="scenes (prompts drawn over all six tags)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--vq", default=None, help="saved VQTokenizer folder: also measure after a round trip")
    ap.add_argument("--blur", type=float, default=None, help="also measure after Gaussian blur σ + noise")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)

    metadata = generate_metadata(args.n, args.seed)
    rng = np.random.default_rng(args.seed)
    scenes = [sample_scene(m, rng, args.size) for m in metadata]
    clean = np.stack([render(s, args.size) for s in scenes])  # [N, H, W, 3]
    results = {"config": vars(args), "clean": measure(clean, scenes, metadata)}
    print(table("clean renders", results["clean"]))
    if args.blur:
        results["blur"] = measure(blur_and_noise(clean, args.blur, args.seed), scenes, metadata)
        print(table(f"blur σ={args.blur} + noise", results["blur"]))
    if args.vq:
        rec = vq_round_trip(clean, args.vq)
        results["vq"] = measure(rec, scenes, metadata)
        results["vq"]["mean_abs_error"] = float(np.abs(rec.astype(int) - clean).mean())
        print(table(f"VQ round trip ({args.vq})", results["vq"]))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    main()
