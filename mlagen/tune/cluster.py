"""A tune on a Dask cluster (``mlagen tune --scheduler tcp://HOST:8786``): one more runner.

The search, the trial runner, the final re-timing and the records are the local tuner's
(:func:`mlagen.tune.loop.tune_class` with a :class:`mlagen.tune.runner.TrialRunner`); only where
the work runs changes. Compiles (:func:`mlagen.build._compile_one`, the local pool's task) go
through the local tuner's :class:`mlagen.build.CompileQueue`, each a task on a worker with a
free compile slot (:class:`PlacedCompiles`: never the thread a GPU worker measures on).
Measurements run only on workers that declare a GPU (``dask worker ... --resources "GPU=1"``),
each in a :class:`mlagen.tune.worker.GpuWorker` process that the Dask worker starts as a class
begins (:func:`warm`) and keeps between measurements (its timeout and restart after a crash or
hang as on one host). Before a tune the client asks each GPU worker which GPU it holds, and
groups them by kind (device name and SM count); every record is keyed by, and measured on, its
kind.

Failures are data here too: a compile task whose worker dies is run again on another by Dask
(a compile is deterministic); a measurement whose worker dies or does not answer in time is a
``crash`` or ``hang`` trial, as on one host, and the worker is left out of what follows.
Trials and records go to the client's database. Nothing here is imported unless a scheduler is
given: Dask is an optional extra (``pip install mlagen[cluster]``).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from .. import arch, db, dispatch, resources
from .. import spec as spec_mod
from ..build import BuildResult, CompileQueue, _compile_one
from ..errors import TuningError
from .config import TuneConfig, TuneResult, family_of
from .loop import ShapeClass, shape_classes, tune_class
from .runner import TrialRunner
from .worker import GpuWorker

GPU_RESOURCE = "GPU"      # the worker resource a measuring worker declares (one per GPU)
SETUP_S = 300.0           # a measurement may wait this long for its worker process to start
REJOIN_S = 60.0           # how long a share whose worker was lost waits for another of its kind
POLL_S = 1.0              # how often a measurement's client looks whether its worker is still there


def client_for(scheduler):
    """A ``distributed.Client`` of ``scheduler`` (an address or a cluster object); TuningError
    without Dask."""
    try:
        from distributed import Client
    except ImportError:
        raise TuningError("--scheduler needs Dask: pip install 'mlagen[cluster]'") from None
    try:
        return Client(scheduler, timeout="30s")
    except OSError as exc:
        raise TuningError(f"--scheduler {scheduler}: cannot reach the scheduler ({exc})") from None


# --- on the Dask workers ----------------------------------------------------------------------

_PROCESSES: dict = {}   # on a GPU worker: the measuring process of the class being tuned


def probe() -> dict:
    """The GPU this Dask worker measures on (runs there)."""
    from ..runtime import device_info

    info = device_info(0)
    return {"device": info.name, "sm_count": info.sm_count, "driver": info.driver_version,
            "target": info.target.name if info.target else None}


def _process(args: tuple) -> GpuWorker:
    w = _PROCESSES.get(args)
    if w is None:
        release()
        w = _PROCESSES[args] = GpuWorker(*args, import_main=False)
    return w


def measure(args: tuple, values: dict, iters: int, warmup: int | None, verify) -> dict:
    """One request of :meth:`GpuWorker.run` (runs on a GPU worker): the worker process of
    ``args`` (spec path, shape, seed, warm-up, timeout) is started on first use and kept; one of
    another class is stopped first, so one process holds the GPU."""
    return _process(args).run(values, iters, warmup=warmup, verify=verify)


def warm(args: tuple) -> dict:
    """Start the worker process of ``args`` before its first measurement (runs on a GPU worker):
    the client sends this as a class begins, so the process starts (torch, a CUDA context, the
    shape's inputs and reference: seconds) while the first batch compiles, as a local tune's
    workers do. What it reports; a failure to start is left to the first measurement to report."""
    w = _process(args)
    if w.proc is None or not w.proc.is_alive():
        return w.start()
    return {}


def release() -> None:
    """Stop the measuring processes of this worker (runs on a GPU worker)."""
    while _PROCESSES:
        _PROCESSES.popitem()[1].stop()


# --- on the client ----------------------------------------------------------------------------


def _wait(fut, seconds: float) -> bool:
    """Whether ``fut`` is done, waiting at most ``seconds`` for it."""
    from distributed import wait

    try:
        wait(fut, timeout=seconds)
    except TimeoutError:
        pass
    return fut.done()


@dataclass(frozen=True)
class Kind:
    """GPUs of one kind in the cluster: what a record key names, and the workers holding one."""

    device: str
    sm_count: int
    driver: str
    target: str | None
    workers: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.device} ({self.sm_count} SMs)"


def _gpu_workers(client) -> list[str]:
    return [a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
            if w.get("resources", {}).get(GPU_RESOURCE, 0) >= 1]


def gpu_kinds(client, probe_fn: Callable = probe) -> list[Kind]:
    """The kinds of GPU the cluster's workers declare (resource ``GPU``), each asked which GPU it
    holds; TuningError if none declares one."""
    workers = _gpu_workers(client)
    if not workers:
        raise TuningError(f"no worker of the cluster declares a GPU: start them with --resources \"{GPU_RESOURCE}=1\"")
    futures = {a: client.submit(probe_fn, workers=[a], allow_other_workers=False, resources={GPU_RESOURCE: 1},
                                pure=False) for a in workers}
    groups: dict = {}
    for a, fut in futures.items():
        info = fut.result(timeout=SETUP_S)
        groups.setdefault((info["device"], info["sm_count"], info["driver"], info["target"]), []).append(a)
    return [Kind(*k, tuple(sorted(v))) for k, v in sorted(groups.items())]


def pick_kinds(kinds: list[Kind], wanted: str | None) -> list[Kind]:
    """Every kind, or those whose device name or target contains ``wanted`` (``--device-kind``)."""
    if wanted is None:
        return kinds
    picked = [k for k in kinds if wanted.lower() in k.device.lower() or wanted == k.target]
    if not picked:
        raise TuningError(f"--device-kind {wanted}: the cluster holds {', '.join(k.name for k in kinds)}")
    return picked


class ClusterGpu:
    """One GPU worker of the cluster as the trial runner's worker (``run`` as
    :meth:`GpuWorker.run`): a measurement is a task pinned to it. A worker that leaves the
    cluster, or does not answer within the trial's timeout, fails that trial (``crash``,
    ``hang``: recorded, never retried); the next measurement goes to another GPU worker of the
    same kind that no other share uses (the one its nanny restarted, or a new one), if one
    comes within ``REJOIN_S``, else fails at once too."""

    def __init__(self, client, address: str, args: tuple, timeout_s: float, measure_fn: Callable = measure,
                 kind: Kind | None = None, bound: set | None = None, probe_fn: Callable = probe):
        self.client, self.address, self.args, self.timeout_s = client, address, args, timeout_s
        self.measure_fn, self.kind, self.probe_fn = measure_fn, kind, probe_fn
        self.bound = bound if bound is not None else {address}   # addresses the kind's shares use
        self.lost = ""
        self.started = False
        self.replaced: list[str] = []   # why each worker given up was

    def _rejoin(self) -> bool:
        """Bind to a GPU worker of this kind that no share uses; False if none comes in time."""
        if self.kind is None:
            return False
        deadline = time.monotonic() + REJOIN_S
        while time.monotonic() < deadline:
            for a in _gpu_workers(self.client):
                if a in self.bound:
                    continue
                try:
                    info = self.client.submit(self.probe_fn, workers=[a], allow_other_workers=False,
                                              resources={GPU_RESOURCE: 1}, pure=False).result(timeout=SETUP_S)
                except Exception:
                    continue
                if (info["device"], info["sm_count"], info["driver"]) == (self.kind.device, self.kind.sm_count,
                                                                          self.kind.driver):
                    self.bound.discard(self.address)
                    self.bound.add(a)
                    self.replaced.append(self.lost)
                    self.address, self.lost, self.started = a, "", False
                    return True
            time.sleep(POLL_S)
        return False

    def run(self, values: dict, iters: int, warmup: int | None = None, verify=None) -> dict:
        if self.lost and not self._rejoin():
            return {"outcome": "crash", "detail": self.lost}
        fut = self.client.submit(self.measure_fn, self.args, values, iters, warmup, verify, workers=[self.address],
                                 allow_other_workers=False, resources={GPU_RESOURCE: 1}, pure=False)
        wait = self.timeout_s + (0 if self.started else SETUP_S) + 30
        deadline = time.monotonic() + wait
        try:
            # Waiting first: the usual measurement is answered within the first wait, with no
            # question to the scheduler (a round trip per measurement) on the way.
            while not _wait(fut, POLL_S):
                if time.monotonic() > deadline:
                    fut.cancel()
                    self.lost = f"dask worker {self.address} did not answer within {wait:.0f} s"
                    return {"outcome": "hang", "detail": self.lost}
                # A task pinned to a worker that died would wait for it for ever (Dask restarts a
                # worker under a new address): a worker gone from the scheduler fails the trial.
                if self.address not in self.client.nthreads():
                    fut.cancel()
                    self.lost = f"dask worker {self.address} left the cluster"
                    return {"outcome": "crash", "detail": self.lost}
            payload = fut.result()
        except Exception as exc:   # the worker died (KilledWorker), or the task could not run there
            self.lost = f"dask worker {self.address} lost: {type(exc).__name__}: {exc}"
            return {"outcome": "crash", "detail": self.lost}
        self.started = True
        return payload

    def stop(self) -> None:
        if not self.lost:
            try:
                self.client.submit(release, workers=[self.address], allow_other_workers=False,
                                   resources={GPU_RESOURCE: 1}, pure=False).result(timeout=60)
            except Exception:
                pass


def compile_slots(client) -> dict[str, int]:
    """Compiles each worker may run at once: its threads, less one on a GPU worker (the thread
    its measurements run on: a compile there would hold up the next measurement by a compile's
    time); every GPU worker's one thread where no worker has another to spare."""
    workers = client.scheduler_info(n_workers=-1)["workers"]
    gpu = {a for a, w in workers.items() if w.get("resources", {}).get(GPU_RESOURCE, 0) >= 1}
    slots = {a: w["nthreads"] - (a in gpu) for a, w in workers.items() if w["nthreads"] - (a in gpu) > 0}
    return slots or {a: 1 for a in workers}   # empty only while the cluster has no worker


