"""Broadcast variables of one run and their lifetimes: every shard the driver sends down is a Spark broadcast
that lives until the job that reads it has ended, then is destroyed, so that executors' memory stays flat over
thousands of cycles; the pipeline's staged broadcasts wait here for the job that carries them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import torch

from mpca.algorithm.wire import Codec, ErrorFeedback


@dataclass
class Staged:
    shard: int
    bc: object  # pyspark Broadcast of the projected shard x*


class Broadcasts:
    """The run's broadcasts, encoded in its wire format; a lossy format with the driver's error feedback per
    shard (what the last projection of a shard lost goes down with the next one)."""

    def __init__(self, sc, codec: Codec):
        self.sc = sc
        self.codec = codec
        self.feedback = ErrorFeedback(codec)
        self.counts = {"created": 0, "destroyed": 0}
        self._staged: Dict[int, Staged] = {}  # by the cycle whose job will carry it

    def create(self, vec: torch.Tensor, shard: Optional[int] = None, exact: bool = False):
        """A broadcast of ``vec`` (shard ``shard``'s projection) in the wire format, or ``exact``: the values in
        their own dtype (a replacement's whole joint model).  Raw bytes, not an ndarray: PySpark's encrypted
        broadcast path (spark.io.encryption.enabled) cannot write the PickleBuffer that protocol 5 produces for
        arrays."""
        data = (np.ascontiguousarray(vec.numpy(), dtype=self.codec.dtype).tobytes() if exact
                else self.feedback.encode(shard, vec.numpy()))
        bc = self.sc.broadcast(data)
        self.counts["created"] += 1
        return bc

    def destroy(self, bc) -> None:
        """Drop a broadcast no job will read again."""
        bc.destroy(blocking=False)
        self.counts["destroyed"] += 1

    def stage(self, cycle: int, shard: int, vec: torch.Tensor) -> None:
        """``vec`` (shard ``shard``) goes down with the job of cycle ``cycle``."""
        self._staged[cycle] = Staged(shard, self.create(vec, shard))

    def take(self, cycle: int) -> Optional[Staged]:
        """What the job of ``cycle`` carries (the caller destroys it once the job has ended)."""
        return self._staged.pop(cycle, None)

    def drop_staged(self) -> None:
        for st in self._staged.values():
            self.destroy(st.bc)
        self._staged.clear()
