"""Credit maps: where on the image a credit scheme puts its token weights (docs/concepts/credit.md).

Token weights w_it of an image-token sequence live on the tokenizer's grid [rows, cols] (row-major
token order). These helpers draw that grid over the decoded image:

- `weight_overlay`: one image with its weight grid as a translucent heat layer (nearest upsampling,
  so token cells stay visible).
- `credit_figure`: a matplotlib figure, one row per sample, the image then one weight map per scheme
  (shared colour scale per scheme column, one colour bar per column).
- `write_credit_html`: one self-contained HTML page of figures and per-sample tables.
- Value maps (docs/concepts/tree_credit.md#value-maps): a sample carrying ``value_grid`` (V of the prefix
  each token was decided under) gets a "V(prefix)" column in `credit_figure`, on a diverging scale centred
  on its group's mean V_0; `value_figure` draws them over the images of several groups.
- Reward trajectories (docs/concepts/tree_credit.md#stepwise-rewards): a sample carrying ``step_rewards``
  (r(x̂_s) of the model's full prediction after each reveal step) gets an "r(x̂_s)" column in `credit_figure`,
  a line over the steps on one scale per figure; `step_figure` draws the predictions x̂_s themselves.

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
VALUE_COLUMN = "V(prefix)"
VALUE_CMAP = "RdBu"  # diverging: red below the group mean V_0 (became worse), blue above (became better)
STEP_REWARD_COLUMN = "r(x̂_s)"


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
    if any(s.get("value_grid") is not None for s in samples):
        cols.append(VALUE_COLUMN)
    if any(s.get("step_rewards") is not None for s in samples):
        cols.append(STEP_REWARD_COLUMN)
    if any(s.get("reveal_step") is not None for s in samples):
        cols.append(REVEAL_COLUMN)
    return cols


def _column_grid(sample: dict, column: str) -> np.ndarray | None:
    if column == STEP_REWARD_COLUMN:  # a line, not a grid (`_draw_trajectory`)
        return None
    if column == REVEAL_COLUMN:
        grid = sample.get("reveal_step")
    elif column == VALUE_COLUMN:
        grid = sample.get("value_grid")
    else:
        grid = (sample.get("weights") or {}).get(column)
    return None if grid is None else _as_grid(grid, f"weights[{column!r}]")


def value_scale(samples: Sequence[dict]) -> tuple[float, float]:
    """(V_0, span) of the samples' value maps: the colour scale runs V_0 − span … V_0 + span, span the
    largest |V − V_0| of any token or final reward (1 when all equal V_0). V_0: the first sample's centre
    (a figure shows one group; samples of several groups are each drawn around their own V_0)."""
    shown = [s for s in samples if s.get("value_grid") is not None]
    if not shown:
        return 0.0, 1.0
    devs = [0.0]
    for s in shown:
        centre = float(s["value_centre"])
        dev = np.abs(_as_grid(s["value_grid"], "value_grid") - centre)
        devs += [float(np.nanmax(dev))] if np.isfinite(dev).any() else []
        devs += [abs(float(s["reward"]) - centre)] if s.get("reward") is not None else []
    span = max(devs)
    return float(shown[0]["value_centre"]), span if span > 0 else 1.0


def trajectory_range(samples: Sequence[dict]) -> tuple[float, float]:
    """(low, high) of every sample's r(x̂_s), padded by 5 % (0 … 1 when none or all equal)."""
    vals = [float(v) for s in samples for v in (s.get("step_rewards") or []) if np.isfinite(float(v))]
    if not vals or max(vals) == min(vals):
        lo = vals[0] if vals else 0.0
        return lo - 0.5, lo + 0.5
    pad = 0.05 * (max(vals) - min(vals))
    return min(vals) - pad, max(vals) + pad


