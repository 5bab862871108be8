"""Every code block in ``docs/`` runs: the docs cannot drift from the code.

* ```python blocks run, in page order, in one namespace per page, in a fresh working directory (a page
  may build on its earlier blocks, like a reader typing them in);
* ```toml and ```json blocks must parse;
* ```text / ```sh / ```console blocks are shown output or shell sessions: a test that drives the same
  commands lives next to the feature's other tests.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)


def _blocks(page: Path) -> list[tuple[str, str, int]]:
    text = page.read_text()
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


PAGES = sorted(p for p in DOCS.rglob("*.md") if _blocks(p))


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_page_code_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for lang, code, line in _blocks(page):
        where = f"{page.name}:{line}"
        if lang == "python":
            exec(compile(code, where, "exec"), namespace)
        elif lang == "toml":
            tomllib.loads(code)
        elif lang == "json":
            json.loads(code)


def test_fence_parser_finds_blocks(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("x\n```python\nx = 1\n```\ntext\n```toml\na = 1\n```\n")
    assert [(lang, line) for lang, _, line in _blocks(page)] == [("python", 2), ("toml", 6)]
