"""Checkpoints against a writer process killed mid-write (kill -9): never torn, temporaries swept."""
import os

from mpca import checkpoint
from tests.helpers import checkpoint_at

_WRITER = """
import sys, torch
from mpca import checkpoint
from mpca.checkpoint import Checkpoint
loc, start = sys.argv[1], int(sys.argv[2])
joint = torch.randn(1_000_000)  # 4 MB: a write takes long enough to be cut
print("ready", flush=True)
c = start
while True:
    state = {"joint": [joint + c], "velocity": [torch.zeros(3)], "reductions": [c]}
    checkpoint.save(loc, Checkpoint(cycle=c, algorithm="mpca", driver_state=state, model_state={},
                                    layout=[("a", 3, "torch.float32")], shards=1, wall_s=0.0), keep=3)
    c += 1
"""


def test_kill_9_of_the_writer_never_leaves_a_torn_checkpoint(tmp_path):
    """20 times: a process writing checkpoints in a loop is killed with SIGKILL at a random moment; every
    checkpoint left on disk verifies (old or new, never torn), the newest is found, temporaries are swept."""
    import random
    import signal
    import subprocess
    import sys
    import time

    loc = str(tmp_path / "ck")
    rng = random.Random(7)
    start = 0
    for _ in range(20):
        p = subprocess.Popen([sys.executable, "-c", _WRITER, loc, str(start)], stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.6))
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        store = checkpoint.open_store(loc)
        manifests = sorted(n for n in store.list() if checkpoint.MANIFEST_NAME.match(n))
        for n in manifests:  # every manifest on disk names a complete, matching data file
            ck = checkpoint.read_manifest(store, n)
            assert ck is not None, f"torn checkpoint {n}"
            assert ck.driver_state["reductions"] == [ck.cycle]  # the data of the manifest's own cycle
        newest = checkpoint.latest(loc)
        if newest is not None:
            assert int(checkpoint.MANIFEST_NAME.match(manifests[-1]).group(1)) == newest.cycle
            start = newest.cycle + 1
    assert start > 20  # the writers got far enough to be killed mid-write many times
    checkpoint.save(loc, checkpoint_at(10_000))  # the next writer sweeps what the killed ones left
    assert not [n for n in os.listdir(loc) if ".tmp-" in n]
