"""Configuration mistakes through the console command in its own process: one line, exit 2, no traceback
(the mistakes themselves, through ``mpca.cli.main`` in this process: tests/unit/test_config.py)."""
import subprocess
import sys


def test_real_process_prints_no_traceback():
    p = subprocess.run([sys.executable, "-m", "mpca.cli", "train", "-c", "conf/digits.yaml", "training.agents=x"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and p.stderr.strip().count("\n") == 0, p.stderr
