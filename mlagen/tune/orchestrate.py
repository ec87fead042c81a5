"""A whole tune: the shape classes in order, the workers and the compile pool for each."""

from __future__ import annotations

import threading
import time
from typing import Callable

from .. import arch, db, dispatch, knobs
from .. import spec as spec_mod
from ..build import CompileQueue, abort_pool, compile_pool
from ..errors import MlagenError, TuningError
from .config import TuneConfig, TuneResult, family_of
from .loop import ShapeClass, _class_search, shape_classes, tune_class
from .runner import TrialRunner
from .search import Ask
from .worker import GpuWorker, default_devices



def tune(config: TuneConfig, progress: Callable[[str], None] = print, bar=None,
         clock: Callable[[], float] = time.monotonic) -> list[TuneResult]:
    """Tune ``config.spec`` for each shape class of ``config.shapes``; returns one result per class.

    ``progress`` gets one line per step; ``bar`` (a :class:`mlagen.progress.Progress`) if given
    counts trials. Raises TuningError (no GPU, a spec that does not target it) or ShapeError
    (a bad shape) before any GPU work."""
    began = time.monotonic()
    spec = spec_mod.load(config.spec)
    classes = shape_classes(config.shapes, family_of(spec))
    if not classes:
        raise TuningError("no shape to tune; give --shape or --workload")
    for c in classes:
        why = family_of(spec).refuses(spec, c.shape)
        if why:
            raise TuningError(f"{spec.name} cannot tune {c.problem} ({family_of(spec).describe_shape(c.shape)}): {why}")
    # Starting a worker takes seconds (a process, torch, a CUDA context, the shape's inputs and
    # reference): with the GPUs named, the first class's workers start before this process
    # looks at the GPUs itself (CUDA's start-up here takes time too), and are stopped if what
    # follows finds an error.
    early = _start_workers(spec, classes[0], config, config.devices) if config.devices is not None else None
    try:
        target, devices = _target_and_devices(spec, config)
        database = db.TuningDB(config.db_path)
    except BaseException:
        if early is not None:
            _abandon(*early)
        raise
    total_weight = sum(c.weight for c in classes)
    results = []
    jobs = config.jobs or knobs.compile_workers()
    pool = compile_pool(jobs)  # one set of compile processes for the whole session
    queue = CompileQueue(pool, target.name, jobs)
    try:
        for c in classes:
            budget = None if config.budget_s is None else config.budget_s * c.weight / total_weight
            workers, started = early or _start_workers(spec, c, config, devices)
            early = None
            try:
                # Compile the search's first batch while the workers start.
                first_key = _early_key(spec, c.problem, target, devices)
                if first_key is not None:
                    first = _class_search(spec, c.shape, target, config, database, first_key)[1].next_batch()
                    queue([a.variant if isinstance(a, Ask) else a for a in first])
                key = _record_key(spec, c.problem, target, started(), devices)
                # (since the tune, or the previous class, began: the fixed cost of a class)
                progress(f"{c.shape.id}: {len(workers)} GPU worker(s) ready after {time.monotonic() - began:.1f} s")
                runner = TrialRunner(workers, queue.build, config.iters, prefetch=queue, warmup=config.warmup,
                                     measure_ahead=config.measure_ahead)
                results.append(tune_class(spec, c, target, config, database, runner, key, progress, bar=bar,
                                          budget_s=budget, clock=clock))
            finally:
                stopping = time.monotonic()
                _stop_all(workers)
            progress(f"  measuring processes stopped in {time.monotonic() - stopping:.1f} s")
            began = time.monotonic()
    except BaseException:  # Ctrl-C: stop the compiles now (the GPU workers are stopped above)
        if early is not None:
            _abandon(*early)
        queue.close()
        abort_pool(pool)
        raise
    queue.cancel()
    if queue.pending:
        # Only guesses can still be compiling, and nothing will ask for them: waiting for a
        # cold compile to finish would hold up the exit by seconds.
        abort_pool(pool)
    else:
        pool.shutdown(cancel_futures=True)
    queue.close()
    return results


