"""What an exchange task does on its executor (mpca.runtime.exchange)."""
from __future__ import annotations

import pytest


def test_exchange_work_runs_niced_without_renicing_the_worker():
    import os
    import threading

    from mpca.runtime.exchange import EXCHANGE_NICENESS, run_niced

    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    inner = run_niced(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    assert inner == EXCHANGE_NICENESS or before >= EXCHANGE_NICENESS
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
    with pytest.raises(KeyError):
        run_niced(lambda: {}["x"])
