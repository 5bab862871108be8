"""``vcasync._early_signals``: SIGTERM and SIGINT held from a command's first moment. A command that
does not take them over gets them back as they would have acted (SIGTERM ends the process, SIGINT is
Ctrl-C, exit 130); one that does hears a held one at its hand-over; a second one is never held.
Each case runs in its own interpreter, with real signals."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from vcasync.cli import ExitCode


def run(code: str) -> subprocess.CompletedProcess[str]:
    head = "import os, signal\nfrom vcasync import _early_signals as e\n"
    return subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, timeout=120)


def test_a_held_sigterm_ends_the_process_when_released() -> None:
    out = run("e.hold(); os.kill(os.getpid(), signal.SIGTERM); print('held', e.received()); e.release();"
              " print('not reached')")
    assert out.returncode == -signal.SIGTERM
    assert out.stdout.split() == ["held", str(int(signal.SIGTERM))]


def test_a_held_sigint_is_ctrl_c_when_released_and_the_command_exits_130() -> None:
    """Through ``vcasync.cli.main``: a command that does not take the signals over (here one made
    up) gets a SIGINT from its start-up as KeyboardInterrupt, exit 130, as before."""
    out = run("from vcasync.cli import Command, main\n"
              "ran = []\n"
              "def configure(p):\n    os.kill(os.getpid(), signal.SIGINT)\n"
              "cmd = Command('x', 'x', configure, lambda a: ran.append(1) or 0)\n"
              "print(main(['x'], commands={'x': cmd}), ran)")
    assert out.stdout.split() == [str(int(ExitCode.INTERRUPTED)), "[]"], out.stderr


def test_a_command_that_takes_them_over_hears_a_held_one_at_once() -> None:
    out = run("import asyncio\n"
              "from vcasync.cli import Command, main\n"
              "def configure(p):\n    os.kill(os.getpid(), signal.SIGTERM)\n"
              "async def serve():\n"
              "    stop = asyncio.Event()\n"
              "    e.handover(asyncio.get_running_loop(), stop.set)\n"
              "    return 7 if stop.is_set() else 0\n"
              "cmd = Command('x', 'x', configure, lambda a: asyncio.run(serve()), handles_signals=True)\n"
              "print(main(['x'], commands={'x': cmd}))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["7"]


@pytest.mark.parametrize("second", ["SIGTERM", "SIGINT"])
def test_a_second_signal_is_not_held(second: str) -> None:
    out = run(f"e.hold(); os.kill(os.getpid(), signal.SIGTERM); print('one held', flush=True)\n"
              f"try:\n    os.kill(os.getpid(), signal.{second})\n"
              "except KeyboardInterrupt:\n    print('ctrl-c')\n"
              "print('after')")
    if second == "SIGTERM":
        assert out.returncode == -signal.SIGTERM
        assert out.stdout.split() == ["one", "held"]
    else:
        assert out.stdout.split() == ["one", "held", "ctrl-c", "after"]


def test_a_held_signal_is_still_heard_after_a_second_one_was_ignored() -> None:
    """``cmd &`` in a script starts the command with SIGINT ignored: two SIGINTs during start-up,
    the second "acting as it would have" (ignored), lost the first too, and the coordinator served
    on."""
    out = run("import asyncio\n"
              "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
              "e.hold(); os.kill(os.getpid(), signal.SIGINT); os.kill(os.getpid(), signal.SIGINT)\n"
              "async def serve():\n"
              "    stop = asyncio.Event()\n"
              "    e.handover(asyncio.get_running_loop(), stop.set)\n"
              "    return stop.is_set()\n"
              "print(asyncio.run(serve()))")
    assert out.stdout.split() == ["True"], out.stderr


def test_a_signal_while_the_console_script_exits_leaves_its_status() -> None:
    """A SIGTERM 30-100 ms after a worker logged "done (finished)" (interpreter shutdown, torch's
    teardown) made its exit 0 a 143: the console script ignores both signals once the command has
    returned its status. Here the signals come from an exit handler, the last moment there is."""
    out = run("import sys, atexit\n"
              "from vcasync import cli\n"
              "def late():\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    print('late signals sent', flush=True)\n"
              "atexit.register(late)\n"
              "cmd = cli.Command('x', 'x', lambda p: None, lambda a: 3, handles_signals=True)\n"
              "cli.available_commands = lambda: {'x': cmd}\n"
              "sys.argv = ['vcasync', 'x']\n"
              "cli.console()\n")
    assert out.returncode == 3, out.stderr
    assert out.stdout.split() == ["late", "signals", "sent"]
