"""An emulated cluster on one machine: a driver "host" and N worker "hosts" on one switch.

    python -m lab.netcluster --workers 2 --link 100mbit [--cores 2] [--memory-mb 1024] -- CMD [ARGS...]
    python -m lab.netcluster --cleanup-stale          # remove leftovers of crashed runs
    python -m lab.netcluster --check                  # can this machine do it? (exit 0 / 2)

A lab tool of the repository (run from a checkout; not installed with mpca).

Every host is a Linux network namespace with its own hostname (own UTS namespace), its own
``/etc/hosts`` naming the cluster (private mount namespace) and an ``eth0`` on a bridge in the
root namespace.  The bridge has no address, so the cluster reaches nothing else and nothing
reaches it.  ``--link`` limits every host's port with ``tc tbf`` on both ends of its veth
(uplink and downlink, like full-duplex ports on a non-blocking switch; incast to the driver is
bottlenecked at the driver's port).  There is no latency or loss emulation (no netem here).

A Spark standalone master runs in the driver's namespace, one worker in each worker namespace;
workers offer the ``agentslot`` resource (amount 1) that mpca pins its agents with.  CMD runs in
the driver's namespace with::

    MPCA_SPARK_MASTER=spark://<driver-ip>:7077   MPCA_DRIVER_HOST=<driver-ip>   SPARK_LOCAL_IP=<driver-ip>
    MPCA_NETWORK=<link>   MPCA_NETCLUSTER_WORKERS=N   PYSPARK_PYTHON=<this interpreter>
    MPCA_NETCLUSTER_PREFIX=<prefix>   MPCA_NETCLUSTER_HOSTS=driver=<ip>,w1=<ip>,...

These variables are the interface to mpca: :mod:`mpca.bench.emulated_cluster` builds a SparkSession from them
(``session_in_cluster``) and ``mpca bench compare --network`` runs itself inside this tool as a process; the
link grammar (``rate_bits``) is the package's.

Afterwards everything is torn down (Spark processes, namespaces, veths, bridge, qdiscs, temp
files), also after Ctrl-C, SIGTERM, SIGHUP or a failure; the exit status is CMD's (128+N when
CMD died of signal N or this tool was stopped by signal N, 124 on ``--timeout``, 1 when the
cluster did not come up, 2 when this machine cannot host it: not root, tools missing).

Names carry a per-invocation prefix ``mpca<pid><letter>`` (namespaces ``<prefix>-driver``,
``<prefix>-w1``..., bridge ``<prefix>br``, veths ``<prefix>v0``...; state in
``$TMPDIR/mpca-netcluster-<prefix>/`` with an ``owner`` file), so concurrent runs never collide
and ``--cleanup-stale`` can tell leftovers (owner gone) from live clusters.

As a library::

    from lab.netcluster import NetCluster, available
    ok, why = available()
    with NetCluster(workers=2, link="1gbit") as nc:
        rc = nc.run_in_driver([sys.executable, "train.py"])
        tx, rx = nc.driver_link_bytes()
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from mpca.bench.emulated_cluster import DRIVER_HOST, MASTER, NETWORK, rate_bits
from mpca.errors import MpcaError, UserError
from mpca.runtime.cluster import AGENT_SLOT  # the resource mpca pins its agents with (one agent per executor)

MASTER_PORT = 7077
MASTER_UI_PORT = 8080
WORKER_UI_PORT = 8081
PREFIX_RE = re.compile(r"^mpca[0-9a-z]{1,10}$")
_NS_RE = re.compile(r"^(mpca[0-9a-z]{1,10})-(driver|w\d+)$")
_LINK_RE = re.compile(r"^(mpca\d+[a-z]?)(br|v\d+)$")
_STATE_GLOB = "mpca-netcluster-mpca*"
_IFNAMSIZ = 15
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_used_prefixes: set = set()


class NetClusterError(MpcaError):
    """The emulated cluster could not be built or did not come up (one line, no traceback in the CLI)."""


class NetClusterUnavailable(NetClusterError):
    """This machine cannot host an emulated cluster (not root, tools or kernel support missing)."""


class Stopped(BaseException):
    """A signal (SIGINT, SIGTERM, SIGHUP) asked this process to stop; see :func:`handle_signals`."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


# ----------------------------------------------------------------------------------------------- helpers


def _tool(name: str) -> Optional[str]:
    path = os.environ.get("PATH", os.defpath) + os.pathsep + "/usr/sbin:/sbin:/usr/bin:/bin"
    return shutil.which(name, path=path)


