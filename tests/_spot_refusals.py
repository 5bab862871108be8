"""The refusals every command taking ``--spot-trace`` / ``--spot-walk`` must give
(``vcasync.costing.spot_options``): one table for the demo's test and the simulator's.

``REFUSED`` holds ``(arguments, what stderr must say)``, with ``{tmp}`` for the test's directory;
:func:`write_traces` writes the files they name there, and :func:`refused` runs the command and
checks it said so, with exit 2 and no traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from vcasync.exit_codes import ExitCode

REFUSED: list[tuple[list[str], str]] = [
    (["--spot-trace", "{tmp}/gone.csv"],
     "--spot-trace: cannot read spot trace '{tmp}/gone.csv': No such file"),
    (["--spot-trace", "{tmp}/bad.csv"], "--spot-trace: {tmp}/bad.csv:3: not a number in"),
    (["--spot-trace", "{tmp}/header.csv"], "--spot-trace: {tmp}/header.csv: the CSV header must name t_s"),
    (["--spot-trace", "{tmp}/order.csv"], "--spot-trace: {tmp}/order.csv:3: trace times must increase: "
                                          "t_s 0 after 60"),
    (["--spot-trace", "{tmp}/nan.csv"], "--spot-trace: {tmp}/nan.csv:2: t_s must be a finite number"),
    (["--spot-trace", "{tmp}/empty.csv"], "a spot trace needs one price per time, and at least one"),
    (["--spot-walk", "-0.1"], "--spot-walk SIGMA must be a finite number >= 0"),
    (["--spot-walk", "nan"], "--spot-walk SIGMA must be a finite number >= 0 (the log-normal step's spread), "
                             "got nan"),
    (["--spot-walk", "inf"], "--spot-walk SIGMA must be a finite number >= 0"),
    (["--spot-walk", "0.1", "--spot-walk-step", "0.5"], "--spot-walk-step must be a finite number of "
                                                        "seconds >= 1"),
    (["--spot-walk", "0.1", "--spot-walk-step", "nan"], "--spot-walk-step must be a finite number"),
    (["--spot-walk-step", "5"], "--spot-walk-step sets the step of --spot-walk SIGMA; give --spot-walk too"),
    (["--spot-trace", "{tmp}/ok.csv", "--spot-price", "0.1"], "--spot-trace gives the workers' spot price "
                                                              "over the run and --spot-price a fixed one"),
    (["--spot-trace", "{tmp}/ok.csv", "--spot-walk", "0.1"], "argument --spot-walk: not allowed with "
                                                             "argument --spot-trace"),

]

TRACES = {"bad.csv": "t_s,spot_per_h\n0,0.1\nten,0.2\n", "header.csv": "time,price\n0,1\n",
          "order.csv": "t_s,spot_per_h\n60,0.1\n0,0.2\n",
          "nan.csv": "t_s,spot_per_h\nnan,0.1\n", "empty.csv": "t_s,spot_per_h\n",
          "ok.csv": "t_s,spot_per_h\n0,0.1\n"}


def refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], said: str,
            run: Callable[[list[str]], int]) -> None:
    """Write the traces, run ``run`` with ``args`` (``{tmp}`` filled in) and check the refusal:
    exit 2 (argparse's own included), ``said`` on stderr, no traceback."""
    for name, text in TRACES.items():
        (tmp_path / name).write_text(text)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    try:
        code = run(argv)
    except SystemExit as exc:       # argparse's own refusal (the two options are one choice)
        code = exc.code             # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == ExitCode.CONFIG, err
    assert said.replace("{tmp}", str(tmp_path)) in err
    assert "Traceback" not in err
