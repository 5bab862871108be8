"""SIGTERM and SIGINT at any moment of a ``vcasync worker``'s or ``vcasync coordinator``'s start-up
end it as documented: a worker exits 0 (preempted) having joined and leased nothing, a coordinator
exits 130 having changed nothing. Before, both were held off only once started: a worker SIGTERMed
while it imported torch (seconds, on a loaded spot machine) died of it, exit 143.

The signal comes from the user's code the command is loading (:mod:`signals_on_import`), so it lands
at that moment whatever the machine's speed."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from vcasync.cli import ExitCode

from .conftest import HERE, Procs, free_port

pytestmark = pytest.mark.slow


def start_worker(procs: Procs, signals: str) -> subprocess.Popen[bytes]:
    procs.env.update({"SELF_SIGNALS": signals, "SELF_SIGNAL_AT": "import"})
    # nothing listens there: a worker that tried to join would log "coordinator unreachable"
    return procs.start("w", "worker", "--coordinator", f"http://127.0.0.1:{free_port()}",
                       "--trainer", "signals_on_import:train", "--app-dir", str(HERE),
                       "--state-dir", str(procs.root / "state"))


@pytest.mark.parametrize("sig", ["TERM", "INT"])
def test_a_worker_signalled_while_it_loads_its_trainer_exits_0_having_done_nothing(
        procs: Procs, sig: str) -> None:
    worker = start_worker(procs, sig)
    assert worker.wait(120) == ExitCode.OK, procs.log("w")[-3000:]
    log = procs.log("w")
    assert "stopped before it started: nothing joined or leased" in log
    assert "unreachable" not in log
    assert "joined as worker" not in log
    assert "Traceback" not in log


def test_a_second_sigterm_while_starting_ends_the_worker_at_once(procs: Procs) -> None:
    """Start-up stuck in user code stays stoppable: the second signal is not held."""
    worker = start_worker(procs, "TERM,TERM")
    assert worker.wait(120) == -signal.SIGTERM, procs.log("w")[-3000:]


@pytest.mark.parametrize("sig", ["TERM", "INT"])
def test_a_coordinator_signalled_while_it_builds_the_model_exits_130_and_changes_nothing(
        procs: Procs, sig: str) -> None:
    procs.env.update({"SELF_SIGNALS": sig, "SELF_SIGNAL_AT": "factory"})
    store = procs.root / "store"
    coord = procs.start("c", "coordinator", "--model", "signals_on_import:model", "--app-dir", str(HERE),
                        "--units", "2", "--steps", "3", "--storage", f"file://{store}",
                        "--port", "0", "--port-file", str(procs.root / "url"))
    assert coord.wait(120) == ExitCode.INTERRUPTED, procs.log("c")[-3000:]
    log = procs.log("c")
    assert "stopped before the storage was opened: nothing was changed" in log
    assert "Traceback" not in log
    assert not store.exists()
    assert not (procs.root / "url").exists()


def test_the_command_line_takes_the_signals_before_loading_torch_or_aiohttp() -> None:
    """What runs before ``vcasync.cli.main`` holds the signals is the interpreter and ``import
    vcasync.cli``: that import must not load the heavy packages (seconds on a loaded machine)."""
    out = subprocess.run([sys.executable, "-c", "import sys, vcasync.cli; "
                          "print(sorted(m for m in ('torch', 'aiohttp', 'numpy') if m in sys.modules))"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out
