"""Running a batch of measurements on the GPU workers while the CPU pool compiles."""

from __future__ import annotations

import collections
import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping

from .. import verify as verify_mod
from .config import TrialResult
from .search import Ask

AHEAD_POLL_S = 0.005   # how often a batch waiting for compiles looks for idle GPUs



def _failed_build(b) -> TrialResult | None:
    if b.status == "pruned":  # by the resource model, or after compiling because it spills
        rep = b.report
        return TrialResult(b.variant, "pruned", registers=rep.registers if rep else None,
                           spills=(rep.spill_stores + rep.spill_loads) if rep else None, detail="; ".join(b.reasons))
    if b.status == "compile_error":
        return TrialResult(b.variant, "compile_error", detail=b.reasons[0][:4000] if b.reasons else "")
    return None


def _combine(parts: list[TrialResult]) -> TrialResult:
    """One measurement from its shares on several GPUs: the mean of their medians, so each GPU
    weighs the same for every variant; a share that failed fails the whole (the first failure in
    GPU order); the error is the largest any share's checks found."""
    failed = next((p for p in parts if p.outcome != "ok"), None)
    if failed is not None or len(parts) == 1:
        return failed or parts[0]
    first = parts[0]
    # The mean as an offset from the first share: equal shares give the first exactly (a sum
    # divided would not), so a tune of deterministic timings is the same on any number of GPUs.
    ms = first.time_ms + sum(p.time_ms - first.time_ms for p in parts) / len(parts)
    flops_per_ms = first.tflops * first.time_ms if first.tflops and first.time_ms else None
    tflops = first.tflops if ms == first.time_ms else flops_per_ms / ms if flops_per_ms else None
    errors = [p.max_error for p in parts if p.max_error is not None]
    return replace(first, time_ms=ms, tflops=tflops, max_error=max(errors) if errors else None)


def _trial_result(variant, payload: dict, build) -> TrialResult:
    rep = getattr(build, "report", None)
    return TrialResult(variant, payload.get("outcome", "crash"), payload.get("time_ms"), payload.get("tflops"),
                       payload.get("max_error"), rep.registers if rep else payload.get("registers"),
                       (rep.spill_stores + rep.spill_loads) if rep else payload.get("spills"),
                       payload.get("detail", ""))


_DROPPED = "dropped"   # a share not measured because the tune stops (the ask is dropped)
_SKIPPED = "skipped"   # a share not measured because another share of its ask failed


class _Batch:
    """One call of :meth:`TrialRunner.run`: its asks, their results and shares (one per worker),
    and whether it is answered or given up (interrupted)."""

    def __init__(self, asks, should_stop, on_result, workers: int, on_answered: Callable | None = None):
        self.asks, self.should_stop, self.on_result = asks, should_stop, on_result
        self.on_answered = on_answered   # called once every ask is answered (not on fail())
        self.results: list[TrialResult | None] = [None] * len(asks)
        self.shares: list[list] = [[None] * workers for _ in asks]
        self.failed = [False] * len(asks)   # a share failed: the others need not be measured
        self.started = [False] * len(asks)  # a worker has taken a share
        self.open = len(asks)          # asks not answered yet (dropped ones count as answered)
        self.answered = threading.Event()
        self.progressed = threading.Event()   # an ask was answered (set with ``answered`` too)
        self.aborted = threading.Event()
        self.errors: list[BaseException] = []
        self.busy = 0                  # shares being measured now (guarded by the runner's lock)
        self.lock = threading.Lock()
        if not asks:
            self.answered.set()

    def finish(self, i: int, r: TrialResult | None) -> None:
        with self.lock:
            if self.aborted.is_set():
                return
            self.results[i] = r
            if r is not None and self.on_result is not None:
                try:
                    self.on_result(self.asks[i], r)
                except BaseException as exc:
                    # Recording failed (the database: a full disk, a lock held too long). Called on a
                    # worker's thread: raised here it would end that thread and leave the batch
                    # unanswered for ever; the tune stops with the error instead.
                    self.errors.append(exc)
                    self.answered.set()
            self.open -= 1
            done = self.open == 0
            if done:
                self.answered.set()
            self.progressed.set()
        if done and self.on_answered is not None:
            self.on_answered(self)

    def partial(self) -> dict:
        """The new trials answered so far: variant -> ms (None: failed)."""
        with self.lock:
            return {a.variant: (r.time_ms if r.outcome == "ok" else None)
                    for a, r in zip(self.asks, self.results) if r is not None and not a.retime}

    def finish_share(self, i: int, w: int, r) -> None:
        """Worker ``w``'s share of ask ``i``: a TrialResult, ``_DROPPED`` or ``_SKIPPED``."""
        with self.lock:
            parts = self.shares[i]
            parts[w] = r
            if isinstance(r, TrialResult) and r.outcome != "ok":
                self.failed[i] = True
            if any(p is None for p in parts):
                return
        if any(p is _DROPPED for p in parts):
            self.finish(i, None)
        else:
            self.finish(i, _combine([p for p in parts if isinstance(p, TrialResult)]))

    def fail(self, exc: BaseException) -> None:
        self.errors.append(exc)
        self.answered.set()
        self.progressed.set()


