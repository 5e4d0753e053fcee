"""The established connections to one local port, asked of the kernel over netlink (sock_diag).

The connection watch (connections.py) needs, once a second, every established connection to the
listening port with its socket inode and client address. `/proc/net/tcp{,6}` lists every socket of the
host as text: the kernel formats ~150 bytes per socket and Python splits every line, including the
clients' own ends and every other program's sockets. At 10,000 jobs on one host that was 9 % of the
controller's samples. `SOCK_DIAG_BY_FAMILY` with a bytecode filter on the local port returns only the
server's own connections, 72 bytes each, parsed with `struct` (the `ss` tool asks the same way).
`established()` returns None where netlink is not available (not Linux, a sandbox without
NETLINK_SOCK_DIAG, a filter the kernel refuses): the caller then reads /proc instead.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import logging
import os
import socket
import struct

log = logging.getLogger(__name__)

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_REQ_BYTECODE = 1
INET_DIAG_BC_S_GE, INET_DIAG_BC_S_LE = 2, 3
TCP_ESTABLISHED = 1

_NLMSG = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_REQ = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states; then the 48-byte sockid (zero: match all)
_SOCKID_BYTES = 48
# of inet_diag_msg (72 bytes) only what the watch needs: family, remote port (big-endian), remote address, inode
_MSG = struct.Struct("=B5xH16x16s28xI")
_BC_OP = struct.Struct("=BBH")  # inet_diag_bc_op: code, yes, no


def _port_filter(port: int) -> bytes:
    """Bytecode accepting local port == `port` (S_GE then S_LE: what kernels since 2.6 understand). A jump
    that lands exactly at the end accepts, one 4 bytes past it rejects."""
    ge = _BC_OP.pack(INET_DIAG_BC_S_GE, 8, 20) + _BC_OP.pack(0, 0, port)
    le = _BC_OP.pack(INET_DIAG_BC_S_LE, 8, 12) + _BC_OP.pack(0, 0, port)
    code = ge + le
    return struct.pack("=HH", 4 + len(code), INET_DIAG_REQ_BYTECODE) + code


def _request(family: int, port: int, seq: int) -> bytes:
    body = _REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_ESTABLISHED) + bytes(_SOCKID_BYTES)
    body += _port_filter(port)
    return _NLMSG.pack(_NLMSG.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


@functools.lru_cache(maxsize=4096)
def _ip(family: int, raw: bytes) -> str:
    """The client address as connections.py's /proc reader gives it (an IPv4-mapped IPv6 one as IPv4). Cached:
    10,000 connections come from a few hosts."""
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    addr = ipaddress.IPv6Address(raw)
    return str(addr.ipv4_mapped) if addr.ipv4_mapped is not None else str(addr)


def _dump(sock: socket.socket, family: int, port: int, out: dict[int, tuple[str, int]]) -> None:
    seq = os.getpid() & 0xFFFF  # any number: one request at a time on this socket
    sock.send(_request(family, port, seq))
    while True:
        data = sock.recv(1 << 20)
        if not data:
            raise OSError(errno.EIO, "netlink socket closed")
        off = 0
        while off + _NLMSG.size <= len(data):
            length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(data, off)
            if length < _NLMSG.size:
                raise OSError(errno.EIO, f"netlink message of {length} bytes")
            if kind == NLMSG_DONE:
                return
            if kind == NLMSG_ERROR:
                (code,) = struct.unpack_from("=i", data, off + _NLMSG.size)
                raise OSError(-code, os.strerror(-code))
            if kind == SOCK_DIAG_BY_FAMILY:
                fam, dport, dst, inode = _MSG.unpack_from(data, off + _NLMSG.size)
                out[inode] = (_ip(fam, dst), socket.ntohs(dport))
            off += (length + 3) & ~3


def established(port: int) -> dict[int, tuple[str, int]] | None:
    """{socket inode: (client ip, client port)} of the established TCP connections whose local port is
    `port`, IPv4 and IPv6; None when the kernel cannot be asked this way (read /proc instead)."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    except (OSError, AttributeError):  # no netlink (not Linux), or the sandbox forbids it
        return None
    out: dict[int, tuple[str, int]] = {}
    try:
        sock.settimeout(5.0)
        for family in (socket.AF_INET, socket.AF_INET6):
            _dump(sock, family, port, out)
    except OSError as exc:
        log.debug("sock_diag unavailable (%s): reading /proc/net/tcp instead", exc)
        return None
    finally:
        sock.close()
    return out
