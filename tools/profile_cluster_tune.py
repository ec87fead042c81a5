"""Where the fixed time of a tune on a Dask cluster goes, on a CPU machine.

The tune of D1 (``mla_prefill_sm90``) runs twice with the same simulated GPU and compiler as
``tools/simulate_tune.py`` (a GPU worker sleeps for loading, checking and timing a variant; a
compile sleeps for a cold NVRTC compile): once with the local tuner's runner and compile queue,
once through :func:`mlagen.tune.cluster.tune` on a real Dask cluster of worker processes (one worker
with ``GPU=1``, some CPU-only workers, as ``tools/cluster_tune_h200.sh`` starts them). What only
the cluster path adds (its client, the probe, tasks and their polling, where the measuring
process starts, compiles placed by Dask) is then the difference, and the timeline of the cluster
run says where it falls: each event in seconds since the tune began.

The simulated GPU worker's start (``--start-s``: on the device a process, torch, a CUDA context,
the shape's inputs and reference) is slept on the Dask worker the first time it measures for a
class, as :func:`mlagen.tune.cluster.measure` starts its GpuWorker, or when the cluster path
warms it (:func:`mlagen.tune.cluster.warm`); locally it overlaps the first compiles, as
``mlagen tune`` starts its workers.

    python tools/profile_cluster_tune.py                    # 24 trials, 2 CPU workers
    python tools/profile_cluster_tune.py --max-trials 24 --cpu-workers 4 --threads 3
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import functools
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path[:0] = [str(TOOLS.parent), str(TOOLS)]

import simulate_tune as sim  # noqa: E402

from mlagen import db, dispatch  # noqa: E402
from mlagen.build import CompileQueue  # noqa: E402
from mlagen.families.mla_prefill.problem import SHAPES  # noqa: E402

FAKE = {"device": "Simulated H200", "sm_count": 132, "driver": "13.0", "target": "sm_90a"}


# --- on the Dask workers (this module is imported there by name: tools/ is on their path) ------

_STARTED: dict = {}   # on the GPU worker: the (tune, class) whose simulated process runs -> its SimWorker
_LOCK = threading.Lock()


def probe() -> dict:
    return dict(FAKE)


def _worker(costs, run, args):
    """The simulated measuring process of ``args`` in tune ``run``: started (slept) once per tune
    and class, as each ``mlagen tune`` starts its own."""
    with _LOCK:
        w = _STARTED.get((run, args))
        if w is None:
            _STARTED.clear()
            time.sleep(costs.start * costs.scale)   # the measuring process starts (torch, CUDA, inputs)
            w = _STARTED[(run, args)] = sim.SimWorker(sim.Landscape(0), costs)
    return w


def measure(costs, run, args, values, iters, warmup, verify) -> dict:
    t0 = time.monotonic()
    out = _worker(costs, run, args).run(values, iters, warmup, verify)
    return {**out, "task_s": time.monotonic() - t0}


def warm(costs, run, args) -> dict:
    _worker(costs, run, args)
    return {}


def release() -> None:
    _STARTED.clear()


# --- on the client ------------------------------------------------------------------------------


class Timeline:
    """Events of one run, seconds since ``start``."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.events: list[tuple[float, str]] = []
        self.lock = threading.Lock()

    def __call__(self, what: str) -> None:
        with self.lock:
            self.events.append((time.monotonic() - self.t0, what))

    def first(self, prefix: str) -> float | None:
        return next((t for t, e in self.events if e.startswith(prefix)), None)

    def last(self, prefix: str) -> float | None:
        return next((t for t, e in reversed(self.events) if e.startswith(prefix)), None)


def _config(args, tune_mod, db_path):
    return tune_mod.TuneConfig(spec=sim.SPEC.path, shapes=("D1",), max_trials=args.max_trials, seed=args.seed,
                               iters=20, warmup=args.warmup, target="sm_90a", db_path=db_path)


