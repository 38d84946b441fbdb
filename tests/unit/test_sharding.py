import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpca.algorithm import ShardLayout, TensorSpec, exchanged_tensors


class Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.h16 = torch.nn.Parameter(torch.randn(7, dtype=torch.float16))
        self.fc = torch.nn.Linear(5, 3)


def test_cuts_by_bytes_across_parameter_boundaries():
    specs = [TensorSpec("a", 10, torch.float32), TensorSpec("b", 20, torch.float32)]
    lay = ShardLayout(specs, 3)
    assert [lay.shard_numel(s) for s in range(3)] == [10, 10, 10]
    assert lay.shards[0][0].tensor == 0
    # second and third shard both cut inside tensor b
    assert [(g.tensor, g.start, g.stop) for g in lay.shards[1]] == [(1, 0, 10)]
    assert [(g.tensor, g.start, g.stop) for g in lay.shards[2]] == [(1, 10, 20)]


def test_mixed_dtypes_balanced_by_bytes():
    # 8 float64 (64 B) + 32 float16 (64 B) = 128 B → two shards of 64 B
    specs = [TensorSpec("d", 8, torch.float64), TensorSpec("h", 32, torch.float16)]
    lay = ShardLayout(specs, 2)
    assert lay.shard_nbytes(0) == 64 and lay.shard_nbytes(1) == 64
    assert lay.wire_dtype == torch.float64


def test_buffers_average_includes_float_buffers_only():
    m = Mixed()
    names = [n for n, _ in exchanged_tensors(m, "average")]
    assert "bn.running_mean" in names and "bn.running_var" in names
    assert "bn.num_batches_tracked" not in names
    local = [n for n, _ in exchanged_tensors(m, "local")]
    assert "bn.running_mean" not in local
    assert [n for n, _ in exchanged_tensors(m, "recalibrate")] == names  # averaged as average, re-estimated to score
    with pytest.raises(ValueError):
        exchanged_tensors(m, "sum")


def test_views_are_zero_copy():
    m = Mixed()
    lay = ShardLayout.from_module(m, 3)
    bound = lay.bind_module(m)
    for s in range(3):
        for v in bound.views(s):
            v.fill_(1.5)
    assert all(torch.all(p == 1.5) for p in m.parameters())
    assert torch.all(m.bn.running_mean == 1.5)


def test_bad_arguments():
    with pytest.raises(ValueError):
        ShardLayout([TensorSpec("a", 2, torch.float32)], 3)
    with pytest.raises(ValueError):
        ShardLayout([TensorSpec("a", 2, torch.float32)], 0)
    lay = ShardLayout.from_module(torch.nn.Linear(2, 2), 2)
    with pytest.raises(ValueError):
        lay.bind_module(torch.nn.Linear(3, 2))
    with pytest.raises(ValueError):
        lay.bind_module(torch.nn.Linear(2, 2)).write(0, torch.zeros(1000))


sizes = st.lists(st.integers(0, 50), min_size=1, max_size=6).filter(lambda s: sum(s) >= 1)
dtypes = st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64])


@given(sizes, st.data(), st.integers(1, 6))
@settings(max_examples=80, deadline=None)
def test_sharding_roundtrips_any_model_bit_exactly(sz, data, num_shards):
    dts = [data.draw(dtypes) for _ in sz]
    num_shards = min(num_shards, sum(sz))
    src = [torch.randn(n).to(dt) for n, dt in zip(sz, dts)]
    dst = [torch.randn(n).to(dt) for n, dt in zip(sz, dts)]
    specs = [TensorSpec(f"t{i}", n, dt) for i, (n, dt) in enumerate(zip(sz, dts))]
    lay = ShardLayout(specs, num_shards)
    assert sum(lay.shard_numel(s) for s in range(num_shards)) == sum(sz)
    assert all(lay.shard_numel(s) >= 1 for s in range(num_shards))
    a, b = lay.bind(src), lay.bind(dst)
    for s in range(num_shards):
        b.write(s, a.read(s))
    for x, y in zip(src, dst):
        assert torch.equal(x.view(torch.uint8) if x.numel() else x, y.view(torch.uint8) if y.numel() else y)


@given(st.integers(1, 2000), st.integers(1, 8))
def test_balance_within_one_element(n, s):
    s = min(s, n)
    lay = ShardLayout([TensorSpec("a", n, torch.float32)], s)
    sizes = [lay.shard_numel(i) for i in range(s)]
    assert max(sizes) - min(sizes) <= 1


def test_module_roundtrip_through_wire_vector():
    torch.manual_seed(0)
    a, b = Mixed(), Mixed()
    a.bn.running_mean.uniform_()
    la = ShardLayout.from_module(a)
    ba, bb = la.bind_module(a), la.bind_module(b)
    for s in range(3):
        bb.write(s, ba.read(s))
    sa, sb = a.state_dict(), b.state_dict()
    for k in sa:
        if k.endswith("num_batches_tracked"):
            continue
        assert torch.equal(sa[k], sb[k]), k
