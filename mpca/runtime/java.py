"""The Java a local Spark will start, checked before it starts: the two most common set-up mistakes on Spark
hosts are a ``JAVA_HOME`` without ``bin/java`` and a Java older than the installed pyspark needs.

PySpark's launcher (``spark-class``) runs ``$JAVA_HOME/bin/java`` when ``JAVA_HOME`` is set and ``java`` from
``PATH`` otherwise; this module finds the same binary, asks it for its version and turns each mistake into
one :class:`~mpca.errors.UserError` line naming the problem and the fix (instead of PySpark's
``JAVA_GATEWAY_EXITED`` and a traceback).
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from typing import Optional, Tuple

from mpca.errors import UserError

INSTALL_HINT = "install Java 17 (e.g. apt-get install openjdk-17-jre-headless)"


def required_java(pyspark_version: str) -> int:
    """The oldest Java major version a pyspark release runs on: 17 for Spark 4, 8 for Spark 3.5 (8/11/17)."""
    major = int(pyspark_version.split(".")[0])
    return 17 if major >= 4 else 8


def java_major(version_output: str) -> Optional[int]:
    """The major version in ``java -version``'s output: ``"1.8.0_392"`` → 8 (the old scheme), ``"17.0.15"`` → 17,
    ``"21"`` → 21; None when it names none."""
    m = re.search(r'version "(\d+)(?:\.(\d+))?[^"]*"', version_output)
    if m is None:
        return None
    first, second = int(m.group(1)), m.group(2)
    return int(second) if first == 1 and second is not None else first


def java_binary(java_home: Optional[str], path_lookup=shutil.which) -> Tuple[str, str]:
    """``(binary, where it came from)`` the way spark-class picks it, or a UserError when there is none."""
    if java_home:
        binary = os.path.join(java_home, "bin", "java")
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise UserError(f"JAVA_HOME={java_home!r} has no executable bin/java: point JAVA_HOME at a Java "
                            f"installation (the directory holding bin/java) or unset it to use java from PATH")
        return binary, f"JAVA_HOME={java_home}"
    binary = path_lookup("java")
    if binary is None:
        raise UserError(f"no Java found for the local Spark cluster (JAVA_HOME unset, no java on PATH): "
                        f"{INSTALL_HINT} or set JAVA_HOME")
    return binary, "PATH"


@functools.lru_cache(maxsize=8)
def _version_output(binary: str) -> str:
    try:
        p = subprocess.run([binary, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UserError(f"{binary} -version failed ({e}): {INSTALL_HINT} and point JAVA_HOME at it") from None
    return p.stderr + p.stdout


def check_java(pyspark_version: Optional[str] = None) -> int:
    """Raise one UserError line unless the Java a local Spark would start exists and is new enough for the
    installed pyspark; returns its major version."""
    if pyspark_version is None:
        import pyspark

        pyspark_version = pyspark.__version__
    binary, source = java_binary(os.environ.get("JAVA_HOME"))
    major = java_major(_version_output(binary))
    if major is None:
        raise UserError(f"{binary} (from {source}) did not report a Java version: {INSTALL_HINT} and point "
                        "JAVA_HOME at it")
    need = required_java(pyspark_version)
    if major < need:
        raise UserError(f"{binary} (from {source}) is Java {major}, but pyspark {pyspark_version} needs Java "
                        f"{need} or newer: {INSTALL_HINT} and set JAVA_HOME to it")
    return major
