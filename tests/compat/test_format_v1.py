"""What the format-1 code wrote stays readable: a crashed run's journal (tensors inline in each
entry) replays to the same model and receipts, and old control messages decode to the same values.
The fixtures were written by ``tests/fixtures/make_v1.py`` on that code and are never regenerated."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import torch

from vcasync.coordinator import Coordinator
from vcasync.ledger._units import LeaseGrant, Receipt
from vcasync.policy import build_policy
from vcasync.protocol._messages import (
    MSGPACK,
    decode_control,
    decode_msg,
    encode_msg,
    grant_from_body,
    receipt_from_body,
)
from vcasync.storage import open_storage
from vcasync.wire import decode_payload_bytes

FIXTURES = Path(__file__).parent.parent / "fixtures"
_spec = importlib.util.spec_from_file_location("make_v1", FIXTURES / "make_v1.py")
assert _spec is not None
assert _spec.loader is not None
make_v1 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_v1)


async def _one(data: bytes):
    yield data


async def test_a_format_1_journal_replays_bit_for_bit(tmp_path: Path) -> None:
    expected = json.loads((FIXTURES / "journal_v1.json").read_text())
    shutil.copytree(FIXTURES / "journal_v1", tmp_path / "store")
    want = decode_payload_bytes(bytes.fromhex(expected["model"]), expected_kind="model").tensors
    storage = open_storage(f"file://{tmp_path / 'store'}")
    async with storage, Coordinator(make_v1.model(), make_v1.units(), policy=build_policy("vcasgd"),
                                    storage=storage, config=make_v1.config()) as coord:
        assert coord.version == expected["version"]
        got = coord.model()
        for name, t in want.items():
            assert torch.equal(got[name], t), name
        for lease_id, status in expected["receipts"].items():
            # the body is not read for a lease that has its receipt
            r = await coord.submit(expected["worker_id"], lease_id, _one(b""))
            assert r.status == ("duplicate" if status == "accepted" else status)


def test_format_1_control_messages_decode() -> None:
    msgs = json.loads((FIXTURES / "messages_v1.json").read_text())
    grant = grant_from_body(decode_control(bytes.fromhex(msgs["grant_msgpack"]), MSGPACK, "lease"))
    assert (grant.lease_id, grant.unit.unit_id, grant.unit.shard, grant.unit.num_shards,
            grant.unit.steps, dict(grant.unit.params), grant.base_version, grant.deadline_s,
            grant.heartbeat_interval_s, grant.resumed) == ("L1", "e0-s1", 1, 4, 5, {"lr": 0.1}, 3,
                                                           12.5, 2.0, True)
    receipt = receipt_from_body(decode_control(bytes.fromhex(msgs["receipt_msgpack"]), MSGPACK,
                                               "receipt"))
    assert (receipt.lease_id, receipt.unit_id, receipt.status, receipt.version,
            receipt.reason) == ("L1", "e0-s1", "accepted", 4, None)
    payload = decode_payload_bytes(bytes.fromhex(msgs["result_payload"]), expected_kind="result")
    assert payload.meta["lease_id"] == "L1"
    assert payload.meta["kind"] == "delta"


def test_grants_and_receipts_encode_to_the_same_bytes_as_format_1() -> None:
    msgs = json.loads((FIXTURES / "messages_v1.json").read_text())
    for key, cls in (("grant_msgpack", LeaseGrant), ("receipt_msgpack", Receipt)):
        old = bytes.fromhex(msgs[key])
        assert encode_msg(decode_msg(cls, old, MSGPACK), MSGPACK) == old
