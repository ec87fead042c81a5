"""Predict how much faster a tune runs on several GPUs, without a GPU.

Runs the tuner's real search, trial runner and tuning loop (``mlagen.tune.tune_class``) on the
D1 shape class of ``mla_prefill_sm90`` with simulated GPU workers and a simulated compiler: a
worker sleeps for what loading, checking and timing a variant would take on the GPU, the
compiler for what a cold compile takes (nothing with a warm cache). The worker start and the
process's own start and exit are added as constants. It prints the wall time of the tune with
each number of GPUs and their ratio to one GPU, and whether the trials were the same.

Every cost is an option. The defaults, and where they come from (the 2x H200 logs of
2026-11-23 were ``docs/data/tune-2gpu-h200-2026-11-23/``, removed from the tree since; commit 85d2397
has them):

- kernel times: a synthetic landscape whose random samples spread like the logs' global stage
  (about 4.4 to 10 ms, median 6);
- a timed call besides the kernel (the L2 flush, the launch): 0.3 ms, an estimate;
- loading a variant in a worker: 10 ms (rendering and reading the cached binary take 3 ms on
  this 2-core machine; the module load is an estimate);
- the two checks: 90 ms each, fitted so that one GPU with a warm cache spends 26 s on 80 trials
  (search and finalists), as the log's "80 trials in 26 s" says; the logs do not say how much of
  a trial's time is checking and how much is anything else, and that split decides how much a
  second GPU can take over (``--load-ms`` moves it to what every GPU pays per variant,
  ``--record-ms`` to the tuning database's commits);
- a worker's start 7 s, the process's own start and exit 3.5 s: together the 10.5 to 11 s by
  which the logged wall times exceed the tune's own seconds, split by estimate;
- a cold compile: 1 s per variant (1.0 to 1.3 s measured here with NVRTC 13.5), 32 at a time.

A prediction is only as good as those figures: the tune's time lines on the device (``GPU
worker N: ... loading, checking, timing, other``) give the real ones.

    python tools/simulate_tune.py --max-trials 80
    python tools/simulate_tune.py --max-trials 200 --cold
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib
import math
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlagen import arch, db  # noqa: E402
from mlagen import spec as spec_mod  # noqa: E402
from mlagen import variant as variant_mod  # noqa: E402
from mlagen.build import CompileQueue  # noqa: E402
from mlagen.families.mla_prefill.problem import SHAPES  # noqa: E402

SPEC = spec_mod.load("mla_prefill_sm90")
TARGET = arch.target("sm_90a")
KEY = db.RecordKey("mla_prefill", SPEC.name, "causal/h128/q8192/k8192", "bf16", "Simulated H200", 132, "13.0",
                   "nvrtc 13.0", "sim")
PARTS = ("check problem", "shape")


class Landscape:
    """Kernel milliseconds of a variant: log-normal main effects per tunable value and random
    pair interactions around a base, seeded; random samples spread like those of the D1 logs
    (about 4.4 to 10 ms, median 6)."""

    def __init__(self, seed: int = 0, base_ms: float = 4.7, main: float = 0.05, pairs: int = 25, pair: float = 0.05,
                 spill_rate: float = 0.1):
        rng = random.Random(seed)
        self.base, self.spill_rate, self.seed = base_ms, spill_rate, seed
        tunables = [t for t in SPEC.tunables if len(t.values) > 1]
        self.effects = {(t.name, v): rng.gauss(0, main) for t in tunables for v in t.values}
        self.pairs = []
        for _ in range(pairs):
            a, b = rng.sample(tunables, 2)
            self.pairs.append((a.name, rng.choice(a.values), b.name, rng.choice(b.values), rng.gauss(0, pair)))

    def ms(self, v) -> float:
        x = sum(self.effects.get((k, v[k]), 0.0) for k in v.tunables)
        x += sum(e for a, av, b, bv, e in self.pairs if v[a] == av and v[b] == bv)
        return self.base * math.exp(x)

    def spills(self, v) -> bool:
        """Whether the compiled kernel spills (pruned after compiling), for a share of variants."""
        return random.Random(f"{self.seed}:{v.symbol}").random() < self.spill_rate


class Costs:
    """Seconds on the simulated machine (see the module docstring for where they come from)."""

    def __init__(self, args):
        self.load = args.load_ms / 1e3
        self.check_small = args.check_small_ms / 1e3
        self.check_shape = args.check_shape_ms / 1e3
        self.call_overhead = args.call_overhead_ms / 1e3
        self.warmup = args.warmup
        self.compile = args.compile_s if args.cold else 0.0
        self.jobs = args.jobs
        self.start = args.worker_start_s
        self.fixed = args.fixed_s
        self.record = args.record_ms / 1e3
        self.scale = args.scale


class SimWorker:
    """A GPU worker that sleeps for what a request would take; answers like ``GpuWorker.run``."""

    def __init__(self, landscape: Landscape, costs: Costs):
        self.landscape, self.costs = landscape, costs
        self.loaded: set = set()
        self.checked: dict = {}
        self.lock = threading.Lock()

    def run(self, values, iters, warmup=None, verify=None):
        c = self.costs
        v = variant_mod.make(SPEC, values)
        kernel = self.landscape.ms(v) / 1e3
        load = 0.0 if v in self.loaded else c.load
        self.loaded.add(v)
        done = self.checked.setdefault(v, set())
        parts = [p for p in (PARTS if verify is None else verify) if p not in done]
        spent = {p: (c.check_small if p == PARTS[0] else c.check_shape + kernel) * c.scale for p in parts}
        check = sum(spent.values()) / c.scale
        done.update(parts)
        timing = ((c.warmup if warmup is None else warmup) + iters) * (kernel + c.call_overhead)
        time.sleep((load + check + timing) * c.scale)
        return {"outcome": "ok", "time_ms": kernel * 1e3, "tflops": 1.0 / kernel, "max_error": 1e-3,
                "registers": 168, "spills": 0, "load_s": load * c.scale, "verify_s": check * c.scale,
                "time_s": timing * c.scale, "checks_s": spent}


class SimCompile:
    """What a compile process runs (``_compile_one``'s arguments and result), for the tuner's
    real :class:`mlagen.build.CompileQueue` on a thread pool of ``jobs``: sleeps for a cold
    compile (nothing with a warm cache); a share of the variants come back spilling (pruned)."""

    def __init__(self, landscape: Landscape, costs: Costs):
        self.landscape, self.costs = landscape, costs

    def __call__(self, spec, values, target, out_dir):
        v = variant_mod.make(spec, values)
        seconds = self.costs.compile * self.costs.scale
        time.sleep(seconds)
        if self.landscape.spills(v):
            return "pruned", ("spills registers (simulated)",), None, None, seconds
        return "ok", (), None, None, seconds


class SlowDB(db.TuningDB):
    """The tuning database, each trial's write taking ``record`` seconds more (a commit's disk
    flushes on the device machine; locally they take about a millisecond)."""

    def __init__(self, path, record: float):
        super().__init__(path)
        self.record = record

    def add_trials(self, trials) -> None:
        time.sleep(self.record)   # one commit, however many trials
        super().add_trials(trials)


def simulate(tune_mod, gpus: int, max_trials: int, seed: int, landscape: Landscape, costs: Costs, workdir: Path):
    """One simulated tune of D1 on ``gpus`` GPUs: (wall seconds, tune_class seconds, result, log)."""
    config = tune_mod.TuneConfig(spec=SPEC.path, shapes=("D1",), max_trials=max_trials, seed=seed, iters=20,
                                 warmup=costs.warmup)
    pool = cf.ThreadPoolExecutor(max(1, costs.jobs))
    compiler = CompileQueue(pool, TARGET.name, costs.jobs, compile_one=SimCompile(landscape, costs))
    workers = [SimWorker(landscape, costs) for _ in range(gpus)]
    runner = tune_mod.TrialRunner(workers, compiler.build, config.iters, prefetch=compiler, warmup=costs.warmup)
    shape_class = tune_mod.ShapeClass(KEY.problem, SHAPES["D1"], 1.0, [SHAPES["D1"]])
    database = SlowDB(workdir / f"sim-{gpus}-{max_trials}-{time.monotonic_ns()}.sqlite", costs.record * costs.scale)
    lines: list[str] = []
    t0 = time.monotonic()
    # tune(): the search's first batch compiles while the workers start
    fixed = {**config.fixed, "mask": "causal"}
    first = tune_mod.make_search(config.strategy, SPEC, fixed, TARGET, max_trials, seed).next_batch()
    compiler([a.variant if isinstance(a, tune_mod.Ask) else a for a in first])
    time.sleep(costs.start * costs.scale)
    t1 = time.monotonic()
    result = tune_mod.tune_class(SPEC, shape_class, TARGET, config, database, runner, KEY, progress=lines.append,
                                 clock=time.monotonic)
    t2 = time.monotonic()
    compiler.cancel()
    compiler.close()
    pool.shutdown(wait=False, cancel_futures=True)
    return costs.fixed + (t2 - t0) / costs.scale, (t2 - t1) / costs.scale, result, lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-trials", type=int, default=80)
    p.add_argument("--gpus", default="1,2", help="GPU counts to simulate (the first is the reference)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--landscape-seed", type=int, default=0)
    p.add_argument("--cold", action="store_true", help="cold compile cache: every variant compiles once")
    p.add_argument("--compile-s", type=float, default=1.0, help="one cold compile (NVRTC, sm_90a)")
    p.add_argument("--jobs", type=int, default=32, help="compile processes (the H200 host's CPU count)")
    p.add_argument("--load-ms", type=float, default=10.0, help="a worker loads a variant's module")
    p.add_argument("--check-small-ms", type=float, default=90.0, help="the check on the small awkward problem")
    p.add_argument("--check-shape-ms", type=float, default=90.0,
                   help="the check on the real shape, besides its one kernel call")
    p.add_argument("--call-overhead-ms", type=float, default=0.3, help="per timed call besides the kernel")
    p.add_argument("--record-ms", type=float, default=0.0, help="writing one trial to the database (a commit)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--worker-start-s", type=float, default=7.0, help="a worker's start (in parallel)")
    p.add_argument("--fixed-s", type=float, default=3.5, help="the process's own start and exit")
    p.add_argument("--scale", type=float, default=1.0, help="sleep this fraction of each simulated second")
    p.add_argument("--tuner", default="mlagen.tune", help="module of the tuner to simulate")
    p.add_argument("--verbose", action="store_true", help="print the tunes' logs")
    args = p.parse_args(argv)
    tune_mod = importlib.import_module(args.tuner)
    costs = Costs(args)
    landscape = Landscape(args.landscape_seed)
    counts = [int(x) for x in args.gpus.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            wall, tuned, result, lines = simulate(tune_mod, n, args.max_trials, args.seed, landscape, costs, Path(tmp))
            rows.append((n, wall, tuned, result))
            if args.verbose:
                print("\n".join(lines))
    ref = rows[0]
    print(f"simulated D1 tune, max_trials {args.max_trials}, {'cold' if args.cold else 'warm'} compile cache, "
          f"tuner {args.tuner}")
    print(f"{'GPUs':>4}  {'trials':>6}  {'tune s':>7}  {'wall s':>7}  {'tune ratio':>10}  {'wall ratio':>10}  same trials")
    for n, wall, tuned, result in rows:
        same = [t.variant for t in result.trials] == [t.variant for t in ref[3].trials]
        print(f"{n:>4}  {len(result.trials):>6}  {tuned:>7.1f}  {wall:>7.1f}  {tuned / ref[2]:>10.3f}  "
              f"{wall / ref[1]:>10.3f}  {'yes' if same else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