class PlacedCompiles(cf.Executor):
    """The cluster as the compile pool of a :class:`mlagen.build.CompileQueue` (the local tuner's
    queue: real builds ahead of guesses, a reserve for them, the results kept, so the runner
    measures guesses ahead while the GPUs would wait): each compile is a Dask task placed on the
    worker with the most free compile slots (:func:`compile_slots`), so no compile takes a
    measuring thread; Dask runs a task again elsewhere if its worker dies (a compile is
    deterministic). ``jobs`` is the slots' total."""

    def __init__(self, client, slots: dict[str, int]):
        from distributed.cfexecutor import ClientExecutor

        self.slots = dict(slots)
        self.busy = dict.fromkeys(self.slots, 0)
        self._lock = threading.Lock()
        self._executor = ClientExecutor(client, pure=False)

    @property
    def jobs(self) -> int:
        return sum(self.slots.values())

    def submit(self, fn, /, *args, **kwargs) -> cf.Future:
        with self._lock:
            if not self.slots:   # no worker was known when the slots were counted (one restarting)
                return self._executor.submit(fn, *args, **kwargs)   # Dask places it when one is there
            address = max(self.slots, key=lambda a: self.slots[a] - self.busy[a])
            self.busy[address] += 1
        fut = self._executor.submit(fn, *args, workers=[address], allow_other_workers=True, **kwargs)
        fut.add_done_callback(lambda _f: self._free(address))
        return fut

    def _free(self, address: str) -> None:
        with self._lock:
            self.busy[address] -= 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._executor.shutdown(wait=wait)


