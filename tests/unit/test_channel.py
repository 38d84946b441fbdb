import os
import socket
import stat
import threading

import pytest

from mpca.runtime.channel import MAX_HEADER, PREFIX, Channel, ChannelError, listen


@pytest.fixture
def server(tmp_path):
    path = str(tmp_path / "a.sock")
    srv = listen(path)
    yield path, srv
    srv.close()


def _serve_once(srv, secret, handler=None):
    result = {}

    def run():
        conn, _ = srv.accept()
        try:
            ch = Channel.accept(conn, secret, max_payload=1024)
            h, p = ch.recv()
            result["got"] = (h, bytes(p))
            ch.send({"echo": h}, p)
        except Exception as e:  # noqa: BLE001
            result["error"] = e
        finally:
            conn.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def test_socket_is_owner_only(server):
    path, _ = server
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_roundtrip_with_shared_secret(server):
    path, srv = server
    t, res = _serve_once(srv, b"k" * 32)
    ch = Channel.connect(path, b"k" * 32)
    h, p = ch.request({"op": "x", "n": 3}, b"\x01\x02")
    t.join(5)
    assert h == {"echo": {"op": "x", "n": 3}} and bytes(p) == b"\x01\x02"


def test_wrong_secret_is_rejected_on_both_sides(server):
    path, srv = server
    t, res = _serve_once(srv, b"right" * 8)
    with pytest.raises(ChannelError):
        Channel.connect(path, b"wrong" * 8)
    t.join(5)
    assert isinstance(res.get("error"), ChannelError) and "got" not in res


def test_oversized_payload_refused_before_reading(server):
    path, srv = server
    t, res = _serve_once(srv, b"s")
    ch = Channel.connect(path, b"s")
    ch.sock.sendall(PREFIX.pack(2, 10 ** 9) + b"{}")  # announces 1 GB, limit is 1 KiB
    t.join(5)
    assert "payload" in str(res["error"])


def test_oversized_and_non_json_headers_refused(server):
    path, srv = server
    t, res = _serve_once(srv, b"s")
    ch = Channel.connect(path, b"s")
    ch.sock.sendall(PREFIX.pack(MAX_HEADER + 1, 0))
    t.join(5)
    assert "header" in str(res["error"])
    t, res = _serve_once(srv, b"s")
    ch = Channel.connect(path, b"s")
    pickled = b"\x80\x04\x95"  # a pickle opcode stream is never accepted, only JSON
    ch.sock.sendall(PREFIX.pack(len(pickled), 0) + pickled)
    t.join(5)
    assert "malformed" in str(res["error"])


def test_unauthenticated_client_gets_nothing(server):
    path, srv = server
    t, res = _serve_once(srv, b"s")
    raw = socket.socket(socket.AF_UNIX)
    raw.connect(path)
    raw.recv(32)  # server nonce
    raw.sendall(b"\x00" * 32 + b"\x00" * 32)  # our nonce + a bogus proof
    t.join(5)
    assert isinstance(res["error"], ChannelError)
