"""The driver-hosted parameter service: authentication, framing limits, error replies, lifecycle."""
import socket
import threading
import time
import tracemalloc

import numpy as np
import pytest

from mpca.runtime import channel
from mpca.runtime.channel import MAX_HEADER, PREFIX, Channel, ChannelError
from mpca.runtime.service import ParameterService, ServiceClient, ServiceError

SECRET = b"r" * 32
MAX_PAYLOAD = 1 << 20


def handler(header, payload):
    """Echo the header and payload; ``sum`` adds the float32 payload; ``boom`` is a bug."""
    op = header["op"]  # a missing op is a KeyError, i.e. a bad request
    if op == "echo":
        return {"echo": header}, payload
    if op == "sum":
        return {"sum": float(np.frombuffer(payload, dtype=np.float32).sum())}, None
    if op == "boom":
        raise RuntimeError("handler bug")
    raise ValueError(f"unknown op {op!r}")


def wait_for(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


@pytest.fixture
def service():
    svc = ParameterService(SECRET, handler, max_payload=MAX_PAYLOAD, bind_host="127.0.0.1").start()
    yield svc
    svc.close()


def client(svc, secret=SECRET, **kw):
    host, port = svc.address
    return ServiceClient(host, port, secret, max_payload=MAX_PAYLOAD, timeout_s=5.0, **kw)


def authenticated_socket(svc):
    """A raw socket past the handshake, to send hand-made frames."""
    return Channel.connect_tcp(*svc.address, SECRET, max_payload=MAX_PAYLOAD).sock


def test_roundtrip_is_bit_exact(service):
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    x[:3] = [np.nan, -0.0, np.inf]
    with client(service) as c:
        h, p = c.request({"op": "echo", "step": 7, "tags": ["a"]}, x)
        assert h == {"echo": {"op": "echo", "step": 7, "tags": ["a"]}}
        assert np.frombuffer(p, dtype=np.float32).tobytes() == x.tobytes()
        h, p = c.request({"op": "sum"}, np.ones(5, np.float32))
        assert h == {"sum": 5.0} and len(p) == 0
        # a non-contiguous array goes out as its logical contents
        h, p = c.request({"op": "echo"}, x[::2])
        assert np.frombuffer(p, dtype=np.float32).tobytes() == x[::2].tobytes()
    s = service.stats
    assert s["requests"] == 3 and s["connections"] == 1 and s["auth_failures"] == 0


def test_wrong_secret_refused_then_good_client_served(service):
    with pytest.raises(ChannelError):
        client(service, secret=b"w" * 32)
    wait_for(lambda: service.stats["auth_failures"] == 1)
    with client(service) as c:
        assert c.request({"op": "sum"}, np.arange(4, dtype=np.float32))[0] == {"sum": 6.0}
    assert service.stats["auth_failures"] == 1 and service.stats["requests"] == 1


def test_silent_peer_is_dropped_after_auth_timeout(service, monkeypatch):
    monkeypatch.setattr(channel, "AUTH_TIMEOUT_S", 0.2)
    raw = socket.create_connection(service.address, timeout=5)
    assert len(raw.recv(64)) == channel.NONCE_BYTES  # the server's nonce, then we say nothing
    assert raw.recv(64) == b""  # the server hung up on us
    raw.close()
    wait_for(lambda: service.stats["auth_failures"] == 1 and service.active_connections == 0)


def test_truncated_frame_ends_only_that_connection(service):
    raw = authenticated_socket(service)
    raw.sendall(PREFIX.pack(100, 0) + b"x" * 10)
    raw.close()
    wait_for(lambda: service.active_connections == 0)
    with client(service) as c:
        assert c.request({"op": "echo"}, b"ok")[1] == b"ok"
    s = service.stats
    assert s["requests"] == 1 and s["bad_frames"] == 0 and s["handler_errors"] == 0


@pytest.mark.parametrize("hlen,plen", [(2, 2 ** 40), (2 ** 31, 0), (2, 64 * MAX_PAYLOAD)],
                         ids=["payload-2**40", "header-2**31", "payload-64x-limit"])
def test_absurd_lengths_refused_before_allocation(service, hlen, plen):
    raw = authenticated_socket(service)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        raw.sendall(PREFIX.pack(hlen, plen))
        assert raw.recv(1) == b""  # refused: the server closed without answering
        wait_for(lambda: service.stats["bad_frames"] == 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        raw.close()
    assert peak < 4 * 1024 ** 2
    with client(service) as c:  # and the service still serves
        assert c.request({"op": "echo"}, b"ok")[1] == b"ok"


def test_oversized_header_just_above_limit_is_a_bad_frame(service):
    raw = authenticated_socket(service)
    raw.sendall(PREFIX.pack(MAX_HEADER + 1, 0))
    assert raw.recv(1) == b""
    raw.close()
    wait_for(lambda: service.stats["bad_frames"] == 1)


def test_handler_errors_are_replies_and_connection_survives(service, caplog):
    with client(service) as c:
        with pytest.raises(ServiceError, match="bad request: KeyError"):
            c.request({"no-op": 1})
        with pytest.raises(ServiceError, match="bad request: ValueError"):
            c.request({"op": "nope"})
        assert c.request({"op": "echo"}, b"again")[1] == b"again"
        with caplog.at_level("ERROR", logger="mpca.service"):
            with pytest.raises(ServiceError, match="handler bug"):
                c.request({"op": "boom"})
        assert c.request({"op": "sum"}, np.ones(2, np.float32))[0] == {"sum": 2.0}
    assert any("handler failed" in r.getMessage() for r in caplog.records)
    s = service.stats
    assert s["connections"] == 1 and s["requests"] == 5 and s["handler_errors"] == 1


def test_idle_connection_closed_and_client_reconnects():
    with ParameterService(SECRET, handler, max_payload=MAX_PAYLOAD, bind_host="127.0.0.1",
                          idle_timeout_s=0.2) as svc:
        with client(svc) as c:
            assert c.request({"op": "echo"}, b"1")[1] == b"1"
            wait_for(lambda: svc.active_connections == 0)  # the service dropped us
            assert c.request({"op": "echo"}, b"2")[1] == b"2"
        assert svc.stats["connections"] == 2 and svc.stats["requests"] == 2


def test_max_connections_enforced():
    with ParameterService(SECRET, handler, max_payload=MAX_PAYLOAD, bind_host="127.0.0.1",
                          max_connections=2) as svc:
        a, b = client(svc), client(svc)
        with pytest.raises(OSError):  # ChannelError or a reset, depending on timing
            client(svc)
        assert svc.stats["refused"] == 1 and svc.stats["connections"] == 2
        assert a.request({"op": "echo"}, b"a")[1] == b"a"
        a.close()
        wait_for(lambda: svc.active_connections == 1)
        with client(svc) as c:
            assert c.request({"op": "echo"}, b"c")[1] == b"c"
        b.close()


def test_close_is_idempotent_and_stops_listening():
    svc = ParameterService(SECRET, handler, max_payload=MAX_PAYLOAD, bind_host="127.0.0.1").start()
    c = client(svc)
    addr = svc.address
    svc.close()
    svc.close()
    assert svc.active_connections == 0
    assert not any(t.name.startswith("mpca-service") for t in threading.enumerate())
    with pytest.raises(OSError):
        socket.create_connection(addr, timeout=1).close()
    with pytest.raises(OSError):  # the live connection was dropped and reconnecting fails
        c.request({"op": "echo"})
    c.close()
    c.close()
    with pytest.raises(RuntimeError):
        svc.start()


def test_address_advertises_the_given_host():
    with ParameterService(SECRET, handler, max_payload=1, bind_host="127.0.0.1",
                          advertise_host="driver.example") as svc:
        host, port = svc.address
        assert host == "driver.example" and port > 0


def test_a_replayed_handshake_is_refused(service):
    import socket

    from tests.helpers import assert_replayed_handshake_refused

    assert_replayed_handshake_refused(lambda: socket.create_connection(service.address), SECRET)
    with client(service) as c:
        assert c.request({"op": "echo"}, None)[0] == {"echo": {"op": "echo"}}  # and it serves on


def test_a_replacement_fetches_the_servers_current_model_and_the_next_observation_names_it():
    """op join on the driver's service: the driver rule's join vectors (the EASGD centre as it is now, not w⁰),
    exact, whatever the wire format; the next observation lists the agent as joined, the one after does not."""
    import torch

    from mpca.algorithm.easgd import EASGDDriver
    from mpca.algorithm.wire import Codec
    from mpca.runtime.driver_service import DriverService

    rule = EASGDDriver([torch.zeros(5)], agents=2, alpha=0.5)
    rule.joint[0] = torch.tensor([0.1, -2.0, 3.3, 1e-8, 7.0])  # the centre moved since w⁰
    svc = DriverService(rule, SECRET, Codec("int8", block=64), MAX_PAYLOAD, "127.0.0.1", 0, agents=2)
    try:
        host, port = svc.address
        with ServiceClient(host, port, SECRET, max_payload=MAX_PAYLOAD, timeout_s=5.0) as client:
            reply, payload = client.request({"op": "join", "agent": 1})
        assert reply["n"] == 5
        assert np.array_equal(np.frombuffer(payload, np.float32), rule.joint[0].numpy())  # exact, not int8
        assert svc.observe(0.05)[1] == [1]
        assert svc.observe(0.05)[1] == []
    finally:
        svc.close()


def test_an_agent_asked_to_leave_is_told_in_its_next_answer_and_is_not_missing_once_it_left():
    """Decommissioning: the service's next answer to the agent carries ``leave``; the agent's client wrapper
    (LeaveOnRequest) calls back once; the agent's ``op: leave`` marks it left, and it is no longer silent."""
    import torch

    from mpca.algorithm.easgd import EASGDDriver
    from mpca.algorithm.wire import Codec
    from mpca.runtime.agent_leave import LeaveOnRequest
    from mpca.runtime.driver_service import DriverService

    rule = EASGDDriver([torch.zeros(4)], agents=2, alpha=0.5)
    svc = DriverService(rule, SECRET, Codec(), MAX_PAYLOAD, "127.0.0.1", 0, agents=2)
    asked = []
    try:
        host, port = svc.address
        with ServiceClient(host, port, SECRET, max_payload=MAX_PAYLOAD, timeout_s=5.0) as raw:
            client = LeaveOnRequest(raw, lambda: asked.append(1))
            x = np.ones(4, np.float32).tobytes()
            assert not client.request({"op": "easgd", "agent": 1, "n": 4}, x)[0].get("leave")
            svc.ask_to_leave([1])
            assert client.request({"op": "easgd", "agent": 1, "n": 4}, x)[0]["leave"] and asked == [1]
            assert sorted(svc.silent(0.0)) == [0, 1]  # both silent for 0 s, neither left yet
            client.request({"op": "leave", "agent": 1})
        assert svc.left == {1} and svc.silent(0.0) == [0] and asked == [1]
    finally:
        svc.close()


def test_a_cycle_algorithms_agent_polls_leaves_and_hands_in_one_exact_vector_per_shard():
    """Driver-initiated algorithms (``serves=False``): ``op: poll`` says whether to leave; ``op: leave`` with a
    payload carries the agent's last contributions (shards, weights, reports) — taken once, weighted (τ·x), each
    checked; any other op is refused (this run has no parameter service)."""
    import torch

    from mpca.algorithm import MPCAHyper
    from mpca.algorithm.mpca import MPCADriver
    from mpca.algorithm.wire import Codec
    from mpca.runtime.driver_service import DriverService

    rule = MPCADriver([torch.zeros(3), torch.zeros(2)], agents=2, hyper=MPCAHyper())
    svc = DriverService(rule, SECRET, Codec(), MAX_PAYLOAD, "127.0.0.1", 0, agents=2, serves=False)
    try:
        host, port = svc.address
        with ServiceClient(host, port, SECRET, max_payload=MAX_PAYLOAD, timeout_s=5.0) as client:
            assert client.request({"op": "poll", "agent": 1})[0]["leave"] is False
            svc.ask_to_leave([1])
            assert client.request({"op": "poll", "agent": 1})[0]["leave"] is True
            assert client.request({"op": "poll", "agent": 0})[0]["leave"] is False
            with pytest.raises(ServiceError, match="no parameter service"):
                client.request({"op": "easgd", "agent": 0, "n": 3}, np.zeros(3, np.float32).tobytes())
            with pytest.raises(ServiceError, match="handed in 4 values for shards of 5"):
                client.request({"op": "leave", "agent": 1, "shards": [0, 1], "weights": [1, 1]},
                               np.ones(4, np.float32).tobytes())
            with pytest.raises(ServiceError, match="NaN/Inf"):
                client.request({"op": "leave", "agent": 1, "shards": [1], "weights": [1]},
                               np.array([1, np.nan], np.float32).tobytes())
            with pytest.raises(ServiceError, match="shards of this run"):
                client.request({"op": "leave", "agent": 1, "shards": [2], "weights": [1]},
                               np.ones(2, np.float32).tobytes())
            assert svc.take_left() == []  # refused hand-ins did not count as leaving
            x = np.array([1, 2, 3, 4, 5], np.float32)
            client.request({"op": "leave", "agent": 1, "shards": [0, 1], "weights": [3, 0.5],
                            "extras": [{"tau": 3}, {"tau": 1}]}, x.tobytes())
        got = svc.take_handed_in()
        assert [(a, s, e) for a, s, _, e in got] == [(1, 0, {"tau": 3}), (1, 1, {"tau": 1})]
        assert got[0][2].total.tolist() == [3, 6, 9] and got[0][2].weight == 3  # τ·x, τ
        assert got[1][2].total.tolist() == [2, 2.5] and got[1][2].weight == 0.5
        assert svc.take_handed_in() == [] and svc.take_left() == [1] and svc.take_left() == []
    finally:
        svc.close()


def test_a_client_that_can_relocate_follows_the_service_to_its_new_address_and_one_that_cannot_fails():
    """A Spark Connect run's coordinator that Spark started again serves from another port: the agent's client
    sends its request there once ``relocate`` names it (within ``relocate_s``); without ``relocate`` the request
    fails as before, and a relocating client whose service never moves gives up after ``relocate_s``."""
    first = ParameterService(SECRET, handler, max_payload=MAX_PAYLOAD, bind_host="127.0.0.1").start()
    where = {"now": first.address}
    moving = client(first, relocate=lambda: where["now"], relocate_s=10.0)
    fixed = client(first)
    old = first.address
    stuck = client(first, relocate=lambda: old, relocate_s=1.5)
    for c in (moving, fixed, stuck):
        assert c.request({"op": "sum"}, np.ones(3, np.float32))[0] == {"sum": 3.0}
    first.close()
    second = ParameterService(SECRET, handler, max_payload=MAX_PAYLOAD, bind_host="127.0.0.1").start()
    try:
        threading.Timer(0.5, lambda: where.update(now=second.address)).start()  # the new coordinator says where
        assert moving.request({"op": "sum"}, np.ones(4, np.float32))[0] == {"sum": 4.0}
        assert (moving.host, moving.port) == second.address
        with pytest.raises((ChannelError, OSError)):
            fixed.request({"op": "sum"}, np.ones(4, np.float32))
        t = time.monotonic()
        with pytest.raises((ChannelError, OSError)):
            stuck.request({"op": "sum"}, np.ones(4, np.float32))
        assert 1.4 < time.monotonic() - t < 5
    finally:
        for c in (moving, fixed, stuck):
            c.close()
        second.close()
