"""MkDocs hook: serve MathJax from the site itself, so the formulas render offline (a CDN link left them as
raw TeX without a network).

MathJax 3 comes from the PyPI package django-static-mathjax (MathJax's release files as package data,
no dependencies; the `docs` extra installs it). The site gets its TeX → CommonHTML bundle under
`javascripts/mathjax/` with what that bundle loads by itself: the CommonHTML fonts, the TeX extensions it
autoloads, the menu and the accessibility components. The speech-rule engine (4 MB, only for the
opt-in explorer) and the SVG output are left out.
"""

from __future__ import annotations

from importlib.resources import files as package_files
from pathlib import Path

from mkdocs.structure.files import File, Files

SITE_FOLDER = "javascripts/mathjax"
BUNDLE = "tex-chtml.js"  # mkdocs.yml's extra_javascript names SITE_FOLDER/BUNDLE
LOADED_BY_THE_BUNDLE = ("input/tex/extensions", "output/chtml", "ui", "a11y", "adaptors")


def mathjax_root() -> Path:
    """MathJax's es5 folder as django-static-mathjax installs it."""
    try:
        root = Path(str(package_files("mathjax"))) / "static" / "mathjax" / "es5"
    except ModuleNotFoundError:
        root = None
    if root is None or not (root / BUNDLE).is_file():
        raise SystemExit('MathJax not found: pip install -e ".[docs]" (it installs django-static-mathjax)')
    return root


def mathjax_files(root: Path) -> list[Path]:
    """The bundle and the files it loads, as paths under `root`."""
    found = [root / BUNDLE]
    for folder in LOADED_BY_THE_BUNDLE:
        found += sorted(p for p in (root / folder).rglob("*") if p.is_file())
    return found


def on_files(files: Files, config) -> Files:  # MkDocs hook signature
    root = mathjax_root()
    for path in mathjax_files(root):
        uri = f"{SITE_FOLDER}/{path.relative_to(root).as_posix()}"
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
