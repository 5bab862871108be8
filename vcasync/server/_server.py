"""The coordinator's HTTP server: a thin aiohttp skin over a :class:`~vcasync.coordinator.Coordinator`.

Routes (all under ``/v1`` but the probes; every one but ``/healthz`` and ``/metrics`` needs a
credential)::

    POST /v1/join                       join credential -> {worker_id, token}
    POST /v1/leases                     -> a lease (201), 503 + Retry-After, or 410 run_finished
    POST /v1/leases/{lease}/resume      -> the same lease, if still valid
    POST /v1/leases/{lease}/heartbeat   {steps_done, stopping} -> the lease with its new deadline
    PUT  /v1/leases/{lease}/result      wire payload, streamed into the coordinator -> a receipt
    POST /v1/leases/{lease}/release     {reason}
    GET  /v1/models/{version|latest}    wire payload, streamed; ETag / If-None-Match -> 304
    GET  /v1/status                     JSON
    GET  /healthz   GET /metrics        liveness; Prometheus text
    GET  /status/ ...  POST /v1/evals   the live status page (see :mod:`vcasync.server.status`)

Every error is a 4xx/5xx with a JSON body ``{"error": code, "message": ..., <context>}``; the table
from exception class to status lives in :mod:`vcasync.protocol._errors`. While the coordinator's storage is
unavailable, leases, results and joins are answered ``503 storage_unavailable`` with ``Retry-After``.
Control bodies are msgpack (``application/x-msgpack``) or JSON. Credentials never reach a log line.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import HttpVersion11, web

from ..coordinator import Coordinator
from ..errors import (
    AuthError,
    ClosedError,
    ConfigError,
    StorageError,
    StorageFailedError,
    StorageUnavailableError,
    VCAsyncError,
)
from ..protocol import _messages as P
from ..protocol._errors import error_fields, spec_for
from ..wire import Limits
from . import _routes as R
from ._access_log import AccessLog, without_query
from ._auth import TokenAuthority
from ._http_metrics import HttpMetrics
from ._parser_errors import JsonErrorRunner, undecodable_body
from ._refusals import RefusalLog
from ._stalls import StallLog
from ._upload_pace import BodyCutOff, BodyTimeouts, Pace
from ._waits import cap_wait, longest_wait, told_wait
from .status import PUBLIC_STATUS_ROUTES, STATUS_ACCESS, StatusAccess
from .status import routes as status_routes

__all__ = ["BodyTimeouts", "Listener", "Pace", "Server", "ServerConfig", "build_app", "listen",
           "server_ssl_context"]

log = logging.getLogger("vcasync.server")

#: The refused-request log of an app (see _refusals); what an error response says, for it.
REFUSALS = web.AppKey("vcasync_refusals", RefusalLog)
#: The longest wait told to a worker (``inf``: as the coordinator says); see :mod:`._waits`.
_CODE = web.ResponseKey("vcasync_error_code", str)
_MESSAGE = web.ResponseKey("vcasync_error_message", str)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Routes that need no worker token (each checks its own credential, or serves no data).
_PUBLIC_ROUTES = R.PUBLIC_ROUTES | PUBLIC_STATUS_ROUTES

_HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 408: "request_timeout",
               413: "limit_exceeded", 415: "unsupported_media_type"}


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Where and how the server listens. ``port=0`` picks a free port (see :attr:`Server.url`)."""

    host: str = "127.0.0.1"             # address to listen on ("0.0.0.0": every interface)
    port: int = 8470                    # 0 picks a free port
    tls_cert: Path | None = None        # PEM certificate (chain): serve HTTPS, TLS >= 1.2 ...
    tls_key: Path | None = None         # ... with this PEM private key
    #: Largest result upload accepted; ``None``: the wire's default ``max_message_bytes``.
    max_result_bytes: int | None = None
    chunk_size: int = 1 << 20           # bytes read from an upload at a time
    access_log: bool = True             # one INFO line per request (logger aiohttp.access)
    backlog: int = 2048                 # connections waiting to be accepted
    shutdown_timeout_s: float = 5.0     # in-flight requests get this long at shutdown
    #: A request body that sends nothing for this long is cut off with 408 ...
    body_idle_timeout_s: float = 30.0
    #: ... and so is one that, once it ran ``upload_rate_grace_s``, brought less than this rate over
    #: the last ``upload_rate_window_s``, or is not complete within ``upload_rate_grace_s`` plus its
    #: size at this rate (see docs/limits.md). 0 turns both checks off.
    min_upload_bytes_per_s: float = 16 * 1024
    upload_rate_grace_s: float = 10.0   # see min_upload_bytes_per_s
    upload_rate_window_s: float = 10.0  # see min_upload_bytes_per_s
    #: A connection that has not sent a whole request head for this long, counted from its connect
    #: or its last answer, is closed: headers trickled in (slow loris), or a kept-alive connection
    #: left idle (aiohttp's keep-alive timeout, which it arms at connect).
    idle_timeout_s: float = 75.0

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("TLS needs both a certificate file and a key file")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port} is out of range")
        if self.max_result_bytes is not None and self.max_result_bytes <= 0:
            raise ConfigError("max_result_bytes must be positive")
        # chunk_size 0 read nothing from every upload (each refused as truncated, and counted
        # against its worker); a negative backlog is the kernel's to clamp, silently
        if not 1 <= self.chunk_size <= 1 << 30:
            raise ConfigError(f"chunk_size must be a whole number of bytes from 1 to 1 GiB, got "
                              f"{self.chunk_size!r}")
        if self.backlog < 1:
            raise ConfigError(f"backlog must be a whole number >= 1, got {self.backlog!r}")
        if not 0 <= self.shutdown_timeout_s < math.inf:     # NaN fails this, as it did no `< 0` check
            raise ConfigError(f"shutdown_timeout_s must be a finite number >= 0 (0: in-flight requests "
                              f"are not waited for), got {self.shutdown_timeout_s!r}")
        # Each bound is checked on its own so the error names the one field that is wrong; an
        # infinite timeout is refused like a negative one: it would switch a slow-loris guard off
        # without saying so (min_upload_bytes_per_s = 0 is the documented way to switch the rate
        # checks off).
        for name, low, strict in (("body_idle_timeout_s", 0.0, True), ("idle_timeout_s", 0.0, True),
                                  ("upload_rate_window_s", 0.0, True),
                                  ("upload_rate_grace_s", 0.0, False),
                                  ("min_upload_bytes_per_s", 0.0, False)):
            value = getattr(self, name)
            ok = (value > low if strict else value >= low) and value < math.inf
            if not ok:     # NaN fails both comparisons
                raise ConfigError(f"{name} must be a finite number {'>' if strict else '>='} {low:g}, "
                                  f"got {value!r}")

    @property
    def body_timeouts(self) -> BodyTimeouts:
        return BodyTimeouts(idle_s=self.body_idle_timeout_s, min_rate=self.min_upload_bytes_per_s,
                            grace_s=self.upload_rate_grace_s, window_s=self.upload_rate_window_s)


