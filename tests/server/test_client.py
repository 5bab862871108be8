"""CoordinatorClient.submit against a real coordinator on 127.0.0.1: every body form it takes
arrives whole (the coordinator checks each frame's CRC, so an accepted result is byte-exact)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from harness.tls import self_signed
from vcasync.errors import ConfigError
from vcasync.ledger._units import make_units
from vcasync.server import ServerConfig
from vcasync.tensors import ModelState
from vcasync.wire import decode_payload_bytes
from vcasync.worker import _client as client_mod
from vcasync.worker._client import CoordinatorClient, client_ssl_context

from .conftest import SECRET, result_payload, running


async def _model(coord: Any) -> ModelState:
    data = b"".join([c async for c in coord.model_payload()])
    payload = decode_payload_bytes(data, expected_kind="model")
    return ModelState(payload.tensors, version=payload.meta["version"])


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


def _as_file(tmp: Path) -> Callable[[bytes], Any]:
    def write(data: bytes) -> Path:
        path = tmp / "result.bin"
        path.write_bytes(data)
        return path
    return write


BODIES: dict[str, tuple[Callable[[bytes], Any], bool]] = {
    # form -> (how the payload is handed over, whether size= is passed)
    "bytes": (bytes, False),
    "bytearray": (bytearray, False),
    "memoryview": (memoryview, True),
    "chunks_with_size": (lambda d: _chunks(d, 37), True),
    "chunks_chunked": (lambda d: _chunks(d, 37), False),
}


@pytest.mark.parametrize("form", [*BODIES, "file"])
async def test_every_body_form_arrives_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             form: str) -> None:
    # Blocks far smaller than the payload, so headers, first block and the rest all take part.
    monkeypatch.setattr(client_mod, "UPLOAD_BLOCK", 64)
    monkeypatch.setattr(client_mod, "FILE_BLOCK", 64)
    make, sized = BODIES.get(form, (_as_file(tmp_path), False))
    async with running(tmp_path, units=make_units(2, steps=3), durability="none") as (coord, server), \
            CoordinatorClient(server.url) as client:
        await client.join(SECRET, "t")
        grant = await client.lease()
        data = result_payload(await _model(coord), grant.lease_id, grant.base_version)
        assert len(data) > 4 * 64
        receipt = await client.submit(grant.lease_id, make(data), size=len(data) if sized else None)
        assert receipt.status == "accepted"
        assert coord.version == grant.base_version + 1


async def test_a_size_that_does_not_match_the_buffer_sends_nothing(tmp_path: Path) -> None:
    async with running(tmp_path, units=make_units(2, steps=3), durability="none") as (coord, server), \
            CoordinatorClient(server.url) as client:
        await client.join(SECRET, "t")
        grant = await client.lease()
        data = result_payload(await _model(coord), grant.lease_id, grant.base_version)
        with pytest.raises(ConfigError, match="does not match"):
            await client.submit(grant.lease_id, data, size=len(data) - 1)
        assert coord.version == grant.base_version
        assert coord.metrics.bytes_in == 0
        # The lease is untouched: the right upload is accepted afterwards.
        receipt = await client.submit(grant.lease_id, data, size=len(data))
        assert receipt.status == "accepted"


@pytest.mark.parametrize("form", ["bytes", "file"])
async def test_blocks_over_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    # The TLS transport holds the memoryview blocks until it has encrypted them.
    monkeypatch.setattr(client_mod, "UPLOAD_BLOCK", 64)
    monkeypatch.setattr(client_mod, "FILE_BLOCK", 64)
    cert, key = self_signed(tmp_path)
    make = _as_file(tmp_path) if form == "file" else bytes
    async with running(tmp_path, units=make_units(2, steps=3), durability="none",
                       server_config=ServerConfig(port=0, tls_cert=cert, tls_key=key)) as (coord, server), \
            CoordinatorClient(server.url, ssl_context=client_ssl_context(cert)) as client:
        assert server.url.startswith("https://")
        await client.join(SECRET, "t")
        grant = await client.lease()
        data = result_payload(await _model(coord), grant.lease_id, grant.base_version)
        receipt = await client.submit(grant.lease_id, make(data))
        assert receipt.status == "accepted"
        assert coord.version == grant.base_version + 1


@pytest.mark.parametrize("url", ["http://coord.example:8470/vcasync/", "https://[::1]:8470/a/b",
                                 "http://xn--bcher-kva.example:1", "http://my_host:1"])
def test_a_coordinator_url_may_have_a_path_a_proxy_mounts_it_under(url: str) -> None:
    client_mod.check_coordinator_url(url)
    assert CoordinatorClient(url).url == url.rstrip("/")     # requests go to URL + "/v1/..."
