"""The driver's timeline stays bounded on long runs: a window in memory, totals over the run, the rest spilled."""
import gc
import os

import pandas as pd
import pytest

from mpca.runtime.reports import AgentReport
from mpca.runtime.timeline import CycleRecord, Timeline


def _cycle(i: int) -> CycleRecord:
    """Cycle i: 100 + i bytes up, 10 * i down, rejected when i is 4, one correction every third cycle; its
    broadcast (0-1.5 s) overlaps its reduction (1-2 s) for even i, not for odd i (reduction from 1.6 s);
    cycle i lasts i / 10 s more than 2 s; cycle 0 broadcasts nothing (warm-up)."""
    return CycleRecord(i, i % 3, None if i == 0 else (i + 1) % 3, t_submit=100.0 * i, t_end=100.0 * i + 2 + i / 10,
                       bcast_end=100.0 * i + 1.5, reduce_start=100.0 * i + (1.0 if i % 2 == 0 else 1.6),
                       stage_shard=None if i < 2 else (i - 1) % 3, bytes_up=100 + i, bytes_down=10 * i,
                       rejected=i == 4, corrections=int(i % 3 == 0), misplaced=2 if i == 7 else 0,
                       missing=[1] if i == 5 else [], joined=[1] if i == 6 else [],
                       agents={a: AgentReport(agent=a, weight=float(i + a), steps_per_s=10.0 * a, resets=int(i == 2))
                               for a in (0, 1)})


def _open_in(directory) -> list:
    """This process's open files in ``directory`` (the spill file is unnamed: only its descriptor shows it)."""
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # the descriptor that listed the directory, closed since
            pass
    return [link for link in links if link.startswith(str(directory) + os.sep)]


def _timeline(n: int, window: int, spill_dir=None) -> Timeline:
    tl = Timeline(window, spill_dir=spill_dir)
    for i in range(n):
        tl.add(_cycle(i))
    return tl


def test_only_the_window_stays_in_memory_and_the_rest_is_spilled(tmp_path):
    tl = _timeline(10, window=3, spill_dir=str(tmp_path))
    assert [c.cycle for c in tl.cycles] == [7, 8, 9]
    assert tl.spilled == 7 and len(_open_in(tmp_path)) == 1 and os.listdir(tmp_path) == []  # nothing named
    for i in range(10, 50):
        tl.add(_cycle(i))
        assert len(tl.cycles) == 3  # bounded after every cycle, not once in a while
    assert tl.spilled == 47


def test_totals_are_the_sums_over_every_cycle_not_the_window(tmp_path):
    t = _timeline(10, window=3, spill_dir=str(tmp_path)).totals
    assert t.bytes_up == 1045  # 10 x 100 + (0 + ... + 9)
    assert t.bytes_down == 450  # 10 x 45
    assert t.exchanged == 9 and t.overlapped == 4  # cycles 1-9 broadcast; the even ones (2, 4, 6, 8) overlapped
    assert t.shards == {0, 1, 2}


def test_overlap_fraction_is_over_the_whole_run_after_the_warm_up(tmp_path):
    tl = _timeline(10, window=3, spill_dir=str(tmp_path))
    assert tl.overlap_fraction(skip=0) == pytest.approx(4 / 9)
    assert tl.overlap_fraction() == pytest.approx(3 / 7)  # cycles 3-9: 4, 6, 8 overlapped
    with pytest.raises(ValueError, match="skip"):
        tl.overlap_fraction(skip=17)


def test_the_whole_run_is_the_same_as_an_unbounded_timeline_s(tmp_path):
    bounded, unbounded = _timeline(25, window=4, spill_dir=str(tmp_path)), _timeline(25, window=10 ** 6)
    assert unbounded.spilled == 0 and bounded.spilled == 21
    assert bounded.rows() == unbounded.rows()
    pd.testing.assert_frame_equal(bounded.to_pandas(), unbounded.to_pandas())
    row = bounded.rows()[2]  # from the spill file: types kept (dicts keyed by agent, lists, None)
    assert row["weight"] == {0: 2.0, 1: 3.0} and row["resets"] == 2 and row["missing"] == []
    assert row["stage_shard"] == 1 and bounded.rows()[0]["bcast_shard"] is None


