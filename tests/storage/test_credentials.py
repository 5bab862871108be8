"""Credentials: the emulator host from STORAGE_EMULATOR_HOST, and clear errors when credentials
are missing or unreadable (no network lookups: the metadata service is switched off)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from vcasync.errors import AccessDeniedError, ConfigError
from vcasync.storage import open_storage
from vcasync.testing.emulators import Emulator

from .conftest import _request

BUCKET = "vcasync-tests"


async def test_gcs_emulator_host_from_the_environment(gcs_endpoint: str, unique_prefix: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_endpoint)
    async with open_storage(f"gs://{BUCKET}/{unique_prefix}") as storage:
        await storage.put("via-env", b"found the emulator")
        assert await storage.get("via-env") == b"found the emulator"


async def test_unreadable_gcs_service_file_is_a_config_error(tmp_path: Path) -> None:
    async with open_storage(f"gs://{BUCKET}/x", service_file=str(tmp_path / "missing.json")) as storage:
        with pytest.raises(ConfigError, match="service_file"):
            await storage.get("anything")


async def test_missing_aws_credentials_say_what_to_do(s3_endpoint: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_DEFAULT_PROFILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    async with open_storage(f"s3://{BUCKET}/x", endpoint_url=s3_endpoint, region="us-east-1") as storage:
        with pytest.raises(AccessDeniedError, match="credentials") as info:
            await storage.get("some/key")
        assert info.value.key == "some/key"


@pytest.fixture(scope="module")
def s3_with_auth() -> Iterator[str]:
    """moto checking every request's credentials (after the one that creates the bucket)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "1")
        server = Emulator("s3").start()
    try:
        _request("PUT", f"{server.endpoint}/{BUCKET}")
        yield server.endpoint
    finally:
        server.stop()


async def test_refused_aws_credentials_are_named_as_the_cause(s3_with_auth: str) -> None:
    """A wrong key at the bucket check every worker and coordinator starts with (a HEAD: a bare 403,
    no error code to read) names the credentials as the likely cause, never the secret."""
    async with open_storage(f"s3://{BUCKET}/x", endpoint_url=s3_with_auth, region="us-east-1",
                            aws_access_key_id="AKIAWRONGWRONGWRONG0",
                            aws_secret_access_key="not-the-secret") as storage:
        with pytest.raises(AccessDeniedError, match="credentials") as info:
            await storage.preflight()
    assert "not-the-secret" not in str(info.value)
    assert BUCKET in str(info.value)
