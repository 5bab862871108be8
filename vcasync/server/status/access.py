"""Who may read the status page's data: anyone on loopback, elsewhere the holder of a read token.

The read token (``VCASYNC_STATUS_TOKEN`` or ``--status-token-file``) is a credential of its own:
it is not the join secret (every volunteer holds that) nor the operator token (a browser keeps the
read token in its session storage). Only its SHA-256 digest is kept, compared in constant time;
``repr`` says whether one is set, never what it is. Behind a reverse proxy on the same host every
request comes from loopback: set ``open_on_loopback=False`` (``--status-no-loopback``) there.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress

from ...errors import AuthError, ConfigError, StatusDisabledError

__all__ = ["MIN_TOKEN_LENGTH", "StatusAccess", "is_loopback"]

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

    def check(self, remote: str | None, authorization: str) -> None:
        """Pass, or raise :class:`StatusDisabledError` (no token configured and not on loopback) or
        :class:`AuthError` (the ``Authorization: Bearer`` credential is missing or wrong)."""
        if self.open_on_loopback and is_loopback(remote):
            return
        if self._digest is None:
            raise StatusDisabledError("the status page's data is served to loopback only: start the "
                                      "coordinator with VCASYNC_STATUS_TOKEN or --status-token-file "
                                      "to read it from elsewhere")
        scheme, _, value = authorization.partition(" ")
        got = _digest(value.strip()) if scheme.lower() == "bearer" else bytes(32)
        if not hmac.compare_digest(got, self._digest) or not value.strip():
            raise AuthError("status credential refused: send 'Authorization: Bearer <status read "
                            "token>'")
