"""A run under a storage prefix, seen through real ``vcasync coordinator`` processes on S3 and GCS API
servers (moto, gcp-storage-emulator; the stock GCS emulator for a store that ignores preconditions).

A restart keeps the run (its id and lease secret: leases in flight stay valid); a store that ignores
if-absent writes is refused (or, when allowed, warned about); a start with another model, units or
policy is refused with what differs; a finished run exits at once with its result; a missing bucket
and missing GCS credentials are named at once; a transient fault during start-up is retried.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import CHAOS_COORDINATOR, harness_env
from vcasync.cli import ExitCode
from vcasync.storage import open_storage
from vcasync.testing.emulators import DUMMY_S3_CREDENTIALS
from vcasync.worker._client import CoordinatorClient

BUCKET = "vcasync-tests"
SECRET = "runs-join-secret-4f0a9b7c"
MODEL = "vcasync.examples.digits:model"


def _url(kind: str, request: pytest.FixtureRequest, prefix: str, bucket: str = BUCKET) -> str:
    if kind == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        return f"s3://{bucket}/{prefix}?endpoint_url={endpoint}&region=us-east-1"
    fixture = "stock_gcs_endpoint" if kind == "stock-gs" else "gcs_endpoint"
    return f"gs://{bucket}/{prefix}?emulator_host={request.getfixturevalue(fixture)}"


class Coord:
    """One ``python -m vcasync coordinator`` process, its log in a file."""

    def __init__(self, tmp: Path, storage: str, *args: str, env: dict[str, str] | None = None,
                 name: str = "coord", module: str = "vcasync") -> None:
        self.port_file = tmp / f"{name}.port"
        self.port_file.unlink(missing_ok=True)
        self.log_path = tmp / f"{name}.log"
        environ = {**os.environ, "VCASYNC_JOIN_SECRET": SECRET, "OMP_NUM_THREADS": "1",
                   "AWS_ACCESS_KEY_ID": DUMMY_S3_CREDENTIALS["aws_access_key_id"],
                   "AWS_SECRET_ACCESS_KEY": DUMMY_S3_CREDENTIALS["aws_secret_access_key"],
                   **(env or {})}
        if module == CHAOS_COORDINATOR:
            environ = harness_env(environ)
        cmd = [sys.executable, "-m", module, "coordinator", "--model", MODEL, "--storage",
               storage, "--host", "127.0.0.1", "--port", "0", "--port-file", str(self.port_file),
               "--linger", "0", "--durability", "journal", *args]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=environ,
                                         cwd=tmp)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float = 90) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the coordinator did not exit:\n{self.log()[-3000:]}") from None

    def ready(self, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.port_file.exists():
                return self.port_file.read_text().strip()
            if self.proc.poll() is not None:
                raise AssertionError(f"the coordinator exited {self.proc.returncode}:\n"
                                     f"{self.log()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"the coordinator never listened:\n{self.log()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.wait()


@pytest.fixture
def coords(tmp_path: Path) -> Iterator[list[Coord]]:
    """Every coordinator a test starts; any still running is killed (by its own pid) at the end."""
    started: list[Coord] = []
    yield started
    for c in started:
        if c.proc.poll() is None:
            c.proc.kill()
            c.proc.wait()


def start(coords: list[Coord], tmp: Path, storage: str, *args: str, **kw: Any) -> Coord:
    c = Coord(tmp, storage, *args, **kw)
    coords.append(c)
    return c


async def _status(url: str) -> dict[str, Any]:
    async with CoordinatorClient(url) as client:
        await client.join(SECRET, "probe")
        return await client.status()


async def _token(url: str) -> str:
    async with CoordinatorClient(url) as client:
        _, token = await client.join(SECRET, "w")
        return str(token)


async def _status_with(url: str, token: str) -> int:
    import aiohttp

    async with aiohttp.ClientSession() as http, \
            http.get(f"{url}/v1/status", headers={"Authorization": f"Bearer {token}"}) as resp:
        return resp.status


def start_worker(tmp_path: Path, url: str, *args: str) -> subprocess.Popen[bytes]:
    """A real digits worker on ``url`` (more ``vcasync worker`` flags in ``args``), its log in
    ``tmp_path/worker.log``, its state in ``w``."""
    env = {**os.environ, "VCASYNC_JOIN_SECRET": SECRET, "OMP_NUM_THREADS": "1"}
    with (tmp_path / "worker.log").open("ab") as log:
        return subprocess.Popen([sys.executable, "-m", "vcasync", "worker", "--coordinator", url,
                                 "--trainer", "vcasync.examples.digits:train", "--state-dir",
                                 str(tmp_path / "w"), *args], stdout=log, stderr=subprocess.STDOUT,
                                env=env, cwd=tmp_path)


# -- issue 19: a restart must never forget the run --------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("kind", ["s3", "stock-gs"])
def test_a_restart_keeps_the_run_and_the_leases_in_flight(kind: str, request: pytest.FixtureRequest,
                                                          tmp_path: Path, unique_prefix: str,
                                                          coords: list[Coord]) -> None:
    storage = _url(kind, request, unique_prefix)
    unsafe = ["--allow-unsafe-store"] if kind == "stock-gs" else []
    first = start(coords, tmp_path, storage, "--units", "4", *unsafe)
    url = first.ready()

    async def lease_two() -> tuple[str, list[str], str]:
        async with CoordinatorClient(url) as client:
            _, token = await client.join(SECRET, "w")
            grants = [await client.lease(), await client.lease()]
            return token, [g.lease_id for g in grants], (await client.status())["run_id"]

    token, leases, run_id = asyncio.run(lease_two())
    first.stop(signal.SIGKILL)                 # a crash: nothing more is written

    second = start(coords, tmp_path, storage, "--units", "4", *unsafe, name="again")
    url = second.ready()

    async def carry_on() -> str:
        async with CoordinatorClient(url, token=token) as client:
            for lease_id in leases:             # "never issued here" if the secret had changed
                await client.heartbeat(lease_id, 1)
            return str((await client.status())["run_id"])

    assert asyncio.run(carry_on()) == run_id
    if kind == "stock-gs":
        assert "UNSAFE STORE" in second.log()
    second.stop()


KEYS = {k: v for k, v in DUMMY_S3_CREDENTIALS.items() if k != "region"}   # the URL has the region


async def _journal(url: str) -> list[str]:
    async with open_storage(url, **KEYS) as st:
        return [k async for k in st.list("vcasync/journal/")]


def _run_until_journaled(tmp: Path, url: str, entries: int, coords: list[Coord],
                         max_units: int) -> list[str]:
    """A coordinator and a worker on ``url`` until its journal holds ``entries``; then both are
    SIGKILLed, so the entries stay (a clean stop would fold them into its final snapshot). The
    worker takes at most ``max_units`` of the run's 20, so the run never ends and folds its
    journal before it is seen (it did: 20 units of 60 ms ended between two looks at the journal,
    and the loop waited 240 s for entries that were in the final snapshot)."""
    tmp.mkdir()
    c = start(coords, tmp, url, "--units", "20", "--steps", "20")
    worker = start_worker(tmp, c.ready(), "--max-units", str(max_units))
    try:
        deadline = time.monotonic() + 240
        while len(keys := asyncio.run(_journal(url))) < entries:
            assert time.monotonic() < deadline, (tmp / "worker.log").read_text()[-2000:]
            time.sleep(0.5)
    finally:
        c.stop(signal.SIGKILL)
        worker.kill()
        worker.wait()
    return keys


@pytest.mark.slow
def test_a_journal_entry_of_another_run_is_not_replayed(request: pytest.FixtureRequest,
                                                        tmp_path: Path, unique_prefix: str,
                                                        coords: list[Coord]) -> None:
    # An entry copied (or restored) into this run's journal from another run's, same units and
    # model, was merged on replay without a word; its lease was never signed by this run.
    mine = _url("s3", request, f"{unique_prefix}-mine")
    other = _url("s3", request, f"{unique_prefix}-other")
    kept = _run_until_journaled(tmp_path / "mine", mine, 1, coords, max_units=5)       # 1 to 5
    theirs = _run_until_journaled(tmp_path / "other", other, len(kept) + 1, coords, max_units=15)
    foreign = theirs[len(kept)]                  # the seq that comes next in this run's journal

    async def copy() -> None:
        async with open_storage(other, **KEYS) as src, open_storage(mine, **KEYS) as dst:
            entry = await src.get(foreign)
            await dst.put(foreign, entry)
            async for key in src.list("vcasync/incoming/"):
                if key.encode() in entry:        # the received bytes the record names
                    await dst.put(key, await src.get(key))

    asyncio.run(copy())
    again = start(coords, tmp_path, mine, "--units", "20", "--steps", "20", name="again")
    assert again.wait() == ExitCode.STORAGE
    log = again.log()
    assert "which this run never granted" in log
    assert "coordinator listening" not in log


def test_a_store_that_ignores_preconditions_is_refused(stock_gcs_endpoint: str, tmp_path: Path,
                                                       unique_prefix: str,
                                                       coords: list[Coord]) -> None:
    storage = f"gs://{BUCKET}/{unique_prefix}?emulator_host={stock_gcs_endpoint}"
    c = start(coords, tmp_path, storage, "--units", "2")
    assert c.wait() == ExitCode.CONFIG
    log = c.log()
    assert "does not honour conditional writes" in log
    assert "--allow-unsafe-store" in log

    async def left_behind() -> list[str]:
        async with open_storage(storage) as st:
            return [k async for k in st.list()]

    assert asyncio.run(left_behind()) == []    # the probe cleaned up; no run was recorded


# -- issue 19 / 13: a prefix that already holds a run ------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("kind", ["s3", "gs"])
def test_a_different_configuration_is_refused_and_the_same_one_resumes(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path, unique_prefix: str,
        coords: list[Coord]) -> None:
    storage = _url(kind, request, unique_prefix)
    first = start(coords, tmp_path, storage, "--units", "4")
    run_id = asyncio.run(_status(first.ready()))["run_id"]
    first.stop()

    async def record() -> bytes:
        creds = {k: v for k, v in DUMMY_S3_CREDENTIALS.items() if k != "region"}
        async with open_storage(storage, **({} if kind == "gs" else creds)) as st:
            return await st.get("vcasync/run")

    before = asyncio.run(record())
    units = start(coords, tmp_path, storage, "--units", "8", name="units")
    policy = start(coords, tmp_path, storage, "--units", "4", "--policy", "fedasync", name="policy")
    params = start(coords, tmp_path, storage, "--units", "4", "--policy-param", "alpha=0.7",
                   name="params")
    assert units.wait() == policy.wait() == params.wait() == ExitCode.CONFIG
    assert "units: the run has 4 (e0-s0 .. e3-s0), this start asks for 8" in units.log()
    assert "policy: the run uses vcasgd" in policy.log()
    assert "asks for fedasync" in policy.log()
    assert '"alpha": 0.7' in params.log()
    assert "--reset-policy" in params.log()
    for refused in (units, policy, params):
        assert "--new-run" in refused.log()
    assert asyncio.run(record()) == before     # a refused start changes nothing

    # Naming a default explicitly is the same run; --reset-policy switches the policy.
    same = start(coords, tmp_path, storage, "--units", "4", "--policy-param", "alpha=0.5",
                 name="same")
    assert asyncio.run(_status(same.ready()))["run_id"] == run_id
    same.stop()
    reset = start(coords, tmp_path, storage, "--units", "4", "--policy", "fedasync",
                  "--reset-policy", name="reset")
    status = asyncio.run(_status(reset.ready()))
    assert (status["run_id"], status["policy"]) == (run_id, "fedasync")
    reset.stop()
    again = start(coords, tmp_path, storage, "--units", "4", "--policy", "fedasync", name="again")
    assert asyncio.run(_status(again.ready()))["run_id"] == run_id   # recorded: no flag needed now
    old_token = asyncio.run(_token(again.ready()))
    again.stop()
    new = start(coords, tmp_path, storage, "--units", "8", "--new-run", name="new")
    assert asyncio.run(_status(new.ready()))["run_id"] != run_id
    # found by hand: the old run's worker tokens outlived --new-run, so its workers joined the
    # new run without its join secret
    assert asyncio.run(_status_with(new.ready(), old_token)) == 401
    new.stop()


@pytest.mark.slow
def test_a_finished_run_exits_at_once_with_its_result(request: pytest.FixtureRequest,
                                                      tmp_path: Path, unique_prefix: str,
                                                      coords: list[Coord]) -> None:
    storage = _url("s3", request, unique_prefix)
    args = ("--units", "2", "--steps", "5")
    first = start(coords, tmp_path, storage, *args)
    url = first.ready()
    worker = start_worker(tmp_path, url)
    try:
        assert first.wait(240) == ExitCode.OK
    finally:
        worker.kill()
        worker.wait()
    began = time.monotonic()
    again = start(coords, tmp_path, storage, *args, "--output", str(tmp_path / "final.pt"),
                  name="again")
    assert again.wait() == ExitCode.OK
    assert time.monotonic() - began < 60
    assert "already finished" in again.log()
    assert not again.port_file.exists()        # it never served
    assert (tmp_path / "final.pt").exists()


# -- missing buckets, missing credentials, transient faults at start-up -----------------------------

@pytest.mark.parametrize("kind", ["s3", "gs"])
def test_a_missing_bucket_is_named(kind: str, request: pytest.FixtureRequest, tmp_path: Path,
                                   coords: list[Coord]) -> None:
    c = start(coords, tmp_path, _url(kind, request, "p", bucket="no-such-bucket"), "--units", "2")
    assert c.wait() != ExitCode.OK
    assert "the bucket 'no-such-bucket' does not exist" in c.log()
    assert "ObjectNotFoundError" not in c.log()


@pytest.mark.parametrize("kind", ["s3", "gs"])
@pytest.mark.parametrize("prefix", ["runs//a", "runs/./a", "runs/../a"])
def test_a_prefix_that_is_no_key_is_a_configuration_error(kind: str, prefix: str,
                                                          request: pytest.FixtureRequest,
                                                          tmp_path: Path, coords: list[Coord]) -> None:
    # A typo in the URL's path is the operator's to fix: exit 2 naming the URL and its prefix
    # (it was exit 4, "storage error: key 'runs//a' has an empty part", naming neither).
    c = start(coords, tmp_path, _url(kind, request, prefix), "--units", "2")
    assert c.wait() == ExitCode.CONFIG
    log = c.log()
    assert "configuration error" in log
    assert f"{kind}://{BUCKET}/{prefix}?" in log
    assert f"the prefix {prefix!r} cannot be used" in log


@pytest.mark.parametrize("where", ["url", "env"])
def test_an_aws_profile_that_does_not_exist_is_named(where: str, request: pytest.FixtureRequest,
                                                     tmp_path: Path, coords: list[Coord]) -> None:
    # A typo in ?profile= or AWS_PROFILE ended the coordinator on botocore's ProfileNotFound
    # traceback (exit 1); it is a configuration error naming the profile and where it came from.
    empty = tmp_path / "aws-config"
    empty.write_text("")
    env = {"AWS_CONFIG_FILE": str(empty), "AWS_SHARED_CREDENTIALS_FILE": str(empty)}
    url = _url("s3", request, "p")
    if where == "url":
        url += "&profile=no-such-profile"
    else:
        env["AWS_PROFILE"] = "no-such-profile"
    c = start(coords, tmp_path, url, "--units", "2", env=env)
    assert c.wait() == ExitCode.CONFIG
    log = c.log()
    assert "Traceback" not in log
    assert "the AWS profile 'no-such-profile'" in log
    assert ("?profile=" if where == "url" else "AWS_PROFILE") in log


def test_gcs_without_credentials_says_so_quickly(tmp_path: Path, coords: list[Coord]) -> None:
    closed = tmp_path / "no-gcloud"
    closed.mkdir()
    env = {"CLOUDSDK_CONFIG": str(closed), "GOOGLE_APPLICATION_CREDENTIALS": "",
           "STORAGE_EMULATOR_HOST": "", "GCE_METADATA_HOST": "127.0.0.1:9"}   # nothing listens
    began = time.monotonic()
    c = start(coords, tmp_path, f"gs://{BUCKET}/p", "--units", "2", env=env)
    assert c.wait() != ExitCode.OK
    assert time.monotonic() - began < 40      # the process start itself takes a few seconds
    log = c.log()
    assert "no Google Cloud credentials were found" in log
    assert "GOOGLE_APPLICATION_CREDENTIALS" in log
    assert "application-default login" in log


def test_a_transient_fault_while_starting_is_retried(request: pytest.FixtureRequest,
                                                     tmp_path: Path, unique_prefix: str,
                                                     coords: list[Coord]) -> None:
    # Seeded (3 of the start-up writes fail, then a whole attempt succeeds), as a hiccup would;
    # injected through the test-only entry point, which runs the same coordinator command.
    faults = {"VCASYNC_STORAGE_FAULTS": "fail=0.2,ops=put,seed=4"}
    c = start(coords, tmp_path, _url("s3", request, unique_prefix), "--units", "2", env=faults,
              module=CHAOS_COORDINATOR)
    c.ready()
    assert "coordinator start-up failed" in c.log()
    c.stop()
