"""The run report: one self-contained HTML page a person opens in a browser to follow a run.

`write_run_report(run_dir)` reads what the trainer leaves in a run directory

    <run_dir>/metrics.jsonl              one JSON object per logged step ("step", "reward/mean", …)
    <run_dir>/samples/step_XXXXXX.png    sample grids
    <run_dir>/credit_maps/step_XXXXXX.png credit-map figures
    <run_dir>/credit_maps/step_XXXXXX.html token heatmaps (text runs)
    <run_dir>/value_maps/step_XXXXXX.png  value maps (runs with continuations: the vine scheme)
    <run_dir>/config.yaml                the resolved config

and writes `<run_dir>/report.html`. First the held-out score with its 95 % interval (over the images
or texts sampled) and its curve — or a note that the run has no held-out evaluation — then the training
batches' reward curves (overall and per GenEval tag), optimisation, credit and timing diagnostics,
the latest sample grid, credit map and value map, and the config. Every metric that is present is
drawn, none is required. Images are inlined (base64 PNG; the small multiples of the optimisation,
credit and other metrics are inline SVG); the file is written to a temp file and renamed, so it can be
rewritten while training and a reader never sees half a page.
"""

from __future__ import annotations

import io
import math
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from PIL import Image

from t2i_gcpo import metrics as M
from t2i_gcpo.errors import UserError
from t2i_gcpo.outdir import parse_json, read_bytes
from t2i_gcpo.viz import _html

REPORT_NAME = "report.html"
_STEP_PNG = re.compile(r"^step_(\d+)\.png$")

# Panels drawn as small multiples (one axis per metric, since their scales differ).
_OPTIM_KEYS = ("zero_std_ratio", "clip_frac", "kl_k3")
_CREDIT_KEYS = ("credit/weight_max", "credit/weight_entropy", "credit_lift")
_MAX_OTHER = 24  # cap on the "other metrics" grid

Series = dict[str, tuple[np.ndarray, np.ndarray]]  # key -> (steps [n], values [n])
Bounds = tuple[float, float] | None  # the range a series' values lie in, where known

# the held-out score of each task family: (score, its standard error, what it is); scores are shares in [0, 1]
HELD_OUT = (
    (M.EVAL_STRICT, M.EVAL_STRICT_SE, "held-out strict score"),
    (M.EVAL_ACCURACY, M.EVAL_ACCURACY_SE, "held-out accuracy"),
)
Z95 = 1.96  # the interval drawn: ± Z95 standard errors (normal; hundreds of images)

_CAPTIONS = {
    "value_maps": '<p class="meta">Each token coloured by V(prefix), the value of the prefix it was decided '
    "under (the mean reward of the continuations from its segment's branch point), centred on the group's "
    "mean V₀: red where the sample had become worse than its prompt's value, blue where better "
    "(docs/concepts/tree_credit.md#value-maps).</p>\n"
}


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_metrics(path: str | os.PathLike) -> tuple[list[dict], int]:
    """Records of a metrics.jsonl merged by step (later lines win key by key; a resumed run that
    re-logs a step overwrites it), sorted by step; plus the number of unreadable lines skipped
    (e.g. a line being written right now). A record without "step" takes its line index."""
    by_step: dict[int, dict] = {}
    bad = 0
    path = Path(path)
    if not path.exists():
        return [], 0
    for idx, line in enumerate(_text(path).splitlines()):
        if not line.strip():
            continue
        try:
            rec = parse_json(line, f"{path}:{idx + 1}")
        except UserError:  # malformed, nested too deeply, or being written right now
            bad += 1
            continue
        if not isinstance(rec, dict):
            bad += 1
            continue
        step = rec.get("step", idx)
        step = int(step) if _is_number(step) else idx
        by_step.setdefault(step, {"step": step}).update(rec, step=step)
    return [by_step[s] for s in sorted(by_step)], bad


def _series(records: Sequence[dict]) -> Series:
    keys: dict[str, None] = {}
    for r in records:
        keys.update(dict.fromkeys(k for k, v in r.items() if k != "step" and _is_number(v)))
    out: Series = {}
    for k in keys:
        pts = [(r["step"], float(r[k])) for r in records if _is_number(r.get(k))]
        out[k] = (np.array([p[0] for p in pts], dtype=np.float64), np.array([p[1] for p in pts]))
    return out


