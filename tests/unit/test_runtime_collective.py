"""The Spark runtime's transport for ddp: the backend each generation chooses from its members' devices."""
import torch

from mpca.runtime.collective import choose_backend, device_identity


def test_ddp_uses_nccl_only_when_every_member_has_a_gpu_of_its_own():
    a, b = "cuda:host1:GPU-aaaa", "cuda:host1:GPU-bbbb"
    assert choose_backend([a, b]) == "nccl"
    assert choose_backend([a, a]) == "gloo"  # two executors given the same GPU: NCCL would refuse the group
    assert choose_backend([a, "cpu"]) == "gloo"
    assert choose_backend(["cpu", "cpu"]) == "gloo"
    assert choose_backend([]) == "gloo"
    assert device_identity(torch.device("cpu")) == "cpu"
