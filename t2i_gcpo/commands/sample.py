"""`t2i-gcpo sample`: images for a prompt file, in GenEval's folder layout."""

from __future__ import annotations

import click

from t2i_gcpo.commands.options import (
    cfg_option,
    config_value,
    images_option,
    masked_sampling_options,
    seed_option,
)
from t2i_gcpo.policies.registry import models_help


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
    help=models_help() + ".",
)
@images_option("n_images")
@cfg_option(help="CFG scale s [default: the checkpoint's].")
@click.option(
    "--temperature", default=1.0, show_default=True, type=float, callback=config_value("rollout.temperature")
)
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(min=0), help="0 = no truncation.")
@masked_sampling_options
@seed_option
@click.option(
    "--grid-scale", default=4, show_default=True, type=click.IntRange(1, 32), help="Upscaling of grid.png."
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
    settings (an option left out means the model's default, not what OUT was made with); otherwise the
    run stops with an error naming the setting (--overwrite regenerates). Every prompt must fit
    the task's templates; nothing is written otherwise.

    \b
    Example:
      t2i-gcpo sample --prompts prompts/shapeworld_test.txt --out samples/ --n 4 --cfg 3
      t2i-gcpo sample --model shapeworld-masked --steps 16 --prompts prompts/shapeworld_test.txt \\
          --out masked16/
    """
    from pathlib import Path

    from t2i_gcpo.api import sample

    # a Path is a file, never a prompt
    result = sample(
        Path(prompts_path),
        out,
        model,
        n_images,
        cfg_scale=cfg_scale,
        temperature=temperature,
        top_k=top_k,
        steps=steps,
        reveal_order=reveal_order,
        seed=seed,
        grid_scale=grid_scale,
        overwrite=overwrite,
    )
    kept = len(result.prompts) * n_images - result.written
    made = f"wrote {result.written} image(s)" + (
        f", kept {kept} made earlier with the same settings," if kept else ""
    )
    click.echo(
        f"{made} to {Path(out)}/ ({len(result.prompts)} prompts × {n_images}; grid: {Path(out) / 'grid.png'})"
    )
