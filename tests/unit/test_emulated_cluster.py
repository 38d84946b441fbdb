"""`bench compare --network` builds its emulated cluster's hosts like the run's local-cluster executors."""
from mpca.bench.compare import emulated_hosts
from mpca.bench.emulated_cluster import harness_argv
from mpca.config import load_config


def test_the_hosts_get_the_cores_and_memory_of_the_local_cluster_executors():
    cfg = load_config(["conf/teacher_mlp.yaml"], ["training.agents=4", "cluster.master=local-cluster[4,3,2048]"])
    hosts = emulated_hosts(cfg)
    assert hosts == {"cores": 3, "memory_mb": 2048}
    argv = harness_argv("/repo", 4, "30mbit", ["cmd", "--x"], **hosts)
    assert argv[argv.index("--workers") + 1] == "4" and argv[argv.index("--cores") + 1] == "3"
    assert argv[argv.index("--memory-mb") + 1] == "2048" and argv[-2:] == ["cmd", "--x"]


def test_any_other_master_leaves_the_harness_defaults():
    cfg = load_config(["conf/teacher_mlp.yaml"], ["cluster.master=existing"])
    assert emulated_hosts(cfg) == {}
    argv = harness_argv("/repo", 2, "100mbit", ["cmd"])
    assert argv[argv.index("--cores") + 1] == "2" and argv[argv.index("--memory-mb") + 1] == "1024"
