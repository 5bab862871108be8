"""A worker process SIGKILLed mid-unit (no notice, as a spot VM vanishes) and a replacement started on a
*fresh, empty local disk* with the same ``--state URL``: it takes the state over once the dead owner's
record goes silent, resumes the same lease from the checkpoint it finds in storage, and the run ends
with every unit merged exactly once. For file:// (another directory than either local disk) and the S3
and GCS API servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._procs import wait_until
from vcasync.cli import ExitCode
from vcasync.storage import open_storage
from vcasync.testing.emulators import DUMMY_S3_CREDENTIALS, Emulator

from .conftest import HERE, Procs, free_port

pytestmark = pytest.mark.slow

SHARDS, STEPS = 2, 60
BUCKET = "vcasync-state"
ACK = re.compile(r"result for lease (\S+) \(unit (\S+)\) (accepted|duplicate)")
START = re.compile(r"unit (\S+) lease (\S+) starts at step (\d+)")


def http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"null")


@pytest.fixture(scope="module")
def emulators() -> Iterator[dict[str, str]]:
    with Emulator("s3") as s3, Emulator("gcs") as gcs:
        http("PUT", f"{s3.endpoint}/{BUCKET}")
        http("POST", f"{gcs.endpoint}/storage/v1/b?project=test", json.dumps({"name": BUCKET}).encode(),
             {"Content-Type": "application/json"})
        yield {"s3": s3.endpoint, "gs": gcs.endpoint}


def state_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    prefix = f"w-{uuid.uuid4().hex[:10]}"
    if kind == "file":  # a shared file system in real life: neither machine's local disk
        (tmp_path / "bucket").mkdir()
        return (tmp_path / "bucket" / prefix).as_uri()
    endpoint = request.getfixturevalue("emulators")[kind]
    if kind == "s3":
        return f"s3://{BUCKET}/{prefix}?endpoint_url={endpoint}"
    return f"gs://{BUCKET}/{prefix}?emulator_host={endpoint}"


def stored(url: str, prefix: str) -> list[str]:
    async def keys() -> list[str]:
        options = {k: v for k, v in DUMMY_S3_CREDENTIALS.items() if k != "region"} if url.startswith("s3") \
            else {}
        async with open_storage(url, **options) as st:
            return [k async for k in st.list(prefix)]

    return asyncio.run(keys())


def start_coordinator(procs: Procs, tmp_path: Path) -> str:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    procs.start("coord", "coordinator", "--model", "vcasync.examples.digits:model", "--shards", str(SHARDS),
                "--epochs", "1", "--steps", str(STEPS), "--unit-param", "checkpoint_every=5",
                "--storage", f"file://{tmp_path / 'store'}", "--durability", "journal",
                "--lease-timeout", "120", "--port", str(port), "--linger", "600")

    def up() -> bool:
        try:
            http("GET", f"{url}/healthz")
        except OSError:
            return False
        return True

    wait_until("the coordinator", up)
    return url


@pytest.mark.parametrize("kind", ["file", "s3", "gs"])
def test_a_replacement_machine_resumes_a_killed_workers_lease_from_remote_state(
        kind: str, procs: Procs, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = state_url(kind, tmp_path, request)
    procs.env.update({"SLOW_DIGITS_DELAY_S": "0.05", "AWS_ACCESS_KEY_ID": "testing",
                      "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"})
    coordinator = start_coordinator(procs, tmp_path)

    def start_worker(name: str) -> Any:
        return procs.start(name, "worker", "--coordinator", coordinator, "--trainer", "resume_probe:train",
                           "--app-dir", str(HERE), "--state", url, "--state-dir", str(tmp_path / name),
                           "--state-lease", "3")

    first = start_worker("machine-a")
    wait_until("a checkpoint in the remote state", lambda: bool(stored(url, "checkpoints/")))
    (lease,) = json.loads(Path(tmp_path / "machine-a" / "lease.json").read_text())["lease_id"],
    first.send_signal(signal.SIGKILL)       # no notice: the machine and its disk are gone
    first.wait(30)
    assert not ACK.search(procs.log("machine-a")), "the unit ended before the kill; nothing to resume"

    second = start_worker("machine-b")      # a new machine: an empty local disk, the same state URL
    assert second.wait(180) == 0, procs.log("machine-b")[-3000:]
    log_b = procs.log("machine-b")
    assert f"resumed lease {lease}" in log_b, log_b[-3000:]
    starts = {lease_id: int(step) for _, lease_id, step in START.findall(log_b)}
    assert starts[lease] > 0, f"the resumed unit started over: {starts}"
    assert "restored lease" in log_b
    assert "with checkpoint #" in log_b

    acks = ACK.findall(log_b)
    accepted = Counter(unit for _, unit, kind_ in acks if kind_ == "accepted")
    assert sorted(accepted.values()) == [1] * SHARDS, acks    # every unit merged exactly once
    assert lease in {lease_id for lease_id, _, _ in acks}
    assert http("GET", f"{coordinator}/healthz")["version"] == SHARDS
    assert stored(url, "checkpoints/") == []                  # finished leases leave nothing behind
    assert stored(url, "lease.json") == []


def test_a_second_live_worker_on_the_same_state_url_is_refused(procs: Procs, tmp_path: Path,
                                                               request: pytest.FixtureRequest) -> None:
    url = state_url("file", tmp_path, request)
    procs.env["SLOW_DIGITS_DELAY_S"] = "1.0"           # the first worker holds its unit for a minute
    coordinator = start_coordinator(procs, tmp_path)
    args = ["worker", "--coordinator", coordinator, "--trainer", "resume_probe:train", "--app-dir", str(HERE),
            "--state", url, "--state-lease", "3"]
    first = procs.start("first", *args, "--state-dir", str(tmp_path / "first"))
    wait_until("the first worker training", lambda: "starts at step" in procs.log("first"))
    second = procs.start("second", *args, "--state-dir", str(tmp_path / "second"))
    assert second.wait(60) == ExitCode.CONFIG, procs.log("second")[-3000:]
    assert "in use by a live worker" in procs.log("second")
    assert first.poll() is None                        # the holder carries on, its state untouched
    assert stored(url, "owner/") == ["owner/000000000001.json"]


def test_a_state_url_added_to_a_killed_workers_state_dir_takes_its_lease_over(
        procs: Procs, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = state_url("file", tmp_path, request)
    procs.env["SLOW_DIGITS_DELAY_S"] = "0.05"
    coordinator = start_coordinator(procs, tmp_path)
    disk = tmp_path / "disk"
    args = ["worker", "--coordinator", coordinator, "--trainer", "resume_probe:train", "--app-dir", str(HERE),
            "--state-dir", str(disk)]
    first = procs.start("local", *args)                 # a local state dir only
    wait_until("a local checkpoint", lambda: any((disk / "checkpoints").glob("*.pt")))
    lease = json.loads((disk / "lease.json").read_text())["lease_id"]
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    assert not ACK.search(procs.log("local")), "the unit ended before the kill; nothing to resume"

    second = procs.start("remote", *args, "--state", url, "--state-lease", "3")
    assert second.wait(180) == 0, procs.log("remote")[-3000:]
    log = procs.log("remote")
    assert f"moved the local state in {disk} into it" in log, log[-3000:]
    assert f"resumed lease {lease}" in log
    starts = {lease_id: int(step) for _, lease_id, step in START.findall(log)}
    assert starts[lease] > 0, f"the resumed unit started over: {starts}"
    assert stored(url, "identity.json") == ["identity.json"]    # the state now lives in storage


def test_a_checkpoint_saved_after_falling_back_from_a_corrupt_one_is_numbered_past_it(
        procs: Procs, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # A restore that skipped the newest checkpoint (its bytes no longer match its digest) went on
    # numbering from the one it took, so the next checkpoint reused the corrupt one's number: two
    # checkpoints #3, and keeping the newest one (--keep-checkpoints 1) could delete the good one
    # and keep the corrupt one, so the next restart started the unit over.
    url = state_url("file", tmp_path, request)
    port = free_port()
    coordinator = f"http://127.0.0.1:{port}"
    procs.start("coord", "coordinator", "--model", "hold_trainer:model", "--app-dir", str(HERE),
                "--shards", "1", "--epochs", "1", "--steps", "6",
                "--storage", f"file://{tmp_path / 'store'}", "--durability", "journal",
                "--lease-timeout", "120", "--port", str(port), "--linger", "600")
    wait_until("the coordinator", lambda: _up(coordinator))
    bucket = Path(url.removeprefix("file://"))

    def start_worker(name: str, hold_at: int | None, *extra: str) -> Any:
        procs.env.pop("HOLD_AT", None)
        if hold_at is not None:
            procs.env["HOLD_AT"] = str(hold_at)
        return procs.start(name, "worker", "--coordinator", coordinator, "--trainer", "hold_trainer:train",
                           "--app-dir", str(HERE), "--state", url, "--state-dir", str(tmp_path / name),
                           "--state-lease", "3", *extra)

    def checkpoints() -> list[str]:
        return [k.rsplit("/", 1)[1] for k in stored(url, "checkpoints/")]

    first = start_worker("machine-a", 3)
    wait_until("machine-a holding",
               lambda: "holding after the checkpoint of step 3" in procs.log("machine-a"))
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    kept = checkpoints()
    assert [k[:12] for k in kept] == ["000000000002", "000000000003"], kept
    (newest,) = [k for k in stored(url, "checkpoints/") if k.endswith(kept[-1])]
    torn = bucket / newest
    torn.write_bytes(torn.read_bytes()[:40])          # the newest checkpoint no longer matches its digest

    second = start_worker("machine-b", 3, "--keep-checkpoints", "1")
    wait_until("machine-b holding",
               lambda: "holding after the checkpoint of step 3" in procs.log("machine-b"))
    log_b = procs.log("machine-b")
    assert "does not match its digest; trying an older one" in log_b, log_b[-3000:]
    assert "with checkpoint #2" in log_b
    assert [int(s) for _, _, s in START.findall(log_b)] == [2]
    after = checkpoints()
    assert [k[:12] for k in after] == ["000000000004"], after   # past the corrupt #3, which is gone
    second.send_signal(signal.SIGKILL)
    second.wait(30)

    third = start_worker("machine-c", None)
    assert third.wait(180) == 0, procs.log("machine-c")[-3000:]
    log_c = procs.log("machine-c")
    assert [int(s) for _, _, s in START.findall(log_c)] == [3], log_c[-3000:]   # machine-b's step 3
    assert "does not match its digest" not in log_c
    assert http("GET", f"{coordinator}/healthz")["version"] == 1


def _up(url: str) -> bool:
    try:
        http("GET", f"{url}/healthz")
    except OSError:
        return False
    return True
