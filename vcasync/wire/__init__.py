"""The tensor wire: msgpack control messages and streamed tensor payloads (raw or zstd).

- :func:`encode_payload` / :func:`aencode_payload` / :func:`decode_payload` /
  :func:`decode_payload_bytes` and :class:`PayloadDecoder`: named tensors plus metadata, streamed
  frame by frame, every declared size checked against :class:`Limits` before anything is allocated.
- :func:`encode_message` / :func:`decode_message`: small msgpack control messages.
- :func:`pack_tree` / :func:`unpack_tree`: nested plain data with tensors (policy state), bit-exact;
  :func:`check_tree`: whether ``pack_tree`` could pack it, without packing.
- :class:`CodecSpec`, :class:`LinkProfile`, :func:`register_codec`: how tensors are encoded
  (``raw``, ``zstd`` with byte-plane shuffle, opt-in lossy ``bf16``/``fp16``, per-link ``auto``).

The layout is in :mod:`vcasync.wire.frames`. Only :class:`~vcasync.errors.WireError` subclasses
escape a decoder (plus :class:`~vcasync.errors.SpecMismatchError` against a spec).
"""

from __future__ import annotations

from .codecs import BlockCodec, block_codec_names, register_block_codec
from .decoder import Payload, PayloadDecoder
from .dtypes import ALL_DTYPE_NAMES
from .frames import PROTOCOL_VERSION, checksum
from .limits import Limits
from .messages import Message, decode_message, encode_message
from .payload import aencode_payload, decode_payload, decode_payload_bytes, encode_payload
from .plan import CodecSpec, LinkProfile, codec_names, lossy_bound, register_codec, resolve_codec
from .tree import check_tree, pack_tree, unpack_tree

__all__ = [
    "ALL_DTYPE_NAMES",
    "PROTOCOL_VERSION",
    "BlockCodec",
    "CodecSpec",
    "Limits",
    "LinkProfile",
    "Message",
    "Payload",
    "PayloadDecoder",
    "aencode_payload",
    "block_codec_names",
    "check_tree",
    "checksum",
    "codec_names",
    "decode_message",
    "decode_payload",
    "decode_payload_bytes",
    "encode_message",
    "encode_payload",
    "lossy_bound",
    "pack_tree",
    "register_block_codec",
    "register_codec",
    "resolve_codec",
    "unpack_tree",
]
