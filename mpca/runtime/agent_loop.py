"""The agent's training loop (a part of :class:`mpca.runtime.agent.Agent`, which holds the state it uses):
steps at full speed on its rows, or on the ramp while they still arrive (:mod:`mpca.data.stream`), each under
the step lock that the exchange's requests are let in through first, on the emulated device's clock
(:mod:`mpca.exchange.device`), with the rule's hooks in the exchange core's order
(:mod:`mpca.exchange.agent_step`); a non-finite loss resets the replica to the last joint model it received."""
from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import traceback
from typing import Optional, Tuple

import torch

from mpca.data.arrow import UnreadableRows
from mpca.data.checks import found_in_agent, unreadable
from mpca.data.stream import ramp_rows
from mpca.exchange.agent_step import BatchOrder, batch_seed, forward_backward, optimizer_step
from mpca.runtime.agent_leave import hand_in

log = logging.getLogger("mpca.agent")


class TrainingLoop:
    """The training half of an agent; :class:`~mpca.runtime.agent.Agent` mixes it in with its answers to the
    driver (:class:`~mpca.runtime.agent_answers.ExchangeAnswers`)."""

    def train_forever(self) -> None:
        if self.error:  # its rows were refused: it answers until stopped, so that the driver says why
            return
        gen = torch.Generator().manual_seed(batch_seed(self.spec.seed, self.id))
        bs = self.spec.training.batch_size
        self.model.train()
        if self.spec.training.agent_cpus:
            os.sched_setaffinity(0, self.spec.training.agent_cpus)  # on Linux: this (training) thread only
        try:
            batches_of = self.joins  # the joins the process's own batch order follows (a join starts it afresh)
            while self.joining and not self._should_stop():  # a replacement: no steps before the joint model
                time.sleep(0.02)
            ramped = self.loading is None or self._ramp(gen, bs)  # its rows all there (else: stopped, refused)
            n = self.features.shape[0]
            device = None if self.data_on_host else self.device  # rows in file order on the host: indices sorted there
            batches = BatchOrder(n, bs, gen=gen, device=device) if n else None  # after the ramp's draws
            while ramped and not self._should_stop():
                if n == 0:  # an empty partition: nothing to learn from, contribute weight 0
                    time.sleep(0.05)
                    if time.time() - self.last_contact > self.spec.idle_timeout_s:
                        break
                    continue
                while self.joining and not self._should_stop():  # told it replaces a lost process
                    time.sleep(0.02)
                if self._should_stop():
                    break
                joins = self.joins
                if joins != batches_of:  # joined from the joint model: a fresh process's batches, as a replacement's
                    batches, batches_of = BatchOrder(n, bs, batch_seed(self.spec.seed, self.id), device=device), joins
                idx = batches.next()
                if self.data_on_host:  # rows in file order: fewer, longer reads from the page cache
                    self._timed_step(self.features, self.labels, idx.sort().values, joins)
                else:
                    self._timed_step(self.features, self.labels, idx, joins)
                if batches.epoch_done and self._driver_gone():
                    break
            if self.leaving:  # its executor is being decommissioned: hand in what it holds, then say so
                hand_in(self)
                log.warning("agent %s left the run (its executor is being decommissioned)", self.id)
        except Exception:
            self.error = f"agent {self.id} training failed:\n{traceback.format_exc()}"

    def _timed_step(self, features: torch.Tensor, labels: torch.Tensor, idx: torch.Tensor, joins: int) -> bool:
        """One training step on rows ``idx`` (moved to the device where they are not there), drawn after join
        number ``joins``, on the emulated device's clock, then the rule's hook between steps; in lock step, within
        the cycle's window.  False where it was not taken (stopping, or a join came since the batch was drawn)."""
        if self.pace is not None:
            self.pace.before_step()
            if self._should_stop():
                return False
        started = self.device_clock.start(self.exchange_s)
        x, y = features[idx], labels[idx]
        if not self.step(x.to(self.device), y.to(self.device), joins):
            return False
        self.device_clock.finish(started, self.exchange_s)  # unlocked: the exchange is served meanwhile
        t = time.perf_counter()
        self.rule.between_steps()  # may wait for a round or talk to the parameter service
        self.exchange_s += time.perf_counter() - t
        return True

    def _driver_gone(self) -> bool:
        if time.time() - self.last_contact > self.spec.idle_timeout_s:
            self.error = f"agent {self.id}: no exchange for {self.spec.idle_timeout_s:.0f}s; driver presumed gone"
            return True
        return False

    def _loading_failure(self, loading) -> Tuple[str, bool]:
        """Why its rows stopped arriving: (the line, whether it is the user's data to fix)."""
        if loading.problem:
            return found_in_agent(loading.problem, self.id), True
        if isinstance(loading.error, UnreadableRows):
            return found_in_agent(unreadable(self.spec.data.features, self.spec.data.label, loading.error), self.id), True
        return f"agent {self.id} could not read its rows: {loading.error!r}", False

    def _ramp(self, gen: torch.Generator, bs: int) -> bool:
        """Training while its rows arrive (:mod:`mpca.data.stream`): ramp step r draws its batch from the first
        ``ramp_rows(r)`` rows, waiting where fewer are there yet; once they are all there and the ramp covers
        them, every row goes to the device for the epochs.  False where it must not go on (stopped, its rows
        refused or unreadable, the driver gone)."""
        loading, r = self.loading, 0
        while not self._should_stop():
            while self.joining and not self._should_stop():
                time.sleep(0.02)
            want = ramp_rows(r)
            there = loading.wait(want, timeout=0.05)
            if loading.problem or loading.error is not None:
                self.error, self.user_error = self._loading_failure(loading)
                return False
            if loading.done and there <= want:
                break
            if there < want:  # its steps outran the rows' arrival
                if self._driver_gone():
                    return False
                continue
            features, labels = loading.view()
            joins = self.joins
            if self._timed_step(features, labels, torch.randint(want, (bs,), generator=gen), joins):
                r += 1
        if self._should_stop():
            return False
        features, labels = loading.rows()
        self.features = features if self.data_on_host else features.to(self.device)
        self.labels = labels if self.data_on_host else labels.to(self.device)
        self.ramp_steps = r
        log.info("agent %s: all %d rows there after %d ramp steps", self.id, len(labels), r)
        return True

    @contextlib.contextmanager
    def _served(self):
        """The step lock for a request of the exchange: the training loop lets it in before its next step.

        (CPython's lock is not fair: a loop that releases and re-takes it between millisecond steps could
        otherwise keep a waiting request out for seconds.)"""
        with self._waiting_lock:
            self._waiting += 1
        try:
            with self.lock:
                yield
        finally:
            with self._waiting_lock:
                self._waiting -= 1

    def step(self, x: torch.Tensor, y: torch.Tensor, joins: Optional[int] = None) -> bool:
        """One step on batch ``(x, y)``, under the step lock; False (not taken) while the agent waits for the joint
        model, or where a join came after the batch was drawn (``joins``: the joins it was drawn after) — a join
        starts the batch order afresh, as a replacement process's.  In lock step the window counts the step
        before the lock is released, so a join between the two cannot count it in its fresh window."""
        while self._waiting:  # a request of the exchange is waiting for the lock: let it in first
            time.sleep(0.0002)
        with self.lock:
            if self.joining or (joins is not None and joins != self.joins):
                return False
            loss = forward_backward(self.rule, self.model, self.optimizer, self.spec.loss_fn, x, y)
            t = time.perf_counter()
            self.rule.after_backward()  # e.g. DDP's all-reduce
            self.exchange_s += time.perf_counter() - t
            optimizer_step(self.rule, self.optimizer)
            self.steps += 1
            if self.pace is not None:
                self.pace.stepped()
            self.samples += int(x.shape[0])
            if self.steps % 10 == 0 or self.steps == 1:  # every 10 steps (a device sync), and the first one
                self.last_loss = float(loss.detach())
                if not math.isfinite(self.last_loss):
                    self._reset(f"loss {self.last_loss} at step {self.steps}")
        if self.service is not None:
            self.last_contact = time.time()  # agent-initiated: a dead driver fails the next service request
        return True

    def _reset(self, why: str) -> None:
        """Numerical fault (lock held): back to the latest joint model this agent received (the initial one for
        shards never delivered), with a fresh optimizer; the rule starts over (MPCA: τ from 0)."""
        self.resets += 1
        log.warning("agent %s: %s; reset to the joint model (reset %d)", self.id, why, self.resets)
        with torch.no_grad():
            for s, pieces in enumerate(self._anchor):
                torch._foreach_copy_(self.shards.views(s), pieces)
        self.optimizer = self.spec.optimizer_fn(self.model.parameters())
        self.rule.ctx.optimizer = self.optimizer
        self.rule.on_reset()
