"""Compressed exchange on a real local-cluster: every algorithm family trains with int8 (up and down, with
error feedback), and the bytes each cycle moves are those of the wire format, measured where they are sent."""
import pytest

from mpca.algorithm.wire import Codec
from mpca.data.datasets import dataset_dataframe
from mpca.trainer import Trainer
from tests import helpers

pytestmark = pytest.mark.cluster()

SETTINGS = dict(agents=2, input_shape=(1, 8, 8), eval_every_cycles=5)


@pytest.mark.parametrize("algorithm", ["mpca", {"name": "sync", "every": 10}, {"name": "diloco", "every": 10},
                                       {"name": "easgd", "every": 5}, {"name": "downpour", "every": 5}],
                         ids=["mpca", "sync", "diloco", "easgd", "downpour"])
def test_each_algorithm_trains_digits_with_int8_on_the_wire(spark, algorithm):
    df = dataset_dataframe(spark, "digits")
    fit = Trainer(helpers.small_cnn, helpers.cross_entropy, helpers.adam, algorithm=algorithm, wire="int8",
                  max_seconds=25, target_error=0.2, spark=spark, **SETTINGS).fit(df)
    assert fit.final.error < 0.35, (fit.algorithm, fit.final.error)
    numel = sum(p.numel() for p in helpers.small_cnn().parameters())
    if fit.counters.service_bytes:  # agent-initiated: every request and answer is one int8 model
        assert fit.counters.service_bytes % Codec("int8").nbytes(numel) == 0
    else:
        totals = fit.timeline.totals
        assert totals.bytes_up > 0 and totals.bytes_up <= 0.27 * 4 * numel * fit.cycles * 2


def test_mpca_cycles_move_a_quarter_of_the_fp32_bytes_with_int8(spark):
    df = dataset_dataframe(spark, "digits")
    runs = {fmt: Trainer(helpers.small_cnn, helpers.cross_entropy, helpers.adam, wire=fmt, max_cycles=9,
                         spark=spark, **SETTINGS).fit(df) for fmt in ("fp32", "bf16", "int8")}
    per_yield = {fmt: sum(c.bytes_up for c in f.timeline.cycles) / sum(len(c.agents) for c in f.timeline.cycles)
                 for fmt, f in runs.items()}
    assert per_yield["bf16"] / per_yield["fp32"] <= 0.52 and per_yield["int8"] / per_yield["fp32"] <= 0.27
    assert runs["int8"].final.error < 0.6


def test_an_int8_checkpoint_holds_the_driver_residuals_and_resumes_with_them(spark, tmp_path, caplog):
    """The driver's error feedback (one residual per broadcast shard) goes into the checkpoint; a resumed run
    restores it and goes on training from the checkpoint's cycle."""
    import logging

    import numpy as np

    from mpca import checkpoint

    df = dataset_dataframe(spark, "digits")
    common = dict(wire="int8", spark=spark, checkpoint_dir=str(tmp_path), checkpoint_every=3, **SETTINGS)
    Trainer(helpers.small_cnn, helpers.cross_entropy, helpers.adam, max_cycles=7, **common).fit(df)
    ck = checkpoint.latest(str(tmp_path))
    wire = ck.wire
    assert wire["format"] == "int8" and sorted(wire["broadcast"]) == ["0", "1", "2"]  # every shard went down
    assert all(float(r.abs().max()) > 0 for r in wire["broadcast"].values())
    with caplog.at_level(logging.INFO, logger="mpca.run"):
        second = Trainer(helpers.small_cnn, helpers.cross_entropy, helpers.adam, max_cycles=ck.cycle + 6,
                         resume=True, **common).fit(df)
    assert "the driver's int8 residuals of 3 streams restored" in caplog.text
    assert second.first_cycle == ck.cycle and second.cycles == ck.cycle + 6
    assert np.isfinite(second.final.error) and second.final.error < 0.6


def test_ddp_with_int8_keeps_replicas_identical_and_sends_a_quarter_of_the_fp32_ring(spark):
    """DDP's compression hook (mpca.algorithm.ring): every replica applies the same decoded bytes, so the
    models stay bit-identical step after step, and a step sends 2 (K − 1) / K of the int8 gradient."""
    fit = Trainer(helpers.small_cnn, helpers.cross_entropy, helpers.adam, wire="int8", max_seconds=20,
                  algorithm={"name": "ddp", "verify_every": 1, "min_cycle_interval_s": 0.5},
                  spark=spark, **SETTINGS).fit(dataset_dataframe(spark, "digits"))
    last = fit.timeline.cycles[-1].agents
    d0, d1 = (last[a].extra["digests"] for a in (0, 1))
    common = sorted(set(d0) & set(d1), key=int)
    assert len(common) >= 20 and all(d0[s] == d1[s] for s in common)
    assert len({d0[s] for s in common}) == len(common)  # and they moved every step
    grads = sum(p.numel() for p in helpers.small_cnn().parameters() if p.requires_grad)
    fp32_ring = 4 * grads * 2 * (2 - 1) / 2
    per_step = last[0].extra["wire_bytes"] / last[0].steps
    assert 0.24 * fp32_ring <= per_step <= 0.27 * fp32_ring, per_step / fp32_ring
    assert fit.final.error < 0.35
