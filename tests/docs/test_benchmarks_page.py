"""docs/benchmarks.md is what ``python -m bench.publish`` renders from the saved figures, and it
names every figure issue 18 asks for."""

from __future__ import annotations

import json
from pathlib import Path

from bench.publish import BENCHES, ISSUE_18, PAGE, load_results, render


def test_the_page_is_in_sync_with_the_saved_figures() -> None:
    assert PAGE.read_text() == render(*load_results()), "run: python -m bench.publish"


def test_every_figure_issue_18_names_is_on_the_page() -> None:
    page = PAGE.read_text()
    missing = [n for names in ISSUE_18.values() for n in names if f"`{n}`" not in page]
    assert missing == []
    assert set(ISSUE_18) <= set(BENCHES)


def test_render_is_deterministic_and_shows_spreads_and_the_machine(tmp_path: Path) -> None:
    (tmp_path / "machine.json").write_text(json.dumps({"cpu": "Test CPU", "cores": 2}))
    figures = {"vcasgd_vs_floor": 1.1, "vcasgd_vs_floor_spread": [1.0, 1.1, 1.3], "failed": 0}
    (tmp_path / "merge.json").write_text(json.dumps({"command": "python -m bench.merge --json",
                                                     "seconds": 1.0, "figures": figures}))
    page = render(*load_results(tmp_path))
    assert page == render(*load_results(tmp_path))
    assert "| `merge` | `vcasgd_vs_floor` | 1.1 (1-1.3) |" in page
    assert "| cpu | Test CPU |" in page
    assert "| `codec` | `raw_vs_memcpy_25m` | not measured |" in page
