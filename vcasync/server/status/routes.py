"""The live status page's routes: the page and its two assets, its JSON, and the evaluation hook.

::

    GET  /status              -> 308 to /status/ (the page's assets are relative to it)
    GET  /status/             the page (HTML); GET /status/app.js, /status/app.css its assets
    GET  /status/data         {"status": <the GET /v1/status document>, "live": {...}, "now": t}
    POST /v1/evals            {"version": v, "values": {"accuracy": 0.9, ...}}: an evaluator's figures

The page and assets hold no data and are served to anyone (a browser cannot send a bearer token
when it navigates); ``/status/data`` is checked by :class:`~vcasync.status.access.StatusAccess`
(open on loopback, a read token elsewhere). ``/v1/evals`` needs a worker token like every other
``/v1`` route. Everything is read-only but the evaluation hook, which only appends to a bounded
curve. Answers carry a strict Content-Security-Policy: the page runs its own script and nothing else.
"""

from __future__ import annotations

import functools
import json
import math
import time
from importlib import resources
from typing import Any, Final

from aiohttp import web

from ...protocol import _messages as P
from ...protocol._bodies import EvalRecorded, EvalRequest
from .._routes import COORDINATOR, LONGEST_WAIT, read_msg, reply_msg, status_body
from .access import StatusAccess

__all__ = ["ASSETS", "PUBLIC_STATUS_ROUTES", "STATUS_ACCESS", "routes"]

STATUS_ACCESS: Final = web.AppKey("status_access", StatusAccess)

#: Asset file name -> content type. Anything else under /status/ is 404.
ASSETS: Final = {"app.js": "text/javascript", "app.css": "text/css", "favicon.svg": "image/svg+xml"}
#: The page asks for new data this often (seconds).
REFRESH_S: Final = 2.0

def _asset_route(name: str) -> str:
    return "status_asset_" + name.replace(".", "_")


#: Routes that need no worker token (``status_data`` checks its own access rule).
PUBLIC_STATUS_ROUTES: Final = frozenset({"status_redirect", "status_page", "status_data",
                                         *(_asset_route(name) for name in ASSETS)})

_SECURITY_HEADERS: Final = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; "
                                "img-src 'self'; connect-src 'self'; base-uri 'none'; "
                                "form-action 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


@functools.cache
def _static(name: str) -> bytes:
    return resources.files(__package__ or "vcasync.server.status").joinpath("static", name).read_bytes()


async def _redirect(request: web.Request) -> web.Response:
    return web.Response(status=308, headers={"Location": "status/", **_SECURITY_HEADERS})


async def _page(request: web.Request) -> web.Response:
    return web.Response(body=_static("index.html"), content_type="text/html", charset="utf-8",
                        headers={**_SECURITY_HEADERS, "Cache-Control": "no-cache"})


def _asset(name: str) -> Any:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=_static(name), content_type=ASSETS[name], charset="utf-8",
                            headers={**_SECURITY_HEADERS, "Cache-Control": "no-cache"})
    return handler


def page_data(request: web.Request) -> dict[str, Any]:
    """The JSON of ``/status/data``: the ``/v1/status`` document and the live view."""
    coord = request.app[COORDINATOR]
    return {"status": status_body(coord, request.app.get(LONGEST_WAIT, math.inf)),
            "live": coord.live_status(), "now": time.time(), "refresh_s": REFRESH_S}


async def _data(request: web.Request) -> web.Response:
    request.app[STATUS_ACCESS].check(request.remote, request.headers.get("Authorization", ""),
                                     request.headers.get("Host"))
    text = json.dumps(page_data(request), default=str, allow_nan=False)
    return web.Response(text=text, content_type=P.JSON,
                        headers={**_SECURITY_HEADERS, "Cache-Control": "no-store"})


async def _eval(request: web.Request) -> web.Response:
    req = await read_msg(request, EvalRequest)
    request.app[COORDINATOR].record_eval(req.version, req.values)
    return reply_msg(request, EvalRecorded(req.version))


def routes(prefix: str = P.API_PREFIX) -> list[web.RouteDef]:
    """The status page's routes, named (see :data:`PUBLIC_STATUS_ROUTES`)."""
    return [
        web.get("/status", _redirect, name="status_redirect", allow_head=False),
        web.get("/status/", _page, name="status_page", allow_head=False),
        *(web.get(f"/status/{name}", _asset(name), name=_asset_route(name), allow_head=False)
          for name in ASSETS),
        web.get("/status/data", _data, name="status_data", allow_head=False),
        web.post(f"{prefix}/evals", _eval, name="eval"),
    ]
