"""The transport-free exchange core (issue 56): the mechanics around the algorithms' rules that the Spark runtime
(:mod:`mpca.runtime`) and the virtual-clock simulator (:mod:`mpca.sim`) both drive, each written once, with no
Spark, no sockets and no clock of its own.

- :mod:`mpca.exchange.schedule`: the 3-phase schedule (which shard a cycle reduces and broadcasts, when a reduction
  is staged, hand-ins, the pending reduction of a checkpoint).
- :mod:`mpca.exchange.presence`: the presence book (absent, joining, not started, left; the bounded wait; the
  ``training.min_agents`` rule).
- :mod:`mpca.exchange.partials`: the partial sums of Eq. 9 a reduction carries, how two combine, and the sum the
  driver rule takes (decoded, finite).
- :mod:`mpca.exchange.agent_step`: an agent's batch order, its training step with its rule's hooks in order, and
  its contribution as it goes on the wire (finite, encoded with error feedback).
- :mod:`mpca.exchange.lock_step`: an agent in lock step with the cycles (``training.lock_step``: a reproducible
  run).
- :mod:`mpca.exchange.service`: the parameter service's handling of one request (decode, refuse NaN/Inf, the
  rule's ``serve``, the answer encoded with the driver's error feedback per agent).
- :mod:`mpca.exchange.timeouts`: how long the exchange's tasks wait (``cluster.task_timeout_s``'s default).
- :mod:`mpca.exchange.device`: an agent's device — its step time (T / speed) on the simulator's virtual clock and
  waited out in wall time by the runtime's emulated devices.
"""
