"""Local files a command will write, checked before it starts (``--output``, ``--port-file``,
``--plot``): a file that could not be written was found only when it was, after the whole run, as
a traceback or a failed command.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import ConfigError

__all__ = ["check_output_file"]


def check_output_file(path: Path | str, what: str, *, purpose: str = "", kind: str = "file",
                      example: str = "") -> Path:
    """``path`` as a :class:`Path`, once a file can be written there: it names a file (not ``''``,
    ``'..'`` or a directory) in a directory that exists and where this process could create a file
    (tried: a hidden file is created there and removed), and an existing file it may write. Else a
    :class:`ConfigError` naming the setting (``what``), saying when the file is written
    (``purpose``) and what to name (``kind``, e.g. ``"image file"``, with an ``example``)."""
    path = Path(path)
    why = f" ({purpose})" if purpose else ""
    eg = f", e.g. {example}" if example else ""
    if path.name in ("", ".", ".."):
        raise ConfigError(f"{what} {str(path)!r}: name the {kind} to write{eg}{why}")
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a directory; name the {kind} itself{eg}{why}")
    parent = path.parent
    if not parent.is_dir():
        raise ConfigError(f"{what}: the directory {parent} does not exist{why}")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"{what}: the directory {parent} is not writable by this process{why}")
    # os.access answers from the permission bits, and root passes them everywhere: /proc said
    # "writable" and the run failed at its end. Creating (and removing) a file there is the answer.
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".vcasync-check-")
    except OSError as exc:
        raise ConfigError(f"{what}: cannot create a file in the directory {parent} "
                          f"({exc.strerror or exc}){why}") from None
    os.close(fd)
    os.unlink(probe)
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{what}: {path} exists and is not writable by this process{why}")
    return path
