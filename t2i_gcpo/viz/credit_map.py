"""Credit maps: where on the image a credit scheme puts its token weights (docs/concepts/credit.md).

Token weights w_it of an image-token sequence live on the tokenizer's grid [rows, cols] (row-major
token order). These helpers draw that grid over the decoded image:

- `weight_overlay`: one image with its weight grid as a translucent heat layer (nearest upsampling,
  so token cells stay visible).
- `credit_figure`: a matplotlib figure, one row per sample, the image then one weight map per scheme
  (shared colour scale per scheme column, one colour bar per column).
- `write_credit_html`: one self-contained HTML page of figures and per-sample tables.

Inputs are plain arrays (numpy, or torch tensors, converted on the way in); nothing here needs a model.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PIL import Image

from t2i_gcpo.errors import UserError
from t2i_gcpo.viz import _html
from t2i_gcpo.viz.lift import credit_lift

REVEAL_COLUMN = "reveal step"


# ---------------------------------------------------------------------------------------------
# array helpers
# ---------------------------------------------------------------------------------------------


def _as_numpy(x: Any) -> np.ndarray:
    """numpy view of an array or torch tensor (no torch import needed)."""
    if hasattr(x, "detach"):  # torch.Tensor
        x = x.detach().cpu()
        x = (x.float() if x.is_floating_point() else x).numpy()  # bf16 has no numpy dtype
    return np.asarray(x)


def to_uint8_image(image: Any) -> np.ndarray:
    """Image as uint8 [H, W, 3]. Accepts uint8 [H, W, 3], float [H, W, 3] or [3, H, W] in [0, 1]
    (numpy or torch), and grayscale [H, W]."""
    a = _as_numpy(image)
    if a.ndim == 3 and a.shape[0] in (1, 3) and a.shape[-1] not in (1, 3):
        a = np.moveaxis(a, 0, -1)  # [3, H, W] -> [H, W, 3]
    if a.ndim == 2:
        a = a[..., None]
    if a.ndim != 3 or a.shape[-1] not in (1, 3):
        raise UserError(f"image must be [H, W, 3] or [3, H, W], got shape {tuple(a.shape)}")
    if a.shape[-1] == 1:
        a = np.repeat(a, 3, axis=-1)
    if a.dtype != np.uint8:
        a = a.astype(np.float64)
        if a.size and (a.min() < -0.1 or a.max() > 1.1):  # small overshoot of a decoder is clipped
            raise UserError(
                f"float images must be in [0, 1], got [{a.min():.3g}, {a.max():.3g}] "
                "(map [-1, 1] outputs with (x + 1) / 2; pass 0–255 images as uint8)"
            )
        a = np.clip(np.rint(a * 255.0), 0, 255).astype(np.uint8)
    return a


def _as_grid(weights: Any, name: str = "weights") -> np.ndarray:
    w = _as_numpy(weights).astype(np.float64)
    if w.ndim != 2:
        raise UserError(f"{name} must be a [rows, cols] grid, got shape {tuple(w.shape)}")
    return w


def _upsample_nearest(grid: np.ndarray, height: int, width: int) -> np.ndarray:
    """[rows, cols, ...] -> [height, width, ...]; pixel y takes row floor(y·rows/height)."""
    rows, cols = grid.shape[:2]
    ys = (np.arange(height) * rows) // height
    xs = (np.arange(width) * cols) // width
    return grid[ys][:, xs]


def _norm(w: np.ndarray, vmin: float, vmax: float | None) -> np.ndarray:
    """Weights scaled to [0, 1] by (w − vmin) / (vmax − vmin), vmax defaulting to max(w)."""
    hi = float(np.nanmax(w)) if vmax is None else float(vmax)
    span = hi - vmin if hi > vmin else 1.0  # all weights ≤ vmin: everything maps to 0
    return np.clip((w - vmin) / span, 0.0, 1.0)


def weight_entropy(weights: Any) -> float:
    """Normalised entropy H(p) / ln N of p = w / Σw over the N cells: 1 = uniform credit,
    0 = all credit on one token; nan when Σw = 0."""
    w = _as_numpy(weights).astype(np.float64).ravel()
    total = w.sum()
    if w.size < 2 or not total > 0:
        return float("nan")
    p = w[w > 0] / total
    return float(-(p * np.log(p)).sum() / math.log(w.size))


# ---------------------------------------------------------------------------------------------
# overlay
# ---------------------------------------------------------------------------------------------


def weight_overlay(
    image: Any,
    weights: Any,
    scale: int = 8,
    vmin: float = 0.0,
    vmax: float | None = None,
    cmap: str = "magma",
    alpha: float = 0.55,
) -> Image.Image:
    """The image upscaled `scale`× (nearest) with its token-weight grid as a translucent heat layer.

    Args:
        image: uint8 [H, W, 3] or float [3, H, W] / [H, W, 3] in [0, 1].
        weights: [rows, cols] token weights (row-major token order), upsampled nearest onto the
            image so each token is a visible cell.
        vmin, vmax: colour range of the heat layer (vmax defaults to the grid's max).
        alpha: opacity of the heat layer; pixel = (1 − alpha)·image + alpha·cmap(norm(w)).

    Returns: an RGB PIL image of size (W·scale, H·scale).
    """
    if scale < 1:
        raise UserError(f"scale must be ≥ 1, got {scale}")
    if not 0.0 <= alpha <= 1.0:
        raise UserError(f"alpha must be in [0, 1], got {alpha}")
    img = to_uint8_image(image)
    w = _as_grid(weights)
    height, width = img.shape[0] * scale, img.shape[1] * scale
    big = np.repeat(np.repeat(img, scale, axis=0), scale, axis=1).astype(np.float64)  # [H·s, W·s, 3]
    heat = matplotlib.colormaps[cmap](_norm(w, vmin, vmax))[..., :3] * 255.0  # [rows, cols, 3]
    heat = _upsample_nearest(heat, height, width)  # [H·s, W·s, 3]
    out = (1.0 - alpha) * big + alpha * heat
    return Image.fromarray(np.clip(np.rint(out), 0, 255).astype(np.uint8))


# ---------------------------------------------------------------------------------------------
# matplotlib figure
# ---------------------------------------------------------------------------------------------


def _columns(samples: Sequence[dict], schemes: Sequence[str]) -> list[str]:
    cols = list(schemes)
    if any(s.get("reveal_step") is not None for s in samples):
        cols.append(REVEAL_COLUMN)
    return cols


def _column_grid(sample: dict, column: str) -> np.ndarray | None:
    if column == REVEAL_COLUMN:
        grid = sample.get("reveal_step")
    else:
        grid = (sample.get("weights") or {}).get(column)
    return None if grid is None else _as_grid(grid, f"weights[{column!r}]")


def _figure_png(samples: Sequence[dict], schemes: Sequence[str], title: str, dpi: int = 100) -> bytes:
    if not samples:
        raise UserError("credit_figure needs at least one sample")
    if not schemes:
        raise UserError("credit_figure needs at least one scheme")
    columns = _columns(samples, schemes)
    nrows, ncols = len(samples), 1 + len(columns)
    grids = [[_column_grid(s, c) for c in columns] for s in samples]

    # Shared colour scale per column: 0 … the column's max weight (reveal steps: 0 … last step).
    vmax = []
    for j in range(len(columns)):
        vals = [float(np.nanmax(g[j])) for g in grids if g[j] is not None and g[j].size]
        vmax.append(max(vals) if vals and max(vals) > 0 else 1.0)

    cell = 2.0  # inches per panel
    fig = Figure(figsize=(cell * ncols + 1.2, cell * nrows + 1.1), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(title, fontsize=12)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    mappables: list[Any] = [None] * len(columns)
    for i, sample in enumerate(samples):
        ax = axes[i, 0]
        ax.imshow(to_uint8_image(sample["image"]), interpolation="nearest")
        label = f"r = {float(sample.get('reward', float('nan'))):.3f}\nA = {float(sample.get('advantage', float('nan'))):+.3f}"
        ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=10, labelpad=6)
        if i == 0:
            ax.set_title("image", fontsize=10)
        for j, column in enumerate(columns):
            ax = axes[i, j + 1]
            grid = grids[i][j]
            if i == 0:
                ax.set_title(column, fontsize=10)
            if grid is None:
                ax.text(0.5, 0.5, "n/a", ha="center", va="center", color="#888", transform=ax.transAxes)
                ax.set_facecolor("#f2f2f2")
            else:
                cmap = "viridis" if column == REVEAL_COLUMN else "magma"
                mappables[j] = ax.imshow(grid, cmap=cmap, vmin=0.0, vmax=vmax[j], interpolation="nearest")
        for ax in axes[i]:
            ax.set_xticks([])
            ax.set_yticks([])
    for j, column in enumerate(columns):
        if mappables[j] is not None:
            cb = fig.colorbar(
                mappables[j], ax=axes[:, j + 1], orientation="horizontal", shrink=0.85, aspect=12, pad=0.02
            )
            cb.set_label("step revealed" if column == REVEAL_COLUMN else "weight w", fontsize=9)
            cb.ax.tick_params(labelsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    return buf.getvalue()


def credit_figure(
    samples: list[dict], schemes: list[str], out_path: str | os.PathLike, title: str = ""
) -> Path:
    """Draw credit maps of several samples under several schemes; save a PNG (Agg, no display).

    Each sample: ``{"image": uint8 [H, W, 3], "reward": float, "advantage": float,
    "weights": {scheme: [rows, cols]}, "reveal_step": [rows, cols] (optional, masked models)}``.
    Layout: one row per sample (reward r and advantage A at its left); columns = image, one weight
    map per scheme, then "reveal step" if any sample has one. Each column shares one colour scale
    (0 … the column's max) and one colour bar. A scheme missing from a sample is drawn as "n/a".
    """
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_bytes(_figure_png(samples, schemes, title))
    return out_path


# ---------------------------------------------------------------------------------------------
# HTML page
# ---------------------------------------------------------------------------------------------


def _fmt(x: Any, spec: str = ".3f") -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "–"
    return "–" if math.isnan(x) else format(x, spec)


def _group_schemes(group: dict) -> list[str]:
    if group.get("schemes"):
        return list(group["schemes"])
    seen: dict[str, None] = {}
    for s in group.get("samples", []):
        seen.update(dict.fromkeys(s.get("weights") or {}))
    return list(seen)


def _group_table(samples: Sequence[dict], schemes: Sequence[str]) -> str:
    has_lift = any(s.get("object_grid") is not None for s in samples)
    head = ["#", "reward", "advantage"]
    for sc in schemes:
        head += [f"{sc}: max w", f"{sc}: H/ln N"] + ([f"{sc}: lift"] if has_lift else [])
    rows = ["<tr>" + "".join(f"<th>{_html.esc(h)}</th>" for h in head) + "</tr>"]
    for i, s in enumerate(samples):
        cells = [str(i), _fmt(s.get("reward")), _fmt(s.get("advantage"), "+.3f")]
        for sc in schemes:
            w = (s.get("weights") or {}).get(sc)
            if w is None:
                cells += ["–", "–"] + (["–"] if has_lift else [])
                continue
            w = _as_grid(w)
            cells += [_fmt(np.nanmax(w)), _fmt(weight_entropy(w))]
            if has_lift:
                obj = s.get("object_grid")
                lift = (
                    credit_lift(w[None], np.asarray(obj, dtype=bool)[None])[0] if obj is not None else np.nan
                )
                cells.append(_fmt(lift))
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return "<table>\n" + "\n".join(rows) + "\n</table>"


def write_credit_html(
    out_dir: str | os.PathLike,
    prompt_groups: list[dict],
    title: str = "Credit maps",
    filename: str = "credit_maps.html",
) -> Path:
    """Write ONE self-contained HTML page (figures inlined as base64 PNG) of credit maps per prompt.

    Each group: ``{"prompt": str, "samples": [sample dicts as in credit_figure],
    "schemes": [...] (optional; default: every scheme found in the samples' weights),
    "figure": PNG path or bytes (optional; drawn with credit_figure when absent)}``.
    A sample may carry ``"object_grid"``: bool [rows, cols] of tokens covering prompt objects, which
    adds a credit-lift column per scheme (docs/worlds/shapeworld.md#credit-lift). The table shows reward, advantage and, per scheme,
    max w and the normalised weight entropy H/ln N (1 = uniform).

    Returns the path of the page (``<out_dir>/<filename>``), written atomically.
    """
    parts = [f"<h1>{_html.esc(title)}</h1>", f'<p class="meta">{len(prompt_groups)} prompt(s)</p>']
    for k, group in enumerate(prompt_groups):
        prompt = str(group.get("prompt", f"prompt {k}"))
        samples = list(group.get("samples", []))
        schemes = _group_schemes(group)
        parts.append(f"<h2>{k + 1}. {_html.esc(prompt)}</h2>")
        fig = group.get("figure")
        if fig is None and samples and schemes:
            fig = _figure_png(samples, schemes, prompt)
        if fig is not None:
            parts.append(_html.img_tag(fig, alt=f"credit maps: {prompt}"))
        if samples:
            parts.append(_group_table(samples, schemes))
    return _html.atomic_write_text(Path(out_dir) / filename, _html.page(title, "\n".join(parts)))