def server_ssl_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A TLS (>= 1.2) server context from PEM certificate and key files; ConfigError if unreadable."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS certificate {cert} / key {key}: {exc}") from exc
    return ctx


class Listener:
    """The listening sockets of a :class:`Server` and its TLS context, made by :func:`listen`
    before the Server starts, so that everything about the address and the TLS files that can be
    wrong is found before a coordinator touches its storage. The Server that starts with it owns
    the sockets from then on; :meth:`close` (idempotent) closes those never handed over."""

    def __init__(self, sockets: list[socket.socket], ssl_context: ssl.SSLContext | None) -> None:
        self.sockets = sockets
        self.ssl_context = ssl_context

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Listener:     # beside an ``async with`` of the storage
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


def listen(config: ServerConfig) -> Listener:
    """Load the TLS files into a context and bind ``config``'s address (every address its host
    resolves to, as aiohttp would), listening; a :class:`ConfigError` naming what is wrong: a TLS
    file that is missing, unreadable or not a matching certificate and key, a host that does not
    resolve or is not this machine's, a port in use."""
    ctx = (server_ssl_context(config.tls_cert, config.tls_key)
           if config.tls_cert and config.tls_key else None)
    try:
        return Listener(_bind(config.host or None, config.port, config.backlog), ctx)
    except OSError as exc:     # a port in use, a host that is not this machine's: a traceback before
        why = (exc.strerror or str(exc) or type(exc).__name__).lower()   # as asyncio words it
        raise ConfigError(f"cannot listen on {config.host}:{config.port}: {why} (server.host is one "
                          f"of this machine's addresses, server.port a free port or 0)") from exc


