"""The protocol's JSON errors below the front's handlers: aiohttp's parser and its own
answers.

aiohttp answers a request that its HTTP parser refuses (10,000 headers, a 20 KB header,
a method of ``GARBAGE``, ``Content-Length: abc``, a chunk size of ``ZZ``, an HTTP/2
preface, ...) before any middleware runs, with a plain-text ``HTTP/1.0 400`` whose body
quotes the request's own bytes; and an ``HTTPException`` raised outside the middleware
(an ``Expect`` header other than ``100-continue``) gets a plain-text body too.
``JsonErrorHandler`` is aiohttp's connection handler (``RequestHandler``) with both
seams overridden, ``handle_error`` (what aiohttp calls to answer a parser error or an
exception that escaped the handlers) and ``finish_response`` (what writes every
response): every error it sends is ``{"error": message}`` with ``application/json``,
a fixed message chosen from the kind of fault, never the request's bytes, and a 4xx
status for the client's faults; each one is reported, with the layer that refused the
request, to the front's metrics.

``adopt`` turns the handler that aiohttp's server made into one (by its class: the
construction stays aiohttp's own, whatever arguments a version passes), so the same
code holds on every aiohttp from 3.9.5 (setup.cfg's floor: 3.9.0 still took folded
headers) to 3.14, with the C parser or the pure-Python one.
"""

from __future__ import annotations

import http
import json
import re
from typing import Any, Callable

from aiohttp import http_exceptions, web
from aiohttp.http_exceptions import (BadStatusLine, ContentEncodingError,
                                     HttpProcessingError, InvalidHeader, LineTooLong,
                                     PayloadEncodingError, TransferEncodingError)
from aiohttp.web_protocol import RequestHandler

# aiohttp 3.10 split BadHttpMethod off BadStatusLine.
_BadHttpMethod = getattr(http_exceptions, "BadHttpMethod", ())


#: The layers that refuse a request, as the ``layer`` label of the error counter.
PARSER_LAYER = "http_parser"      # aiohttp's HTTP parser: the request is not HTTP/1.1
FRONT_LAYER = "front"             # a route, the front's handlers or a limit
CONNECTION_LAYER = "connection"   # refused at the connection cap, before any parsing

#: Called once per error response: (status, layer).
ErrorReport = Callable[[int, str], None]

_JSON = "application/json"
# Messages for a parser error, from the words of aiohttp's own message (llhttp's or
# the pure-Python parser's), read only up to where it starts quoting the request (see
# _own_words): the request's bytes are never matched, nor copied. The first match wins;
# the class of the exception decides when none does.
_PARSER_WORDS = (
    ("https traffic", 400, "this port speaks plain HTTP, not TLS: use http://"),
    ("pri/upgrade", 400, "HTTP/2 is not served here: use HTTP/1.1"),
    ("too many headers", 431, "the request has more headers than the front allows"),
    ("can't be present with content-length", 400,
     "the request has both Content-Length and Transfer-Encoding: send one"),
    ("duplicate", 400, "the request has more than one Content-Length or "
                       "Transfer-Encoding"),
    ("content-length", 400, "Content-Length must be one decimal number of bytes"),
    ("transfer-encoding", 400, "Transfer-Encoding must be 'chunked' alone"),
    ("chunk", 400, "the chunked body is malformed: a chunk size must be hexadecimal "
                   "and each chunk must end with CRLF"),
    ("crlf", 400, "lines must end with CRLF"),
    ("method", 400, "the request line does not start with an HTTP method"),
    ("version", 400, "the request line must end with HTTP/1.0 or HTTP/1.1"),
    ("url", 400, "the request target is not a valid path"),
    ("status line", 400, "the request line is not 'METHOD /path HTTP/1.1'"),
    ("header", 400, "a header is malformed: a name without a colon, a space before "
                    "the colon, a control character or a folded line"),
)
_FRAMING_HEADERS = {"content-length": "Content-Length must be one decimal number of "
                                      "bytes",
                    "transfer-encoding": "Transfer-Encoding must be 'chunked' alone"}
_BAD_REQUEST = "the request is not valid HTTP/1.1"
# Errors that aiohttp or a route raise outside the front's handlers, by status.
_STATUS_MESSAGES = {
    404: "no such route; see /v2 and /v2/models/{name}",
    405: "this route does not take that method",
    417: "the Expect header must be '100-continue' or absent",
}


def error_response(message: str, status: int) -> web.Response:
    """The protocol's error: ``{"error": message}`` as ``application/json``."""
    return web.Response(body=json.dumps({"error": message}).encode(), status=status,
                        content_type=_JSON)


class _ParserError(web.Response):
    """The answer to a request that the HTTP parser refused (counted by its layer)."""


def parser_error(error: BaseException) -> tuple[int, str]:
    """The status and message that answer a request aiohttp's parser refused: 4xx,
    with words of the server's own (never the request's bytes).

    Example:
        >>> from aiohttp.http_exceptions import BadHttpMessage
        >>> parser_error(BadHttpMessage("Invalid character in chunk size: b'ZZ'"))[0]
        400
    """
    if isinstance(error, LineTooLong):
        return _too_long(error)
    if isinstance(error, PayloadEncodingError):  # the body's framing or encoding
        return payload_error(error)
    if isinstance(error, InvalidHeader):  # the pure-Python parser names the header
        name = str(getattr(error, "hdr", "")).lower()
        if name in _FRAMING_HEADERS:
            return 400, _FRAMING_HEADERS[name]
    text = _own_words(str(getattr(error, "message", "") or error))
    for words, status, message in _PARSER_WORDS:
        if words in text:
            return status, message
    if isinstance(error, _BadHttpMethod):
        return 400, "the request line does not start with an HTTP method"
    if isinstance(error, BadStatusLine):
        return 400, "the request line is not 'METHOD /path HTTP/1.1'"
    if isinstance(error, InvalidHeader):
        return 400, "a header is malformed"
    return 400, _BAD_REQUEST


