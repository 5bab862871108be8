"""Route handlers of the coordinator's HTTP API (``/v1/...``); the app itself is built in ``server``.

Each handler parses and checks its body, calls one :class:`~vcasync.coordinator.Coordinator` method
and renders the answer. Errors are raised as the exception tree and turned into JSON by the error
middleware, so no handler builds an error response itself.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncGenerator, Callable
from typing import Any, Final, TypeVar

from aiohttp import web

from .._redact import one_line
from ..coordinator import Coordinator
from ..errors import AuthError, FrameError, LimitExceededError
from ..protocol import _messages as P
from ..protocol._bodies import (
    HeartbeatRequest,
    Joined,
    JoinRequest,
    LeaveRequest,
    Left,
    Released,
    ReleaseRequest,
    Requeued,
    RequeueRequest,
    from_body,
    kind_of,
)
from ._auth import TokenAuthority
from ._http_metrics import HttpMetrics
from ._upload_pace import BodyTimeouts, read_body

__all__ = ["AUTH", "BODY_TIMEOUTS", "CHUNK", "COORDINATOR", "HTTP_METRICS", "LONGEST_WAIT", "MAX_RESULT",
           "PUBLIC_ROUTES", "WORKER_ID", "BodyTimeouts", "routes"]

log = logging.getLogger("vcasync.server")

COORDINATOR: Final = web.AppKey("coordinator", Coordinator)
AUTH: Final = web.AppKey("auth", TokenAuthority)
HTTP_METRICS: Final = web.AppKey("http_metrics", HttpMetrics)
#: Upper bound on a result upload in bytes (the coordinator's ``limits.max_message_bytes``).
MAX_RESULT: Final = web.AppKey("max_result_bytes", int)
CHUNK: Final = web.AppKey("chunk_size", int)
#: The longest wait (and heartbeat interval) told to a worker: half the run's linger (see ``_waits``).
LONGEST_WAIT: Final = web.AppKey("vcasync_longest_wait", float)


BODY_TIMEOUTS: Final = web.AppKey("body_timeouts", BodyTimeouts)
WORKER_ID: Final = web.RequestKey("worker_id", str)

#: Routes that need no worker token (``join`` checks a join credential itself, ``requeue`` the
#: operator token: a worker's token must not pass there).
PUBLIC_ROUTES: Final = frozenset({"healthz", "metrics", "join", "requeue"})
#: The public routes that check a credential of their own, and the check (every other route that is
#: not public takes a worker token: :meth:`TokenAuthority.verify`).
OWN_CREDENTIAL: Final[dict[str, Callable[[TokenAuthority, str], object]]] = {
    "join": TokenAuthority.check_join, "requeue": TokenAuthority.check_operator}
#: At most this many unit ids in one requeue request.
T = TypeVar("T")


def bearer(request: web.Request) -> str:
    """The bearer credential of ``request``, or :class:`AuthError` (never echoed back)."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise AuthError("missing credentials: send 'Authorization: Bearer <token>'")
    return value.strip()


def _content_type(request: web.Request) -> str:
    """The body's content type; "" without a body or a Content-Type header (which aiohttp reports
    as application/octet-stream): such a control body is read as JSON."""
    if not request.body_exists or "Content-Type" not in request.headers:
        return ""
    return request.content_type


def _reply_type(request: web.Request) -> str:
    if request.content_type == P.MSGPACK or P.MSGPACK in request.headers.get("Accept", ""):
        return P.MSGPACK
    return P.JSON


async def read_control(request: web.Request, kind: str) -> dict[str, Any]:
    """The checked control body of ``request``; the size is checked from Content-Length first."""
    length = request.content_length
    if length is not None and length > P.MAX_CONTROL_BYTES:
        raise LimitExceededError(f"control body of {length} bytes is over {P.MAX_CONTROL_BYTES}",
                                 field="body", limit=P.MAX_CONTROL_BYTES, value=length)
    data = b""
    if request.body_exists and request.content.is_eof():
        # The whole body has arrived with the head (the common case: a few bytes): nothing can
        # stall or trickle any more, so it is taken as it is; decode_control checks its size.
        data = request.content.read_nowait()
    elif request.body_exists:  # to its end (read(n) returns what has arrived), capped, with timeouts
        parts = [c async for c in read_body(request, P.MAX_CONTROL_BYTES, 4096,
                                            request.app[BODY_TIMEOUTS])]
        data = b"".join(parts)
    return P.decode_control(data, _content_type(request), kind)


