"""What an executor's Python worker imports for the control and exchange jobs: no torch
(:mod:`mpca.algorithm.weighted_sum`, the lazy :mod:`mpca.algorithm` package).

A fresh interpreter per check (this test process has torch already). In a fresh session each worker that
imports torch costs ~2 s of CPU while the agents start; `python -m lab.coldstart` measures the effect.
"""
import subprocess
import sys

import pytest

# every module a control or exchange task's function comes from (mpca.runtime.control / jobs / exchange /
# scatter) and what its pickled arguments are made of (records, reports, the wire's codec)
EXCHANGE_PATH = ["mpca.runtime.control", "mpca.runtime.jobs", "mpca.runtime.exchange", "mpca.runtime.scatter",
                 "mpca.runtime.record", "mpca.runtime.reports", "mpca.algorithm.wire", "mpca.algorithm.weighted_sum",
                 "mpca.exchange.partials", "mpca.exchange.presence", "mpca.exchange.timeouts"]


def test_the_control_and_exchange_tasks_modules_import_without_torch():
    code = "import sys\n" + "".join(f"import {m}\n" for m in EXCHANGE_PATH) + "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.split() == ["False"]


@pytest.mark.parametrize("name,module", [("WeightedSum", "mpca.algorithm.weighted_sum"),
                                         ("Algorithm", "mpca.algorithm.base"),
                                         ("build_algorithm", "mpca.algorithm.registry")])
def test_the_algorithm_package_imports_a_name_and_its_module_when_first_used(name, module):
    code = (f"import sys, mpca.algorithm as a\nbefore = {module!r} in sys.modules\nvalue = getattr(a, {name!r})\n"
            f"print(before, {module!r} in sys.modules, value.__module__)")
    before, after, where = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                          text=True).stdout.split()
    assert (before, after, where) == ("False", "True", module)


def test_the_teacher_rows_worker_imports_torch_after_its_last_row_only():
    """Its rows come without torch; its worker then goes back to the pool with torch loaded, for an agent
    (mpca.data.synthetic.generate_rows)."""
    code = ("import sys, pyarrow as pa\nfrom mpca.data.synthetic import TeacherTask, generate_rows\n"
            "ids = [pa.RecordBatch.from_pydict({'id': pa.array(range(lo, lo + 100), pa.int64())}) for lo in (0, 100)]\n"
            "rows = generate_rows(TeacherTask(rows=1000, features=8, hidden=8), iter(ids))\n"
            "print(next(rows).num_rows, 'torch' in sys.modules)\n"
            "print(sum(b.num_rows for b in rows), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.split() == ["100", "False", "100", "True"]
