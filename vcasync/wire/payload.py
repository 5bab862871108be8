"""The payload API: tensors plus metadata, streamed both ways.

``encode_payload`` yields the chunks of one payload and never builds the whole message;
``aencode_payload`` does the same from async code with the CPU work (checksums, casts, compression)
in a worker thread, a few MiB at a time, so the event loop stays free. ``decode_payload`` consumes an
async stream of chunks (CPU work batched into a worker thread too), ``decode_payload_bytes`` a buffer
already in memory; both return a :class:`Payload` whose tensors the caller owns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Generator, Iterator, Mapping
from typing import Any, Literal, overload

import torch

from .._aio import to_thread_released
from ..tensors import ModelSpec
from .decoder import Chunk, Payload, PayloadDecoder
from .encoder import iter_payload
from .limits import Limits
from .plan import CodecSpec, LinkProfile, resolve_codec

__all__ = ["aencode_payload", "decode_payload", "decode_payload_bytes", "encode_payload"]

#: CPU work handed to a worker thread per hop when encoding or decoding asynchronously.
_BATCH_BYTES = 4 << 20
#: Below this, decoding a batch inline is cheaper than a thread hop.
_INLINE_BYTES = 64 << 10


@overload
def encode_payload(kind: str, meta: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], *,
                   codec: str | CodecSpec = ..., chunk_size: int = ..., link: LinkProfile | None = ...,
                   zero_copy: Literal[False] = ...) -> Iterator[bytes]: ...


@overload
def encode_payload(kind: str, meta: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], *,
                   codec: str | CodecSpec = ..., chunk_size: int = ..., link: LinkProfile | None = ...,
                   zero_copy: Literal[True]) -> Iterator[bytes | memoryview]: ...


def encode_payload(kind: str, meta: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], *,
                   codec: str | CodecSpec = "raw", chunk_size: int = 1 << 20,
                   link: LinkProfile | None = None,
                   zero_copy: bool = False) -> Iterator[bytes] | Iterator[bytes | memoryview]:
    """Chunks (about ``chunk_size`` bytes each) of a payload of ``kind`` with ``meta`` (plain
    msgpack-able data) and named ``tensors`` (any dtype in the allow-list, any layout, CPU or not).

    ``codec`` is a preset name (``"raw"``, ``"zstd"``, ``"zstd-plain"``, ``"auto"``, ``"bf16"``,
    ``"fp16"``, ...) or a :class:`CodecSpec`; ``link`` tells ``auto`` the link's bandwidth.
    ``zero_copy=True`` yields raw tensor blocks as memoryviews into the tensors (leave them alone
    until the iteration ends); the default yields ``bytes`` only. Nothing is encoded before the
    first ``next()``; bad arguments raise ConfigError/TypeError/UnsupportedDtypeError then.
    """
    spec = resolve_codec(codec, link=link)
    if not isinstance(meta, Mapping):
        raise TypeError(f"meta must be a mapping, got {type(meta).__name__}")
    return iter_payload(kind, dict(meta), tensors, spec, chunk_size, zero_copy)


@overload
def aencode_payload(kind: str, meta: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], *,
                    codec: str | CodecSpec = ..., chunk_size: int = ..., link: LinkProfile | None = ...,
                    zero_copy: Literal[False] = ...) -> AsyncIterator[bytes]: ...


@overload
def aencode_payload(kind: str, meta: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], *,
                    codec: str | CodecSpec = ..., chunk_size: int = ..., link: LinkProfile | None = ...,
                    zero_copy: Literal[True]) -> AsyncIterator[bytes | memoryview]: ...


def aencode_payload(kind: str, meta: Mapping[str, Any], tensors: Mapping[str, torch.Tensor],
                    *, codec: str | CodecSpec = "raw", chunk_size: int = 1 << 20,
                    link: LinkProfile | None = None,
                    zero_copy: bool = False) -> AsyncIterator[bytes] | AsyncIterator[bytes | memoryview]:
    """:func:`encode_payload` for async code: the encoding runs in a worker thread, about 4 MiB
    of output per hop, so the event loop only ever hands chunks on.

    ``zero_copy=True`` as in :func:`encode_payload`: raw blocks come as memoryviews of the tensors,
    which must stay unchanged until the consumer is done with every chunk (a storage write that has
    returned, say; not a socket that may still queue them). The default yields ``bytes`` only.
    """
    spec = resolve_codec(codec, link=link)
    if not isinstance(meta, Mapping):
        raise TypeError(f"meta must be a mapping, got {type(meta).__name__}")
    return _athreaded(iter_payload(kind, dict(meta), tensors, spec, chunk_size, zero_copy=zero_copy))


async def _athreaded(gen: Generator[bytes | memoryview, None, None]) -> AsyncIterator[Any]:
    """Drive ``gen`` in worker threads, a batch of about ``_BATCH_BYTES`` per hop."""
    running = False
    try:
        while True:
            running = True
            batch = await to_thread_released(_take, gen, _BATCH_BYTES)
            running = False
            if not batch:
                return
            for chunk in batch:
                yield chunk
    finally:
        if not running:  # a cancelled hop still owns the generator; it is collected after it
            gen.close()


def _take(gen: Iterator[bytes | memoryview], budget: int) -> list[bytes | memoryview]:
    out: list[bytes | memoryview] = []
    size = 0
    for chunk in gen:
        out.append(chunk)
        size += len(chunk)
        if size >= budget:
            break
    return out


async def decode_payload(chunks: AsyncIterable[Chunk], *, limits: Limits | None = None,
                         spec: ModelSpec | None = None, expected_kind: str | None = None,
                         out: Mapping[str, torch.Tensor] | None = None) -> Payload:
    """Decode a payload from an async stream of chunks of any size.

    Only :class:`~vcasync.errors.WireError` subclasses escape for bad bytes, plus
    :class:`~vcasync.errors.SpecMismatchError` when the tensors do not fit ``spec`` or ``out``.
    Tensors are allocated after their header passed the limits and the spec; with ``out`` the
    named buffers are filled in place (their contents are undefined if decoding fails). The
    source's own exceptions (a dropped connection) pass through unchanged. Chunks must not be
    modified after they are yielded.
    """
    dec = PayloadDecoder(limits=limits, spec=spec, expected_kind=expected_kind, out=out)
    batch: list[Chunk] = []
    size = 0
    # One batch decodes in a thread while the next is read: receiving and decoding overlap (the
    # decoder is fed by one thread at a time, at most two batches are held).
    feeding: asyncio.Future[None] | None = None
    try:
        async for chunk in chunks:
            batch.append(chunk)
            size += len(chunk)
            if size >= _BATCH_BYTES:
                if feeding is not None:
                    await feeding
                feeding = asyncio.ensure_future(to_thread_released(dec.feed_many, batch))
                batch, size = [], 0
        if feeding is not None:
            await feeding
            feeding = None
    finally:
        if feeding is not None and not feeding.done():
            # The source failed (or we were cancelled) mid-batch: let the thread finish with
            # the decoder before anyone else touches it; the source's error is what counts.
            await asyncio.wait([feeding])
        if feeding is not None and feeding.done() and not feeding.cancelled():
            feeding.exception()     # retrieved: a decode error behind the source's is not logged
    if size > _INLINE_BYTES:
        await to_thread_released(dec.feed_many, batch)
    else:
        dec.feed_many(batch)
    return dec.finish()


def decode_payload_bytes(data: Chunk, *, limits: Limits | None = None,
                         spec: ModelSpec | None = None, expected_kind: str | None = None,
                         out: Mapping[str, torch.Tensor] | None = None) -> Payload:
    """Decode a payload already in memory (synchronously; same guarantees as
    :func:`decode_payload`)."""
    dec = PayloadDecoder(limits=limits, spec=spec, expected_kind=expected_kind, out=out)
    dec.feed(data)
    return dec.finish()
