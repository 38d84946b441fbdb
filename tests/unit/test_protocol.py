"""The exchange protocol (mpca.runtime.protocol): every operation declared once, each header checked on receipt —
an unknown op, a missing field, a field of another type or one not declared is refused in one line."""
from __future__ import annotations

import pytest

from mpca.runtime.protocol import AGENT_OPS, SERVICE_OPS, check, header


def test_a_declared_request_passes_and_names_its_operation():
    h = header(AGENT_OPS, "yield", shard=1, params={}, cycle=4, counted=[2, 3], rejoin=False, timeout_s=120)
    assert h == {"op": "yield", "shard": 1, "params": {}, "cycle": 4, "counted": [2, 3], "rejoin": False,
                 "timeout_s": 120}
    assert check(AGENT_OPS, h).name == "yield"
    assert check(AGENT_OPS, {"op": "deliver", "shard": 0, "cycle": None, "params": {"alpha": 0.5}}).name == "deliver"


@pytest.mark.parametrize("received, says", [
    ({"shard": 0}, "a request without an op"),
    ({"op": "dance"}, "unknown op 'dance'"),
    ({"op": "yield"}, "op 'yield' lacks field(s) ['shard']"),
    ({"op": "yield", "shard": "0"}, "field 'shard' is str, not int"),
    ({"op": "yield", "shard": True}, "field 'shard' is bool, not int"),  # JSON true is no number
    ({"op": "yield", "shard": 0, "rejoin": 1}, "field 'rejoin' is int, not bool"),
    ({"op": "claim", "token": "t", "agent": 3}, "op 'claim' has no field 'agent'"),
])
def test_a_bad_header_is_refused_in_one_line(received, says):
    with pytest.raises(ValueError) as e:
        check(AGENT_OPS, received)
    assert str(e.value) == says or says in str(e.value)
    assert "\n" not in str(e.value)


def test_a_sender_cannot_send_a_field_or_an_op_it_did_not_declare():
    with pytest.raises(ValueError, match=r"op 'stop' has no field\(s\) \['now'\]"):
        header(AGENT_OPS, "stop", now=True)
    with pytest.raises(ValueError, match="unknown op 'stpo'"):
        header(AGENT_OPS, "stpo")


def test_the_service_takes_its_own_ops_and_an_algorithms_request_with_the_agents_counters():
    assert check(SERVICE_OPS, {"op": "leave", "agent": 1, "shards": [0], "weights": [2.0], "extras": [{}]}).name \
        == "leave"
    easgd = {"op": "easgd", "agent": 0, "n": 3, "steps": 12, "loss": 0.7}  # counters ride along
    assert check(SERVICE_OPS, easgd, algorithm_ops=True).name == "*"
    with pytest.raises(ValueError, match="unknown op 'easgd'"):
        check(SERVICE_OPS, easgd)
    with pytest.raises(ValueError, match=r"op 'easgd' lacks field\(s\) \['n'\]"):
        check(SERVICE_OPS, {"op": "easgd", "agent": 0}, algorithm_ops=True)
    with pytest.raises(ValueError, match="op 'poll' has no field 'steps'"):
        check(SERVICE_OPS, {"op": "poll", "agent": 0, "steps": 3}, algorithm_ops=True)


def test_every_operation_the_runtime_sends_is_declared():
    """The runtime's modules build every request through protocol.header: no header is written as a literal."""
    import pathlib
    import re

    runtime = pathlib.Path(__file__).resolve().parents[2] / "mpca" / "runtime"
    literals = [f"{p.name}:{i + 1}" for p in sorted(runtime.glob("*.py")) if p.name != "protocol.py"
                for i, line in enumerate(p.read_text(encoding="utf-8").splitlines())
                if re.search(r"""\{\s*["']op["']\s*:""", line)]
    assert not literals, f"request headers written as literals (use protocol.header): {literals}"
