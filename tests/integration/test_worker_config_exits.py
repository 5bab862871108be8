"""What a worker, or ``vcasync requeue``, says when it is set up wrong, with real processes: a TLS
coordinator whose certificate it does not trust is a configuration error (one line naming the
certificate and ``--ca-file``, exit 2: a supervisor restarting it for ever would not help), and plain
HTTP to the TLS port gives up with a hint of TLS; a wrong operator token is exit 2 too. A trainer
that returns None stops its worker, which hands its lease back first, so the unit goes on elsewhere
at once instead of after the lease timeout; its ``identity.json`` under ``--state file://`` is 0600."""

from __future__ import annotations

import ssl
import stat
import time
import urllib.request
from pathlib import Path

import pytest

from harness.tls import self_signed
from vcasync.cli import ExitCode

from .conftest import HERE, Procs, free_port
from .test_remote_state import start_coordinator, wait_until

pytestmark = pytest.mark.slow

OPERATOR = "operator-token-for-tests-7d1e0c4b2a"


def start_tls_coordinator(procs: Procs, tmp_path: Path) -> tuple[int, Path]:
    cert, key = self_signed(tmp_path)
    (tmp_path / "operator").write_text(OPERATOR + "\n")
    port = free_port()
    procs.start("coord", "coordinator", "--model", "vcasync.examples.digits:model", "--shards", "1",
                "--steps", "5", "--storage", f"file://{tmp_path / 'store'}", "--port", str(port),
                "--tls-cert", str(cert), "--tls-key", str(key), "--linger", "600",
                "--operator-token-file", str(tmp_path / "operator"))
    trusting = ssl.create_default_context(cafile=str(cert))

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=5,
                                        context=trusting) as r:
                return r.status == 200
        except OSError:
            return False

    wait_until("the TLS coordinator", up)
    return port, cert


def error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("vcasync ")]


def test_tls_set_up_wrong_is_a_configuration_error_with_the_fix_named(procs: Procs, tmp_path: Path) -> None:
    port, cert = start_tls_coordinator(procs, tmp_path)
    url = f"https://127.0.0.1:{port}"
    worker = ["worker", "--trainer", "vcasync.examples.digits:train", "--threads", "1"]

    # No --ca-file for a self-signed certificate: was a ClientConnectorCertificateError traceback, exit 1.
    untrusting = procs.start("untrusting", *worker, "--coordinator", url, "--state-dir", str(tmp_path / "u"))
    assert untrusting.wait(60) == ExitCode.CONFIG, procs.log("untrusting")[-3000:]
    log = procs.log("untrusting")
    assert "Traceback" not in log
    (line,) = error_lines(log)
    assert line.startswith(f"vcasync worker: configuration error: the coordinator at {url} presented a "
                           "TLS certificate that does not verify (self-signed certificate)"), line
    assert "--ca-file" in line

    # requeue: the coordinator runs and the URL is right; the certificate is what to fix.
    requeue = procs.start("requeue", "requeue", "--coordinator", url, "--operator-token-file",
                          str(tmp_path / "operator"))
    assert requeue.wait(60) == ExitCode.CONFIG, procs.log("requeue")[-3000:]
    log = procs.log("requeue")
    assert "Traceback" not in log
    assert "is it running" not in log
    (line,) = error_lines(log)
    assert "certificate that does not verify" in line, line
    assert "--ca-file" in line
    assert "nothing was requeued" in line

    # With the CA but the wrong operator token: configuration (exit 2), as a refused join secret is.
    (tmp_path / "wrong").write_text("not-the-operator-token-0123456789\n")
    wrong = procs.start("wrong-token", "requeue", "--coordinator", url, "--ca-file", str(cert),
                        "--operator-token-file", str(tmp_path / "wrong"))
    assert wrong.wait(60) == ExitCode.CONFIG, procs.log("wrong-token")[-3000:]
    (line,) = error_lines(procs.log("wrong-token"))
    assert "refused the operator token" in line, line

    # Plain HTTP to the TLS port: the server hangs up; the worker gives up with a hint of TLS.
    plain = procs.start("plain", *worker, "--coordinator", f"http://127.0.0.1:{port}",
                        "--state-dir", str(tmp_path / "p"), "--give-up-after", "2")
    assert plain.wait(60) == ExitCode.ERROR, procs.log("plain")[-3000:]
    log = procs.log("plain")
    assert "Traceback" not in log
    (line,) = error_lines(log)
    assert "use https://" in line, line


def test_a_trainer_returning_none_hands_its_lease_back_before_the_worker_stops(
        procs: Procs, tmp_path: Path) -> None:
    coordinator = start_coordinator(procs, tmp_path)      # 2 units, a lease timeout of 120 s
    state = tmp_path / "shared-fs" / "b"
    broken = procs.start("broken", "worker", "--coordinator", coordinator, "--trainer", "none_trainer:train",
                         "--app-dir", str(HERE), "--state", state.as_uri())
    assert broken.wait(60) == ExitCode.ERROR, procs.log("broken")[-3000:]
    assert "the trainer returned NoneType" in procs.log("broken")
    # file:// storage keeps credentials to their owner: the worker's token, the lease-signing secret
    for secret in (state / "identity.json", tmp_path / "store" / "vcasync" / "run"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    started = time.monotonic()
    good = procs.start("good", "worker", "--coordinator", coordinator, "--trainer",
                       "vcasync.examples.digits:train", "--threads", "1", "--state-dir", str(tmp_path / "g"))
    # Both units, the broken worker's too, long before its lease would have timed out.
    assert good.wait(100) == 0, procs.log("good")[-3000:]
    assert "done (finished): 2 accepted" in procs.log("good")
    assert time.monotonic() - started < 100
