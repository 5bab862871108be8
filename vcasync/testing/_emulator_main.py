"""Child-process entry for :mod:`vcasync.testing.emulators` (``python -m ...`` only).

Runs moto's S3 server or gcp-storage-emulator on 127.0.0.1, prints ``READY <endpoint>`` on stdout
and serves until SIGTERM. Two documented adjustments make the emulators keep the guarantees the
real services give, which the conformance suite checks:

- moto checks ``If-None-Match: *`` and then stores the object without a lock, on a threaded
  server: two racing conditional PUTs can both win. ``--serialize`` runs one request at a time
  (real S3 evaluates the condition atomically).
- gcp-storage-emulator ignores ``ifGenerationMatch``. The precondition is enforced here for
  uploads (media, multipart, resumable: checked when the session starts and on each chunk);
  the emulator is single-threaded, so check-and-write is atomic. Two emulator bugs are fixed on
  the way: an empty media upload crashes the handler, and a resumable status query answers
  ``Range: bytes=0-0`` (one byte persisted) when nothing was (GCS sends no Range then).
  Its request path is parsed with ``urlparse``, which cuts an object name at a literal ``;``
  (legal in a path, and sent by aiohttp/yarl); ``urlsplit`` keeps it whole. And in memory it
  re-serialises every object's metadata to JSON on every write, nowhere read back, which makes
  a write cost O(objects); that is skipped. Its listen backlog of 5 drops connections (each a
  one-second SYN retry) as soon as a test has more requests in flight; it gets 256.

``--no-preconditions`` leaves ``ifGenerationMatch`` ignored, as the stock emulator does (the bug
fixes stay): the store a coordinator's start-up probe must catch (see ``docs/runs.md``).
"""

from __future__ import annotations

import argparse
import http.server
import logging
import signal
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any


def _ready(endpoint: str) -> None:
    sys.stdout.write(f"READY {endpoint}\n")
    sys.stdout.flush()
    sys.stdout.close()


def _wait_for_term() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()


class _Serialized:
    """WSGI middleware: one request at a time, body included."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self.lock:
            result = self.app(environ, start_response)
            try:
                return list(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()


def run_s3(port: int, serialize: bool) -> None:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app: Any = DomainDispatcherApplication(create_backend_app)
    if serialize:
        app = _Serialized(app)
    server = make_server("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, name="moto", daemon=True)
    thread.start()
    _ready(f"http://127.0.0.1:{server.server_port}")
    _wait_for_term()
    server.shutdown()


def _precondition_failed(response: Any, name: str) -> None:
    response.status = HTTPStatus.PRECONDITION_FAILED
    response.json({"error": {"code": 412, "message": f"ifGenerationMatch failed for {name}",
                             "errors": [{"reason": "conditionNotMet"}]}})


def _object_name(request: Any, storage: Any, upload_id: str | None) -> str | None:
    if upload_id is not None:
        return str(storage.get_resumable_file_obj(upload_id)["name"])
    if "name" in request.query:
        return str(request.query["name"][0])
    data = request.data
    if isinstance(data, dict):
        meta = data.get("meta", data)
        if isinstance(meta, dict) and meta.get("name"):
            return str(meta["name"])
    return None


def _with_preconditions(handler: Callable[..., Any], pending: dict[str, str]) -> Callable[..., Any]:
    from gcp_storage_emulator.exceptions import NotFound  # type: ignore[import-untyped]

    def wrapped(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        if request.query.get("uploadType") == ["media"] and request.data is None:
            request._data = b""  # an empty body: the emulator would call len(None)
        upload_id = request.query.get("upload_id", [None])[0]
        wanted = request.query.get("ifGenerationMatch", [None])[0]
        if wanted is None and upload_id is not None:
            wanted = pending.get(upload_id)
        if wanted is not None:
            bucket = request.params["bucket_name"]
            try:
                name = _object_name(request, storage, upload_id)
            except NotFound:
                name = None
            if name is not None:
                try:
                    current = str(storage.get_file_obj(bucket, name)["generation"])
                except NotFound:
                    current = "0"
                if current != wanted:
                    _precondition_failed(response, name)
                    return None
        result = handler(request, response, storage, *args, **kwargs)
        if wanted is not None and upload_id is None:
            location = response._headers.get("Location")  # the emulator's Response keeps a dict
            if location:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(location).query)
                for started in query.get("upload_id", []):
                    pending[started] = wanted
        return result

    return wrapped


def run_gcs(port: int, preconditions: bool = True) -> None:
    from gcp_storage_emulator import server as gserver  # type: ignore[import-untyped]
    from gcp_storage_emulator import storage as gstorage
    from gcp_storage_emulator.handlers import objects  # type: ignore[import-untyped]

    pending: dict[str, str] = {}

    def resumable_incomplete(response: Any, storage: Any, upload_id: str, fallback_end: int = 0
                             ) -> None:
        response.status = objects.GoogleHTTPStatus.RESUME_INCOMPLETE
        received = storage.get_resumable_byte_count(upload_id)
        if received > 0:
            response["Range"] = f"bytes=0-{received - 1}"

    objects._resumable_incomplete = resumable_incomplete
    gserver.Request.path = property(lambda self: urllib.parse.urlsplit(self._full_url).path)
    gstorage.Storage._write_config_to_file = lambda self: None
    http.server.HTTPServer.request_queue_size = 256
    guarded = {objects.insert, objects.upload_partial} if preconditions else set()
    gserver.HANDLERS = tuple(
        (regex, {method: (_with_preconditions(fn, pending) if fn in guarded else fn)
                 for method, fn in handlers.items()})
        for regex, handlers in gserver.HANDLERS)
    server = gserver.create_server("127.0.0.1", port, in_memory=True)
    server.start()
    _ready(f"http://127.0.0.1:{server._api._httpd.server_port}")
    _wait_for_term()
    server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vcasync.testing._emulator_main")
    parser.add_argument("kind", choices=["s3", "gcs"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--serialize", action="store_true",
                        help="s3: one request at a time (atomic If-None-Match)")
    parser.add_argument("--no-preconditions", action="store_true",
                        help="gcs: ignore ifGenerationMatch, as the stock emulator does")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.kind == "s3":
        run_s3(args.port, args.serialize)
    else:
        run_gcs(args.port, preconditions=not args.no_preconditions)


if __name__ == "__main__":
    main()
