"""A deterministic fleet simulator: the real coordinator, ledger and merge policies on a virtual clock.

    from vcasync.sim import SimConfig, Simulation, summarize
    summary = summarize(Simulation(SimConfig(policy="vcasgd")).run())

Modules: :mod:`.clock` (virtual-time event loop),
:mod:`.fleet` (machines and preemption), :mod:`.signals` (what workers train), :mod:`.worker`
(a simulated worker session), :mod:`.engine` (the run), :mod:`.sync` (the synchronous on-demand
baseline), :mod:`.cost` (billing), :mod:`.report` (figures, text, plot), :mod:`.cli`. Prices and the
cost-to-target arithmetic live in :mod:`vcasync.costing`, the models and data in :mod:`vcasync.examples`
(shared with :mod:`vcasync.demo`, which this package never imports).
The engine imports the coordinator, so it loads lazily here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..costing.prices import DEFAULT_INSTANCE, DEFAULT_PRICES, InstancePrice, PriceTable
from .clock import SimulationStalledError, VirtualClock, VirtualEventLoop, run_virtual
from .config import SimConfig
from .fleet import FleetConfig, MachineProfile, NoPreemption, Outage, PoissonPreemption, TracePreemption

if TYPE_CHECKING:
    from .engine import SimOutcome, Simulation
    from .report import summarize

__all__ = [
    "DEFAULT_INSTANCE",
    "DEFAULT_PRICES",
    "FleetConfig",
    "InstancePrice",
    "MachineProfile",
    "NoPreemption",
    "Outage",
    "PoissonPreemption",
    "PriceTable",
    "SimConfig",
    "SimOutcome",
    "Simulation",
    "SimulationStalledError",
    "TracePreemption",
    "VirtualClock",
    "VirtualEventLoop",
    "run_virtual",
    "summarize",
]

_LAZY = {"Simulation": ".engine", "SimOutcome": ".engine", "summarize": ".report"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vcasync.sim' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(module, __name__), name)