@dataclass
class WorkerTime:
    """Where one worker's time went (seconds): measurements answered, the wall time the tuner
    waited for them (a restart after a crash included), and the worker's own account of it."""

    measurements: int = 0
    busy: float = 0.0
    load: float = 0.0
    verify: float = 0.0
    timing: float = 0.0
    checks: dict = field(default_factory=dict)   # seconds per check (verify.PARTS)

    def add(self, payload: dict, wall: float) -> None:
        self.measurements += 1
        self.busy += wall
        self.load += payload.get("load_s") or 0.0
        self.verify += payload.get("verify_s") or 0.0
        self.timing += payload.get("time_s") or 0.0
        for part, seconds in (payload.get("checks_s") or {}).items():
            self.checks[part] = self.checks.get(part, 0.0) + seconds


@dataclass
class CompileTime:
    """How long batches waited for their own compiles (seconds): from the moment a batch with new
    variants was handed to the compile pool until its first new variant was built (nothing of the
    batch's new trials can be measured before) and until all were built; ``ahead``: new variants
    found compiled already (guesses compiled while earlier batches were measured, or a warm cache)."""

    batches: int = 0
    variants: int = 0
    ahead: int = 0
    first: float = 0.0
    all: float = 0.0

    def add(self, variants: int, ahead: int, first: float, all_: float) -> None:
        self.batches += 1
        self.variants += variants
        self.ahead += ahead
        self.first += first
        self.all += all_


