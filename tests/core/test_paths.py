"""One check for a file a command will write (``--output``, ``--port-file``, ``--plot``), before it
starts: the coordinator's and the simulator's were near-copies, and only one looked at whether the
directory may be written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vcasync._paths import check_output_dir, check_output_file, make_output_dir
from vcasync.errors import ConfigError


def test_a_file_that_could_be_written_is_taken(tmp_path: Path) -> None:
    assert check_output_file(str(tmp_path / "w.pt"), "--output") == tmp_path / "w.pt"


@pytest.mark.parametrize(("name", "said"), [
    ("", "--plot '.': name the image file to write, e.g. saving.png (when)"),
    ("..", "--plot '..': name the image file to write, e.g. saving.png (when)"),
    ("DIR", "--plot DIR is a directory; name the image file itself, e.g. saving.png (when)"),
    ("DIR/no/p.png", "--plot: the directory DIR/no does not exist (when)"),
])
def test_what_cannot_be_written_is_named(tmp_path: Path, name: str, said: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_output_file(name.replace("DIR", str(tmp_path)), "--plot", purpose="when",
                          kind="image file", example="saving.png")
    assert str(info.value) == said.replace("DIR", str(tmp_path))


def test_a_directory_this_process_may_not_write_is_refused(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # (as root every directory is writable: the permission is what os.access says)
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(ConfigError, match=rf"--port-file: the directory {tmp_path} is not writable by "
                                          r"this process \(the URL\)$"):
        check_output_file(tmp_path / "port", "--port-file", purpose="the URL")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_directory_no_file_can_be_created_in_is_refused_whatever_its_permission_bits_say(
        capsys: pytest.CaptureFixture[str]) -> None:
    # as root os.access says /proc may be written: `simulate --plot /proc/nope.png` ran the whole
    # simulation and ended in a FileNotFoundError traceback (exit 1); the check now creates a file
    with pytest.raises(ConfigError, match=r"^--plot: cannot create a file in the directory /proc \("):
        check_output_file("/proc/nope.png", "--plot")
    from vcasync.cli import main

    assert main(["simulate", "--plot", "/proc/nope.png"]) == 2       # refused before the run
    assert "--plot: cannot create a file in the directory /proc" in capsys.readouterr().err


def test_the_check_leaves_nothing_behind_and_refuses_an_existing_file_it_may_not_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "w.pt"
    assert check_output_file(target, "--output") == target
    assert not list(tmp_path.iterdir())
    target.write_text("old")
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != target)
    with pytest.raises(ConfigError, match=rf"^--output: {target} exists and is not writable"):
        check_output_file(target, "--output")
    assert target.read_text() == "old"


def test_a_directory_that_could_be_made_is_taken(tmp_path: Path) -> None:
    assert check_output_dir(tmp_path / "a" / "b", "--run-dir") == tmp_path / "a" / "b"
    assert check_output_dir(tmp_path, "--run-dir") == tmp_path
    made = make_output_dir(tmp_path / "a" / "b", "--run-dir")
    assert made.is_dir()


def test_a_directory_below_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "file.json").write_text("{}")
    with pytest.raises(ConfigError) as info:
        make_output_dir(tmp_path / "file.json" / "sub", "--run-dir")
    assert str(info.value) == (f"--run-dir {tmp_path}/file.json/sub cannot be made: {tmp_path}/file.json "
                               f"is a file, not a directory")
    with pytest.raises(ConfigError, match=rf"--run-dir {tmp_path}/file.json is not a directory"):
        check_output_dir(tmp_path / "file.json", "--run-dir")


def test_a_directory_the_checks_pass_but_the_system_refuses_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # /proc as root: os.access says writable, mkdir fails (ENOENT); any such refusal is named
    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise FileNotFoundError(2, "No such file or directory", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(ConfigError,
                       match=rf"^--run-dir {tmp_path}/x cannot be made: No such file or directory$"):
        make_output_dir(tmp_path / "x", "--run-dir")


def test_a_directory_this_process_may_not_write_in_is_refused(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(ConfigError, match=rf"the directory {tmp_path} is not writable by this process"):
        check_output_dir(tmp_path / "new", "--run-dir")
