"""The documentation site works offline: no script or style sheet from another host (the formulas were
raw TeX without a network when MathJax came from a CDN); MathJax comes from a PyPI package instead."""

from __future__ import annotations

import importlib.util

import pytest
import yaml

from repo_paths import REPO


def test_the_site_loads_nothing_from_another_host():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assets = [*config.get("extra_javascript", []), *config.get("extra_css", [])]
    assert "javascripts/mathjax/tex-chtml.js" in assets
    assert [a for a in assets if "://" in str(a) or str(a).startswith("//")] == []


def test_the_mathjax_hook_serves_the_bundle_and_what_it_loads():
    if importlib.util.find_spec("mathjax") is None or importlib.util.find_spec("mkdocs") is None:
        pytest.skip("the docs group is not installed (pip install --group docs)")
    spec = importlib.util.spec_from_file_location("mathjax_hook", REPO / "docs" / "hooks" / "mathjax.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    root = hook.mathjax_root()
    served = {p.relative_to(root).as_posix() for p in hook.mathjax_files(root)}
    assert hook.BUNDLE in served
    assert "output/chtml/fonts/woff-v2/MathJax_Main-Regular.woff" in served  # the glyphs
    assert "input/tex/extensions/boldsymbol.js" in served  # autoloaded by \boldsymbol
