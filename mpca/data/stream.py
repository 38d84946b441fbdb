"""An agent's rows while they load (``data.stream``): training starts on the first ones, the rest arrive in the
background.

Spark hands an agent its partition as a stream of Arrow batches; reading every row before the first step is
most of an agent's start-up on a large partition.  :class:`LoadingRows` takes the batches in a thread of the
agent's process into buffers that double as they fill, and publishes how many rows are ready; the agent
starts once :data:`START_ROWS` rows (or all of them) are there.

Off by default: the load then shares the executor's cores with training and the exchange.  Measured on this
2-core machine (``mpca bench compare --regime resnet110-gbe --no-tune --repeats 3 --algorithms mpca``, four
agents of 250 k rows, 2026-11-27): the first useful exchange came 7.9 s after the clock's 0 instead of 9.9 s,
but the agents' rows were all there only at 8.5 s (4.9 s when read first), the cycles during the load took
up to 4.6 s, 24% came at 28.4 s (27.2–35.9) against 29.4 s (27.9–29.4), and every streamed run was
INVALID (the machine 95–97% busy, against 78–89%; a later run of 3 reading first was at 86–98%: four agents
on two cores sit at the emulation's limit in this regime).  Where an executor has cores to spare for the
load, or a partition takes minutes to read, turn it on.

Which rows a step may draw from does not depend on how fast they arrive: step ``r`` of the agent's ramp
draws its batch uniformly (with replacement) from the first :func:`ramp_rows` ``(r)`` rows, a count that
doubles every :data:`RAMP_DOUBLING_STEPS` steps, and waits where fewer are loaded yet. Once every row is
there and the ramp covers them, the agent goes on in epochs of random permutations, as it did before. With
the same data, layout and seed, an agent therefore draws the same rows in every run (a deterministic
algorithm, e.g. ``sync``, stays deterministic), and an agent waits for its data only where its steps outrun
Spark's delivery — never longer than a full read before its first step took.

The labels of each batch are checked as it arrives (:func:`mpca.data.checks.labels_problem`); a problem
stops the loading and is the agent's error, one line for the user, at its next answer to the driver.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable, Optional, Sequence, Tuple

import numpy as np
import torch

from mpca.data.arrow import label_dtype

START_ROWS = 1024  # rows an agent waits for before its first step (or all of its rows, where fewer)
RAMP_DOUBLING_STEPS = 8  # the rows a ramp step may draw from double every this many steps


def ramp_rows(step: int) -> int:
    """How many of the first rows ramp step ``step`` (0, 1, ...) draws from: START_ROWS, doubled every
    RAMP_DOUBLING_STEPS steps."""
    return START_ROWS << min(step // RAMP_DOUBLING_STEPS, 40)


class LoadingRows:
    """Rows arriving in chunks (features float32 ``(n, *input_shape)``, labels int64 or float32), readable
    while they arrive: :meth:`ready` is how many rows are there, :meth:`view` tensors holding at least those."""

    def __init__(self, input_shape: Sequence[int], check: Optional[Callable[[torch.Tensor], Optional[str]]] = None):
        self.input_shape = tuple(input_shape)
        self.check = check  # one line for labels the model cannot take, else None
        self._x: Optional[torch.Tensor] = None
        self._y: Optional[torch.Tensor] = None
        self._n = 0
        self._changed = threading.Condition()
        self.done = False
        self.problem: Optional[str] = None  # the labels' problem (the user's to fix)
        self.error: Optional[BaseException] = None  # the load failed otherwise
        self.finished_at: Optional[float] = None
        self._dropping = False  # the agent ended before its rows: the rest is read and dropped
        self._thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ the loading side
    def load(self, batches: Iterable[Any], convert: Callable[[Any], Optional[Tuple[np.ndarray, np.ndarray]]]) -> None:
        """Take every batch, ``convert``-ed to (features, labels) (None: no rows) — the loading thread's body. The
        input is read to its end whatever happens (Spark's Python worker expects its input consumed); the rows
        there stay readable."""
        try:
            for b in batches:
                if self._dropping or self.problem or self.error:
                    continue
                try:
                    arrays = convert(b)
                    if arrays is None:
                        continue
                    problem = self.check(torch.from_numpy(np.asarray(arrays[1]))) if self.check else None
                    if problem:
                        self.problem = problem
                        continue
                    self._append(*arrays)
                except Exception as e:  # noqa: BLE001 - the agent reports it
                    self.error = e
        except BaseException as e:  # noqa: BLE001 - the input itself failed: the agent reports it
            self.error = self.error or e
        finally:
            with self._changed:
                self.done, self.finished_at = True, time.time()
                self._changed.notify_all()

    def start(self, batches: Iterable[Any], convert, name: str = "mpca-load") -> None:
        """:meth:`load` in a thread of this process."""
        self._thread = threading.Thread(target=self.load, args=(batches, convert), name=name, daemon=True)
        self._thread.start()

    def drop_rest(self, timeout: Optional[float] = None) -> None:
        """The agent is done: what has not arrived is read and dropped; returns once the input has ended."""
        self._dropping = True
        if self._thread is not None:
            self._thread.join(timeout)

    def _append(self, x: np.ndarray, y: np.ndarray) -> None:
        k = len(x)
        if k == 0:
            return
        y = y.astype(label_dtype(y))
        n = self._n
        if self._x is None or n + k > len(self._x):  # double: readers keep the tensors they hold, rows [0, n) alike
            cap = max(2 * (len(self._x) if self._x is not None else 0), n + k, START_ROWS)
            nx = torch.empty((cap, *x.shape[1:]), dtype=torch.float32)
            ny = torch.empty((cap, *y.shape[1:]), dtype=torch.from_numpy(y[:0]).dtype)  # labels per row or position
            if n:
                nx[:n], ny[:n] = self._x[:n], self._y[:n]
            self._x, self._y = nx, ny
        self._x[n:n + k] = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        self._y[n:n + k] = torch.from_numpy(y)
        with self._changed:
            self._n = n + k  # published after the rows are written
            self._changed.notify_all()

    # ------------------------------------------------------------------ the training side
    def ready(self) -> int:
        return self._n

    def wait(self, rows: int, timeout: float) -> int:
        """Until ``rows`` rows are there or the load ended (at most ``timeout`` s); the rows there."""
        with self._changed:
            self._changed.wait_for(lambda: self._n >= rows or self.done, timeout)
            return self._n

    def view(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """Features and labels of the rows there so far (and perhaps more, not yet written: index below
        :meth:`ready` only)."""
        x, y = self._x, self._y
        if x is None:
            return torch.zeros((0, *self.input_shape)), torch.zeros(0, dtype=torch.int64)
        return x, y

    def rows(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """All of the rows, exactly (once :attr:`done`): the buffers cut to size."""
        x, y = self.view()
        n = self._n
        if x.shape[0] == n:
            return x, y
        return x[:n].clone(), y[:n].clone()
