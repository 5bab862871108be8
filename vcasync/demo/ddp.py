"""The baseline a user would run instead: synchronous data-parallel training with ``torch.distributed``.

:func:`run_ddp` starts ``N`` real processes (``python -m vcasync.demo.ddp``), which join a gloo
process group on 127.0.0.1 and train the workload's model (:mod:`vcasync.examples.workloads`) with
``DistributedDataParallel``: every step each
rank computes the gradient of its own ``batch_size`` samples, DDP averages them (an all-reduce), and
all ranks apply the same SGD step, i.e. one step on a batch of ``N x batch_size`` samples, the same
samples the single-process :func:`vcasync.demo.baseline.sync_sgd` draws. Rank 0 evaluates at regular
steps and writes its curve to a JSON file.

The clock starts in the parent **before the processes are spawned**, like the asynchronous run's clock
starts before its coordinator: interpreter start, ``import torch``, data loading and the rendezvous
are paid on both sides. Evaluation time is taken off rank 0's clock (the other ranks wait for it at
the next all-reduce), since the asynchronous run is scored by a separate monitor. ``min_step_s``
paces each step (its gradient, all-reduce and update) to at least that long, as the demo's
``--min-step-s`` paces the workers' steps: both sides then stand for a model that costs that much
per batch of ``batch_size`` samples on each process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from .._spawn import module_command
from ..errors import ConfigError, RunIncompleteError

__all__ = ["DdpConfig", "DdpResult", "run_ddp"]


@dataclass(frozen=True, slots=True)
class DdpConfig:
    """One DDP run: ``workers`` processes, ``samples`` training samples in all."""

    workers: int
    workload: str
    batch_size: int
    samples: int
    lr: float
    momentum: float = 0.9
    seed: int = 0
    eval_points: int = 20
    threads: int = 1
    timeout_s: float = 600.0
    min_step_s: float = 0.0

    def __post_init__(self) -> None:
        if self.workers < 1 or self.batch_size < 1 or self.samples < 1 or self.eval_points < 1:
            raise ConfigError("DDP needs workers, batch_size, samples and eval_points >= 1")
        if not self.min_step_s >= 0:
            raise ConfigError(f"DDP needs min_step_s >= 0, got {self.min_step_s}")
        if not self.lr > 0 or not 0 <= self.momentum < 1:
            raise ConfigError(f"DDP needs lr > 0 and momentum in [0, 1), got {self.lr}, {self.momentum}")

    @property
    def steps(self) -> int:
        return max(1, math.ceil(self.samples / (self.workers * self.batch_size)))


@dataclass(frozen=True, slots=True)
class DdpResult:
    """Rank 0's curve ``(t_s, samples, accuracy, loss)`` on the parent's clock, and the run's times."""

    config: DdpConfig
    points: list[tuple[float, int, float, float]]
    first_step_s: float
    wall_s: float
    digests: list[str]

    @property
    def final_accuracy(self) -> float:
        return self.points[-1][2]

    @property
    def final_loss(self) -> float:
        return self.points[-1][3]

    def as_dict(self) -> dict[str, Any]:
        return {"kind": "DDP (torch.distributed, gloo)", **asdict(self.config), "steps": self.config.steps,
                "first_step_s": self.first_step_s, "wall_s": self.wall_s,
                "points": [list(p) for p in self.points]}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ddp(cfg: DdpConfig, out_dir: Path) -> DdpResult:
    """Run ``cfg.workers`` DDP processes to the end; :class:`RunIncompleteError` (with the logs' place)
    as soon as one fails, the others stopped, or when they run past ``cfg.timeout_s``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": str(cfg.threads), "PYTHONUNBUFFERED": "1"}
    spec = json.dumps(asdict(cfg))
    t0 = time.time()
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for rank in range(cfg.workers):
            log = (out_dir / f"ddp-rank{rank}.log").open("wb")
            logs.append(log)
            args = module_command("vcasync.demo.ddp", "--rank", str(rank), "--config", spec,
                                  "--out", str(out_dir / f"ddp-rank{rank}.json"), "--t0", repr(t0))
            procs.append(subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT))
        _wait_ranks(procs, cfg.timeout_s, out_dir)
        wall = time.time() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    ranks = [json.loads((out_dir / f"ddp-rank{r}.json").read_text()) for r in range(cfg.workers)]
    points = [(float(t), int(n), float(a), float(loss)) for t, n, a, loss in ranks[0]["points"]]
    return DdpResult(cfg, points, float(ranks[0]["first_step_s"]), wall, [r["digest"] for r in ranks])


def _wait_ranks(procs: list[subprocess.Popen[bytes]], timeout_s: float, out_dir: Path) -> None:
    """Until every rank has exited 0; :class:`RunIncompleteError` as soon as one exits otherwise (the
    caller stops the others) or after ``timeout_s``. The ranks were waited for one by one, so a
    rank killed from outside (the OOM killer) while rank 0 waited in the rendezvous or an
    all-reduce left the demo waiting for rank 0 until the gloo timeout, ``--max-wall`` (15 minutes
    by default), and a failed rank was a "configuration error" (exit 2) after the whole fleet ran."""
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p in procs]
        failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            said = ", ".join(f"rank {rank} {_exit_how(code)}" for rank, code in failed)
            raise RunIncompleteError(f"a DDP rank failed ({said}); the other ranks were stopped; see "
                                     f"{out_dir}/ddp-rank*.log")
        if all(code == 0 for code in codes):
            return
        if time.monotonic() >= deadline:
            raise RunIncompleteError(f"the DDP baseline did not finish in {timeout_s:.0f} s; "
                                     f"see {out_dir}/ddp-rank*.log")
        time.sleep(0.1)


def _exit_how(code: int | None) -> str:
    """A rank's exit, in words: the signal that killed it, or its exit status."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


