"""Shared pieces of the self-contained HTML pages written by viz/: data URIs, page shell, atomic writes.

Every page is ONE file: images are inlined as base64 PNG data URIs, styles are inline, and the only
script is a few lines that count the images that decoded (``<body data-images-loaded="…">``), which
the browser test reads back.
"""

from __future__ import annotations

import base64
import html
import io
import os
from pathlib import Path

import numpy as np
from PIL import Image

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto;
       max-width: 1280px; padding: 0 16px; color: #222; background: #fff; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h3 { font-size: 1.05em; margin-bottom: 0.3em; }
.meta { color: #666; font-size: 0.9em; }
.headline { font-size: 1.35em; margin: 0.4em 0; }
.note { background: #fff6e0; border: 1px solid #f0d9a0; padding: 8px 12px; }
img.fig { max-width: 100%; height: auto; border: 1px solid #eee; }
img.pix { image-rendering: pixelated; max-width: 100%; height: auto; border: 1px solid #eee; }
.multiples { display: grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr)); gap: 6px; }
svg.spark { width: 100%; height: auto; border: 1px solid #eee; }
svg.spark text { font-size: 11px; fill: #444; }
svg.spark text.t { font-size: 12px; fill: #222; }
table { border-collapse: collapse; font-size: 0.9em; margin: 8px 0 16px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th { background: #f4f4f4; }
td.l, th.l { text-align: left; }
pre { background: #f7f7f7; border: 1px solid #e4e4e4; padding: 10px; overflow-x: auto; font-size: 0.85em; }
.tok { white-space: pre-wrap; font-family: ui-monospace, Menlo, Consolas, monospace; line-height: 1.9;
       font-size: 1.05em;
       margin-right: 1px;
       padding: 1px 0; border-radius: 2px; }
.seq { border: 1px solid #e4e4e4; padding: 8px 10px; margin: 6px 0 18px; }
.legend { display: inline-block; width: 160px; height: 10px; vertical-align: middle; border: 1px solid #ccc; }
"""

# Counts the <img> elements that decoded; the browser test checks it against the total.
_SCRIPT = """
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (im) { return im.complete && im.naturalWidth > 0; }).length;
  document.body.setAttribute("data-images-loaded", String(ok));
  document.body.setAttribute("data-images-total", String(imgs.length));
});
"""


def esc(text: object) -> str:
    """HTML-escape any value (quotes too, so the result is safe inside attributes)."""
    return html.escape(str(text), quote=True)


def png_bytes(obj: object) -> bytes:
    """PNG bytes of a path to a PNG, PNG bytes, a PIL image, or a uint8 array [H, W, 3]."""
    if isinstance(obj, (bytes, bytearray)):
        data = bytes(obj)
        if not data.startswith(_PNG_MAGIC):
            raise ValueError("bytes are not a PNG")
        return data
    if isinstance(obj, (str, os.PathLike)):
        from t2i_gcpo.outdir import read_bytes

        data = read_bytes(Path(obj))  # a plain file, not through a link
        if data.startswith(_PNG_MAGIC):
            return data
        obj = Image.open(io.BytesIO(data))  # another format: re-encode below
    if isinstance(obj, np.ndarray):
        obj = Image.fromarray(obj)
    if isinstance(obj, Image.Image):
        buf = io.BytesIO()
        obj.save(buf, format="PNG")
        return buf.getvalue()
    raise TypeError(f"cannot make a PNG from {type(obj).__name__}")


def data_uri(obj: object) -> str:
    """A ``data:image/png;base64,…`` URI for anything `png_bytes` accepts."""
    return "data:image/png;base64," + base64.b64encode(png_bytes(obj)).decode("ascii")


def img_tag(obj: object, alt: str, cls: str = "fig", width: int | None = None) -> str:
    """An <img> with the image inlined as a data URI."""
    w = f' width="{int(width)}"' if width else ""
    return f'<img class="{cls}" alt="{esc(alt)}"{w} src="{data_uri(obj)}">'


def page(title: str, body: str) -> str:
    """A complete HTML document around `body` (already-escaped HTML)."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>{_CSS}</style>\n"
        f"<script>{_SCRIPT}</script>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def atomic_write_text(path: str | os.PathLike, text: str, within: str | os.PathLike | None = None) -> Path:
    """Write `text` whole, never through a link (outdir.write_file: a temporary file in the same folder,
    renamed over `path`; readers never see a half-written page). `within`: the folder the command writes,
    whose subfolders down to `path` are checked."""
    from t2i_gcpo.outdir import write_file

    return write_file(path, text, within)


def save_png(fig: object, path: str | os.PathLike, within: str | os.PathLike | None = None) -> Path:
    """A matplotlib figure saved as PNG at `path` the way `atomic_write_text` writes."""
    from t2i_gcpo.outdir import write_file

    return write_file(path, lambda f: fig.savefig(f, format="png", facecolor="white"), within)
