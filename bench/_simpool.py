"""Simulated cells side by side: one process per core for work whose result depends only on its
arguments.

A simulated run keeps virtual time and draws from seeded generators, so where and beside what it
runs changes no figure it returns, only how long the benchmark takes. Real-process runs never go
through this pool: they measure wall time and need the machine to themselves.

``jobs=1`` runs each call in the caller's process when it is submitted (no pool, no start-up).
The workers are spawned (not forked from a process that has started threads) and use one torch
thread each, as the caller does; arguments and results cross between local processes only.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any, TypeVar

__all__ = ["SimPool"]

T = TypeVar("T")


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


class SimPool:
    """``submit(fn, *args, **kw)`` -> a future; ``fn`` must be a module-level function."""

    def __init__(self, jobs: int) -> None:
        if jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {jobs}")
        self.jobs = jobs
        spawn = multiprocessing.get_context("spawn")
        self._ex: Executor | None = (ProcessPoolExecutor(jobs, mp_context=spawn, initializer=_one_thread)
                                     if jobs > 1 else None)

    def submit(self, fn: Callable[..., T], *args: Any, **kw: Any) -> Future[T]:
        if self._ex is not None:
            return self._ex.submit(fn, *args, **kw)
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args, **kw))
        except Exception as e:  # handed to the caller through the future, as the pool would
            done.set_exception(e)
        return done

    def __enter__(self) -> SimPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self._ex is None:
            return
        if exc_type is None:
            self._ex.shutdown(wait=True, cancel_futures=True)
            return
        # Interrupted (Ctrl-C, SIGTERM, an error): the cells still running are of no use. Waiting
        # for them took minutes after a Ctrl-C, and a SIGTERM to this process alone left them
        # running after it. This benchmark's only multiprocessing children are the pool's (its
        # real runs' processes are subprocesses).
        self._ex.shutdown(wait=False, cancel_futures=True)
        for child in multiprocessing.active_children():
            child.terminate()
        for child in multiprocessing.active_children():
            child.join(10)