def _proc_start_time(pid: int) -> Optional[str]:
    """The start time of process ``pid`` (field 22 of /proc/PID/stat), None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _set_pdeathsig() -> None:  # preexec_fn: the child gets SIGTERM when this process dies (even by SIGKILL)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except Exception:
        pass


def _run(argv: Sequence[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise NetClusterError(f"'{' '.join(argv)}' did not finish within {timeout:.0f} s") from None
    except OSError as e:
        raise NetClusterError(f"cannot run '{argv[0]}': {e}") from None
    if check and p.returncode != 0:
        err = (p.stderr or p.stdout).strip().splitlines()
        raise NetClusterError(f"'{' '.join(argv)}' failed (status {p.returncode}): {err[-1] if err else ''}")
    return p


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _stop_popen(p: subprocess.Popen, first: int = signal.SIGTERM, grace: float = 5.0) -> None:
    """Stop a child started in its own session: ``first`` to its process group, SIGKILL after ``grace`` s."""
    if p.poll() is None:
        _kill_group(p.pid, first)
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    _kill_group(p.pid, signal.SIGKILL)  # stragglers of the group, even when the leader already left
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(5)


@contextlib.contextmanager
def handle_signals() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into a :class:`Stopped` exception (so ``with NetCluster`` tears down)."""
    def raise_stopped(signum, frame):
        raise Stopped(signum)

    old = {s: signal.signal(s, raise_stopped) for s in _SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[List[int]]:
    """While tearing down, signals are noted, not acted on (a second Ctrl-C must not leave half a cluster)."""
    got: List[int] = []
    try:
        old = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in _SIGNALS}
    except ValueError:  # not the main thread: nothing to defer
        yield got
        return
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ----------------------------------------------------------------------------------------------- availability


@functools.lru_cache(maxsize=1)
def available() -> Tuple[bool, str]:
    """(True, "") when this machine can host an emulated cluster, else (False, one line saying why)."""
    uid = os.geteuid()
    if uid != 0:
        return False, (f"needs root for network namespaces (running as uid {uid}); use local-cluster instead")
    missing = [t for t in ("ip", "tc", "unshare", "mount", "hostname") if _tool(t) is None]
    if missing:
        return False, f"missing tools: {', '.join(missing)} (install iproute2 and util-linux); use local-cluster instead"
    if not os.path.exists("/proc/self/ns/net"):
        return False, "this kernel has no network namespaces; use local-cluster instead"
    # build a bridge, a veth pair and a tbf qdisc in a throw-away namespace (gone when the shell exits)
    probe = ("ip link add nc0 type bridge && ip link add nc1 type veth peer name nc2 && "
             "tc qdisc add dev nc1 root tbf rate 100mbit burst 32kb latency 10ms")
    try:
        p = subprocess.run([_tool("unshare"), "--net", "--", "/bin/sh", "-c", probe], capture_output=True,
                           text=True, timeout=20, stdin=subprocess.DEVNULL,
                           env={**os.environ, "PATH": os.path.dirname(_tool("ip")) + os.pathsep
                                + os.environ.get("PATH", os.defpath)})
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"cannot probe network namespaces ({e}); use local-cluster instead"
    if p.returncode != 0:
        err = (p.stderr or p.stdout).strip().splitlines()
        return False, (f"network namespaces, bridges, veths or tbf unsupported here "
                       f"({err[-1] if err else 'status %d' % p.returncode}); use local-cluster instead")
    p = subprocess.run([_tool("ip"), "netns", "list"], capture_output=True, text=True, timeout=20)
    if p.returncode != 0:
        return False, f"'ip netns' does not work here ({p.stderr.strip()}); use local-cluster instead"
    return True, ""


def _spark_home() -> str:
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise NetClusterError("pyspark is not installed in this interpreter")
    home = list(spec.submodule_search_locations)[0]
    if not os.path.exists(os.path.join(home, "bin", "spark-class")):
        raise NetClusterError(f"{home}/bin/spark-class not found (pyspark installation incomplete)")
    return home


# ----------------------------------------------------------------------------------------------- the cluster


