"""Defaults and limits the docs' prose states, held to the code that sets them: a page that says
"default 3600" or "after 3 in a row" is read by operators sizing a fleet or a supervisor, and
nothing ran that prose (docs/leases.md said the restart grace added "a worker's longest retry
delay, 5 s" while the worker retried up to 10 s apart).

Each claim is a phrase with ``{}`` where the page writes the value; the value is read from the
code (a parser's default, a config field's default, a module constant), so changing either side
alone fails here, naming the page.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from vcasync.cli import available_commands, build_parser
from vcasync.coordinator import CoordinatorConfig
from vcasync.coordinator._merger import POLICY_FAILURE_LIMIT
from vcasync.costing.params import MAX_INPUT_FILE_BYTES, MAX_INPUT_FILE_ROWS
from vcasync.costing.prices import PriceTable
from vcasync.demo.cli import DEFAULT_WALK_STEP_S as DEMO_WALK_STEP_S
from vcasync.demo.limits import MAX_WORKERS
from vcasync.runconfig import RunConfig
from vcasync.worker import WorkerConfig

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _default(command: str, dest: str) -> Any:
    """The default of ``vcasync COMMAND``'s option stored in ``dest``."""
    top = build_parser(available_commands())
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices[command]._actions if a.dest == dest)
    return action.default


def _field(cls: Any, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def _text(page: str) -> str:
    return " ".join((DOCS / page).read_text().split())      # prose wraps anywhere


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


CONFIG = CoordinatorConfig()
_PRICES = PriceTable()
#: the built-in price rows' dates, exact rows first: the quickstart once said `--list-prices`
#: "lists the current rows (2024)" while it listed the paper's 2021 rows among them
_AS_OF = sorted({(_PRICES[k].approximate, _PRICES[k].as_of) for k in _PRICES})
#: (page, phrase with {} for the value, the value as the code has it)
CLAIMS: list[tuple[str, str, Any]] = [
    ("operating.md", "`--give-up-after` seconds without a break (default {};",
     _default("worker", "give_up_after")),
    ("trainer.md", "(`--grace-period`, {} s)", _field(WorkerConfig, "grace_period_s")),
    ("trainer.md", "(`--grace-period`, {} s)", _default("worker", "grace_period")),
    ("operating.md", "each `snapshot_every` results, default {},", CONFIG.snapshot_every),
    ("concepts.md", "versions behind ({} by default)", CONFIG.max_staleness),
    ("operating.md", "after {} in a row the coordinator stops and exits 2", POLICY_FAILURE_LIMIT),
    ("operating.md", "its merge policy failed {} merges in a row", POLICY_FAILURE_LIMIT),
    ("trainer.md", "after `quarantine_after` failures in a row, {} by default", CONFIG.quarantine_after),
    ("leases.md", "at the default `linger_s` of {},", _field(RunConfig, "linger_s")),
    ("leases.md", "the default `--linger` of {})", _field(RunConfig, "linger_s")),
    ("leases.md", "{} s with the default `lease_timeout_s` of 60",
     dataclasses.replace(CONFIG, lease_timeout_s=60.0).restart_grace()),
    ("leases.md", "a worker's longest retry delay, {} s", WorkerConfig().backoff.max_delay_s),
    ("operating.md", "then at most {} s apart", WorkerConfig().backoff.max_delay_s),
    ("quickstart.md", "every `--spot-walk-step` seconds, default {};", DEMO_WALK_STEP_S),
    ("quickstart.md", "at most {} workers", MAX_WORKERS),
    ("quickstart.md", "the paper's {} rates beside", _AS_OF[0][1]),
    ("quickstart.md", "beside approximate {} ones", _AS_OF[-1][1]),
    ("limits.md", "MAX_INPUT_FILE_BYTES`, 8 MiB ({} bytes)", f"{MAX_INPUT_FILE_BYTES:,}"),
    ("limits.md", "MAX_INPUT_FILE_ROWS`, {} (a price every", f"{MAX_INPUT_FILE_ROWS:,}"),
    ("headline.md", "at most 8 MiB and {} rows, as every file", f"{MAX_INPUT_FILE_ROWS:,}"),
    ("quickstart.md", "at most 8 MiB and {} rows;", f"{MAX_INPUT_FILE_ROWS:,}"),
]


@pytest.mark.parametrize(("page", "phrase", "value"), CLAIMS,
                         ids=[f"{page}:{phrase[:40]}" for page, phrase, _ in CLAIMS])
def test_the_page_states_the_codes_value(page: str, phrase: str, value: Any) -> None:
    said = phrase.format(_show(value))
    text = _text(page)
    if said not in text:
        pattern = re.escape(phrase).replace(r"\{\}", r"(\S+?)")
        found = re.search(pattern, text)
        stated = found.group(1) if found else "nothing (the phrase is gone)"
        pytest.fail(f"docs/{page} states {stated} where the code has {_show(value)}: {phrase!r}")


def test_the_coordinator_table_on_the_leases_page_shows_the_defaults() -> None:
    """docs/leases.md shows the failure settings' ``[coordinator]`` table with their defaults."""
    text = (DOCS / "leases.md").read_text()
    block = re.search(r"```toml\n(\[coordinator\]\nlease_timeout_s.*?)```", text, re.S)
    assert block is not None, "docs/leases.md lost its [coordinator] settings table"
    table = tomllib.loads(block.group(1))["coordinator"]
    assert table, "the table is empty"
    for key, value in table.items():
        default = _field(CoordinatorConfig, key)
        assert value == default, f"docs/leases.md shows {key} = {value}; the default is {default}"


def test_a_page_that_states_another_value_is_named_with_both() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"docs/operating.md states 3600 where the code has 7200"):
        test_the_page_states_the_codes_value("operating.md", CLAIMS[0][1], 7200.0)