class TrialRunner:
    """Runs a batch of asks on the workers (one per GPU) and returns the results in the order of
    the asks, whatever order they finished in.

    Every measurement is split into shares, one per worker, each with an equal part of the timed
    calls (2 GPUs: 20 calls become 10 on each; the warm-up calls are divided too, at least one),
    and its time is the mean of the shares' medians: a batch of one variant keeps every GPU
    busy, and every variant is timed on the same GPUs for the same number of calls, so a GPU a
    little faster than its twin shifts them all alike, where handing whole variants to whichever
    GPU is free would rank them partly by the GPU they drew. Re-timings (successive halving, the
    finalists) the same way, the workers starting at different places in the list so that no
    variant is always measured first or last.

    A new trial is checked once: its checks (``mlagen.verify.PARTS``: the small awkward problem,
    the real shape) go to different workers, taking turns, and each worker times its share after
    its checks pass; a worker with no check to run times at once. A share that fails (wrong
    result, crash, hang) fails the trial, and shares not started yet are skipped. With one worker
    it checks everything, then times: as before shares existed. Re-timings are not checked again.

    New trials are compiled on the CPU pool (``build``, on a thread) and measured as each is
    built. Meanwhile the batches the search will probably ask for next (``lookahead``) are
    queued behind them to compile ahead (``prefetch``, a :class:`mlagen.build.CompileQueue`),
    so a cold compile cache holds up the next batch less; a guess changes no trial. When every
    GPU is idle because the batch still waits for a compile, the nearest compiled guess is
    measured (``measure_ahead``, with a compile queue): if the search asks for it later, that
    measurement is its trial, with nothing to wait for; the trials and their order are the same.

    ``workers`` have ``run(values, iters, warmup=, verify=) -> payload`` (:meth:`GpuWorker.run`);
    ``build(variants, on_built)`` compiles and calls ``on_built(build_result)`` as each finishes
    (:meth:`mlagen.build.CompileQueue.build`); ``warmup`` is the configured warm-up calls (None:
    each worker's own). One thread per worker serves the batches and ends when no batch is
    running, so a runner needs no closing. ``time`` says where each worker's time went."""

    def __init__(self, workers: list, build: Callable, iters: int, prefetch=None, warmup: int | None = None,
                 measure_ahead: bool = True):
        self.workers, self.build, self.iters, self.prefetch, self.warmup = workers, build, iters, prefetch, warmup
        self._cond = threading.Condition()   # guards the queues, threads and batch below
        self._queues = [collections.deque() for _ in workers]   # each worker's shares to measure
        self._threads: list = [None] * len(workers)
        self._batch: _Batch | None = None
        self._turn = 0                      # the worker that runs the next new trial's first check
        self._measuring = 0                 # shares being measured now, of any batch
        # Measuring ahead (see run()): guesses measured while the GPUs would idle, by variant.
        self.measure_ahead = measure_ahead and hasattr(prefetch, "results")
        self._ahead: dict = {}              # measured: variant -> TrialResult (None: dropped)
        self._ahead_running: dict = {}      # being measured: variant -> its one-ask batch
        self._claims: dict = {}             # asked for while being measured: variant -> (batch, i)
        self._guesses: list = []            # the latest guesses, nearest first
        self.time = [WorkerTime() for _ in workers]
        self.compile = CompileTime()
        self.ahead_used = 0                 # trials answered by a measurement made ahead
        self.ahead_made = 0

    def cancel_prefetch(self) -> None:
        """The search has ended: drop the guessed compiles not started yet."""
        if self.prefetch is not None:
            self.prefetch.cancel()

    def _take(self, w: int):
        """The next share of worker ``w``, or None when no batch is running (the thread ends)."""
        with self._cond:
            while True:
                if self._queues[w]:
                    return self._queues[w].popleft()
                if self._batch is None:
                    self._threads[w] = None
                    return None
                self._cond.wait()

    def _serve(self, w: int) -> None:
        while True:
            job = self._take(w)
            if job is None:
                return
            batch = job[0]
            with self._cond:
                batch.busy += 1
                self._measuring += 1
            try:
                self._measure(w, *job)
            finally:
                with self._cond:
                    batch.busy -= 1
                    self._measuring -= 1
                    self._cond.notify_all()

    def _measure(self, w: int, batch: _Batch, i: int, iters: int, warmup: int | None, checks: tuple, build) -> None:
        ask = batch.asks[i]
        with batch.lock:
            # Out of time: measure no new ask, but finish one another worker has begun (its
            # shares alone would be no measurement, and their GPU time lost).
            stop = batch.errors or batch.aborted.is_set() or (not batch.started[i] and batch.should_stop())
            batch.started[i] = batch.started[i] or not stop
        if stop:
            batch.finish_share(i, w, _DROPPED)
            return
        if batch.failed[i]:
            batch.finish_share(i, w, _SKIPPED)
            return
        t0 = time.monotonic()
        try:
            payload = self.workers[w].run(dict(ask.variant.values), iters, warmup=warmup, verify=checks)
        except BaseException as exc:  # a worker that cannot start stops the tune
            batch.fail(exc)
            return
        self.time[w].add(payload, time.monotonic() - t0)
        batch.finish_share(i, w, _trial_result(ask.variant, payload, build))

    def _measure_ahead(self, batch: _Batch, index: dict) -> None:
        """Every GPU idle while ``batch`` waits for its compiles: measure the nearest guess that
        is compiled (one at a time, so a build that comes waits at most one share). Its result
        answers the trial if the search asks for the variant later (a measurement is the same
        whenever it is made); the search, and so the trials, do not change. A guess never
        asked for costs GPU time the GPUs would have spent idle."""
        if not self.measure_ahead or batch.should_stop():
            return
        results = self.prefetch.results
        with self._cond:
            if self._measuring or any(self._queues) or self._ahead_running:
                return
            for v in self._guesses:
                b = results.get(v)
                if v in index or v in self._ahead or b is None or b.status != "ok":
                    continue
                ask = Ask(v)
                one = _Batch([ask], batch.should_stop, None, len(self.workers), on_answered=self._measured_ahead)
                self._ahead_running[v] = one
                self.ahead_made += 1
                iters, warmup = self._shares(ask)
                for k, checks in enumerate(self._checks()):
                    self._queues[k].append((one, 0, iters, warmup, checks, b))
                self._cond.notify_all()
                return

    def _measured_ahead(self, one: _Batch) -> None:
        v, r = one.asks[0].variant, one.results[0]
        with self._cond:
            self._ahead_running.pop(v, None)
            claim = self._claims.pop(v, None)
            if claim is None:
                self._ahead[v] = r
        if claim is not None:
            claim[0].finish(claim[1], r)

    def _shares(self, ask: Ask) -> tuple[int, int | None]:
        """(timed calls, warm-up calls) of one share of ``ask``; warm-up None: the worker's own."""
        n = len(self.workers)
        warmup = None if n == 1 or self.warmup is None else max(1, math.ceil(self.warmup / n))
        return math.ceil(self.iters * ask.scale / n), warmup

    def _checks(self) -> list[tuple[str, ...]]:
        """Each worker's checks of the next new trial: every check once, on workers taking turns."""
        n = len(self.workers)
        out: list[list[str]] = [[] for _ in range(n)]
        for j, part in enumerate(verify_mod.PARTS):
            out[(self._turn + j) % n].append(part)
        self._turn = (self._turn + 1) % n
        return [tuple(c) for c in out]

    def run(self, asks: list[Ask], should_stop: Callable[[], bool] = lambda: False, on_result: Callable | None = None,
            lookahead: Iterable[Iterable] | Callable[[Mapping], Iterable[Iterable]] = ()) -> list[TrialResult | None]:
        """One result per ask; None for an ask dropped because ``should_stop()`` said so.
        ``lookahead``: guessed batches, compiled ahead while this batch compiles and is measured,
        until it is answered; or a function of the batch's new trials measured so far (variant
        -> ms, None if failed) that returns them, asked again each time more are in (the newest
        guesses compile first)."""
        n = len(self.workers)
        batch = _Batch(asks, should_stop, on_result, n)
        index = {a.variant: i for i, a in enumerate(asks) if not a.retime}
        done_ahead = []
        with self._cond:
            for v, i in list(index.items()):   # measured ahead, or being measured ahead
                if v in self._ahead:
                    done_ahead.append((i, self._ahead.pop(v)))
                elif v in self._ahead_running:
                    self._claims[v] = (batch, i)
                else:
                    continue
                del index[v]
                self.ahead_used += 1
            self._batch = batch
            for w in range(n):
                if self._threads[w] is None:
                    self._threads[w] = threading.Thread(target=self._serve, args=(w,), daemon=True)
                    self._threads[w].start()
            retimes = [i for i, a in enumerate(asks) if a.retime]
            for k in range(n):
                first = k * len(retimes) // n
                for i in retimes[first:] + retimes[:first]:
                    self._queues[k].append((batch, i, *self._shares(asks[i]), (), None))
            self._cond.notify_all()
        for i, r in done_ahead:
            batch.finish(i, r)
        building = None
        try:
            if index:
                t0, first, ahead = time.monotonic(), [], [0]

                def on_built(b):
                    if not first:
                        first.append(time.monotonic())
                    if b.ahead or (b.binary is not None and b.binary.from_cache):
                        ahead[0] += 1
                    i = index[b.variant]
                    failed = _failed_build(b)
                    if failed is not None:
                        batch.finish(i, failed)
                        return
                    with self._cond:
                        iters, warmup = self._shares(asks[i])
                        for k, checks in enumerate(self._checks()):
                            self._queues[k].append((batch, i, iters, warmup, checks, b))
                        self._cond.notify_all()

                def build():
                    try:
                        self.build(list(index), on_built)
                    except BaseException as exc:   # raised by run(), below
                        batch.fail(exc)
                        return
                    done = time.monotonic()
                    self.compile.add(len(index), ahead[0], (first[0] if first else done) - t0, done - t0)

                # On a thread: the guesses below are made while this batch compiles, too.
                building = threading.Thread(target=build, name="mlagen-build", daemon=True)
                building.start()
            # Guessing costs CPU time (the resource model): spent here while the batch compiles
            # and the GPUs measure, and no longer than they do. Guesses queue behind this batch.
            if self.prefetch is not None:
                while not batch.answered.is_set():
                    batch.progressed.clear()
                    partial = batch.partial()
                    guesses = []
                    for guess in (lookahead(partial) if callable(lookahead) else lookahead):
                        if batch.answered.is_set():
                            break
                        guess = [v for v in guess if v not in index]
                        if guess:
                            self.prefetch(guess)
                            guesses += guess
                    self._guesses = guesses
                    if not callable(lookahead):
                        break
                    while not batch.progressed.wait(AHEAD_POLL_S):
                        self._measure_ahead(batch, index)
            batch.answered.wait()
            if building is not None and not batch.errors:
                building.join()   # its last result is in; the compile time is about to be added
            if batch.errors:   # record what the other workers are finishing before giving up
                with self._cond:
                    while batch.busy:
                        self._cond.wait()
        except BaseException:
            # Interrupted: the caller stops the workers; a trial they were running ends as a
            # "crash" that is the interruption's doing, so it must not be recorded or waited for.
            batch.aborted.set()
            raise
        finally:
            with self._cond:
                self._batch = None
                if batch.aborted.is_set() or batch.errors:
                    for q in self._queues:
                        q.clear()
                self._cond.notify_all()
        if batch.errors:
            raise batch.errors[0]
        return batch.results


# --- the tuning loop --------------------------------------------------------------------------
