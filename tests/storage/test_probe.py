"""The open-time checks a coordinator runs before it trusts a store: the precondition probe against a
real store that ignores them (the stock GCS emulator), missing buckets named as buckets, and GCS
credential discovery that answers locally and fast (the metadata server is a local stand-in here)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from vcasync.errors import AccessDeniedError, BucketNotFoundError
from vcasync.storage import Preflight, open_storage, probe_storage
from vcasync.testing.emulators import DUMMY_S3_CREDENTIALS

BUCKET = "vcasync-tests"


async def test_the_probe_catches_the_stock_gcs_emulator(stock_gcs_endpoint: str,
                                                        unique_prefix: str) -> None:
    async with open_storage(f"gs://{BUCKET}/{unique_prefix}?emulator_host={stock_gcs_endpoint}") as st:
        result = await probe_storage(st, "vcasync")
        assert not result.conditional_writes
        assert [k async for k in st.list()] == []


async def test_the_probe_trusts_the_enforcing_emulators(gcs_endpoint: str, s3_endpoint: str,
                                                        unique_prefix: str) -> None:
    async with open_storage(f"gs://{BUCKET}/{unique_prefix}?emulator_host={gcs_endpoint}") as gs, \
            open_storage(f"s3://{BUCKET}/{unique_prefix}", endpoint_url=s3_endpoint,
                         **DUMMY_S3_CREDENTIALS) as s3:
        for st in (gs, s3):
            assert isinstance(st, Preflight)
            assert (await probe_storage(st, "vcasync")).conditional_writes


@pytest.mark.parametrize("kind", ["s3", "gs"])
async def test_a_missing_bucket_is_named_before_anything_is_written(
        kind: str, request: pytest.FixtureRequest) -> None:
    if kind == "s3":
        storage = open_storage("s3://no-such-bucket/p", endpoint_url=request.getfixturevalue(
            "s3_endpoint"), **DUMMY_S3_CREDENTIALS)
    else:
        storage = open_storage(f"gs://no-such-bucket/p?emulator_host="
                               f"{request.getfixturevalue('gcs_endpoint')}")
    async with storage:
        with pytest.raises(BucketNotFoundError, match="the bucket 'no-such-bucket' does not exist") as info:
            await probe_storage(storage, "vcasync")
        assert info.value.bucket == "no-such-bucket"


@pytest.mark.parametrize("kind", ["s3", "gs"])
@pytest.mark.parametrize("size", [1, 9 << 20])       # one request; a multipart/resumable upload
async def test_a_write_to_a_bucket_gone_mid_run_names_the_bucket(
        kind: str, size: int, request: pytest.FixtureRequest) -> None:
    # found by a probe: past the open-time check (a bucket deleted mid-run, or embedding code that
    # never probes), GCS's put said "404 Not Found" as an ObjectNotFoundError naming the key
    if kind == "s3":
        storage = open_storage("s3://no-such-bucket/p", endpoint_url=request.getfixturevalue(
            "s3_endpoint"), part_size=5 << 20, multipart_threshold=5 << 20, **DUMMY_S3_CREDENTIALS)
    else:
        storage = open_storage(f"gs://no-such-bucket/p?emulator_host="
                               f"{request.getfixturevalue('gcs_endpoint')}&simple_upload_max=1048576")
    async with storage:
        with pytest.raises(BucketNotFoundError, match="the bucket 'no-such-bucket' does not exist") as info:
            await storage.put("k", b"x" * size)
        assert info.value.bucket == "no-such-bucket"


# -- GCS credential discovery ------------------------------------------------------------------------

@pytest.fixture
def no_gcp_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No credentials anywhere: an empty gcloud dir, no env, a metadata host where nothing listens."""
    gcloud = tmp_path / "gcloud"
    gcloud.mkdir()
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(gcloud))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "GCE_METADATA_ROOT"):
        monkeypatch.delenv(name, raising=False)
    return gcloud


async def test_no_gcp_credentials_is_said_in_about_a_second(no_gcp_credentials: Path) -> None:
    began = time.monotonic()
    async with open_storage(f"gs://{BUCKET}/p") as st:
        with pytest.raises(AccessDeniedError, match="no Google Cloud credentials were found") as info:
            await probe_storage(st, "vcasync")
    assert time.monotonic() - began < 5
    assert "gcloud auth application-default login" in str(info.value)


async def test_gcp_credentials_named_by_the_environment_must_exist(
        no_gcp_credentials: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    async with open_storage(f"gs://{BUCKET}/p") as st:
        with pytest.raises(AccessDeniedError, match=r"missing\.json, which is not a readable file"):
            await st.preflight()     # type: ignore[attr-defined]


@pytest.fixture
async def metadata_server(unused_tcp_port: int) -> AsyncIterator[str]:
    """A stand-in for a Google Cloud machine's metadata server (it answers with its flavour)."""
    async def root(_req: web.Request) -> web.Response:
        return web.Response(text="computeMetadata/", headers={"Metadata-Flavor": "Google"})

    app = web.Application()
    app.router.add_get("/computeMetadata/v1/", root)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    try:
        yield f"127.0.0.1:{unused_tcp_port}"
    finally:
        await runner.cleanup()


async def test_gcp_credentials_are_found_where_google_auth_looks(
        no_gcp_credentials: Path, monkeypatch: pytest.MonkeyPatch, metadata_server: str) -> None:
    from vcasync.backends._gcp_credentials import find_credentials

    url = f"gs://{BUCKET}/p"
    adc = no_gcp_credentials / "application_default_credentials.json"
    adc.write_text(json.dumps({"type": "authorized_user"}))
    assert "application default credentials" in await find_credentials(url, None)
    adc.unlink()
    monkeypatch.setenv("GCE_METADATA_HOST", metadata_server)
    assert await find_credentials(url, None) == f"the metadata server at {metadata_server}"
    assert "service_file" in await find_credentials(url, "/etc/sa.json")


# -- no secret in what credential discovery says ------------------------------------------------------

SECRET = "tok-5ecret-0123456789"
KEY_JSON = json.dumps({"type": "service_account", "private_key": f"-----BEGIN PRIVATE KEY-----\n{SECRET}\n"})


async def test_no_gcp_credentials_error_masks_the_url(no_gcp_credentials: Path) -> None:
    url = f"gs://alice:{SECRET}@{BUCKET}/p"
    from vcasync.backends._gcp_credentials import find_credentials

    with pytest.raises(AccessDeniedError, match="no Google Cloud credentials were found") as info:
        await find_credentials(url, None)
    assert SECRET not in str(info.value)
    assert f"***@{BUCKET}/p" in str(info.value)


@pytest.mark.parametrize("value", [KEY_JSON, f"/nonexistent/sa.json?token={SECRET}"],
                         ids=["key-json-in-place-of-a-path", "url-with-a-token"])
async def test_bad_google_application_credentials_is_refused_without_showing_a_secret(
        no_gcp_credentials: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", value)
    async with open_storage(f"gs://{BUCKET}/p") as st:
        with pytest.raises(AccessDeniedError, match="GOOGLE_APPLICATION_CREDENTIALS names") as info:
            await st.preflight()     # type: ignore[attr-defined]
    assert SECRET not in str(info.value)
    assert "not a readable file" in str(info.value)


async def test_credential_source_in_the_log_line_shows_no_secret(no_gcp_credentials: Path) -> None:
    from vcasync.backends._gcp_credentials import find_credentials

    assert SECRET not in await find_credentials(f"gs://{BUCKET}/p", KEY_JSON)
    assert await find_credentials(f"gs://{BUCKET}/p", "/etc/sa.json") == "the service_file /etc/sa.json"
