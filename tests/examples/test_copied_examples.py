"""The examples are files a user copies (docs/headline.md, "Workloads"): each must import, and the
digits one train, as a module of the user's own, outside the ``vcasync.examples`` package.

They used relative imports (``from ..tensors import ModelState``), so a copy failed at its first line
with "attempted relative import with no known parent package". Each runs in a real interpreter whose
working directory holds only the copy, as a user's script would.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import vcasync.examples

EXAMPLES = Path(vcasync.examples.__file__).parent

#: The documented lease loop (docs/trainer.md, "A complete trainer, run by a real worker") around the
#: copied trainer: a coordinator and its server on 127.0.0.1, one worker, two short units.
TRAIN = """
import asyncio, tempfile
from vcasync import (Coordinator, ModelState, Server, ServerConfig, TokenAuthority, Worker,
                     WorkerConfig, build_policy, make_units, open_storage)
import my_digits

SECRET = "copied-example-join-secret"

async def run():
    async with open_storage("memory://copied") as storage, Coordinator(
        ModelState.from_module(my_digits.model()), make_units(2, steps=3, params={"lr": 0.05}),
        policy=build_policy("vcasgd", {"alpha": 0.5}), storage=storage,
    ) as coord, Server(coord, TokenAuthority(join_secret=SECRET), ServerConfig(port=0)) as server:
        with tempfile.TemporaryDirectory() as state_dir:
            report = await Worker(server.url, my_digits.train, state_dir=state_dir, join_secret=SECRET,
                                  config=WorkerConfig(name="mine")).run()
        accuracy = my_digits.evaluate(coord.model())
        print(report.reason, report.results_accepted, 0.0 <= accuracy <= 1.0)

asyncio.run(run())
"""


def _python(cwd: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.parametrize("name", ["digits", "mnist5000", "tinylm"])
def test_a_copied_example_imports_as_the_users_own_module(tmp_path: Path, name: str) -> None:
    shutil.copy(EXAMPLES / f"{name}.py", tmp_path / f"my_{name}.py")
    out = _python(tmp_path, f"import my_{name} as m; print(callable(m.model), callable(m.train))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


def test_a_copied_digits_example_trains_with_the_documented_worker(tmp_path: Path) -> None:
    shutil.copy(EXAMPLES / "digits.py", tmp_path / "my_digits.py")
    out = _python(tmp_path, TRAIN)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["finished", "2", "True"]
