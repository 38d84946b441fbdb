"""The long-run benchmark's process accounting against a real child process (its arithmetic:
tests/unit/test_longrun.py)."""
import os

from lab import longrun


def test_rss_and_children_of_this_process():
    assert longrun._rss_mb(os.getpid()) > 10
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert p.pid in longrun._children([os.getpid()])
    finally:
        p.kill()
        p.wait()
