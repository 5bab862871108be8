"""Watching a demo run: the coordinator's status, the model's test accuracy, and a live rich display.

The monitor joins the coordinator like any client (a ``demo-monitor`` identity that never leases),
polls ``GET /v1/status`` and, every few seconds, downloads the latest model (``GET /v1/models/latest``)
and scores it on the workload's test split (accuracy and loss); each score goes back to the coordinator
(:meth:`~vcasync.worker._client.CoordinatorClient.report_eval`) for the status page's curve. The display
reads ``version`` and ``units.done`` from the coordinator's status document
(:meth:`vcasync.coordinator.Coordinator.status`); while the coordinator is down (restarting) they show
as "?". :func:`live_display` is that display, ended on a line of its own on a terminal or not.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import VCAsyncError
from ..examples.workloads import Workload
from ..wire import decode_payload_bytes
from ..worker._client import CoordinatorClient
from .procs import Slot

__all__ = ["AccuracyPoint", "Monitor", "live_display", "status_figure"]


@contextlib.contextmanager
def live_display(console: Any) -> Iterator[Any]:
    """rich's ``Live`` on ``console`` (a ``rich.console.Console``), its last frame ended by a newline.

    On a terminal rich ends the display with one; when the output is not a terminal (piped,
    logged) it prints the last frame once, at the end, without it, and the next line ran into the
    table's bottom border ("└───┘DDP baseline: 4 processes ...").
    """
    from rich.live import Live

    live = Live(console=console, auto_refresh=False, transient=False)
    try:
        with live:
            yield live
    finally:
        if not console.is_terminal and live.get_renderable() != "":   # a frame was printed
            console.line()


def status_figure(status: Mapping[str, Any], *paths: str) -> int | None:
    """The first integer found at one of the dotted ``paths`` in the status document."""
    for path in paths:
        node: Any = status
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                node = None
                break
            node = node[part]
        if isinstance(node, int) and not isinstance(node, bool):
            return node
    return None


@dataclass(frozen=True, slots=True)
class AccuracyPoint:
    t_s: float
    version: int
    units_done: int | None
    accuracy: float
    loss: float


@dataclass(slots=True)
class Monitor:
    """Status and accuracy history of one run (times from ``t0``, ``time.monotonic``)."""

    client: CoordinatorClient
    work: Workload
    scratch: Path
    t0: float
    total_units: int
    status: dict[str, Any] = field(default_factory=dict)
    accuracy: list[AccuracyPoint] = field(default_factory=list)
    versions: list[tuple[float, int]] = field(default_factory=list)
    #: (version, the coordinator's process CPU seconds) at each new version a poll saw
    coordinator_cpu: list[tuple[int, float]] = field(default_factory=list)
    #: when each score's model was downloaded (from ``t0``): the instants the fleet was scored at,
    #: every 3 s or so (``eval_every_s`` after the last score ended), which the simulator's replay of
    #: the run scores its own fleet at (``bench.convergence.calibrate``)
    scored_s: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def version(self) -> int:
        return self.versions[-1][1] if self.versions else 0

    def units_done(self) -> int | None:
        return status_figure(self.status, "units.done")

    def finished(self) -> bool:
        flag = self.status.get("finished")
        if isinstance(flag, bool):
            return flag
        done = self.units_done()
        return done is not None and done >= self.total_units

    async def poll(self) -> None:
        """Refresh the status; a coordinator that is down (restarting) is counted, not fatal."""
        try:
            self.status = await self.client.status()
        except (VCAsyncError, OSError, TimeoutError) as exc:
            self.errors += 1
            self.status = {**self.status, "unreachable": type(exc).__name__}
            return
        version = status_figure(self.status, "version")
        if version is not None and (not self.versions or self.versions[-1][1] != version):
            self.versions.append((time.monotonic() - self.t0, version))
            cpu = (self.status.get("metrics") or {}).get("process_cpu_seconds_total")
            if isinstance(cpu, int | float) and not isinstance(cpu, bool):
                self.coordinator_cpu.append((version, float(cpu)))

    async def score(self) -> AccuracyPoint | None:
        """Download the latest model and score it; None if the coordinator is unreachable.

        The point is stamped when the scored model existed, not when its score was known: the first
        status poll that showed its version, or the end of its download if no poll saw it. DDP's
        points are stamped the same way (at the step, evaluation time left out,
        :mod:`vcasync.demo.ddp`), so the fleet's time to target does not carry the download and the
        evaluation as a lag DDP is spared.
        """
        dest = self.scratch / "latest.model"
        try:
            _, version = await self.client.download_model("latest", dest)
        except (VCAsyncError, OSError, TimeoutError):
            self.errors += 1
            return None
        fetched = time.monotonic() - self.t0
        self.scored_s.append(fetched)
        if self.accuracy and self.accuracy[-1].version == version:
            # scored already (nothing merged since): the same point again was a duplicate row in
            # report.json's curve, and an evaluation for nothing
            return self.accuracy[-1]
        seen = next((t for t, v in self.versions if v == version), fetched)
        net = self.work.model()
        payload = decode_payload_bytes(dest.read_bytes(), expected_kind="model")
        net.load_state_dict(payload.tensors)
        ev = self.work.evaluate(net, "test")
        point = AccuracyPoint(min(seen, fetched), version, self.units_done(), ev.accuracy, ev.loss)
        self.accuracy.append(point)
        try:      # the status page's curve: the coordinator keeps what its evaluator reports
            await self.client.report_eval(version, {"accuracy": ev.accuracy, "loss": ev.loss})
        except (VCAsyncError, OSError, TimeoutError):
            self.errors += 1
        return point

    def score_weights(self, path: Path) -> AccuracyPoint:
        """Score final weights the coordinator wrote (``--output``) when it is no longer there to
        serve them: at the last version seen, stamped now."""
        import torch

        net = self.work.model()
        net.load_state_dict(torch.load(path, weights_only=True))
        ev = self.work.evaluate(net, "test")
        version = self.versions[-1][1] if self.versions else 0
        point = AccuracyPoint(time.monotonic() - self.t0, version, self.units_done(), ev.accuracy, ev.loss)
        self.accuracy.append(point)
        return point

    def merges_per_s(self, window_s: float = 10.0) -> float:
        if len(self.versions) < 2:
            return 0.0
        t_now, v_now = self.versions[-1]
        older = [p for p in self.versions if p[0] <= t_now - window_s] or self.versions[:1]
        t_then, v_then = older[-1]
        return (v_now - v_then) / (t_now - t_then) if t_now > t_then else 0.0

    def render(self, slots: Sequence[Slot], elapsed_s: float, coordinator_state: str) -> Any:
        """A rich renderable of the run's state."""
        from rich.table import Table

        counts = _count(s.state for s in slots)
        table = Table(title=f"vcasync demo - {elapsed_s:5.0f} s", show_header=False, expand=False)
        table.add_column("what", style="bold")
        table.add_column("value")
        done = self.units_done()
        table.add_row("units done / total", f"{'?' if done is None else done} / {self.total_units}")
        table.add_row("model version", str(self.version))
        down = counts.get("preempting", 0) + counts.get("preempted", 0)
        tail = f"  ({counts['done']} done)" if counts.get("done") else ""
        table.add_row("workers alive / preempted / waiting",
                      f"{counts.get('running', 0)} / {down} / {counts.get('starting', 0)}{tail}")
        last = self.accuracy[-1] if self.accuracy else None
        metric = self.work.metric
        value = None if last is None else last.accuracy if metric == "accuracy" else last.loss
        table.add_row(f"latest test {metric}", "-" if value is None else f"{value:.3f} (v{last.version})"
                      if last is not None else "-")
        table.add_row("merges / s", f"{self.merges_per_s():.1f}")
        table.add_row("coordinator", coordinator_state)
        return table


def _count(states: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in states:
        out[s] = out.get(s, 0) + 1
    return out