# -- one rank (runs in its own process) -------------------------------------------------------------
def _rank(rank: int, cfg: DdpConfig, out: Path, t0: float) -> None:
    import hashlib

    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from ..examples.cnn import unit_batches
    from ..examples.workloads import get_workload

    torch.set_num_threads(cfg.threads)
    dist.init_process_group("gloo", rank=rank, world_size=cfg.workers,
                            timeout=timedelta(seconds=cfg.timeout_s))
    try:
        work = get_workload(cfg.workload)
        torch.manual_seed(cfg.seed)  # the coordinator seeds its model the same way
        net = work.model()
        model = DistributedDataParallel(net)
        big = cfg.workers * cfg.batch_size
        batches = unit_batches(np.arange(work.num_train), cfg.steps, big, cfg.seed ^ 0x5EED)
        opt = work.optimizer(model.parameters(), cfg.lr, cfg.momentum)
        every = max(1, cfg.steps // cfg.eval_points)
        eval_s = 0.0
        points: list[tuple[float, int, float, float]] = []

        def score(samples: int) -> None:
            nonlocal eval_s
            began = time.time()
            ev = work.evaluate(net, "test")
            points.append((began - t0 - eval_s, samples, ev.accuracy, ev.loss))
            eval_s += time.time() - began

        dist.barrier()
        first_step_s = time.time() - t0
        if rank == 0:
            score(0)
        for step, idx in enumerate(batches, start=1):
            began = time.monotonic()
            net.train()
            opt.zero_grad(set_to_none=True)
            loss = work.batch_loss(model, idx[rank * cfg.batch_size:(rank + 1) * cfg.batch_size])
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            if cfg.min_step_s > 0:  # paced like the workers' steps (vcasync.demo.trainer)
                time.sleep(max(0.0, cfg.min_step_s - (time.monotonic() - began)))
            if rank == 0 and (step % every == 0 or step == cfg.steps):
                score(step * big)
        h = hashlib.blake2b(digest_size=16)
        for t in net.state_dict().values():
            h.update(t.detach().contiguous().numpy().tobytes())
        out.write_text(json.dumps({"rank": rank, "points": points, "first_step_s": first_step_s,
                                   "digest": h.hexdigest()}))
        # Leave together: a rank tearing gloo down while rank 0 still evaluates can abort a peer
        # ("terminate called without an active exception", exit -6) after its work is done.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="one rank of the demo's DDP baseline (started by run_ddp)")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--config", required=True, help="the DdpConfig as JSON")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--t0", type=float, required=True, help="the parent's clock origin (time.time())")
    a = p.parse_args(argv)
    _rank(a.rank, DdpConfig(**json.loads(a.config)), a.out, a.t0)
    return 0


if __name__ == "__main__":
    code = main()
    # The rank's result is written and the group destroyed: leave without running C++ static
    # destructors, where a gloo thread still joinable aborted a rank that had finished ("terminate
    # called without an active exception", exit -6, once in a full suite even after the barrier).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
