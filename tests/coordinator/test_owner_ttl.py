"""Owner TTLs have a floor: a coordinator's ``owner_ttl_s`` and a worker's state lease.

Found by a probe: ``owner_ttl_s = 0.001`` renewed ~650 times a second at 71 % of a core, and a
second start took over a live coordinator (a renewal is several storage round trips, longer than
the third of a TTL it had). Both are refused by name, before anything runs (CLI exit 2).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.server.conftest import coordinator_refused
from vcasync.cli import main
from vcasync.coordinator import CoordinatorConfig
from vcasync.errors import ConfigError
from vcasync.worker import WorkerConfig


@pytest.mark.parametrize("ttl", [0.001, 2.9])
def test_an_owner_ttl_below_the_minimum_is_refused_by_name(ttl: float) -> None:
    with pytest.raises(ConfigError, match=r"CoordinatorConfig\.owner_ttl_s must be >= 3 s"):
        CoordinatorConfig(owner_ttl_s=ttl)
    with pytest.raises(ConfigError, match=r"state_lease_s must be >= 3 s"):
        WorkerConfig(state_lease_s=ttl)
    assert CoordinatorConfig(owner_ttl_s=3.0).owner_ttl_s == 3.0
    assert WorkerConfig(state_lease_s=3.0).state_lease_s == 3.0


@pytest.mark.parametrize("ttl", [86400.5, 1e12])
def test_an_owner_ttl_past_a_day_is_refused_by_name(ttl: float) -> None:
    """Found by a probe: ``owner_ttl_s = 1e12`` was taken; after a crash, a start on another machine
    watches the old record for a TTL before taking the run over, so the run stayed down for ever."""
    with pytest.raises(ConfigError, match=r"CoordinatorConfig\.owner_ttl_s must be at most 86400 s"):
        CoordinatorConfig(owner_ttl_s=ttl)
    with pytest.raises(ConfigError, match=r"state_lease_s must be at most 86400 s"):
        WorkerConfig(state_lease_s=ttl)
    assert CoordinatorConfig(owner_ttl_s=86400.0).owner_ttl_s == 86400.0
    assert WorkerConfig(state_lease_s=86400.0).state_lease_s == 86400.0


def test_the_cli_refuses_a_long_state_lease_with_exit_2(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert coordinator_refused(tmp_path, monkeypatch, toml="[coordinator]\nowner_ttl_s = 1e12\n") == 2
    assert "owner_ttl_s must be at most 86400 s" in capsys.readouterr().err
    assert main(["worker", "--coordinator", "http://127.0.0.1:9", "--trainer", "no.such.module:train",
                 "--state", (tmp_path / "ws").as_uri(), "--state-lease", "1e12"]) == 2
    assert "--state-lease must be at most 86400 seconds" in capsys.readouterr().err
    assert not (tmp_path / "ws").exists()


def test_the_cli_refuses_a_short_owner_ttl_and_state_lease_with_exit_2(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert coordinator_refused(tmp_path, monkeypatch, toml="[coordinator]\nowner_ttl_s = 0.001\n") == 2
    assert "owner_ttl_s must be >= 3 s" in capsys.readouterr().err
    assert main(["worker", "--coordinator", "http://127.0.0.1:9", "--trainer", "no.such.module:train",
                 "--state", (tmp_path / "ws").as_uri(), "--state-lease", "0.001"]) == 2
    assert "--state-lease must be at least 3 seconds" in capsys.readouterr().err
    assert not (tmp_path / "ws").exists()
