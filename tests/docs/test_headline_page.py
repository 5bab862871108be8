"""docs/headline.md as a reader uses it: each Python block pasted alone, and the commands that
name a price file priced with that file's rows.

tests/docs/test_docs.py runs a page's blocks in one namespace, in order, so a block that leaned on
an import of an earlier one passed there and failed with ``NameError`` when pasted alone; and
``--prices prices.json`` without ``--instance`` ran on the built-in default instance, the file's
row loaded and unused.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from vcasync.cli import available_commands, build_parser
from vcasync.costing.prices import PriceTable

PAGE = Path(__file__).resolve().parents[2] / "docs" / "headline.md"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)


def _blocks(lang: str) -> list[tuple[str, int]]:
    text = PAGE.read_text()
    return [(m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)
            if m.group(1) == lang]


def _commands() -> list[str]:
    """The page's shell commands, ``\\`` continuations joined."""
    out, pending = [], ""
    for code, _ in _blocks("sh"):
        for text in code.splitlines():
            if not pending and (not text.strip() or text.startswith("#")):
                continue
            pending += text.rstrip().removesuffix("\\") + " "
            if not text.rstrip().endswith("\\"):
                out.append(pending.strip())
                pending = ""
    return out


@pytest.mark.parametrize(("code", "line"), _blocks("python"), ids=[f"line{n}" for _, n in _blocks("python")])
def test_each_python_block_runs_pasted_alone(code: str, line: int, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"headline.md:{line}", "exec"), {"__name__": "pasted"})


def test_a_command_given_a_price_file_is_priced_with_its_rows(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for code, line in _blocks("python"):       # the page's blocks write prices.json
        exec(compile(code, f"headline.md:{line}", "exec"), {"__name__": "pasted"})
    parser = build_parser(available_commands())
    named = [c for c in _commands()
             if c.startswith("vcasync ") and "--prices" in shlex.split(c, comments=True)]
    assert named, "the page shows no command with --prices"
    for command in named:
        args = parser.parse_args(shlex.split(command, comments=True)[1:])
        rows = PriceTable.from_file(args.prices)
        used = {args.instance, args.coordinator_instance}
        assert used & set(rows), (f"{command!r} loads {args.prices} but prices with {used}, "
                                  f"not its rows {list(rows)}")


def test_a_saving_with_a_missed_seed_is_never_quoted_with_a_finite_interval() -> None:
    """A miss leaves a saving's interval unbounded below (``vcasync.costing.spread``): the page
    quoted ``saving_same_machines 0.572, 95 % 0.482 .. 0.663, 1 target missed``, the reached seeds'
    interval as if it were the figure's."""
    finite = re.compile(r"95 % (?:interval )?-?\d")
    missed = re.compile(r"\b(?:[1-9]\d*|one|two|three|four|seeds? [\d ,and]+) (?:targets? |seeds? )?missed\b"
                        r"|\bseeds? [\d ,and]+missed\b")
    bad = [f"{n}: {line.strip()}" for n, line in enumerate(PAGE.read_text().splitlines(), 1)
           if "saving" in line and finite.search(line) and missed.search(line)]
    assert bad == []
