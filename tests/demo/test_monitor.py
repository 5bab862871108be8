"""The demo's monitor against a real coordinator on 127.0.0.1: each scored point is stamped when its
model existed, not when the (slow) evaluation finished, so the fleet's time to target is on DDP's
footing (DDP's points leave evaluation time out)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.server.conftest import SECRET, running, tiny_model
from vcasync.examples.cnn import Evaluation
from vcasync.examples.workloads import Workload
from vcasync.worker._client import CoordinatorClient

pytest.importorskip("sklearn", reason="the demo needs scikit-learn (vcasync[demo])")

from vcasync.demo.monitor import Monitor

EVAL_S = 0.4


class SlowEval(Workload):
    """The coordinator's tiny model, scored after a fixed wait (an evaluation that takes time)."""

    name, metric, model_ref, lr, batch_size = "slow", "accuracy", "tests:tiny", 0.1, 4

    def model(self) -> nn.Module:
        return tiny_model()

    def evaluate(self, net: nn.Module, split: str = "test") -> Evaluation:
        time.sleep(EVAL_S)
        return Evaluation(accuracy=0.5, loss=float(sum(p.detach().abs().sum() for p in net.parameters())))


async def test_a_point_is_stamped_when_its_version_was_first_seen(tmp_path: Path) -> None:
    async with running(tmp_path) as (_, server), CoordinatorClient(server.url) as client:
        await client.join(SECRET, name="demo-monitor", info={"role": "monitor"})
        t0 = time.monotonic()
        mon = Monitor(client, SlowEval(), tmp_path, t0, total_units=4)
        await mon.poll()
        ((seen, version),) = mon.versions
        before = time.monotonic() - t0
        point = await mon.score()
        after = time.monotonic() - t0
    assert point is not None
    assert point.version == version == 0
    assert point.t_s == seen < before
    assert after - before >= EVAL_S  # the evaluation's time is not in the stamp
    # beside each new version, the coordinator's CPU seconds so far (bench.convergence's replay
    # charges the CPU per merged result to the shared cores)
    ((v, cpu),) = mon.coordinator_cpu
    assert v == 0
    assert 0 < cpu <= time.process_time()   # the coordinator runs in this process here


async def test_a_version_no_poll_saw_is_stamped_at_its_download_not_after_its_evaluation(
        tmp_path: Path) -> None:
    async with running(tmp_path) as (_, server), CoordinatorClient(server.url) as client:
        await client.join(SECRET, name="demo-monitor", info={"role": "monitor"})
        t0 = time.monotonic()
        mon = Monitor(client, SlowEval(), tmp_path, t0, total_units=4)
        before = time.monotonic() - t0
        point = await mon.score()
        after = time.monotonic() - t0
    assert point is not None
    assert not mon.versions
    assert before <= point.t_s <= after - EVAL_S
    assert torch.isfinite(torch.tensor(point.loss))


async def test_a_version_scored_already_is_not_scored_again(tmp_path: Path) -> None:
    # Found by a probe: each look at an unchanged model appended the same row again (report.json's
    # curve had 4 duplicates in 10 rows) after an evaluation for nothing.
    async with running(tmp_path) as (_, server), CoordinatorClient(server.url) as client:
        await client.join(SECRET, name="demo-monitor", info={"role": "monitor"})
        t0 = time.monotonic()
        evaluations: list[str] = []

        class Counted(SlowEval):
            def evaluate(self, net: nn.Module, split: str = "test") -> Evaluation:
                evaluations.append(split)
                return super().evaluate(net, split)

        mon = Monitor(client, Counted(), tmp_path, t0, total_units=4)
        first = await mon.score()
        again = await mon.score()
    assert first is not None
    assert again is first
    assert len(mon.accuracy) == 1
    assert evaluations == ["test"]          # no second evaluation
    # both looks are scoring instants (bench.convergence's replay scores its fleet at them)
    assert len(mon.scored_s) == 2
    assert 0 <= mon.scored_s[0] <= mon.scored_s[1]


@pytest.mark.parametrize("terminal", [False, True])
def test_the_live_display_ends_on_a_line_of_its_own_on_a_terminal_or_not(terminal: bool) -> None:
    # Piped or logged, rich prints the last frame without a newline after it: the next line ran into
    # the table's bottom border ("└───┘DDP baseline: 4 processes ...").
    import io

    from rich.console import Console
    from rich.text import Text

    from vcasync.demo.monitor import live_display

    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=40)
    with live_display(console) as live:
        live.update(Text("units done / total 3 / 8"), refresh=True)
    out.write("DDP baseline: 4 processes ...\n")      # the demo's next line (a print to stderr)
    lines = out.getvalue().splitlines()
    assert lines[-1].removeprefix("\x1b[?25h") == "DDP baseline: 4 processes ..."  # on its own line
    assert "units done / total 3 / 8" in lines[-2]
    empty = io.StringIO()
    with live_display(Console(file=empty, force_terminal=False)):
        pass                                  # nothing displayed: no blank line either
    assert empty.getvalue() == ""
