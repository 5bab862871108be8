"""Session fixtures: moto's S3 server and gcp-storage-emulator on 127.0.0.1, started once, stopped
at the end. Each test gets its own prefix in a shared bucket, so tests never see each other."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

from vcasync.testing.emulators import Emulator

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


@pytest.fixture
def unique_prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"
