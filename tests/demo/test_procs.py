"""The demo's child processes import the installed vcasync, whatever folder they start in."""

from __future__ import annotations

from pathlib import Path

import pytest

from vcasync.demo.procs import Proc


async def test_a_vcasync_folder_in_the_working_directory_is_not_imported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What `pip install . && vcasync demo` meets in a source checkout: a vcasync/ folder (without
    # the plugins and backends installed beside it) in the directory the children start in.
    shadow = tmp_path / "vcasync"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise SystemExit('imported ./vcasync, not the installed package')\n")
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "child.log"
    proc = Proc("child", ["coordinator", "--help"], env={}, log_path=log)
    await proc.start()
    try:
        code = await proc.wait(within_s=120)
    finally:
        await proc.stop()
    assert code == 0, log.read_text()
    assert "--config" in log.read_text()
