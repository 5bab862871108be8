"""Secrets taken out of failure text before it leaves the process or reaches a log.

A trainer's exception message is the user's code talking, and it may hold anything: a message built
from ``os.environ``, a storage URL with its credentials, the worker's own bearer token. The worker
sends it with the lease it releases, and the coordinator logs it, keeps it in the ledger (stored in
every snapshot) and shows it on the status page. So both ends scrub it (docs/leases.md, "Failures
are attributed to workers"): the worker takes out every secret it knows (:class:`Redactor`), the
coordinator's server the ones it knows (the join secret, join tokens and operator token, compared by
digest: it keeps no plain copy); both take out anything shaped like a credential, whoever's:
a worker token (:data:`WORKER_TOKEN`), a URL's user info, a bearer token (:data:`SHAPES`). Each
found secret becomes :data:`MASK`.

What is scrubbed is text matched exactly: a secret the message encodes (escaped, split, hashed) is
not found. Secrets shorter than :data:`MIN_SECRET` characters are not looked for (they would mask
every word they happen to be part of, and guard nothing).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["MASK", "MIN_SECRET", "SHAPES", "WORKER_TOKEN", "Redactor", "bounded", "env_secrets",
           "mask_spans", "one_line", "option_secrets", "shaped_spans", "url_secrets"]

MASK: Final = "***"
#: The shortest secret looked for.
MIN_SECRET: Final = 4
#: A worker token, ``vca_<16 hex>_<secret>`` (vcasync.server._auth): masked wherever it appears,
#: known or not (a token of another worker, of an earlier run).
WORKER_TOKEN: Final = re.compile(r"vca_[0-9a-f]{16}_[A-Za-z0-9_\-]{8,}")
#: Credentials any text may carry, known to this process or not: a URL's user info
#: (``scheme://user:password@host``: group 1) and a bearer credential (``Bearer <token>``: group 1).
SHAPES: Final = (re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://([^/\s@]+)@"),
                 re.compile(r"\bBearer\s+([A-Za-z0-9._~+/=\-]{8,})"))
#: Environment variables whose values are taken for secrets (``AWS_SECRET_ACCESS_KEY``,
#: ``HF_TOKEN``, ``VCASYNC_JOIN_SECRET``...).
_SECRET_NAME: Final = re.compile(r"SECRET|TOKEN|PASSW|API_?KEY|ACCESS_KEY|CREDENTIAL", re.I)
#: Storage options whose values are taken for secrets (``aws_secret_access_key=``, ``token=``...).
_SECRET_OPTION: Final = re.compile(r"secret|token|passw|key|credential", re.I)


def shaped_spans(text: str) -> list[tuple[int, int]]:
    """Where ``text`` holds a worker token (:data:`WORKER_TOKEN`), a URL's user info or a bearer
    credential (:data:`SHAPES`): secrets found by their shape, whoever's they are."""
    spans = [m.span() for m in WORKER_TOKEN.finditer(text)]
    for shape in SHAPES:
        spans += [m.span(1) for m in shape.finditer(text)]
    return spans


def mask_spans(text: str, spans: Iterable[tuple[int, int]]) -> str:
    """``text`` with each ``[start, end)`` span (they may overlap) replaced by :data:`MASK`."""
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    out, at = [], 0
    for start, end in merged:
        out.append(text[at:start])
        out.append(MASK)
        at = end
    out.append(text[at:])
    return "".join(out)


def one_line(text: object, limit: int, *, escape: bool = False) -> str:
    """``text`` cut to ``limit`` characters as one printable line: each character that is not
    printable (a line break, an escape, a NUL) becomes ``?``, or with ``escape`` its escape
    (``\\n``, ``\\x1b``), so that what a worker or a client sent cannot forge a log line."""
    return "".join(c if c.isprintable() else (repr(c)[1:-1] if escape else "?")
                   for c in str(text)[:limit])


def bounded(text: str, limit: int) -> str:
    """At most ``limit`` characters: a longer text is cut, and ends with ``...``."""
    return text if len(text) <= limit else text[:max(limit - 3, 0)] + "..."


def url_secrets(url: str) -> list[str]:
    """The parts of a storage URL that may be credentials: its user info (``user:password@``) and
    every query value (``?aws_secret_access_key=...``), as written and percent-decoded."""
    try:
        parts = urlsplit(url if "://" in url else "")
        netloc = parts.netloc
        query = parse_qsl(parts.query, keep_blank_values=False)
    except ValueError:
        return []
    found: list[str] = []
    if "@" in netloc:
        user, _, password = netloc.rpartition("@")[0].partition(":")
        found += [user, password, unquote(user), unquote(password)]
    for _, value in query:
        found.append(value)
    return [s for s in found if s]


def option_secrets(options: Mapping[str, Any] | None) -> list[str]:
    """The string values of storage options whose names say they are credentials."""
    return [str(v) for k, v in (options or {}).items()
            if isinstance(v, str) and _SECRET_OPTION.search(str(k))]


def env_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of this process's environment variables whose names say they are secrets."""
    env = os.environ if environ is None else environ
    return [v for k, v in env.items() if _SECRET_NAME.search(k) and len(v) >= 8]


class Redactor:
    """Masks the secrets it was given (and worker tokens) in a text. Never shows them: no repr."""

    __slots__ = ("_secrets",)

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        self._secrets: set[str] = set()
        for s in secrets:
            self.add(s)

    def __repr__(self) -> str:
        return f"Redactor({len(self._secrets)} secrets)"

    def add(self, secret: str | None) -> None:
        """Look for ``secret`` too (None, or one shorter than :data:`MIN_SECRET`: nothing)."""
        if secret and len(secret) >= MIN_SECRET:
            self._secrets.add(secret)

    def __call__(self, text: str) -> str:
        spans = shaped_spans(text)
        for secret in self._secrets:
            at = text.find(secret)
            while at >= 0:
                spans.append((at, at + len(secret)))
                at = text.find(secret, at + 1)
        return mask_spans(text, spans) if spans else text
