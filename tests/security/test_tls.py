"""TLS end to end with the real commands: ``vcasync coordinator --tls-cert/--tls-key`` and ``vcasync
worker --ca-file`` train to the end over HTTPS; a worker that does not trust the certificate, or
speaks plain HTTP, gets nowhere and changes nothing."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from harness.fleet import free_port, toml_text
from harness.tls import self_signed
from vcasync._spawn import module_command

from .conftest import SECRET


def _vcasync(*args: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "VCASYNC_JOIN_SECRET": SECRET, "OMP_NUM_THREADS": "1"}
    with log.open("wb") as out:
        return subprocess.Popen(module_command("vcasync", *args), stdout=out,
                                stderr=subprocess.STDOUT, env=env)


@pytest.mark.slow
def test_training_over_tls_with_the_real_commands(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    port = free_port()
    (tmp_path / "run.toml").write_text(toml_text({
        "model": {"factory": "vcasync.examples.digits:model"},
        "units": {"shards": 2, "epochs": 1, "steps": 10},
        "storage": {"url": f"file://{tmp_path / 'store'}"},
        "server": {"host": "127.0.0.1", "port": port, "tls_cert": str(cert), "tls_key": str(key)},
        "run": {"linger_s": 3.0, "output": str(tmp_path / "final.pt")}}))
    coord = _vcasync("coordinator", "--config", str(tmp_path / "run.toml"), log=tmp_path / "coord.log")
    try:
        url = f"https://127.0.0.1:{port}"
        common = ["worker", "--trainer", "vcasync.examples.digits:train", "--threads", "1"]
        # Neither a worker that does not trust the certificate nor one speaking plain HTTP gets in.
        untrusting = _vcasync(*common, "--coordinator", url, "--state-dir", str(tmp_path / "u"),
                              log=tmp_path / "untrusting.log")
        assert untrusting.wait(180) != 0
        assert "certificate" in (tmp_path / "untrusting.log").read_text().lower()
        worker = _vcasync(*common, "--coordinator", url, "--ca-file", str(cert),
                          "--state-dir", str(tmp_path / "w"), log=tmp_path / "worker.log")
        assert worker.wait(240) == 0, (tmp_path / "worker.log").read_text()[-2000:]
        assert coord.wait(60) == 0, (tmp_path / "coord.log").read_text()[-2000:]
    finally:
        for p in (coord,):
            if p.poll() is None:
                p.kill()
                p.wait()
    log = (tmp_path / "worker.log").read_text()
    assert "done (finished): 2 accepted" in log
    assert (tmp_path / "final.pt").exists()
    receipts = (tmp_path / "w" / "receipts.jsonl").read_text().splitlines()
    assert len(receipts) == 2


def test_plain_http_to_the_tls_port_is_refused(tmp_path: Path) -> None:
    import http.client
    import ssl

    from harness.probe import CoordinatorProcess

    cert, key = self_signed(tmp_path)
    table = {"model": {"factory": "vcasync.examples.digits:model"},
             "units": {"shards": 1, "epochs": 1, "steps": 1},
             "storage": {"url": f"file://{tmp_path / 'store'}"},
             "server": {"host": "127.0.0.1", "tls_cert": str(cert), "tls_key": str(key)}}
    proc = CoordinatorProcess(tmp_path, table, join_secret=SECRET)
    with pytest.raises(RuntimeError):       # it never answers plain-HTTP /healthz
        proc.start(timeout=20)
    try:
        ctx = ssl.create_default_context(cafile=str(cert))
        deadline = time.monotonic() + 60
        while True:
            try:
                c = http.client.HTTPSConnection("127.0.0.1", proc.port, context=ctx, timeout=5)
                try:
                    c.request("GET", "/healthz")
                    assert c.getresponse().status == 200
                finally:
                    c.close()
                break
            except (ConnectionError, OSError):
                assert time.monotonic() < deadline
                time.sleep(0.2)
    finally:
        proc.stop()
