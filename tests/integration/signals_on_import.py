"""User code that signals its own process while ``vcasync`` is still starting: at its import (a
worker's ``--trainer``) or in its model factory (a coordinator's ``--model``), the moments a spot
machine's preemption notice lands while torch and the user's code load. ``SELF_SIGNALS`` names the
signals sent, in order (``TERM``, ``INT``, ``TERM,TERM``); each is handled before the next line runs.
Loaded with ``--app-dir`` pointing here."""

from __future__ import annotations

import os
import signal

import torch

from vcasync.trainer import TrainContext, TrainResult


def _signal_self() -> None:
    for name in filter(None, os.environ.get("SELF_SIGNALS", "").split(",")):
        os.kill(os.getpid(), getattr(signal, f"SIG{name}"))


if os.environ.get("SELF_SIGNAL_AT") == "import":
    _signal_self()


def train(ctx: TrainContext) -> TrainResult:
    raise AssertionError("a worker stopped while starting must not train")


def model() -> torch.nn.Module:
    if os.environ.get("SELF_SIGNAL_AT") == "factory":
        _signal_self()
    return torch.nn.Linear(2, 2)
