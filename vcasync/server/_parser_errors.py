"""JSON answers for requests aiohttp's HTTP parser refuses before any route sees them.

A request line with a control character, a header over 8190 bytes, too many headers: aiohttp
answers those itself with a ``text/plain`` 400 that quotes the offending bytes, and logs them at
ERROR with a traceback (attacker-controlled bytes in the log, and a credential if it was in the
oversized header). :class:`JsonErrorRunner` answers them like every other error of the API, a JSON
``{"error": "bad_http_request", "message": ...}`` naming the problem but not the bytes, and logs one
line without them, through the server's refusal log (:class:`~._refusals.RefusalLog`): at most one a
minute per peer, 50 a minute in all, so a client sending garbage does not fill the log with a line
per request when the access log is off.

A body that does not decode (``Content-Encoding: gzip`` on bytes that are not gzip, broken chunked
framing) is found only as it is read. A route reading it gets
:class:`aiohttp.web.RequestPayloadError`, which the server's error middleware answers with the same
``bad_http_request`` (its message from :func:`undecodable_body`), closing the connection. A route
that answered without reading it (a 401, a 404) leaves aiohttp to drain it after the answer, and
the handler logs that failure as one INFO line, not as an ERROR traceback.

The same handler tells a :class:`~._stalls.StallLog` of each connection aiohttp closes for not
sending a whole request head within its keep-alive timeout (the server's ``idle_timeout_s``).
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler, RequestPayloadError
from aiohttp.web_request import BaseRequest

from ._http_metrics import HttpMetrics
from ._refusals import RefusalLog
from ._stalls import StallLog

__all__ = ["JsonErrorRunner", "undecodable_body"]

log = logging.getLogger("vcasync.server")


class _JsonErrorHandler(RequestHandler):
    #: Where refusals are logged (set by the server that makes the handler); None: a line each.
    refusals: RefusalLog | None = None
    #: Where they are counted (``vcasync_http_malformed_requests_total``); None: nowhere.
    metrics: HttpMetrics | None = None
    #: Told of a connection closed for stalling before its request head; None: nobody.
    stalls: StallLog | None = None
    #: Bytes received on this connection, in all and by the end of its last request's handler.
    received = 0
    received_at_answer = 0

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        super().data_received(data)

    async def _handle_request(self, *args: Any, **kwargs: Any) -> Any:
        # aiohttp's private hook, its arguments passed through as they are: their list has changed
        # between aiohttp releases (``aiohttp>=3.9`` is allowed), and a request must never fail here
        try:
            return await super()._handle_request(*args, **kwargs)
        finally:
            self.received_at_answer = self.received

    def _process_keepalive(self) -> None:
        # aiohttp's keep-alive timer, armed at connect and after each answer, closes a connection
        # still waiting for a request head (force_close): one that sent nothing since, or part of
        # a head, stalled; one kept alive by a client's pool and idle since its answer did not.
        closing, peer = self._force_close, self._peer()     # the peer: before the transport goes
        super()._process_keepalive()
        if closing or not self._force_close or self.stalls is None:
            return
        if self.received > self.received_at_answer:
            self.stalls.note("partial_head", peer)
        elif self._request_count == 0:
            self.stalls.note("nothing", peer)

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "error"
        what = type(exc).__name__ if exc is not None else phrase
        if self.metrics is not None:
            self.metrics.note_malformed("request")
        if self.refusals is None:
            log.info("refused a malformed HTTP request from %s: %d %s", request.remote, status, what)
        else:
            self.refusals.note(status=status, code="bad_http_request", message=f"{what}: {phrase}",
                               route="a malformed HTTP request", worker=None,
                               peer=request.remote, lease=None, routine=True)
        resp = web.json_response({"error": "bad_http_request",
                                  "message": f"malformed HTTP request ({what}): {phrase}"}, status=status)
        resp.force_close()
        return resp

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        if isinstance(exc, RequestPayloadError):
            # aiohttp drained the body of a request already answered (and logged), and it did not
            # decode: the client's bytes, not a fault of the server, and no traceback to read
            why = f"it did not decode ({_cause_name(exc)}); dropped"
            if self.metrics is not None:
                self.metrics.note_malformed("body")
            if self.refusals is None:
                log.info("dropped the rest of a request body from %s that did not decode (%s)",
                         self._peer(), _cause_name(exc))
            else:
                self.refusals.note(status=400, code="bad_http_request", message=why,
                                   route="the rest of a request body", worker=None,
                                   peer=self._peer(), lease=None, routine=True)
            return
        super().log_exception(*args, **kw)

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return str(peer[0]) if isinstance(peer, tuple) and peer else "a closed connection"


def _cause_name(exc: RequestPayloadError) -> str:
    """What aiohttp found wrong with a body (``ContentEncodingError``, ...), not its bytes."""
    return type(exc.__cause__).__name__ if exc.__cause__ is not None else type(exc).__name__


def undecodable_body(exc: RequestPayloadError) -> str:
    """The message of the ``400 bad_http_request`` answering a request body that does not decode
    as its headers say (naming what aiohttp found wrong, not the bytes)."""
    return (f"malformed HTTP request body ({_cause_name(exc)}): it does not decode as its "
            "Content-Encoding and Transfer-Encoding headers say")


class _JsonErrorServer(web.Server):
    refusals: RefusalLog | None = None
    metrics: HttpMetrics | None = None
    stalls: StallLog | None = None

    def __call__(self) -> RequestHandler:
        handler = _JsonErrorHandler(self, loop=self._loop, **self._kwargs)
        handler.refusals = self.refusals
        handler.metrics = self.metrics
        handler.stalls = self.stalls
        return handler


class JsonErrorRunner(web.AppRunner):
    """An :class:`aiohttp.web.AppRunner` whose connections answer parser errors in JSON, logged
    through ``refusals`` (None: one INFO line each) and counted in ``metrics`` (None: nowhere),
    and tell ``stalls`` of those closed for stalling before their request head."""

    def __init__(self, app: web.Application, *, refusals: RefusalLog | None = None,
                 metrics: HttpMetrics | None = None, stalls: StallLog | None = None,
                 **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._refusals = refusals
        self._metrics = metrics
        self._stalls = stalls

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # Same object, one overridden method (the handler factory) and the class attribute
        # ``refusals`` given a value: no state of aiohttp's is added or lost.
        server.__class__ = _JsonErrorServer
        assert isinstance(server, _JsonErrorServer)
        server.refusals = self._refusals
        server.metrics = self._metrics
        server.stalls = self._stalls
        return server
