"""The typed control messages: one converter, every field checked on the way in, the same maps as
the hand-written converters built."""

from __future__ import annotations

from typing import Any

import pytest

from vcasync.errors import FrameError
from vcasync.ledger._units import LeaseGrant, Receipt, WorkUnit
from vcasync.protocol._bodies import (
    HeartbeatRequest,
    JoinRequest,
    JournalReject,
    JournalResult,
    RequeueRequest,
    ResultMeta,
    from_body,
    journal_record,
    to_body,
)

GRANT = LeaseGrant("L", WorkUnit("u", shard=1, num_shards=2, steps=3, params={"lr": 0.1}), 4, 9.5,
                   1.0, resumed=True)


@pytest.mark.parametrize("msg", [
    GRANT, Receipt("L", "u", "rejected", 3, "too_stale"), Receipt("L", "u", "accepted", 3),
    JoinRequest("w", {"gpu": "h100"}), HeartbeatRequest(7), RequeueRequest(["a", "b"]),
    JournalResult("result", "w1", "u", "L", 2, "delta", 3, 8, False, {"loss": 0.5}, "increment"),
    JournalReject("reject", "L", "w1", "u", "too_stale"),
])
def test_a_message_round_trips(msg: Any) -> None:
    assert from_body(type(msg), to_body(msg)) == msg


def test_the_grant_map_is_the_one_the_old_converter_built() -> None:
    assert to_body(GRANT) == {"lease_id": "L", "unit": {"unit_id": "u", "shard": 1, "num_shards": 2,
                                                        "epoch": 0, "steps": 3, "params": {"lr": 0.1}},
                              "base_version": 4, "deadline_s": 9.5, "heartbeat_interval_s": 1.0,
                              "resumed": True}


@pytest.mark.parametrize(("cls", "body", "field"), [
    (HeartbeatRequest, {}, "steps_done"),
    (HeartbeatRequest, {"steps_done": -1}, "steps_done"),
    (HeartbeatRequest, {"steps_done": True}, "steps_done"),
    (HeartbeatRequest, {"steps_done": "3"}, "steps_done"),
    (JoinRequest, {"name": "x" * 129}, "name"),
    (Receipt, {"lease_id": "L", "unit_id": "u", "status": "maybe", "version": 1}, "status"),
    (LeaseGrant, {**to_body(GRANT), "unit": {"unit_id": "u", "shard": "0"}}, "shard"),
    (LeaseGrant, {**to_body(GRANT), "unit": []}, "unit"),
    (RequeueRequest, {"units": ["", "b"]}, "units"),
])
def test_a_bad_field_is_a_frame_error_that_names_it(cls: Any, body: dict[str, Any], field: str) -> None:
    with pytest.raises(FrameError) as info:
        from_body(cls, body)
    assert info.value.field == field


def test_a_struct_that_refuses_its_values_is_a_frame_error() -> None:
    with pytest.raises(FrameError, match="shard"):
        from_body(WorkUnit, {"unit_id": "u", "shard": 3, "num_shards": 2})


def test_journal_records_by_type_with_old_entries_read_as_they_were() -> None:
    old = {"type": "result", "worker_id": "w", "unit_id": "u", "lease_id": "L", "base_version": 0,
           "kind": "weights", "steps": 1, "samples": 2, "partial": False, "metrics": {}, "seq": 5}
    record = journal_record(old)           # before the counter rule: no "ints"; "seq" is ignored
    assert isinstance(record, JournalResult)
    assert record.ints is None
    assert record.meta() == ResultMeta("L", 0, "weights", 1, 2, False, {})
    with pytest.raises(FrameError, match="record type"):
        journal_record({"type": "merge"})
