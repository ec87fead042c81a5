"""A tune on a Dask cluster (``mlagen tune --scheduler tcp://HOST:8786``): one more runner.

The search, the trial runner, the final re-timing and the records are the local tuner's
(:func:`mlagen.tune.loop.tune_class` with a :class:`mlagen.tune.runner.TrialRunner`); only where
the work runs changes. Compiles (:func:`mlagen.build._compile_one`, the local pool's task) run on
any worker of the cluster. Measurements run only on workers that declare a GPU
(``dask worker ... --resources "GPU=1"``), each in a :class:`mlagen.tune.worker.GpuWorker` process
that the Dask worker keeps between measurements (its timeout and restart after a crash or hang
as on one host). Before a tune the client asks each GPU worker which GPU it holds, and groups
them by kind (device name and SM count); every record is keyed by, and measured on, its kind.

Failures are data here too: a compile task whose worker dies is run again on another by Dask
(a compile is deterministic); a measurement whose worker dies or does not answer in time is a
``crash`` or ``hang`` trial, as on one host, and the worker is left out of what follows.
Trials and records go to the client's database. Nothing here is imported unless a scheduler is
given: Dask is an optional extra (``pip install mlagen[cluster]``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

from .. import arch, db, dispatch, resources
from .. import spec as spec_mod
from ..build import BuildResult, _compile_one
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


def measure(args: tuple, values: dict, iters: int, warmup: int | None, verify) -> dict:
    """One request of :meth:`GpuWorker.run` (runs on a GPU worker): the worker process of
    ``args`` (spec path, shape, seed, warm-up, timeout) is started on first use and kept; one of
    another class is stopped first, so one process holds the GPU."""
    w = _PROCESSES.get(args)
    if w is None:
        release()
        w = _PROCESSES[args] = GpuWorker(*args)
    return w.run(values, iters, warmup=warmup, verify=verify)


def release() -> None:
    """Stop the measuring processes of this worker (runs on a GPU worker)."""
    while _PROCESSES:
        _PROCESSES.popitem()[1].stop()


# --- on the client ----------------------------------------------------------------------------


def _wait(fut, seconds: float) -> None:
    from distributed import wait

    try:
        wait(fut, timeout=seconds)
    except TimeoutError:
        pass


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
            while not fut.done():
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
                _wait(fut, POLL_S)
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


class ClusterBuild:
    """Compiles on the cluster's workers: ``build(variants, on_built)`` as
    :meth:`mlagen.build.CompileQueue.build`, each compile a task on any worker; the resource
    model prunes on the client first, as the local queue does. Called with variants (the
    trial runner's guesses at the next batches), it starts their compiles at a lower priority,
    and a build that asks for one later takes that task; :meth:`cancel` drops the guesses no
    build took."""

    def __init__(self, client, target: str):
        self.client, self.target = client, target
        self._guessed: dict = {}   # variant -> its compile task, begun as a guess

    def _submit(self, v, priority: int):
        return self.client.submit(_compile_one, v.spec, dict(v.values), self.target, None, pure=False,
                                  priority=priority)

    def __call__(self, variants) -> None:
        t = arch.target(self.target)
        for v in variants:
            if v not in self._guessed and resources.check(v, t).ok:
                self._guessed[v] = self._submit(v, -1)

    def cancel(self) -> None:
        if self._guessed:
            self.client.cancel(list(self._guessed.values()))
            self._guessed.clear()

    def build(self, variants, on_built: Callable[[BuildResult], None]) -> None:
        from distributed import as_completed

        t = arch.target(self.target)
        futures = {}
        for v in variants:
            verdict = resources.check(v, t)
            if not verdict.ok:
                on_built(BuildResult(v, self.target, verdict.resources, "pruned", verdict.reasons))
                continue
            guessed = self._guessed.pop(v, None)
            futures[guessed or self._submit(v, 0)] = (v, guessed is not None)
        for fut in as_completed(list(futures)):
            v, ahead = futures[fut]
            try:
                status, reasons, binary, artifact, seconds = fut.result()
            except Exception as exc:   # lost on every worker it ran on (Dask's allowed failures)
                status, reasons, binary, artifact, seconds = "compile_error", (f"{type(exc).__name__}: {exc}",), \
                    None, None, 0.0
            on_built(BuildResult(v, self.target, resources.estimate(v), status, tuple(reasons), binary, artifact,
                                 seconds, ahead=ahead))


def compile_all(client, variants, target: str) -> list[BuildResult]:
    """Build ``variants`` for ``target`` on the cluster; results in input order."""
    out: dict = {}
    ClusterBuild(client, target).build(list(variants), lambda b: out.__setitem__(b.variant, b))
    return [out[v] for v in variants]


def tune(config: TuneConfig, scheduler, device_kind: str | None = None, progress: Callable[[str], None] = print,
         bar=None, probe_fn: Callable = probe, measure_fn: Callable = measure,
         clock: Callable[[], float] = time.monotonic) -> list[TuneResult]:
    """:func:`mlagen.tune.tune` on a Dask cluster: every shape class on every GPU kind the cluster
    holds (or those ``device_kind`` names), the kinds one after another, all the kind's GPUs
    measuring together. ``probe_fn`` and ``measure_fn`` run on the GPU workers (the tests pass
    simulated ones). Results come per kind and class, in that order; each result's ``shape`` is
    prefixed with its kind."""
    spec = spec_mod.load(config.spec)
    family = family_of(spec)
    classes = shape_classes(config.shapes, family)
    if not classes:
        raise TuningError("no shape to tune; give --shape or --workload")
    for c in classes:
        why = family.refuses(spec, c.shape)
        if why:
            raise TuningError(f"{spec.name} cannot tune {c.problem} ({family.describe_shape(c.shape)}): {why}")
    own = isinstance(scheduler, str)
    client = client_for(scheduler) if own else scheduler
    try:
        kinds = pick_kinds(gpu_kinds(client, probe_fn), device_kind)
        database = db.TuningDB(config.db_path)
        total_weight = sum(c.weight for c in classes)
        results = []
        for kind in kinds:
            target = arch.target(config.target or kind.target or "")
            if target.name not in spec.targets:
                progress(f"{kind.name}: {spec.name} does not target {target.name}; skipped")
                continue
            say = _prefixed(progress, kind)
            say(f"{len(kind.workers)} GPU worker(s): {', '.join(kind.workers)}")
            build = ClusterBuild(client, target.name)
            for c in classes:
                results.append(_tune_class(spec, c, kind, target, config, database, client, build, say, bar,
                                           None if config.budget_s is None else
                                           config.budget_s * c.weight / total_weight / len(kinds),
                                           measure_fn, probe_fn, clock))
        return results
    finally:
        if own:
            client.close()


def _tune_class(spec, c: ShapeClass, kind: Kind, target, config: TuneConfig, database, client, build: ClusterBuild,
                say, bar, budget, measure_fn, probe_fn, clock) -> TuneResult:
    # A packaged spec by name: the workers' hosts hold it at paths of their own.
    packaged = str(spec.path) in map(str, spec_mod.available())
    args = (spec.name if packaged else spec.path, c.shape, config.seed, config.warmup, config.timeout_s)
    bound = set(kind.workers)
    workers = [ClusterGpu(client, a, args, config.timeout_s, measure_fn, kind, bound, probe_fn) for a in kind.workers]
    key = dispatch.record_key(spec, c.problem, device=kind.device, sm_count=kind.sm_count, driver=kind.driver,
                              target=target)
    runner = TrialRunner(workers, build.build, config.iters, prefetch=build, warmup=config.warmup)
    try:
        r = tune_class(spec, c, target, config, database, runner, key, say, bar=bar, budget_s=budget, clock=clock)
    finally:
        for w in workers:
            w.stop()
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
