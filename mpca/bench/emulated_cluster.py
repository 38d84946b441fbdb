"""The emulated cluster as the package sees it: the environment of a command inside it, and its link rates.

The emulated cluster itself (network namespaces, links limited with ``tc``, a Spark standalone master and
workers) is a lab tool of the repository, ``lab/netcluster.py``: it needs root, ``ip`` and ``tc``, runs from
a checkout as ``python -m lab.netcluster`` and is not installed with mpca.  The package never imports it;
the interface is

* the environment of the command it runs on its driver host: ``MPCA_SPARK_MASTER`` (the standalone master),
  ``MPCA_DRIVER_HOST`` (the driver's address), ``MPCA_NETWORK`` (the link) and more (lab/netcluster.py lists
  them); :func:`session_in_cluster` builds a SparkSession from them;
* the link grammar, :func:`rate_bits` (``100mbit``, ``1gbit``, ``none``), which lab/netcluster.py imports;
* the process: :func:`run_inside` runs a command inside a new emulated cluster when a checkout's
  lab/netcluster.py is at hand and this machine can host it, and otherwise says why not.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from mpca.errors import UserError
from mpca.runtime.cluster import AGENT_SLOT, AGENT_TASK_MAX_FAILURES

MASTER = "MPCA_SPARK_MASTER"  # spark://<driver-ip>:7077 inside an emulated cluster, unset elsewhere
DRIVER_HOST = "MPCA_DRIVER_HOST"  # the driver host's address
NETWORK = "MPCA_NETWORK"  # the link of every host, e.g. 100mbit
HARNESS = ("lab", "netcluster.py")  # the emulated cluster: a file of the repository's checkout, not installed
NEEDS = ("a repository checkout's lab/netcluster.py (python -m lab.netcluster), run as root with ip and tc; "
         "it is not installed with mpca")
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def rate_bits(link: str) -> int:
    """``"100mbit"`` -> 100_000_000 bit/s; ``"none"`` -> 0 (no limit).  A bad rate is a :class:`UserError`."""
    s = str(link).strip().lower()
    if s in ("none", "off", "unlimited", "0"):
        return 0
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)", s)
    if not m:
        raise UserError(f"bad link rate {link!r} (use 1gbit, 100mbit, none or e.g. 500mbit)")
    bits = int(float(m.group(1)) * {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)])
    if bits < 8000:
        raise UserError(f"link rate {link!r} is too low (at least 8kbit)")
    return bits


def inside() -> bool:
    """Does this process run inside an emulated cluster (its command, or a process it started)?"""
    return bool(os.environ.get(MASTER))


def session_in_cluster(app_name: str, conf: Optional[Dict[str, str]] = None):
    """A SparkSession on the master of the emulated cluster this process runs in (``$MPCA_SPARK_MASTER``, set
    by lab/netcluster.py for its command), ready for mpca agents (an agent's task may fail
    :data:`~mpca.runtime.cluster.AGENT_TASK_MAX_FAILURES` times, as in mpca's own sessions, unless ``conf``
    says otherwise); None outside one."""
    master = os.environ.get(MASTER)
    if not master:
        return None
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master(master).appName(app_name)
         .config("spark.driver.host", os.environ[DRIVER_HOST])
         .config(f"spark.executor.resource.{AGENT_SLOT}.amount", "1").config("spark.ui.enabled", "false")
         .config("spark.pyspark.python", sys.executable)
         .config("spark.sql.execution.arrow.pyspark.enabled", "true"))
    for key, value in {"spark.task.maxFailures": str(AGENT_TASK_MAX_FAILURES), **(conf or {})}.items():
        b = b.config(key, value)
    return b.getOrCreate()


def checkout() -> Optional[str]:
    """The root of a repository checkout with lab/netcluster.py: the one this mpca runs from (an editable
    install or ``python -m`` at its root), else one whose ``lab`` is on ``sys.path``; None for an installed
    wheel.  Found by its files, never imported."""
    roots = [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec(HARNESS[0])  # locates the package, runs none of it
        roots += [os.path.dirname(p) for p in (spec.submodule_search_locations or [])] if spec else []
    for root in roots:
        if all(os.path.isfile(os.path.join(root, HARNESS[0], f)) for f in ("__init__.py", HARNESS[1])):
            return root
    return None


def _harness(root: str) -> List[str]:
    """The command line of the checkout's lab/netcluster.py: this interpreter runs that very file (``-m lab...``
    would take a ``lab`` of the working directory first)."""
    return [sys.executable, os.path.join(root, *HARNESS)]


def can_host(root: str) -> Tuple[bool, str]:
    """(True, "") when the checkout's lab/netcluster.py can build a cluster on this machine, else (False, its
    one line saying why); asked as a process (``--check``)."""
    try:
        p = subprocess.run([*_harness(root), "--check"], capture_output=True, text=True, timeout=180,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"cannot run {os.path.join(root, *HARNESS)} --check ({e})"
    if p.returncode == 0:
        return True, ""
    lines = (p.stderr or p.stdout).strip().splitlines()
    return False, lines[-1].removeprefix("netcluster: ") if lines else f"netcluster --check: status {p.returncode}"


def harness_argv(root: str, workers: int, link: str, command: Sequence[str], cores: int = 2,
                 memory_mb: int = 1024) -> List[str]:
    """lab/netcluster.py's command line for ``command`` on ``workers`` hosts of ``cores`` cores and ``memory_mb``
    MB with ``link`` on every port."""
    return [*_harness(root), "--workers", str(int(workers)), "--link", str(link), "--cores", str(int(cores)),
            "--memory-mb", str(int(memory_mb)), "-q", "--", *command]


def run_inside(workers: int, link: str, command: Sequence[str], replace: bool = True, cores: int = 2,
               memory_mb: int = 1024) -> Tuple[Optional[int], str]:
    """Run ``command`` inside a new emulated cluster of ``workers`` worker hosts with ``link`` on every port and
    ``cores`` cores and ``memory_mb`` MB per worker (the run's ``local-cluster[K,C,MB]``), where this machine
    can: ``python lab/netcluster.py --workers W --link L --cores C --memory-mb MB -q -- COMMAND`` of a checkout.

    ``replace``: this process becomes lab/netcluster.py (``os.execv``: same process, so SIGTERM, SIGHUP and
    Ctrl-C reach its own handler, which stops the command and tears the cluster down); does not return when it
    can run.  Otherwise it runs as a child in its own session, these signals forwarded to it, and the result
    is (its exit status, "").  Where it cannot run: (None, one line saying why)."""
    root = checkout()
    if root is None:
        return None, f"the emulated network needs {NEEDS}"
    ok, why = can_host(root)
    if not ok:
        return None, why
    argv = harness_argv(root, workers, link, command, cores, memory_mb)
    if replace:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, argv)
    p = subprocess.Popen(argv, start_new_session=True)  # Ctrl-C reaches it once: forwarded from here

    def forward(signum, frame):
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signum)

    old = {}
    try:
        with contextlib.suppress(ValueError):  # not the main thread: nothing to forward from here
            old = {s: signal.signal(s, forward) for s in _SIGNALS}
        rc = p.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return (128 - rc if rc < 0 else rc), ""
