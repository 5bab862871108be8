"""One check for a file a command will write (``--output``, ``--port-file``, ``--plot``), before it
starts: the coordinator's and the simulator's were near-copies, and only one looked at whether the
directory may be written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vcasync._paths import check_output_file
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
