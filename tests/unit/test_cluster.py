"""The cluster checks (mpca.runtime.cluster): room for the agents, classic Spark only, no dynamic allocation."""
from __future__ import annotations

import time

import pytest

from mpca.errors import ClusterTooSmallError, UserError
from mpca.runtime.cluster import ClusterShape, check_capacity, require_classic


def test_capacity_rule_two_cores_per_agent():
    check_capacity(ClusterShape(2, 2, 0, 1), 2, use_gpus=False)
    with pytest.raises(ClusterTooSmallError, match="lower 'agents' to 2"):
        check_capacity(ClusterShape(2, 2, 0, 1), 3, use_gpus=False)
    with pytest.raises(ClusterTooSmallError):
        check_capacity(ClusterShape(4, 1, 0, 1), 1, use_gpus=False)  # no core left for exchange tasks
    check_capacity(ClusterShape(1, 8, 4, 0), 4, use_gpus=True)
    with pytest.raises(ClusterTooSmallError):
        check_capacity(ClusterShape(1, 6, 4, 0), 4, use_gpus=True)  # 4 GPUs but cores for 3 agents


class _RegisteringCluster:
    """What inspect_cluster reads of a SparkContext: the master, its conf, and executors registering one more
    each time they are counted (the driver's block manager counts as one, as in Spark)."""

    def __init__(self, master, conf, executors):
        self.master, self.conf, self.registered, self.counted = master, conf, 0, 0
        self.executors = executors
        self.defaultParallelism = 2
        self._jsc = self

    def sc(self):
        return self

    def getConf(self):
        return self.conf

    def getExecutorMemoryStatus(self):
        self.counted += 1
        self.registered = min(self.executors, self.registered + 1)
        return self

    def size(self):
        return self.registered + 1


def test_the_driver_waits_for_room_for_the_agents_not_for_one_executor_per_agent(monkeypatch):
    """Four agents on two executors of two agent slots each: the wait ends once both executors registered
    (it once waited for four executors, the whole executor_wait_s, on every start of such a cluster)."""
    from mpca.runtime import cluster

    monkeypatch.setattr(cluster.time, "sleep", lambda s: None)
    slots = {"spark.executor.resource.agentslot.amount": "2"}
    sc = _RegisteringCluster("local-cluster[2,4,1024]", slots, executors=2)
    t = time.time()
    shape = cluster.inspect_cluster(sc, 4, wait_s=5.0)
    assert (shape.executors, shape.agent_slots_per_executor) == (2, 2) and time.time() - t < 1.0
    assert cluster.agent_capacity(shape, use_gpus=False) == 4
    one_each = _RegisteringCluster("local-cluster[3,2,1024]", {}, executors=3)  # one agent per executor: all three
    assert cluster.inspect_cluster(one_each, 3, wait_s=5.0).executors == 3
    few_cores = _RegisteringCluster("local-cluster[2,1,1024]", {}, executors=2)  # room for none: no wait
    assert cluster.inspect_cluster(few_cores, 2, wait_s=5.0).executors == 1 and few_cores.counted == 1


def test_spark_connect_is_refused_where_a_classic_driver_is_needed_and_fit_takes_it_over_connect(monkeypatch):
    Connect = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})
    with pytest.raises(UserError, match="Spark Connect"):
        require_classic(Connect())
    from mpca.connect import client
    from mpca.trainer import Trainer

    taken = []
    monkeypatch.setattr(client, "fit_over_connect", lambda trainer, spark, df, holdout, called: taken.append(spark))
    session = Connect()
    Trainer(lambda: None, lambda o, y: o, lambda p: None, max_cycles=1, spark=session).fit(df=None)
    assert taken == [session]  # before it touches the data


def test_a_connect_run_needs_a_shared_directory_unless_the_cluster_is_on_this_machine():
    import types

    from mpca.config import Settings
    from mpca.connect.client import connect_location

    def spark(master):
        return types.SimpleNamespace(conf=types.SimpleNamespace(get=lambda key, default=None: master))

    with pytest.raises(UserError, match="cluster.connect_dir"):
        connect_location(spark("spark://head:7077"), Settings(), "r1")
    where, temporary = connect_location(spark("local-cluster[2,2,1024]"), Settings(), "r1")
    assert temporary and where.endswith("mpca-connect-r1")
    shared = Settings.model_validate({"cluster": {"connect_dir": "s3://bucket/mpca/"}})
    assert connect_location(spark("spark://head:7077"), shared, "r1") == ("s3://bucket/mpca/r1", False)


def test_dynamic_allocation_is_refused_in_one_line_that_says_what_to_set():
    from mpca.errors import UserError
    from mpca.runtime.cluster import refuse_dynamic_allocation

    refuse_dynamic_allocation({})  # off by default
    refuse_dynamic_allocation({"spark.dynamicAllocation.enabled": "false"})
    with pytest.raises(UserError, match=r"needs spark.dynamicAllocation.enabled=false") as e:
        refuse_dynamic_allocation({"spark.dynamicAllocation.enabled": "True"})
    assert "\n" not in str(e.value)
