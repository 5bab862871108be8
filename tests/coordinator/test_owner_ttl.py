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

#: (TTL, what CoordinatorConfig says, what WorkerConfig says, the bound the config takes)
CONFIG_BOUNDS = [
    (0.001, r"CoordinatorConfig\.owner_ttl_s must be >= 3 s", r"state_lease_s must be >= 3 s", 3.0),
    (2.9, r"CoordinatorConfig\.owner_ttl_s must be >= 3 s", r"state_lease_s must be >= 3 s", 3.0),
    # Found by a probe: ``owner_ttl_s = 1e12`` was taken; after a crash, a start on another machine
    # watches the old record for a TTL before taking the run over, so the run stayed down for ever.
    (86400.5, r"CoordinatorConfig\.owner_ttl_s must be at most 86400 s",
     r"state_lease_s must be at most 86400 s", 86400.0),
    (1e12, r"CoordinatorConfig\.owner_ttl_s must be at most 86400 s",
     r"state_lease_s must be at most 86400 s", 86400.0),
]


@pytest.mark.parametrize(("ttl", "coordinator", "worker", "bound"), CONFIG_BOUNDS)
def test_an_owner_ttl_out_of_bounds_is_refused_by_name(ttl: float, coordinator: str, worker: str,
                                                       bound: float) -> None:
    with pytest.raises(ConfigError, match=coordinator):
        CoordinatorConfig(owner_ttl_s=ttl)
    with pytest.raises(ConfigError, match=worker):
        WorkerConfig(state_lease_s=ttl)
    assert CoordinatorConfig(owner_ttl_s=bound).owner_ttl_s == bound
    assert WorkerConfig(state_lease_s=bound).state_lease_s == bound


@pytest.mark.parametrize(("ttl", "coordinator", "worker"), [
    ("0.001", "owner_ttl_s must be >= 3 s", "--state-lease must be at least 3 seconds"),
    ("1e12", "owner_ttl_s must be at most 86400 s", "--state-lease must be at most 86400 seconds"),
])
def test_the_cli_refuses_an_owner_ttl_and_state_lease_out_of_bounds_with_exit_2(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        ttl: str, coordinator: str, worker: str) -> None:
    assert coordinator_refused(tmp_path, monkeypatch, toml=f"[coordinator]\nowner_ttl_s = {ttl}\n") == 2
    assert coordinator in capsys.readouterr().err
    assert main(["worker", "--coordinator", "http://127.0.0.1:9", "--trainer", "no.such.module:train",
                 "--state", (tmp_path / "ws").as_uri(), "--state-lease", ttl]) == 2
    assert worker in capsys.readouterr().err
    assert not (tmp_path / "ws").exists()
