"""Code cites the documentation as repository paths (`docs/concepts/credit.md#gcpo`): every cited page
and anchor must exist, and no citation of the old, unshipped SPEC.md may remain."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from repo_paths import REPO

CITATION = re.compile(r"\bdocs/[\w./-]+?\.md(?:#[\w-]+)?")
SOURCES = ("t2i_gcpo", "tests", "benchmarks", "configs", "examples")


def source_files() -> list[Path]:
    files = [p for d in SOURCES if (REPO / d).is_dir() for p in (REPO / d).rglob("*") if p.is_file()]
    return [p for p in files if p.suffix in {".py", ".yaml", ".yml", ".md", ".txt"}]


def slug(text: str) -> str:
    """Python-Markdown's default toc slug: ASCII, lower case, punctuation dropped, spaces to hyphens."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def anchors(page: Path) -> set[str]:
    """The ids a page's headings get: an explicit `{#id}` or the heading's slug."""
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*$", line)
        if heading:
            explicit = re.search(r"\{#([\w-]+)\}\s*$", heading.group(1))
            found.add(explicit.group(1) if explicit else slug(heading.group(1)))
    return found


def citations() -> list[tuple[str, str]]:
    this = Path(__file__).resolve()
    return sorted(
        {
            (str(p.relative_to(REPO)), m)
            for p in source_files()
            if p != this
            for m in CITATION.findall(p.read_text())
        }
    )


def test_the_code_cites_many_pages_and_no_spec_section():
    assert len({c for _, c in citations()}) >= 20
    this = Path(__file__).resolve()
    spec = [str(p.relative_to(REPO)) for p in source_files() if p != this and "SPEC §" in p.read_text()]
    assert spec == [], f"SPEC § cited in {spec}: cite the docs page instead"


def test_every_cited_page_and_anchor_exists():
    broken = []
    for where, citation in citations():
        path, _, anchor = citation.partition("#")
        page = REPO / path
        if not page.is_file():
            broken.append(f"{where}: {citation} (no such page)")
        elif anchor and anchor not in anchors(page):
            broken.append(f"{where}: {citation} (no heading #{anchor})")
    assert broken == []


def test_anchor_reading_matches_mkdocs(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Title\n\n## GCPO {#gcpo}\n\n### Credit lift, measured\n\n```bash\n# a comment\n```\n")
    assert anchors(page) == {"title", "gcpo", "credit-lift-measured"}


def test_no_page_holds_a_control_character():
    """A TeX macro written in a Python string without r"" loses its backslash: "\\frac" becomes a form feed
    and "rac" (docs/concepts/algorithms.md had two). Text files hold no control character
    but tab and newline."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    bad = [
        f"{p.relative_to(REPO)}:{n}"
        for p in pages
        for n, line in enumerate(p.read_text().split("\n"), start=1)  # splitlines() splits at a form feed
        if re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", line)
    ]
    assert not bad, "control characters in: " + ", ".join(bad)
