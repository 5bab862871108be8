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
from vcasync.costing.market import SpotTrace
from vcasync.costing.prices import PriceTable

PAGE = Path(__file__).resolve().parents[2] / "docs" / "headline.md"
#: Where the headline's measurements moved, verbatim: its figures are held to the same rules.
NOTEBOOK = PAGE.with_name("headline-notebook.md")
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


def test_a_command_given_a_spot_trace_reads_the_file_the_page_writes(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 14: --spot-trace FILE prices the demo's fleet on a moving spot price; the page's
    # commands name a file its Python blocks write, in the format the option reads
    monkeypatch.chdir(tmp_path)
    for code, line in _blocks("python"):
        exec(compile(code, f"headline.md:{line}", "exec"), {"__name__": "pasted"})
    parser = build_parser(available_commands())
    named = [c for c in _commands()
             if c.startswith("vcasync ") and "--spot-trace" in shlex.split(c, comments=True)]
    assert named, "the page shows no command with --spot-trace"
    for command in named:
        args = parser.parse_args(shlex.split(command, comments=True)[1:])
        assert len(SpotTrace.from_csv(args.spot_trace).times) > 1, command


def test_a_saving_with_a_missed_seed_is_never_quoted_with_a_finite_interval() -> None:
    """A miss leaves a saving's interval unbounded below (``vcasync.costing.spread``): the page
    quoted ``saving_same_machines 0.572, 95 % 0.482 .. 0.663, 1 target missed``, the reached seeds'
    interval as if it were the figure's."""
    finite = re.compile(r"95 % (?:interval )?-?\d")
    missed = re.compile(r"\b(?:[1-9]\d*|one|two|three|four|seeds? [\d ,and]+) (?:targets? |seeds? )?missed\b"
                        r"|\bseeds? [\d ,and]+missed\b")
    bad = [f"{page.name}:{n}: {line.strip()}" for page in (PAGE, NOTEBOOK)
           for n, line in enumerate(page.read_text().splitlines(), 1)
           if "saving" in line and finite.search(line) and missed.search(line)]
    assert bad == []


def test_the_headline_links_its_notebook_and_the_notebook_says_what_supersedes_it() -> None:
    """The measurements moved to the notebook: a reader of the headline must reach them, and a
    reader of the notebook must know its figures are not the current ones."""
    assert "(headline-notebook.md" in PAGE.read_text()
    notebook = NOTEBOOK.read_text()
    assert "superseded by" in notebook
    assert "(benchmarks.md)" in notebook


def test_where_it_stands_names_every_figure_issue_14_asks_for() -> None:
    """The first section after the intro is the current answer: every figure of issue 14, each
    with a row in its table."""
    text = PAGE.read_text()
    sections = re.split(r"^## ", text, flags=re.M)
    assert sections[1].startswith("Where it stands\n")
    rows = [line for line in sections[1].splitlines() if line.startswith("| `")]
    for figure in ("saving_real", "saving_real_ci_low", "saving_sim_64", "saving_same_machines",
                   "gap_mnist_30", "gap_mnist_30_ci_high", "adaptive_gap_mnist_50", "lm_loss_gap_30",
                   "sim_vs_real_error", "targets_missed"):
        assert any(row.startswith(f"| `{figure}` ") for row in rows), figure


def test_where_it_stands_quotes_docs_benchmarks_md_to_the_digit() -> None:
    """Each value in the table is the generated page's for that bench entry, and "not yet saved"
    stands only where that page says not measured: when ``bench.publish`` saves a new run, this
    fails until the headline quotes it."""
    published = {}
    for line in (PAGE.parent / "benchmarks.md").read_text().splitlines():
        m = re.fullmatch(r"\| `(\w+)` \| `(\w+)`(?: \*\(simulated\)\*)? \| (.*) \|", line)
        if m:
            published[m.group(1), m.group(2)] = m.group(3)
    stands = re.split(r"^## ", PAGE.read_text(), flags=re.M)[1]
    checked = 0
    for row in stands.splitlines():
        if not row.startswith("| `"):
            continue
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        figure = re.match(r"`(\w+)`", cells[0]).group(1)
        benches = re.findall(r"`(\w+)`", re.match(r"`\w+` \(([^;)]*)", cells[0]).group(1))
        for bench in benches:
            shown = published[bench, figure]
            if cells[2].startswith("not yet saved"):
                assert shown.startswith("not measured"), (figure, bench, shown)
            else:
                assert cells[2] == shown, (figure, bench, cells[2], shown)
            checked += 1
    assert checked >= 14
