"""Where checkpoints, models and job outputs are written: a local directory, or a filesystem URI.

:func:`open_store` picks the backend:

* a local path (no ``scheme://``): the local disk, written with fsync;
* a URI while this driver has a classic SparkContext: the cluster's own Hadoop ``FileSystem`` through the
  driver's JVM — whatever the cluster is configured for (``hdfs://``, ``s3a://``, ``abfss://``,
  ``dbfs:/``, ``viewfs://``, ``file://``), with its credentials, and no libhdfs to set up;
* a URI without Spark: pyarrow's filesystems (``file://``, ``s3://``, ``gs://``, ``hdfs://`` with libhdfs).

Every store writes atomically: a temporary name, then a rename, so a reader never sees half a file.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import List, Optional

from mpca.errors import UserError


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Store:
    """A directory: ``write_atomic``, ``read``, ``list``, ``delete`` of names inside it."""

    def __init__(self, location: str):
        self.location = location

    def path(self, name: str) -> str:
        return f"{self.location.rstrip('/')}/{name}"

    def tmp_name(self, name: str) -> str:
        return f".{name}.tmp-{os.getpid()}"

    def sweep_temporaries(self) -> None:
        """Remove temporaries of writers that died mid-write (kill -9): local disks only, dead processes only."""


class LocalStore(Store):
    def makedirs(self) -> None:
        try:
            os.makedirs(self.location, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot create directory {self.location!r}: {e.strerror or e}") from None

    def write_atomic(self, name: str, data: bytes) -> None:
        final, tmp = self.path(name), self.path(self.tmp_name(name))
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        dfd = os.open(self.location, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def read(self, name: str) -> bytes:
        with open(self.path(name), "rb") as f:
            return f.read()

    def list(self) -> List[str]:
        return os.listdir(self.location) if os.path.isdir(self.location) else []

    def delete(self, name: str) -> None:
        try:
            os.remove(self.path(name))
        except OSError:
            pass

    def sweep_temporaries(self) -> None:
        for n in self.list():
            m = re.fullmatch(r"\..+\.tmp-(\d+)", n)
            if m and not _alive(int(m.group(1))):
                self.delete(n)


class ArrowStore(Store):
    """A URI through pyarrow's filesystems (no Spark needed)."""

    def __init__(self, location: str):
        super().__init__(location)
        import pyarrow.fs as pafs

        try:
            self.fs, self.root = pafs.FileSystem.from_uri(location)
        except Exception as e:  # noqa: BLE001 - any failure here is a user-fixable location
            raise UserError(f"location {location!r} is not reachable: {e}") from None

    def path(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def makedirs(self) -> None:
        try:
            self.fs.create_dir(self.root, recursive=True)
        except OSError as e:
            raise UserError(f"cannot create directory {self.location!r}: {e}") from None

    def write_atomic(self, name: str, data: bytes) -> None:
        tmp = self.path(self.tmp_name(name))
        with self.fs.open_output_stream(tmp) as f:
            f.write(data)
        self.fs.move(tmp, self.path(name))

    def read(self, name: str) -> bytes:
        with self.fs.open_input_stream(self.path(name)) as f:
            return f.read()

    def list(self) -> List[str]:
        import pyarrow.fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        except OSError:
            return []
        return [os.path.basename(i.path) for i in infos]

    def delete(self, name: str) -> None:
        try:
            self.fs.delete_file(self.path(name))
        except OSError:
            pass


class HadoopStore(Store):
    """A URI through the cluster's Hadoop FileSystem in the driver's JVM; bytes cross through a local
    temporary file (``copyFromLocalFile`` / ``copyToLocalFile``), not through py4j."""

    def __init__(self, location: str, sc):
        super().__init__(location)
        self._jvm = sc._jvm
        self._Path = self._jvm.org.apache.hadoop.fs.Path
        try:
            self.fs = self._Path(location).getFileSystem(sc._jsc.hadoopConfiguration())
        except Exception as e:  # noqa: BLE001 - py4j wraps the JVM's error; the first line says what
            raise UserError(f"location {location!r} is not reachable from this cluster: {_first(e)}") from None

    def _p(self, name: Optional[str] = None):
        return self._Path(self.location if name is None else self.path(name))

    def makedirs(self) -> None:
        try:
            self.fs.mkdirs(self._p())
        except Exception as e:  # noqa: BLE001
            raise UserError(f"cannot create directory {self.location!r}: {_first(e)}") from None

    def write_atomic(self, name: str, data: bytes) -> None:
        with tempfile.NamedTemporaryFile(prefix="mpca-", delete=False) as f:
            f.write(data)
            local = f.name
        try:
            tmp = self._p(self.tmp_name(name))
            self.fs.copyFromLocalFile(False, True, self._Path(f"file://{local}"), tmp)
            final = self._p(name)
            if self.fs.exists(final):
                self.fs.delete(final, False)
            if not self.fs.rename(tmp, final):
                raise OSError(f"rename to {self.path(name)} failed")
        finally:
            os.unlink(local)

    def read(self, name: str) -> bytes:
        d = tempfile.mkdtemp(prefix="mpca-")
        try:
            local = os.path.join(d, "f")
            try:
                self.fs.copyToLocalFile(False, self._p(name), self._Path(f"file://{local}"), True)
            except Exception as e:  # noqa: BLE001
                raise FileNotFoundError(f"{self.path(name)}: {_first(e)}") from None
            with open(local, "rb") as f:
                return f.read()
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def list(self) -> List[str]:
        try:
            if not self.fs.exists(self._p()):
                return []
            return [st.getPath().getName() for st in self.fs.listStatus(self._p())]
        except Exception:  # noqa: BLE001
            return []

    def delete(self, name: str) -> None:
        try:
            self.fs.delete(self._p(name), False)
        except Exception:  # noqa: BLE001
            pass


def _first(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = next((ln for ln in text if "Exception:" in ln or "Error:" in ln), text[0] if text else type(e).__name__)
    return line.strip()[:300]


def _active_context():
    """This driver's classic SparkContext, from any thread (None without one, e.g. Spark Connect)."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return None
    return SparkContext._active_spark_context


def is_uri(location: str) -> bool:
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/", location) is not None


def open_store(location: str) -> Store:
    if not is_uri(location):
        return LocalStore(location)
    sc = _active_context()
    return HadoopStore(location, sc) if sc is not None else ArrowStore(location)


ARROW_SCHEMES = ("file", "s3", "gs", "gcs")  # pyarrow reaches these without native libraries
HADOOP_SCHEMES = ("hdfs", "viewfs", "webhdfs", "s3a", "s3n", "dbfs", "abfs", "abfss", "wasb", "wasbs", "oss", "cos",
                  "ofs", "o3fs", "jfs", "gsfs")  # a cluster's Hadoop may: checked once Spark is up


def check_location(location: str) -> None:
    """Fail now, with one line, when a URI names no filesystem this machine (or cluster) can reach.  Before
    Spark starts, schemes only a cluster's Hadoop may know (``hdfs``, ``s3a``, ``dbfs``, ``abfss`` …) wait
    for the session (the job checks them right after it starts, before training); unknown ones fail."""
    if not is_uri(location):
        return
    scheme = location.split(":", 1)[0].lower()
    if _active_context() is None:
        if scheme in HADOOP_SCHEMES:
            return
        if scheme not in ARROW_SCHEMES:
            raise UserError(f"location {location!r} is not reachable: unknown scheme {scheme!r} (local paths, "
                            f"{', '.join(ARROW_SCHEMES + HADOOP_SCHEMES)})")
    open_store(location).list()