def _own_words(message: str) -> str:
    """aiohttp's words in a parser message, before the quote of the request's bytes:
    its first line, cut where a quote starts (``b'...'``, ``bytearray(b...``,
    ``'GET ...'``)."""
    head = message.split("\n", 1)[0]
    for quote in ("b'", 'b"', "bytearray(", " '", ' "'):
        head = head.split(quote, 1)[0]
    return head.lower()


def _too_long(error: LineTooLong) -> tuple[int, str]:
    """414 for a request line or target over the bound (10 KB model names), else 431;
    told apart by the shape of aiohttp's excerpt (a path, or a method and a path)."""
    excerpt = error.args[0] if error.args else b""
    if isinstance(excerpt, str):
        excerpt = excerpt.encode("latin-1", "replace")
    limit = error.args[1] if len(error.args) > 1 and isinstance(error.args[1], int) \
        else None
    bound = f" of {limit} bytes" if limit is not None else ""
    if re.match(rb"(/|[A-Za-z]+://|[A-Z]+ |Status line)", bytes(excerpt)):  # the last:
        # aiohttp 3.9's words for a long request line
        return 414, f"the request line is longer than the front's bound{bound}"
    return 431, f"a header is longer than the front's bound{bound}"


def payload_error(error: BaseException) -> tuple[int, str]:
    """The status and message for a body that aiohttp could not read: its framing
    (chunks, Content-Length) or its Content-Encoding is broken."""
    cause = error.__cause__ or error
    if isinstance(cause, ContentEncodingError) or "content-encoding" in str(
            error).lower():
        return 400, ("the body could not be decoded with its Content-Encoding (gzip, "
                     "deflate, br): send it plain or encoded whole")
    if isinstance(cause, TransferEncodingError) or "chunk" in str(error).lower():
        return 400, ("the chunked body is malformed: a chunk size must be hexadecimal "
                     "and each chunk must end with CRLF")
    return 400, "the body ended before its Content-Length or its last chunk"


class JsonErrorHandler(RequestHandler):
    """aiohttp's connection handler, whose every error answer is the protocol's JSON.

    Made by ``adopt`` from the handler aiohttp made (a subclass of it per front, that
    carries the front's ``report``).
    """

    __slots__ = ()  # the same layout as RequestHandler, so that adopt can retype one
    report: ErrorReport = staticmethod(lambda status, layer: None)

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """Answer a parser error (or an exception that escaped the handlers) with JSON,
        and close the connection, as aiohttp does."""
        if request.writer.output_size > 0:  # part of an answer is out: nothing to fix
            raise ConnectionError("a response was partly sent; cannot send an error")
        if isinstance(exc, HttpProcessingError):
            self.logger.debug("refused a malformed request from %s: %r",
                              request.remote, exc)
            status, text = parser_error(exc)
            layer = PARSER_LAYER
        else:
            if exc is not None:
                self.log_exception("error handling a request", exc_info=exc)
            layer = FRONT_LAYER
            text = "internal error" if status >= 500 else _status_message(status)
        response = (_ParserError if layer == PARSER_LAYER else web.Response)(
            body=json.dumps({"error": text}).encode(), status=status, content_type=_JSON)
        response.force_close()
        return response

    def finish_response(self, request: web.BaseRequest, resp: Any, start_time):
        """Write ``resp``; an error response that is not the protocol's JSON yet (one
        aiohttp or a route made) is replaced by one first. Every error is reported."""
        if getattr(resp, "status", 0) >= 400:
            if resp.content_type != _JSON:
                resp = _as_json(resp)
            self.report(resp.status, PARSER_LAYER if isinstance(resp, _ParserError)
                        else FRONT_LAYER)
        # A plain call, not an ``await``: the caller awaits aiohttp's own coroutine.
        return RequestHandler.finish_response(self, request, resp, start_time)


def _status_message(status: int) -> str:
    if status in _STATUS_MESSAGES:
        return _STATUS_MESSAGES[status]
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return f"error {status}"


def _as_json(resp: web.StreamResponse) -> web.Response:
    """The JSON error for a non-JSON error response (no copy of its text: it may quote
    the request)."""
    status = resp.status if resp.status < 500 else 500
    answer = error_response(_status_message(status) if status < 500 else
                            "internal error", status)
    for name in ("Allow", "Retry-After"):
        if name in resp.headers:
            answer.headers[name] = resp.headers[name]
    if resp.keep_alive is False:
        answer.force_close()
    return answer


def error_handler_class(report: ErrorReport) -> type:
    """A ``JsonErrorHandler`` subclass whose errors go to ``report``."""
    return type("JsonErrorHandler", (JsonErrorHandler,),
                {"__slots__": (), "report": staticmethod(report)})


def adopt(handler: Any, handler_class: type) -> bool:
    """Retype ``handler`` (the ``RequestHandler`` aiohttp's server made) as
    ``handler_class`` (made by ``error_handler_class``); False, untouched, for a handler
    of another class (a future aiohttp's), which keeps aiohttp's own answers."""
    if type(handler) is not RequestHandler:
        return False
    handler.__class__ = handler_class  # same slots, no state of its own: a safe retype
    return True