def _bind(host: str | None, port: int, backlog: int) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for ``host``:``port``, made as asyncio's
    ``create_server`` makes them (SO_REUSEADDR on POSIX, IPv6 sockets IPv6-only)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            if os.name == "posix" and sys.platform != "cygwin":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, True)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, True)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _error_response(status: int, code: str, message: str, fields: dict[str, Any] | None = None,
                     headers: dict[str, str] | None = None) -> web.Response:
    resp = web.json_response({"error": code, "message": message, **(fields or {})}, status=status,
                             headers=headers)
    reason = (fields or {}).get("reason")
    # for the refusal log: the code and the finer reason (invalid_update: non_finite)
    resp[_CODE] = code if not reason or reason == code else f"{code} ({reason})"
    resp[_MESSAGE] = message
    return resp


def _vcasync_error(exc: VCAsyncError, longest_wait: float = math.inf) -> web.Response:
    """``exc`` as its JSON answer; a wait it asks of the caller (``retry_after`` of a 503 or 429) is
    at most ``longest_wait`` seconds, so a waiting worker asks again while a finished run is still
    served (see :mod:`vcasync.server._waits`)."""
    spec = spec_for(exc)
    headers: dict[str, str] = {}
    fields = error_fields(exc)
    if isinstance(exc, AuthError):
        headers["WWW-Authenticate"] = 'Bearer realm="vcasync"'
    message = str(exc)
    retry_after = getattr(exc, "retry_after", None)   # no work yet; backing off; storage unavailable
    if spec.status in (429, 503) and isinstance(retry_after, int | float):
        wait, whole = cap_wait(retry_after, longest_wait)
        if wait < retry_after:
            fields["retry_after"] = wait
        if spec.status == 503:
            headers["Retry-After"] = str(whole)
        message = told_wait(message, wait)
    if spec.status == 500:
        log.warning("%s: %s", spec.code, exc)
    return _error_response(spec.status, spec.code, message, fields, headers)


async def _cut_off(request: web.Request, exc: BodyCutOff) -> web.StreamResponse:
    """Answer a too-slow body with 408 and close its connection now: the rest of a drip is not
    worth reading (aiohttp would linger on it for 10 s), and the client must not reuse it."""
    resp = _error_response(exc.status, "request_timeout", exc.reason)
    resp.force_close()
    try:
        await resp.prepare(request)
        await resp.write_eof()
    except (ConnectionError, RuntimeError):
        pass        # the client hung up first: nothing to tell it
    request.protocol.force_close()
    return resp


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    resp = await _answer(request, handler)
    if 400 <= resp.status < 500:
        # refused requests are the operator's to see (docs/operating.md), not only aiohttp's
        # access log, which may be off: once per kind and caller and window
        match = request.match_info
        request.app[REFUSALS].note(
            status=resp.status, code=resp.get(_CODE, f"http_{resp.status}"),
            message=resp.get(_MESSAGE, resp.reason or ""),
            route=match.route.name or f"{request.method} {request.path}"[:120],
            worker=request.get(R.WORKER_ID), peer=request.remote, lease=match.get("lease"))
    return resp


