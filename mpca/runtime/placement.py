"""Where a Python task runs: executor id, agent socket names, resource addresses."""
from __future__ import annotations

import glob
import os
import re
from typing import List, Optional

SOCKET_PATTERN = "mpca-{run}-agent-{agent}.sock"


def executor_id() -> str:
    """The executor this Python worker belongs to.

    Python's TaskContext has no executor id; the worker's cwd is
    ``<work>/<app-id>/<executor-id>`` on standalone/local-cluster (``<work>/<app-id>/<executor-id>/<session>``
    for a Spark Connect session's tasks), and
    ``SPARK_LOG_URL_STDERR`` carries ``executorId=`` on YARN.
    """
    url = os.environ.get("SPARK_LOG_URL_STDERR", "")
    m = re.search(r"executorId=([^&/]+)", url)
    if m:
        return m.group(1)
    cwd = os.getcwd()
    base, parent = os.path.basename(cwd), os.path.basename(os.path.dirname(cwd))
    if base.isdigit():
        return base
    # a Spark Connect session's tasks run in a directory of their session inside the executor's
    return parent if parent.isdigit() else f"local:{cwd}"


def agent_socket(run_id: str, agent: int) -> str:
    """Relative path (in the executor's work dir, short enough for the 108-byte limit)."""
    return SOCKET_PATTERN.format(run=run_id, agent=agent)


def agent_sockets_here(run_id: str) -> List[str]:
    return sorted(glob.glob(SOCKET_PATTERN.format(run=run_id, agent="*")))


def agent_of_socket(path: str) -> Optional[int]:
    m = re.search(r"-agent-(\d+)\.sock$", path)
    return int(m.group(1)) if m else None