async def read_msg(request: web.Request, cls: type[T]) -> T:
    """The typed control message ``cls`` a request carries (an empty body: its defaults)."""
    return from_body(cls, await read_control(request, kind_of(cls)))


def reply(request: web.Request, kind: str, body: dict[str, Any], status: int = 200) -> web.Response:
    ctype = _reply_type(request)
    return web.Response(body=P.encode_control(kind, body, ctype), status=status, content_type=ctype)


def reply_msg(request: web.Request, msg: Any, status: int = 200) -> web.Response:
    ctype = _reply_type(request)
    return web.Response(body=P.encode_msg(msg, ctype), status=status, content_type=ctype)


def _lease_id(request: web.Request) -> str:
    lease_id = request.match_info["lease"]
    if not lease_id or len(lease_id) > 128:
        raise FrameError("lease id in the path is empty or too long", field="lease")
    return lease_id


# -- handlers -------------------------------------------------------------------------------------

async def healthz(request: web.Request) -> web.Response:
    coord = request.app[COORDINATOR]
    return web.json_response({"ok": True, "version": coord.version, "run_id": coord.run_id})


async def join(request: web.Request) -> web.Response:
    app = request.app
    auth = app[AUTH]
    try:
        identity = auth.check_join(bearer(request))
    except AuthError:
        app[HTTP_METRICS].auth_failures += 1
        raise
    req = await read_msg(request, JoinRequest)
    name, info = req.name, req.info
    if identity.name is not None:  # a pre-issued join token fixes the worker's name
        name = identity.name
    worker_id = await app[COORDINATOR].join(name, info)
    token = await auth.issue(worker_id, name[:128], join_token=identity.name or "")
    log.info("worker %s joined", worker_id)
    return reply_msg(request, Joined(worker_id, token, app[COORDINATOR].run_id))


async def leave(request: web.Request) -> web.Response:
    """A worker exits cleanly: shown ``left``, not alive, until heard again; its leases stay."""
    req = await read_msg(request, LeaveRequest)
    reason = request.app[AUTH].scrub(req.reason)
    await request.app[COORDINATOR].leave(request[WORKER_ID], reason)
    log.info("worker %s left (%s)", request[WORKER_ID], one_line(reason, 64) or "no reason given")
    return reply_msg(request, Left(request[WORKER_ID]))


async def lease(request: web.Request) -> web.Response:
    await read_control(request, "lease_request")
    grant = await request.app[COORDINATOR].lease(request[WORKER_ID])
    return reply_msg(request, grant.heartbeat_at_most(request.app[LONGEST_WAIT]), status=201)


async def resume(request: web.Request) -> web.Response:
    await read_control(request, "resume")
    grant = await request.app[COORDINATOR].resume(request[WORKER_ID], _lease_id(request))
    return reply_msg(request, grant.heartbeat_at_most(request.app[LONGEST_WAIT]))


async def heartbeat(request: web.Request) -> web.Response:
    beat = await read_msg(request, HeartbeatRequest)
    grant = await request.app[COORDINATOR].heartbeat(request[WORKER_ID], _lease_id(request),
                                                     beat.steps_done, stopping=beat.stopping)
    return reply_msg(request, grant.heartbeat_at_most(request.app[LONGEST_WAIT]))


async def release(request: web.Request) -> web.Response:
    req = await read_msg(request, ReleaseRequest)
    # the worker's failure text is logged, kept in the ledger (and its snapshots) and shown: without
    # the secrets we know, whatever the worker did (an older one sends its trainer's message raw)
    reason = request.app[AUTH].scrub(req.reason)
    await request.app[COORDINATOR].release(request[WORKER_ID], _lease_id(request), reason,
                                           failed=req.failed, preempted=req.preempted)
    return reply_msg(request, Released(_lease_id(request)))


async def result(request: web.Request) -> web.Response:
    app = request.app
    limit = app[MAX_RESULT]
    length = request.content_length
    if length is not None and length > limit:
        raise LimitExceededError(f"result of {length} bytes is over the limit of {limit}",
                                 field="body", limit=limit, value=length)
    if request.body_exists and request.content_type not in (P.PAYLOAD, "application/octet-stream"):
        raise FrameError(f"a result is a wire payload: send Content-Type {P.PAYLOAD}", field="content-type")
    receipt = await app[COORDINATOR].submit(request[WORKER_ID], _lease_id(request),
                                            read_body(request, limit, app[CHUNK], app[BODY_TIMEOUTS]))
    return reply_msg(request, receipt)


