"""``vcasync demo`` refuses non-finite and unbounded settings before anything starts (a QA probe:
``--min-step-s inf``, ``--restart-delay 0 inf``, ``--grace inf``, ``--preempt-per-min inf``,
``--workers 100000``, ``--steps 2**40`` and ``--shards 100000`` on 1,293 images were accepted)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sklearn", reason="the demo needs scikit-learn (vcasync[demo])")

from vcasync.cli import main
from vcasync.demo.run import MAX_DELAY_S, MAX_WORKERS, DemoConfig, run_demo
from vcasync.errors import ConfigError

INF, NAN = math.inf, math.nan


@pytest.mark.parametrize(("kwargs", "word"), [
    ({"min_step_s": INF}, r"min_step_s \(--min-step-s\) must be a finite number of seconds"),
    ({"min_step_s": NAN}, r"min_step_s \(--min-step-s\) must be a finite"),
    ({"min_step_s": MAX_DELAY_S + 1}, r"min_step_s \(--min-step-s\) must be"),
    ({"restart_delay_s": (0.0, INF)}, r"restart delay \(--restart-delay\) must be finite seconds"),
    ({"restart_delay_s": (NAN, 1.0)}, r"restart delay \(--restart-delay\) must be finite"),
    ({"grace_s": INF}, r"grace_s \(--grace\) must be a finite number of seconds > 0"),
    ({"lease_timeout_s": INF}, "lease_timeout_s must be a finite"),
    ({"eval_every_s": INF}, "eval_every_s must be a finite"),
    ({"max_wall_s": INF}, r"max_wall_s \(--max-wall\) must be a finite"),
    ({"preempt_per_min": INF}, r"preempt_per_min \(--preempt-per-min\) must be a finite rate"),
    ({"preempt_per_min": NAN}, r"preempt_per_min \(--preempt-per-min\) must be a finite rate"),
    ({"workers": 100_000}, rf"workers \(--workers\) must be 1 to {MAX_WORKERS} "),
    ({"workers": 0}, r"workers \(--workers\) must be 1 to"),
    ({"steps": 2**40}, r"steps \(--steps\) must be 1 to"),
    ({"epochs": 10**9}, r"epochs \(--epochs\) must be 1 to"),
    ({"preemptions": 10**9}, r"preemptions \(--preemptions\) must be 0 to"),
    ({"lr": INF}, r"lr \(--lr\) must be a finite number > 0"),
    ({"sync_lr": NAN}, r"sync_lr \(--sync-lr\) must be a finite number > 0"),
    ({"momentum": 1.0}, r"momentum must be in \[0, 1\)"),
    ({"momentum": NAN}, "momentum must be in"),
])
def test_a_setting_that_is_not_finite_or_is_too_large_is_refused(kwargs: dict[str, Any], word: str) -> None:
    with pytest.raises(ConfigError, match=word):
        DemoConfig(**kwargs)


def test_the_bounds_leave_the_defaults_and_the_largest_allowed_values_alone() -> None:
    DemoConfig()
    DemoConfig(workers=MAX_WORKERS, min_step_s=MAX_DELAY_S, restart_delay_s=(0.0, MAX_DELAY_S),
               grace_s=MAX_DELAY_S, preempt_per_min=1.0, preemptions=0)


def test_more_shards_than_training_samples_are_refused_before_a_run_directory_is_made(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"shards must be at most the digits workload's \d+ training "
                                          r"samples, got 100000: lower --shards"):
        asyncio.run(run_demo(DemoConfig(shards=100_000, run_dir=run_dir, progress=False)))
    assert not run_dir.exists()


@pytest.mark.parametrize("argv", [["--min-step-s", "inf"], ["--restart-delay", "0", "inf"],
                                  ["--grace", "inf"], ["--preempt-per-min", "inf"], ["--workers", "100000"],
                                  ["--steps", str(2**40)], ["--shards", "100000"]])
def test_the_cli_exits_2_and_creates_nothing(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert "must be" in err
    assert list(tmp_path.iterdir()) == []      # no ./runs, no run directory


def test_the_workers_help_states_the_bound_the_config_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    # the help said "at most 64" by hand beside MAX_WORKERS = 64: one changed, the other would lie
    import argparse

    import vcasync.demo.cli as demo_cli
    from vcasync.demo import limits

    assert MAX_WORKERS is limits.MAX_WORKERS      # DemoConfig checks the bound the help states
    monkeypatch.setattr(demo_cli, "MAX_WORKERS", 7)
    p = argparse.ArgumentParser(prog="vcasync demo")
    demo_cli.configure(p)
    assert "at most 7)" in " ".join(p.format_help().split())


def test_the_demo_flags_are_built_without_the_run_module() -> None:
    # every `vcasync` call builds every subcommand's flags: the demo's must not load its run
    # module (workloads, models, process plumbing) to state a bound
    import subprocess
    import sys

    code = ("import sys; from vcasync.cli import available_commands, build_parser; "
            "build_parser(available_commands()); print('vcasync.demo.run' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=120)
    assert out.stdout.strip() == "False", out.stderr
