import os

import pytest
import torch

from mpca import checkpoint
from mpca.checkpoint import Checkpoint
from mpca.errors import UserError
from mpca.models import SmallCNN


def _ck(cycle, value=1.0):
    m = SmallCNN(8)
    state = {"joint": [torch.full((3,), value)], "velocity": [torch.zeros(3)], "reductions": [cycle], "buf": None}
    return Checkpoint(cycle=cycle, algorithm="mpca", driver_state=state, model_state=m.state_dict(),
                      layout=[("a", 3, "torch.float32")], shards=1, wall_s=1.5)


@pytest.mark.parametrize("uri", [False, True])
def test_save_and_load_latest(tmp_path, uri):
    loc = f"file://{tmp_path}/ck" if uri else str(tmp_path / "ck")
    checkpoint.save(loc, _ck(5, 1.0))
    checkpoint.save(loc, _ck(10, 2.0))
    ck = checkpoint.latest(loc)
    assert ck.cycle == 10 and ck.algorithm == "mpca"
    assert torch.equal(ck.driver_state["joint"][0], torch.full((3,), 2.0)) and ck.driver_state["reductions"] == [10]
    assert not [n for n in os.listdir(tmp_path / "ck") if ".tmp" in n]  # no temporary left behind


def test_corrupt_newest_falls_back_to_previous(tmp_path):
    loc = str(tmp_path)
    checkpoint.save(loc, _ck(5))
    checkpoint.save(loc, _ck(10))
    with open(tmp_path / "ckpt-00000010.pt", "r+b") as f:  # a torn write / bit rot
        f.seek(100)
        f.write(b"garbage")
    assert checkpoint.latest(loc).cycle == 5
    os.remove(tmp_path / "ckpt-00000005.pt")  # manifest without data
    assert checkpoint.latest(loc) is None


def test_retention_keeps_newest(tmp_path):
    for c in (1, 2, 3, 4):
        checkpoint.save(str(tmp_path), _ck(c), keep=2)
    names = sorted(os.listdir(tmp_path))
    assert names == ["ckpt-00000003.json", "ckpt-00000003.pt", "ckpt-00000004.json", "ckpt-00000004.pt"]


def test_final_model_loads_in_plain_torch(tmp_path):
    m = SmallCNN(8)
    from mpca.ml.spec import save_model

    path = save_model(str(tmp_path / "model.pt"), m)
    state = torch.load(path, weights_only=True)  # plain PyTorch, no mpca
    fresh = SmallCNN(8)
    fresh.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), m.state_dict().values()))
    assert checkpoint.load_model_state(path).keys() == m.state_dict().keys()


def test_init_from_checkpoint_dir_and_bad_paths(tmp_path):
    checkpoint.save(str(tmp_path / "ck"), _ck(7))
    assert "features.0.weight" in checkpoint.load_model_state(str(tmp_path / "ck"))
    with pytest.raises(UserError, match="does not exist"):
        checkpoint.load_model_state(str(tmp_path / "missing.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="not a model state_dict"):
        checkpoint.load_model_state(str(tmp_path / "junk.pt"))


def test_unreachable_uri_is_a_user_error():
    with pytest.raises(UserError, match="not reachable"):
        checkpoint.latest("nosuchscheme://bucket/path")


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
        manifests = sorted(n for n in store.list() if checkpoint._NAME.match(n))
        for n in manifests:  # every manifest on disk names a complete, matching data file
            ck = checkpoint._load(store, n)
            assert ck is not None, f"torn checkpoint {n}"
            assert ck.driver_state["reductions"] == [ck.cycle]  # the data of the manifest's own cycle
        newest = checkpoint.latest(loc)
        if newest is not None:
            assert int(checkpoint._NAME.match(manifests[-1]).group(1)) == newest.cycle
            start = newest.cycle + 1
    assert start > 20  # the writers got far enough to be killed mid-write many times
    checkpoint.save(loc, _ck(10_000))  # the next writer sweeps what the killed ones left
    assert not [n for n in os.listdir(loc) if ".tmp-" in n]
