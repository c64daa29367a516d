"""The incremental chunked-coding decoder: any split of a body gives its data; a broken body raises."""

from __future__ import annotations

import pytest

from workers.sglang_client.chunked import MAX_LINE, ChunkedBody, ChunkedError

PIECES = [b"data: {}\n\n", b"x" * 300, b"\r\n inside \r\n", b"last"]
BODY = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in PIECES) + b"0\r\n\r\n"


def decode(*parts: bytes) -> tuple[bytes, bool]:
    body = ChunkedBody()
    data = b"".join(piece for part in parts for piece in body.feed(part))
    return data, body.ended


def test_a_body_fed_whole_gives_its_data_and_ends() -> None:
    assert decode(BODY) == (b"".join(PIECES), True)


def test_every_split_of_a_body_gives_the_same_data() -> None:
    for cut in range(len(BODY) + 1):
        assert decode(BODY[:cut], BODY[cut:]) == (b"".join(PIECES), True), cut
    assert decode(*(BODY[i : i + 1] for i in range(len(BODY)))) == (b"".join(PIECES), True)


def test_a_body_not_yet_ended_is_not_ended() -> None:
    data, ended = decode(BODY[:-5])
    assert data == b"".join(PIECES) and not ended


def test_extensions_trailers_and_upper_case_sizes_are_read() -> None:
    body = b"A;name=value\r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\n"
    assert decode(body) == (b"0123456789", True)


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\nab\r\n",  # not hex
        b"\r\nab\r\n",  # no size
        b"-2\r\nab\r\n",  # not a size
        b"2\r\nabXY",  # data not followed by CRLF
        b"0\r\n\r\nmore",  # bytes after the end
    ],
)
def test_a_broken_body_raises(body: bytes) -> None:
    with pytest.raises(ChunkedError):
        decode(body)


def test_a_size_line_past_the_limit_raises() -> None:
    with pytest.raises(ChunkedError, match="longer than"):
        decode(b"1" * (MAX_LINE + 1))


def test_bytes_fed_after_the_end_raise() -> None:
    body = ChunkedBody()
    body.feed(b"0\r\n\r\n")
    assert body.ended and body.feed(b"") == []
    with pytest.raises(ChunkedError, match="after the body's end"):
        body.feed(b"x")
