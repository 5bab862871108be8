"""A ``vcasync coordinator`` start refused as a configuration error (exit status 2) changes nothing:
no run record, no snapshot, no owner lease, so the corrected start is a new run and is not refused
as "not matching the stored run". Each refusal here was found by an operator probe after the run
had been written: a bad TLS file or listen address, a policy plugin that fails validation (exit 1,
"restart", before) and a policy whose initial state cannot be stored (a raw TypeError, exit 1)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.tls import self_signed
from vcasync import storage as storage_module
from vcasync._spawn import module_command
from vcasync.cli import main
from vcasync.policy import refresh_policies, unregister_policy
from vcasync.storage import unregister_backend

SECRET = "s" * 24
MODEL = "vcasync.examples.digits:model"

#: A plugin package of policies, broken in the ways the probe found, installed as a real
#: distribution (a ``.dist-info`` with entry points) on ``sys.path``.
PLUGINS = '''
from typing import ClassVar

from vcasync.plugins.vcasgd import VCASGD


class WrongName(VCASGD):
    name: ClassVar[str] = "not-wrongname"


class NoAnnot(VCASGD):
    name: ClassVar[str] = "noannot"

    def __init__(self, rate=0.5):
        super().__init__()


class BadState(VCASGD):
    name: ClassVar[str] = "badstate"

    def init_state(self, model):
        return {"obj": object()}
'''
ENTRY_POINTS = {"wrongname": "WrongName", "noannot": "NoAnnot", "badstate": "BadState",
                "missingmod": None, "noclass": "NoSuchClass"}


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    site = tmp_path / "site"
    site.mkdir()
    (site / "fa_probe_policies.py").write_text(PLUGINS)
    info = site / "fa_probe_policies-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fa-probe-policies\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[vcasync.policies]\n" + "".join(
        f"{name} = {'fa_probe_policies:' + cls if cls else 'fa_no_such_module:Policy'}\n"
        for name, cls in ENTRY_POINTS.items()))
    monkeypatch.syspath_prepend(str(site))
    refresh_policies()
    yield site
    for name in ENTRY_POINTS:
        unregister_policy(name)
    monkeypatch.undo()
    refresh_policies()


def coordinator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> int:
    """``vcasync coordinator`` on a file storage under ``tmp_path``: its exit status."""
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", SECRET)
    return main(["coordinator", "--model", MODEL, "--units", "2", "--steps", "2", "--port", "0",
                 "--storage", str(tmp_path / "store"), *flags])


def stored(tmp_path: Path) -> list[str]:
    root = tmp_path / "store"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize(("policy", "why"), [
    ("wrongname", "class attribute 'name' is 'not-wrongname'"),
    ("noannot", "constructor parameter 'rate' needs a type annotation"),
    ("missingmod", "cannot import fa_no_such_module:Policy"),
    # an entry point naming a class its module lacks died with an AttributeError, exit 1
    ("noclass", "cannot load fa_probe_policies:NoSuchClass: AttributeError: module "
                "'fa_probe_policies' has no attribute 'NoSuchClass'"),
])
def test_a_policy_plugin_that_fails_validation_is_a_configuration_error(
        plugins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], policy: str, why: str) -> None:
    # exit 1 reads "restart; the run resumes" (docs/operating.md): a restart loop on a bad install
    assert coordinator(tmp_path, monkeypatch, "--policy", policy) == 2
    err = capsys.readouterr().err
    assert f"configuration error: plugin {policy!r}: {why}" in err
    assert "Traceback" not in err
    assert stored(tmp_path) == []


def test_help_lists_a_policy_that_cannot_load_apart_from_the_installed_ones(
        plugins: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["coordinator", "--help"])
    out = capsys.readouterr().out
    installed = out.split("merge policies installed", 1)[1].split("merge policies that cannot load", 1)[0]
    broken = out.split("merge policies that cannot load", 1)[1].split("storage schemes", 1)[0]
    for name in ("wrongname", "noannot", "missingmod", "noclass"):
        assert name not in installed
        assert name in broken
    for name in ("vcasgd", "badstate"):     # badstate validates: its state fails only when made
        assert name in installed
        assert name not in broken


@pytest.fixture
def backend_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Storage backends of a package as pip installs it: one that loads, one whose import fails."""
    site = tmp_path / "backend-site"
    site.mkdir()
    (site / "fa_probe_store.py").write_text(
        "from vcasync.backends.memory import MemoryStorage as Store\n")
    (site / "fa_probe_store_boom.py").write_text('raise RuntimeError("no driver here")\n')
    info = site / "fa_probe_store-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fa-probe-store\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[vcasync.backends]\nfaok = fa_probe_store:Store\n"
                                           "faboom = fa_probe_store_boom:Store\n")
    monkeypatch.syspath_prepend(str(site))
    storage_module._BACKENDS.refresh()
    yield site
    for scheme in ("faok", "faboom"):
        unregister_backend(scheme)
    monkeypatch.undo()
    storage_module._BACKENDS.refresh()


