"""The parameter service's handling of one agent's request, with no transport: decode the agent's payload in the
run's wire format, refuse NaN/Inf, let the driver rule serve it, encode the answer with the driver's error
feedback for that agent.  The runtime's service (:class:`mpca.runtime.driver_service.DriverService`, behind an
authenticated socket) and the simulator's (:class:`mpca.sim.service.SimServiceClient`, on the virtual clock) both
call :func:`serve`."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

from mpca.algorithm.base import DriverRule
from mpca.algorithm.wire import Codec, ErrorFeedback


def decode_request(codec: Codec, agent: int, header: dict, payload) -> torch.Tensor:
    """The agent's vector: ``header["n"]`` values (default: as many as the payload holds uncompressed), finite."""
    data = payload if payload else b""  # bytes or the socket's bytearray: decoded in place, not copied
    n = int(header.get("n", len(data) // np.dtype(codec.dtype).itemsize))
    vec = torch.from_numpy(codec.decode(data, n))
    if not bool(torch.isfinite(vec).all()):
        raise ValueError(f"agent {agent} sent NaN/Inf; refused (the joint model stays finite)")
    return vec


def serve(rule: DriverRule, codec: Codec, answers: ErrorFeedback, agent: int, header: dict,
          payload) -> Tuple[dict, Optional[bytes]]:
    """(reply header, answer payload or None): the rule's ``serve`` of the decoded request; an answer carries its
    value count ``n`` and is encoded with ``answers``' residual stream for this agent."""
    reply, out = rule.serve(agent, header, decode_request(codec, agent, header, payload))
    if out is None:
        return reply, None
    return {**reply, "n": out.numel()}, answers.encode(agent, out.numpy())


__all__ = ["decode_request", "serve"]
