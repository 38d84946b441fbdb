"""The benchmark's straggler: the slowed agent's steps take 1/speed as long; others are untouched."""
import functools

import pytest
import torch

from mpca.bench import straggler


def test_each_step_is_stretched_to_one_over_speed(monkeypatch):
    clock = {"t": 0.0}
    slept = []
    monkeypatch.setattr(straggler.time, "perf_counter", lambda: clock["t"])
    monkeypatch.setattr(straggler.time, "sleep", lambda s: (slept.append(s), clock.__setitem__("t", clock["t"] + s)))
    opt = straggler.SlowedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), speed=0.25)
    for _ in range(3):
        clock["t"] += 0.2  # 0.2 s of work per step
        opt.step()
    assert slept == pytest.approx([0.6, 0.6])  # each step then lasts 0.8 s = 0.2 / 0.25
    assert opt.param_groups[0]["lr"] == 0.1  # the real optimizer behind it


def test_on_an_emulated_device_the_optimizer_does_not_sleep():
    from mpca.config import settings_from

    sgd = functools.partial(torch.optim.SGD, lr=0.1)
    emulated, fn = straggler.straggle(settings_from(agents=2, device_step_s=0.1), sgd, 1, 0.5)
    assert fn is sgd  # the agent's DeviceClock waits out T / device_speed instead
    assert emulated.emulation.device_speed == {1: 0.5} and emulated.emulation.device_step_s == 0.1
    plain, fn = straggler.straggle(settings_from(agents=2), sgd, 1, 0.5)
    assert plain.emulation.device_speed == {} and fn is not sgd


def test_only_the_named_partition_is_slowed():
    fn = straggler.slowed(lambda p: torch.optim.SGD(p, lr=0.1), agent=1, speed=0.5)
    assert isinstance(fn([torch.nn.Parameter(torch.zeros(1))]), torch.optim.SGD)  # the driver: no task context


@pytest.mark.parametrize("text", ["1", "a:0.5", "1:x"])
def test_bad_straggler_text(text):
    from mpca.spellings import parse_device_speed

    with pytest.raises(ValueError, match="AGENT:SPEED"):
        parse_device_speed(text)
    with pytest.raises(ValueError):
        straggler.slowed(lambda p: None, 1, 1.5)