async def requeue(request: web.Request) -> web.Response:
    """Operator: queue parked units again, ``{"units": [...]}`` or ``{}`` for every parked unit."""
    app = request.app
    try:
        app[AUTH].check_operator(bearer(request))
    except AuthError:
        app[HTTP_METRICS].auth_failures += 1
        raise
    req = await read_msg(request, RequeueRequest)
    done = await app[COORDINATOR].requeue(req.units)
    return reply_msg(request, Requeued(done))


def _parse_version(raw: str, current: int) -> int:
    if raw == "latest":
        return current
    if not raw.isdigit() or len(raw) > 18:
        raise FrameError(f"model version must be an integer or 'latest', got {raw[:32]!r}", field="version")
    return int(raw)


def _etag_matches(header: str, etag: str) -> bool:
    if header.strip() == "*":
        return True
    for item in header.split(","):
        tag = item.strip().removeprefix("W/")
        if tag == etag:
            return True
    return False


async def model(request: web.Request) -> web.StreamResponse:
    coord = request.app[COORDINATOR]
    version = _parse_version(request.match_info["version"], coord.version)
    etag = f'"{coord.model_etag(version)}"'
    headers = {"ETag": etag, "X-VCAsync-Version": str(version), "Cache-Control": "private, max-age=0"}
    inm = request.headers.get("If-None-Match")
    if inm is not None and _etag_matches(inm, etag):
        return web.Response(status=304, headers=headers)
    payload = coord.model_payload(version)
    try:
        first = await anext(payload)  # errors (e.g. a dropped version) surface before headers go out
        resp = web.StreamResponse(status=200, headers={**headers, "Content-Type": P.PAYLOAD})
        await resp.prepare(request)
        await resp.write(first)
        async for chunk in payload:
            await resp.write(chunk)
        await resp.write_eof()
        return resp
    finally:
        if isinstance(payload, AsyncGenerator):  # a client that hangs up must not pin the version
            await payload.aclose()


def status_body(coord: Coordinator, longest_wait: float = math.inf) -> dict[str, Any]:
    """The ``GET /v1/status`` document (the status page shows the same one); the storage's
    ``retry_after_s`` is the wait a refused worker is told, at most ``longest_wait``."""
    body: dict[str, Any] = _scrub({**coord.status(), "version": coord.version})
    storage = body.get("storage")
    if isinstance(storage, dict) and isinstance(storage.get("retry_after_s"), int | float):
        storage["retry_after_s"] = min(storage["retry_after_s"], longest_wait)
    return body


async def status(request: web.Request) -> web.Response:
    body = status_body(request.app[COORDINATOR], request.app[LONGEST_WAIT])
    # an authenticated answer that changes by the second: no cache keeps it (as /status/data)
    return web.Response(text=json.dumps(body, default=str, allow_nan=False), content_type=P.JSON,
                        headers={"Cache-Control": "no-store"})


def _scrub(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _scrub(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_scrub(v) for v in obj]
    return obj


def routes(prefix: str = P.API_PREFIX) -> list[web.RouteDef]:
    """Every route of the API, each named so middlewares can tell them apart."""
    return [
        web.get("/healthz", healthz, name="healthz"),
        web.post(f"{prefix}/join", join, name="join"),
        web.post(f"{prefix}/leave", leave, name="leave"),
        web.post(f"{prefix}/leases", lease, name="lease"),
        web.post(f"{prefix}/leases/{{lease}}/resume", resume, name="resume"),
        web.post(f"{prefix}/leases/{{lease}}/heartbeat", heartbeat, name="heartbeat"),
        web.put(f"{prefix}/leases/{{lease}}/result", result, name="result"),
        web.post(f"{prefix}/leases/{{lease}}/release", release, name="release"),
        web.get(f"{prefix}/models/{{version}}", model, name="model", allow_head=False),
        web.get(f"{prefix}/status", status, name="status"),
        web.post(f"{prefix}/units/requeue", requeue, name="requeue"),
    ]
