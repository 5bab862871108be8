"""A real ``vcasync coordinator`` process to throw hostile input at, shared by the area's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.hostile import HostileContext, prepare
from harness.probe import CoordinatorProcess, HttpProbe

SECRET = "hostile-join-secret-0123456789abcdef"


def run_table(store: Path) -> dict[str, object]:
    return {"model": {"factory": "vcasync.examples.digits:model"},
            "units": {"shards": 4, "epochs": 4, "steps": 20},
            "policy": {"name": "vcasgd"},
            "storage": {"url": f"file://{store}"},
            "coordinator": {"durability": "journal", "lease_timeout_s": 3600.0},
            "server": {"body_idle_timeout_s": 3.0, "upload_rate_grace_s": 2.0, "upload_rate_window_s": 2.0,
                       "min_upload_bytes_per_s": 4096.0, "idle_timeout_s": 4.0}}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[CoordinatorProcess, HttpProbe,
                                                                         HostileContext]]:
    run_dir = tmp_path_factory.mktemp("hostile")
    with CoordinatorProcess(run_dir, run_table(run_dir / "store"), join_secret=SECRET) as proc, \
            HttpProbe("127.0.0.1", proc.port) as probe:
        ctx = prepare(probe, SECRET, spare=3)
        yield proc, probe, ctx