async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
    longest_wait = request.app[R.LONGEST_WAIT]
    try:
        return await handler(request)
    except (StorageUnavailableError, StorageFailedError) as exc:
        return _vcasync_error(exc, longest_wait)
    except StorageError as exc:
        # A write of the coordinator's own (a join token) failed: that is its storage being
        # down, not the caller's fault, so the caller is told to wait like everyone else.
        return _vcasync_error(request.app[R.COORDINATOR].report_storage_failure(exc), longest_wait)
    except VCAsyncError as exc:
        return _vcasync_error(exc, longest_wait)
    except BodyCutOff as exc:
        return await _cut_off(request, exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _HTTP_CODES.get(exc.status, f"http_{exc.status}")
        return _error_response(exc.status, code, exc.reason, headers=None)
    except web.RequestPayloadError as exc:
        # The body does not decode (a gzip body that is not gzip, broken chunks): the client's
        # bytes, answered like a request aiohttp's parser refuses; what follows on this
        # connection can no longer be told apart, so it is closed.
        resp = _error_response(400, "bad_http_request", undecodable_body(exc))
        resp.force_close()
        return resp
    except ConnectionError:
        # The client hung up before its request was complete (a worker preempted mid-upload, or
        # during a model download): routine on spot machines, and nothing changed. Neither an
        # internal error nor re-raised (aiohttp logs that at ERROR with a traceback): nobody reads
        # this answer, and the refusal log makes it one INFO line.
        resp = _error_response(400, "client_disconnected",
                               "the connection was lost before the request was complete")
        resp.force_close()
        return resp
    except TimeoutError:
        raise
    except Exception:
        # the path as sent (one line), its query masked as in the access log
        log.exception("internal error in %s %s", request.method, without_query(request.raw_path)[:200])
        return _error_response(500, "internal_error", "internal server error; see the coordinator's log")


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    name = request.match_info.route.name
    if name is not None and name not in _PUBLIC_ROUTES:
        try:
            request[R.WORKER_ID] = request.app[R.AUTH].verify(R.bearer(request))
        except AuthError:
            request.app[R.HTTP_METRICS].auth_failures += 1
            raise
    return await handler(request)


@web.middleware
async def _metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    start = time.perf_counter()
    resp = await handler(request)
    route = request.match_info.route.name or "unmatched"
    out = resp.body_length if resp.prepared else (resp.content_length or 0)
    # the body bytes that arrived, not the Content-Length the client declared: a request refused
    # before its body is read (401, 413) declared what it liked and sent nothing
    request.app[R.HTTP_METRICS].observe(route, request.method, resp.status, time.perf_counter() - start,
                                        request.content.total_bytes, out)
    return resp


async def _expect(request: web.Request) -> None:
    """A request's ``Expect`` header. ``100-continue`` is answered ``100 Continue`` only when the
    route will read the body: not when its credential or its declared size is refused, which the
    route then answers at once, before one byte of the body is sent (aiohttp's own handler invited
    every body first, a 4 GB upload with a wrong token included). Any other expectation is ignored,
    as RFC 9110 allows (aiohttp answered it with a ``text/plain`` 417 outside the JSON errors)."""
    if request.version != HttpVersion11 or request.headers.get("Expect", "").lower() != "100-continue":
        return
    if _refused_unread(request):
        return
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0       # the answer's own bytes have not begun (as aiohttp does)


def _refused_unread(request: web.Request) -> bool:
    """Whether the route will refuse ``request`` before reading its body: its credential (the
    check :func:`_auth` makes, or the route's own: ``R.OWN_CREDENTIAL``) or its Content-Length."""
    app, name = request.app, request.match_info.route.name
    length = request.content_length or 0
    if length > (app[R.MAX_RESULT] if name == "result" else P.MAX_CONTROL_BYTES):
        return True
    check = R.OWN_CREDENTIAL.get(name or "")
    if check is None:
        if name is None or name in _PUBLIC_ROUTES:
            return False
        check = TokenAuthority.verify
    try:
        check(app[R.AUTH], R.bearer(request))
    except VCAsyncError:
        return True
    return False


def _expecting(defs: list[web.RouteDef]) -> list[web.RouteDef]:
    """``defs``, each with :func:`_expect` for its ``Expect`` header."""
    return [web.RouteDef(d.method, d.path, d.handler, {**d.kwargs, "expect_handler": _expect})
            for d in defs]


async def _metrics_page(request: web.Request) -> web.Response:
    """The coordinator's registry (its metrics and this server's HTTP counters), exposed once."""
    return web.Response(text=coordinator_metrics_text(request.app[R.COORDINATOR]),
                        content_type="text/plain", charset="utf-8",
                        headers={"X-Content-Type-Options": "nosniff"})


def coordinator_metrics_text(coord: Coordinator) -> str:
    """The Prometheus text exposition of the coordinator's registry."""
    return coord.metrics.render_prometheus()


def build_app(coordinator: Coordinator, authority: TokenAuthority,
              config: ServerConfig | None = None, *,
              status_access: StatusAccess | None = None,
              linger_s: float | None = None) -> web.Application:
    """The aiohttp application exposing ``coordinator``; state under typed ``web.AppKey``\\ s.
    ``status_access``: who may read the status page's data (default: loopback only). ``linger_s``:
    how long the run is served once finished (None: not known); no wait told to a worker is longer
    than half of it (:func:`~vcasync.server._waits.longest_wait`), so a waiting worker hears the end."""
    config = config or ServerConfig()
    app = web.Application(middlewares=[_metrics, _errors, _auth], client_max_size=1 << 16)
    app[R.COORDINATOR] = coordinator
    app[R.AUTH] = authority
    app[REFUSALS] = RefusalLog()
    app[R.LONGEST_WAIT] = longest_wait(linger_s)
    http_metrics = app[R.HTTP_METRICS] = HttpMetrics()
    app[R.MAX_RESULT] = config.max_result_bytes or Limits().max_message_bytes
    app[R.CHUNK] = config.chunk_size
    app[R.BODY_TIMEOUTS] = config.body_timeouts
    app[STATUS_ACCESS] = status_access or StatusAccess()
    app.add_routes(_expecting(R.routes()))
    app.add_routes(_expecting(status_routes()))
    app.router.add_get("/metrics", _metrics_page, name="metrics", expect_handler=_expect)
    registry = coordinator.metrics.registry

    async def expose(_: web.Application) -> None:
        registry.register(http_metrics)

    async def withdraw(_: web.Application) -> None:
        with contextlib.suppress(KeyError):          # startup never ran
            registry.unregister(http_metrics)

    app.on_startup.append(expose)
    app.on_cleanup.append(withdraw)
    return app


class Server:
    """Serve ``coordinator`` over HTTP(S) while inside ``async with``; the coordinator's lifetime is
    the caller's (open it first, close it after). ``status_access``: who may read the live status
    page's data, ``/status/data`` (default: loopback only; see
    :class:`vcasync.server.status.StatusAccess`). ``linger_s``: how long the caller keeps serving
    once the run is finished (``vcasync coordinator --linger``); every wait the server tells a worker
    is then at most half of it, so that a waiting worker asks again, hears ``410 run_finished`` and
    exits before the server goes (None or 0: waits as the coordinator says)."""

    def __init__(self, coordinator: Coordinator, authority: TokenAuthority,
                 config: ServerConfig | None = None, *, status_access: StatusAccess | None = None,
                 listener: Listener | None = None, linger_s: float | None = None) -> None:
        self.config = config or ServerConfig()
        #: Sockets bound by :func:`listen` beforehand (``vcasync coordinator`` binds before it
        #: touches the storage); None: :meth:`start` binds ``config``'s address itself.
        self._listener = listener
        self._status_access = status_access
        self._linger_s = linger_s
        self._coordinator = coordinator
        self._authority = authority
        self._runner: web.AppRunner | None = None
        self._stalls: StallLog | None = None
        self._port: int | None = None
        self._closed = False

    async def __aenter__(self) -> Server:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def start(self) -> None:
        if self._closed:
            raise ClosedError("this Server was closed; create a new one")
        if self._runner is not None:
            return
        cfg = self.config
        listener, self._listener = self._listener or listen(cfg), None
        try:
            await self._authority.load()
            # workers that joined after the coordinator's last snapshot: listed by name, not lost
            self._coordinator.recall_workers(self._authority.joined())
            app = build_app(self._coordinator, self._authority, cfg, status_access=self._status_access,
                            linger_s=self._linger_s)
            # the access log's line, its query strings masked: a token pasted into a URL stays out
            kwargs: dict[str, Any] = ({"access_log_class": AccessLog} if cfg.access_log
                                      else {"access_log": None})
            self._stalls = StallLog(cfg.idle_timeout_s, metrics=app[R.HTTP_METRICS])
            runner = JsonErrorRunner(app, refusals=app[REFUSALS], metrics=app[R.HTTP_METRICS],
                                     stalls=self._stalls, handle_signals=False,
                                     shutdown_timeout=cfg.shutdown_timeout_s,
                                     keepalive_timeout=cfg.idle_timeout_s, **kwargs)
            await runner.setup()
        except BaseException:
            listener.close()
            raise
        try:
            for sock in listener.sockets:
                site = web.SockSite(runner, sock, ssl_context=listener.ssl_context,
                                    backlog=cfg.backlog)
                await site.start()
        except BaseException:
            await runner.cleanup()
            listener.close()
            raise
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        log.info("serving on %s", self.url)

    @property
    def app(self) -> web.Application:
        if self._runner is None:
            raise ClosedError("the server is not running")
        return self._runner.app

    @property
    def port(self) -> int:
        if self._port is None:
            raise ClosedError("the server is not running")
        return self._port

    @property
    def url(self) -> str:
        """``http(s)://host:port`` of the listening socket (IPv6 hosts in brackets)."""
        scheme = "https" if self.config.tls_cert else "http"
        host = self.config.host or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"{scheme}://{host}:{self.port}"

    @property
    def status_url(self) -> str:
        """The live status page's address (``/status/``)."""
        return f"{self.url}/status/"

    async def aclose(self) -> None:
        """Stop listening and finish in-flight requests (bounded by ``shutdown_timeout_s``)."""
        self._closed = True
        listener, self._listener = self._listener, None
        if listener is not None:        # never started: its sockets are still ours to close
            listener.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        stalls, self._stalls = self._stalls, None
        if stalls is not None:
            stalls.close()      # the stalls of the last window, logged now rather than never
