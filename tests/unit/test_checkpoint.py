import os

import pytest
import torch

from mpca import checkpoint
from mpca.errors import UserError
from mpca.models import SmallCNN
from tests.helpers import checkpoint_at


@pytest.mark.parametrize("uri", [False, True])
def test_save_and_load_latest(tmp_path, uri):
    loc = f"file://{tmp_path}/ck" if uri else str(tmp_path / "ck")
    checkpoint.save(loc, checkpoint_at(5, 1.0))
    checkpoint.save(loc, checkpoint_at(10, 2.0))
    ck = checkpoint.latest(loc)
    assert ck.cycle == 10 and ck.algorithm == "mpca"
    assert torch.equal(ck.driver_state["joint"][0], torch.full((3,), 2.0)) and ck.driver_state["reductions"] == [10]
    assert not [n for n in os.listdir(tmp_path / "ck") if ".tmp" in n]  # no temporary left behind


def test_corrupt_newest_falls_back_to_previous(tmp_path):
    loc = str(tmp_path)
    checkpoint.save(loc, checkpoint_at(5))
    checkpoint.save(loc, checkpoint_at(10))
    with open(tmp_path / "ckpt-00000010.pt", "r+b") as f:  # a torn write / bit rot
        f.seek(100)
        f.write(b"garbage")
    assert checkpoint.latest(loc).cycle == 5
    os.remove(tmp_path / "ckpt-00000005.pt")  # manifest without data
    assert checkpoint.latest(loc) is None


def test_retention_keeps_newest(tmp_path):
    for c in (1, 2, 3, 4):
        checkpoint.save(str(tmp_path), checkpoint_at(c), keep=2)
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
    checkpoint.save(str(tmp_path / "ck"), checkpoint_at(7))
    assert "features.0.weight" in checkpoint.load_model_state(str(tmp_path / "ck"))
    with pytest.raises(UserError, match="does not exist"):
        checkpoint.load_model_state(str(tmp_path / "missing.pt"))
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="not a model state_dict"):
        checkpoint.load_model_state(str(tmp_path / "junk.pt"))


def test_unreachable_uri_is_a_user_error():
    with pytest.raises(UserError, match="not reachable"):
        checkpoint.latest("nosuchscheme://bucket/path")


def test_the_driver_wire_residuals_survive_a_checkpoint(tmp_path):
    """A lossy run's checkpoint holds the driver's error-feedback residuals (tensors, loaded back with
    weights_only=True), which ErrorFeedback takes back as they were."""
    import dataclasses

    import numpy as np

    from mpca.algorithm.wire import Codec, ErrorFeedback

    sender = ErrorFeedback(Codec("int8", block=4))
    sender.encode(0, np.array([1.0, 0.33, -0.51, 0.2], dtype=np.float32))
    sender.encode(2, np.array([0.07, 0.5], dtype=np.float32))
    wire = {"format": "int8", "block": 4,
            "broadcast": {k: torch.from_numpy(v) for k, v in sender.state_dict()["residual"].items()}}
    checkpoint.save(str(tmp_path), dataclasses.replace(checkpoint_at(5), wire=wire))
    back = checkpoint.latest(str(tmp_path)).wire
    assert back["format"] == "int8" and sorted(back["broadcast"]) == ["0", "2"]
    again = ErrorFeedback(Codec("int8", block=4))
    again.load_state_dict({"residual": {k: v.numpy() for k, v in back["broadcast"].items()}})
    assert sorted(again.residual) == [0, 2]
    for k in (0, 2):
        assert np.array_equal(again.residual[k], sender.residual[k]) and np.abs(sender.residual[k]).max() > 0


def test_a_checkpoint_keeps_the_last_cycles_durations_for_the_resumed_driver_s_deadline(tmp_path):
    """The recent cycle times go into the checkpoint and come back as they were (None where a checkpoint has
    none), so a resumed driver's cycle deadline holds from its first cycle."""
    import dataclasses

    checkpoint.save(str(tmp_path), dataclasses.replace(checkpoint_at(5), cycle_times=[0.3, 0.4, 5.5]))
    assert checkpoint.latest(str(tmp_path)).cycle_times == [0.3, 0.4, 5.5]
    checkpoint.save(str(tmp_path), checkpoint_at(6))
    assert checkpoint.latest(str(tmp_path)).cycle_times is None


def test_a_checkpoint_is_due_every_n_cycles_or_once_enough_time_passed_since_the_last():
    """checkpoint.due: the campaign's DDP run restarted its driver every ~70 s and ran ~9 cycles per incarnation
    (slow ones while links were cut), so every_cycles = 20 alone never wrote a checkpoint and every resume started
    from the beginning; every_seconds bounds what a dead driver loses."""
    from mpca.checkpoint import due
    from mpca.config import settings_from

    assert due(20, 20, 1.0, 300.0) and due(40, 20, 0.0, None)  # by cycles, whatever the time
    assert not due(9, 20, 299.9, 300.0) and due(9, 20, 300.0, 300.0)  # by time, however few cycles
    assert not due(9, 20, 10_000.0, None)  # by cycles only
    assert settings_from(input_shape=(4,)).checkpoint.every_seconds == 300.0
    assert settings_from(input_shape=(4,), checkpoint={"every_seconds": None}).checkpoint.every_seconds is None
