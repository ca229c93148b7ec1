"""Click options shared by the commands that generate images (`sample`, `eval geneval|dpg|shapeworld`)."""

from __future__ import annotations

from collections.abc import Callable

import click


def lock_out(folder):
    """Lock the output folder `folder` (outdir.lock_output) until the running command ends; returns it."""
    from t2i_gcpo.outdir import lock_output

    lock = lock_output(folder)
    click.get_current_context().call_on_close(lock.release)
    return folder


# policies/maskgen.py REVEAL_ORDERS, repeated so that --help imports no torch (a test checks they agree)
REVEAL_ORDER_CHOICES = ("confidence", "random")


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


def config_value(key: str) -> Callable:
    """A click callback checking an option's value as the config key `key` (its `Bounds` in
    config.py, NaN and inf included): the option accepts what the config accepts, and a bad value is
    one line naming the option, before any work."""

    def check(_ctx: click.Context, param: click.Parameter, value: object) -> object:
        from t2i_gcpo.config import check_value

        return value if value is None else check_value(key, value, what=param.opts[0])

    return check


def cfg_option(help: str) -> Callable:
    """--cfg: the guidance scale, checked as rollout.cfg_scale (no NaN or inf, within its range)."""
    return click.option(
        "--cfg", "cfg_scale", type=float, default=None, callback=config_value("rollout.cfg_scale"), help=help
    )


def seed_option(command: Callable) -> Callable:
    """--seed, checked as the config key seed (an integer in [0, 2⁶³ − 1], as `train --seed` takes)."""
    return click.option("--seed", type=int, default=0, show_default=True, callback=config_value("seed"))(
        command
    )


def images_option(name: str, default: int = 4) -> Callable:
    """--n: images per prompt, checked as eval_images_per_prompt (1 to its ceiling)."""
    return click.option(
        "--n",
        name,
        type=int,
        default=default,
        show_default=True,
        help="Images per prompt.",
        callback=config_value("eval_images_per_prompt"),
    )
