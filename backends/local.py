"""``file:///abs/path`` (or a plain path): objects as files under a root directory.

Writes go to a private temporary file under ``<root>/.vcasync-tmp/``, are fsynced, then renamed
(plain put) or hard-linked (if-absent put) to the final name, and the directory is fsynced. So a
crash leaves either the old object or the new one under the final name, never a torn file: at
worst a stray temporary file, which :meth:`LocalStorage.remove_stale_temp` deletes.
``link()`` fails atomically when the name exists, which makes the conditional create race-free
between threads and processes alike (it needs a file system with hard links; all POSIX ones have).

A file system cannot hold an object ``a`` and an object ``a/b`` at once (``a`` would have to be a
file and a directory); that second put raises :class:`InvalidKeyError`. The first path part
``.vcasync-tmp`` is reserved. Blocking file calls run in worker threads (``asyncio.to_thread``).

A streamed write (:meth:`LocalStorage.put_stream`, how the coordinator journals an upload while it
arrives) starts the disk's writeback every :data:`WRITEBACK_BYTES` as it goes (``posix_fadvise``
``DONTNEED``: asynchronous writeback of what is dirty, and written pages are not kept in the page
cache), so the closing ``fsync`` waits only for the last few megabytes instead of the whole object.
Measured here on 22 MB written in 1 MiB blocks: write + fsync 24 ms, 18 ms with writeback started
every 4 MiB (an ``fdatasync`` every 4 MiB instead: 25 ms, since each one waits).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import re
import stat
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

from vcasync.errors import (
    AccessDeniedError,
    ConfigError,
    InvalidKeyError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
)
from vcasync.storage import DEFAULT_CHUNK_SIZE, BytesLike, ObjectInfo, validate_key, validate_prefix

from ._common import (
    StorageBase,
    check_chunk_size,
    check_data,
    parse_options,
    shown_url,
    split_url,
    writer_token,
)

__all__ = ["LocalOptions", "LocalStorage", "Writeback"]

T = TypeVar("T")

TMP_DIR = ".vcasync-tmp"
_NAME_MAX = 255
_BUFFER = 1 << 20  # small stream chunks are gathered to this size before a write
#: ... or for at most this long: a write touches its temporary file (its mtime) at least this often
#: while chunks arrive, so :meth:`LocalStorage.remove_stale_temp` never takes a live write's file
#: for a dead writer's (an upload trickling 1 KiB/s filled no buffer, and wrote nothing, for 17 min).
TOUCH_EVERY_S = 60.0
#: A streamed write starts the writeback of what it wrote so far each time this much more is written.
WRITEBACK_BYTES = 4 << 20
_FADVISE = getattr(os, "posix_fadvise", None)  # Linux, the BSDs; absent on macOS and Windows
#: Objects and the directories this backend creates are its owner's only (the umask can only take
#: more away). Some objects are credentials (a worker's ``identity.json`` holds its token, the
#: coordinator's ``vcasync/run`` its lease-signing secret) and the backend cannot tell which; with
#: 0o666/0o755 any local user of a shared file system could read every worker's token. A directory
#: that already exists (the root the operator made) keeps its mode.
FILE_MODE = 0o600
DIR_MODE = 0o700


#: In ``TMP_DIR``: touched by each sweep to read the file system's clock (not a ``*.tmp``: never swept)
CLOCK_FILE = "clock"


def _file_system_now(tmp_dir: Path) -> float:
    """Now, on the clock that stamps the files in ``tmp_dir``: a network file system's server stamps
    them with its own, so comparing their times with this machine's ``time.time()`` made a live
    write's file look 9 minutes old on a client whose clock ran 9 minutes ahead of the server, and
    the sweep deleted it mid-write. A file touched there now carries that clock's time; where none
    can be touched (a read-only mount, a link in its place), this machine's clock."""
    path = tmp_dir / CLOCK_FILE
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), FILE_MODE))
        os.utime(path, None)            # now, as the file system's clock says (NFS: the server's)
        return os.stat(path).st_mtime
    except OSError:
        return time.time()


class Writeback:
    """Start the asynchronous writeback of a file being written, every ``WRITEBACK_BYTES``."""

    __slots__ = ("fd", "started", "written")

    def __init__(self, fd: int) -> None:
        self.fd, self.written, self.started = fd, 0, 0

    def wrote(self, n: int) -> None:
        self.written += n
        if _FADVISE is None or self.written - self.started < WRITEBACK_BYTES:
            return
        with contextlib.suppress(OSError):  # advice: a file system that ignores it loses nothing
            _FADVISE(self.fd, self.started, self.written - self.started, os.POSIX_FADV_DONTNEED)
        self.started = self.written


@dataclass(frozen=True, slots=True)
class LocalOptions:
    """``durable``: fsync files and directories (turn off only for scratch data on tmpfs)."""

    durable: bool = True


