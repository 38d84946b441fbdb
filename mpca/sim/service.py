"""The parameter service in virtual time: an object with ``request(header, payload) -> (header, payload)``, as
the runtime's service client has, that calls the driver rule's ``serve`` at once (the simulator runs one
agent's hook at a time, in virtual-time order) and charges the round trip's virtual time to the calling agent:
the request through the driver's port (FIFO), the service's overhead, the answer back through it, and the
exchange's CPU for both messages when the constants model it (:func:`~mpca.sim.network.exchange_cpu_time`).

The payload travels as the runtime's does (:mod:`mpca.runtime.driver_service`): the agent's rule encoded it in
the run's wire format with its error feedback (``ServiceAgent.call_service``); here the exchange core's
:func:`~mpca.exchange.service.serve` decodes it, checks it finite, serves it and encodes the answer with the
driver's error feedback per agent, as the runtime's service does.  Requests are served in the
order agents send them, which is their arrival order at a FIFO port fed at equal sizes."""
from __future__ import annotations

from typing import Callable, Tuple

from mpca.algorithm.base import DriverRule
from mpca.algorithm.wire import Codec, ErrorFeedback
from mpca.exchange.service import serve
from mpca.sim.constants import NetworkConstants
from mpca.sim.network import DriverPort, exchange_cpu_time


class SimServiceClient:
    """One agent's client.  ``now()`` is the calling agent's virtual time; :meth:`take_charge` returns (and
    resets) the seconds its requests took since the last call."""

    def __init__(self, agent: int, rule: DriverRule, codec: Codec, answers: ErrorFeedback, port: DriverPort,
                 net: NetworkConstants, now: Callable[[], float]):
        self.agent, self.rule, self.codec, self.answers, self.port = agent, rule, codec, answers, port
        self.net = net
        self.now = now
        self.charged_s = 0.0
        self.requests = 0

    def request(self, header: dict, payload=None) -> Tuple[dict, bytes]:
        t = self.now() + self.charged_s
        size = len(payload or b"")
        arrived = self.port.receive(t, size)
        reply, answer = serve(self.rule, self.codec, self.answers, self.agent, header, payload)
        answer = answer or b""
        done = self.port.send(arrived + self.net.service_overhead_s, len(answer))
        done += exchange_cpu_time(1, size + len(answer), self.net)  # the caller's messages, both ways
        self.charged_s += done - t
        self.requests += 1
        return reply, answer

    def take_charge(self) -> float:
        c, self.charged_s = self.charged_s, 0.0
        return c

    def close(self) -> None: ...
