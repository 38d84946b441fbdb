"""The initial model in the agents' task (mpca.runtime.initial): its weights travel only where the executors
cannot rebuild them from ``model_fn`` and the seed."""
import numpy as np
import torch

from mpca.algorithm import build_algorithm
from mpca.runtime.initial import InitialModel, for_agents, model_state, rebuild, state_digest


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _seeded(seed):
    torch.manual_seed(seed)
    return _mlp()


def test_the_digest_follows_every_value_name_and_dtype_not_the_order():
    a = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, np.float32)}
    same = {"b": np.zeros(3, np.float32), "w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    assert state_digest(a) == state_digest(same)
    nudged = {**a, "w": a["w"].copy()}
    nudged["w"][1, 2] = np.nextafter(nudged["w"][1, 2], np.float32(np.inf))  # one ulp
    assert state_digest(nudged) != state_digest(a)
    assert state_digest({**a, "b": np.zeros(3, np.int32)}) != state_digest(a)  # the same bytes, another dtype
    assert state_digest({"w": a["w"].reshape(3, 2), "b": a["b"]}) != state_digest(a)
    assert state_digest({"w2": a["w"], "b": a["b"]}) != state_digest(a)


def test_a_model_the_seed_rebuilds_travels_as_its_seed_and_digest_only():
    model = _seeded(7)
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    initial = for_agents(model, _mlp, seed=7)
    assert not initial.shipped and initial.state is None
    assert initial.digest == state_digest(model_state(model))
    assert torch.equal(torch.rand(3), expected_next)  # the driver's own random state is left as it was


def test_weights_the_seed_does_not_build_travel_themselves():
    resumed = _seeded(7)
    with torch.no_grad():
        resumed[0].bias[0] += 1.0  # as a checkpoint or init_from would have replaced them
    for model, seed, rebuildable in ((resumed, 7, True), (_seeded(7), 8, True), (_seeded(7), 7, False)):
        initial = for_agents(model, _mlp, seed=seed, rebuildable=rebuildable)
        assert initial.shipped
        assert initial.state.keys() == model.state_dict().keys()
        assert all(np.array_equal(initial.state[k], v.numpy()) for k, v in model.state_dict().items())


def test_an_agent_rebuilds_the_drivers_weights_or_says_it_could_not():
    driver = _seeded(3)
    initial = for_agents(driver, _mlp, seed=3)
    torch.manual_seed(1003)  # the agent's own seed: the rebuild does not depend on it
    agent, same = rebuild(initial, _mlp)
    assert same
    assert all(torch.equal(a, d) for a, d in zip(agent.state_dict().values(), driver.state_dict().values()))

    def other_init():  # e.g. another torch on the executor: the seed builds other weights
        m = _mlp()
        with torch.no_grad():
            m[2].weight.mul_(2.0)
        return m

    _, same = rebuild(initial, other_init)
    assert not same


def test_shipped_weights_are_loaded_whatever_the_seed_builds():
    resumed = _seeded(3)
    with torch.no_grad():
        resumed[2].bias.fill_(0.25)
    agent, same = rebuild(InitialModel.shipping(resumed, seed=3), _mlp)
    assert same
    assert torch.equal(agent[2].bias, torch.full((3,), 0.25))
    assert all(torch.equal(a, r) for a, r in zip(agent.state_dict().values(), resumed.state_dict().values()))


def test_only_ddp_ships_its_initial_weights_always():
    assert not build_algorithm("ddp").rebuilds_initial_model
    for name in ("mpca", "sync", "diloco", "single", "easgd", "downpour"):
        assert build_algorithm(name).rebuilds_initial_model, name
