"""An agent's channel server: the exchange and control tasks of its executor connect to its Unix socket
(owner-only), authenticate (:mod:`mpca.runtime.channel`: HMAC handshake, JSON headers, raw arrays, never unpickled)
and send requests the agent answers (:data:`mpca.runtime.protocol.AGENT_OPS`); at most :data:`MAX_CONNECTIONS` at
once, one thread each."""
from __future__ import annotations

import logging
import threading
from typing import Callable, Optional, Tuple

from mpca.runtime.channel import Channel, ChannelError

log = logging.getLogger("mpca.agent")

MAX_CONNECTIONS = 64  # exchange tasks hold a few per agent at once

Handler = Callable[[dict, bytearray], Tuple[dict, Optional[bytes]]]


class ChannelServer:
    """Serves ``handle(header, payload) -> (reply, body)`` on a listening socket until ``stopped()``; a request
    the handler cannot take (ValueError, KeyError, TypeError, IndexError, TimeoutError) is answered with an error,
    not fatal; ``refused`` counts connections closed because :data:`MAX_CONNECTIONS` were open."""

    def __init__(self, name: str, secret: bytes, max_payload: int, handle: Handler, stopped: Callable[[], bool]):
        self.name, self.secret, self.max_payload = name, secret, max_payload
        self.handle, self.stopped = handle, stopped
        self.refused = 0

    def serve(self, srv) -> None:
        """Accept connections (the socket is owner-only: a peer that could flood it runs as this user; connections
        beyond the bound are closed at once)."""
        srv.settimeout(0.5)
        slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        while not self.stopped():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            if not slots.acquire(blocking=False):
                conn.close()
                self.refused += 1
                continue
            threading.Thread(target=self.serve_one, args=(conn, slots), daemon=True).start()

    def serve_one(self, conn, slots: Optional[threading.BoundedSemaphore] = None) -> None:
        try:
            ch = Channel.accept(conn, self.secret, self.max_payload)
            while True:
                header, payload = ch.recv()
                try:
                    reply, body = self.handle(header, payload)
                except (ValueError, KeyError, TypeError, IndexError, TimeoutError) as e:  # answered, not fatal
                    reply, body = {"error": f"bad request {header.get('op')!r}: {e!r}"}, None
                ch.send(reply, body)
        except (ChannelError, OSError) as e:
            if not isinstance(e, ChannelError) or "closed" not in str(e):
                log.warning("%s: dropped a connection: %s", self.name, e)
        finally:
            conn.close()
            if slots is not None:
                slots.release()


__all__ = ["ChannelServer", "MAX_CONNECTIONS"]
