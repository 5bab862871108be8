"""Credentials: the emulator host from STORAGE_EMULATOR_HOST, and clear errors when credentials
are missing or unreadable (no network lookups: the metadata service is switched off)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vcasync.errors import AccessDeniedError, ConfigError
from vcasync.storage import open_storage

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
