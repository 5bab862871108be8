"""Join credentials and per-worker bearer tokens for the coordinator's HTTP server.

A worker proves it may join with the run's shared **join secret**, or with a **pre-issued join token**
bound to one worker name (revocable one by one). It then receives its own random **worker token**
``vca_<id>_<secret>`` that every other route requires in ``Authorization: Bearer``.

An **operator token** (optional, from ``VCASYNC_OPERATOR_TOKEN`` or ``--operator-token-file``) guards
the operator routes, such as requeueing parked units. It is deliberately not the join secret, which
every volunteer holds; without one configured, operator routes answer ``403 operator_disabled``.

Only SHA-256 digests are kept (in memory, and in an optional :class:`TokenStore` so tokens survive a
coordinator restart); comparisons use :func:`hmac.compare_digest`. Nothing here logs or ``repr``\\ s a
secret, and :meth:`TokenAuthority.scrub` takes them out of a worker's failure text by their
digests. Worker secrets carry 256 random bits, so a plain hash is enough; a slow KDF would only
matter for low-entropy passwords, which the join secret is compared against but never stored as.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Final, Protocol

from .._aio import run_all
from .._redact import mask_spans, shaped_spans
from ..errors import AuthError, ConfigError, ObjectNotFoundError, OperatorDisabledError
from ..storage import Storage

__all__ = ["MIN_SECRET_LENGTH", "JoinIdentity", "StorageTokenStore", "TokenAuthority", "TokenRecord",
           "TokenStore", "check_join_tokens",
           "check_length"]

#: The fewest characters a join secret, a join token or the operator token may have.
MIN_SECRET_LENGTH: Final = 16
_PREFIX = "vca_"
_ID_HEX = 16


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


def check_length(secret: str, what: str) -> None:
    """A :class:`ConfigError` naming ``what`` (never the secret) when ``secret`` is shorter than
    :data:`MIN_SECRET_LENGTH`."""
    if len(secret) < MIN_SECRET_LENGTH:
        raise ConfigError(f"{what} is too short: use at least {MIN_SECRET_LENGTH} characters "
                          "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")


def check_join_tokens(join_tokens: Mapping[str, str], join_secret: str | None) -> None:
    """A :class:`ConfigError` naming the worker (never the token) when a pre-issued join token is
    shorter than :data:`MIN_SECRET_LENGTH`, or is the join secret itself: such a token could not be
    revoked alone (the secret would still let its holder in) and would say nothing of who joined."""
    for name, token in join_tokens.items():
        check_length(token, f"the join token of {name!r}")
        if join_secret is not None and hmac.compare_digest(_digest(token), _digest(join_secret)):
            raise ConfigError(f"the join token of {name!r} is the join secret: give each worker name "
                              "its own token (revoking it must not lock out every worker)")


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """What is kept about one issued worker token: never the token itself."""

    worker_id: str
    digest_hex: str
    issued_at: float
    revoked: bool = False
    #: The name the worker joined with (records from before 2026-12-07 have none): a coordinator
    #: restarted after a crash lists the workers that joined since its last snapshot by it.
    name: str = ""
    #: The name of the pre-issued join token the worker joined with ("": the join secret; records
    #: from before 2026-12-07 have none): the token is refused once that join token is no longer
    #: configured, so revoking a join token revokes the machine, not only its next join.
    join_token: str = ""


@dataclass(frozen=True, slots=True)
class JoinIdentity:
    """Who a join credential says the caller is: ``name`` is set for pre-issued join tokens."""

    name: str | None


class TokenStore(Protocol):
    """Where token records live between coordinator restarts."""

    async def load(self) -> dict[str, TokenRecord]: ...

    async def save(self, token_id: str, record: TokenRecord) -> None: ...


class StorageTokenStore:
    """Token records as small JSON objects under ``prefix`` on a :class:`Storage` (digests only)."""

    LOAD_PARALLEL = 32

    def __init__(self, storage: Storage, prefix: str = "auth/tokens/") -> None:
        self._storage = storage
        self._prefix = prefix

    async def load(self) -> dict[str, TokenRecord]:
        """Every record, read ``LOAD_PARALLEL`` at a time: a long run on spot machines holds one
        a join (each restarted machine joins anew), and read one after another from an object
        store they held a restarted coordinator for minutes (10,000 at ~20 ms a GET: 200 s)."""
        out: dict[str, TokenRecord] = {}
        gate = asyncio.Semaphore(self.LOAD_PARALLEL)

        async def read(key: str) -> None:
            async with gate:
                try:
                    data = await self._storage.get(key)
                except ObjectNotFoundError:       # revoked and removed meanwhile
                    return
            try:
                raw = json.loads(data)
                out[key[len(self._prefix):].removesuffix(".json")] = TokenRecord(
                    worker_id=str(raw["worker_id"]), digest_hex=str(raw["digest_hex"]),
                    issued_at=float(raw["issued_at"]), revoked=bool(raw.get("revoked", False)),
                    name=str(raw.get("name", "")), join_token=str(raw.get("join_token", "")))
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"token record {key!r} is corrupt: {exc}") from exc

        await run_all(read(key) for key in [k async for k in self._storage.list(self._prefix)])
        return out

    async def save(self, token_id: str, record: TokenRecord) -> None:
        await self._storage.put(f"{self._prefix}{token_id}.json", json.dumps(asdict(record)).encode())


class TokenAuthority:
    """Checks join credentials, issues worker tokens, verifies and revokes them.

    ``verify`` is synchronous and allocation-light: it runs on every request.
    """

    def __init__(self, *, join_secret: str | None = None, join_tokens: Mapping[str, str] | None = None,
                 store: TokenStore | None = None, clock: Callable[[], float] = time.time,
                 operator_token: str | None = None) -> None:
        if not join_secret and not join_tokens:
            raise ConfigError("no join credential configured: set a join secret (VCASYNC_JOIN_SECRET) "
                              "or pre-issued join tokens")
        if join_secret is not None:
            check_length(join_secret, "the join secret")
        check_join_tokens(join_tokens or {}, join_secret)
        if operator_token is not None:
            check_length(operator_token, "the operator token")
        if operator_token is not None and operator_token in (join_secret, *(join_tokens or {}).values()):
            raise ConfigError("the operator token must differ from the join secret and join tokens: "
                              "every worker holds those")
        self._operator_digest = _digest(operator_token) if operator_token else None
        self._secret_digest = _digest(join_secret) if join_secret else None
        self._join_tokens: dict[str, bytes] = {
            name: _digest(tok) for name, tok in (join_tokens or {}).items()}
        #: What :meth:`scrub` looks for, by digest and length (revoked join tokens included).
        known = [c for c in (join_secret, operator_token, *(join_tokens or {}).values()) if c]
        self._scrub_digests = frozenset(_digest(c) for c in known)
        self._scrub_lengths = tuple(sorted({len(c) for c in known}))
        self._store = store
        self._records: dict[str, TokenRecord] = {}
        self._clock = clock

    def __repr__(self) -> str:
        return (f"TokenAuthority(join_secret={'set' if self._secret_digest else 'unset'}, "
                f"join_tokens={len(self._join_tokens)}, worker_tokens={len(self._records)}, "
                f"operator_token={'set' if self._operator_digest else 'unset'})")

    async def load(self) -> None:
        """Read the records a previous run of the coordinator issued (when a store is configured)."""
        if self._store is not None:
            self._records.update(await self._store.load())

    # -- joining ---------------------------------------------------------------------------------
    def check_join(self, credential: str) -> JoinIdentity:
        """The identity ``credential`` proves, or :class:`AuthError`. Constant time per candidate."""
        got = _digest(credential)
        ok_secret = self._secret_digest is not None and hmac.compare_digest(got, self._secret_digest)
        matched: str | None = None
        for name, digest in self._join_tokens.items():  # no early exit: timing does not reveal which
            if hmac.compare_digest(got, digest):
                matched = name
        if matched is not None:
            return JoinIdentity(name=matched)
        if ok_secret:
            return JoinIdentity(name=None)
        raise AuthError("join refused: the join secret or join token is wrong")

    def scrub(self, text: str) -> str:
        """``text`` (a worker's failure, before it is logged, stored or shown) with the join
        secret, every join token and the operator token masked, found by their digests (no plain
        copy is kept: each window of a secret's length is hashed), and anything shaped like a
        credential masked too: a worker token, a URL's user info, a bearer token (see
        :mod:`vcasync._redact`)."""
        spans = shaped_spans(text)
        for length in self._scrub_lengths:
            spans += [(i, i + length) for i in range(len(text) - length + 1)
                      if _digest(text[i:i + length]) in self._scrub_digests]
        return mask_spans(text, spans) if spans else text

    # -- operators -------------------------------------------------------------------------------
    def check_operator(self, credential: str) -> None:
        """Pass when ``credential`` is the operator token; :class:`OperatorDisabledError` when none is
        configured, :class:`AuthError` otherwise (a worker token or the join secret never passes)."""
        if self._operator_digest is None:
            raise OperatorDisabledError("operator actions are disabled on this coordinator: start it "
                                        "with VCASYNC_OPERATOR_TOKEN or --operator-token-file")
        if not hmac.compare_digest(_digest(credential), self._operator_digest):
            raise AuthError("operator credential refused: send the operator token")

    def revoke_join_token(self, name: str) -> bool:
        """Stop accepting the pre-issued join token of ``name``, and the worker tokens issued to
        whoever joined with it; True when there was one."""
        return self._join_tokens.pop(name, None) is not None

    # -- worker tokens ---------------------------------------------------------------------------
    async def issue(self, worker_id: str, name: str = "", *, join_token: str = "") -> str:
        """A new bearer token for ``worker_id`` (who joined as ``name``, with the pre-issued join
        token of that name ``join_token``, "" for the join secret); only its digest is kept. A token
        issued under a join token is refused once that join token is revoked (or left out of the
        coordinator's join tokens at a restart)."""
        token_id = secrets.token_hex(_ID_HEX // 2)
        secret = secrets.token_urlsafe(32)
        record = TokenRecord(worker_id=worker_id, digest_hex=_digest(secret).hex(), issued_at=self._clock(),
                             name=name, join_token=join_token)
        if self._store is not None:
            await self._store.save(token_id, record)
        self._records[token_id] = record
        return f"{_PREFIX}{token_id}_{secret}"

    def verify(self, token: str) -> str:
        """The worker id ``token`` belongs to, or :class:`AuthError` (malformed, unknown, revoked)."""
        if not token.startswith(_PREFIX) or len(token) < len(_PREFIX) + _ID_HEX + 2:
            raise AuthError("malformed worker token")
        token_id = token[len(_PREFIX):len(_PREFIX) + _ID_HEX]
        secret = token[len(_PREFIX) + _ID_HEX + 1:]
        record = self._records.get(token_id)
        got = _digest(secret)
        want = bytes.fromhex(record.digest_hex) if record is not None else bytes(32)
        if not hmac.compare_digest(got, want) or record is None:
            raise AuthError("unknown worker token: join again")
        if record.revoked:
            raise AuthError("this worker token was revoked")
        if not self._live(record):
            raise AuthError("this worker token was revoked with the join token it joined with")
        return record.worker_id

    def _live(self, record: TokenRecord) -> bool:
        """Not revoked, and the join token it joined with (if any) still accepted."""
        return not record.revoked and (not record.join_token or record.join_token in self._join_tokens)

    async def revoke(self, worker_id: str) -> int:
        """Revoke every token of ``worker_id``; returns how many were live."""
        count = 0
        for token_id, record in list(self._records.items()):
            if record.worker_id == worker_id and not record.revoked:
                revoked = replace(record, revoked=True)
                if self._store is not None:
                    await self._store.save(token_id, revoked)
                self._records[token_id] = revoked
                count += 1
        return count

    def joined(self) -> list[tuple[str, str, float]]:
        """``(worker id, name, seconds since it joined)`` of each worker holding a live token, by
        its latest: whom a restarted coordinator can list though its snapshot predates them."""
        latest: dict[str, TokenRecord] = {}
        for r in self._records.values():
            if self._live(r) and (r.worker_id not in latest or r.issued_at > latest[r.worker_id].issued_at):
                latest[r.worker_id] = r
        now = self._clock()
        return [(r.worker_id, r.name, max(now - r.issued_at, 0.0)) for r in latest.values()]

    def live_tokens(self) -> int:
        return sum(1 for r in self._records.values() if self._live(r))