def test_help_lists_a_storage_scheme_that_cannot_load_apart_from_the_installed_ones(
        backend_plugins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # --help listed every declared scheme as installed, one whose backend cannot load too
    with pytest.raises(SystemExit):
        main(["coordinator", "--help"])
    out = capsys.readouterr().out
    installed = out.split("storage schemes installed", 1)[1].split("storage schemes that cannot", 1)[0]
    broken = out.split("storage schemes that cannot load", 1)[1].split("\n\n", 1)[0]
    assert "faok://" in installed
    assert "file://" in installed
    assert "faboom://" in broken
    assert "faboom://" not in installed
    assert "faok://" not in broken
    # and starting on it is a configuration error naming the backend and what its import raised
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", SECRET)
    assert main(["coordinator", "--model", MODEL, "--units", "2", "--port", "0",
                 "--storage", "faboom://x"]) == 2
    err = capsys.readouterr().err
    assert ("configuration error: the faboom:// storage backend: cannot load fa_probe_store_boom:Store: "
            "RuntimeError: no driver here") in err
    assert "Traceback" not in err


def test_help_has_no_broken_list_when_every_policy_loads(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["coordinator", "--help"])
    assert "cannot load" not in capsys.readouterr().out


def test_a_policy_state_that_cannot_be_stored_is_refused_before_anything_is_stored(
        plugins: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # was a TypeError traceback from the first snapshot (exit 1), with the run record and the owner
    # lease already written, and no word of the policy or of init_state
    assert coordinator(tmp_path, monkeypatch, "--policy", "badstate") == 2
    err = capsys.readouterr().err
    assert ("configuration error: policy 'badstate': the state init_state(model) returns cannot be "
            "stored (tree.obj: cannot pack a object") in err
    assert "Serialisable state" in err
    assert "Traceback" not in err
    assert stored(tmp_path) == []


def test_a_policy_parameter_past_its_bound_is_refused_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # was accepted: median's buffer, a copy of the model per result, would have grown with every
    # result until the coordinator ran out of memory, never aggregating
    assert coordinator(tmp_path, monkeypatch, "--policy", "median",
                       "--policy-param", "buffer_size=1000000000000000000") == 2
    err = capsys.readouterr().err
    assert "median: buffer_size must be at most 1,000, got 1,000,000,000,000,000,000" in err
    assert "Traceback" not in err
    assert stored(tmp_path) == []


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield int(s.getsockname()[1])


def tls_flags(tmp_path: Path, case: str) -> list[str]:
    cert, key = self_signed(tmp_path)
    if case == "missing cert":
        return ["--tls-cert", str(tmp_path / "no-such-cert.pem"), "--tls-key", str(key)]
    if case == "swapped":
        return ["--tls-cert", str(key), "--tls-key", str(cert)]
    (tmp_path / "other").mkdir()
    other_cert, _ = self_signed(tmp_path / "other")
    return ["--tls-cert", str(other_cert), "--tls-key", str(key)]      # a key of another certificate


@pytest.mark.parametrize("case", ["missing cert", "swapped", "mismatched"])
def test_tls_files_that_do_not_load_are_refused_before_the_storage_is_touched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        case: str) -> None:
    assert coordinator(tmp_path, monkeypatch, *tls_flags(tmp_path, case)) == 2
    err = capsys.readouterr().err
    assert "configuration error: cannot load TLS certificate" in err
    assert "Traceback" not in err
    assert stored(tmp_path) == []


def test_a_listen_address_that_cannot_be_bound_is_refused_before_the_storage_is_touched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        taken_port: int) -> None:
    for host, port, why in (("999.1.1.1", "0", "cannot listen on 999.1.1.1:0: "),
                            ("192.0.2.1", "0", "cannot listen on 192.0.2.1:0: "),   # not this machine's
                            ("127.0.0.1", str(taken_port), f"cannot listen on 127.0.0.1:{taken_port}: ")):
        assert coordinator(tmp_path, monkeypatch, "--host", host, "--port", port) == 2
        err = capsys.readouterr().err
        assert f"configuration error: {why}" in err, err
        assert stored(tmp_path) == [], host


def test_the_corrected_start_after_a_refused_one_is_a_new_run(tmp_path: Path, taken_port: int) -> None:
    """As the probe found it, with real processes: the refused start left run 1 unit, and the
    corrected start with 2 shards was refused as not matching the stored run."""
    env = {**os.environ, "VCASYNC_JOIN_SECRET": SECRET, "OMP_NUM_THREADS": "1"}
    base = ["coordinator", "--model", MODEL, "--steps", "2", "--storage", str(tmp_path / "store")]
    refused = subprocess.run(module_command("vcasync", *base, "--port", str(taken_port)),
                             capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 2, refused.stderr
    assert f"cannot listen on 127.0.0.1:{taken_port}" in refused.stderr
    assert stored(tmp_path) == []
    port_file = tmp_path / "url"
    with (tmp_path / "coord.log").open("wb") as log:
        proc = subprocess.Popen(module_command("vcasync", *base, "--shards", "2", "--port", "0",
                                               "--port-file", str(port_file)),
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert port_file.exists(), (tmp_path / "coord.log").read_text()[-2000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(60)
    text = (tmp_path / "coord.log").read_text()
    assert "does not match" not in text
    assert status == 130, text[-2000:]
