"""The server room: the coordinator's HTTP server, a thin aiohttp skin over a Coordinator.

The public names are re-exported here; the modules beside them are private: ``_server`` (the app,
its config and TLS), ``_routes`` (one handler per route), ``_auth`` (join credentials and per-worker
tokens), ``_upload_pace`` (request bodies read against the clock), ``_parser_errors`` (JSON answers
for requests aiohttp's parser refuses), ``_http_metrics`` (HTTP-level counters), ``_waits`` (the
longest wait told to a worker, so it hears the end of a run while the run lingers) and ``_collector``
(the garbage collector kept from stalling the loop).
"""

from __future__ import annotations

from ._auth import MIN_SECRET_LENGTH, check_join_tokens, check_length
from ._collector import CollectorGuard
from ._server import (
    BodyTimeouts,
    Listener,
    Pace,
    Server,
    ServerConfig,
    build_app,
    listen,
    server_ssl_context,
)

__all__ = ["MIN_SECRET_LENGTH", "BodyTimeouts", "CollectorGuard", "Listener", "Pace", "Server",
           "ServerConfig", "build_app", "check_join_tokens", "check_length", "listen", "server_ssl_context"]
