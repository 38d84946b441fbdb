"""A Spark Connect run's directory (``cluster.connect_dir``/<run id>): what the client, the coordinator task and
the agent tasks tell each other through storage that all three reach — a local path on one machine, a Databricks
volume, a cloud bucket (:mod:`mpca.storage`).

Every file is small JSON written atomically (a reader never sees half of one), except the final model:

* ``coordinator.json`` — the coordinator's address, its parameter service and the algorithm's rendezvous;
* ``agent-<id>.json`` — where agent ``id`` listens for the coordinator (host, port) and its process;
  a replacement overwrites its predecessor's;
* ``row-<n>.json`` — the n-th history row (an evaluation of the joint model) and the progress at that point;
* ``agents-ended.json`` — the client's word that the agents' job ended, and why;
* ``stop.json`` — the client asks the run to stop after the current cycle;
* ``client.json`` — the client's heartbeat: when it last said it is there;
* ``failed.json`` — the coordinator's error (its one line, and whether it is the user's to fix);
* ``note-<origin>-<ns>.json`` — a warning for the user: one of the coordinator's log records at WARNING or above,
  or why an agent's task ended early (a refused or failed start); the client logs each once, as a classic
  driver's log would have shown it;
* ``result.json`` and ``model.pt`` — the run's result and the final model's ``state_dict``.

No secret is ever written here: the channels authenticate with the run's secret, which travels only inside the
Spark tasks' closures, so whoever can write this directory can at most make an agent fail to reach its
coordinator, never talk to it.
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Any, Dict, Iterable, List, Optional, Set

from mpca.storage import Store, open_store

COORDINATOR = "coordinator.json"
AGENTS_ENDED = "agents-ended.json"
STOP = "stop.json"
CLIENT = "client.json"
FAILED = "failed.json"
RESULT = "result.json"
MODEL = "model.pt"
NOTE_PREFIX = "note-"


def reachable_host() -> str:
    """This process's address as other hosts of the cluster reach it: Spark's own ``SPARK_LOCAL_IP`` where set
    (what the executor's block manager binds), else the address of the host's name."""
    ip = os.environ.get("SPARK_LOCAL_IP")
    if ip:
        return ip
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class RunDir:
    """One run's directory in ``cluster.connect_dir``."""

    def __init__(self, location: str):
        self.location = location
        self.store: Store = open_store(location)

    def create(self) -> "RunDir":
        self.store.makedirs()
        return self

    # -- JSON files ----------------------------------------------------------------------
    def write(self, name: str, value: Dict[str, Any]) -> None:
        self.store.write_atomic(name, json.dumps(value, default=str).encode())

    def read(self, name: str) -> Optional[Dict[str, Any]]:
        """The file's JSON object, or None while it is not there."""
        try:
            data = self.store.read(name)
        except (FileNotFoundError, OSError):
            return None
        value = json.loads(data)
        if not isinstance(value, dict):
            raise ValueError(f"{self.location}/{name}: not a JSON object")
        return value

    def names(self) -> List[str]:
        try:
            return self.store.list()
        except (FileNotFoundError, OSError):
            return []

    def wait_for(self, name: str, timeout_s: float, poll_s: float = 0.2) -> Optional[Dict[str, Any]]:
        """The file's JSON object once it is there, or None after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.read(name)
            if value is not None or time.monotonic() > deadline:
                return value
            time.sleep(poll_s)

    # -- the agents' announcements -----------------------------------------------------------
    def announce_agent(self, agent: int, host: str, port: int, attempt: int) -> None:
        self.write(f"agent-{agent}.json", {"agent": agent, "host": host, "port": port, "pid": os.getpid(),
                                          "attempt": attempt, "at": time.time()})

    def agents(self) -> Dict[int, Dict[str, Any]]:
        """Every agent's latest announcement, by agent id."""
        out = {}
        for name in self.names():
            if name.startswith("agent-") and name.endswith(".json"):
                value = self.read(name)
                if value is not None:
                    out[int(value["agent"])] = value
        return out

    # -- history rows ----------------------------------------------------------------------
    def write_row(self, n: int, row: Dict[str, Any]) -> None:
        self.write(f"row-{n:07d}.json", row)

    def row_count(self) -> int:
        """How many history rows are there (their names only: none is read)."""
        return sum(1 for name in self.names() if name.startswith("row-") and name.endswith(".json"))

    def rows_from(self, n: int, names: Optional[Iterable[str]] = None) -> List[Dict[str, Any]]:
        """The history rows from the n-th on, in order, as far as they are there without a gap (``names``: the
        directory's listing, where the caller has one)."""
        names = self.names() if names is None else names
        there = sorted(int(name[4:11]) for name in names if name.startswith("row-") and name.endswith(".json"))
        out = []
        for i in there:
            if i < n:
                continue
            if i != n + len(out):
                break
            value = self.read(f"row-{i:07d}.json")
            if value is None:
                break
            out.append(value)
        return out

    # -- notes for the user ------------------------------------------------------------------
    def write_note(self, origin: str, level: int, message: str) -> None:
        """A warning for the user from ``origin`` (``coordinator``, ``agent 1``), at a ``logging`` level."""
        key = "".join(c if c.isalnum() else "_" for c in origin)
        self.write(f"{NOTE_PREFIX}{key}-{time.time_ns()}.json",
                   {"origin": origin, "level": int(level), "message": message, "at": time.time()})

    def new_notes(self, seen: Set[str], names: Optional[Iterable[str]] = None) -> List[Dict[str, Any]]:
        """The notes not in ``seen`` (their file names, added to it), oldest first."""
        names = self.names() if names is None else names
        out = []
        for name in sorted(n for n in names if n.startswith(NOTE_PREFIX) and n.endswith(".json") and n not in seen):
            value = self.read(name)
            if value is not None:
                seen.add(name)
                out.append(value)
        return sorted(out, key=lambda v: v.get("at", 0.0))
