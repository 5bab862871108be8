"""Size limits every decoder checks *before* it allocates or decompresses anything.

A hostile peer controls every number in a message. :class:`Limits` bounds each of them; the decoders
compare a declared size with its limit first and raise :class:`~vcasync.errors.LimitExceededError`
naming the field, the value and the limit, so a 100-byte message can never make us allocate 1 TB.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import cast

from ..errors import ConfigError, LimitExceededError
from .dtypes import ALL_DTYPE_NAMES

__all__ = ["DEFAULT_LIMITS", "Limits", "check_limit"]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class Limits:
    """Upper bounds on what one decoded message may declare. The defaults suit models of a few GiB.

    ``max_message_bytes`` counts bytes on the wire; ``max_decoded_bytes`` the sum of decoded tensor
    bytes (compression makes the two differ); ``max_tensor_bytes`` / ``max_elements`` / ``max_dims``
    bound one tensor; ``max_block_bytes`` one compressed or raw block (the unit of decompression);
    ``max_header_bytes`` one msgpack frame header; ``max_meta_bytes`` the msgpack metadata of a
    payload or a control message; ``max_depth`` / ``max_items`` the nesting and container sizes of
    that metadata; ``allowed_dtypes`` and ``allowed_codecs`` are allow-lists by wire name.
    """

    max_message_bytes: int = 4 * GiB
    max_decoded_bytes: int = 4 * GiB
    max_tensor_bytes: int = 2 * GiB
    max_elements: int = 1 << 31
    max_dims: int = 16
    max_tensors: int = 100_000
    max_name_bytes: int = 1024
    max_meta_bytes: int = 1 * MiB
    max_header_bytes: int = 64 * KiB
    max_block_bytes: int = 64 * MiB
    max_depth: int = 32
    max_items: int = 100_000
    allowed_dtypes: frozenset[str] = field(default_factory=lambda: ALL_DTYPE_NAMES)
    allowed_codecs: frozenset[str] = frozenset({"raw", "zstd"})

    def __post_init__(self) -> None:
        for name in ("max_message_bytes", "max_decoded_bytes", "max_tensor_bytes", "max_elements",
                     "max_dims", "max_tensors", "max_name_bytes", "max_meta_bytes",
                     "max_header_bytes", "max_block_bytes", "max_depth", "max_items"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"Limits.{name} must be a non-negative int, got {value!r}")
        unknown = set(self.allowed_dtypes) - ALL_DTYPE_NAMES
        if unknown:
            raise ConfigError(f"Limits.allowed_dtypes has unknown dtypes {sorted(unknown)}; "
                              f"known: {sorted(ALL_DTYPE_NAMES)}")
        if not isinstance(cast(object, self.allowed_dtypes), frozenset):
            object.__setattr__(self, "allowed_dtypes", frozenset(self.allowed_dtypes))
        if not isinstance(cast(object, self.allowed_codecs), frozenset):
            object.__setattr__(self, "allowed_codecs", frozenset(self.allowed_codecs))


    def for_stored_state(self, nbytes: int) -> Limits:
        """These limits, for reading back state a coordinator wrote itself (a snapshot's ledger or
        policy state) that is ``nbytes`` long and already in memory.

        A ledger's metadata grows with the run (about 300 bytes a unit with its lease), so the
        bounds meant for one network message (``max_meta_bytes``, ``max_header_bytes``,
        ``max_items``) would refuse the snapshot of any run past a few thousand units. Here they
        may reach ``nbytes``: a frame cannot declare more header than the bytes in hand, nor a
        msgpack container more items than bytes. Depth, tensor, dtype and codec bounds stay.
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ConfigError(f"nbytes must be a non-negative int, got {nbytes!r}")
        return replace(self, max_meta_bytes=max(self.max_meta_bytes, nbytes),
                       max_header_bytes=max(self.max_header_bytes, nbytes),
                       max_items=max(self.max_items, nbytes))


#: The default limits, built once (frozen): what a parser uses when it is given none.
DEFAULT_LIMITS = Limits()


def check_limit(field_name: str, value: int, limit: int, *, what: str = "") -> None:
    """Raise :class:`LimitExceededError` when ``value > limit``; the message names both."""
    if value > limit:
        detail = f" ({what})" if what else ""
        raise LimitExceededError(
            f"{field_name} = {value} exceeds the limit {limit}{detail}",
            field=field_name, limit=limit, value=value)
