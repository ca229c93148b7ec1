"""`t2i-gcpo reward-server`: serve any reward spec over HTTP, for runs that name it ``remote:http://HOST:PORT``
(t2i_gcpo/rewards/server.py; docs/guides/rewards.md#server)."""

from __future__ import annotations

import click

from t2i_gcpo.rewards.registry import forms_text as reward_forms

EXAMPLES = """
\b
Examples:
  t2i-gcpo reward-server --reward shapeworld --check          # build it, print what it would serve, exit
  t2i-gcpo reward-server --reward shapeworld --port 8100      # then: train … --reward remote:http://127.0.0.1:8100
  t2i-gcpo reward-server --reward '0.7*pickscore:/models/PickScore_v1+0.3*shapeworld' \\
      --device cuda:1 --port 8100
"""


@click.command("reward-server", epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--reward", "spec", required=True, metavar="SPEC", help=f"The reward to serve: {reward_forms('image')}."
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help=(
        "Address to listen on. There is no authentication: anything but loopback belongs on a "
        "private network."
    ),
)
@click.option(
    "--port", default=8100, show_default=True, type=click.IntRange(0, 65535), help="0: a free port."
)
@click.option(
    "--device",
    default=None,
    help="Where the reward's models run: cpu, cuda, cuda:N [default: cuda if there is one, else cpu]; a term "
    "may say its own (NAME:…,device=cuda:1).",
)
@click.option(
    "--max-images",
    default=512,
    show_default=True,
    type=click.IntRange(1, 65536),
    help="Images one request may hold (a client sends at most this many at a time).",
)
@click.option(
    "--max-mb",
    default=256,
    show_default=True,
    type=click.IntRange(1, 1 << 16),
    help="Megabytes one request may hold (its PNGs in base64 and JSON).",
)
@click.option(
    "--max-mpx",
    default=64,
    show_default=True,
    type=click.IntRange(1, 1 << 14),
    help="Megapixels one request's images may hold decoded (read from their PNG headers before any is "
    "decoded; 64: 455 images of 384 px). Clients split their calls to fit.",
)
@click.option(
    "--body-timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0, 3600, min_open=True),
    help=(
        "Seconds a request's body may take to arrive, whole (408 after): a slow client holds nothing longer."
    ),
)
@click.option(
    "--check", is_flag=True, help="Build the reward, print what the server would answer to /health, and exit."
)
@click.option("--quiet", is_flag=True, help="No line per request.")
def reward_server_cmd(
    spec: str,
    host: str,
    port: int,
    device: str | None,
    max_images: int,
    max_mb: int,
    max_mpx: int,
    body_timeout: float,
    check: bool,
    quiet: bool,
) -> None:
    """Serve a reward over HTTP: images as PNG, prompts and metadata as JSON, each request's batch scored as
    one call, for training runs elsewhere (another process, GPU or machine) that name it
    ``--reward remote:http://HOST:PORT``.

    The spec is any `--reward` of `t2i-gcpo train` that scores images: one form, a weighted sum (each term
    may say its device=), or a function of yours (its code runs here). A request this server cannot take (too
    large, too many pixels, not JSON, an unreadable PNG, prompts that do not match the images, a body too slow
    to arrive) is answered 4xx with one line, and the server goes on. Served by uvicorn: 64 clients at once
    and more; slow clients hold no slot. Stop it with Ctrl-C. Loopback by default: there is no authentication.
    """
    import json
    import sys

    from t2i_gcpo.rewards.registry import check_device, check_reward_spec
    from t2i_gcpo.rewards.server import LOOPBACK, RewardService, check_servable, make_server

    check_servable(spec)
    check_reward_spec(spec, output="image")  # a typo or a missing weights folder: one line before loading
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    check_device(device, "--device")
    service = RewardService(
        spec,
        device=device,
        max_images=max_images,
        max_bytes=max_mb << 20,
        max_pixels=max_mpx << 20,
        body_timeout=body_timeout,
    )
    if check:
        click.echo(json.dumps(service.health(), indent=1))
        return
    server = make_server(service, host, port, quiet)
    bound = server.server_address[1]
    shown = f"[{host}]" if ":" in host else host
    if host not in LOOPBACK:
        click.echo(
            f"note: listening on {host} without authentication: keep this port on a private network", err=True
        )
    click.echo(
        f"serving '{service.spec}' (t2i-gcpo {service.health()['version']}, {device}) on "
        f"http://{shown}:{bound}; train with --reward remote:http://{shown}:{bound}",
        nl=True,
    )
    sys.stdout.flush()
    try:
        # until Ctrl-C or SIGTERM: uvicorn stops taking requests, finishes those it has
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    click.echo("stopped", err=True)
