"""Broken messages for an agent's channel (:mod:`mpca.runtime.channel`), as a fault campaign sends them.

Each variant is one connection to the agent's Unix socket that breaks the protocol a different way:

* without the run's secret: ``junk`` (random bytes where the handshake's nonce and proof belong) and ``stall``
  (a connection that sends nothing and is held longer than the handshake's timeout);
* with the secret (a peer that authenticated, then sent a frame the agent must not take):
  ``truncated`` (a ``deliver`` whose payload stops halfway, then the connection closes), ``malformed`` (a header
  that is not JSON), ``oversized`` (a prefix announcing a payload beyond the channel's bound), ``wrong_size``
  (a ``deliver`` of shard 0 whose payload has the wrong length for its wire format) and ``nonfinite`` (a
  ``deliver`` of shard 0 of the right length whose values are NaN).

:func:`send` returns what the agent did with it (``"closed"``, ``"error: …"``, ``"ok"``, ``"timeout"``), read
from its side of the connection."""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Optional

import numpy as np

from mpca.runtime.channel import AUTH_TIMEOUT_S, PREFIX, Channel, ChannelError

VARIANTS = ("junk", "stall", "truncated", "malformed", "oversized", "wrong_size", "nonfinite")
UNAUTHENTICATED = ("junk", "stall")


def _frame(header: bytes, payload_len: int) -> bytes:
    return PREFIX.pack(len(header), payload_len) + header


def _answer(ch: Channel, timeout: float) -> str:
    try:
        reply, _ = ch.recv(timeout)
    except (ChannelError, OSError) as e:
        return "timeout" if isinstance(e, socket.timeout) else "closed"
    return f"error: {reply['error']}" if "error" in reply else "ok"


def send(variant: str, path: str, secret: Optional[bytes], shard_bytes: int = 0, timeout: float = 15.0) -> str:
    """One broken connection of ``variant`` to the agent socket at ``path``; ``secret``: the run's (the variants
    after the handshake need it); ``shard_bytes``: shard 0's size in the run's wire format (``nonfinite``)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    if variant in UNAUTHENTICATED:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            if variant == "junk":
                sock.sendall(os.urandom(64))
            else:
                time.sleep(AUTH_TIMEOUT_S + 2.0)  # nothing sent: the agent's handshake times out first
            while sock.recv(4096):  # its nonce (and for junk its proof), until it closes
                pass
            return "closed"
        except socket.timeout:
            return "timeout"
        except OSError:
            return "closed"
        finally:
            sock.close()
    if secret is None:
        raise ValueError(f"{variant} needs the run's secret")
    ch = Channel.connect(path, secret, timeout=timeout)
    try:
        deliver = json.dumps({"op": "deliver", "shard": 0}).encode()
        if variant == "truncated":
            ch.sock.sendall(_frame(deliver, 1024) + bytes(512))
            return "closed"  # the rest never comes: the agent waits for it until the connection closes
        if variant == "malformed":
            ch.sock.sendall(_frame(b"\xff{not json", 0))
        elif variant == "oversized":
            ch.sock.sendall(_frame(deliver, 1 << 40))
        elif variant == "wrong_size":
            ch.sock.sendall(_frame(deliver, 3) + b"\x00\x01\x02")
        else:  # nonfinite
            nans = np.full(shard_bytes // 4 + 1, np.nan, np.float32).tobytes()[:shard_bytes]  # NaN in any format
            ch.sock.sendall(_frame(deliver, shard_bytes) + nans)
        return _answer(ch, timeout)
    finally:
        ch.close()


__all__ = ["UNAUTHENTICATED", "VARIANTS", "send"]
