"""A driver-hosted parameter service for asynchronous algorithms (asynchronous EASGD, parameter servers).

Agents — long-lived Spark tasks on executors, possibly on other hosts — call the driver
over TCP on their own clock (e.g. every n local steps) instead of meeting at a barrier.
The transport is the authenticated channel of :mod:`mpca.runtime.channel`, reused as is:
same HMAC handshake, same framing, same size limits.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

from mpca.runtime.channel import Channel, ChannelError, FrameError, listen_tcp

log = logging.getLogger("mpca.service")

Handler = Callable[[dict, bytearray], Tuple[dict, Any]]
"""``handler(header, payload) -> (reply_header, reply_payload)``; the payload may be None,
bytes, a memoryview or anything exporting the buffer protocol (a numpy array)."""

BAD_REQUEST_ERRORS = (ValueError, KeyError, TypeError, IndexError)
"""Exceptions a handler raises to reject a request: answered as ``bad request``, not logged as bugs."""

ACCEPT_POLL_S = 0.25
JOIN_S = 2.0
_COUNTERS = ("connections", "refused", "auth_failures", "bad_frames", "requests", "handler_errors")


class ServiceError(RuntimeError):
    """The service answered with an error (the reply header carried ``"error"``)."""


def _as_buffer(payload: Any) -> Optional[memoryview]:
    """``payload`` as a C-contiguous memoryview (copied only when it is not contiguous)."""
    if payload is None:
        return None
    view = memoryview(payload)
    return view if view.c_contiguous else memoryview(view.tobytes())


def _shut(sock: socket.socket) -> None:
    """Shut down and close ``sock``; shutting down first wakes a thread blocked on it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class ParameterService:
    """A request/reply service hosted by the driver and called by agents over TCP.

    Each request is one channel message (a JSON header and an optional raw payload) and gets
    exactly one reply from ``handler(header, payload) -> (reply_header, reply_payload)``.
    The handler runs on the connection's thread, so calls from different agents run
    concurrently: it must guard shared state (e.g. the center variable) with its own lock.
    Rejecting a request is done by raising ValueError/KeyError/TypeError/IndexError: the
    agent gets ``{"error": "bad request: ..."}`` and its connection stays usable.  Any other
    exception is logged (logger ``mpca.service``), counted in ``handler_errors`` and
    answered with ``{"error": ...}`` as well.

    Security model.  The listening port is open to anyone who can reach the driver, so the
    only access control is the handshake: each connection proves, in both directions,
    knowledge of the per-run secret with HMAC-SHA256 over the other side's fresh nonce (the
    secret itself never crosses the wire; it reaches executors inside the task closures,
    protected by Spark's ``spark.authenticate`` / ``spark.io.encryption`` when they are on).
    A peer that does not finish the handshake within ``channel.AUTH_TIMEOUT_S`` is dropped.
    Messages are a JSON header (at most ``channel.MAX_HEADER`` bytes) and raw array bytes
    (at most ``max_payload``); sizes are checked before anything is allocated or read, and
    nothing received is ever unpickled.  A peer announcing an oversized frame is
    disconnected; a connection idle for ``idle_timeout_s`` is closed; at most
    ``max_connections`` are served at once, further ones are closed on accept.  Traffic is
    authenticated but not encrypted: run it on a trusted network (or a VPN/overlay).

    Reachability on YARN or another real cluster.  Agents connect to :attr:`address`, which
    the driver ships to them.  Bind on all interfaces (``bind_host="0.0.0.0"``, the default)
    or on the interface facing the executors, and set ``advertise_host`` to the name or IP
    the executors can resolve (typically ``spark.driver.host``); a wildcard bind host is not
    a reachable address.  Where a firewall or security group sits between executors and the
    driver, pick a fixed ``port`` (e.g. next to ``spark.driver.port``) and open it from the
    executors' hosts to the driver's host; ``port=0`` picks a free port, which only works
    where executors may reach any driver port.  In YARN cluster mode the driver runs inside
    the application master's container, so the rule must cover the NodeManager hosts.
    """

    def __init__(self, secret: bytes, handler: Handler, *, max_payload: int, bind_host: str = "0.0.0.0",
                 port: int = 0, advertise_host: Optional[str] = None, max_connections: int = 64,
                 idle_timeout_s: float = 600.0):
        if not isinstance(secret, (bytes, bytearray)) or not secret:
            raise ValueError("secret must be non-empty bytes")
        if max_payload < 0 or max_connections < 1 or idle_timeout_s <= 0:
            raise ValueError("max_payload must be >= 0, max_connections >= 1 and idle_timeout_s > 0")
        self._secret = bytes(secret)
        self._handler = handler
        self.max_payload = max_payload
        self.bind_host = bind_host
        self.port = port
        self.advertise_host = advertise_host
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self._lock = threading.Lock()
        self._counts: Dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        self._live: Dict[socket.socket, threading.Thread] = {}
        self._listener: Optional[socket.socket] = None
        self._acceptor: Optional[threading.Thread] = None
        self._closed = threading.Event()

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> "ParameterService":
        """Bind, listen and run the accept loop in a daemon thread; returns ``self``."""
        with self._lock:
            if self._closed.is_set():
                raise RuntimeError("the service is closed")
            if self._listener is not None:
                return self
            self._listener = listen_tcp(self.bind_host, self.port, backlog=self.max_connections)
            self._listener.settimeout(ACCEPT_POLL_S)
            self._acceptor = threading.Thread(target=self._accept_loop, name="mpca-service-accept", daemon=True)
        self._acceptor.start()
        log.info("parameter service listening on %s:%d (advertised as %s:%d)",
                 self.bind_host, self._listener.getsockname()[1], *self.address)
        return self

    @property
    def address(self) -> Tuple[str, int]:
        """``(host, port)`` agents should connect to: the advertised (else bound) host, the bound port."""
        if self._listener is None:
            raise RuntimeError("the service is not started")
        return self.advertise_host or self.bind_host, self._listener.getsockname()[1]

    @property
    def stats(self) -> Dict[str, int]:
        """A snapshot of the counters: connections (admitted), refused (over max_connections),
        auth_failures, bad_frames (refused or malformed frames), requests, handler_errors."""
        with self._lock:
            return dict(self._counts)

    @property
    def active_connections(self) -> int:
        """Connections currently held by a thread (authenticating or serving)."""
        with self._lock:
            return len(self._live)

    def close(self) -> None:
        """Stop accepting, drop every live connection and join the threads briefly. Idempotent."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            listener, live = self._listener, dict(self._live)
        if listener is not None:
            _shut(listener)
        for sock in live:
            _shut(sock)
        deadline = time.monotonic() + JOIN_S
        for t in [self._acceptor, *live.values()]:
            if t is not None and t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> "ParameterService":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- serving ------------------------------------------------------------------------------
    def _count(self, key: str) -> None:
        with self._lock:
            self._counts[key] += 1

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                sock, peer = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                if not self._closed.is_set():
                    log.exception("parameter service: accept failed; no longer accepting")
                return
            with self._lock:
                admitted = not self._closed.is_set() and len(self._live) < self.max_connections
                if admitted:
                    self._counts["connections"] += 1
                    t = threading.Thread(target=self._serve, args=(sock, peer), daemon=True,
                                         name=f"mpca-service-{peer[0]}:{peer[1]}")
                    self._live[sock] = t
                else:
                    self._counts["refused"] += 1
            if admitted:
                t.start()
            else:
                log.warning("parameter service: refusing %s:%d (%d connections live)",
                            peer[0], peer[1], self.max_connections)
                _shut(sock)

    def _serve(self, sock: socket.socket, peer: Tuple[Any, ...]) -> None:
        """One connection: authenticate, then answer requests until the peer leaves or misbehaves."""
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                ch = Channel.accept(sock, self._secret, self.max_payload)  # AUTH_TIMEOUT_S applies
            except (ChannelError, OSError) as e:
                self._count("auth_failures")
                log.warning("parameter service: %s:%d failed to authenticate: %s", peer[0], peer[1], e)
                return
            while not self._closed.is_set():
                try:
                    header, payload = ch.recv(timeout=self.idle_timeout_s)
                except FrameError as e:
                    self._count("bad_frames")
                    log.warning("parameter service: dropping %s:%d: %s", peer[0], peer[1], e)
                    return
                except socket.timeout:
                    log.info("parameter service: closing %s:%d, idle for %.0f s", peer[0], peer[1],
                             self.idle_timeout_s)
                    return
                except (ChannelError, OSError):
                    return  # the peer left, possibly mid-frame
                self._count("requests")
                reply, body = self._dispatch(header, payload)
                del payload
                try:
                    ch.send(reply, body)
                except (TypeError, ValueError) as e:  # raised by send before anything is written
                    self._count("handler_errors")
                    log.error("parameter service: unsendable reply to %r: %s", header.get("op"), e)
                    ch.send({"error": f"internal error: unsendable reply: {e}"})
        except OSError:
            pass  # the peer went away while we were replying, or close() shut the socket
        except Exception:  # noqa: BLE001 - never let one connection take the service down
            log.exception("parameter service: connection %s:%d failed", peer[0], peer[1])
        finally:
            with self._lock:
                self._live.pop(sock, None)
            _shut(sock)

    def _dispatch(self, header: dict, payload: bytearray) -> Tuple[dict, Optional[memoryview]]:
        """Run the handler; map its exceptions and malformed results to error replies."""
        try:
            reply, body = self._handler(header, payload)
        except BAD_REQUEST_ERRORS as e:
            log.info("parameter service: bad request %r: %r", header.get("op"), e)
            return {"error": f"bad request: {type(e).__name__}: {e}"}, None
        except Exception as e:  # noqa: BLE001
            self._count("handler_errors")
            log.exception("parameter service: handler failed on %r", header.get("op"))
            return {"error": f"internal error: {type(e).__name__}: {e}"}, None
        try:
            if not isinstance(reply, dict):
                raise TypeError(f"reply header is a {type(reply).__name__}, not a dict")
            return reply, _as_buffer(body)
        except (TypeError, ValueError) as e:
            self._count("handler_errors")
            log.error("parameter service: handler returned a malformed reply to %r: %s", header.get("op"), e)
            return {"error": f"internal error: malformed reply: {e}"}, None


class ServiceClient:
    """An agent's connection to a :class:`ParameterService`; thread-safe (one request at a time).

    A connection the service dropped (e.g. after ``idle_timeout_s``) is re-established once,
    transparently, and the request re-sent; a request whose reply was lost with the
    connection may therefore reach the handler twice, so handlers should tolerate replays
    (elastic exchanges do).  Timeouts and refused frames are not retried.
    """

    def __init__(self, host: str, port: int, secret: bytes, *, max_payload: int, timeout_s: float = 60.0,
                 relocate: Optional[Callable[[], Optional[Tuple[str, int]]]] = None, relocate_s: float = 0.0):
        """``relocate``: where the service is now — a Spark Connect run's coordinator that Spark started again
        serves from another address; a request that cannot reach the service then looks there, for up to
        ``relocate_s``, until the address changes, and is sent to the new one."""
        self.host, self.port = host, port
        self.relocate, self.relocate_s = relocate, relocate_s
        self._secret = bytes(secret)
        self.max_payload = max_payload
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._closed = False
        self._ch: Optional[Channel] = self._connect()

    def _connect(self) -> Channel:
        return Channel.connect_tcp(self.host, self.port, self._secret, timeout=self.timeout_s,
                                   max_payload=self.max_payload)

    def _exchange(self, ch: Channel, header: dict, payload: Any) -> Tuple[dict, bytearray]:
        ch.sock.settimeout(self.timeout_s)  # bounds a send into a stalled service, too
        ch.send(header, _as_buffer(payload))
        return ch.recv(timeout=self.timeout_s)

    def _drop(self) -> None:
        if self._ch is not None:
            self._ch.close()
            self._ch = None

    def request(self, header: dict, payload: Any = None) -> Tuple[dict, bytearray]:
        """Send one request and return ``(reply_header, reply_payload)``.

        Raises ServiceError when the service answered with an error, ChannelError/OSError when
        it cannot be reached (after one reconnection), ValueError/TypeError for an unsendable header.
        """
        with self._lock:
            try:
                reply, body = self._request(header, payload)
            except FrameError:
                raise  # a refused frame: the service is there
            except (ChannelError, OSError) as e:
                if self.relocate is None or self._closed:
                    raise
                reply, body = self._relocated(header, payload, e)
        if "error" in reply:
            raise ServiceError(str(reply["error"]))
        return reply, body

    def _relocated(self, header: dict, payload: Any, error: BaseException) -> Tuple[dict, bytearray]:
        """The request sent to the service's new address once :attr:`relocate` names one (``error`` raised
        again if none comes within :attr:`relocate_s`)."""
        deadline = time.monotonic() + self.relocate_s
        while time.monotonic() < deadline:
            where = self.relocate()
            if where is not None and tuple(where) != (self.host, self.port):
                log.warning("service client: the service moved from %s:%d to %s:%d", self.host, self.port, *where)
                self.host, self.port = where
                try:
                    self._ch = self._connect()
                    return self._exchange(self._ch, header, payload)
                except (ChannelError, OSError):
                    self._drop()
            time.sleep(1.0)
        raise error

    def _request(self, header: dict, payload: Any) -> Tuple[dict, bytearray]:
        """One request on the connection (re-established once where the service dropped it)."""
        if self._closed:
            raise ChannelError("the service client is closed")
        reused = self._ch is not None
        if self._ch is None:
            self._ch = self._connect()
        try:
            reply, body = self._exchange(self._ch, header, payload)
        except (socket.timeout, FrameError):
            self._drop()  # the stream is out of step with the service
            raise
        except (ChannelError, OSError):
            self._drop()
            if not reused:
                raise
            log.info("service client: connection to %s:%d dropped, reconnecting", self.host, self.port)
            self._ch = self._connect()
            try:
                reply, body = self._exchange(self._ch, header, payload)
            except (ChannelError, OSError):
                self._drop()
                raise
        return reply, body

    def close(self) -> None:
        """Close the connection; further requests raise ChannelError. Idempotent."""
        with self._lock:
            self._closed = True
            self._drop()

    def __enter__(self) -> "ServiceClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