def run_local(args, costs, workdir: Path):
    """The local tuner (mlagen.tune.tune's steps): the workers start while the first batch compiles."""
    from mlagen import tune as tune_mod
    from mlagen.tune.loop import _class_search

    jobs = args.cpu_workers * args.threads + args.gpu_threads - 1
    config = _config(args, tune_mod, str(workdir / "local.sqlite"))
    t0 = time.monotonic()
    pool = cf.ThreadPoolExecutor(jobs)
    queue = CompileQueue(pool, sim.TARGET.name, jobs, compile_one=sim.SimCompile(sim.Landscape(0), costs))
    c = tune_mod.ShapeClass("causal/h128/q8192/k8192", SHAPES["D1"], 1.0, [SHAPES["D1"]])
    key = dispatch.record_key(sim.SPEC, c.problem, device=FAKE["device"], sm_count=FAKE["sm_count"],
                              driver=FAKE["driver"], target=sim.TARGET)
    database = db.TuningDB(config.db_path)
    first = _class_search(sim.SPEC, c.shape, sim.TARGET, config, database, key)[1].next_batch()
    queue([a.variant if isinstance(a, tune_mod.Ask) else a for a in first])
    time.sleep(costs.start * costs.scale)   # the workers start meanwhile
    runner = tune_mod.TrialRunner([sim.SimWorker(sim.Landscape(0), costs)], queue.build, config.iters,
                                  prefetch=queue, warmup=config.warmup)
    lines: list[str] = []
    result = tune_mod.tune_class(sim.SPEC, c, sim.TARGET, config, database, runner, key, progress=lines.append)
    wall = time.monotonic() - t0
    result.lines = lines
    queue.cancel()
    queue.close()
    pool.shutdown(wait=False, cancel_futures=True)
    return wall, result


