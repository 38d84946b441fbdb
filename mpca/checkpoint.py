"""Checkpoints of the joint model and the driver's state (the paper's DumpModel, §5.3).

A checkpoint is two files in the checkpoint directory (a local path or a
filesystem URI — ``hdfs://``, ``s3a://``, ``abfss://``, ``dbfs:/`` … through the
cluster's own Hadoop FileSystem while Spark runs, else pyarrow; see :mod:`mpca.storage`):

* ``ckpt-<cycle>.pt``: ``torch.save`` of tensors and plain values only (the
  algorithm's name and its driver rule's ``state_dict`` — for MPCA the joint
  shards x̃, trajectories ṽ and reduction counts —, the next cycle, the
  driver's model ``state_dict``, with a lossy wire format the driver's
  error-feedback residuals), loaded back with ``weights_only=True`` so
  nothing but tensors is ever unpickled;
* ``ckpt-<cycle>.json``: its manifest with the SHA-256 of the data file.

Both are written atomically (temporary name, fsync on local disks, rename);
the manifest goes last, so a manifest always names a complete data file, and
:func:`latest` returns the newest checkpoint whose checksum matches.
"""
from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import re
import time
from dataclasses import dataclass
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch

from mpca import storage
from mpca.errors import UserError
from mpca.storage import Store, open_store

FORMAT = 2
MANIFEST_NAME = re.compile(r"ckpt-(\d+)\.json$")


@dataclass
class Checkpoint:
    cycle: int  # the next cycle to run
    algorithm: str
    driver_state: Dict[str, Any]  # the algorithm's DriverRule.state_dict()
    model_state: Dict[str, torch.Tensor]
    layout: List[Tuple[str, int, str]]  # (name, numel, dtype) of the exchanged tensors
    shards: int
    wall_s: float
    path: str = ""
    pending: Optional[Dict[str, Any]] = None  # a reduction received but not staged yet (the pipeline's)
    wire: Optional[Dict[str, Any]] = None  # the driver's error-feedback residuals (lossy wire formats)
    cycle_times: Optional[List[float]] = None  # the last cycles' durations (the cycle deadline's, the bounded wait's)


def due(cycles: int, every_cycles: int, since_last_s: float, every_seconds: Optional[float]) -> bool:
    """Whether a checkpoint is due after ``cycles`` cycles of the run: every ``every_cycles``-th, or once
    ``every_seconds`` have passed since the last one (the run's start before the first) — a run whose cycles are
    slow, or whose driver is restarted more often than it runs ``every_cycles`` cycles, still gets them."""
    return cycles % every_cycles == 0 or (every_seconds is not None and since_last_s >= every_seconds)


def check_location(location: str) -> None:
    """Fail now, with one line, when a checkpoint URI names no filesystem this machine can reach."""
    storage.check_location(location)


def save(location: str, ckpt: Checkpoint, keep: int = 3) -> str:
    store = open_store(location)
    store.makedirs()
    store.sweep_temporaries()
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "cycle": ckpt.cycle, "algorithm": ckpt.algorithm, "driver_state": ckpt.driver_state,
                "pending": ckpt.pending, "wire": ckpt.wire, "cycle_times": ckpt.cycle_times,
                "model_state": ckpt.model_state,
                "layout": [list(x) for x in ckpt.layout], "shards": ckpt.shards, "wall_s": ckpt.wall_s}, buf)
    data = buf.getvalue()
    name = f"ckpt-{ckpt.cycle:08d}"
    store.write_atomic(f"{name}.pt", data)
    manifest = {"format": FORMAT, "cycle": ckpt.cycle, "data": f"{name}.pt", "sha256": hashlib.sha256(data).hexdigest(),
                "bytes": len(data), "written_at": time.time()}
    store.write_atomic(f"{name}.json", json.dumps(manifest).encode())
    # retention: keep the newest `keep` checkpoints
    cycles = sorted(int(m.group(1)) for m in map(MANIFEST_NAME.match, store.list()) if m)
    for old in cycles[:-keep]:
        store.delete(f"ckpt-{old:08d}.json")
        store.delete(f"ckpt-{old:08d}.pt")
    return store.path(f"{name}.pt")


def read_manifest(store: Store, manifest_name: str) -> Optional[Checkpoint]:
    try:
        manifest = json.loads(store.read(manifest_name))
        data = store.read(manifest["data"])
    except (OSError, ValueError, KeyError):
        return None
    if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
        return None
    state = torch.load(io.BytesIO(data), weights_only=True)
    if state.get("format") != FORMAT:
        return None  # written by another version of mpca
    return Checkpoint(cycle=int(state["cycle"]), algorithm=str(state["algorithm"]), driver_state=state["driver_state"],
                      pending=state.get("pending"), wire=state.get("wire"), cycle_times=state.get("cycle_times"),
                      model_state=state["model_state"],
                      layout=[tuple(x) for x in state["layout"]], shards=int(state["shards"]),
                      wall_s=float(state["wall_s"]), path=store.path(manifest["data"]))


def latest(location: str) -> Optional[Checkpoint]:
    """The newest checkpoint in ``location`` whose data matches its checksum (None if there is none)."""
    store = open_store(location)
    names = sorted((n for n in store.list() if MANIFEST_NAME.match(n)), reverse=True)
    for n in names:
        ck = read_manifest(store, n)
        if ck is not None:
            return ck
    return None


def load_model_state(path: str) -> Dict[str, torch.Tensor]:
    """A model ``state_dict`` from a final ``model.pt`` or from a checkpoint (file or directory)."""
    if os.path.isdir(path) or ("://" in path and not path.endswith((".pt", ".json"))):
        ck = latest(path)
        if ck is None:
            raise UserError(f"init_from {path!r}: no valid checkpoint there")
        return ck.model_state
    if not os.path.exists(path) and "://" not in path:
        raise UserError(f"init_from {path!r} does not exist; give a previous run's model.pt or checkpoint directory")
    store = open_store(os.path.dirname(path) or ".")
    try:
        state = torch.load(io.BytesIO(store.read(os.path.basename(path))), weights_only=True)
    except Exception as e:  # noqa: BLE001
        raise UserError(f"init_from {path!r} is not a model state_dict or checkpoint: {e}") from None
    if isinstance(state, dict) and "model_state" in state and "format" in state:
        return state["model_state"]
    if isinstance(state, dict) and all(isinstance(v, torch.Tensor) for v in state.values()):
        return state
    raise UserError(f"init_from {path!r} holds neither a state_dict nor an mpca checkpoint")


class BackgroundSaver:
    """Writes checkpoints in a thread (one at a time; a checkpoint due while one is written is skipped)."""

    def __init__(self, location: Optional[str], keep: int):
        self.location, self.keep = location, keep
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None
        self.written: collections.deque = collections.deque(maxlen=keep)  # the last ones (those kept)

    def write(self, ckpt: Checkpoint) -> None:
        """Write now, after any checkpoint still being written."""
        self.close()
        self.written.append(save(self.location, ckpt, self.keep))

    def submit(self, ckpt: Checkpoint) -> None:
        if self.error is not None:
            raise self.error
        if self._thread is not None and self._thread.is_alive():
            return

        def work():
            try:
                self.written.append(save(self.location, ckpt, self.keep))
            except BaseException as e:  # noqa: BLE001 - re-raised on the next submit
                self.error = e

        self._thread = threading.Thread(target=work, name="mpca-checkpoint", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join()
