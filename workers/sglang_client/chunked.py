"""HTTP/1.1 chunked transfer coding, decoded incrementally: :class:`ChunkedBody`.

A streamed answer's body arrives as ``<hex size>[;extensions]\\r\\n<data>\\r\\n`` pieces ending
with a zero-size chunk, optional trailer lines and a blank line (RFC 9112, section 7.1). The
decoder takes whatever bytes the socket gave (any split, even inside a size line) and returns the
chunks' data it completed; a body that breaks the coding raises :class:`ChunkedError`.
"""

from __future__ import annotations

_CRLF = b"\r\n"
#: The longest size or trailer line accepted (a size line is a few bytes; extensions are rare).
MAX_LINE = 64 * 1024
_HEX = frozenset(b"0123456789abcdefABCDEF")


class ChunkedError(ValueError):
    """The body breaks the chunked coding (a bad size line, data without its CRLF, ...)."""


class ChunkedBody:
    """One chunked body: :meth:`feed` it the bytes read; :attr:`ended` once its last chunk and
    trailers were read (bytes after that belong to no one and are an error)."""

    __slots__ = ("_buf", "_need", "_state", "ended")

    def __init__(self) -> None:
        self._buf = b""
        self._need = 0  # data bytes still due in the current chunk
        self._state = "size"  # size | data | crlf | trailer
        self.ended = False

    def feed(self, data: bytes) -> list[bytes]:
        """The chunks' data completed by ``data`` (possibly several, possibly none)."""
        if self.ended:
            if data:
                raise ChunkedError(f"{len(data)} bytes after the body's end")
            return []
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        pos = 0
        while pos < len(buf) and not self.ended:
            if self._state == "data":
                take = min(self._need, len(buf) - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self._need -= take
                if self._need == 0:
                    self._state = "crlf"
                continue
            if self._state == "crlf":
                if len(buf) - pos < 2:
                    break
                if buf[pos : pos + 2] != _CRLF:
                    raise ChunkedError("a chunk's data is not followed by CRLF")
                pos += 2
                self._state = "size"
                continue
            end = buf.find(_CRLF, pos)
            if end < 0:
                if len(buf) - pos > MAX_LINE:
                    raise ChunkedError(f"a line longer than {MAX_LINE} bytes")
                break
            line = buf[pos:end]
            pos = end + 2
            if self._state == "size":
                self._size_line(line)
            elif not line:  # the blank line after the trailers
                self.ended = True
        if self.ended and pos < len(buf):
            raise ChunkedError(f"{len(buf) - pos} bytes after the body's end")
        self._buf = buf[pos:]
        return [piece for piece in out if piece]

    def _size_line(self, line: bytes) -> None:
        size = line.split(b";", 1)[0].strip(b" \t")
        if not size or not _HEX.issuperset(size):
            raise ChunkedError(f"a bad chunk size line ({len(line)} bytes)")
        self._need = int(size, 16)
        self._state = "data" if self._need else "trailer"