def run_cluster(args, costs, client, workdir: Path, timeline: Timeline):
    from mlagen import tune as tune_mod
    from mlagen.tune import cluster

    # The functions the workers run, by reference to this module as the workers import it (run as
    # a script, this file is __main__, whose functions would travel by value, their state lost).
    import profile_cluster_tune as on_workers

    config = _config(args, tune_mod, str(workdir / f"cluster-{time.monotonic_ns()}.sqlite"))
    # Events seen from the client: when each measurement and compile task was sent and answered
    # (the compiles through whichever of the cluster runner's builders this version has).
    patched = []

    def patch(owner, name, wrapper):
        orig = getattr(owner, name)
        patched.append((owner, name, orig))
        setattr(owner, name, wrapper(orig))

    def run_w(orig):
        def run(self, values, iters, warmup=None, verify=None):
            timeline(f"measure sent {'checks' if verify else 'time'}")
            out = orig(self, values, iters, warmup, verify)
            timeline(f"measure answered (the task ran {out.get('task_s', 0):.3f} s)")
            return out
        return run

    def build_w(orig):
        def build(self, variants, on_built):
            variants = list(variants)
            timeline(f"build of {len(variants)} asked")

            def built(b):
                timeline(f"built {b.status}{' (ahead)' if b.ahead else ''}")
                on_built(b)
            orig(self, variants, built)
        return build

    def submit_w(orig):
        def submit(self, *a, **k):
            timeline("compile sent")
            return orig(self, *a, **k)
        return submit

    patch(cluster.ClusterGpu, "run", run_w)
    if hasattr(cluster, "ClusterBuild"):   # before the compile queue
        patch(cluster.ClusterBuild, "build", build_w)
        patch(cluster.ClusterBuild, "_submit", submit_w)
    else:
        from mlagen.build import CompileQueue as queue_cls

        patch(queue_cls, "build", build_w)
        patch(cluster.PlacedCompiles, "submit", submit_w)
    run_token = time.monotonic_ns()
    extra = {"warm_fn": functools.partial(on_workers.warm, costs, run_token)} \
        if "warm_fn" in cluster.tune.__code__.co_varnames else {}
    try:
        timeline("tune called")
        results = cluster.tune(config, client, progress=lambda line: timeline(f"log {line}"),
                               probe_fn=on_workers.probe, measure_fn=functools.partial(on_workers.measure, costs, run_token),
                               compile_fn=sim.SimCompile(sim.Landscape(0), costs), **extra)
        timeline("tune returned")
    finally:
        for owner, name, orig in patched:
            setattr(owner, name, orig)
    return results[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-trials", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu-workers", type=int, default=2, help="CPU-only Dask workers (the H200 script starts 4)")
    p.add_argument("--threads", type=int, default=1, help="threads of each CPU worker (the H200 script: 3)")
    p.add_argument("--gpu-threads", type=int, default=2, help="threads of the GPU worker (the H200 script: 2)")
    p.add_argument("--compile-s", type=float, default=1.0, help="one cold compile")
    p.add_argument("--start-s", type=float, default=3.0, help="the measuring process's start on the GPU worker")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--scale", type=float, default=1.0, help="sleep this fraction of each simulated second")
    p.add_argument("--repeat", type=int, default=1, help="cluster runs (after one untimed run that warms the workers)")
    p.add_argument("--timeline", action="store_true", help="print the events of the last cluster run")
    args = p.parse_args(argv)
    ns = argparse.Namespace(load_ms=10.0, check_small_ms=90.0, check_shape_ms=90.0, call_overhead_ms=0.3,
                            warmup=args.warmup, compile_s=args.compile_s, cold=True, jobs=0,
                            worker_start_s=args.start_s, fixed_s=0.0, record_ms=0.0, scale=args.scale)
    costs = sim.Costs(ns)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(TOOLS.parent), str(TOOLS), os.environ.get("PYTHONPATH", "")])
    import distributed

    # One worker process with GPU=1 and two threads (it compiles too), CPU-only worker processes.
    workers = {"gpu0": {"cls": distributed.Nanny, "options": {"nthreads": args.gpu_threads, "resources": {"GPU": 1}}}}
    workers.update({f"cpu{i}": {"cls": distributed.Nanny, "options": {"nthreads": args.threads}}
                    for i in range(args.cpu_workers)})
    scheduler = {"cls": distributed.Scheduler, "options": {"dashboard": False}}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        local_wall, local = run_local(args, costs, workdir)
        with distributed.SpecCluster(workers=workers, scheduler=scheduler, silence_logs=40) as lc:
            with distributed.Client(lc) as client:
                client.wait_for_workers(1 + args.cpu_workers)
                run_cluster(args, costs, client, workdir, Timeline())   # imports on the workers, first tasks
                walls, timeline, remote = [], None, None
                for _ in range(args.repeat):
                    timeline = Timeline()
                    t0 = time.monotonic()
                    remote = run_cluster(args, costs, client, workdir, timeline)
                    walls.append(time.monotonic() - t0)
    same = [t.variant for t in remote.trials] == [t.variant for t in local.trials]
    print(f"simulated D1 tune, {args.max_trials} trials, compile {args.compile_s} s, worker start {args.start_s} s, "
          f"{args.cpu_workers} CPU worker(s) x {args.threads} thread(s)")
    print(f"local   {local_wall:6.1f} s  {len(local.trials)} trials  winner {local.best.variant.symbol}")
    print(f"cluster {' '.join(f'{w:.1f}' for w in walls)} s  {len(remote.trials)} trials  winner "
          f"{remote.best.variant.symbol}  same trials: {'yes' if same else 'NO'}")
    print(f"cluster - local: {min(walls) - local_wall:+.1f} s (best cluster run)")
    summary = ("  search", "  compiles", "  compile queue", "  measured ahead", "  GPU worker")
    print("local:\n" + "\n".join(line for line in local.lines if line.startswith(summary)))
    print("cluster (last run):\n" + "\n".join(e[4:].replace("[Simulated H200] ", "") for _, e in timeline.events
                                            if e.startswith("log ") and e[4:].replace("[Simulated H200] ", "")
                                            .startswith(summary)))
    t = timeline
    marks = [("first compile sent", t.first("compile sent")), ("first build asked", t.first("build")),
             ("first compile built", t.first("built")), ("first measure sent", t.first("measure sent")),
             ("first measure answered", t.first("measure answered")),
             ("last measure answered", t.last("measure answered")), ("tune returned", t.last("tune returned"))]
    print("cluster timeline (s): " + ", ".join(f"{name} {v:.2f}" for name, v in marks if v is not None))
    if args.timeline:
        for when, what in t.events:
            print(f"  {when:7.3f}  {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
