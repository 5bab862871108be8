"""Every code block in ``docs/`` runs: the docs cannot drift from the code.

* ```python blocks run, in page order, in one namespace per page, in a fresh working directory (a page
  may build on its earlier blocks, like a reader typing them in);
* ```toml and ```json blocks must parse;
* ```text / ```sh / ```console blocks are shown output or shell sessions: a test that drives the same
  commands lives next to the feature's other tests (tests/docs/test_readme.py checks every shell line);
* a ```text title="output" block is what the Python block before it prints, exactly (so a page's
  shown output cannot drift either).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import tomllib
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```\s*$", re.S | re.M)
OUTPUT = 'title="output"'


def _fenced(page: Path) -> list[tuple[str, str, str, int]]:
    """``(lang, info, code, line)`` of each fenced block."""
    text = page.read_text()
    return [(m.group(1), m.group(2).strip(), m.group(3), text.count("\n", 0, m.start()) + 1)
            for m in FENCE.finditer(text)]


def _blocks(page: Path) -> list[tuple[str, str, int]]:
    return [(lang, code, line) for lang, _, code, line in _fenced(page)]


PAGES = sorted(p for p in DOCS.rglob("*.md") if _blocks(p))


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_page_code_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    printed: str | None = None
    for lang, info, code, line in _fenced(page):
        where = f"{page.name}:{line}"
        if lang == "python":
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, where, "exec"), namespace)
            printed = out.getvalue()
        elif lang == "text" and OUTPUT in info:
            assert printed is not None, f"{where}: an output block with no Python block before it"
            assert printed.rstrip() == code.rstrip(), f"{where}: the block above printed\n{printed}"
            printed = None
        elif lang == "toml":
            tomllib.loads(code)
        elif lang == "json":
            json.loads(code)


def test_fence_parser_finds_blocks(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("x\n```python\nx = 1\n```\ntext\n```toml\na = 1\n```\n")
    assert [(lang, line) for lang, _, line in _blocks(page)] == [("python", 2), ("toml", 6)]


def test_output_blocks_are_compared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "docs" / "p.md"
    page.parent.mkdir()
    page.write_text('```python\nprint("a")\n```\n\n```text title="output"\nb\n```\n')
    with pytest.raises(AssertionError, match="printed"):
        test_page_code_blocks_run(page, tmp_path, monkeypatch)
    page.write_text('```python\nprint("a")\n```\n\n```text title="output"\na\n```\n')
    test_page_code_blocks_run(page, tmp_path, monkeypatch)
