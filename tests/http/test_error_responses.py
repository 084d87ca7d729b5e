"""The protocol's errors below the front's handlers: aiohttp's parser errors as JSON
4xx in words of the front's own, and the handler that aiohttp's server makes, retyped."""

import asyncio
import json

import pytest

pytest.importorskip("aiohttp")  # the http extra

from aiohttp import web  # noqa: E402
from aiohttp.http_exceptions import (BadHttpMessage, BadStatusLine, ContentLengthError,
                                     InvalidHeader, InvalidURLError, LineTooLong,
                                     TransferEncodingError)
from aiohttp.web_protocol import RequestHandler

from async_search.http.error_responses import (JsonErrorHandler, adopt,
                                              error_handler_class, error_response,
                                              parser_error, payload_error)

pytestmark = pytest.mark.timeout(30)

MARK = "QZX"  # the request's bytes in each message: never in an answer


# (the exception aiohttp raises, as llhttp or the Python parser words it, on 3.9 to
# 3.14) -> the status it must get. The request's bytes quoted in each carry words that
# would pick another message if they were read: "chunk", "header", "method".
PARSER_ERRORS = [
    (BadHttpMessage(f"Invalid character in chunk size:\n\n  b'{MARK} header'\n ^"), 400,
     "chunk"),
    (BadHttpMessage(f"Invalid header value char:\n\n  b'X-A: {MARK} chunk'\n ^"), 400,
     "header"),
    (BadHttpMessage("Too many headers received"), 431, "headers"),
    (BadHttpMessage(f"Transfer-Encoding can't be present with Content-Length:\n\n  "
                    f"b'{MARK}'"), 400, "both Content-Length and Transfer-Encoding"),
    (BadHttpMessage("Duplicate 'Content-Length' header found."), 400, "more than one"),
    (BadHttpMessage(f"Invalid character in Content-Length:\n\n  b'{MARK}'"), 400,
     "Content-Length"),
    (BadHttpMessage(f"Pause on PRI/Upgrade:\n\n  b'{MARK}'"), 400, "HTTP/2"),
    (BadHttpMessage(f"Invalid method encountered:\n\n  b'{MARK} chunk'"), 400,
     "method"),
    (BadStatusLine(error=f"Bad status line:\n  Expected CRLF after version:\n\n  "
                         f"b'{MARK}'"), 400, "request line"),
    (BadHttpMessage(f"Bad status line:\n  Invalid HTTP version:\n\n  b'{MARK}'"), 400,
     "request line"),
    (BadStatusLine(f"{MARK} /v2 HTTP/1.1 chunk header"), 400, "request line"),
    (BadStatusLine(error="Received HTTPS traffic on an HTTP port"), 400, "TLS"),
    (InvalidHeader(f"{MARK} chunk".encode()), 400, "header"),
    (InvalidHeader("Content-Length"), 400, "Content-Length"),
    (InvalidURLError(f"Invalid char in url path:\n\n  b'/{MARK}'"), 400, "path"),
    (LineTooLong(f"/v2/models/{MARK * 100}".encode(), 8190), 414, "request line"),
    (LineTooLong(bytearray(f"/v2/models/{MARK}".encode()), 8190), 414, "request line"),
    (LineTooLong(f"POST /v2/models/{MARK}".encode(), 8190), 414, "request line"),
    (LineTooLong("Status line is too long", 8190, 9000), 414, "request line"),  # 3.9
    (LineTooLong(f"X-Big: {MARK * 100}".encode(), 8190), 431, "header"),
    (LineTooLong("Header value is too long", 8190, 9000), 431, "header"),  # 3.9
    (TransferEncodingError(f"Not enough data for satisfy transfer length header. "
                           f"{MARK}"), 400, "chunked"),
    (ContentLengthError(f"Not enough data to satisfy content length header. {MARK}"),
     400, "Content-Length"),
]


@pytest.mark.parametrize("error, status, words", PARSER_ERRORS,
                         ids=[type(e).__name__ for e, _, _ in PARSER_ERRORS])
def test_parser_errors_get_a_4xx_in_the_fronts_words(error, status, words):
    got, message = parser_error(error)
    assert got == status
    assert words in message and MARK not in message


def test_a_body_aiohttp_could_not_read_gets_400_saying_why():
    from aiohttp.http_exceptions import ContentEncodingError
    from aiohttp.web_protocol import RequestPayloadError

    wrapped = RequestPayloadError("Can not decode content-encoding: gzip")
    wrapped.__cause__ = ContentEncodingError("Can not decode content-encoding: gzip")
    assert payload_error(wrapped) == (400, payload_error(wrapped)[1])
    assert "Content-Encoding" in payload_error(wrapped)[1]
    assert "chunked" in payload_error(TransferEncodingError("bad chunk"))[1]


def test_error_responses_are_the_protocols_json():
    response = error_response("what went wrong", 431)
    assert response.status == 431 and response.content_type == "application/json"
    assert json.loads(response.body) == {"error": "what went wrong"}


async def test_adopt_retypes_aiohttps_handler_and_nothing_else():
    reports = []
    handler_class = error_handler_class(lambda status, layer: reports.append(
        (status, layer)))
    server = web.Server(lambda request: web.Response())
    handler = server()
    assert type(handler) is RequestHandler
    assert adopt(handler, handler_class)
    assert isinstance(handler, JsonErrorHandler) and isinstance(handler, RequestHandler)
    handler_class.report(400, "http_parser")
    assert reports == [(400, "http_parser")]

    class Other(RequestHandler):  # a handler of another class keeps its own answers
        pass

    other = Other(server, loop=asyncio.get_running_loop())
    assert not adopt(other, handler_class) and type(other) is Other
