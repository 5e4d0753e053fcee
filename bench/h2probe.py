"""A raw HTTP/2 client for hostile probes: what a peer that never authenticates can make a gRPC server hold.

gRPC's own client cannot misbehave on purpose (declare a 4 MB message and send it a byte at a time,
open a connection and never call), so this speaks the frames itself: the preface, SETTINGS, HEADERS
(HPACK literals, no Huffman, no table), DATA, WINDOW_UPDATE, PING acks. Plaintext only. Used by
bench/hostile.py and tests/e2e/controller/test_controller_unauthenticated.py.
"""

from __future__ import annotations

import selectors
import socket
import struct
import time
from dataclasses import dataclass, field

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
SETTINGS_INITIAL_WINDOW_SIZE = 4
DEFAULT_WINDOW = 65535


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _int(value: int, prefix: int) -> bytes:
    """HPACK integer with a `prefix`-bit prefix (RFC 7541 5.1), first byte's high bits zero."""
    limit = (1 << prefix) - 1
    if value < limit:
        return bytes([value])
    out = bytearray([limit])
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def hpack(headers: list[tuple[str, str]]) -> bytes:
    """Literal header fields without indexing, new names (RFC 7541 6.2.2): no state to keep."""
    out = bytearray()
    for name, value in headers:
        n, v = name.encode(), value.encode()
        out += b"\x00" + _int(len(n), 7) + n + _int(len(v), 7) + v
    return bytes(out)


@dataclass
class Stream:
    sid: int
    to_send: int  # bytes of the declared message not yet sent
    window: int
    closed: bool = False  # the server answered (HEADERS with END_STREAM) or reset it
    answer: bytes = b""


@dataclass
class RawConnection:
    """One TCP connection speaking HTTP/2 by hand; `pump()` reads what arrived and sends what the windows allow."""

    sock: socket.socket
    authority: str
    window: int = DEFAULT_WINDOW  # connection send window
    stream_window: int = DEFAULT_WINDOW  # the server's SETTINGS_INITIAL_WINDOW_SIZE
    streams: dict[int, Stream] = field(default_factory=dict)
    next_sid: int = 1
    closed: bool = False
    goaway: bytes = b""
    sent_data: int = 0
    _buf: bytearray = field(default_factory=bytearray)

    @classmethod
    def open(cls, host: str, port: int, source: str | None = None, timeout: float = 10.0) -> RawConnection:
        sock = socket.create_connection((host, port), timeout=timeout,
                                        source_address=(source, 0) if source else None)
        sock.setblocking(False)
        conn = cls(sock, f"{host}:{port}")
        conn._send(PREFACE + frame(SETTINGS, 0, 0))
        return conn

    def _send(self, data: bytes) -> None:
        if self.closed:
            return
        self.sock.setblocking(True)
        try:
            self.sock.sendall(data)
        except OSError:
            self.closed = True
        finally:
            self.sock.setblocking(False)

    def call(self, path: str, declared: int, metadata: list[tuple[str, str]] = ()) -> Stream:  # type: ignore[assignment]
        """HEADERS for a gRPC call and the 5-byte message prefix declaring `declared` bytes; no END_STREAM."""
        sid = self.next_sid
        self.next_sid += 2
        headers = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", self.authority),
                   ("content-type", "application/grpc"), ("te", "trailers"), *metadata]
        self._send(frame(HEADERS, END_HEADERS, sid, hpack(headers)))
        stream = self.streams[sid] = Stream(sid, declared, self.stream_window)
        self._data(stream, b"\x00" + struct.pack(">I", declared))
        return stream

    def _data(self, stream: Stream, payload: bytes, end: bool = False) -> None:
        self._send(frame(DATA, END_STREAM if end else 0, stream.sid, payload))
        self.window -= len(payload)
        stream.window -= len(payload)
        self.sent_data += len(payload)

    def fill(self, chunk: int = 16384) -> None:
        """Send as much of every open stream's declared message as the windows allow."""
        for stream in self.streams.values():
            while not stream.closed and stream.to_send > 0 and not self.closed:
                n = min(chunk, stream.to_send, self.window, stream.window)
                if n <= 0:
                    break
                self._data(stream, b"\x00" * n)
                stream.to_send -= n

    def trickle(self, n: int = 1) -> None:
        """One more byte (or `n`) on every open stream, whatever the windows say (they allow it here)."""
        for stream in self.streams.values():
            if not stream.closed and stream.to_send > 0 and self.window > 0 and stream.window > 0:
                k = min(n, stream.to_send, self.window, stream.window)
                self._data(stream, b"\x00" * k)
                stream.to_send -= k

    def pump(self) -> None:
        """Read whatever arrived: settings (acked), window updates, pings (acked), answers, GOAWAY, EOF."""
        while not self.closed:
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.closed = True
                break
            if not data:
                self.closed = True
                break
            self._buf += data
        while len(self._buf) >= 9:
            length = int.from_bytes(self._buf[:3], "big")
            if len(self._buf) < 9 + length:
                break
            kind, flags = self._buf[3], self._buf[4]
            sid = int.from_bytes(self._buf[5:9], "big") & 0x7FFFFFFF
            payload = bytes(self._buf[9:9 + length])
            del self._buf[:9 + length]
            self._frame(kind, flags, sid, payload)

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        stream = self.streams.get(sid)
        if kind == SETTINGS and not flags & ACK:
            for i in range(0, len(payload) - 5, 6):
                key, value = struct.unpack(">HI", payload[i:i + 6])
                if key == SETTINGS_INITIAL_WINDOW_SIZE:
                    delta = value - self.stream_window
                    self.stream_window = value
                    for s in self.streams.values():
                        s.window += delta
            self._send(frame(SETTINGS, ACK, 0))
        elif kind == WINDOW_UPDATE:
            inc = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            if sid == 0:
                self.window += inc
            elif stream is not None:
                stream.window += inc
        elif kind == PING and not flags & ACK:
            self._send(frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            self.goaway = payload[8:]
        elif kind in (HEADERS, RST_STREAM) and stream is not None:
            stream.answer += payload
            if kind == RST_STREAM or flags & END_STREAM:
                stream.closed = True

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


def pump_all(conns: list[RawConnection], seconds: float) -> None:
    """Read from every connection for `seconds` (acking settings and pings so none is closed for that)."""
    sel = selectors.DefaultSelector()
    for c in conns:
        if not c.closed:
            sel.register(c.sock, selectors.EVENT_READ, c)
    end = time.monotonic() + seconds
    try:
        while (left := end - time.monotonic()) > 0:
            for key, _ in sel.select(min(left, 0.2)):
                conn: RawConnection = key.data
                conn.pump()
                if conn.closed:
                    sel.unregister(conn.sock)
    finally:
        sel.close()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def hwm_bytes(pid: int) -> int:
    """The peak RSS (VmHWM) of `pid`."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0
