"""Build many variants: prune with the resource model, then render and compile in parallel.

Compilation needs no GPU. Work runs in spawned worker processes (NVRTC is CPU-bound and a
spawned process never inherits a CUDA context); results, failures included, come back as data.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from . import arch, knobs, resources
from . import spec as spec_mod
from . import variant as variant_mod
from .compiler import Binary, KernelResources, for_target, save_binary, spill_reason
from .errors import CompileError, MlagenError
from .render import render


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
        binary = for_target(target).compile(render(v), target)
    except CompileError as exc:
        return "compile_error", (str(exc),), None, None, time.perf_counter() - t0
    spilled = spill_reason(binary)
    if spilled:  # never launched or recorded as a candidate, so no artifact either
        return "pruned", (spilled,), binary, None, time.perf_counter() - t0
    artifact = str(save_binary(binary, Path(out_dir) / target)) if out_dir else None
    return "ok", (), binary, artifact, time.perf_counter() - t0


def _worker_init() -> None:
    # Ctrl-C reaches every process of the terminal's process group: the workers leave it to the
    # parent, which cancels what is pending and terminates them (abort_pool), so an interrupt
    # neither waits for the running compiles nor prints a traceback per worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def compile_pool(jobs: int | None = None) -> cf.ProcessPoolExecutor:
    """A pool of spawned compile processes; pass it to several build_many calls to pay the
    process start-up (interpreter, imports, NVRTC load) once."""
    return cf.ProcessPoolExecutor(max_workers=jobs or knobs.compile_workers(),
                                  mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init)


def abort_pool(pool: cf.Executor) -> None:
    """Stop a pool now: cancel pending jobs and terminate the workers (a compile inside NVRTC
    cannot be interrupted any other way), without waiting for running jobs."""
    # The executor forgets its processes and queues in shutdown(): take them first.
    processes = list((getattr(pool, "_processes", None) or {}).values())
    call_queue = getattr(pool, "_call_queue", None)
    result_queue = getattr(pool, "_result_queue", None)
    # The call queue is fed by a thread writing to a pipe that only the (soon terminated) workers
    # read; the executor joins that thread when it winds down, so a write blocked on a full pipe
    # would hang the exit. Nothing queued is wanted any more: do not wait for it.
    if call_queue is not None:
        call_queue.cancel_join_thread()
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
                i = futures[fut]
                try:
                    payload = fut.result()
                except MlagenError as exc:
                    payload = ("compile_error", (str(exc),), None, None, 0.0)
                except Exception as exc:  # a crashed worker is a failed build, not a failed tool
                    payload = ("compile_error", (f"{type(exc).__name__}: {exc}",), None, None, 0.0)
                finish(i, payload)
        except BaseException:  # Ctrl-C (KeyboardInterrupt) or a failure of ours: stop at once
            abort_pool(executor)
            raise
        finally:
            if own:
                executor.shutdown()
    return [results[i] for i in range(len(items))]


class Prefetch:
    """Compiles guessed variants into the compile cache in the background, on a shared pool.

    The tuner guesses which variants the search will ask for next and compiles them while the
    GPUs measure the current batch, when the pool would otherwise be idle; the real build then
    finds them in the cache (or waits on the cache entry's lock for a compile under way). A
    guess is compiled once per session. :meth:`cancel` drops the guesses not yet started, so a
    real build never queues behind them."""

    def __init__(self, pool: cf.Executor, target: str):
        self.pool, self.target = pool, target
        self.lock = threading.RLock()   # a future done at once runs its callback inside __call__
        self.pending: dict[variant_mod.Variant, cf.Future] = {}
        self.compiled: dict[variant_mod.Variant, bool] = {}   # done: compiled, without spilling?
        self.waiting: dict[variant_mod.Variant, list] = {}

    def __call__(self, variants: Iterable[variant_mod.Variant],
                 on_compiled: Callable[[variant_mod.Variant], None] | None = None) -> None:
        """Queue ``variants`` (those the resource model accepts) in order; ``on_compiled(v)`` is
        called (from a pool thread, or at once if it is done) when ``v`` compiled without error
        and without spilling."""
        for v in variants:
            with self.lock:
                done = self.compiled.get(v)
                if done is None:
                    if v not in self.pending and not resources.check(v, arch.target(self.target)).ok:
                        self.compiled[v] = False
                        continue
                    if on_compiled is not None:
                        self.waiting.setdefault(v, []).append(on_compiled)
                    if v not in self.pending:
                        fut = self.pool.submit(_compile_one, v.spec, dict(v.values), self.target, None)
                        self.pending[v] = fut
                        fut.add_done_callback(lambda f, v=v: self._done(v, f))
                    continue
            if done and on_compiled is not None:
                on_compiled(v)

    def _done(self, v: variant_mod.Variant, fut: cf.Future) -> None:
        with self.lock:
            if self.pending.get(v) is not fut:
                return
            del self.pending[v]
            waiting = self.waiting.pop(v, [])
            if fut.cancelled():
                return
            ok = fut.exception() is None and fut.result()[0] == "ok"
            self.compiled[v] = ok   # the result (the binary) is not kept: the cache has it
        if ok:
            for call in waiting:
                call(v)

    def cancel(self) -> int:
        """Cancel the guesses not started yet (they may be queued again); returns how many."""
        with self.lock:
            futures = list(self.pending.values())
        return sum(f.cancel() for f in futures)   # each runs _done, which forgets it
