"""`t2i-gcpo sample`: images for a prompt file, in GenEval's folder layout."""

from __future__ import annotations

import os

import click

from t2i_gcpo.commands.options import cfg_option, lock_out, masked_sampling_options


@click.command("sample")
@click.option(
    "--prompts",
    "prompts_path",
    required=True,
    type=click.Path(dir_okay=False),
    help=".txt or .jsonl prompt file.",
)
@click.option("--out", required=True, help="Output folder.")
@click.option(
    "--model",
    default="shapeworld",
    show_default=True,
    help="'shapeworld' (AR), 'shapeworld-64', 'shapeworld-masked', a checkpoint dir, 'masked:PATH', 'amused:PATH', "
    "'janus:PATH'.",
)
@click.option(
    "--n", "n_images", default=4, show_default=True, type=click.IntRange(min=1), help="Images per prompt."
)
@cfg_option(help="CFG scale s [default: the checkpoint's].")
@click.option("--temperature", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(min=0), help="0 = no truncation.")
@masked_sampling_options
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--grid-scale", default=4, show_default=True, type=click.IntRange(min=1), help="Upscaling of grid.png."
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Regenerate: delete the prompt folders (OUT/00000/, …) already in OUT first. Without it, a run "
    "resumes only into folders made for the same prompts, model, seed, CFG, temperature, top-k, --n (and "
    "masked --steps / --reveal-order).",
)
def sample_cmd(
    prompts_path: str,
    out: str,
    model: str,
    n_images: int,
    cfg_scale: float | None,
    temperature: float,
    top_k: int,
    steps: int | None,
    reveal_order: str | None,
    seed: int,
    grid_scale: int,
    overwrite: bool,
) -> None:
    """Sample images for every prompt of a prompt file.

    Writes GenEval's layout at native resolution (OUT/00000/metadata.jsonl,
    OUT/00000/samples/0000.png, …, and OUT/00000/generation.json, the settings) and OUT/grid.png
    (each prompt's images side by side, several prompts per row, upscaled ×--grid-scale with nearest
    neighbour). Resumable: written images are kept when OUT was made for the same prompts and
    settings; otherwise the run stops with an error (--overwrite regenerates). Every prompt must fit
    the task's templates; nothing is written otherwise.

    \b
    Example:
      t2i-gcpo sample --prompts prompts/shapeworld_test.txt --out samples/ --n 4 --cfg 3
      t2i-gcpo sample --model shapeworld-masked --steps 16 --prompts prompts/shapeworld_test.txt --out masked16/
    """
    import numpy as np
    from PIL import Image

    from t2i_gcpo.errors import check_writable_dir
    from t2i_gcpo.eval.geneval import generate_geneval
    from t2i_gcpo.eval.layout import model_identity, sample_path
    from t2i_gcpo.policies.registry import load_policy
    from t2i_gcpo.resources import prompt_file
    from t2i_gcpo.tasks.registry import get_task
    from t2i_gcpo.train.visuals import image_grid
    from t2i_gcpo.worlds.shapeworld import read_prompt_file

    out_dir = check_writable_dir(out, "--out")  # before loading anything
    prompts_path = prompt_file(prompts_path)  # the user's file, else the shipped one it names
    lock_out(out_dir)
    texts = [m["prompt"] for m in read_prompt_file(prompts_path, strict=False)]
    policy = load_policy(model).eval()
    policy.check_prompts(texts)  # every word the model cannot take, at once
    # every prompt parsed into GenEval metadata (the parser's error names file and line) before writing
    metadata = [p.meta for p in get_task(policy.default_task).load_prompts(prompts_path)]
    # --cfg, --steps, --reveal-order left out: a resumed folder's recorded values, else the model's
    generate_geneval(policy, metadata, out_dir, n=n_images, batch=max(1, 64 // n_images), cfg_scale=cfg_scale,
                     temperature=temperature, top_k=top_k, steps=steps, reveal_order=reveal_order, seed=seed,
                     model=model_identity(model),
                     overwrite=overwrite)  # fmt: skip
    images = np.stack(
        [
            np.asarray(Image.open(sample_path(out_dir, i, k)).convert("RGB"))
            for i in range(len(metadata))
            for k in range(n_images)
        ]
    )
    cols = min(len(images), n_images * max(1, 16 // n_images))  # whole groups per row, ≈ 16 images wide
    Image.fromarray(image_grid(images, cols=cols, scale=grid_scale)).save(os.path.join(out, "grid.png"))
    click.echo(f"wrote {len(metadata)} × {n_images} images to {out}/ (grid: {os.path.join(out, 'grid.png')})")