def _target_and_devices(spec, config: TuneConfig) -> tuple[arch.Target, tuple[int, ...]]:
    """The target tuned for and the GPUs to tune on, checked (TuningError)."""
    if config.target is None:
        from ..runtime import device_info

        target = device_info(0).target
        if target is None:
            raise TuningError("the GPU is of no known target")
    else:
        target = arch.target(config.target)
    if target.name not in spec.targets:
        raise TuningError(f"{spec.name} does not target {target.name} (targets: {', '.join(spec.targets)})")
    devices = config.devices if config.devices is not None else default_devices()
    if not devices:
        raise TuningError("no GPU to tune on")
    if config.devices is not None:
        from ..runtime import device_count

        visible = device_count()
        for d in devices:
            if d >= visible:
                raise TuningError(f"--devices {d}: only {visible} GPU(s) are visible (0 to {visible - 1})")
    return target, devices


def _start_workers(spec, shape_class: ShapeClass, config: TuneConfig, devices) -> tuple[list, Callable]:
    """One worker per GPU for ``shape_class``, starting in the background: (workers, a function
    that waits until they are ready and returns what they report)."""
    workers = [GpuWorker(spec.path, shape_class.shape, config.seed, config.warmup, config.timeout_s, device=d)
               for d in devices]
    return workers, _start_in_background(workers)


def _abandon(workers: list, started: Callable) -> None:
    """Stop workers that are starting, once they have started (or failed to): a worker
    stopped in the middle of its start would be left running."""
    try:
        started()
    except BaseException:
        pass
    _stop_all(workers)


def _stop_all(workers: list) -> None:
    """Stop the workers together: each winds down its CUDA context at the same time."""
    for w in workers:
        if hasattr(w, "ask_stop"):
            w.ask_stop()
    for w in workers:
        w.stop()


def _start_in_background(workers: list[GpuWorker]) -> Callable[[], list[dict]]:
    """Start the workers on a thread; returns a function that waits for them (and raises what
    starting them raised)."""
    out: dict = {}

    def start():
        try:
            out["infos"] = _start_all(workers)
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=start, daemon=True)
    thread.start()

    def wait() -> list[dict]:
        thread.join()
        if "error" in out:
            raise out["error"]
        return out["infos"]

    return wait


def _early_key(spec, problem: str, target, devices) -> db.RecordKey | None:
    """The record key as this process sees the first GPU, before the workers report; None where
    it sees none. Only for compiling ahead: the key recorded is the one the workers report."""
    from ..runtime import device_info

    try:
        info = device_info(devices[0])
    except MlagenError:
        return None
    return dispatch.record_key(spec, problem, device=info.name, sm_count=info.sm_count, driver=info.driver_version,
                               target=target)


def _start_all(workers: list[GpuWorker]) -> list[dict]:
    """Start the workers in parallel (each builds its inputs and references)."""
    infos: list = [None] * len(workers)
    errors: list = []

    def start(i):
        try:
            infos[i] = workers[i].start()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(i,), daemon=True) for i in range(len(workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return infos


def _record_key(spec, problem: str, target, infos: list[dict], devices) -> db.RecordKey:
    # Each worker must have a GPU of its own (CUDA_VISIBLE_DEVICES set before CUDA started in it):
    # two on one GPU would time each other's kernels.
    places = [i.get("pci") for i in infos if i.get("pci")]
    if len(set(places)) < len(places):
        raise TuningError("--devices " + ",".join(map(str, devices)) + ": two workers run on one GPU ("
                          + ", ".join(f"{d}: {i.get('pci')}" for d, i in zip(devices, infos))
                          + "); CUDA_VISIBLE_DEVICES was not applied in a worker")
    kinds = {(i["device"], i["sm_count"], i["driver"]) for i in infos}
    if len(kinds) > 1:
        raise TuningError("--devices: the GPUs differ (" + "; ".join(f"{d}: {i['device']}, {i['sm_count']} SMs"
                          for d, i in zip(devices, infos)) + "); tune on GPUs of one kind")
    info = infos[0]
    return dispatch.record_key(spec, problem, device=info["device"], sm_count=info["sm_count"],
                               driver=info["driver"], target=target)


