"""The worker's local state directory (``vcasync.worker._state_dir.StateDir``) on a real file
system: what ending a lease leaves behind."""

from __future__ import annotations

from pathlib import Path

from vcasync.worker._state_dir import StateDir


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
