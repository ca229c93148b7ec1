"""Click options shared by the commands that generate images (`sample`, `eval geneval|dpg|shapeworld`)."""

from __future__ import annotations

from collections.abc import Callable

import click

REVEAL_ORDER_CHOICES = (
    "confidence",
    "random",
)  # policies/maskgen.py REVEAL_ORDERS (a test checks they agree)


def masked_sampling_options(command: Callable) -> Callable:
    """--steps and --reveal-order: how a masked model decodes (default: the model's own settings)."""
    command = click.option(
        "--reveal-order",
        type=click.Choice(REVEAL_ORDER_CHOICES),
        default=None,
        help="Masked models: reveal the most confident masked positions first, or a random subset "
        "[default: the model's, i.e. the order it was trained under].",
    )(command)
    return click.option(
        "--steps",
        type=click.IntRange(min=1),
        default=None,
        help="Masked models: decoding steps [default: the model's].",
    )(command)


def masked_settings(steps: int | None, reveal_order: str | None) -> dict:
    """The masked-decoding settings given on the command line (only those given)."""
    return {k: v for k, v in (("steps", steps), ("reveal_order", reveal_order)) if v is not None}
