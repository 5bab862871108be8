"""The status page in a real headless browser (Debian's chromium driven by Playwright) during a LIVE
run: a ``vcasync coordinator`` process and two ``vcasync worker`` processes on 127.0.0.1.

The page must load without a console error, show the same numbers as ``GET /v1/status``, update as
units complete, and draw the evaluation curve this test feeds in as the run's evaluator (it scores
each new model version and sends the accuracy through ``POST /v1/evals``). A full-page screenshot
is kept under the test's tmp dir and copied to ``test-artifacts/status-page.png`` (path printed).

Without chromium or Playwright the test skips, with the reason; in CI (``CI`` set, as ``.ci/run``
does, which also installs chromium) it fails instead: the check must not vanish silently.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
SECRET = "browser-test-join-secret-3b9e1f"
ROOT = Path(__file__).resolve().parents[2]
SLOW_TRAINER_DIR = ROOT / "tests" / "integration"       # slow_digits:train, a throttled digits trainer
UNITS = 8
#: Figures the page shows from the /v1/status document: (data-field, path in the document).
SAME_AS_V1 = ("phase", "run_id", "policy", "durability", "version", "units.queued", "units.leased",
              "units.done", "units.parked", "workers.known", "workers.alive", "workers.quarantined",
              "metrics.merges")
BROWSER_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _unavailable() -> str | None:
    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} is missing (apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; the browser is Debian's chromium)"
    return None


@pytest.fixture(scope="module")
def browser_ready() -> None:
    why = _unavailable()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test: {why}")
        pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, predicate: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _http(url: str, method: str = "GET", body: dict[str, Any] | None = None,
          token: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def _field(doc: dict[str, Any], path: str) -> str:
    node: Any = doc
    for part in path.split("."):
        node = node[part]
    return str(node)


@contextlib.contextmanager
def _processes(root: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "VCASYNC_JOIN_SECRET": SECRET, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "SLOW_DIGITS_DELAY_S": "0.05"}

    def start(name: str, *args: str) -> subprocess.Popen[bytes]:
        with (root / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "vcasync", "--log-level", "info", *args],
                                    stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)


class Evaluator:
    """The run's evaluator: scores each new model version on the digits test split and reports it."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token, self.scored = url, token, -1

    def step(self) -> None:
        from vcasync.examples.digits import evaluate
        from vcasync.wire import decode_payload_bytes

        status, raw = _http(f"{self.url}/v1/models/latest", token=self.token)
        if status != 200:
            return
        payload = decode_payload_bytes(raw, expected_kind="model")
        version = int(payload.meta["version"])
        if version > self.scored:
            accuracy = evaluate(payload.tensors)
            status, body = _http(f"{self.url}/v1/evals", "POST",
                                 {"version": version, "values": {"accuracy": accuracy}}, self.token)
            assert status == 200, body
            self.scored = version


