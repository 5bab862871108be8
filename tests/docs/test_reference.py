"""The generated reference pages (CLI, run.toml, metrics, HTTP API) are what the code says now.

``tools/gen_reference.py`` reads the argparse parsers, the config dataclasses, a live coordinator's
``/metrics`` and its registered aiohttp routes; a change to any of them without re-running it fails
here, naming the page.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "tools" / "gen_reference.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_reference", module)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return GEN.generate_fresh()


@pytest.mark.parametrize("name", ["cli.md", "run-toml.md", "metrics.md", "http.md"])
def test_committed_page_is_what_the_code_generates(pages: dict[str, str], name: str) -> None:
    committed = (ROOT / "docs" / "reference" / name).read_text()
    assert committed == pages[name], (f"docs/reference/{name} is out of date with the code: run "
                                      "`python tools/gen_reference.py` and commit the result")


async def test_every_registered_route_is_on_the_http_page(pages: dict[str, str]) -> None:
    """Read from the app the server builds, not from the generator, so a route the generator
    overlooked (or one added to the app later) fails here."""
    import torch

    from vcasync import (
        Coordinator,
        CoordinatorConfig,
        ModelState,
        Server,
        ServerConfig,
        TokenAuthority,
        build_policy,
        make_units,
    )

    async with Coordinator(ModelState.from_module(torch.nn.Linear(1, 1)), make_units(1),
                           policy=build_policy("vcasgd"), storage=None,
                           config=CoordinatorConfig(durability="none")) as coord, \
            Server(coord, TokenAuthority(join_secret="x" * 16), ServerConfig(port=0)) as server:
        routes = {(r.method, r.resource.canonical) for r in server.app.router.routes()
                  if r.method != "HEAD" and r.resource is not None}
    page = pages["http.md"]
    assert routes, "the app registered no routes"
    for method, path in routes:
        assert f"## `{method} {path}`" in page, f"{method} {path} is not documented in docs/reference/http.md"


def test_every_error_code_and_exit_status_is_documented(pages: dict[str, str]) -> None:
    from vcasync.cli import ENVIRONMENT, ExitCode

    for spec in GEN.error_table().values():
        assert f"| {spec.status} | `{spec.code}` |" in pages["http.md"]
    for code in ExitCode:
        assert re.search(rf"^\| {int(code)} \| `{code.name}` \| \S", pages["cli.md"], re.M), code
    for var in ENVIRONMENT:
        assert f"| `{var}` |" in pages["cli.md"]


def test_every_config_field_is_in_the_run_toml_page(pages: dict[str, str]) -> None:
    import dataclasses

    from vcasync import CoordinatorConfig, ServerConfig
    from vcasync.runconfig import UnitsConfig

    for cls in (CoordinatorConfig, ServerConfig, UnitsConfig):
        for f in dataclasses.fields(cls):
            if f.name != "limits":
                assert f"| `{f.name}` |" in pages["run-toml.md"], f"{cls.__name__}.{f.name}"


def test_field_comments_reads_both_comment_styles() -> None:
    class Example:
        #: above,
        #: on two lines
        a: int = 1
        b: float = 2.0     # after it,
                           # continued
        c: str = ""
    assert GEN.field_comments(Example) == {"a": "above, on two lines", "b": "after it, continued"}


def test_check_mode_fails_on_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          pages: dict[str, str]) -> None:
    for name, text in pages.items():
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(GEN, "OUT", tmp_path)
    assert GEN.stale(pages) == []
    (tmp_path / "http.md").write_text(pages["http.md"].replace("/v1/join", "/v1/enter"))
    assert GEN.stale(pages) == ["http.md"]


def test_every_key_metric_and_variable_has_a_meaning(pages: dict[str, str]) -> None:
    """A field added without the comment that explains it shows up as an empty cell."""
    for name in ("run-toml.md", "metrics.md", "cli.md"):
        empty = [line for line in pages[name].splitlines() if line.startswith("| ") and line.endswith("|  |")]
        assert not empty, f"rows of docs/reference/{name} without a meaning: {empty}"
