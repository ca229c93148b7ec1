"""Generate images from Python, write them in GenEval's layout, and score the model on ShapeWorld.

    python examples/sample_and_evaluate.py [OUT]             # default OUT: runs/example-sample

`generate` returns the images in memory; `sample` writes the same images (same seed, same settings)
as files; `evaluate_shapeworld` scores held-out prompts with the ShapeWorld detector and GenEval's rules.
"""

import sys
from pathlib import Path

from t2i_gcpo import api


def main(out: str = "runs/example-sample") -> None:
    prompts = ["a photo of a red circle", "a photo of a circle left of a square"]
    images = api.generate("shapeworld", prompts, n=4, seed=0)  # [2, 4, 3, H, W] in [0, 1]
    print(f"generated {tuple(images.shape)} images, mean red {images[:, :, 0].mean():.3f}")

    written = api.sample(prompts, Path(out) / "samples", model="shapeworld", n=4, seed=0)
    print(f"wrote {written.image_paths(0)[0]} …, grid {written.grid}")

    # held-out prompts: here a list of four; by default the shipped prompts/shapeworld_test.jsonl
    held_out = prompts + ["a photo of three yellow crosses", "a photo of a triangle above a bar"]
    summary = api.evaluate_shapeworld(Path(out) / "eval", "shapeworld", held_out, n=4, seed=0)
    print(f"ShapeWorld strict score {summary['overall']:.3f} over {len(held_out)} prompts × 4 images")


if __name__ == "__main__":
    main(*sys.argv[1:])
