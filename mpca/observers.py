"""Who watches a run: the Trainer's observers, declared.

A :class:`RunObserver` hears a fit's ``start(settings)`` before the agents start, every history row (an evaluation
of the joint model: ``cycle``, ``wall_s``, ``holdout_error``, ``holdout_loss``, ``samples_per_s``, ``epochs``, the
agents' weights …) as a call, and ``finish(result)`` when it ends — the :class:`~mpca.trainer.FitResult`, or None
when it failed.  ``mpca train`` also hands it a few rows of the training data (``take_input_example``) and the
files it wrote (``log_outputs``).  The trackers of :mod:`mpca.tracking` are observers; a plain function of one
row is one too (:func:`observer_of` wraps it).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Union

from mpca.errors import UserError


class RunObserver:
    """A run's observer: override what you need; every hook does nothing by default."""

    def start(self, settings) -> None:
        """Before the agents start, with the run's settings."""

    def __call__(self, row: Dict[str, Any]) -> None:
        """A new history row."""

    def finish(self, result) -> None:
        """The fit ended: its FitResult, or None when it failed."""

    def take_input_example(self, df, data) -> None:
        """``mpca train``: a few rows of the training DataFrame ``df`` read as the job's ``data`` section says."""

    def log_outputs(self, outputs: Dict[str, Optional[str]]) -> None:
        """``mpca train``: the local paths of the files it wrote (model, history, plot, …)."""

    def describe(self) -> Dict[str, Any]:
        """Where it logs (``summary.json``'s ``tracking``)."""
        return {}


class _RowFunction(RunObserver):
    def __init__(self, fn: Callable[[Dict[str, Any]], None]):
        self.fn = fn

    def __call__(self, row: Dict[str, Any]) -> None:
        self.fn(row)


OnCycle = Union[RunObserver, Callable[[Dict[str, Any]], None], None]


def observer_of(on_cycle: OnCycle) -> RunObserver:
    """``on_cycle`` as an observer: a :class:`RunObserver` as it is, a function of one row wrapped, None: nobody."""
    if on_cycle is None:
        return RunObserver()
    if isinstance(on_cycle, RunObserver):
        return on_cycle
    if not callable(on_cycle):
        raise UserError(f"on_cycle must be a function of one history row or an mpca.RunObserver, got "
                        f"{type(on_cycle).__name__}")
    if any(callable(getattr(on_cycle, hook, None)) for hook in ("start", "finish")):
        raise UserError(f"on_cycle ({type(on_cycle).__name__}) has start/finish hooks: make it a subclass of "
                        "mpca.RunObserver so that the Trainer calls them")
    return _RowFunction(on_cycle)


__all__ = ["OnCycle", "RunObserver", "observer_of"]
