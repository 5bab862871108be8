"""``vcasync coordinator --policy module:Class`` with real processes: a policy class in a module of
the current directory runs a whole run (a worker trains, the run finishes), a restart with the same
``--policy`` is the same run, and a reference to no policy class is a configuration error that
changes nothing."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from vcasync.cli import ExitCode

from .conftest import Procs
from .test_remote_state import wait_until

pytestmark = pytest.mark.slow

MY_POLICY = '''
from typing import ClassVar

import torch


class Half:
    """Halfway from the model to each result."""

    name: ClassVar[str] = "half"
    needs_base: ClassVar[bool] = True
    claims: ClassVar[frozenset[str]] = frozenset({"identity", "convex"})

    def __init__(self, rate: float = 0.5) -> None:
        self.rate = rate

    def init_state(self, model):
        return {"merged": 0}

    def merge(self, model, update, state):
        for name, w in model.items():
            x = update.tensors[name]
            if w.dtype == torch.bool:
                w.copy_(x)
            elif not w.is_floating_point():
                w.add_(x)
            elif update.kind == "weights":
                w.lerp_(x, self.rate)
            else:
                w.lerp_(update.base[name], self.rate).add_(x, alpha=self.rate)
        state["merged"] += 1
        return model
'''


def coordinator(procs: Procs, name: str, policy: str) -> list[str]:
    return ["coordinator", "--policy", policy, "--policy-param", "rate=0.25",
            "--model", "vcasync.examples.digits:model", "--units", "1", "--steps", "2",
            "--storage", f"file://{procs.root / 'store'}", "--port", "0",
            "--port-file", str(procs.root / f"{name}.url"), "--linger", "2"]


def test_a_policy_class_in_the_current_directory_runs_a_run(procs: Procs) -> None:
    (procs.root / "my_policy.py").write_text(MY_POLICY)      # the processes' working directory
    coord = procs.start("c", *coordinator(procs, "c", "my_policy:Half"))
    url_file = procs.root / "c.url"
    wait_until("the coordinator", lambda: url_file.exists() or coord.poll() is not None)
    assert coord.poll() is None, procs.log("c")[-3000:]
    worker = procs.start("w", "worker", "--coordinator", url_file.read_text().strip(),
                         "--trainer", "vcasync.examples.digits:train", "--state-dir", str(procs.root / "w"))
    assert worker.wait(180) == ExitCode.OK, procs.log("w")[-3000:]
    assert coord.wait(60) == ExitCode.OK, procs.log("c")[-3000:]
    assert "1 units, policy half)" in procs.log("c")
    again = procs.start("c2", *coordinator(procs, "c2", "my_policy:Half"))   # the same run
    assert again.wait(120) == ExitCode.OK, procs.log("c2")[-3000:]
    assert "is already finished" in procs.log("c2")


@pytest.mark.parametrize(("policy", "message"), [
    ("my_policy:Nope", "policy 'my_policy:Nope': module 'my_policy' has no attribute 'Nope'"),
    ("my_policy:Half.merge", "policy 'my_policy:Half.merge' is a function, not a class"),
    ("missing_mod:Half", "policy 'missing_mod:Half': cannot import 'missing_mod'"),
])
def test_a_reference_to_no_policy_class_is_a_config_error_that_changes_nothing(
        procs: Procs, policy: str, message: str) -> None:
    (procs.root / "my_policy.py").write_text(MY_POLICY)
    coord = procs.start("c", *coordinator(procs, "c", policy))
    assert coord.wait(120) == ExitCode.CONFIG, procs.log("c")[-3000:]
    log = procs.log("c")
    assert f"vcasync coordinator: configuration error: {message}" in log
    assert "Traceback" not in log
    assert not Path(procs.root / "store").exists()


OTHER_POLICY = MY_POLICY.replace("class Half:", "class Elsewhere:")   # another class named "half"


def started(procs: Procs, name: str, *args: str) -> str:
    """Start a coordinator of ``args``, wait until it serves, stop it (SIGTERM); its log."""
    coord = procs.start(name, *args)
    url_file = procs.root / f"{name}.url"
    wait_until(f"coordinator {name}", lambda: url_file.exists() or coord.poll() is not None)
    assert coord.poll() is None, procs.log(name)[-3000:]
    coord.send_signal(signal.SIGTERM)
    assert coord.wait(60) == ExitCode.INTERRUPTED, procs.log(name)[-3000:]
    return procs.log(name)


def test_reset_policy_switches_a_run_away_from_a_policy_class(procs: Procs) -> None:
    # the run records where its policy class came from, so the replay before the switch imports it
    (procs.root / "my_policy.py").write_text(MY_POLICY)
    started(procs, "c1", *coordinator(procs, "c1", "my_policy:Half"))
    def vcasgd(name: str) -> list[str]:
        args = coordinator(procs, name, "vcasgd")
        return args[:3] + args[5:]          # without the policy parameter 'half' takes
    log = started(procs, "c2", *vcasgd("c2"), "--reset-policy")
    assert "switches from half to vcasgd" in log
    assert started(procs, "c3", *vcasgd("c3"))      # the run is vcasgd's now: no flag needed


def test_another_class_of_the_same_name_resumes_the_run_with_a_warning(procs: Procs) -> None:
    (procs.root / "my_policy.py").write_text(MY_POLICY)
    (procs.root / "other_policy.py").write_text(OTHER_POLICY)
    started(procs, "c1", *coordinator(procs, "c1", "my_policy:Half"))
    log = started(procs, "c2", *coordinator(procs, "c2", "other_policy:Elsewhere"))
    assert ("was started with policy 'half' from 'my_policy:Half'; this start imports 'half' from "
            "'other_policy:Elsewhere', another class of the same name") in log
    assert "WARNING" in log.split("another class of the same name")[0].splitlines()[-1]