def test_csv_holds_every_cycle_written_in_chunks(tmp_path):
    bounded, unbounded = _timeline(25, window=4, spill_dir=str(tmp_path)), _timeline(25, window=10 ** 6)
    bounded.write_csv(str(tmp_path / "bounded.csv"), chunk=7)  # chunks of 7 rows: 4 chunks, one header
    unbounded.write_csv(str(tmp_path / "unbounded.csv"))
    text = (tmp_path / "bounded.csv").read_text()
    assert text == (tmp_path / "unbounded.csv").read_text()
    csv = pd.read_csv(tmp_path / "bounded.csv")
    assert list(csv["cycle"]) == list(range(25)) and csv["bytes_up"].sum() == 25 * 100 + 300
    assert text.splitlines()[1].startswith("0,0,,,1,0.0,2.0,")  # shards as integers, empty where none
    Timeline().write_csv(str(tmp_path / "empty.csv"))
    assert (tmp_path / "empty.csv").read_text().startswith("cycle,reduce_shard,bcast_shard,")


def test_the_spill_file_is_gone_on_close_at_the_end_of_a_with_and_when_collected(tmp_path):
    tl = _timeline(5, window=2, spill_dir=str(tmp_path))
    assert len(_open_in(tmp_path)) == 1 and _open_in(tmp_path)[0].endswith("(deleted)")
    tl.close()
    assert _open_in(tmp_path) == []
    assert [c.cycle for c in tl.cycles] == [3, 4] and tl.totals.bytes_up == 510  # window and totals stay
    with pytest.raises(RuntimeError, match="3 rows it had spilled are gone"):
        tl.to_pandas()
    with pytest.raises(RuntimeError, match="closed"):
        tl.add(_cycle(5))
    with _timeline(5, window=2, spill_dir=str(tmp_path)) as tl:
        assert len(_open_in(tmp_path)) == 1
    assert _open_in(tmp_path) == []
    tl = _timeline(5, window=2, spill_dir=str(tmp_path))
    del tl
    gc.collect()
    assert _open_in(tmp_path) == []


def test_rows_read_while_cycles_are_added_stay_in_order(tmp_path):
    tl = _timeline(6, window=2, spill_dir=str(tmp_path))
    rows = tl.iter_rows()
    assert next(rows)["cycle"] == 0
    tl.add(_cycle(6))  # spills cycle 4 while cycles 1-3 are still to be read: the reader has its own offset
    assert [r["cycle"] for r in rows] == [1, 2, 3, 4, 5] and [r["cycle"] for r in tl.iter_rows()] == list(range(7))


def test_a_short_run_writes_no_file(tmp_path):
    tl = _timeline(5, window=5, spill_dir=str(tmp_path))
    assert tl.spilled == 0 and _open_in(tmp_path) == []
    assert len(tl.to_pandas()) == 5


def test_window_is_a_validated_setting():
    from mpca.config import settings_from
    from mpca.errors import UserError

    assert settings_from().training.timeline_window == 1000
    assert settings_from(timeline_window=50).training.timeline_window == 50
    with pytest.raises(UserError, match="timeline_window"):
        settings_from(timeline_window=0)
    with pytest.raises(ValueError, match="window"):
        Timeline(0)


def test_a_broadcast_counts_as_delivered_when_the_last_agent_held_it_within_its_job():
    """The first useful exchange's moment: the deliver tasks' latest hand-off (executors' clocks), bounded by the
    job's submission and end (the driver's clock); the job's end where nothing was delivered."""
    assert CycleRecord(1, 1, 0, t_submit=10.0, t_end=11.2, bcast_end=10.6).delivered_at() == 10.6
    assert CycleRecord(1, 1, 0, t_submit=10.0, t_end=11.2, bcast_end=12.0).delivered_at() == 11.2  # clock ahead
    assert CycleRecord(1, 1, 0, t_submit=10.0, t_end=11.2, bcast_end=9.5).delivered_at() == 10.0  # clock behind
    assert CycleRecord(1, 1, None, t_submit=10.0, t_end=11.2).delivered_at() == 11.2


def test_overlap_is_computed_from_timestamps():
    tl = Timeline()
    a = CycleRecord(0, 0, 1, t_submit=0.0, t_end=2.0, bcast_end=1.5, reduce_start=1.0)
    b = CycleRecord(1, 1, 2, t_submit=3.0, t_end=5.0, bcast_end=3.5, reduce_start=4.0)
    tl.add(a)
    tl.add(b)
    assert a.broadcast_overlaps_reduce() and not b.broadcast_overlaps_reduce()
    assert tl.overlap_fraction(skip=0) == 0.5