#: ``scheme:rest``: what a URL missing its ``//`` looks like (``file:run``, ``s3:bucket``)
_URL_LIKE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


def _check_root(root: Path) -> None:
    """A :class:`ConfigError` now, when the storage is opened, if ``root`` (or the nearest part of
    it that exists) is not a directory: otherwise the mistake surfaces at the first write, deep in a
    run. A root that does not exist yet is fine; the first write creates it."""
    for path in (root, *root.parents):
        try:
            info = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            continue            # not there yet, or under a file: the parents tell which
        except OSError:
            return              # e.g. no permission to look: the first write says why
        if not stat.S_ISDIR(info.st_mode):
            where = "is" if path == root else f"is under {path}, which is"
            raise ConfigError(f"file:// storage root {root} {where} not a directory: point the URL "
                              "at a directory (a missing one is created on the first write)")
        return


class LocalStorage(StorageBase):
    """Objects as files under ``root``; see the module docstring for the crash guarantees."""

    def __init__(self, root: str | os.PathLike[str], options: LocalOptions | None = None) -> None:
        path = Path(root).expanduser().absolute()
        _check_root(path)
        super().__init__(path.as_uri())
        self.root = path
        self.options = options if options is not None else LocalOptions()
        if not isinstance(self.options.durable, bool):
            raise ConfigError(f"LocalOptions.durable must be a bool, got {self.options.durable!r}")

    @classmethod
    def from_url(cls, url: str, **options: Any) -> LocalStorage:
        if "://" not in url:
            # a plain path; a typo for a URL would become a directory named after it
            if _URL_LIKE.match(url):
                raise ConfigError(f"{shown_url(url)!r} looks like a URL without '//': write "
                                  "file:///absolute/path (or a plain path)")
            if "?" in url:
                raise ConfigError(f"{shown_url(url)!r}: a plain path takes no options (they would become "
                                  "part of the directory's name); write file:///absolute/path?option=value")
            return cls(url, parse_options(LocalOptions, url, "", options))
        parts = split_url(url, "file")
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"file:// URLs name a local path; got a host in {shown_url(url)!r}")
        if not parts.path.startswith("/"):
            raise ConfigError(f"file:// URLs need an absolute path, got {shown_url(url)!r}")
        return cls(unquote(parts.path), parse_options(LocalOptions, url, parts.query, options))

    # --- helpers ------------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        self._check_open()
        validate_key(key)
        parts = key.split("/")
        if parts[0] == TMP_DIR:
            raise InvalidKeyError(f"{self.url}: the key part {TMP_DIR!r} is reserved", key=key)
        for part in parts:
            if len(part.encode("utf-8")) > _NAME_MAX:
                raise InvalidKeyError(f"{self.url}: key part {part[:40]!r}... is longer than "
                                      f"{_NAME_MAX} bytes, the file name limit", key=key)
        return self.root.joinpath(*parts)

    async def _run(self, key: str | None, fn: Callable[[], T]) -> T:
        """Run blocking ``fn`` in a thread and map OS errors to storage errors. A cancelled caller
        still waits for the thread, which cannot be interrupted, so that no file descriptor is
        closed under it."""
        job = asyncio.ensure_future(asyncio.to_thread(fn))
        with self._os_errors(key):
            try:
                return await asyncio.shield(job)
            except asyncio.CancelledError:
                await asyncio.wait([job])
                if not job.cancelled():
                    job.exception()  # retrieved: the caller was cancelled, the result is moot
                raise

    @contextlib.contextmanager
    def _os_errors(self, key: str | None) -> Iterator[None]:
        try:
            yield
        except PermissionError as exc:
            raise AccessDeniedError(f"{self.url}: {exc}", key=key) from exc
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                raise InvalidKeyError(f"{self.url}: path too long for {key!r}", key=key) from exc
            raise StorageError(f"{self.url}: {key!r}: {exc}", key=key) from exc

    def _fsync_dir(self, path: Path) -> None:
        if not self.options.durable:
            return
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _makedirs(self, directory: Path, key: str) -> None:
        """Create ``directory`` (under root) and fsync each new entry into its parent."""
        missing: list[Path] = []
        probe = directory
        while True:
            try:
                mode = os.stat(probe).st_mode  # one look: another thread may be creating it
            except FileNotFoundError:
                missing.append(probe)      # the root's own missing parents too: created as promised
                if probe.parent == probe:
                    break
                probe = probe.parent
                continue
            if stat.S_ISDIR(mode):
                break
            if not probe.is_relative_to(self.root) or probe == self.root:
                raise ConfigError(f"{self.url}: cannot create the storage root: {probe} is not a "
                                  "directory")
            conflict = probe.relative_to(self.root).as_posix()
            raise InvalidKeyError(f"{self.url}: cannot store {key!r}: {conflict!r} is an object, "
                                  "and a file system cannot hold an object and a prefix of the "
                                  "same name", key=key)
        for path in reversed(missing):
            try:
                os.mkdir(path, DIR_MODE)
            except FileExistsError:
                if not path.is_dir():
                    raise InvalidKeyError(f"{self.url}: cannot store {key!r}: a part of it is an "
                                          "object", key=key) from None
                continue
            self._fsync_dir(path.parent)

    def _open_temp(self) -> tuple[int, Path]:
        tmp_dir = self.root / TMP_DIR
        if not tmp_dir.is_dir():
            self._makedirs(tmp_dir, TMP_DIR)
        path = tmp_dir / f"{writer_token()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags, FILE_MODE)
        return fd, path

    @staticmethod
    def _write_all(fd: int, view: memoryview) -> None:
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def _finish(self, fd: int, tmp: Path, path: Path, key: str, if_absent: bool) -> None:
        """fsync and close the temp file, then publish it under ``path``; removes it on failure."""
        published = False
        try:
            if self.options.durable:
                os.fsync(fd)
            os.close(fd)
            fd = -1
            self._publish(tmp, path, key, if_absent)
            published = True
        finally:
            if fd >= 0:
                os.close(fd)
            if not published or if_absent:
                tmp.unlink(missing_ok=True)

    def _publish(self, tmp: Path, path: Path, key: str, if_absent: bool) -> None:
        for _ in range(8):  # a concurrent delete may remove an emptied parent directory under us
            self._makedirs(path.parent, key)
            try:
                if if_absent:
                    os.link(tmp, path)
                else:
                    os.replace(tmp, path)
            except FileNotFoundError:
                if not os.path.lexists(tmp):      # not the directory: the file being published
                    raise StorageError(f"{self.url}: {key!r}: its temporary file {TMP_DIR}/{tmp.name} "
                                       "was deleted before it was published (the stale-temp sweep "
                                       "deletes files no write has touched for a long while: a "
                                       "writer stopped that long, or a clock that jumped)",
                                       key=key) from None
                continue
            except FileExistsError:
                if path.is_dir():
                    raise self._is_prefix(key) from None
                raise PreconditionFailedError(f"{self.url}: {key!r} already exists", key=key) from None
            except (IsADirectoryError, NotADirectoryError):
                raise self._is_prefix(key) from None
            except OSError as exc:
                if if_absent and exc.errno in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                    raise StorageError(f"{self.url}: if-absent writes need hard links, which this file "
                                       f"system refused ({exc.strerror})", key=key) from exc
                raise
            self._fsync_dir(path.parent)
            return
        raise StorageError(f"{self.url}: {key!r}: its directory kept disappearing", key=key)

    def _is_prefix(self, key: str) -> InvalidKeyError:
        return InvalidKeyError(f"{self.url}: cannot store {key!r}: it is a prefix of other objects, "
                               "and a file system cannot hold an object and a prefix of the same name",
                               key=key)

    def _not_found(self, key: str) -> ObjectNotFoundError:
        return ObjectNotFoundError(f"{self.url}: no object {key!r}", key=key)

    # --- the protocol ---------------------------------------------------------------------------

    async def get(self, key: str) -> bytes:
        path = self._path(key)

        def read() -> bytes:
            try:
                with open(path, "rb") as f:
                    return f.read()
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                raise self._not_found(key) from None

        return await self._run(key, read)

    async def put(self, key: str, data: BytesLike, *, if_absent: bool = False) -> None:
        path = self._path(key)
        view = check_data(data)

        def write() -> None:
            fd, tmp = self._open_temp()
            try:
                self._write_all(fd, view)
            except BaseException:
                os.close(fd)
                tmp.unlink(missing_ok=True)
                raise
            self._finish(fd, tmp, path, key, if_absent)

        await self._run(key, write)

    async def put_stream(self, key: str, chunks: AsyncIterable[BytesLike], *,
                         if_absent: bool = False) -> None:
        path = self._path(key)
        if if_absent and await self.exists(key):  # fail before reading the stream; link() decides
            raise PreconditionFailedError(f"{self.url}: {key!r} already exists", key=key)
        with self._os_errors(key):  # in the loop's thread: a cancelled hop would leak the descriptor
            fd, tmp = self._open_temp()
        handed_over = False
        writeback = Writeback(fd) if self.options.durable else None

        def write(view: memoryview) -> None:
            self._write_all(fd, view)
            if writeback is not None:
                writeback.wrote(len(view))

        try:
            buf = bytearray()
            touched = time.monotonic()
            async for chunk in chunks:
                self._check_open()
                view = check_data(chunk)
                if len(buf) + len(view) < _BUFFER and time.monotonic() - touched < TOUCH_EVERY_S:
                    buf += view
                    continue
                if buf:
                    await self._run(key, functools.partial(write, memoryview(buf)))
                    buf = bytearray()
                await self._run(key, functools.partial(write, view))
                touched = time.monotonic()
            if buf:
                await self._run(key, functools.partial(write, memoryview(buf)))
            self._check_open()
            handed_over = True
            await self._run(key, lambda: self._finish(fd, tmp, path, key, if_absent))
        finally:
            if not handed_over:
                os.close(fd)
                tmp.unlink(missing_ok=True)

    async def exists(self, key: str) -> bool:
        path = self._path(key)
        return await self._run(key, path.is_file)

    async def stat(self, key: str) -> ObjectInfo:
        path = self._path(key)

        def info() -> ObjectInfo:
            try:
                st = os.stat(path)
            except (FileNotFoundError, NotADirectoryError):
                raise self._not_found(key) from None
            if not os.path.isfile(path):
                raise self._not_found(key)
            return ObjectInfo(key=key, size=st.st_size,
                              etag=f"{st.st_mtime_ns:x}-{st.st_ino:x}-{st.st_size:x}")

        return await self._run(key, info)

    async def delete(self, key: str) -> None:
        path = self._path(key)

        def remove() -> None:
            try:
                os.unlink(path)
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                return
            except PermissionError:
                if path.is_dir():  # some systems say EPERM for unlink() of a directory
                    return
                raise
            self._fsync_dir(path.parent)
            parent = path.parent
            while parent != self.root:  # drop directories the delete emptied, up to the root
                try:
                    os.rmdir(parent)
                except OSError:
                    break
                parent = parent.parent

        await self._run(key, remove)

    async def list(self, prefix: str = "") -> AsyncIterator[str]:
        self._check_open()
        validate_prefix(prefix)
        head, _, _ = prefix.rpartition("/")
        if head.split("/")[0] == TMP_DIR:
            return
        start = self.root.joinpath(*head.split("/")) if head else self.root

        def walk() -> list[str]:
            found: list[str] = []
            stack = [(start, f"{head}/" if head else "")]
            while stack:
                directory, rel = stack.pop()
                try:
                    entries = list(os.scandir(directory))
                except (FileNotFoundError, NotADirectoryError):
                    continue
                for entry in entries:
                    key = rel + entry.name
                    if not rel and entry.name == TMP_DIR:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        if key.startswith(prefix) or prefix.startswith(key + "/"):
                            stack.append((Path(entry.path), key + "/"))
                    elif key.startswith(prefix) and entry.is_file():
                        found.append(key)
            found.sort()
            return found

        for key in await self._run(prefix, walk):
            self._check_open()
            yield key

    async def open_read(self, key: str, *, chunk_size: int = DEFAULT_CHUNK_SIZE
                        ) -> AsyncIterator[bytes]:
        check_chunk_size(chunk_size)
        path = self._path(key)

        def open_file() -> int:
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except (FileNotFoundError, NotADirectoryError):
                raise self._not_found(key) from None
            if not os.path.isfile(path):
                os.close(fd)
                raise self._not_found(key)
            return fd

        with self._os_errors(key):  # in the loop's thread, like the temp file above
            fd = open_file()
        try:
            while True:
                self._check_open()
                chunk = await self._run(key, lambda: os.read(fd, chunk_size))
                if not chunk:
                    return
                yield chunk
        finally:
            os.close(fd)

    async def remove_stale_temp(self, max_age_s: float = 3600.0) -> int:
        """Delete temporary files older than ``max_age_s`` (left by crashed writers); returns how
        many. Younger ones may belong to a write in progress in another process. Ages are taken on
        the file system's clock (that of the server of a network file system, which stamps the
        files' times), not this machine's: see :func:`_file_system_now`. Only this
        backend's own files are candidates (regular files named ``*.tmp``; a symbolic link or a
        directory there is not followed nor removed), and one that cannot be removed is skipped:
        it does not stop the sweep (a directory in ``.vcasync-tmp/`` used to end every sweep
        before it deleted anything)."""
        self._check_open()
        tmp_dir = self.root / TMP_DIR

        def sweep() -> int:
            removed = 0
            try:
                entries = list(os.scandir(tmp_dir))
            except FileNotFoundError:
                return 0
            deadline = _file_system_now(tmp_dir) - max_age_s
            for entry in entries:
                try:
                    if not entry.name.endswith(".tmp") or not entry.is_file(follow_symlinks=False):
                        continue
                    if entry.stat(follow_symlinks=False).st_mtime < deadline:
                        os.unlink(entry.path)
                        removed += 1
                except OSError:       # gone since the listing, or not ours to remove
                    continue
            return removed

        return await self._run(None, sweep)
