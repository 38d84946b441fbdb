"""The parameter service's handling of one request (mpca.exchange.service), as the runtime's socket service and
the simulator's virtual one both run it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from mpca.algorithm.wire import Codec, ErrorFeedback
from mpca.exchange.service import decode_request, serve


class _Halver:
    """A driver rule that answers half of what it gets, and nothing to a 'push'."""

    def __init__(self):
        self.got = []

    def serve(self, agent, header, vec):
        self.got.append((agent, vec.tolist()))
        return ({"ok": True}, None) if header.get("op") == "push" else ({"ok": True}, vec / 2)


def test_a_request_is_decoded_served_and_its_answer_encoded():
    rule, codec = _Halver(), Codec("fp32")
    reply, data = serve(rule, codec, ErrorFeedback(codec), 3, {"op": "pull"}, np.array([2.0, -4.0], np.float32).tobytes())
    assert rule.got == [(3, [2.0, -4.0])] and reply == {"ok": True, "n": 2}
    assert np.frombuffer(data, np.float32).tolist() == [1.0, -2.0]
    assert serve(rule, codec, ErrorFeedback(codec), 3, {"op": "push"}, b"") == ({"ok": True}, None)


def test_a_lossy_answer_keeps_the_agents_residual():
    rule, codec = _Halver(), Codec("int8", block=2)
    answers = ErrorFeedback(codec)
    payload = codec.encode(np.array([0.6, -2.0], np.float32))
    reply, data = serve(rule, codec, answers, 1, {"n": 2}, payload)
    assert reply["n"] == 2 and len(data) == codec.nbytes(2) and 1 in answers.residual
    np.testing.assert_allclose(codec.decode(data, 2) + answers.residual[1], np.array(rule.got[0][1]) / 2, atol=1e-6)


def test_non_finite_requests_are_refused():
    with pytest.raises(ValueError, match="agent 2 sent NaN/Inf; refused"):
        decode_request(Codec("fp32"), 2, {}, np.array([1.0, np.inf], np.float32).tobytes())
    assert decode_request(Codec("fp32"), 2, {}, np.array([1.0, 5.0], np.float32).tobytes()).tolist() == [1.0, 5.0]
    assert isinstance(decode_request(Codec("fp32"), 0, {}, b""), torch.Tensor)
