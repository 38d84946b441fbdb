"""Agents come and go (issue 27): every algorithm family survives a lost executor — kill -9 of agent 1's
executor JVM mid-run, Spark's retried agent task starts on the replacement executor, and the run goes on
with the survivors meanwhile and with the replacement afterwards."""
import pytest

from mpca.data.datasets import dataset_dataframe
from mpca.trainer import Trainer
from tests import helpers

pytestmark = pytest.mark.cluster()


@pytest.mark.parametrize("algorithm", [{"name": "sync", "every": 10}, {"name": "diloco", "every": 10}],
                         ids=["sync", "diloco"])
def test_rounds_go_on_with_the_survivor_and_the_replacement_joins_the_current_round(spark, tmp_path, algorithm):
    go = tmp_path / "cycles-under-way"  # the kill comes once a cycle has been evaluated, never at start-up
    fit = Trainer(helpers.executor_killing_cnn_fn(after=str(go)), helpers.cross_entropy, helpers.adam, agents=2,
                  input_shape=(1, 8, 8), algorithm=algorithm, max_seconds=75, eval_every_cycles=5,
                  agent_wait_s=5.0, spark=spark, on_cycle=lambda row: row["cycle"] > 0 and go.touch()
                  ).fit(dataset_dataframe(spark, "digits"))
    cycles = fit.timeline.cycles
    lost = [i for i, c in enumerate(cycles) if 1 in c.missing]
    assert lost, "agent 1 was never missing: the fault did not fire"
    joined = [i for i, c in enumerate(cycles) if 1 in c.joined]
    assert joined and joined[0] >= lost[0], [(c.cycle, c.missing, c.joined) for c in cycles]
    after = cycles[joined[0] + 1:]
    assert len(after) >= 3 and all(c.agents[1].weight > 0 and 1 not in c.missing for c in after[-3:]), \
        [(c.cycle, c.missing, sorted(c.agents)) for c in cycles[joined[0]:]]
    gap = cycles[joined[0]].t_end - cycles[lost[0]].t_submit
    print(f"{fit.algorithm}: {len(lost)} rounds without agent 1, replacement joined {gap:.1f}s after the loss, "
          f"final error {fit.final.error:.3f}")
    assert fit.final.error < 0.15
