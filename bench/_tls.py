"""TLS contexts for the benches, over the harness's self-signed certificate for 127.0.0.1."""

from __future__ import annotations

import ssl
from pathlib import Path


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


def client_context(cert: Path) -> ssl.SSLContext:
    """Trusts exactly the bench's certificate and checks the host name (127.0.0.1) against it."""
    return ssl.create_default_context(cafile=str(cert))
