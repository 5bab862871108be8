"""The ``aiohttp.access`` log line of each request, without its query string.

No route of the coordinator reads a query string, so what one holds is something a client put
there by mistake: a status read token typed as ``/status/?token=...`` instead of the page's
``#token=...`` (which never leaves the browser), a worker token a script added to a URL. aiohttp's
own :class:`~aiohttp.web_log.AccessLogger` writes the request line as sent, query and all, at INFO;
:class:`AccessLog` writes the same line (same format, same ``extra`` fields for structured
handlers) with every query masked (``/status/?***``), and the ``Referer`` header cut the same way
(its user info masked too: :mod:`vcasync._redact`).
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp.web_log import AccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from .._redact import MASK, mask_spans, shaped_spans

__all__ = ["AccessLog", "without_query"]

#: The fields of aiohttp's line that may carry a URL's query: the request line (``%r``) and the
#: ``Referer`` header (``%{Referer}i``).
_REQUEST_LINE = "first_request_line"
_REFERER = ("request_header", "Referer")


def without_query(target: str) -> str:
    """``target`` (a path or a URL) with its query masked (``/p?***``) and its fragment dropped."""
    head, _, _ = target.partition("#")
    path, sep, query = head.partition("?")
    return f"{path}?{MASK}" if sep and query else path


def _request_line(line: str) -> str:
    """``METHOD TARGET HTTP/x.y`` with the target's query masked."""
    method, _, rest = line.partition(" ")
    target, _, version = rest.rpartition(" ")
    if "?" not in target:
        return line
    return f"{method} {without_query(target)} {version}"


def _referer(value: str) -> str:
    cut = without_query(value)
    spans = shaped_spans(cut)
    return mask_spans(cut, spans) if spans else cut


class AccessLog(AccessLogger):
    """aiohttp's access log line with query strings masked (see the module docstring)."""

    def _format_line(self, request: BaseRequest, response: StreamResponse,
                     time: float) -> Iterable[tuple[str | tuple[str, str], str]]:
        out = []
        for key, value in super()._format_line(request, response, time):
            if key == _REQUEST_LINE and isinstance(value, str):
                value = _request_line(value)
            elif key == _REFERER and isinstance(value, str):
                value = _referer(value)
            out.append((key, value))
        return out
