"""Signed lease ids: ``{unit index:x}.{base version:x}.{nonce}.{mac}``.

The MAC (keyed BLAKE2b) binds the unit's index *and id* and the base version to a secret the
coordinator keeps on its storage. After a restart, a lease granted after the last snapshot is unknown
to the restored ledger; its signature proves it was really granted for that unit, so the ledger can
adopt it instead of throwing the worker's progress away. Lease ids are URL-safe (hex and dots).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Callable

__all__ = ["LeaseIdSigner"]

_FORMAT = re.compile(r"^([0-9a-f]{1,12})\.([0-9a-f]{1,16})\.([0-9a-f]{16})\.([0-9a-f]{20})$")


class LeaseIdSigner:
    """Makes and checks signed lease ids."""

    __slots__ = ("_key",)

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("a lease-id secret needs at least 16 bytes")
        self._key = hashlib.blake2b(secret, digest_size=32).digest()

    def _mac(self, index: int, unit_id: str, base_version: int, nonce: str) -> str:
        msg = f"{index}|{base_version}|{nonce}|{unit_id}".encode()
        return hashlib.blake2b(msg, key=self._key, digest_size=10).hexdigest()

    def make(self, index: int, unit_id: str, base_version: int) -> str:
        nonce = secrets.token_hex(8)
        mac = self._mac(index, unit_id, base_version, nonce)
        return f"{index:x}.{base_version:x}.{nonce}.{mac}"

    def parse(self, lease_id: str,
              unit_id_of: Callable[[int], str | None]) -> tuple[int, int] | None:
        """``(unit index, base version)`` when ``lease_id`` is well formed and genuinely ours."""
        m = _FORMAT.match(lease_id) if isinstance(lease_id, str) else None
        if m is None:
            return None
        index, base_version = int(m[1], 16), int(m[2], 16)
        unit_id = unit_id_of(index)
        if unit_id is None:
            return None
        if not hmac.compare_digest(self._mac(index, unit_id, base_version, m[3]), m[4]):
            return None
        return index, base_version