def compile_all(client, variants, target: str) -> list[BuildResult]:
    """Build ``variants`` for ``target`` on the cluster (binaries included); results in input order."""
    from distributed import as_completed

    t = arch.target(target)
    out: dict = {}
    futures = {}
    for v in variants:
        verdict = resources.check(v, t)
        if not verdict.ok:
            out[v] = BuildResult(v, target, verdict.resources, "pruned", verdict.reasons)
        else:
            futures[client.submit(_compile_one, v.spec, dict(v.values), target, None, pure=False)] = v
    for fut in as_completed(list(futures)):
        v = futures[fut]
        try:
            status, reasons, binary, artifact, seconds = fut.result()
        except Exception as exc:   # lost on every worker it ran on (Dask's allowed failures)
            status, reasons, binary, artifact, seconds = "compile_error", (f"{type(exc).__name__}: {exc}",), \
                None, None, 0.0
        out[v] = BuildResult(v, target, resources.estimate(v), status, tuple(reasons), binary, artifact, seconds)
    return [out[v] for v in variants]


def tune(config: TuneConfig, scheduler, device_kind: str | None = None, progress: Callable[[str], None] = print,
         bar=None, probe_fn: Callable = probe, measure_fn: Callable = measure,
         clock: Callable[[], float] = time.monotonic, compile_fn: Callable = _compile_one,
         warm_fn: Callable | None = None) -> list[TuneResult]:
    """:func:`mlagen.tune.tune` on a Dask cluster: every shape class on every GPU kind the cluster
    holds (or those ``device_kind`` names), the kinds one after another, all the kind's GPUs
    measuring together. ``probe_fn`` and ``measure_fn`` run on the GPU workers, ``compile_fn`` (as
    :func:`mlagen.build._compile_one`) on any (the tests and ``tools/profile_cluster_tune.py`` pass
    simulated ones); ``warm_fn`` (default: :func:`warm` with the default ``measure_fn``, else none)
    starts a GPU worker's measuring process as a class begins. Results come per kind and class, in
    that order; each result's ``shape`` is prefixed with its kind."""
    spec = spec_mod.load(config.spec)
    family = family_of(spec)
    classes = shape_classes(config.shapes, family)
    if not classes:
        raise TuningError("no shape to tune; give --shape or --workload")
    for c in classes:
        why = family.refuses(spec, c.shape)
        if why:
            raise TuningError(f"{spec.name} cannot tune {c.problem} ({family.describe_shape(c.shape)}): {why}")
    if warm_fn is None and measure_fn is measure:
        warm_fn = warm
    began = time.monotonic()
    own = isinstance(scheduler, str)
    client = client_for(scheduler) if own else scheduler
    try:
        connected = time.monotonic()
        kinds = pick_kinds(gpu_kinds(client, probe_fn), device_kind)
        asked = time.monotonic()
        database = db.TuningDB(config.db_path)
        total_weight = sum(c.weight for c in classes)
        results = []
        for kind in kinds:
            target = arch.target(config.target or kind.target or "")
            if target.name not in spec.targets:
                progress(f"{kind.name}: {spec.name} does not target {target.name}; skipped")
                continue
            say = _prefixed(progress, kind)
            slots = compile_slots(client)
            say(f"{len(kind.workers)} GPU worker(s): {', '.join(kind.workers)}; {sum(slots.values())} compile "
                f"slot(s) on {len(slots)} worker(s); connected in {connected - began:.1f} s, the GPU workers "
                f"answered in {asked - connected:.1f} s")
            pool = PlacedCompiles(client, slots)
            queue = CompileQueue(pool, target.name, pool.jobs, compile_one=compile_fn)
            try:
                for c in classes:
                    results.append(_tune_class(spec, c, kind, target, config, database, client, queue, say, bar,
                                               None if config.budget_s is None else
                                               config.budget_s * c.weight / total_weight / len(kinds),
                                               measure_fn, probe_fn, clock, warm_fn))
            finally:
                queue.cancel()
                queue.close()
                pool.shutdown(wait=False)   # guesses still compiling are not waited for
        return results
    finally:
        if own:
            client.close()


