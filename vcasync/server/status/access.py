"""Who may read the status page's data: anyone on loopback, elsewhere the holder of a read token.

The read token (``VCASYNC_STATUS_TOKEN`` or ``--status-token-file``) is a credential of its own:
it is not the join secret (every volunteer holds that) nor the operator token (a browser keeps the
read token in its session storage). Only its SHA-256 digest is kept, compared in constant time;
``repr`` says whether one is set, never what it is. Behind a reverse proxy on the same host every
request comes from loopback: set ``open_on_loopback=False`` (``--status-no-loopback``) there.

Loopback is trusted only under a local name in the request's ``Host`` (an IP address,
``localhost`` or a name under ``.localhost``, this machine's host name): a web page opened
elsewhere whose DNS name its owner then points at 127.0.0.1 (DNS rebinding) makes the operator's
browser ask from loopback, but under that page's name, and is asked for the token like any caller.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket

from ..._redact import one_line
from ...errors import AuthError, ConfigError, StatusDisabledError

__all__ = ["MIN_TOKEN_LENGTH", "StatusAccess", "is_local_host", "is_loopback"]

MIN_TOKEN_LENGTH = 16


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


def is_loopback(remote: str | None) -> bool:
    """``remote`` (a peer address as aiohttp reports it) is 127.0.0.0/8, ::1 or a mapped form."""
    if not remote:
        return False
    try:
        addr = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


def is_local_host(host: str | None) -> bool:
    """``host`` (a ``Host`` header, with or without its port) names this machine as only a caller
    on it would: an IP address, ``localhost`` or a name under ``.localhost``, this machine's host
    name; no header at all too (a browser always sends one). A DNS name of anyone else's is not."""
    if host is None:
        return True
    name = host.strip()
    if name.startswith("["):
        name = name[1:name.find("]")] if "]" in name else name[1:]
    else:
        head, sep, port = name.rpartition(":")
        if sep and (port.isdigit() or not port):
            name = head
    name = name.rstrip(".").lower()
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
        return True
    except ValueError:
        pass
    return (name == "localhost" or name.endswith(".localhost")
            or (bool(name) and name == socket.gethostname().rstrip(".").lower()))


class StatusAccess:
    """The status page's access rule (see the module docstring)."""

    __slots__ = ("_digest", "open_on_loopback")

    def __init__(self, token: str | None = None, *, open_on_loopback: bool = True) -> None:
        if token is not None and len(token) < MIN_TOKEN_LENGTH:
            raise ConfigError(f"the status read token is too short: use at least {MIN_TOKEN_LENGTH} "
                              "characters")
        self._digest = _digest(token) if token is not None else None
        self.open_on_loopback = open_on_loopback

    def __repr__(self) -> str:
        return (f"StatusAccess(token={'set' if self._digest else 'unset'}, "
                f"open_on_loopback={self.open_on_loopback})")

    def describe(self) -> str:
        """The rule in words, for the coordinator's start-up log line (never the token)."""
        if not self.open_on_loopback:
            return "data for the read token only"
        return "data open on loopback, read token elsewhere" if self._digest else "data on loopback only"

    @property
    def has_token(self) -> bool:
        return self._digest is not None

    def check(self, remote: str | None, authorization: str, host: str | None = None) -> None:
        """Pass, or raise :class:`StatusDisabledError` (no token configured and not on loopback) or
        :class:`AuthError` (the ``Authorization: Bearer`` credential is missing or wrong).
        ``host``: the request's ``Host`` header; loopback is trusted only when it is a local name
        (:func:`is_local_host`; None: not sent)."""
        foreign = ""
        if self.open_on_loopback and is_loopback(remote):
            if is_local_host(host):
                return
            foreign = (f" (a request from loopback is trusted under a local Host only: 127.0.0.1, "
                       f"localhost or this machine's name, not {one_line(host, 100)!r})")
        if self._digest is None:
            raise StatusDisabledError("the status page's data is served to loopback only: start the "
                                      "coordinator with VCASYNC_STATUS_TOKEN or --status-token-file "
                                      f"to read it from elsewhere{foreign}")
        scheme, _, value = authorization.partition(" ")
        got = _digest(value.strip()) if scheme.lower() == "bearer" else bytes(32)
        if not hmac.compare_digest(got, self._digest) or not value.strip():
            raise AuthError("status credential refused: send 'Authorization: Bearer <status read "
                            f"token>'{foreign}")
