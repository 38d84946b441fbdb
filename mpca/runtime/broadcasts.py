"""Broadcast variables of one run and their lifetimes: every shard the driver sends down is a Spark broadcast
that lives until the job that reads it has ended, then is destroyed, so that executors' memory stays flat over
thousands of cycles (the schedule, :class:`~mpca.exchange.schedule.PhaseSchedule`, holds the staged ones until
the job that carries them)."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from mpca.algorithm.wire import Codec, ErrorFeedback


class Broadcasts:
    """The run's broadcasts, encoded in its wire format; a lossy format with the driver's error feedback per
    shard (what the last projection of a shard lost goes down with the next one)."""

    def __init__(self, sc, codec: Codec):
        self.sc = sc
        self.codec = codec
        self.feedback = ErrorFeedback(codec)
        self.counts = {"created": 0, "destroyed": 0}

    def create(self, vec: torch.Tensor, shard: Optional[int] = None, exact: bool = False):
        """A broadcast of ``vec`` (shard ``shard``'s projection) in the wire format, or ``exact``: the values in
        their own dtype (a replacement's whole joint model).  Raw bytes, not an ndarray: PySpark's encrypted
        broadcast path (spark.io.encryption.enabled) cannot write the PickleBuffer that protocol 5 produces for
        arrays."""
        data = (np.ascontiguousarray(vec.numpy(), dtype=self.codec.dtype).tobytes() if exact
                else self.feedback.encode(shard, vec.numpy()))
        bc = self.publish(data)
        self.counts["created"] += 1
        return bc

    def publish(self, data: bytes):
        """The encoded bytes as a Spark broadcast variable (its ``value`` read by the deliver tasks)."""
        return self.sc.broadcast(data)

    def destroy(self, bc) -> None:
        """Drop a broadcast no job will read again."""
        bc.destroy(blocking=False)
        self.counts["destroyed"] += 1
