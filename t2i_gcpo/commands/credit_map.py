"""`t2i-gcpo credit-map`: where on the image (or on which tokens of a text) each credit scheme puts a
sample's credit."""

from __future__ import annotations

import click

from t2i_gcpo.commands.options import cfg_option, config_value, seed_option
from t2i_gcpo.core.schemes import CREDIT_SCHEMES
from t2i_gcpo.policies.registry import models_help

EXAMPLES = """
\b
Examples:
  t2i-gcpo credit-map --prompt "a photo of a red circle left of a square" --out maps/
  t2i-gcpo credit-map --prompts prompts/shapeworld_test.txt --limit 50 --out maps-lift/  # + credit lift
  t2i-gcpo credit-map --prompt "a photo of three crosses" --model runs/gcpo-…/checkpoints/step_000300/model \\
      --reference shapeworld --schemes gcpo,dgpo --out maps-run/
  t2i-gcpo credit-map --model arithmetic --prompts prompts/arithmetic_test.jsonl --limit 20 \\
      --out maps-text/  # + step lift
  t2i-gcpo credit-map --model arithmetic --prompt "12+7*3=?" --negative wrong_answer --out maps-wrong/
"""


@click.command("credit-map", epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--prompt", "prompt_texts", multiple=True, help="A prompt (repeatable).")
@click.option("--prompts", "prompt_file", type=str, default=None, help="Prompt file (.txt or .jsonl).")
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Use only the first N prompts of --prompts."
)
@click.option(
    "--model",
    default="shapeworld",
    show_default=True,
    help=models_help() + ".",
)
@click.option(
    "--reference", default=None, help="Reference policy for DGPO [default: the shipped base model]."
)
@click.option(
    "--schemes",
    default=None,
    metavar="NAMES",
    help=f"Comma-separated credit schemes: {', '.join(CREDIT_SCHEMES)} (critical = Group Critical-token "
    f"PO, not GCPO), or your own as path/to/file.py:function  [default: all of them]",
)
@click.option(
    "--group",
    "group_size",
    type=int,
    default=8,
    show_default=True,
    callback=config_value("rollout.group_size"),
    help="Samples per prompt (G).",
)
@cfg_option(help="CFG scale [default: the training default].")
@click.option(
    "--negative",
    default=None,
    help=(
        "Text models: GCPO's negative context, 'empty', 'wrong_answer' or a {question} template "
        "[default: empty]."
    ),
)
@click.option("--reward", default=None, help="Reward spec, as for train [default: the task's own].")
@seed_option
@click.option("--out", required=True, help="Output directory (PNG per prompt, credit_maps.html, lift.json).")
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace the maps in OUT made with other settings (without it, OUT takes only maps of the same "
    "prompts, model, schemes and settings, which are drawn again).",
)
def credit_map_cmd(
    prompt_texts,
    prompt_file,
    limit,
    model,
    reference,
    schemes,
    group_size,
    cfg_scale,
    negative,
    reward,
    seed,
    out,
    overwrite,
):
    """Sample a group per prompt, score it, and draw every sample's token weights under each scheme.

    Writes one PNG per prompt and one self-contained HTML page; with ShapeWorld it also prints the
    credit lift of each scheme (share of credit on tokens covering the prompt's objects over the share of
    such tokens; uniform credit = 1).
    """
    from pathlib import Path

    from t2i_gcpo.api import credit_maps

    names = schemes.split(",") if schemes is not None else None
    # a Path is a file, never a prompt
    table = credit_maps(
        list(prompt_texts),
        out,
        model,
        prompt_file=Path(prompt_file) if prompt_file else None,
        limit=limit,
        reference=reference,
        schemes=names,
        group_size=group_size,
        cfg_scale=cfg_scale,
        reward=reward,
        negative=negative,
        seed=seed,
        overwrite=overwrite,
    )
    click.echo(table)