def _tune_class(spec, c: ShapeClass, kind: Kind, target, config: TuneConfig, database, client, queue: CompileQueue,
                say, bar, budget, measure_fn, probe_fn, clock, warm_fn=None) -> TuneResult:
    # A packaged spec by name: the workers' hosts hold it at paths of their own.
    packaged = str(spec.path) in map(str, spec_mod.available())
    args = (spec.name if packaged else spec.path, c.shape, config.seed, config.warmup, config.timeout_s)
    bound = set(kind.workers)
    # The measuring processes start now, while the first batch compiles (each first measurement
    # queues behind its worker's start: one GPU task at a time).
    warming = [client.submit(warm_fn, args, workers=[a], allow_other_workers=False, resources={GPU_RESOURCE: 1},
                             pure=False) for a in kind.workers] if warm_fn is not None else []
    workers = [ClusterGpu(client, a, args, config.timeout_s, measure_fn, kind, bound, probe_fn) for a in kind.workers]
    key = dispatch.record_key(spec, c.problem, device=kind.device, sm_count=kind.sm_count, driver=kind.driver,
                              target=target)
    runner = TrialRunner(workers, queue.build, config.iters, prefetch=queue, warmup=config.warmup,
                         measure_ahead=config.measure_ahead)
    try:
        r = tune_class(spec, c, target, config, database, runner, key, say, bar=bar, budget_s=budget, clock=clock)
    finally:
        stopping = time.monotonic()
        for w in workers:
            w.stop()
        del warming   # a start that failed was the first measurement's to report
    say(f"  measuring processes stopped in {time.monotonic() - stopping:.1f} s")
    for w in workers:
        for why in w.replaced + ([w.lost] if w.lost else []):
            say(f"  {why}: the trial it measured was recorded as failed")
    return replace(r, shape=f"{kind.device}: {r.shape}")


def _prefixed(progress: Callable[[str], None], kind: Kind) -> Callable[[str], None]:
    """Lines of one kind's tune, marked with the kind (trial lines keep their indent)."""
    def say(line: str) -> None:
        progress(f"[{kind.device}] {line}")
    return say


def summary(results: list[TuneResult]) -> str:
    """One row per kind and class: trials, outcomes, the winner and its time."""
    rows = []
    for r in results:
        ok = sum(t.outcome == "ok" for t in r.trials)
        best = r.best.variant.symbol if r.best else "-"
        ms = f"{r.best.time_ms:.3f}" if r.best and r.best.time_ms else "-"
        rows.append((r.shape, r.problem, str(len(r.trials)), str(ok), best, ms, f"{r.seconds:.0f}"))
    head = ("kind: shape", "class", "trials", "ok", "winner", "ms", "s")
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(row, widths)) for row in (head, *rows))