def test_status_page_in_a_browser_during_a_live_run(browser_ready: None, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with _processes(tmp_path) as start:
        start("coordinator", "coordinator", "--model", "vcasync.examples.digits:model",
              "--shards", str(UNITS), "--epochs", "1", "--steps", "60",
              "--storage", f"file://{tmp_path / 'store'}", "--durability", "journal",
              "--port", str(port), "--linger", "600")
        _wait("the coordinator", lambda: _http(f"{url}/healthz")[0] == 200, 90)
        status, raw = _http(f"{url}/v1/join", "POST", {"name": "browser-test"}, SECRET)
        assert status == 200, raw
        token = json.loads(raw)["token"]
        evaluator = Evaluator(url, token)
        evaluator.step()

        def v1() -> dict[str, Any]:
            code, body = _http(f"{url}/v1/status", token=token)
            assert code == 200, body
            doc: dict[str, Any] = json.loads(body)
            return doc

        workers = []
        for i in range(2):
            workers.append(start(f"w{i}", "worker", "--coordinator", url, "--trainer", "slow_digits:train",
                  "--app-dir", str(SLOW_TRAINER_DIR), "--state-dir", str(tmp_path / f"w{i}"),
                  "--name", f"spot-{i}"))

        with sync_playwright() as pw:
            context = pw.chromium.launch_persistent_context(
                tempfile.mkdtemp(dir=tmp_path, prefix="chromium-"), executable_path=CHROMIUM,
                headless=True, args=BROWSER_ARGS, viewport={"width": 1280, "height": 900})
            try:
                page = context.new_page()
                problems: list[str] = []
                page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                        if m.type in ("error", "warning") else None)
                page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
                page.on("response", lambda r: problems.append(f"HTTP {r.status} {r.url}")
                        if r.status >= 400 else None)
                page.goto(f"{url}/status/")
                page.wait_for_selector("body[data-loaded=true]", timeout=30_000)

                def shown(field: str) -> str:
                    return str(page.text_content(f'[data-field="{field}"]'))

                def agrees(doc: dict[str, Any]) -> bool:
                    return all(shown(f) == _field(doc, f) for f in SAME_AS_V1)

                # It updates as units complete, without a reload.
                seen = {shown("units.done")}
                # (watched on /v1/status, polled faster than the page refreshes, so the freeze below
                # comes early in the run even on an idle machine)
                _wait("a unit to complete", lambda: v1()["units"]["done"] >= 1, 120)
                # Mid-run, with the workers frozen (SIGSTOP) so nothing moves: the /v1/status numbers.
                for w in workers:
                    w.send_signal(signal.SIGSTOP)
                try:
                    time.sleep(1.0)               # an upload in flight lands, or stays frozen
                    frozen = v1()
                    assert not frozen["finished"], "the run finished before the mid-run check"
                    _wait("the page to show the mid-run /v1/status numbers", lambda: agrees(frozen), 15)
                    assert v1()["units"] == frozen["units"]
                finally:
                    for w in workers:
                        w.send_signal(signal.SIGCONT)
                deadline = time.monotonic() + 180
                while (len(seen) < 3 or int(max(seen)) < UNITS) and time.monotonic() < deadline:
                    evaluator.step()
                    page.wait_for_timeout(500)
                    seen.add(shown("units.done"))
                assert len(seen) >= 3, f"the page did not follow the run: units done shown {seen}"
                assert str(UNITS) in seen, f"the run did not finish within 180 s: {seen}"
                evaluator.step()

                # The same numbers as GET /v1/status (the run is finished: nothing moves).
                _wait("the run to finish", lambda: v1().get("finished") is True, 60)
                doc = v1()

                _wait("the page to show the /v1/status numbers", lambda: agrees(doc), 15)
                assert shown("units.total") == str(UNITS)
                rows = page.locator("#workers tbody tr")
                names = " ".join(rows.all_text_contents())
                assert "spot-0" in names
                assert "spot-1" in names
                assert page.locator('[data-curve="accuracy"]').count() == 1
                assert page.locator("#curve polyline").count() == 1
                assert page.locator("#events tbody tr.event-join").count() >= 3
                assert page.locator("#staleness rect").count() >= 1

                shot = tmp_path / "status-page.png"
                page.screenshot(path=str(shot), full_page=True)
                artifacts = ROOT / "test-artifacts"
                artifacts.mkdir(exist_ok=True)
                shutil.copy(shot, artifacts / "status-page.png")
                print(f"status page screenshot: {shot} (copied to {artifacts / 'status-page.png'})")
                assert not problems, problems
            finally:
                context.close()


def test_read_token_flow_and_hostile_worker_names(browser_ready: None, tmp_path: Path) -> None:
    """Loopback not trusted (``--status-no-loopback``): the page asks for the read token, takes it
    from the form or from ``#token=`` (then drops it from the address bar), and a worker name
    crafted as HTML is shown as text, never run."""
    from playwright.sync_api import sync_playwright

    read_token = "browser-test-read-token-61c0a9"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with _processes(tmp_path) as start:
        proc = start("coordinator", "coordinator", "--model", "vcasync.examples.digits:model",
                     "--shards", "2", "--epochs", "1", "--steps", "5", "--durability", "none",
                     "--port", str(port), "--status-no-loopback", "--status-token-file",
                     str(_write(tmp_path / "read-token", read_token)))
        _wait("the coordinator", lambda: _http(f"{url}/healthz")[0] == 200 or proc.poll() is not None, 90)
        assert proc.poll() is None, (tmp_path / "coordinator.log").read_text()
        hostile = '<img src=x id=pwned onerror="document.title=1">'
        status, raw = _http(f"{url}/v1/join", "POST", {"name": hostile}, SECRET)
        assert status == 200, raw

        with sync_playwright() as pw:
            context = pw.chromium.launch_persistent_context(
                tempfile.mkdtemp(dir=tmp_path, prefix="chromium-"), executable_path=CHROMIUM,
                headless=True, args=BROWSER_ARGS)
            try:
                page = context.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(f"{url}/status/")
                page.wait_for_selector("#auth:not([hidden])", timeout=30_000)
                assert "status read token" in str(page.text_content("#auth-message"))
                page.fill("#auth-token", "a-wrong-token-of-some-length")
                page.click("#auth button")
                page.wait_for_timeout(1000)
                assert page.get_attribute("body", "data-loaded") is None
                page.fill("#auth-token", read_token)
                page.click("#auth button")
                page.wait_for_selector("body[data-loaded=true]", timeout=30_000)
                assert page.is_hidden("#auth")
                assert hostile in " ".join(page.locator("#workers tbody tr").all_text_contents())
                assert page.locator("#pwned").count() == 0
                assert page.title() == "vcasync status"
                assert read_token not in page.content()

                fresh = context.new_page()                      # a new tab: nothing kept, use #token=
                fresh.goto(f"{url}/status/#token={read_token}")
                fresh.wait_for_selector("body[data-loaded=true]", timeout=30_000)
                assert "token" not in fresh.url
                assert not errors, errors
            finally:
                context.close()


def _write(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    return path