def _draw_trajectory(
    ax: Any, rewards: Sequence[float] | None, ylim: tuple[float, float], last_row: bool
) -> None:
    """r(x̂_s) against the reveal step s: steps that gained drawn blue, steps that lost red."""
    if rewards is None:
        ax.text(0.5, 0.5, "n/a", ha="center", va="center", color="#888", transform=ax.transAxes)
        ax.set_facecolor("#f2f2f2")
        return
    r = np.asarray([float(v) for v in rewards], dtype=np.float64)
    steps = np.arange(len(r))
    ax.plot(steps, r, color="#888", linewidth=1.0, zorder=1)
    gain = np.diff(r, prepend=r[0])
    colours = np.where(gain > 0, "#2166ac", np.where(gain < 0, "#b2182b", "#444"))
    ax.scatter(steps, r, c=colours, s=14, zorder=2)
    ax.set_ylim(*ylim)
    ax.set_xlim(-0.5, len(r) - 0.5)
    ax.tick_params(labelsize=7)
    ax.set_xticks(steps if len(r) <= 12 else steps[:: max(1, len(r) // 6)])
    if not last_row:
        ax.set_xticklabels([])
    else:
        ax.set_xlabel("reveal step s", fontsize=8)


def _value_label(samples: Sequence[dict], centre: float) -> str:
    grids = [_as_grid(s["value_grid"]) for s in samples if s.get("value_grid") is not None]
    lo = min(float(np.nanmin(g)) for g in grids if np.isfinite(g).any())
    hi = max(float(np.nanmax(g)) for g in grids if np.isfinite(g).any())
    return f"V(prefix), centred on V₀ = {centre:.3f}\nvalues {lo:.3f} … {hi:.3f}"


def any_colorbar(columns: Sequence[str]) -> bool:
    """Whether a column draws a colour scale (all but the step-reward trajectory)."""
    return any(c != STEP_REWARD_COLUMN for c in columns)


def _colorbar_axes(fig: Any, above: Any) -> Any:
    """An axes for a column's horizontal colour bar, 0.3 in under its last panel: 85 % of its width."""
    box, inch = above.get_position(), 1 / fig.get_figheight()
    inset = 0.075 * box.width
    return fig.add_axes((box.x0 + inset, box.y0 - 0.42 * inch, box.width - 2 * inset, 0.12 * inch))


def _figure_png(samples: Sequence[dict], schemes: Sequence[str], title: str, dpi: int = 100) -> bytes:
    if not samples:
        raise UserError("credit_figure needs at least one sample")
    if not schemes:
        raise UserError("credit_figure needs at least one scheme")
    columns = _columns(samples, schemes)
    nrows, ncols = len(samples), 1 + len(columns)
    grids = [[_column_grid(s, c) for c in columns] for s in samples]

    # Shared colour scale per column: 0 … the column's max weight (reveal steps: 0 … last step); the value
    # column: V − V_0 on a symmetric diverging scale, each sample around its own group mean V_0
    centre, span = value_scale(samples)
    ylim = trajectory_range(samples)
    vmax = []
    for j in range(len(columns)):
        vals = [float(np.nanmax(g[j])) for g in grids if g[j] is not None and g[j].size]
        vmax.append(max(vals) if vals and max(vals) > 0 else 1.0)

    # Margins in inches, laid out here: matplotlib's constrained layout costs ≈ 1.5 s a figure of 4 × 8
    # panels on a CPU, and a run draws one every `sample_every` steps
    cell, left, right, top = 2.0, 1.2, 0.15, 0.75
    bottom = 1.0 if any_colorbar(columns) else 0.45  # the colour bars and their labels, else the step axis
    width, height = cell * ncols + left + right, cell * nrows + top + bottom
    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    fig.suptitle(title, fontsize=12, y=1 - 0.12 / height, va="top")
    axes = fig.subplots(
        nrows,
        ncols,
        squeeze=False,
        gridspec_kw=dict(
            left=left / width,
            right=1 - right / width,
            top=1 - top / height,
            bottom=bottom / height,
            wspace=0.12,
            hspace=0.18,
        ),
    )
    mappables: list[Any] = [None] * len(columns)
    for i, sample in enumerate(samples):
        ax = axes[i, 0]
        ax.imshow(to_uint8_image(sample["image"]), interpolation="nearest")
        label = (
            f"r = {float(sample.get('reward', float('nan'))):.3f}\n"
            f"A = {float(sample.get('advantage', float('nan'))):+.3f}"
        )
        ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=10, labelpad=6)
        if i == 0:
            ax.set_title("image", fontsize=10)
        for j, column in enumerate(columns):
            ax = axes[i, j + 1]
            grid = grids[i][j]
            if i == 0:
                ax.set_title(column, fontsize=10)
            if column == STEP_REWARD_COLUMN:
                _draw_trajectory(ax, sample.get("step_rewards"), ylim, last_row=i == nrows - 1)
                continue
            if grid is None:
                ax.text(0.5, 0.5, "n/a", ha="center", va="center", color="#888", transform=ax.transAxes)
                ax.set_facecolor("#f2f2f2")
            elif column == VALUE_COLUMN:
                dev = grid - float(sample["value_centre"]) + centre  # drawn around the figure's V_0
                mappables[j] = ax.imshow(
                    dev, cmap=VALUE_CMAP, vmin=centre - span, vmax=centre + span, interpolation="nearest"
                )
            else:
                cmap = "viridis" if column == REVEAL_COLUMN else "magma"
                mappables[j] = ax.imshow(grid, cmap=cmap, vmin=0.0, vmax=vmax[j], interpolation="nearest")
        for j, ax in enumerate(axes[i]):
            if j == 0 or columns[j - 1] != STEP_REWARD_COLUMN:  # the trajectory keeps its axes
                ax.set_xticks([])
                ax.set_yticks([])
    for j, column in enumerate(columns):
        if mappables[j] is not None:
            cb = fig.colorbar(
                mappables[j], cax=_colorbar_axes(fig, axes[-1, j + 1]), orientation="horizontal"
            )
            label = {REVEAL_COLUMN: "step revealed", VALUE_COLUMN: None}.get(column, "weight w")
            cb.set_label(label or _value_label(samples, centre), fontsize=9)
            cb.ax.tick_params(labelsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    return buf.getvalue()


def credit_figure(
    samples: list[dict],
    schemes: list[str],
    out_path: str | os.PathLike,
    title: str = "",
    within: str | os.PathLike | None = None,
) -> Path:
    """Draw credit maps of several samples under several schemes; save a PNG (Agg, no display).

    Each sample: ``{"image": uint8 [H, W, 3], "reward": float, "advantage": float,
    "weights": {scheme: [rows, cols]}, "reveal_step": [rows, cols] (optional, masked models)}``, and
    optionally its value map: ``"value_grid": [rows, cols]`` (V of the prefix each token was decided
    under), ``"value_centre"``: its group's mean V_0, ``"value_path"``: [V_0, V_1 … V_K, r] and
    ``"value_points"``: [t_1 … t_K] (shown in the HTML table).
    Layout: one row per sample (reward r and advantage A at its left); columns = image, one weight
    map per scheme, then "V(prefix)", "r(x̂_s)" (``"step_rewards"``: [r(x̂_0) … r(x̂_{S−1})], a line over the
    reveal steps, blue where a step gained, red where it lost) and "reveal step" if any sample has one. Each
    column shares one colour
    scale (0 … the column's max; the value column: diverging, centred on V_0, symmetric) and one colour
    bar. A scheme missing from a sample is drawn as "n/a". Written as `save_png` writes (`within`).
    """
    from t2i_gcpo.outdir import write_file

    return write_file(out_path, _figure_png(samples, schemes, title), within)


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


def value_path_text(path: Sequence[float], points: Sequence[int]) -> str:
    """A sample's values along its branch points: "V₀ 0.500 → t=16 0.667 → t=32 1.000 → r 1.000"."""
    path = [float(v) for v in path]
    steps = [f"t={int(t)} {_fmt(v)}" for t, v in zip(points, path[1:-1])]
    return " → ".join([f"V₀ {_fmt(path[0])}", *steps, f"r {_fmt(path[-1])}"])


def _group_table(samples: Sequence[dict], schemes: Sequence[str]) -> str:
    has_lift = any(s.get("object_grid") is not None for s in samples)
    has_values = any(s.get("value_path") is not None for s in samples)
    has_steps = any(s.get("step_rewards") is not None for s in samples)
    head = ["#", "reward", "advantage"]
    for sc in schemes:
        head += [f"{sc}: max w", f"{sc}: H/ln N"] + ([f"{sc}: lift"] if has_lift else [])
    head += ["V(prefix) along the branch points"] if has_values else []
    head += ["r(x̂_s) over the reveal steps"] if has_steps else []
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
        if has_values:
            path = s.get("value_path")
            cells.append("–" if path is None else _html.esc(value_path_text(path, s.get("value_points", []))))
        if has_steps:
            r = s.get("step_rewards")
            cells.append("–" if r is None else _html.esc(" → ".join(_fmt(v) for v in r)))
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return "<table>\n" + "\n".join(rows) + "\n</table>"


def write_credit_html(
    out_dir: str | os.PathLike,
    prompt_groups: list[dict],
    title: str = "Credit maps",
    filename: str = "credit_maps.html",
    within: str | os.PathLike | None = None,
) -> Path:
    """Write ONE self-contained HTML page (figures inlined as base64 PNG) of credit maps per prompt.

    Each group: ``{"prompt": str, "samples": [sample dicts as in credit_figure],
    "schemes": [...] (optional; default: every scheme found in the samples' weights),
    "figure": PNG path or bytes (optional; drawn with credit_figure when absent),
    "step_figure": PNG path or bytes (optional: the predictions over the reveal steps, `step_figure`)}``.
    A sample may carry ``"object_grid"``: bool [rows, cols] of tokens covering prompt objects, which
    adds a credit-lift column per scheme (docs/worlds/shapeworld.md#credit-lift). The table shows reward,
    advantage and, per scheme, max w and the normalised weight entropy H/ln N (1 = uniform); samples with a
    value map add their values along the branch points (``value_path``).

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
        if group.get("step_figure") is not None:
            parts.append(
                _html.img_tag(group["step_figure"], alt=f"predictions over the reveal steps: {prompt}")
            )
        if samples:
            parts.append(_group_table(samples, schemes))
    return _html.atomic_write_text(Path(out_dir) / filename, _html.page(title, "\n".join(parts)), within)


# ---------------------------------------------------------------------------------------------
# value maps of several groups
# ---------------------------------------------------------------------------------------------


def _panels(
    nrows: int, ncols: int, cell: tuple[float, float], margin: tuple[float, float], title: str
) -> tuple[Figure, Any]:
    """A constrained-layout figure of nrows × ncols panels, `cell` inches each plus
    `margin`, with its title."""
    fig = Figure(
        figsize=(cell[0] * ncols + margin[0], cell[1] * nrows + margin[1]), dpi=100, layout="constrained"
    )
    FigureCanvasAgg(fig)
    if title:
        fig.suptitle(title, fontsize=11)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def value_figure(
    groups: Sequence[Sequence[dict]],
    out_path: str | os.PathLike,
    title: str = "",
    scale: int = 4,
    alpha: float = 0.6,
    within: str | os.PathLike | None = None,
) -> Path:
    """Value maps of several groups (docs/concepts/tree_credit.md#value-maps), one row per group: each
    sample's image with its ``value_grid`` as a translucent diverging layer centred on the group's V_0
    (``value_centre``; red: the prefix a token was decided under is worth less than V_0, blue: more), its
    reward above it, one colour bar per group with its value range. Samples as in `credit_figure`."""
    groups = [list(g) for g in groups if any(s.get("value_grid") is not None for s in g)]
    if not groups:
        raise UserError("value_figure needs at least one sample with a value_grid")
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    ncols = max(len(g) for g in groups)
    fig, axes = _panels(len(groups), ncols, (1.8, 2.1), (1.6, 0.6), title)
    for i, group in enumerate(groups):
        centre, span = value_scale(group)
        for j, ax in enumerate(axes[i]):
            ax.set_xticks([])
            ax.set_yticks([])
            if j >= len(group) or group[j].get("value_grid") is None:
                ax.set_axis_off()
                continue
            s = group[j]
            dev = np.nan_to_num(_as_grid(s["value_grid"]) - float(s["value_centre"]))  # no value: V_0's tint
            ax.imshow(weight_overlay(s["image"], dev, scale, -span, span, VALUE_CMAP, alpha))
            ax.set_title(f"r = {float(s.get('reward', float('nan'))):.3f}", fontsize=9)
        cb = fig.colorbar(
            ScalarMappable(Normalize(centre - span, centre + span), VALUE_CMAP),
            ax=axes[i, :],
            shrink=0.85,
            aspect=12,
            pad=0.01,
        )
        cb.set_label(_value_label(group, centre), fontsize=8)
        cb.ax.tick_params(labelsize=7)
    return _html.save_png(fig, out_path, within)


# ---------------------------------------------------------------------------------------------
# predictions over the reveal steps
# ---------------------------------------------------------------------------------------------


def step_figure(
    samples: Sequence[dict],
    out_path: str | os.PathLike,
    title: str = "",
    within: str | os.PathLike | None = None,
) -> Path:
    """The model's full prediction after every reveal step (docs/concepts/tree_credit.md#stepwise-rewards),
    one row per sample: ``"step_images"`` [x̂_0 … x̂_{S−1}] (images as in `credit_figure`; x̂_{S−1} is the
    sample), each titled with its reward from ``"step_rewards"`` and the gain over the step before."""
    shown = [s for s in samples if s.get("step_images")]
    if not shown:
        raise UserError("step_figure needs at least one sample with step_images")
    ncols = max(len(s["step_images"]) for s in shown)
    fig, axes = _panels(len(shown), ncols, (1.3, 1.45), (0.6, 0.6), title)
    for i, sample in enumerate(shown):
        rewards = [float(v) for v in sample.get("step_rewards") or []]
        for j, ax in enumerate(axes[i]):
            ax.set_xticks([])
            ax.set_yticks([])
            if j >= len(sample["step_images"]):
                ax.set_axis_off()
                continue
            ax.imshow(to_uint8_image(sample["step_images"][j]), interpolation="nearest")
            if j < len(rewards):
                gain = "" if j == 0 else f" ({rewards[j] - rewards[j - 1]:+.2f})"
                ax.set_title(f"x̂_{j}: {rewards[j]:.2f}{gain}", fontsize=7)
        axes[i, 0].set_ylabel(f"#{i}", rotation=0, ha="right", va="center", fontsize=9)
    return _html.save_png(fig, out_path, within)
