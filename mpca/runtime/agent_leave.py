"""An agent leaving the run because its executor is being decommissioned: how it learns it (the parameter service's
answer, or — for driver-initiated algorithms, whose exchange tasks no longer reach a decommissioning executor — a
poll of the driver once a second) and what it hands in before it stops (its rule's last contribution of each shard,
which the driver adds to the next reduction of that shard: :meth:`mpca.exchange.schedule.PhaseSchedule.hand_in`)."""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from mpca.runtime import protocol
from mpca.runtime.protocol import SERVICE_OPS

if TYPE_CHECKING:
    from mpca.runtime.agent import Agent

log = logging.getLogger("mpca.agent")

LEAVE_POLL_S = 1.0  # how often a driver-initiated algorithm's agent asks whether its executor is going


class LeaveOnRequest:
    """The parameter service's client as the agent rule sees it: an answer that asks this agent to leave (its
    executor is being decommissioned) calls ``on_leave`` once; requests and answers are otherwise untouched."""

    def __init__(self, client, on_leave: Callable[[], None]):
        self.client, self.on_leave = client, on_leave

    def request(self, header: dict, payload=None):
        reply, data = self.client.request(header, payload)
        if reply.get("leave") and header.get("op") != "leave":
            self.on_leave()
        return reply, data

    def close(self) -> None:
        self.client.close()


def watch_for_leave(agent: "Agent", client) -> threading.Thread:
    """Driver-initiated algorithms on a cluster that decommissions executors: ask the driver's service (``client``)
    once a second whether ``agent`` leaves, in a daemon thread, until it stops."""

    def watch() -> None:
        while not agent.stop_requested:
            time.sleep(LEAVE_POLL_S)
            try:
                reply, _ = client.request(protocol.header(SERVICE_OPS, "poll", agent=agent.id))
            except Exception as e:  # noqa: BLE001 - the driver gone: the exchange's idle timeout ends the agent
                if not agent.stop_requested:
                    log.warning("agent %s: cannot ask the driver whether to leave: %s", agent.id, e)
                return
            if reply.get("leave"):
                agent.asked_to_leave()

    thread = threading.Thread(target=watch, name=f"mpca-agent{agent.id}-leave", daemon=True)
    thread.start()
    return thread


def hand_in(agent: "Agent") -> None:
    """``agent``'s executor is being decommissioned and its training loop has ended: hand in what the joint model
    lacks, then say it leaves."""
    if agent.service is not None:  # agent-initiated: the rule's own last exchange with the service
        agent.rule.hand_in()
        agent.service.request(protocol.header(SERVICE_OPS, "leave", agent=agent.id))
        return
    parts = []  # (shard, vector, weight, report)
    with agent.lock:  # no exchange task can reach this executor any more
        for s in range(agent.spec.layout.num_shards):
            got = agent.rule.handed_in(s, agent.last_params)
            if got is not None and got[1] > 0 and bool(torch.isfinite(got[0]).all()):
                parts.append((s, *got))
    payload = b"".join(np.ascontiguousarray(v.numpy(), dtype=agent.codec.dtype).tobytes() for _, v, _, _ in parts)
    agent.leave_watch.request(protocol.header(SERVICE_OPS, "leave", agent=agent.id, shards=[p[0] for p in parts],
                                              weights=[float(p[2]) for p in parts],
                                              extras=[p[3] for p in parts]), payload)


__all__ = ["LEAVE_POLL_S", "LeaveOnRequest", "hand_in", "watch_for_leave"]
