"""Agents on real CUDA devices: `make test-gpu` (MPCA_GPU_TESTS=1), on a host with at least one NVIDIA GPU.

Not part of `make test` (CI has no GPU; a skipped test is not a passing one): without a CUDA device this module
fails in one line instead.  Real Spark (local-cluster whose executors are given this host's GPUs through Spark's
resource scheduling, `cluster.gpus`), real agents, real torch on the device.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from mpca.data.datasets import dataset_dataframe
from mpca.trainer import Trainer
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if not torch.cuda.is_available():
    pytest.fail("make test-gpu needs a CUDA device (torch.cuda.is_available() is False on this host)",
                pytrace=False)


def _expected_device(gpu_addresses) -> str:
    return f"cuda:{gpu_addresses[0]}"


@pytest.mark.cluster(executors=2, cores=2, gpus=1)
def test_mpca_agents_train_on_the_gpus_spark_gave_them(spark):
    df = dataset_dataframe(spark, "digits")
    fit = Trainer(helpers.small_cnn, helpers.cross_entropy, helpers.adam, agents=2, input_shape=(1, 8, 8),
                  max_cycles=40, eval_every_cycles=10, spark=spark).fit(df)
    assert len(fit.agents) == 2
    for a in fit.agents:
        assert a["gpu"], a  # Spark assigned each agent task a GPU address
        assert a["device"] == _expected_device(a["gpu"]), a
        assert a["steps"] > 50, a
    assert fit.final.error < 0.2, fit.final
    assert all(p.device.type == "cpu" for p in fit.model.parameters())  # the joint model comes back to the driver


@pytest.mark.cluster(executors=2, cores=2, gpus=1)
def test_ddp_agents_on_gpus_train_and_agree(spark):
    """Two agents on this host's GPUs: NCCL when each has its own, gloo's CUDA all-reduce when they share one
    (NCCL refuses two ranks on one device); either way the replicas stay identical (DDP's own digest check)."""
    df = dataset_dataframe(spark, "digits")
    fit = Trainer(helpers.small_cnn, helpers.cross_entropy, helpers.adam, agents=2, input_shape=(1, 8, 8),
                  algorithm={"name": "ddp", "verify_every": 1}, max_cycles=8, eval_every_cycles=4, spark=spark).fit(df)
    assert sorted(a["device"] for a in fit.agents) == sorted(_expected_device(a["gpu"]) for a in fit.agents)
    assert all(a["steps"] > 20 for a in fit.agents), fit.agents
    assert fit.final.error < 0.5, fit.final


def test_the_eq7_pull_on_cuda_equals_the_pull_on_the_cpu():
    """The agent rule's fused Eq. 7 pull (mpca.algorithm.mpca) gives the same replica on the GPU as on the CPU."""
    from mpca.bench.pull import agent_with_targets

    results = []
    for device in (torch.device("cpu"), torch.device("cuda")):
        torch.manual_seed(0)
        model = helpers.small_cnn().to(device)
        before = [p.detach().cpu().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        agent_with_targets(model, opt, device, shards=3, offset=0.25, alpha=0.2).before_step()
        results.append([p.detach().cpu() for p in model.parameters()])
    for cpu, gpu, start in zip(*results, before):
        torch.testing.assert_close(gpu, cpu, rtol=1e-5, atol=1e-6)
        assert not torch.equal(cpu, start)  # the pull moved every parameter


@pytest.mark.standalone
@pytest.mark.usefixtures("no_shared_spark")
def test_mpca_train_on_local_cluster_uses_the_hosts_gpus_by_default(tmp_path):
    """The user's path: `mpca train` on local-cluster with `cluster.gpus` left at auto trains on the GPU;
    `cluster.gpus=none` keeps the agents on the CPUs."""
    for gpus, device in (("auto", "cuda"), ("none", "cpu")):
        out = tmp_path / gpus
        p = subprocess.run([sys.executable, "-m", "mpca.cli", "train", "-c", "conf/digits.yaml",
                            f"run.output_dir={out}", f"cluster.gpus={gpus}", "stop.target_error=null",
                            "stop.max_cycles=12", "progress=log"],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        assert [d.split(":")[0] for d in summary["agent_devices"]] == [device] * summary["agents"], summary
