"""The documentation site builds strictly: a broken link, a missing page or a bad reference fails."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _nav_pages() -> set[str]:
    return set(re.findall(r":\s*([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))


def test_every_page_is_in_the_nav() -> None:
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages - _nav_pages() == set(), "pages a reader cannot reach from the site's navigation"
    assert _nav_pages() - pages == set(), "navigation entries without a page"


@pytest.mark.slow
def test_site_builds_strictly(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert "ModelState" in (tmp_path / "site" / "reference" / "core" / "index.html").read_text()
