"""Build kernels: the one compile step every kernel goes through, and many variants in parallel.

:func:`compile_source` is the one way rendered source becomes a binary: a spec's variant (here,
in dispatch, in the tuner's workers) and a family's helper kernel that no spec describes (the FP8
staging kernels, through :func:`helper_kernel`, which also loads it), so all of them share the
compile cache, the errors (CompileError with the compiler's log) and the per-device loading.

Building many variants prunes them with the resource model, then renders and compiles them in
parallel. Compilation needs no GPU. Work runs in spawned worker processes (NVRTC is CPU-bound and a
spawned process never inherits a CUDA context); results, failures included, come back as data.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import heapq
import logging
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable

from . import arch, knobs, resources, runtime
from . import spec as spec_mod
from . import variant as variant_mod
from .compiler import Binary, KernelResources, for_target, save_binary, spill_reason
from .errors import CompileError, MlagenError, NoDeviceError
from .render import render
from .runtime import Kernel
from .source import Source

log = logging.getLogger("mlagen")


def compile_source(source: Source, target: str) -> Binary:
    """Compile rendered ``source`` for ``target`` with its vendor's compiler, through the compile
    cache; CompileError (with the compiler's log and the source's path) if it fails."""
    return for_target(target).compile(source, target)


_helpers: dict[tuple, Binary] = {}
_helpers_lock = threading.Lock()


def helper_kernel(make_source: Callable[..., Source], *args, device: int) -> Kernel:
    """A kernel no spec describes (a family's helper, such as the FP8 staging kernels), built
    for device ``device``'s target and loaded into that device's context: compiled by
    :func:`compile_source` and loaded by the runtime as dispatch loads a spec's kernel (once per
    device, into that device's context whichever device is current).

    ``make_source(*args)`` renders it, once per (``make_source``, ``args``, target) in a process;
    ``args`` must be hashable. A helper that spills is run and logged, not rejected: there is no
    other kernel to take its place."""
    info = runtime.device_info(device)
    target = info.target
    if target is None:
        raise NoDeviceError(f"{info.name} (compute {info.compute[0]}.{info.compute[1]}) is not a known target")
    key = (make_source, args, target.name)
    binary = _helpers.get(key)
    if binary is None:
        with _helpers_lock:
            binary = _helpers.get(key)
            if binary is None:
                binary = compile_source(make_source(*args), target.name)
                r = binary.resources
                if r.spills:
                    log.warning("helper kernel %s spills registers under %s (%d bytes spill stores, %d bytes "
                                "spill loads); running it anyway", binary.symbol, binary.compiler, r.spill_stores,
                                r.spill_loads)
                _helpers[key] = binary
    return runtime.runtime().load(binary, device)


@dataclass(frozen=True)
class BuildResult:
    variant: variant_mod.Variant
    target: str
    estimate: resources.Resources | None
    # "ok", "pruned" (by the resource model before compiling, or after compiling because the
    # kernel spills: then ``binary`` holds the report) or "compile_error"
    status: str
    reasons: tuple[str, ...] = ()     # why pruned, or the compile error
    binary: Binary | None = None
    artifact: str | None = None
    seconds: float = 0.0
    ahead: bool = False               # compiled (or begun) before a build asked for it

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def report(self) -> KernelResources | None:
        return self.binary.resources if self.binary else None


def _compile_one(spec: spec_mod.KernelSpec, values: dict, target: str, out_dir: str | None) -> tuple:
    """Worker entry: returns (status, reasons, binary, artifact, seconds); never raises for
    failures of the variant itself.

    The spec travels itself (it pickles), not its path: a spec built in memory, or a file changed
    since it was loaded, must not silently build another kernel than the variant names."""
    t0 = time.perf_counter()
    v = variant_mod.make(spec, values)
    try:
        binary = compile_source(render(v), target)
    except CompileError as exc:
        return "compile_error", (str(exc),), None, None, time.perf_counter() - t0
    spilled = spill_reason(binary)
    if spilled:  # never launched or recorded as a candidate, so no artifact either
        return "pruned", (spilled,), binary, None, time.perf_counter() - t0
    artifact = str(save_binary(binary, Path(out_dir) / target)) if out_dir else None
    return "ok", (), binary, artifact, time.perf_counter() - t0


def _payload(fut: cf.Future) -> tuple:
    """A finished compile's result as :func:`_compile_one` returns it; a failure of the compile
    process (it raised, or died) becomes a compile error of the variant, not of the tool."""
    try:
        return fut.result()
    except MlagenError as exc:
        return "compile_error", (str(exc),), None, None, 0.0
    except Exception as exc:
        return "compile_error", (f"{type(exc).__name__}: {exc}",), None, None, 0.0


PARENT_POLL_S = 0.2  # how often a compile process looks whether its parent still lives


def _worker_init(parent: int | None = None) -> None:
    # Ctrl-C reaches every process of the terminal's process group: the workers leave it to the
    # parent, which cancels what is pending and terminates them (abort_pool), so an interrupt
    # neither waits for the running compiles nor prints a traceback per worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent is not None:
        _exit_with_parent(parent)


def _exit_with_parent(parent: int) -> None:
    """End this process soon after ``parent`` dies, however it died (SIGTERM, SIGHUP, SIGKILL:
    no handler of the parent's can run for the last), instead of compiling on as an orphan that
    keeps multiprocessing's resource tracker alive too (its pipe closes with the last worker).

    A thread watches the parent's pid rather than prctl(PR_SET_PDEATHSIG): that signal follows
    the parent *thread* that started the worker, and the tuner starts workers from a thread of
    its own that ends before the pool does. NVRTC compiles release the GIL, so the watch runs
    during them."""

    def watch():
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="mlagen-parent-watch", daemon=True).start()


def compile_pool(jobs: int | None = None) -> cf.ProcessPoolExecutor:
    """A pool of spawned compile processes; pass it to several build_many calls to pay the
    process start-up (interpreter, imports, NVRTC load) once."""
    return cf.ProcessPoolExecutor(max_workers=jobs or knobs.compile_workers(),
                                  mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init,
                                  initargs=(os.getpid(),))


_ABORTED_QUEUES: list = []  # the queues of aborted pools, kept until exit (abort_pool)


def abort_pool(pool: cf.Executor) -> None:
    """Stop a pool now: cancel pending jobs and terminate the workers (a compile inside NVRTC
    cannot be interrupted any other way), without waiting for running jobs."""
    # The executor forgets its processes and queues in shutdown(): take them first.
    processes = list((getattr(pool, "_processes", None) or {}).values())
    call_queue = getattr(pool, "_call_queue", None)
    result_queue = getattr(pool, "_result_queue", None)
    manager = getattr(pool, "_executor_manager_thread", None)
    # The call queue is fed by a thread writing to a pipe that only the (soon terminated) workers
    # read; the executor joins that thread when it winds down, so a write blocked on a full pipe
    # would hang the exit. Nothing queued is wanted any more: do not wait for it.
    if call_queue is not None:
        call_queue.cancel_join_thread()
    # The queues' locks are named semaphores. Freed in the feeder thread (a daemon) or the manager
    # thread, their finalizer (unlink the semaphore, then tell multiprocessing's resource tracker)
    # can be cut between the two by the interpreter's exit, and the tracker prints a "leaked
    # semaphore" warning after "interrupted" (seen in CI; traced: 1 of 6 interrupted runs freed
    # them in the feeder). Held here, they are finalized by the main thread's exit handlers.
    _ABORTED_QUEUES.extend(q for q in (call_queue, result_queue) if q is not None)
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        if p.is_alive():
            p.terminate()
    for p in processes:
        p.join(1)
        if p.is_alive():
            p.kill()
            p.join(1)
    # A worker terminated in the middle of writing a result leaves half a message in the result
    # pipe, and the executor's manager thread waits for the rest of it forever; the interpreter
    # joins that thread at exit (seen: about 1 in 16 interrupted `build --all` runs hung after
    # "interrupted", in _python_exit, the manager blocked in recv). With every worker gone, closing the parent's (unused) write end
    # turns the wait into end-of-file, which the manager treats as a broken pool and winds down.
    writer = getattr(result_queue, "_writer", None)
    if writer is not None and not any(p.is_alive() for p in processes):
        writer.close()
    # Let the manager wind down now (it sees the broken pool at once): at exit, Python 3.11's
    # concurrent.futures wakes every manager through a pipe the manager closes when it stops,
    # unlocked, and a manager stopping in that moment makes the exit print a traceback (seen once
    # in about 480 interrupted builds). A stopped manager's pipe is marked closed first.
    if manager is not None and manager.is_alive():
        manager.join(0.5)


def build_many(variants: Iterable[variant_mod.Variant], targets: Iterable[str], jobs: int | None = None,
               out_dir: Path | str | None = None,
               progress: Callable[[BuildResult, int, int], None] | None = None,
               pool: cf.Executor | None = None) -> list[BuildResult]:
    """Prune then compile every (variant, target); results in input order. ``pool`` reuses a
    :func:`compile_pool`; without one a pool is made for this call."""
    jobs = jobs or knobs.compile_workers()
    work, results = [], {}
    items = [(v, t) for v in variants for t in targets]
    for i, (v, t) in enumerate(items):
        verdict = resources.check(v, arch.target(t))
        if verdict.ok:
            work.append(i)
        else:
            results[i] = BuildResult(v, t, verdict.resources, "pruned", verdict.reasons)
    done = 0
    for i in sorted(results):
        done += 1
        if progress:
            progress(results[i], done, len(items))

    def finish(i: int, payload: tuple) -> None:
        nonlocal done
        v, t = items[i]
        status, reasons, binary, artifact, seconds = payload
        results[i] = BuildResult(v, t, resources.estimate(v), status, tuple(reasons), binary, artifact, seconds)
        done += 1
        if progress:
            progress(results[i], done, len(items))

    out = str(out_dir) if out_dir is not None else None
    if pool is None and (jobs <= 1 or len(work) <= 1):
        for i in work:
            v, t = items[i]
            finish(i, _compile_one(v.spec, dict(v.values), t, out))
    else:
        own = pool is None
        executor = compile_pool(min(jobs, len(work))) if own else pool
        try:
            futures = {executor.submit(_compile_one, items[i][0].spec, dict(items[i][0].values), items[i][1], out): i
                       for i in work}
            for fut in cf.as_completed(futures):
                finish(futures[fut], _payload(fut))
        except BaseException:  # Ctrl-C (KeyboardInterrupt) or a failure of ours: stop at once
            abort_pool(executor)
            raise
        finally:
            if own:
                executor.shutdown()
    return [results[i] for i in range(len(items))]


class CompileQueue:
    """The tuner's compiler: variants of one target compiled on a shared pool, each once per
    session, what the GPUs wait for ahead of what the search only guesses it will want.

    :meth:`build` is a real build, the batch about to be measured: its variants go ahead of
    every guess, and ``reserve`` of the pool's ``jobs`` processes are never given to guesses,
    so a batch nobody guessed starts compiling at once instead of queueing behind seconds of
    guesses. Calling the queue (``queue(variants)``) adds guesses: the newest call's first, in
    the order given, then older ones; a guess is never dropped because a real build came (it is
    likely the batch after), only by :meth:`cancel` (the search has ended). A variant the
    resource model rejects is never compiled. Results are kept (without the binary's bytes: the
    compile cache on disk has them, and the GPU worker loads from there), so a variant guessed
    right is built at once when its batch comes; one still compiling is waited for.

    A thread of the queue's own starts the compiles (a pool's callbacks must not submit to it);
    :meth:`close` ends it. ``compile_one`` is what a pool process runs (:func:`_compile_one`'s
    arguments and result); tests and ``tools/simulate_tune.py`` pass stand-ins."""

    def __init__(self, pool: cf.Executor, target: str, jobs: int, reserve: int | None = None,
                 compile_one: Callable | None = None):
        self.pool, self.target, self.jobs = pool, target, max(1, jobs)
        # Room in the reserve for a descent's batch (a sweep over one tunable: a few values).
        self.reserve = min(self.jobs - 1, max(1, self.jobs // 4)) if reserve is None else reserve
        self.compile_one = compile_one or _compile_one
        self.results: dict[variant_mod.Variant, BuildResult] = {}
        self._cond = threading.Condition()
        self._running: dict[variant_mod.Variant, cf.Future] = {}
        self._unwanted: set = set()              # running compiles no build wants yet
        self._wanted: dict[variant_mod.Variant, None] = {}     # queued for a build, in order
        self._guesses: dict[variant_mod.Variant, tuple] = {}   # queued guess -> its place
        self._heap: list = []                    # (place, symbol, variant); stale entries skipped
        self._calls = 0                          # guess calls so far (newer calls go first)
        self._waiting: dict[variant_mod.Variant, list] = {}    # variant -> callbacks for its result
        self._ahead: set = set()                 # begun before a build wanted them
        # compiles started and finished, their seconds, and how each variant a build asked for
        # was found: "ready" (compiled ahead), "begun" (a guess under way), "new" (not guessed)
        self.counts: collections.Counter = collections.Counter()
        self._closed = False
        self._broken: str | None = None          # why the pool stopped taking work
        self._thread: threading.Thread | None = None

    # -- guesses -----------------------------------------------------------------------------

    def __call__(self, variants: Iterable[variant_mod.Variant]) -> None:
        """Queue guesses, ahead of older guesses (those the resource model rejects are skipped)."""
        target = arch.target(self.target)
        with self._cond:
            self._calls += 1
            call = self._calls
        for n, v in enumerate(variants):
            if self._known(v) or not resources.check(v, target).ok:   # the resource model is slow: unlocked
                continue
            with self._cond:
                place = (-call, n)
                if self._known(v) or self._guesses.get(v, (1, 0)) <= place:
                    continue
                self._guesses[v] = place
                heapq.heappush(self._heap, (place, v.symbol, v))
                self._wake()

    def cancel(self) -> int:
        """Forget the guesses not started yet; returns how many."""
        with self._cond:
            n = len(self._guesses)
            self._guesses.clear()
            self._heap.clear()
            return n

    @property
    def pending(self) -> int:
        """Compiles running or queued now."""
        with self._cond:
            return len(self._running) + len(self._guesses) + len(self._wanted)

    def _known(self, v) -> bool:
        with self._cond:
            return v in self.results or v in self._running or v in self._wanted

    # -- builds ------------------------------------------------------------------------------

    def build(self, variants: Iterable[variant_mod.Variant], on_built: Callable[[BuildResult], None]) -> None:
        """Build ``variants`` now (the tuner's ``build``): ``on_built(result)`` for each as it is
        ready (from this thread or the pool's), returning when all are. A result compiled, or
        begun, before this call wanted it has ``ahead`` set."""
        target = arch.target(self.target)
        variants = list(dict.fromkeys(variants))
        if self._broken is not None:
            raise MlagenError(self._broken)
        left = [len(variants)]
        all_done = threading.Event()

        def done(r: BuildResult) -> None:
            on_built(r)
            with self._cond:
                left[0] -= 1
                if left[0] == 0:
                    all_done.set()

        ready = []
        for v in variants:
            pruned = None
            if not self._known(v):
                verdict = resources.check(v, target)
                if not verdict.ok:
                    pruned = BuildResult(v, self.target, verdict.resources, "pruned", verdict.reasons)
            with self._cond:
                if pruned is not None:
                    self.results.setdefault(v, pruned)
                known = self.results.get(v)
                if known is not None:
                    by_model = known.status == "pruned" and known.binary is None   # never compiled
                    self.counts["pruned" if by_model else "ready"] += 1
                    ready.append(known if pruned is not None else _compiled_ahead(known))
                    continue
                if self._broken is not None:   # the pool stopped while this batch was queued
                    ready.append(BuildResult(v, self.target, None, "compile_error", (self._broken,)))
                    continue
                if v in self._running:   # a guess under way: now wanted, so off the guesses' share
                    self.counts["begun"] += 1
                    self._ahead.add(v)
                    self._unwanted.discard(v)
                elif v not in self._wanted:
                    self.counts["new"] += 1
                    self._guesses.pop(v, None)
                    self._wanted[v] = None
                self._waiting.setdefault(v, []).append(done)
                self._wake()
        for r in ready:
            done(r)
        while variants and not all_done.wait(0.5):   # a timeout: Ctrl-C reaches a waiting thread
            pass

    def summary(self) -> str:
        """What the queue did, for the tuner's log."""
        c = self.counts
        mean = c["seconds"] / c["compiled"] if c["compiled"] else 0.0
        return (f"{c['compiled']} compiled ({mean:.1f} s each in its process), {c['started'] - c['compiled']} "
                f"under way at the end; of the variants the batches asked for {c['ready']} were compiled ahead, "
                f"{c['begun']} under way, {c['new']} not guessed, {c['pruned']} pruned by the resource model")

    # -- the pool ----------------------------------------------------------------------------

    def close(self) -> None:
        """End the queue's thread (compiles under way finish in the pool)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _wake(self) -> None:
        """Called with the lock held: let the thread start what now fits."""
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._dispatch, name="mlagen-compile-queue", daemon=True)
            self._thread.start()
        self._cond.notify_all()

    def _dispatch(self) -> None:
        with self._cond:
            while not self._closed:
                self._start_what_fits()
                self._cond.wait()

    def _start_what_fits(self) -> None:
        """Wanted compiles first; guesses only outside the reserve (lock held)."""
        while len(self._running) < self.jobs:
            if self._wanted:
                v = next(iter(self._wanted))
                del self._wanted[v]
            elif self._heap and len(self._unwanted) < self.jobs - self.reserve:
                place, _, v = heapq.heappop(self._heap)
                if self._guesses.get(v) != place:
                    continue   # moved up by a newer call, or cancelled
                del self._guesses[v]
                self._unwanted.add(v)
            else:
                return
            try:
                fut = self.pool.submit(self.compile_one, v.spec, dict(v.values), self.target, None)
            except Exception as exc:   # shut down (interrupted), broken (a process died), or a pool's own error
                # Any error: a dispatch thread that died here would leave every build waiting forever.
                self._stop_taking_work(v, f"the compile pool stopped: {type(exc).__name__}: {exc}")
                return
            self._running[v] = fut
            self.counts["started"] += 1
            fut.add_done_callback(lambda f, v=v: self._finished(v, f))

    def _stop_taking_work(self, v: variant_mod.Variant, reason: str) -> None:
        """The pool refused ``v``: it and every wanted variant fail (so no build waits forever),
        the guesses are dropped, and the next build raises ``reason`` (lock held)."""
        self._broken = reason
        self._unwanted.discard(v)
        calls = []
        for w in [v, *self._wanted]:
            r = BuildResult(w, self.target, None, "compile_error", (reason,))
            calls += [(call, r) for call in self._waiting.pop(w, [])]
        self._wanted.clear()
        self._guesses.clear()
        self._heap.clear()
        self._closed = True
        for call, r in calls:
            call(r)

    def _finished(self, v: variant_mod.Variant, fut: cf.Future) -> None:
        payload = (("compile_error", ("the compile was cancelled",), None, None, 0.0) if fut.cancelled()
                   else _payload(fut))
        status, reasons, binary, artifact, seconds = payload
        if binary is not None:
            binary = replace(binary, data=b"")   # the disk cache has the bytes
        r = BuildResult(v, self.target, resources.estimate(v), status, tuple(reasons), binary, artifact, seconds)
        with self._cond:
            self._running.pop(v, None)
            self._unwanted.discard(v)
            if not fut.cancelled():
                self.results[v] = r
                self.counts["compiled"] += 1
                self.counts["seconds"] += seconds
            waiting = self._waiting.pop(v, [])
            if v in self._ahead:
                r = _compiled_ahead(r)
            self._cond.notify_all()
        for call in waiting:
            call(r)


def _compiled_ahead(r: BuildResult) -> BuildResult:
    """``r`` as a build finds it when it was compiled, or begun, before the build asked."""
    return r if r.ahead else replace(r, ahead=True)