def step_pngs(folder: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) of every `step_XXXXXX.png` in `folder`, newest step first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP_PNG.match(p.name)) and p.is_file()]
    return sorted(found, reverse=True)


def latest_step_png(folder: str | os.PathLike) -> tuple[int, Path] | None:
    """(step, path) of the `step_XXXXXX.png` with the highest step in `folder`, or None."""
    found = step_pngs(folder)
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------------------------


def _window(n: int) -> int:
    """Moving-average window for a curve of n points (0: too short to smooth)."""
    return max(5, n // 20) if n >= 30 else 0


def _smooth(y: np.ndarray, k: int) -> np.ndarray:
    """Trailing moving average over k points (shorter at the start)."""
    return np.array([y[max(0, i + 1 - k) : i + 1].mean() for i in range(y.size)])


def _plot_line(
    ax: Any,
    x: np.ndarray,
    y: np.ndarray,
    label: str | None,
    sd: np.ndarray | None = None,
    bounds: Bounds = None,
) -> None:
    """A metric curve; long curves get a thin raw line plus a bold moving average (named in the
    legend); `sd` adds a ± band (around the average when smoothed), clipped to `bounds`: no part of
    it where no value can be."""
    k = _window(y.size)
    if k:
        (raw,) = ax.plot(x, y, alpha=0.3, lw=1.0)
        y = _smooth(y, k)
        sd = None if sd is None else _smooth(sd, k)
        label = None if label is None else f"{label} (avg of {k})"
        ax.plot(x, y, label=label, color=raw.get_color(), lw=1.8)
    else:
        ax.plot(x, y, label=label, marker="o", ms=3, lw=1.6)
    if sd is not None:
        low, high = (-np.inf, np.inf) if bounds is None else bounds
        band = np.clip(y - sd, low, high), np.clip(y + sd, low, high)
        ax.fill_between(x, *band, alpha=0.15, color=ax.lines[-1].get_color(), lw=0, label="± std")
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps: never 1.5


def _png(fig: Figure | None) -> bytes | None:
    if fig is None:
        return None
    buf = io.BytesIO()
    fig.savefig(buf, format="png", facecolor="white")
    return buf.getvalue()


def _new_fig(w: float, h: float) -> Figure:
    fig = Figure(figsize=(w, h), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def held_out_figure(s: Series, key: str, se_key: str, label: str) -> Figure:
    """The held-out curve `key` with its 95 % interval (± Z95 × `se_key`, within [0, 1]) where logged."""
    x, y = s[key]
    fig = _new_fig(8.0, 3.4)
    ax = fig.add_subplot()
    ax.plot(x, y, marker="o", ms=4, lw=1.8, label=label)
    if se_key in s:
        se = dict(zip(*s[se_key]))
        half = np.array([Z95 * se.get(step, np.nan) for step in x])
        ok = np.isfinite(half)
        ax.fill_between(
            x[ok],
            np.clip(y - half, 0, 1)[ok],
            np.clip(y + half, 0, 1)[ok],
            alpha=0.2,
            lw=0,
            color=ax.lines[-1].get_color(),
            label="95 % interval (images sampled)",
        )
    for step, value in zip(x, y):
        ax.annotate(
            f"{value:.3f}", (step, value), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8
        )
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(label)
    ax.margins(x=0.05, y=0.25)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig


def reward_figure(s: Series, bounds: Bounds = None) -> Figure | None:
    """The training batches' reward: reward/mean (± reward/std band, within the reward's `bounds`), other
    reward/*mean curves, strict/overall."""
    keys = [k for k in s if k.startswith("reward/") and k.endswith("mean")]
    keys += ["strict/overall"] if "strict/overall" in s else []
    if not keys:
        return None
    fig = _new_fig(8.0, 3.8)
    ax = fig.add_subplot()
    for k in keys:
        x, y = s[k]
        std_key = k[: -len("mean")] + "std"  # reward/mean -> reward/std
        sd = s[std_key][1] if std_key in s and np.array_equal(s[std_key][0], x) else None
        label = f"{k} (training batch)" if k == "strict/overall" else k
        _plot_line(ax, x, y, label, sd, bounds if k == M.REWARD_MEAN else None)
    ax.set_xlabel("step")
    ax.set_ylabel("reward / score")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig


def _tag_plot(s: Series) -> bytes | None:
    """Strict GenEval-style score per prompt tag (strict/<tag>), overall dashed for reference."""
    tags = sorted(k for k in s if k.startswith("strict/") and k != "strict/overall")
    if not tags:
        return None
    fig = _new_fig(8.0, 3.8)
    ax = fig.add_subplot()
    for k in tags:
        _plot_line(ax, *s[k], k.split("/", 1)[1])
    if "strict/overall" in s:
        ax.plot(*s["strict/overall"], "k--", lw=1.4, label="overall")
    ax.set_xlabel("step")
    ax.set_ylabel("strict score")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _png(fig)


# the small multiples: one inline SVG panel per metric (viewBox units; the page scales them)
_PANEL = (300, 150)  # width, height
_PAD = (66, 10, 24, 22)  # left, right, top, bottom: room for the value labels, the title, the step labels


def _number(v: float) -> str:
    return f"{v:.4g}"


def _panel_svg(key: str, x: np.ndarray, y: np.ndarray) -> str:
    """One metric as an inline SVG: its curve (long curves: a faint raw line under a bold trailing moving
    average), its first and last logged steps, its lowest and highest values, its name and latest value."""
    (w, h), (left, right, top, bottom) = _PANEL, _PAD
    x0, x1 = float(x.min()), float(x.max())
    lo, hi = float(y.min()), float(y.max())
    if hi == lo:  # a flat curve: drawn across the middle
        lo, hi = lo - (abs(lo) * 0.05 or 1.0), hi + (abs(hi) * 0.05 or 1.0)
    px = left + (x - x0) / ((x1 - x0) or 1.0) * (w - left - right)

    def line(ys: np.ndarray, style: str, dots: bool = False) -> str:
        py = h - bottom - (ys - lo) / (hi - lo) * (h - top - bottom)
        drawn = (
            f'<polyline points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px, py))}" fill="none" '
            f'stroke="#1f77b4" {style}/>'
        )
        marks = "".join(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2"/>' for a, b in zip(px, py)) if dots else ""
        return drawn + (f'<g fill="#1f77b4">{marks}</g>' if marks else "")

    k = _window(y.size)
    if k:
        curve = line(y, 'stroke-opacity="0.3"') + line(_smooth(y, k), 'stroke-width="1.8"')
    else:  # short curves: every point marked
        curve = line(y, 'stroke-width="1.6"', dots=True)
    name = _html.esc(key)
    smooth = f" (bold: the average of {k})" if k else ""
    if y.max() == y.min():  # one value: labelled once, beside the line
        values = (
            f'<text x="{left - 4}" y="{(top + h - bottom) / 2 + 4:.0f}" '
            f'text-anchor="end">{_number(float(y[0]))}</text>'
        )
    else:
        values = (
            f'<text x="{left - 4}" y="{top + 9}" text-anchor="end">{_number(hi)}</text>'
            f'<text x="{left - 4}" y="{h - bottom}" text-anchor="end">{_number(lo)}</text>'
        )
    return (
        f'<svg class="spark" viewBox="0 0 {w} {h}" role="img" aria-label="{name}">'
        f"<title>{name}: {_number(float(y[-1]))} at step {int(x[-1])}{smooth}</title>"
        f'<rect x="{left}" y="{top}" width="{w - left - right}" height="{h - top - bottom}" fill="none" '
        'stroke="#bbb"/>'
        f'{curve}<text x="{w / 2:.0f}" y="15" text-anchor="middle" class="t">{name}</text>{values}'
        f'<text x="{left}" y="{h - 6}">{int(x0)}</text>'
        f'<text x="{w - right}" y="{h - 6}" text-anchor="end">{int(x1)}</text>'
        "</svg>"
    )


def _multiples(s: Series, keys: Sequence[str]) -> str | None:
    """The metrics `keys` that `s` holds as a grid of small panels (their scales differ), as HTML. Inline
    SVG rather than matplotlib: the report is redrawn at every sample step, and a 24-panel matplotlib grid
    took 0.7 s of it (a page of 24 panels now takes milliseconds)."""
    keys = [k for k in keys if k in s]
    if not keys:
        return None
    return '<div class="multiples">' + "".join(_panel_svg(k, *s[k]) for k in keys) + "</div>"


def _time_plot(s: Series) -> bytes | None:
    keys = sorted(k for k in s if k.startswith("time/"))
    if not keys:
        return None
    fig = _new_fig(8.0, 3.2)
    ax = fig.add_subplot()
    for k in keys:
        _plot_line(ax, *s[k], k.split("/", 1)[1])
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _png(fig)


# ---------------------------------------------------------------------------------------------
# page
# ---------------------------------------------------------------------------------------------


def _pixel_img(path: Path, alt: str) -> str:
    """Inline a PNG; small pixel-art grids are shown enlarged (integer factor, crisp pixels)."""
    data = read_bytes(path)  # a plain file in the run folder, never through a link
    with Image.open(io.BytesIO(data)) as im:
        im.load()  # raises OSError on a truncated file
        w = im.width
    factor = max(1, 768 // max(w, 1)) if w < 512 else 1
    return _html.img_tag(data, alt=alt, cls="pix", width=w * factor)


def _latest_table(s: Series) -> str:
    """Latest value of every metric with the step it was logged at (eval metrics such as strict/*
    may be logged less often than the training ones)."""
    rows = [
        f"<tr><th class='l'>{_html.esc(k)}</th><td>{y[-1]:.4g}</td><td class='meta'>{int(x[-1])}</td></tr>"
        for k, (x, y) in sorted(s.items())
    ]
    per = math.ceil(len(rows) / 3) or 1  # three side-by-side tables keep the section short
    head = "<tr><th class='l'>metric</th><th>value</th><th>step</th></tr>"
    tables = ["<table>" + head + "".join(rows[i : i + per]) + "</table>" for i in range(0, len(rows), per)]
    return '<div style="display:flex; gap:24px; flex-wrap:wrap">' + "".join(tables) + "</div>"


def _change_table(s: Series, key: str) -> str:
    """The held-out score per category at step 0 and at the latest evaluation, with its paired change from
    step 0 and the 95 % interval (metrics.EVAL_CHANGE*), the overall row with the unpaired interval too; the
    per-tag scores alone for a run that logged no change (eval_every 0, or a run of an older version)."""
    prefix = M.EVAL_STRICT_TAG.format(tag="") if key == M.EVAL_STRICT else None  # the per-tag scores
    change_prefix = M.EVAL_CHANGE.format(category="")
    cats = [k[len(change_prefix) :] for k in s if k.startswith(change_prefix)]
    if not cats:
        tags = sorted(k for k in s if prefix and k.startswith(prefix) and k != key)
        if not tags:
            return ""
        x = s[key][0]
        rows = [
            f"<tr><th class='l'>{_html.esc(k.split('/')[-1])}</th><td>{s[k][1][-1]:.3f}</td></tr>"
            for k in tags
        ]
        return f"<table><tr><th class='l'>tag</th><th>step {int(x[-1])}</th></tr>{''.join(rows)}</table>"
    cats = [c for c in cats if c not in ("overall", "all")] + ["overall"]  # "all": the one category of a task
    x_change = s[change_prefix + "overall"][0] if change_prefix + "overall" in s else s[key][0]
    last = int(x_change[-1])

    def at(k: str, step: int) -> float:
        if k not in s:
            return math.nan
        values = dict(zip(s[k][0].tolist(), s[k][1].tolist()))
        return values.get(step, math.nan)

    def num(v: float, sign: bool = False) -> str:
        return "—" if not math.isfinite(v) else (f"{v:+.3f}" if sign else f"{v:.3f}")

    head = (
        f"<tr><th class='l'>category</th><th>step 0</th><th>step {last}</th><th>paired change</th>"
        "<th>95 % interval</th><th>unpaired 95 %</th></tr>"
    )
    rows = []
    for c in cats:
        score_key = key if c == "overall" else f"{prefix}{c}"
        change, ci = at(M.EVAL_CHANGE.format(category=c), last), at(M.EVAL_CHANGE_CI.format(category=c), last)
        unpaired = at(M.EVAL_CHANGE_UNPAIRED_CI, last) if c == "overall" else math.nan
        interval = "—" if not math.isfinite(ci) else f"± {ci:.3f}"
        rows.append(
            f"<tr><th class='l'>{_html.esc(c)}</th><td>{num(at(score_key, 0))}</td><td>"
            f"{num(at(score_key, last))}</td><td><b>{num(change, True)}</b></td><td>{interval}</td>"
            f"<td>{'' if not math.isfinite(unpaired) else f'± {unpaired:.3f}'}</td></tr>"
        )
    note = (
        '<p class="meta">Paired change: the mean over the held-out items (a prompt and its sample index) of '
        "the item's score at this step minus its score at step 0 — the same prompts and the same sampling "
        "noise at every evaluation — with its Student-t 95 % interval; the unpaired interval treats the two "
        "evaluations as independent draws (docs/evaluation/index.md#a-runs-gain).</p>"
    )
    return f"<table>{head}{''.join(rows)}</table>\n{note}"


def _held_out_section(s: Series, eval_every: int | None) -> str:
    """The report's first section: the latest held-out score with its 95 % interval, where it started,
    its curve and, for GenEval-style tasks, its tags; else why there is none."""
    for key, se_key, label in HELD_OUT:
        if key not in s:
            continue
        x, y = s[key]
        se = dict(zip(*s[se_key])).get(x[-1], math.nan) if se_key in s else math.nan
        interval = f" ± {Z95 * se:.3f}" if math.isfinite(se) else ""
        start = f"; {y[0]:.3f} at step {int(x[0])}" if x.size > 1 else ""
        change_key = M.EVAL_CHANGE.format(category="overall")
        if change_key in s and int(s[change_key][0][-1]) == int(x[-1]):
            ci_key = M.EVAL_CHANGE_CI.format(category="overall")
            ci = dict(zip(*s[ci_key])).get(x[-1], math.nan) if ci_key in s else math.nan
            start += f"; paired change from step 0 <b>{s[change_key][1][-1]:+.3f}</b>" + (
                f" ± {ci:.3f}" if math.isfinite(ci) else ""
            )
        note = (
            "± the 95 % interval of the score over the samples drawn for the held-out prompts."
            if interval
            else "No interval was recorded with this score (a run from before intervals were logged)."
        )
        parts = [
            "<h2>Held-out score</h2>",
            (
                f'<p class="headline"><b>{y[-1]:.3f}{interval}</b> {_html.esc(label)} at step '
                f"{int(x[-1])}{start}</p>"
            ),  # start: ours
            f'<p class="meta">{note} The curves further down are scored on the training batches.</p>',
            _html.img_tag(_png(held_out_figure(s, key, se_key, label)), alt=label),
        ]
        parts.append(_change_table(s, key))
        return "\n".join(parts)
    if eval_every is not None and eval_every < 0:
        why = (
            "This run has no held-out evaluation (eval_every: -1, or no held-out prompts for its task): "
            "every score below is measured on the training batches, the prompts being trained on."
        )
    elif eval_every is not None:
        when = (
            "at the end of the run"
            if eval_every == 0
            else f"at step 0, every {eval_every} steps and at the end"
        )
        why = f"No held-out evaluation yet: it runs {when} (eval_every: {eval_every})."
    else:
        why = "No held-out score in metrics.jsonl."
    return f'<h2>Held-out score</h2>\n<p class="note">{_html.esc(why)}</p>'


def write_run_report(
    run_dir: str | os.PathLike, reward_bounds: Bounds = None, eval_every: int | None = None
) -> Path:
    """Write `<run_dir>/report.html` from the run directory's metrics, images and config.

    Draws whatever is present (see the module docstring); safe to call repeatedly during training.
    `reward_bounds`: the range the reward's values lie in, where known (its ± std band stays inside);
    `eval_every`: the run's, so that a run without held-out evaluation says so (-1: none). Returns the
    report's path.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"run directory not found: {run_dir}")
    records, bad = read_metrics(run_dir / "metrics.jsonl")
    s = _series(records)

    parts = [f"<h1>Run report: {_html.esc(run_dir.resolve().name)}</h1>"]
    meta = [f"{len(records)} logged steps"]
    if records:
        meta.append(f"latest step {records[-1]['step']}")
    if bad:
        meta.append(f"{bad} unreadable metrics line(s) skipped")
    meta.append("written " + time.strftime("%Y-%m-%d %H:%M:%S"))
    parts.append(f'<p class="meta">{_html.esc(" · ".join(meta))}</p>')

    # the held-out score first: the number a run is judged by
    parts.append(_held_out_section(s, eval_every))
    shown = {k for score in HELD_OUT for k in score[:2]}
    shown.update(k for k in s if k.startswith(("eval/change/", "eval/change_ci/", M.EVAL_CHANGE_UNPAIRED_CI)))

    # curves
    panels = [
        (
            "Reward on the training batches",
            _png(reward_figure(s, reward_bounds)),
            [k for k in s if k.startswith("reward/")] + ["strict/overall"],
        ),
        ("Strict score per tag (training batches)", _tag_plot(s), [k for k in s if k.startswith("strict/")]),
        ("Optimisation", _multiples(s, _OPTIM_KEYS), list(_OPTIM_KEYS)),
        ("Credit", _multiples(s, _CREDIT_KEYS), list(_CREDIT_KEYS)),
        ("Time", _time_plot(s), [k for k in s if k.startswith("time/")]),
    ]
    for name, figure, keys in panels:
        shown.update(keys)
        if figure is not None:  # a PNG, or the small multiples' HTML
            shown_as = figure if isinstance(figure, str) else _html.img_tag(figure, alt=name)
            parts.append(f"<h2>{_html.esc(name)}</h2>\n" + shown_as)
            if name.startswith("Reward"):
                parts.append(
                    '<p class="meta">Scored on each step\'s own samples, of the prompts being trained '
                    "on: not a held-out score.</p>"
                )
    others = [k for k in s if k not in shown]
    if others:
        parts.append("<h2>Other metrics</h2>\n" + _multiples(s, others[:_MAX_OTHER]))
        if len(others) > _MAX_OTHER:
            parts.append(f'<p class="meta">{len(others) - _MAX_OTHER} more metrics not drawn.</p>')
    if not s:
        parts.append('<p class="meta">No metrics yet (metrics.jsonl missing or empty).</p>')
    if s:
        parts.append("<h2>Latest values</h2>\n" + _latest_table(s))

    # latest images (a file still being written is skipped for the previous one)
    for folder, name in (
        ("samples", "Latest samples"),
        ("credit_maps", "Latest credit map"),
        ("value_maps", "Latest value maps"),
    ):
        for step, path in step_pngs(run_dir / folder)[:3]:
            try:
                img = _pixel_img(path, f"{name}, step {step}")
            except (OSError, ValueError, UserError):
                continue
            parts.append(f"<h2>{name} (step {step})</h2>\n" + _CAPTIONS.get(folder, "") + img)
            break

    # text runs: the latest token heatmap page, embedded whole (the report stays one file)
    pages = (
        sorted((run_dir / "credit_maps").glob("step_*.html")) if (run_dir / "credit_maps").is_dir() else []
    )
    if pages:
        page = pages[-1]
        text = _text(page)
        parts.append(
            f"<h2>Latest token credit ({_html.esc(page.name)})</h2>\n"
            f'<iframe title="token credit" srcdoc="{_html.esc(text)}" '
            'style="width:100%;height:70vh;border:1px solid #ccc"></iframe>'
        )

    # config
    cfg = run_dir / "config.yaml"
    if cfg.is_file():
        text = _text(cfg)
        parts.append("<h2>Config</h2>\n<pre>" + _html.esc(text) + "</pre>")

    title = f"report: {run_dir.resolve().name}" + (f" (step {records[-1]['step']})" if records else "")
    return _html.atomic_write_text(run_dir / REPORT_NAME, _html.page(title, "\n".join(parts)), run_dir)


def _text(path: Path) -> str:
    """A file of the run folder as text (outdir.read_bytes: a plain file, never through a link), undecodable
    bytes replaced; empty when it cannot be read."""
    try:
        return read_bytes(path).decode("utf-8", errors="replace")
    except UserError:
        return ""
