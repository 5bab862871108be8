"""Local files and directories a command will write, checked before it starts (``--output``,
``--port-file``, ``--plot``, ``demo --run-dir``): a file that could not be written was found only
when it was, after the whole run, as a traceback or a failed command; a run directory that could
not be made was a ``FileNotFoundError`` or ``NotADirectoryError`` traceback. Also the one file a
command reads by flag before it connects: ``--ca-file`` (:func:`check_ca_file`). And the mode of a
local file holding a secret (:func:`readable_by_others`, :func:`chmod_command`): a worker's state
dir and a ``file://`` store's run record, which builds before 2026-12-07 wrote for every user to read.
"""

from __future__ import annotations

import os
import shlex
import stat
import tempfile
from pathlib import Path

from .errors import ConfigError

__all__ = ["check_ca_file", "check_output_dir", "check_output_file", "chmod_command", "make_output_dir",
           "readable_by_others"]


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


def check_output_dir(path: Path | str, what: str, *, purpose: str = "") -> Path:
    """``path`` as a :class:`Path`, once a directory can be written there: an existing directory
    this process may write, or a path whose nearest existing ancestor is such a directory (the
    rest is made by :func:`make_output_dir`). Else a :class:`ConfigError` naming the setting
    (``what``), the path and what is in the way."""
    path = Path(path)
    why = f" ({purpose})" if purpose else ""
    if str(path) == "":
        raise ConfigError(f"{what}: name a directory{why}")
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"{what} {path} is not a directory{why}")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{what} {path}: the directory is not writable by this process{why}")
        return path
    ancestor = path.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"{what} {path} cannot be made: {ancestor} is a file, not a directory{why}")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path} cannot be made: the directory {ancestor} is not writable by "
                          f"this process{why}")
    return path


def make_output_dir(path: Path | str, what: str, *, purpose: str = "") -> Path:
    """:func:`check_output_dir`, then make the directory (and its missing parents); what the
    checks cannot see (``/proc``, a read-only mount, a full disk, which ``os.access`` passes for
    root) is the same :class:`ConfigError`, naming the path and the system's reason."""
    path = check_output_dir(path, what, purpose=purpose)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = f" ({purpose})" if purpose else ""
        raise ConfigError(f"{what} {path} cannot be made: {exc.strerror or exc}{why}") from None
    return path


def check_ca_file(ca_file: Path | None, url: str) -> str | None:
    """Check ``--ca-file`` against the coordinator ``url`` before connecting: a file that is not
    there is a :class:`ConfigError` (it was ignored without a word for an ``http://`` URL, and for
    an ``https://`` one found only when the TLS context was made). The returned text, when not
    None, is a warning to log: with a plain ``http://`` URL the file has no effect."""
    if ca_file is None:
        return None
    if not ca_file.is_file():
        why = "is a directory" if ca_file.is_dir() else "does not exist"
        raise ConfigError(f"--ca-file {str(ca_file)!r} {why}: name the CA certificate (PEM) that "
                          "verifies an https:// coordinator")
    if not url.lower().startswith("https://"):
        return (f"--ca-file {str(ca_file)!r} has no effect: the coordinator URL is plain HTTP, "
                "nothing is verified (use https:// for a coordinator serving TLS)")
    return None


def readable_by_others(path: Path) -> int | None:
    """``path``'s mode when its group or other users have any access to it; None when it is its
    owner's only, or cannot be looked at (absent)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None
    return mode if mode & 0o077 else None


def chmod_command(path: Path, mode: int) -> str:
    """The shell command that gives ``path`` ``mode`` (its name quoted for the shell)."""
    return f"chmod {mode:o} {shlex.quote(str(path))}"
