"""Token credit over text completions, side by side per credit scheme (docs/concepts/credit.md,
docs/worlds/arithmetic.md).

`text_heatmap_html` renders a self-contained HTML page: per sample its prompt, reward and advantage,
then one column per credit scheme in which every token's background is cmap(w_t / vmax). The tokens
of the sample's first wrong step (the arithmetic world's `first_wrong_step`, mapped to token indices)
are outlined and underlined, so one sees at a glance whether a scheme puts its credit there. One
colour scale for the whole page (vmax: the largest weight shown, unless given), so that schemes
compare directly: uniform credit (w = 1) is one flat tint, a concentrating scheme shows hot spots.
Tokens and prompts are HTML-escaped; a newline shows as "↵" and breaks the line; hovering a token
shows its index and weight. `token_heatmap.token_heatmap_html` is the one-sequence, one-scheme view.
A sample with ``values`` (its value map, docs/concepts/tree_credit.md#value-maps) adds a "V(prefix)"
column (a row in the PNG): every token shaded by the value of the prefix it was decided under, on a
diverging scale centred on the sample's group mean V_0.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

from t2i_gcpo.errors import UserError
from t2i_gcpo.viz import _html
from t2i_gcpo.viz.token_heatmap import DEFAULT_CMAP, _hex, _legend, _show, _text_colour

_NAN_RGB = (0.85, 0.85, 0.85)  # a non-finite weight: grey
_CSS = """
.schemes { display: flex; flex-wrap: wrap; gap: 12px; }
.scheme { flex: 1 1 300px; min-width: 0; border-top: 1px solid #eee; padding-top: 4px; }
.scheme h4 { margin: 2px 0 4px; font-size: 0.95em; }
.tok.wrong, .key.wrong { outline: 2px solid #1f5fbf; outline-offset: -1px; text-decoration: underline;
       text-decoration-color: #1f5fbf; text-decoration-thickness: 2px; }
.key { font-family: ui-monospace, Menlo, Consolas, monospace; padding: 0 3px; }
pre.prompt { margin: 4px 0; white-space: pre-wrap; }
"""


@dataclass
class TextSample:
    """One completion with the credit weights of one or more schemes.

    tokens: the completion's tokens as text (T pieces; a special token may be shown by its name).
    weights: scheme name → T weights w_t (a list, numpy array or torch tensor).
    highlight: indices of the tokens to outline (the first wrong step); empty for none.
    """

    tokens: Sequence[str]
    weights: Mapping[str, Any]
    prompt: str = ""
    reward: float | None = None
    advantage: float | None = None
    highlight: Sequence[int] = ()
    title: str | None = None
    notes: Sequence[str] = field(default_factory=tuple)  # extra facts shown on the sample's line
    values: Any = None  # T values V(prefix) of the prefix each token was decided under (value maps)
    value_centre: float = 0.0  # its group's mean reward V_0, the centre of the value scale


VALUE_COLUMN, VALUE_CMAP = "V(prefix)", "RdBu"  # as viz.credit_map: red below V_0, blue above


def _value_span(samples: Sequence[TextSample]) -> float:
    """The largest |V − V_0| of the samples' value maps (1 when none or all equal V_0)."""
    devs = [np.abs(_as_array(s.values) - s.value_centre) for s in samples if s.values is not None]
    top = max((float(d[np.isfinite(d)].max()) for d in devs if np.isfinite(d).any()), default=0.0)
    return top if top > 0 else 1.0


def _value_rgb(v: float, centre: float, span: float) -> tuple:
    return matplotlib.colormaps[VALUE_CMAP](0.5 + 0.5 * (v - centre) / span) if math.isfinite(v) else _NAN_RGB


def _as_array(w: Any) -> np.ndarray:
    if hasattr(w, "detach"):  # torch.Tensor (bf16 has no numpy dtype)
        w = w.detach().float().cpu().numpy()
    return np.asarray(w, dtype=np.float64).ravel()


def _spans(tokens: Sequence[str], w: np.ndarray, marked: set[int], vmax: float, cmap: str) -> str:
    cm = matplotlib.colormaps[cmap]
    out = []
    for t, (tok, wt) in enumerate(zip(tokens, w)):
        rgb = cm(float(np.clip(wt / vmax, 0.0, 1.0))) if math.isfinite(wt) else _NAN_RGB
        cls = "tok wrong" if t in marked else "tok"
        out.append(
            f'<span class="{cls}" title="t={t} w={wt:.4f}" '
            f'style="background:{_hex(rgb)};color:{_text_colour(rgb)}">{_html.esc(_show(tok))}</span>'
        )
    return "".join(out)


def _value_html(tokens: list[str], s: TextSample, marked: set[int], span: float) -> str:
    v = _as_array(s.values)
    if v.size != len(tokens):
        raise UserError(f"text heatmap: {len(tokens)} tokens but {v.size} values")
    spans = []
    for t, (tok, vt) in enumerate(zip(tokens, v)):
        rgb = _value_rgb(float(vt), s.value_centre, span)
        spans.append(
            f'<span class="{"tok wrong" if t in marked else "tok"}" title="t={t} V={vt:.4f}" '
            f'style="background:{_hex(rgb)};color:{_text_colour(rgb)}">{_html.esc(_show(tok))}</span>'
        )
    head = f"{VALUE_COLUMN} · V₀ {s.value_centre:.3f}"
    return f'<div class="scheme"><h4>{_html.esc(head)}</h4><div>{"".join(spans)}</div></div>'


def _sample_html(k: int, s: TextSample, schemes: list[str], vmax: float, cmap: str, span: float = 1.0) -> str:
    tokens = [str(t) for t in s.tokens]
    marked = {int(i) for i in s.highlight}
    if any(not 0 <= i < len(tokens) for i in marked):
        raise UserError(f"text heatmap sample {k}: highlight indices outside its {len(tokens)} tokens")
    info = [f"{len(tokens)} tokens"]
    if s.reward is not None:
        info.insert(0, f"reward {float(s.reward):.3f}")
    if s.advantage is not None:
        info.insert(1 if s.reward is not None else 0, f"advantage {float(s.advantage):+.3f}")
    info += [str(n) for n in s.notes]
    if marked:
        info.append(f"first wrong step: tokens {min(marked)}–{max(marked)}")
    cols = []
    for name in schemes:
        if name not in s.weights:
            cols.append(f'<div class="scheme"><h4>{_html.esc(name)}</h4><p class="meta">not given</p></div>')
            continue
        w = _as_array(s.weights[name])
        if w.size != len(tokens):
            raise UserError(
                f"text heatmap sample {k}, scheme {name!r}: {len(tokens)} tokens but {w.size} weights"
            )
        fin = w[np.isfinite(w)]
        head = f"{name} · max w {fin.max():.3f}" if fin.size else name
        cols.append(
            f'<div class="scheme"><h4>{_html.esc(head)}</h4>'
            f"<div>{_spans(tokens, w, marked, vmax, cmap)}</div></div>"
        )
    if s.values is not None:
        cols.append(_value_html(tokens, s, marked, span))
    return (
        '<div class="seq">\n'
        f"<h3>{_html.esc(s.title or f'sample {k}')}</h3>\n"
        f'<pre class="prompt">{_html.esc(s.prompt)}</pre>\n'
        f'<p class="meta">{_html.esc(" · ".join(info))}</p>\n'
        f'<div class="schemes">{"".join(cols)}</div>\n</div>'
    )


def text_heatmap_html(
    samples: Sequence[TextSample],
    title: str = "Token credit",
    vmax: float | None = None,
    cmap: str = DEFAULT_CMAP,
) -> str:
    """A complete HTML page (module docstring): the legend, then one section per sample with one
    column per scheme (the schemes of all samples, in first-seen order)."""
    if not samples:
        raise UserError("text heatmap: no samples to draw")
    schemes: list[str] = []
    for s in samples:
        schemes += [n for n in s.weights if n not in schemes]
    if not schemes:
        raise UserError("text heatmap: the samples carry no credit weights")
    if vmax is None:
        finite = [a[np.isfinite(a)] for s in samples for a in map(_as_array, s.weights.values())]
        vmax = max((float(a.max()) for a in finite if a.size), default=1.0)
    vmax = float(vmax) if vmax > 0 else 1.0
    head = (
        f"<h1>{_html.esc(title)}</h1>\n"
        f'<p class="meta">Background = token credit weight w, one scale for the page: {_legend(vmax, cmap)}'
        ' &nbsp; <span class="key wrong">outlined</span> = the first wrong step\'s tokens'
        " &nbsp; ↵ = newline; hover a token for its index and weight.</p>"
    )
    span = _value_span(samples)
    if any(s.values is not None for s in samples):
        stops = ", ".join(_hex(matplotlib.colormaps[VALUE_CMAP](x)) for x in np.linspace(0.0, 1.0, 7))
        head += (
            f'\n<p class="meta">{VALUE_COLUMN}: the value of the prefix each token was decided under, '
            f'centred on its group\'s mean V₀: <span class="meta">V₀ − {span:.3g} </span><span '
            f'class="legend" style="background: linear-gradient(to right, {stops});"></span><span '
            f'class="meta"> V₀ + {span:.3g}'
            "</span> (red: worse than the prompt's value, blue: better).</p>"
        )
    body = [f"<style>{_CSS}</style>", head]
    body += [_sample_html(k, s, schemes, vmax, cmap, span) for k, s in enumerate(samples)]
    return _html.page(title, "\n".join(body))


def write_text_heatmap(
    path: str | os.PathLike,
    samples: Sequence[TextSample],
    title: str = "Token credit",
    within: str | os.PathLike | None = None,
    **kwargs: Any,
) -> Path:
    """Write `text_heatmap_html(samples, title, **kwargs)` to `path` whole, never through a link
    (`_html.atomic_write_text`, `within`)."""
    return _html.atomic_write_text(path, text_heatmap_html(samples, title, **kwargs), within)


def text_heatmap_figure(
    samples: Sequence[TextSample],
    path: str | os.PathLike,
    title: str = "",
    vmax: float | None = None,
    cmap: str = DEFAULT_CMAP,
    within: str | os.PathLike | None = None,
) -> Path:
    """A PNG of the samples (one column each) × schemes (one row each): every token a box coloured by
    its weight on the scheme's own scale (0 … max(2, its largest weight), or `vmax`), laid out as the text is
    (a newline token ends a line), the first wrong step's tokens outlined — the picture of a token heatmap for
    places that show no HTML (a README)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    if not samples:
        raise UserError("text heatmap: no samples to draw")
    schemes = list(dict.fromkeys(n for s in samples for n in s.weights))
    scale = {}  # each scheme on its own scale (0 … its largest weight here), unless vmax is given
    for name in schemes:
        finite = [
            a[np.isfinite(a)] for a in (_as_array(s.weights[name]) for s in samples if name in s.weights)
        ]
        top = max((float(a.max()) for a in finite if a.size), default=1.0)
        scale[name] = vmax or max(top, 2.0)  # weights average 1: uniform credit sits mid-scale
    span = _value_span(samples)
    if any(s.values is not None for s in samples):
        schemes.append(VALUE_COLUMN)
    lines = [max(1, 1 + sum(t.endswith("\n") for t in s.tokens)) for s in samples]
    width = [
        max(len(line) for line in "".join(t if t.endswith("\n") else t or "∅" for t in s.tokens).split("\n"))
        for s in samples
    ]
    cw, lh = 0.13, 0.24  # inches per character and per line
    col_w = [max(w, 12) * cw + 0.3 for w in width]
    row_h = max(lines) * lh + 0.45
    fig = Figure(figsize=(sum(col_w) + 1.2, row_h * len(schemes) + 0.9), dpi=120)
    FigureCanvasAgg(fig)
    cm = matplotlib.colormaps[cmap]
    total_w, total_h = sum(col_w) + 1.2, row_h * len(schemes) + 0.9
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, total_w)
    ax.set_ylim(total_h, 0)
    ax.axis("off")
    if title:
        ax.text(0.1, 0.3, title, fontsize=10, weight="bold", va="center")
    for r, scheme in enumerate(schemes):
        y0 = 0.6 + r * row_h
        ax.text(0.1, y0 + 0.25, scheme, fontsize=9, weight="bold", va="center")
        is_value = scheme == VALUE_COLUMN
        key = f"V₀ ± {span:.2g}" if is_value else f"w 0 … {scale[scheme]:.2g}"
        ax.text(0.1, y0 + 0.5, key, fontsize=7, va="center", color="#444")
        x_col = 1.2
        for c, s in enumerate(samples):
            if r == 0:
                head = s.title or f"sample {c}"
                if s.reward is not None:
                    head += f"  r={s.reward:.2f}"
                ax.text(x_col, y0 - 0.12, head, fontsize=7, va="center", color="#444")
            w = _as_array(
                (s.values if s.values is not None else []) if is_value else s.weights.get(scheme, [])
            )
            marked = set(s.highlight)
            x, y = x_col, y0 + 0.1
            for i, tok in enumerate(s.tokens):
                shown = tok.rstrip("\n") or ("↵" if tok.endswith("\n") else tok or "∅")
                wi = float(w[i]) if i < len(w) else math.nan
                if not math.isfinite(wi):
                    face = "#dddddd"
                elif is_value:
                    face = _value_rgb(wi, s.value_centre, span)
                else:
                    face = cm(min(max(wi / scale[scheme], 0.0), 1.0))
                ax.add_patch(
                    Rectangle(
                        (x, y),
                        cw * len(shown),
                        lh * 0.9,
                        facecolor=face,
                        edgecolor="#1f5fbf" if i in marked else "none",
                        lw=1.2,
                    )
                )
                ink = "#000" if isinstance(face, str) else _text_colour(face)
                ax.text(
                    x + cw * len(shown) / 2,
                    y + lh * 0.45,
                    shown,
                    fontsize=8,
                    family="monospace",
                    ha="center",
                    va="center",
                    color=ink,
                )
                x += cw * len(shown)
                if tok.endswith("\n"):
                    x, y = x_col, y + lh
            x_col += col_w[c]
    return _html.save_png(fig, path, within)
