"""JSON answers for requests aiohttp's HTTP parser refuses before any route sees them.

A request line with a control character, a header over 8190 bytes, too many headers: aiohttp
answers those itself with a ``text/plain`` 400 that quotes the offending bytes, and logs them at
ERROR with a traceback (attacker-controlled bytes in the log, and a credential if it was in the
oversized header). :class:`JsonErrorRunner` answers them like every other error of the API, a JSON
``{"error": "bad_http_request", "message": ...}`` naming the problem but not the bytes, and logs one
line without them.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

__all__ = ["JsonErrorRunner"]

log = logging.getLogger("vcasync.server")


class _JsonErrorHandler(RequestHandler):
    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "error"
        what = type(exc).__name__ if exc is not None else phrase
        log.info("refused a malformed HTTP request from %s: %d %s", request.remote, status, what)
        resp = web.json_response({"error": "bad_http_request",
                                  "message": f"malformed HTTP request ({what}): {phrase}"}, status=status)
        resp.force_close()
        return resp


class _JsonErrorServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, **self._kwargs)


class JsonErrorRunner(web.AppRunner):
    """An :class:`aiohttp.web.AppRunner` whose connections answer parser errors in JSON."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # Same object, one overridden method (the handler factory): no state is added or lost.
        server.__class__ = _JsonErrorServer
        return server
