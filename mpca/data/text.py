"""A real text corpus on every machine, with no download: the Python standard library's own source files.

The running interpreter's library directory (``sysconfig``'s ``stdlib`` path, without ``site-packages``) holds
~1,800 ``.py`` files, ~31 MB of text that nobody here wrote (CPython 3.11). :class:`TextCorpus` turns them into
fixed-length windows of bytes for a next-token language model:

- **tokens** are the files' bytes (a vocabulary of 256; UTF-8 text stays as its bytes);
- **a window** is ``window + 1`` consecutive bytes of one file, never across two: its first ``window`` bytes are
  the features, its last ``window`` the labels (each position's next byte); windows do not overlap, a file's
  tail shorter than a window is dropped;
- **the split is by file**: a file is in the holdout when the hash of its path relative to the library
  directory (SHA-256 with the seed) falls below ``holdout``, so no holdout text is ever in training, whatever
  the window; the same interpreter gives the same split on every machine;
- ``max_mb`` takes a deterministic subset of whole files (in the order of their hashes) of at most that many MB.

Rows are Arrow lists of int16 (``features``, ``label``): Spark's ``array<smallint>``; the agents read them as
float32 tensors (exact for every byte) and :class:`mpca.models.ByteTransformer` embeds them as integers.
"""
from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from mpca.errors import UserError

VOCAB = 256  # byte tokens
SKIPPED_DIRS = ("site-packages", "dist-packages", "__pycache__")


def stdlib_root() -> str:
    """The running interpreter's standard-library directory."""
    return sysconfig.get_paths()["stdlib"]


def corpus_files(root: str, suffix: str = ".py") -> List[str]:
    """Every ``suffix`` file under ``root`` (relative paths, sorted), leaving out installed packages and caches."""
    found = []
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        found += [os.path.relpath(os.path.join(here, f), root) for f in files if f.endswith(suffix)]
    return sorted(found)


def file_fraction(relpath: str, seed: int) -> float:
    """A file's place in [0, 1): SHA-256 of the seed and its relative path (``/``-separated on every OS)."""
    digest = hashlib.sha256(f"{seed}:{relpath.replace(os.sep, '/')}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


def windows(data: bytes, window: int) -> Tuple[np.ndarray, np.ndarray]:
    """A file's bytes as (features, labels), each (n, ``window``) int16: window i holds bytes
    ``i·window … i·window + window − 1`` and their next bytes ``i·window + 1 … i·window + window``."""
    n = (len(data) - 1) // window
    if n <= 0:
        return np.zeros((0, window), np.int16), np.zeros((0, window), np.int16)
    tokens = np.frombuffer(data, dtype=np.uint8)[:n * window + 1].astype(np.int16)
    return tokens[:n * window].reshape(n, window), tokens[1:n * window + 1].reshape(n, window)


@dataclass
class TextCorpus:
    """The byte windows of a directory's text files, split into training and holdout by file (module doc).

    ``root`` None: the running interpreter's standard library."""

    root: Optional[str] = None
    window: int = 128
    holdout: float = 0.1
    max_mb: Optional[float] = None
    seed: int = 0
    suffix: str = ".py"
    _files: Optional[Dict[str, List[str]]] = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.window < 2:
            raise UserError(f"a text window holds at least 2 tokens, got {self.window}")
        if not 0.0 <= self.holdout < 1.0:
            raise UserError(f"the holdout share of files lies in [0, 1), got {self.holdout}")
        if self.max_mb is not None and self.max_mb <= 0:
            raise UserError(f"max_mb must be positive, got {self.max_mb}")

    @property
    def directory(self) -> str:
        return self.root or stdlib_root()

    def files(self) -> Dict[str, List[str]]:
        """``{"train": [...], "holdout": [...]}``: the relative paths on each side (within ``max_mb``)."""
        if self._files is not None:
            return self._files
        root = self.directory
        if not os.path.isdir(root):
            raise UserError(f"text corpus directory {root!r} does not exist; give a directory of {self.suffix} "
                            "files (data.text.root) or leave it unset for the Python standard library")
        names = corpus_files(root, self.suffix)
        if not names:
            raise UserError(f"text corpus directory {root!r} holds no {self.suffix} files; give a directory of "
                            f"text files (data.text.root, data.text.suffix)")
        if self.max_mb is not None:  # whole files in the order of their hashes, up to the budget
            budget, kept = self.max_mb * 1e6, []
            for name in sorted(names, key=lambda n: file_fraction(n, self.seed + 1)):
                size = os.path.getsize(os.path.join(root, name))
                if budget - size < 0 and kept:
                    break
                kept.append(name)
                budget -= size
            names = sorted(kept)
        self._files = {"train": [], "holdout": []}
        for name in names:
            self._files["holdout" if file_fraction(name, self.seed) < self.holdout else "train"].append(name)
        if not self._files["train"]:
            raise UserError(f"text corpus {root!r}: every file fell in the holdout; lower data.holdout or add files")
        return self._files

    def arrays(self, side: str) -> Tuple[np.ndarray, np.ndarray]:
        """(features, labels) of one side (``train`` or ``holdout``), each (rows, window) int16."""
        xs, ys = [], []
        for name in self.files()[side]:
            with open(os.path.join(self.directory, name), "rb") as f:
                x, y = windows(f.read(), self.window)
            xs.append(x)
            ys.append(y)
        if not xs:
            return np.zeros((0, self.window), np.int16), np.zeros((0, self.window), np.int16)
        return np.concatenate(xs), np.concatenate(ys)

    def table(self, side: str):
        """One side as an Arrow table: ``features`` and ``label``, both ``list<int16>`` of ``window`` values."""
        import pyarrow as pa

        x, y = self.arrays(side)
        offsets = pa.array(np.arange(len(x) + 1, dtype=np.int32) * np.int32(self.window))
        return pa.table({"features": pa.ListArray.from_arrays(offsets, pa.array(x.ravel())),
                         "label": pa.ListArray.from_arrays(offsets, pa.array(y.ravel()))})

    def describe(self) -> dict:
        """Files, bytes and windows of each side (what ``mpca data pytext`` prints and writes)."""
        out = {"root": self.directory, "window": self.window, "holdout": self.holdout, "seed": self.seed}
        for side, names in self.files().items():
            sizes = [os.path.getsize(os.path.join(self.directory, n)) for n in names]
            out[side] = {"files": len(names), "bytes": int(sum(sizes)),
                         "windows": int(sum(max(0, (s - 1) // self.window) for s in sizes))}
        return out

    def write_parquet(self, path: str) -> dict:
        """``path/train/part-0.parquet``, ``path/holdout/part-0.parquet`` and ``path/files.json`` (each side's
        files); returns :meth:`describe`."""
        import json

        import pyarrow.parquet as pq

        for side in ("train", "holdout"):
            os.makedirs(os.path.join(path, side), exist_ok=True)
            pq.write_table(self.table(side), os.path.join(path, side, "part-0.parquet"))
        summary = self.describe()
        with open(os.path.join(path, "files.json"), "w") as f:
            json.dump({**summary, "files": self.files()}, f, indent=1)
        return summary