class NetCluster:
    """A driver host and ``workers`` worker hosts as network namespaces on a bridge, with a Spark
    standalone master (driver) and one worker per worker host.  A context manager: ``__enter__``
    returns when every worker registered with the master, ``__exit__`` removes everything.

    Attributes: ``master_url``, ``driver_ip``, ``link``, ``prefix``, ``hosts`` (name -> IP, driver first),
    ``worker_names``, ``spark_pids`` (master and worker JVMs), ``state_dir``.  With ``decommission`` the
    workers have ``spark.decommission.enabled``: SIGPWR to one decommissions it and its executors gracefully, as a
    spot instance's notice (the application needs the setting too).
    """

    def __init__(self, workers: int, link: str = "none", cores: int = 2, memory_mb: int = 1024,
                 prefix: Optional[str] = None, *, subnet: str = "10.200.0", start_timeout: float = 120.0,
                 spark: bool = True, log_dir: Optional[str] = None, quiet: bool = True,
                 decommission: bool = False):
        if not 1 <= int(workers) <= 200:
            raise NetClusterError(f"workers must be 1..200, got {workers}")
        if int(cores) < 1 or int(memory_mb) < 256:
            raise NetClusterError(f"need cores >= 1 and memory_mb >= 256 (got {cores}, {memory_mb})")
        if not re.fullmatch(r"\d{1,3}\.\d{1,3}\.\d{1,3}", subnet):
            raise NetClusterError(f"subnet must look like 10.200.0 (a /24), got {subnet!r}")
        self.workers = int(workers)
        self.link = str(link).strip().lower()
        try:
            self.bits = rate_bits(self.link)  # the package's link grammar (mpca.bench.emulated_cluster)
        except UserError as e:
            raise NetClusterError(str(e)) from None
        self.cores = int(cores)
        self.memory_mb = int(memory_mb)
        self.start_timeout = float(start_timeout)
        self.with_spark = bool(spark)
        self.decommission = bool(decommission)  # workers decommission gracefully on SIGPWR (and their executors)
        self.log_dir = log_dir
        self.quiet = quiet
        self._requested_prefix = prefix
        if prefix is not None and not PREFIX_RE.match(prefix):
            raise NetClusterError(f"prefix must match {PREFIX_RE.pattern} (got {prefix!r})")
        self.prefix = prefix or ""
        self.hosts: Dict[str, str] = {"driver": f"{subnet}.1"}
        for k in range(1, self.workers + 1):
            self.hosts[f"w{k}"] = f"{subnet}.{k + 1}"
        self.worker_names = [f"w{k}" for k in range(1, self.workers + 1)]
        self.driver_ip = self.hosts["driver"]
        self.master_url = f"spark://{self.driver_ip}:{MASTER_PORT}"
        self.state_dir = ""
        self.spark_pids: List[int] = []
        self._daemons: List[Tuple[str, subprocess.Popen, str]] = []  # (name, process, log path)
        self._children: List[subprocess.Popen] = []
        # a worker started later (replace_worker) is started from this long-lived thread: its processes get
        # SIGTERM when the *thread* that started them ends (PR_SET_PDEATHSIG), so a caller's short-lived thread
        # (a timer) would take its fresh worker down a second after it registered
        self._spawner: Optional[ThreadPoolExecutor] = None  # made on __enter__, shut down on close
        self._created = False
        self._up = False

    # names
    def ns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def _veth(self, i: int) -> str:
        return f"{self.prefix}v{i}"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    def _pick_prefix(self) -> str:
        if self._requested_prefix:
            return self._requested_prefix
        existing = set(_list_netns()) | set(_list_links())
        for letter in "abcdefghijklmnopqrstuvwxyz":
            p = f"mpca{os.getpid()}{letter}"
            taken = p in _used_prefixes or os.path.exists(_state_dir_of(p)) or any(
                n.startswith(p + "-") or n == p + "br" or re.fullmatch(re.escape(p) + r"v\d+", n) for n in existing)
            if not taken:
                return p
        raise NetClusterError(f"26 clusters of process {os.getpid()} exist already; tear some down")

    # lifecycle
    def __enter__(self) -> "NetCluster":
        ok, why = available()
        if not ok:
            raise NetClusterUnavailable(why)
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netcluster-spawn")
        try:
            self._create_network()
            if self.with_spark:
                self._start_spark()
            self._up = True
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _say(self, msg: str) -> None:
        if not self.quiet:
            print(f"netcluster: {msg}", file=sys.stderr, flush=True)

    def _create_network(self) -> None:
        self.prefix = self._pick_prefix()
        _used_prefixes.add(self.prefix)
        if len(self._veth(self.workers)) > _IFNAMSIZ or len(self.bridge) > _IFNAMSIZ:
            raise NetClusterError(f"prefix {self.prefix!r} too long for {self.workers} workers "
                                  f"(interface names are at most {_IFNAMSIZ} characters)")
        if _list_owned(self.prefix):
            raise NetClusterError(f"leftovers named {self.prefix}* exist; run with --cleanup-stale")
        # the state directory and its owner file come first: from here on, a crash leaves a stale-detectable run
        self.state_dir = _state_dir_of(self.prefix)
        os.makedirs(self.state_dir, mode=0o755)
        os.chmod(self.state_dir, 0o755)
        with open(os.path.join(self.state_dir, "owner"), "w") as f:
            f.write(f"{os.getpid()} {_proc_start_time(os.getpid())}\n")
        self._created = True
        with open(os.path.join(self.state_dir, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n")
            for name, ip in self.hosts.items():
                f.write(f"{ip} {name}\n")
        open(os.path.join(self.state_dir, "resolv.conf"), "w").close()  # no DNS inside the cluster
        for name in ("hosts", "resolv.conf"):
            os.chmod(os.path.join(self.state_dir, name), 0o644)

        ip, tc = _tool("ip"), _tool("tc")
        br = self.bridge
        _run([ip, "link", "add", br, "type", "bridge"])
        _run([ip, "link", "set", br, "type", "bridge", "nf_call_iptables", "0", "nf_call_ip6tables", "0",
              "nf_call_arptables", "0"], check=False)
        _write_sysctl(f"net/ipv6/conf/{br}/disable_ipv6", "1")
        _run([ip, "link", "set", br, "up"])
        for i, (name, addr) in enumerate(self.hosts.items()):
            ns, hv = self.ns(name), self._veth(i)
            _run([ip, "netns", "add", ns])
            _run([ip, "netns", "exec", ns, _tool("sysctl") or "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                  "net.ipv6.conf.default.disable_ipv6=1"], check=False)
            _run([ip, "link", "add", hv, "type", "veth", "peer", "name", "eth0", "netns", ns])
            _write_sysctl(f"net/ipv6/conf/{hv}/disable_ipv6", "1")
            _run([ip, "link", "set", hv, "master", br])
            _run([ip, "-n", ns, "link", "set", "lo", "up"])
            _run([ip, "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"])
            _run([ip, "link", "set", hv, "up"])
            _run([ip, "-n", ns, "link", "set", "eth0", "up"])
            if self.bits:
                burst = str(max(32768, int(self.bits / 8 * 0.002)))  # 2 ms of the rate, at least 32 KiB
                tbf = ["root", "tbf", "rate", f"{self.bits}bit", "burst", burst, "latency", "10ms"]
                _run([tc, "-n", ns, "qdisc", "replace", "dev", "eth0", *tbf])  # uplink: host -> switch
                _run([tc, "qdisc", "replace", "dev", hv, *tbf])                # downlink: switch -> host
        self._say(f"network {self.prefix}: " + ", ".join(f"{n} {a}" for n, a in self.hosts.items())
                  + f" on bridge {br}, link {self.link}")

    def host_argv(self, host: str, argv: Sequence[str]) -> List[str]:
        """The argv that runs ``argv`` on ``host`` (its namespace, hostname and /etc/hosts)."""
        if host not in self.hosts:
            raise NetClusterError(f"no host {host!r} (hosts: {', '.join(self.hosts)})")
        enter = ('set -e; name=$1; hosts=$2; resolv=$3; shift 3; hostname "$name"; '
                 'if [ -e /etc/hosts ]; then mount --bind "$hosts" /etc/hosts; fi; '
                 'if [ -e /etc/resolv.conf ]; then mount --bind "$resolv" /etc/resolv.conf 2>/dev/null || true; fi; '
                 'exec "$@"')
        return [_tool("ip"), "netns", "exec", self.ns(host), _tool("unshare"), "--mount", "--uts", "--",
                "/bin/sh", "-c", enter, "netcluster-enter", host, os.path.join(self.state_dir, "hosts"),
                os.path.join(self.state_dir, "resolv.conf"), *argv]

    def popen_in(self, host: str, argv: Sequence[str], env: Optional[dict] = None, **kw) -> subprocess.Popen:
        """Start ``argv`` on ``host`` in its own session (stopped, with its process group, at teardown)."""
        if not self._created:
            raise NetClusterError("the cluster is not up")
        full_env = dict(os.environ)
        full_env.update(env or {})
        kw.setdefault("stdin", subprocess.DEVNULL)
        p = subprocess.Popen(self.host_argv(host, argv), env=full_env, start_new_session=True,
                             preexec_fn=_set_pdeathsig, **kw)
        self._children.append(p)
        return p

    def command_env(self) -> Dict[str, str]:
        """The environment variables a command in the driver namespace gets."""
        return {
            MASTER: self.master_url,
            DRIVER_HOST: self.driver_ip,
            NETWORK: self.link,
            "MPCA_NETCLUSTER_WORKERS": str(self.workers),
            "MPCA_NETCLUSTER_PREFIX": self.prefix,
            "MPCA_NETCLUSTER_HOSTS": ",".join(f"{n}={a}" for n, a in self.hosts.items()),
            "SPARK_LOCAL_IP": self.driver_ip,
            "PYSPARK_PYTHON": sys.executable,
        }

    def spark_conf(self, executor_memory_mb: Optional[int] = None) -> Dict[str, str]:
        """Spark settings for a driver in the driver namespace: one executor per worker, each with an agentslot."""
        mem = executor_memory_mb or self.memory_mb
        return {
            "spark.master": self.master_url,
            "spark.driver.host": self.driver_ip,
            "spark.driver.bindAddress": self.driver_ip,
            "spark.pyspark.python": sys.executable,
            "spark.executor.cores": str(self.cores),
            "spark.executor.memory": f"{min(mem, self.memory_mb)}m",
            f"spark.executor.resource.{AGENT_SLOT}.amount": "1",
        }

    def run_in_driver(self, argv: Sequence[str], env: Optional[dict] = None, timeout: Optional[float] = None,
                      stdout=None, stderr=None, cwd: Optional[str] = None) -> int:
        """Run ``argv`` in the driver namespace with :meth:`command_env` (plus ``env``); return its exit
        status (128+N when it died of signal N, 124 when it ran past ``timeout`` seconds and was killed).
        A :class:`Stopped` or KeyboardInterrupt while waiting forwards that signal to the command first."""
        full_env = self.command_env()
        full_env.update(env or {})
        p = self.popen_in("driver", list(argv), env=full_env, stdout=stdout, stderr=stderr, cwd=cwd)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            _stop_popen(p, signal.SIGTERM, grace=5.0)
            return 124
        except BaseException as e:
            sig = e.signum if isinstance(e, Stopped) else signal.SIGINT
            with _signals_deferred():
                _stop_popen(p, sig, grace=5.0)
            raise
        return 128 - rc if rc < 0 else rc

    # Spark
    def _log(self, name: str) -> str:
        return os.path.join(self.state_dir, "logs", f"{name}.log")

    def _spark_daemon(self, host: str, name: str, cls: str, args: List[str], extra_env: Dict[str, str]) -> None:
        home = self._spark_home
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.update({
            "SPARK_HOME": home,
            "SPARK_CONF_DIR": os.path.join(self.state_dir, "conf"),
            "SPARK_LOCAL_IP": self.hosts[host],
            "SPARK_DAEMON_MEMORY": "512m",
            "SPARK_DAEMON_JAVA_OPTS": "-XX:-UsePerfData",
            "PYSPARK_PYTHON": sys.executable,
        })
        env.update(extra_env)
        log = self._log(name)
        with open(log, "ab") as out:
            p = self.popen_in(host, ["/bin/bash", os.path.join(home, "bin", "spark-class"), cls, *args],
                              env=env, stdout=out, stderr=subprocess.STDOUT)
        self._children.remove(p)
        self._daemons.append((name, p, log))
        self.spark_pids.append(p.pid)

    def _start_spark(self) -> None:
        self._spark_home = _spark_home()
        if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
            raise NetClusterError("java not found (Spark needs Java 17+ on PATH or JAVA_HOME)")
        for d in ("logs", "conf", "work", "local"):
            os.makedirs(os.path.join(self.state_dir, d), exist_ok=True)
        script = os.path.join(self.state_dir, f"{AGENT_SLOT}_discover.sh")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\necho '{{\"name\":\"{AGENT_SLOT}\",\"addresses\":[\"0\"]}}'\n")
        os.chmod(script, 0o755)
        master_conf = os.path.join(self.state_dir, "conf", "master.conf")
        with open(master_conf, "w") as f:
            f.write("spark.master.rest.enabled false\nspark.ui.showConsoleProgress false\n")
        worker_conf = os.path.join(self.state_dir, "conf", "worker.conf")
        with open(worker_conf, "w") as f:
            f.write(f"spark.worker.resource.{AGENT_SLOT}.amount 1\n"
                    f"spark.worker.resource.{AGENT_SLOT}.discoveryScript {script}\n"
                    "spark.worker.cleanup.enabled false\n" +
                    ("spark.decommission.enabled true\n" if self.decommission else ""))
        deadline = time.monotonic() + self.start_timeout
        self._spark_daemon("driver", "master", "org.apache.spark.deploy.master.Master",
                           ["--host", self.driver_ip, "--port", str(MASTER_PORT), "--webui-port", str(MASTER_UI_PORT),
                            "--properties-file", master_conf], {})
        # workers start once the master listens: a worker whose first registration fails retries only 5-15 s later
        self._wait_master(lambda st: st.get("status") == "ALIVE", "the Spark master", deadline)
        for name in self.worker_names:
            self._start_worker(name)
        self._wait_master(self._registered(self.worker_names), f"{self.workers} Spark worker(s)", deadline)
        self._say(f"up {self.prefix}: master {self.master_url}, {self.workers} worker(s) x {self.cores} core(s) "
                  f"x {self.memory_mb} MB with {AGENT_SLOT}, link {self.link}; spark pids "
                  + ",".join(map(str, self.spark_pids)))

    def _start_worker(self, name: str) -> None:
        self._spark_daemon(name, f"worker-{name}", "org.apache.spark.deploy.worker.Worker",
                           [self.master_url, "--host", self.hosts[name], "--cores", str(self.cores),
                            "--memory", f"{self.memory_mb}M", "--webui-port", str(WORKER_UI_PORT),
                            "--work-dir", os.path.join(self.state_dir, "work", name),
                            "--properties-file", os.path.join(self.state_dir, "conf", "worker.conf")],
                           {"SPARK_LOCAL_DIRS": os.path.join(self.state_dir, "local", name)})

    def _registered(self, names: Sequence[str], besides: Sequence[str] = ()):
        """A test of the master's state: a worker of each host in ``names`` is ALIVE with the agent slot (and
        is none of the worker ids in ``besides``)."""
        want = {self.hosts[n] for n in names}

        def registered(st: dict) -> bool:
            alive = {w.get("host") for w in st.get("workers", []) if w.get("state") == "ALIVE"
                     and AGENT_SLOT in (w.get("resources") or {}) and w.get("id") not in besides}
            return want <= alive

        return registered

    def replace_worker(self, name: str, timeout_s: float = 120.0) -> float:
        """The cluster manager's side of a lost node (a spot instance taken back after its notice): the worker
        of host ``name`` stopped (its JVM and executors, SIGTERM then SIGKILL) and a fresh one started on the same
        host, as a new node with the old one's address; returns once the master has it ALIVE (seconds taken)."""
        t0 = time.monotonic()
        before = [w.get("id") for w in self.master_state().get("workers", []) if w.get("host") == self.hosts[name]]
        for daemon in [d for d in self._daemons if d[0] == f"worker-{name}"]:
            _, p, _ = daemon
            if p.poll() is None:
                _kill_group(p.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5.0)
            _stop_popen(p, signal.SIGKILL, grace=0.0)
            self._daemons.remove(daemon)
        self._spawner.submit(self._start_worker, name).result()
        self._wait_master(self._registered([name], besides=before), f"a fresh Spark worker on {name}",
                          time.monotonic() + timeout_s)
        return time.monotonic() - t0

    def master_state(self, timeout: float = 5.0) -> dict:
        """The master's JSON status (``http://<driver-ip>:8080/json/``), fetched from inside the driver namespace."""
        fetch = ("import sys, urllib.request as u\n"
                 "o = u.build_opener(u.ProxyHandler({}))\n"
                 "sys.stdout.write(o.open(sys.argv[1], timeout=float(sys.argv[2])).read().decode())\n")
        url = f"http://{self.driver_ip}:{MASTER_UI_PORT}/json/"
        p = _run([_tool("ip"), "netns", "exec", self.ns("driver"), sys.executable, "-I", "-S", "-c", fetch, url,
                  str(timeout)], check=False, timeout=timeout + 15)
        if p.returncode != 0:
            err = p.stderr.strip().splitlines()
            raise NetClusterError(err[-1] if err else f"status {p.returncode}")
        return json.loads(p.stdout)

    def _wait_master(self, cond, what: str, deadline: float) -> dict:
        last = "no answer yet"
        while True:
            for name, p, log in self._daemons:
                if p.poll() is not None:
                    raise NetClusterError(f"Spark {name} exited with status {p.returncode} while starting: "
                                          f"{_log_hint(log)}")
            try:
                st = self.master_state(timeout=3.0)
                if cond(st):
                    return st
                last = (f"master {st.get('status')}, alive workers "
                        f"{[w.get('host') for w in st.get('workers', []) if w.get('state') == 'ALIVE']}")
            except (NetClusterError, ValueError) as e:
                last = str(e)
            if time.monotonic() >= deadline:
                hints = "; ".join(f"{n}: {_log_hint(log)}" for n, _, log in self._daemons)
                raise NetClusterError(f"{what} did not come up within {self.start_timeout:.0f} s "
                                      f"(last: {last}); {hints}")
            time.sleep(0.5)

    # measurements
    def link_bytes(self, host: str) -> Tuple[int, int]:
        """(tx_bytes, rx_bytes) of ``host``'s eth0."""
        p = _run([_tool("ip"), "-n", self.ns(host), "-j", "-s", "link", "show", "dev", "eth0"])
        st = json.loads(p.stdout)[0]
        stats = st.get("stats64") or st.get("stats")
        return int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])

    def driver_link_bytes(self) -> Tuple[int, int]:
        """(tx_bytes, rx_bytes) of the driver's eth0 (its port on the switch), for link-utilisation figures."""
        return self.link_bytes("driver")

    def set_link(self, host: str, up: bool) -> None:
        """Cut ``host``'s port on the switch (its veth's root end down: nothing passes either way, as when its
        cable is pulled) or restore it."""
        i = list(self.hosts).index(host)
        _run([_tool("ip"), "link", "set", self._veth(i), "up" if up else "down"])

    def host_of(self, pid: int) -> Optional[str]:
        """The host whose network namespace process ``pid`` runs in (None: none of this cluster's, or gone)."""
        try:
            inode = os.stat(f"/proc/{pid}/ns/net").st_ino
        except (FileNotFoundError, ProcessLookupError):
            return None
        for host in self.hosts:
            try:
                if os.stat(f"/run/netns/{self.ns(host)}").st_ino == inode:
                    return host
            except FileNotFoundError:
                continue
        return None

    def describe(self) -> str:
        limit = (f"{self.link} per port, both directions (tc tbf)" if self.bits else "unlimited (no qdisc)")
        spark = (f"Spark standalone master {self.master_url}, {self.cores} core(s) and {self.memory_mb} MB per "
                 f"worker, {AGENT_SLOT} x1" if self.with_spark else "no Spark")
        return (f"emulated cluster {self.prefix or '(not up)'}: driver {self.driver_ip} + {self.workers} worker "
                f"host(s) ({', '.join(f'{n} {self.hosts[n]}' for n in self.worker_names)}) as network namespaces "
                f"on one bridge; link {limit}; no latency/loss emulation; {spark}")

    # teardown
    def close(self) -> List[str]:
        """Tear everything down (idempotent); returns what could not be removed (normally nothing)."""
        if not self._created:
            return []
        with _signals_deferred():
            t0 = time.monotonic()
            for p in self._children:
                _stop_popen(p, signal.SIGTERM, grace=3.0)
            self._children.clear()
            daemons = list(self._daemons)
            for _, p, _ in daemons:  # all at once: workers stop their executors, then the master
                if p.poll() is None:
                    _kill_group(p.pid, signal.SIGTERM)
            end = time.monotonic() + 5.0
            for _, p, _ in daemons:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(max(0.0, end - time.monotonic()))
            for _, p, _ in daemons:
                _stop_popen(p, signal.SIGKILL, grace=0.0)
            if self.log_dir and self.state_dir and os.path.isdir(os.path.join(self.state_dir, "logs")):
                with contextlib.suppress(OSError):
                    os.makedirs(self.log_dir, exist_ok=True)
                    for f in glob.glob(os.path.join(self.state_dir, "logs", "*.log")):
                        shutil.copy(f, os.path.join(self.log_dir, f"{self.prefix}-{os.path.basename(f)}"))
            left = _remove_prefix(self.prefix, names=[self.ns(h) for h in self.hosts])
            if not left:
                _used_prefixes.discard(self.prefix)
            self._daemons.clear()
            if self._spawner is not None:
                self._spawner.shutdown(wait=False)
            self._created = self._up = False
            if left:
                print(f"netcluster: warning: could not remove {', '.join(left)}", file=sys.stderr, flush=True)
            self._say(f"down {self.prefix} in {time.monotonic() - t0:.1f} s")
            return left


def _log_hint(log: str) -> str:
    """The most telling line of a Spark log (the last ERROR/Exception line, else the last line)."""
    try:
        with open(log, errors="replace") as f:
            lines = [ln.strip() for ln in f.readlines()[-400:] if ln.strip()]
    except OSError:
        return "no log"
    for ln in reversed(lines):
        if "ERROR" in ln or "Exception" in ln or "Error:" in ln:
            return ln[:300]
    return lines[-1][:300] if lines else "empty log"


def _write_sysctl(key: str, value: str) -> None:
    with contextlib.suppress(OSError):
        with open(f"/proc/sys/{key}", "w") as f:
            f.write(value)


def _state_dir_of(prefix: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"mpca-netcluster-{prefix}")


def _list_netns() -> List[str]:
    ip = _tool("ip")
    if not ip:
        return []
    p = subprocess.run([ip, "netns", "list"], capture_output=True, text=True, timeout=20)
    return [ln.split()[0] for ln in p.stdout.splitlines() if ln.strip()]


def _list_links() -> List[str]:
    ip = _tool("ip")
    if not ip:
        return []
    p = subprocess.run([ip, "-o", "link", "show"], capture_output=True, text=True, timeout=20)
    out = []
    for ln in p.stdout.splitlines():
        parts = ln.split(": ", 2)
        if len(parts) >= 2:
            out.append(parts[1].split("@")[0])
    return out


def _owned(prefix: str, name: str) -> bool:
    return name.startswith(prefix + "-") or name == prefix + "br" or bool(re.fullmatch(re.escape(prefix) + r"v\d+", name))


def _list_owned(prefix: str) -> List[str]:
    return [n for n in _list_netns() + _list_links() if _owned(prefix, n)]


def _remove_prefix(prefix: str, names: Sequence[str] = ()) -> List[str]:
    """Remove every namespace (and the processes in it), veth and bridge named after ``prefix`` and its
    state directory; bounded in time.  Returns what is still there afterwards."""
    ip = _tool("ip")
    existing = _list_netns()
    namespaces = sorted(n for n in existing if n.startswith(prefix + "-") or n in names)
    # every process inside the cluster's namespaces: SIGTERM, then SIGKILL (bounded: 3 s, then 5 s)
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        pids = _netns_pids(namespaces)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        end = time.monotonic() + wait
        while pids and time.monotonic() < end:
            time.sleep(0.1)
            pids = [p for p in _netns_pids(namespaces) if not _is_zombie(p)]
        if not pids:
            break
    links = [n for n in _list_links() if _owned(prefix, n)]
    for dev in sorted(links, key=lambda n: n.endswith("br")):  # veths first (deletes both ends), bridge last
        with contextlib.suppress(NetClusterError):
            _run([ip, "link", "del", dev], check=False)
    for ns in namespaces:
        with contextlib.suppress(NetClusterError):
            _run([ip, "netns", "del", ns], check=False)
    state = _state_dir_of(prefix)
    if os.path.isdir(state):
        shutil.rmtree(state, ignore_errors=True)
    left = _list_owned(prefix) + ([state] if os.path.exists(state) else [])
    return left


def _netns_pids(namespaces: Sequence[str]) -> List[int]:
    ip = _tool("ip")
    pids: List[int] = []
    for ns in namespaces:
        p = subprocess.run([ip, "netns", "pids", ns], capture_output=True, text=True, timeout=20)
        pids += [int(x) for x in p.stdout.split() if x.isdigit() and int(x) != os.getpid()]
    return pids


# ----------------------------------------------------------------------------------------------- stale runs


def _owner_alive(prefix: str) -> Optional[bool]:
    """Is the process that created ``prefix`` still running?  None when that cannot be told."""
    try:
        with open(os.path.join(_state_dir_of(prefix), "owner")) as f:
            pid_s, start = (f.read().split() + ["", ""])[:2]
        pid = int(pid_s)
        now = _proc_start_time(pid)
        return now is not None and (start in ("", "None") or now == start)
    except (OSError, ValueError):
        pass
    m = re.fullmatch(r"mpca(\d+)[a-z]?", prefix)
    if m:
        return _proc_start_time(int(m.group(1))) is not None
    return None


def stale_prefixes() -> Dict[str, Optional[bool]]:
    """Every ``mpca`` prefix with something left on this machine -> whether its owner is alive (None: unknown)."""
    prefixes = set()
    for n in _list_netns():
        m = _NS_RE.match(n)
        if m:
            prefixes.add(m.group(1))
    for n in _list_links():
        m = _LINK_RE.match(n)
        if m:
            prefixes.add(m.group(1))
    for d in glob.glob(os.path.join(tempfile.gettempdir(), _STATE_GLOB)):
        p = os.path.basename(d)[len("mpca-netcluster-"):]
        if PREFIX_RE.match(p):
            prefixes.add(p)
    return {p: _owner_alive(p) for p in sorted(prefixes)}


def cleanup_stale(say=print) -> Tuple[List[str], List[str]]:
    """Remove the leftovers of runs whose owner process is gone.  Returns (removed prefixes, failures)."""
    removed, failed = [], []
    for prefix, alive in stale_prefixes().items():
        if alive:
            continue
        if alive is None:
            say(f"netcluster: skipping {prefix}: its owner cannot be told (no owner file, no pid in the name)")
            continue
        left = _remove_prefix(prefix)
        if left:
            failed.append(f"{prefix} ({', '.join(left)})")
        else:
            removed.append(prefix)
    return removed, failed


# ----------------------------------------------------------------------------------------------- command


def _parse(argv: List[str]) -> Tuple[argparse.Namespace, List[str]]:
    if "--" in argv:
        i = argv.index("--")
        own, command = argv[:i], argv[i + 1:]
    else:
        own, command = argv, []
    ap = argparse.ArgumentParser(
        prog="python -m lab.netcluster",
        description="Run a command on an emulated cluster (network namespaces, rate-limited links, Spark "
                    "standalone master in the driver namespace, one worker per worker namespace).",
        epilog="example: python -m lab.netcluster --workers 2 --link 100mbit -- python train.py")
    ap.add_argument("--workers", type=int, default=2, help="worker hosts (default 2)")
    ap.add_argument("--link", default="none", help="per-port rate limit: 1gbit, 100mbit or none (default none)")
    ap.add_argument("--cores", type=int, default=2, help="cores per Spark worker (default 2)")
    ap.add_argument("--memory-mb", type=int, default=1024, help="memory per Spark worker in MB (default 1024)")
    ap.add_argument("--prefix", default=None, help="name prefix (default mpca<pid><letter>)")
    ap.add_argument("--start-timeout", type=float, default=120.0,
                    help="seconds for the master and workers to come up (default 120)")
    ap.add_argument("--timeout", type=float, default=None, help="kill the command after this many seconds (exit 124)")
    ap.add_argument("--log-dir", default=None, help="keep the Spark master/worker logs here")
    ap.add_argument("--no-spark", action="store_true", help="only the network (no Spark master/workers)")
    ap.add_argument("--cleanup-stale", action="store_true",
                    help="first remove leftovers of crashed runs (mpca* namespaces/bridges whose owner is gone)")
    ap.add_argument("--check", action="store_true", help="only say whether this machine can host the cluster")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    args = ap.parse_args(own)
    if not command and not (args.cleanup_stale or args.check):
        ap.error("no command: put it after '--' (or use --cleanup-stale / --check alone)")
    return args, command


def main(argv: Optional[List[str]] = None) -> int:
    args, command = _parse(list(sys.argv[1:] if argv is None else argv))
    ok, why = available()
    if not ok:
        print(f"netcluster: {why}", file=sys.stderr, flush=True)
        return 2
    if args.check:
        print("netcluster: this machine can host an emulated cluster", file=sys.stderr, flush=True)
        return 0
    cluster = None
    if command:
        try:  # bad options: one line, status 2
            cluster = NetCluster(args.workers, args.link, args.cores, args.memory_mb, args.prefix,
                                 start_timeout=args.start_timeout, spark=not args.no_spark, log_dir=args.log_dir,
                                 quiet=args.quiet)
        except NetClusterError as e:
            print(f"netcluster: {e}", file=sys.stderr, flush=True)
            return 2
    stopped: Optional[int] = None
    with handle_signals():
        try:
            if args.cleanup_stale:
                removed, failed = cleanup_stale(say=lambda m: print(m, file=sys.stderr, flush=True))
                print(f"netcluster: removed {len(removed)} stale cluster(s)"
                      + (f": {', '.join(removed)}" if removed else "")
                      + (f"; could not remove {'; '.join(failed)}" if failed else ""), file=sys.stderr, flush=True)
                if cluster is None:
                    return 1 if failed else 0
            with cluster:
                return cluster.run_in_driver(command, timeout=args.timeout)
        except Stopped as e:
            stopped = e.signum
        except KeyboardInterrupt:
            stopped = signal.SIGINT
        except NetClusterError as e:
            print(f"netcluster: {e}", file=sys.stderr, flush=True)
            return 2 if isinstance(e, NetClusterUnavailable) else 1
    print(f"netcluster: stopped by {signal.Signals(stopped).name}; emulated cluster torn down", file=sys.stderr,
          flush=True)
    return 128 + stopped


if __name__ == "__main__":
    sys.exit(main())
