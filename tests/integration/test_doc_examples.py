"""The Python examples of README.md and docs/ that are marked ``<!-- example: runs -->`` (:mod:`tests.doc_examples`),
run as a reader runs them: in a fresh namespace holding only what the text says the reader brings — ``spark``
(the shared local-cluster session) and ``df`` (the bundled digits, features and label).  Identical blocks (the
README's example is also the Python API page's) run once.  What each example says it gives is checked: the
trained model, its history and timeline, and the target it asks for."""
import pytest
import torch

from mpca.data.datasets import dataset_dataframe
from tests.doc_examples import MARKDOWN, python_blocks

RUNNABLE = {}
for _path in MARKDOWN:
    for _block in python_blocks(_path):
        if _block.mark == "runs":
            RUNNABLE.setdefault(_block.code, _block)


def test_the_docs_have_examples_that_run():
    assert len(RUNNABLE) >= 1


@pytest.mark.parametrize("code", list(RUNNABLE), ids=[b.where for b in RUNNABLE.values()])
def test_a_runnable_example_runs_and_gives_what_it_says(spark, code):
    namespace = {"spark": spark, "df": dataset_dataframe(spark, "digits", partitions=2)}
    exec(compile(code, RUNNABLE[code].where, "exec"), namespace)
    result = namespace["result"]
    assert isinstance(result.model, torch.nn.Module)
    assert len(result.history) > 1 and len(result.timeline.to_pandas()) == result.cycles > 0
    assert result.stop_reason == "target_error" and result.final.error <= 0.03, (result.stop_reason, result.final.error)
