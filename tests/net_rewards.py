"""A reward that costs nothing, served by the reward server in the network tests (tests/net_fixtures.py) as a
user function: imported afresh from this file, so it holds nothing but the function."""

from __future__ import annotations

from typing import Any


def brightness(images: Any, prompts: list[str], metadata: list[dict]) -> Any:
    """Each image's mean pixel (the server's transport is what is tested, not the reward)."""
    return images.float().mean((1, 2, 3))
