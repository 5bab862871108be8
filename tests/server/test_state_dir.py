"""The worker's local state directory (``vcasync.worker._state_dir.StateDir``) on a real file
system: what ending a lease leaves behind."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from vcasync.ledger._units import Receipt
from vcasync.worker._state_dir import Identity, StateDir


def test_finishing_a_lease_removes_what_a_write_cut_off_by_a_kill_left(tmp_path: Path) -> None:
    # found by a probe: a SIGKILL during the trainer's checkpoint write left
    # checkpoints/.<lease>.pt.tmp, which stayed for good once the lease ended without another save
    state = StateDir(tmp_path / "w")
    lease = "0.0.abc.def"
    left = []
    for path in (state.checkpoint_path(lease), state.result_path(lease)):
        path.write_bytes(b"whole")
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(b"half")
        left += [path, tmp]
    other = state.checkpoint_path("1.1.other.lease")
    other.with_name(f".{other.name}.tmp").write_bytes(b"another lease's")
    state.finish_lease(lease)
    assert [p for p in left if p.exists()] == []
    assert other.with_name(f".{other.name}.tmp").exists()      # only that lease's


def test_the_receipts_trail_stays_bounded_however_many_results(tmp_path: Path) -> None:
    # found by a probe: receipts.jsonl took a line (~130 bytes) for every result the worker ever
    # delivered and was never cut: 1 MB after 7,500 results of a run of one-step units, growing
    # for as long as the run went on
    state = StateDir(tmp_path / "w")
    state.receipts_max_bytes = 2_000
    sent = [Receipt(f"{n:x}.{n:x}.abc.def", f"e{n}-s0", "accepted", n + 1) for n in range(300)]
    for receipt in sent:
        state.record_receipt(receipt)
    trail = [tmp_path / "w" / "receipts.jsonl", tmp_path / "w" / "receipts.1.jsonl"]
    line = len((tmp_path / "w" / "receipts.jsonl").read_bytes().splitlines()[-1]) + 1
    assert sum(p.stat().st_size for p in trail) <= 2 * 2_000 + line       # 300 lines: ~35 KB
    kept = state.receipts()
    assert 2_000 // line <= len(kept) < len(sent)
    assert kept == sent[-len(kept):]                   # the newest, in order, none torn or lost
    reopened = StateDir(tmp_path / "w")                # a restarted worker reads the same trail
    assert reopened.receipts() == kept


def test_a_receipt_after_a_torn_line_is_kept(tmp_path: Path) -> None:
    # a crash mid-write leaves a line without its newline; the next receipt was appended onto it,
    # so the two made one line that parsed as neither, and the new receipt was lost with the torn one
    state = StateDir(tmp_path / "w")
    first = Receipt("1.1.abc.def", "e0-s0", "accepted", 1)
    state.record_receipt(first)
    with (tmp_path / "w" / "receipts.jsonl").open("ab") as f:
        f.write(b'{"lease_id":"2.2.abc.def","unit_id":"e1-s0","sta')      # torn by a SIGKILL
    after = Receipt("3.3.abc.def", "e2-s0", "accepted", 2)
    state.record_receipt(after)
    assert state.receipts() == [first, after]


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask, whatever the test runner's: it takes nothing away from 0644 or 0755."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("umask_022")
def test_the_state_dir_holding_the_token_is_its_owners_only(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # found by a probe: --state-dir and its subdirs were made 0755 (identity.json alone 0600), and
    # a temporary identity left by a crash kept its 0644 through the next save
    root = tmp_path / "w"
    state = StateDir(root)
    assert [mode(p) for p in (root, root / "checkpoints", root / "results", root / "models")] == [0o700] * 4
    (root / ".identity.json.tmp").write_bytes(b"left by a crash")     # 0644
    state.save_identity(Identity("http://127.0.0.1:1", "w-1", "vca_token_that_is_a_credential"))
    assert mode(root / "identity.json") == 0o600
    assert not caplog.records


@pytest.mark.usefixtures("umask_022")
def test_a_state_dir_others_can_read_is_named_with_the_chmod_to_run(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "old"                 # made before 2026-12-07, or copied in
    root.mkdir(mode=0o755)
    StateDir(root)
    assert not caplog.records               # no token in it: nothing to say
    (root / "identity.json").write_text("{}")
    (root / "identity.json").chmod(0o644)
    StateDir(root)
    (record,) = caplog.records
    assert record.levelname == "WARNING"
    assert str(root) in record.getMessage()
    assert f"chmod 700 {root} && chmod 600 {root / 'identity.json'}" in record.getMessage()
    assert mode(root) == 0o755              # named, not changed behind the operator's back
