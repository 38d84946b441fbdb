"""On an emulated 100 Mbit cluster a cycle's reduce completes before its broadcast has even arrived: the reduce
tasks need no download (two exchange slots per agent; the test fails on a design where one task does both)."""
import json
import subprocess
import sys

import pytest

from lab.netcluster import available

pytestmark = [pytest.mark.standalone, pytest.mark.usefixtures("no_shared_spark")]
_OK, _WHY = available()


@pytest.mark.skipif(not _OK, reason=f"emulated cluster unavailable: {_WHY}")
def test_reduce_completes_before_broadcast_on_a_100mbit_link():
    p = subprocess.run([sys.executable, "-m", "lab.netcluster", "--workers", "2", "--link", "100mbit",
                        "--cores", "3", "-q", "--", sys.executable, "-m", "lab.overlap", "--params", "3000000",
                        "--cycles", "7", "--alone", "3"], capture_output=True, text=True, timeout=420)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    steady = [c for c in lines if "cycle" in c and c["bcast_shard"] is not None]
    summary = lines[-1]
    assert summary["summary"] and summary["split_tasks"] and summary["B_s"] > 0 and summary["R_s"] > 0, summary
    assert 0 < summary["driver_tx_util"] <= 1.05 and 0 < summary["driver_rx_util"] <= 1.05, summary
    assert len(steady) >= 4, p.stdout
    early = [c["cycle"] for c in steady if c["reduce_before_broadcast"]]
    assert len(early) >= len(steady) // 2, json.dumps(steady, indent=1)
