"""The executor-local channel between an agent and the exchange tasks on its executor.

A Unix stream socket in the executor's working directory, mode 0600, so only
the executor's own user can reach it.  Every connection is authenticated both
ways with an HMAC-SHA256 challenge–response over a per-run secret that the
driver ships to executors inside the task closures (protected by Spark's own
``spark.authenticate`` / ``spark.io.encryption`` settings when they are on).

Wire format of a message: an 12-byte prefix (``<IQ``: header length, payload
length), a UTF-8 JSON header of at most :data:`MAX_HEADER` bytes, and a raw
payload of at most ``max_payload`` bytes (numeric arrays as their bytes).
Nothing received is ever unpickled; sizes are checked before anything is read.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
from typing import Optional, Tuple

PREFIX = struct.Struct("<IQ")
MAX_HEADER = 64 * 1024
DEFAULT_MAX_PAYLOAD = 8 * 1024 ** 3
NONCE_BYTES = 32
AUTH_TIMEOUT_S = 10.0


class ChannelError(ConnectionError):
    """The peer broke the protocol: wrong secret, oversized or malformed message, early close."""


class FrameError(ChannelError):
    """The peer announced or sent a frame this side refuses (oversized or malformed), as
    opposed to an early close; the stream can no longer be trusted and must be dropped."""


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 22))
        if k == 0:
            raise ChannelError(f"peer closed the channel after {got} of {n} bytes")
        got += k
    return buf


def mac(secret: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, role + nonce, hashlib.sha256).digest()


class Channel:
    """One authenticated connection; send/receive (header dict, payload bytes) messages."""

    def __init__(self, sock: socket.socket, max_payload: int = DEFAULT_MAX_PAYLOAD):
        self.sock = sock
        self.max_payload = max_payload

    # -- authentication ---------------------------------------------------------------
    def _handshake(self, secret: bytes, i_am: bytes, peer_is: bytes, timeout: float = AUTH_TIMEOUT_S) -> None:
        """Each side proves knowledge of the secret over the other side's fresh nonce (within ``timeout``)."""
        self.sock.settimeout(min(timeout, AUTH_TIMEOUT_S))
        mine = os.urandom(NONCE_BYTES)
        self.sock.sendall(mine)
        theirs = bytes(recv_exact(self.sock, NONCE_BYTES))
        self.sock.sendall(mac(secret, i_am, theirs))
        proof = bytes(recv_exact(self.sock, 32))
        if not hmac.compare_digest(proof, mac(secret, peer_is, mine)):
            raise ChannelError("channel authentication failed: the peer does not hold this run's secret")
        self.sock.settimeout(None)

    @classmethod
    def connect(cls, path: str, secret: bytes, timeout: float = 10.0, max_payload: int = DEFAULT_MAX_PAYLOAD) -> "Channel":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except BaseException:
            sock.close()
            raise
        return cls._authenticate_client(sock, secret, max_payload, timeout)

    @classmethod
    def connect_tcp(cls, host: str, port: int, secret: bytes, timeout: float = 10.0,
                    max_payload: int = DEFAULT_MAX_PAYLOAD) -> "Channel":
        """Connect over TCP (Nagle off) and authenticate exactly as :meth:`connect` does."""
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException:
            sock.close()
            raise
        return cls._authenticate_client(sock, secret, max_payload, timeout)

    @classmethod
    def _authenticate_client(cls, sock: socket.socket, secret: bytes, max_payload: int,
                             timeout: float = AUTH_TIMEOUT_S) -> "Channel":
        """Run the client side of the handshake on a connected socket; close it on failure."""
        try:
            ch = cls(sock, max_payload)
            ch._handshake(secret, b"client", b"server", timeout)
        except BaseException:
            sock.close()
            raise
        return ch

    @classmethod
    def accept(cls, sock: socket.socket, secret: bytes, max_payload: int = DEFAULT_MAX_PAYLOAD) -> "Channel":
        ch = cls(sock, max_payload)
        ch._handshake(secret, b"server", b"client")
        return ch

    # -- messages -----------------------------------------------------------------------
    def send(self, header: dict, payload: bytes | memoryview | None = None) -> None:
        head = json.dumps(header, separators=(",", ":")).encode()
        if len(head) > MAX_HEADER:
            raise ValueError(f"header of {len(head)} bytes exceeds {MAX_HEADER}")
        body = memoryview(payload if payload is not None else b"").cast("B")
        self.sock.sendall(PREFIX.pack(len(head), body.nbytes) + head)
        if body.nbytes:
            self.sock.sendall(body)

    def recv(self, timeout: Optional[float] = None) -> Tuple[dict, bytearray]:
        self.sock.settimeout(timeout)
        hlen, plen = PREFIX.unpack(bytes(recv_exact(self.sock, PREFIX.size)))
        if hlen > MAX_HEADER:
            raise FrameError(f"refusing a header of {hlen} bytes (limit {MAX_HEADER})")
        if plen > self.max_payload:
            raise FrameError(f"refusing a payload of {plen} bytes (limit {self.max_payload})")
        try:
            header = json.loads(bytes(recv_exact(self.sock, hlen)).decode())
        except (UnicodeDecodeError, ValueError) as e:
            raise FrameError(f"malformed header: {e}") from None
        if not isinstance(header, dict):
            raise FrameError("malformed header: not a JSON object")
        payload = recv_exact(self.sock, plen) if plen else bytearray()
        return header, payload

    def request(self, header: dict, payload=None, timeout: Optional[float] = None) -> Tuple[dict, bytearray]:
        self.send(header, payload)
        return self.recv(timeout)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def listen(path: str) -> socket.socket:
    """A listening Unix socket at ``path`` readable and writable by its owner only (0600)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        srv.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    srv.listen(64)
    return srv


def listen_tcp(host: str, port: int, backlog: int = 64) -> socket.socket:
    """A listening TCP socket on ``(host, port)`` (``port=0``: any free port), SO_REUSEADDR on.

    Unlike :func:`listen`, the file system gives no protection here: every connection
    must go through :meth:`Channel.accept`, whose handshake is the only access control.
    """
    family, kind, proto, _, addr = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    srv = socket.socket(family, kind, proto)
    try:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(addr)
        srv.listen(backlog)
    except BaseException:
        srv.close()
        raise
    return srv
