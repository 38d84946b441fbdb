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


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 22))
        if k == 0:
            raise ChannelError(f"peer closed the channel after {got} of {n} bytes")
        got += k
    return buf


def _mac(secret: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, role + nonce, hashlib.sha256).digest()


class Channel:
    """One authenticated connection; send/receive (header dict, payload bytes) messages."""

    def __init__(self, sock: socket.socket, max_payload: int = DEFAULT_MAX_PAYLOAD):
        self.sock = sock
        self.max_payload = max_payload

    # -- authentication ---------------------------------------------------------------
    def _handshake(self, secret: bytes, i_am: bytes, peer_is: bytes) -> None:
        """Each side proves knowledge of the secret over the other side's fresh nonce."""
        self.sock.settimeout(AUTH_TIMEOUT_S)
        mine = os.urandom(NONCE_BYTES)
        self.sock.sendall(mine)
        theirs = bytes(_recv_exact(self.sock, NONCE_BYTES))
        self.sock.sendall(_mac(secret, i_am, theirs))
        proof = bytes(_recv_exact(self.sock, 32))
        if not hmac.compare_digest(proof, _mac(secret, peer_is, mine)):
            raise ChannelError("channel authentication failed: the peer does not hold this run's secret")
        self.sock.settimeout(None)

    @classmethod
    def connect(cls, path: str, secret: bytes, timeout: float = 10.0, max_payload: int = DEFAULT_MAX_PAYLOAD) -> "Channel":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            ch = cls(sock, max_payload)
            ch._handshake(secret, b"client", b"server")
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
        hlen, plen = PREFIX.unpack(bytes(_recv_exact(self.sock, PREFIX.size)))
        if hlen > MAX_HEADER:
            raise ChannelError(f"refusing a header of {hlen} bytes (limit {MAX_HEADER})")
        if plen > self.max_payload:
            raise ChannelError(f"refusing a payload of {plen} bytes (limit {self.max_payload})")
        try:
            header = json.loads(bytes(_recv_exact(self.sock, hlen)).decode())
        except (UnicodeDecodeError, ValueError) as e:
            raise ChannelError(f"malformed header: {e}") from None
        if not isinstance(header, dict):
            raise ChannelError("malformed header: not a JSON object")
        payload = _recv_exact(self.sock, plen) if plen else bytearray()
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
