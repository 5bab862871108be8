"""Session fixtures: moto's S3 server and gcp-storage-emulator on 127.0.0.1, started once, stopped
at the end. Each test gets its own prefix in a shared bucket, so tests never see each other."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from vcasync.storage import Storage, open_storage
from vcasync.testing.emulators import DUMMY_S3_CREDENTIALS, Emulator

S3_BUCKET = "vcasync-tests"
GCS_BUCKET = "vcasync-tests"


def _request(method: str, url: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> None:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto in server mode (one request at a time, so If-None-Match is atomic as on S3)."""
    with Emulator("s3") as server:
        _request("PUT", f"{server.endpoint}/{S3_BUCKET}")
        yield server.endpoint


@pytest.fixture(scope="session")
def gcs_endpoint() -> Iterator[str]:
    """gcp-storage-emulator, with ifGenerationMatch enforced on uploads."""
    with Emulator("gcs") as server:
        _request("POST", f"{server.endpoint}/storage/v1/b?project=test",
                 json.dumps({"name": GCS_BUCKET}).encode(), {"Content-Type": "application/json"})
        yield server.endpoint


@pytest.fixture(scope="session")
def stock_gcs_endpoint() -> Iterator[str]:
    """gcp-storage-emulator as shipped: it accepts ``ifGenerationMatch=0`` on an existing object
    (a store that does not honour preconditions, for the start-up probe's tests)."""
    with Emulator("gcs", preconditions=False) as server:
        _request("POST", f"{server.endpoint}/storage/v1/b?project=test",
                 json.dumps({"name": GCS_BUCKET}).encode(), {"Content-Type": "application/json"})
        yield server.endpoint


@pytest.fixture
def unique_prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["memory", "file", "s3", "gs"])
async def any_storage(request: pytest.FixtureRequest, tmp_path: Path, unique_prefix: str
                      ) -> AsyncIterator[Storage]:
    """Each built-in backend in turn (S3 and GCS on their emulators), fresh and empty."""
    kind = request.param
    if kind == "memory":
        url, options = "memory://t", {}
    elif kind == "file":
        url, options = (tmp_path / "root").as_uri(), {}
    elif kind == "s3":
        url = f"s3://{S3_BUCKET}/{unique_prefix}"
        options = {"endpoint_url": request.getfixturevalue("s3_endpoint"), **DUMMY_S3_CREDENTIALS}
    else:
        url = f"gs://{GCS_BUCKET}/{unique_prefix}?emulator_host={request.getfixturevalue('gcs_endpoint')}"
        options = {}
    async with open_storage(url, **options) as storage:
        yield storage
