"""`t2i-gcpo sample`: images for a prompt file, in GenEval's folder layout."""

from __future__ import annotations

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
    OUT/00000/samples/0000.png, …) and OUT/grid.png (one row per prompt, each image framed by
    a 1-pixel dark line, upscaled ×--grid-scale with nearest neighbour).

    \b
    Example:
      t2i-gcpo sample --prompts prompts/shapeworld_test.txt --out samples/ --n 4 --cfg 3
    """
    import json
    import os

    import numpy as np
    import torch
    from PIL import Image
    from tqdm.auto import tqdm

    from t2i_gcpo.policies.ar import load_policy
    from t2i_gcpo.worlds.shapeworld import read_prompt_file

    metadata = read_prompt_file(prompts_path, strict=False)
    policy = load_policy(model)
    policy.check_prompts([m["prompt"] for m in metadata])  # fail before sampling anything
    s = float(policy.config.default_cfg_scale) if cfg_scale is None else cfg_scale
    gen = torch.Generator().manual_seed(seed)
    rows = []
    per_batch = max(1, 64 // n_images)
    for start in tqdm(range(0, len(metadata), per_batch), desc="sample"):
        chunk = metadata[start : start + per_batch]
        rollout = policy.rollout([m["prompt"] for m in chunk], n_images, s, temperature, top_k, gen)
        images = (policy.decode(rollout).permute(0, 2, 3, 1).cpu().numpy() * 255).round().astype(np.uint8)
        for j, meta in enumerate(chunk):
            folder = os.path.join(out, f"{start + j:05d}")
            os.makedirs(os.path.join(folder, "samples"), exist_ok=True)
            with open(os.path.join(folder, "metadata.jsonl"), "w") as f:
                f.write(json.dumps(meta) + "\n")
            group = images[j * n_images : (j + 1) * n_images]  # [n, H, W, 3]
            for k, img in enumerate(group):
                Image.fromarray(img).save(os.path.join(folder, "samples", f"{k:04d}.png"))
            framed = np.pad(group, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=64)  # 1 px dark frame
            rows.append(np.concatenate(list(framed), axis=1))  # [H+2, n·(W+2), 3]
    grid = Image.fromarray(np.concatenate(rows, axis=0))
    grid = grid.resize((grid.width * grid_scale, grid.height * grid_scale), Image.NEAREST)
    grid.save(os.path.join(out, "grid.png"))
    click.echo(f"wrote {len(metadata)} × {n_images} images to {out}/ (grid: {os.path.join(out, 'grid.png')})")
