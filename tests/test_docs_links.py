"""Every relative link in the project's Markdown points at a file that exists, and every `#anchor`
at a heading of that file (GitHub's anchors: lowercase, punctuation dropped, spaces as '-')."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".venv", ".venv-policy", ".git", "node_modules", "runs", "out", "build"}  # build/: generated (mutation copies)
PAGES = sorted(p for p in ROOT.rglob("*.md") if not SKIP & set(p.relative_to(ROOT).parts))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes for a page's headings."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")
        out.add(slug)
    return out


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(FENCE.sub("", page.read_text())) if not re.match(r"[a-z]+:", t)]


def test_the_pages_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/README.md", "docs/gpu.md", "docs/machines-and-cost.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert broken == []


def test_the_readme_links_the_reading_order_and_the_gpu_and_cost_guides():
    targets = set(links(ROOT / "README.md"))
    assert {"docs/README.md", "docs/gpu.md", "docs/machines-and-cost.md"} <= targets
