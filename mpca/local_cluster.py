"""The ``local-cluster[K,C,MB]`` master string (K executors of C cores and MB megabytes on this machine):
parsed here once for the configuration, the session factory, the cluster checks and the benchmarks."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

_PATTERN = re.compile(r"local-cluster\[(\d+),(\d+),(\d+)\]")


@dataclass(frozen=True)
class LocalCluster:
    executors: int
    cores: int
    memory_mb: int

    @property
    def master(self) -> str:
        return f"local-cluster[{self.executors},{self.cores},{self.memory_mb}]"


def parse_local_cluster(master: Optional[str]) -> Optional[LocalCluster]:
    """``local-cluster[K,C,MB]`` (spaces allowed) as its three numbers; None for any other master."""
    m = _PATTERN.fullmatch((master or "").replace(" ", ""))
    return LocalCluster(*(int(g) for g in m.groups())) if m else None
