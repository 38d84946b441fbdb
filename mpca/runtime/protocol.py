"""The exchange protocol: every operation that crosses one of the runtime's channels, with its fields, declared once.

Two channels carry it, both authenticated (:mod:`mpca.runtime.channel`: an HMAC handshake, JSON headers, raw
arrays; nothing is unpickled):

* **the agent's channel** — the driver's exchange and control tasks ask an agent (:data:`AGENT_OPS`): ``claim``
  (its answer is the agent's report), ``deliver``, ``join``, ``yield``, ``holdout``, ``stop``, and ``hello`` (the
  report alone);
* **the parameter service** — an agent asks the driver (:data:`SERVICE_OPS`): ``poll`` and ``leave`` (an agent on
  a decommissioning executor), ``join`` (a replacement's model), and the algorithm's own request (e.g. ``easgd``:
  :data:`ALGORITHM_REQUEST`'s fields, the agent's counters beside them, the rest the driver rule's ``serve`` checks).

A sender builds a header with :func:`header` (a field the operation does not declare is a bug: ValueError); a
receiver checks every header with :func:`check` before it acts on it (an unknown operation, a missing field or
one of another type is refused with one line, answered as an error on the channel).  No torch: the exchange tasks'
modules import this one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Tuple

Types = Tuple[type, ...]
INT: Types = (int,)
NUMBER: Types = (int, float)
TEXT: Types = (str,)
FLAG: Types = (bool,)
ITEMS: Types = (list,)
MAP: Types = (dict,)
NONE = type(None)


@dataclass(frozen=True)
class Operation:
    """One request: its ``name``, the fields it must carry and those it may carry (each with the JSON types it
    takes); ``open``: other fields may ride along (an algorithm's request carries the agent's counters)."""

    name: str
    required: Mapping[str, Types] = field(default_factory=dict)
    optional: Mapping[str, Types] = field(default_factory=dict)
    open: bool = False

    def fields(self) -> Dict[str, Types]:
        return {**self.required, **self.optional}


def _ops(*ops: Operation) -> Dict[str, Operation]:
    return {op.name: op for op in ops}


CYCLE = {"cycle": INT + (NONE,), "params": MAP}  # the cycle's sequence number and the algorithm's parameters

AGENT_OPS: Dict[str, Operation] = _ops(
    Operation("hello"),  # the agent's report (a ping: the runtime's tasks get it with their claim)
    Operation("claim", {"token": TEXT}, {"for": TEXT}),  # one task per agent per job: the first token wins
    Operation("deliver", {"shard": INT}, CYCLE),  # the broadcast shard (payload: encoded in the wire format)
    Operation("join", {}, {"shard": INT + (NONE,), **CYCLE}),  # a replacement: the whole joint model, exact
    Operation("yield", {"shard": INT}, {**CYCLE, "counted": ITEMS + (NONE,), "rejoin": FLAG,
                                        "timeout_s": NUMBER, "broadcasts": FLAG}),  # its shard and weight τ (the
    # reply's payload); broadcasts: the cycle hands it a broadcast too (a lock-step agent waits for it, mpca.exchange.lock_step)
    Operation("holdout", {}, {"up_to": INT}),  # its holdout rows' hashes, or its rows up to a hash
    Operation("stop"),
)

SERVICE_OPS: Dict[str, Operation] = _ops(
    Operation("poll", {"agent": INT}),  # whether to leave (its executor is being decommissioned)
    Operation("leave", {"agent": INT}, {"shards": ITEMS, "weights": ITEMS, "extras": ITEMS}),  # + its hand-in
    Operation("join", {"agent": INT}, {"attempt": INT, "rebuilt_other": FLAG}),  # the service's current model
)

ALGORITHM_REQUEST = Operation("*", {"agent": INT, "n": INT}, open=True)  # easgd, rudra, …: a vector of n values


def _of(value: Any, types: Types) -> bool:
    if isinstance(value, bool) and bool not in types:  # JSON true is no number
        return False
    return isinstance(value, types)


def header(ops: Mapping[str, Operation], op: str, **fields: Any) -> Dict[str, Any]:
    """The header of request ``op`` with ``fields``, every one declared for it (a sender's bug otherwise; an
    algorithm's own request is built by :meth:`mpca.algorithm.base.ServiceAgent.call_service`, not here)."""
    spec = ops.get(op)
    if spec is None:
        raise ValueError(f"unknown op {op!r}")
    unknown = sorted(set(fields) - set(spec.fields()))
    if unknown:
        raise ValueError(f"op {op!r} has no field(s) {unknown}")
    return {"op": op, **fields}


def check(ops: Mapping[str, Operation], header: Mapping[str, Any], algorithm_ops: bool = False) -> Operation:
    """The declared operation of a received ``header``, checked: a known op (any other name is an algorithm's
    request where ``algorithm_ops``), every required field present, every declared field of its type, no undeclared
    field.  ValueError (one line) otherwise."""
    op = header.get("op")
    if not isinstance(op, str):
        raise ValueError(f"a request without an op: {sorted(header)}")
    spec = ops.get(op)
    if spec is None:
        if not algorithm_ops:
            raise ValueError(f"unknown op {op!r}")
        spec = ALGORITHM_REQUEST
    missing = sorted(set(spec.required) - set(header))
    if missing:
        raise ValueError(f"op {op!r} lacks field(s) {missing}")
    declared = spec.fields()
    for name, value in header.items():
        if name == "op":
            continue
        if name not in declared:
            if spec.open:
                continue
            raise ValueError(f"op {op!r} has no field {name!r}")
        if not _of(value, declared[name]):
            raise ValueError(f"op {op!r}: field {name!r} is {type(value).__name__}, not "
                             f"{' or '.join(t.__name__ for t in declared[name])}")
    return spec


__all__ = ["AGENT_OPS", "ALGORITHM_REQUEST", "Operation", "SERVICE_OPS", "check", "header"]
