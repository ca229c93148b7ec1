"""`t2i-gcpo sample`: images for a prompt file, in GenEval's folder layout."""

from __future__ import annotations

import os

import click


@click.command("sample")
@click.option(
    "--prompts",
    "prompts_path",
    required=True,
    type=click.Path(dir_okay=False),
    help=".txt or .jsonl prompt file.",
)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option(
    "--model", default="shapeworld", show_default=True, help='"shapeworld" (shipped) or a checkpoint folder.'
)
@click.option(
    "--n", "n_images", default=4, show_default=True, type=click.IntRange(min=1), help="Images per prompt."
)
@click.option("--cfg", "cfg_scale", default=None, type=float, help="CFG scale s [default: the checkpoint's].")
@click.option("--temperature", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(min=0), help="0 = no truncation.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--grid-scale", default=4, show_default=True, type=click.IntRange(min=1), help="Upscaling of grid.png."
)
def sample_cmd(
    prompts_path: str,
    out: str,
    model: str,
    n_images: int,
    cfg_scale: float | None,
    temperature: float,
    top_k: int,
    seed: int,
    grid_scale: int,
) -> None:
    """Sample images for every prompt of a prompt file.

    Writes GenEval's layout at native resolution (OUT/00000/metadata.jsonl,
    OUT/00000/samples/0000.png, …; resumable: written images are kept) and OUT/grid.png (each
    prompt's images side by side, several prompts per row, upscaled ×--grid-scale with nearest
    neighbour).

    \b
    Example:
      t2i-gcpo sample --prompts prompts/shapeworld_test.txt --out samples/ --n 4 --cfg 3
    """
    import numpy as np
    from PIL import Image

    from t2i_gcpo.eval.geneval import generate_geneval
    from t2i_gcpo.eval.layout import iter_layout
    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.train.visuals import image_grid
    from t2i_gcpo.worlds.shapeworld import read_prompt_file

    metadata = read_prompt_file(prompts_path, strict=False)
    policy = load_policy(model).eval()
    policy.check_prompts([m["prompt"] for m in metadata])  # fail before sampling anything
    s = policy.default_sampling().guidance_scale if cfg_scale is None else cfg_scale
    generate_geneval(policy, metadata, out, n=n_images, batch=max(1, 64 // n_images), cfg_scale=s,
                     temperature=temperature, top_k=top_k, seed=seed)  # fmt: skip
    images = np.stack(
        [np.asarray(Image.open(p).convert("RGB")) for _, _, paths in iter_layout(out) for p in paths]
    )
    cols = min(len(images), n_images * max(1, 16 // n_images))  # whole groups per row, ≈ 16 images wide
    Image.fromarray(image_grid(images, cols=cols, scale=grid_scale)).save(os.path.join(out, "grid.png"))
    click.echo(f"wrote {len(metadata)} × {n_images} images to {out}/ (grid: {os.path.join(out, 'grid.png')})")
