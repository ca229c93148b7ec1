"""Token heatmaps for text sequences: each token's background shows its credit weight w_t
(docs/concepts/credit.md, docs/worlds/arithmetic.md).

`token_heatmap_html` renders one sequence as an HTML fragment (one <span> per token, coloured by
weight, the exact value in the `title` attribute so it shows on hover); `write_token_heatmaps`
writes a self-contained page of several sequences.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np

from t2i_gcpo.errors import UserError
from t2i_gcpo.viz import _html

DEFAULT_CMAP = "YlOrRd"  # light for low weight so dark text stays readable on most tokens


def _hex(rgb: Sequence[float]) -> str:
    return "#" + "".join(f"{int(round(255 * c)):02x}" for c in rgb[:3])


def _text_colour(rgb: Sequence[float]) -> str:
    lum = 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2]  # relative luminance (sRGB approx.)
    return "#000" if lum > 0.45 else "#fff"


def _legend(vmax: float, cmap: str) -> str:
    cm = matplotlib.colormaps[cmap]
    stops = ", ".join(_hex(cm(x)) for x in np.linspace(0.0, 1.0, 6))
    return (
        f'<span class="meta">w = 0 </span><span class="legend" '
        f'style="background: linear-gradient(to right, {stops});"></span>'
        f'<span class="meta"> {vmax:.3g}</span>'
    )


def _show(token: str) -> str:
    """Visible form of a token: newlines get a ↵ marker (they would otherwise carry invisible credit)."""
    return token.replace("\n", "↵\n") if token else "∅"


def token_heatmap_html(
    tokens: Sequence[str],
    weights: Sequence[float],
    title: str,
    reward: float | None = None,
    advantage: float | None = None,
    vmax: float | None = None,
    cmap: str = DEFAULT_CMAP,
) -> str:
    """One sequence as an HTML fragment: a heading (title, reward, advantage, colour legend) and a
    block of token <span>s whose background is cmap(w_t / vmax) (vmax defaults to max w).
    Tokens are HTML-escaped; each span's `title` is ``"t=<index> w=<weight>"``."""
    tokens = [str(t) for t in tokens]
    w = np.asarray(
        weights.detach().float().cpu().numpy() if hasattr(weights, "detach") else weights, dtype=np.float64
    ).ravel()
    if len(tokens) != w.size:
        raise UserError(f"token heatmap: {len(tokens)} tokens but {w.size} weights")
    finite = w[np.isfinite(w)]
    hi = float(vmax) if vmax is not None else (float(finite.max()) if finite.size else 1.0)
    hi = hi if hi > 0 else 1.0
    cm = matplotlib.colormaps[cmap]

    spans = []
    for i, (tok, wt) in enumerate(zip(tokens, w)):
        rgb = cm(float(np.clip(wt / hi, 0.0, 1.0))) if math.isfinite(wt) else (0.85, 0.85, 0.85)
        spans.append(
            f'<span class="tok" title="t={i} w={wt:.4f}" '
            f'style="background:{_hex(rgb)};color:{_text_colour(rgb)}">{_html.esc(_show(tok))}</span>'
        )
    info = []
    if reward is not None:
        info.append(f"reward {float(reward):.3f}")
    if advantage is not None:
        info.append(f"advantage {float(advantage):+.3f}")
    info.append(f"{len(tokens)} tokens")
    if finite.size:
        info.append(f"max w {finite.max():.3f}")
    return (
        '<div class="seq">\n'
        f"<h3>{_html.esc(title)}</h3>\n"
        f'<p class="meta">{_html.esc(" · ".join(info))} &nbsp; {_legend(hi, cmap)}</p>\n'
        f"<div>{''.join(spans)}</div>\n</div>"
    )


def write_token_heatmaps(path: str | os.PathLike, items: list[dict], title: str = "Token credit") -> Path:
    """Write a self-contained HTML page of several token heatmaps (atomically).

    Each item: ``{"tokens": [...], "weights": [...], "title": str, "reward"?: float,
    "advantage"?: float, "vmax"?: float}`` — the arguments of `token_heatmap_html`.
    """
    parts = [
        f"<h1>{_html.esc(title)}</h1>",
        '<p class="meta">Background = token credit weight w (hover a token for its value).</p>',
    ]
    for k, item in enumerate(items):
        try:
            tokens, weights = item["tokens"], item["weights"]
        except KeyError as e:
            raise UserError(f"token heatmap item {k} lacks {e.args[0]!r}") from None
        parts.append(
            token_heatmap_html(
                tokens,
                weights,
                item.get("title", f"sequence {k}"),
                reward=item.get("reward"),
                advantage=item.get("advantage"),
                vmax=item.get("vmax"),
            )
        )
    return _html.atomic_write_text(path, _html.page(title, "\n".join(parts)))
