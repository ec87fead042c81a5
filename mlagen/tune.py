"""The autotuner: search a spec's variants for one shape class, record every trial, keep the winner.

For each shape the tuner picks candidate variants (``exhaustive`` over the space, or
``coordinate`` descent from the default: one axis at a time, all its values, move to the best),
prunes them with the resource model, compiles the rest in parallel processes, and runs each one
in a GPU worker process: checked against the float32 reference first (a small ragged problem
with odd lengths, then two heads of the real shape), timed only if right. Failures are data: a
compile error, a wrong result, a crash (the worker dies or the CUDA context is lost) and a hang
(the trial outlives its timeout; the worker is killed) are recorded like successes and never
selected. The fastest correct variant becomes the database's winner for the shape class.
"""

from __future__ import annotations

import multiprocessing
import random
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterable

from . import arch, db, dispatch
from . import spec as spec_mod
from . import variant as variant_mod
from .build import abort_pool, build_many, compile_pool
from .errors import MlagenError, TuningError

STRATEGIES = ("auto", "exhaustive", "coordinate")


@dataclass
class TuneConfig:
    spec: str
    shapes: tuple  # BENCHMARKS.md ids ("D1") or bench.Shape objects
    strategy: str = "auto"
    max_trials: int = 200
    fixed: dict = field(default_factory=dict)
    timeout_s: float = 60.0
    iters: int = 20
    warmup: int = 3
    jobs: int | None = None
    db_path: str | None = None
    seed: int = 0
    target: str | None = None  # default: the target of the GPU the trials run on


@dataclass
class TrialResult:
    variant: variant_mod.Variant
    outcome: str
    time_ms: float | None = None
    tflops: float | None = None
    max_error: float | None = None
    registers: int | None = None
    spills: int | None = None
    detail: str = ""


@dataclass
class TuneResult:
    shape: str
    problem: str
    run_id: str
    trials: list[TrialResult]
    best: TrialResult | None
    default: TrialResult | None
    seconds: float


# --- GPU worker process -----------------------------------------------------------------------


def _worker_main(conn, spec_path: str, shape, seed: int, iters: int, warmup: int) -> None:
    """Runs in a spawned process: owns the CUDA context, the inputs and the references."""
    try:
        import torch

        from . import bench
        from .api import mla_prefill
        from .families import mla_prefill as family
        from .runtime import device_info

        spec = spec_mod.load(spec_path)
        device = torch.device("cuda", torch.cuda.current_device())
        inputs = bench.make_inputs(shape, device, seed)
        ref = bench.reference_heads(shape, inputs)
        check = _check_problem(torch, shape, device, seed)
        check_ref = family.reference(*check["args"], **check["kwargs"])
        flush = bench.L2Flush(device)
        info = device_info(device.index)
        conn.send(("ready", {"device": info.name, "sm_count": info.sm_count, "driver": info.driver_version}))
    except Exception:
        conn.send(("setup_failed", traceback.format_exc()))
        return

    while True:
        msg = conn.recv()
        if msg is None:
            return
        values = msg
        v = variant_mod.make(spec, values)
        try:
            sel = dispatch.dispatcher().select(family.FAMILY.name, "", {}, device.index, None, variant=v)
        except MlagenError as exc:
            conn.send({"outcome": "launch_error", "detail": str(exc)})
            continue
        try:
            # 1. The small ragged problem with odd lengths.
            args, kwargs = check["args"], check["kwargs"]
            out = torch.full_like(check_ref[0], float("nan"), dtype=torch.bfloat16)
            lse = torch.full_like(check_ref[1], float("nan"))
            mla_prefill(*args, **kwargs, out=out, lse=lse, kernel=v)
            torch.cuda.synchronize()
            small = bench.compare(out, lse, *check_ref)
            if not small.ok:
                conn.send({"outcome": "wrong_result", "max_error": small.rel_l2,
                           "detail": f"check problem: {small.problem}"})
                continue
            # 2. The real shape, checked on two heads, then timed.
            kw = {"k_rope": inputs["k_rope"], "cu_seqlens_q": inputs["cu_seqlens_q"],
                  "cu_seqlens_k": inputs["cu_seqlens_k"], "causal": shape.causal, "kernel": v}
            out = torch.full((shape.total_q, shape.heads, family.D_V), float("nan"), dtype=torch.bfloat16,
                             device=device)
            lse = torch.full((shape.total_q, shape.heads), float("nan"), device=device)
            mla_prefill(inputs["q"], inputs["k"], inputs["v"], out=out, lse=lse, **kw)
            torch.cuda.synchronize()
            full = bench.compare(out, lse, *ref)
            if not full.ok:
                conn.send({"outcome": "wrong_result", "max_error": full.rel_l2, "detail": f"shape: {full.problem}"})
                continue

            def call():
                mla_prefill(inputs["q"], inputs["k"], inputs["v"], out=out, lse=lse, check_seqlens=False, **kw)

            for _ in range(warmup):
                call()
            samples = bench.time_calls(call, iters, flush)
            med = bench.median(samples)
            conn.send({"outcome": "ok", "time_ms": med * 1e3, "tflops": shape.flops() / med / 1e12,
                       "max_error": max(small.rel_l2, full.rel_l2),
                       "registers": sel.binary.resources.registers,
                       "spills": sel.binary.resources.spill_stores + sel.binary.resources.spill_loads})
        except Exception as exc:
            # A CUDA error poisons the context: report and exit so the parent starts a fresh worker.
            conn.send({"outcome": "crash", "detail": f"{type(exc).__name__}: {exc}"})
            return


def _check_problem(torch, shape, device, seed: int) -> dict:
    """A small packed batch with length-1, empty and off-tile sequences, the shape's mask and
    head count (capped at 16), and a cached prefix when causal."""
    from .families.mla_prefill import D_NOPE, D_ROPE, D_V

    heads = min(shape.heads, 16)
    lq = [1, 77, 0, 300, 129]
    lk = [1, 77, 5, 333, 129] if shape.causal else [3, 50, 5, 333, 200]
    g = torch.Generator(device=device).manual_seed(seed + 1)

    def rnd(*s):
        return torch.randn(*s, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)

    tq, tk = sum(lq), sum(lk)
    cu = lambda xs: torch.tensor([0] + [sum(xs[:i + 1]) for i in range(len(xs))], dtype=torch.int32, device=device)
    return {"args": (rnd(tq, heads, D_NOPE + D_ROPE), rnd(tk, heads, D_NOPE), rnd(tk, heads, D_V)),
            "kwargs": {"k_rope": rnd(tk, 1, D_ROPE), "cu_seqlens_q": cu(lq), "cu_seqlens_k": cu(lk),
                       "causal": shape.causal}}


class GpuWorker:
    """A worker process with a per-trial timeout; restarted after a crash or a hang."""

    def __init__(self, spec_path: str, shape, seed: int, iters: int, warmup: int, timeout_s: float,
                 setup_timeout_s: float = 300.0):
        self.args = (spec_path, shape, seed, iters, warmup)
        self.timeout_s = timeout_s
        self.setup_timeout_s = setup_timeout_s
        self.ctx = multiprocessing.get_context("spawn")
        self.proc = None
        self.conn = None

    def start(self) -> dict:
        parent, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker_main, args=(child, *self.args), daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        if not parent.poll(self.setup_timeout_s):
            self.stop()
            raise TuningError(f"the GPU worker did not start within {self.setup_timeout_s:.0f} s")
        try:
            kind, payload = parent.recv()
        except EOFError:
            self.stop()
            raise TuningError("the GPU worker died while starting (no GPU? see stderr)") from None
        if kind != "ready":
            self.stop()
            last = payload.strip().splitlines()[-1] if payload.strip() else "unknown error"
            raise TuningError(f"the GPU worker failed to start: {last}\n{payload}")
        return payload

    def run(self, values: dict) -> dict:
        if self.proc is None or not self.proc.is_alive():
            self.start()
        self.conn.send(values)
        if not self.conn.poll(self.timeout_s):
            self.stop()
            return {"outcome": "hang", "detail": f"no result within {self.timeout_s:.0f} s; worker killed"}
        try:
            result = self.conn.recv()
        except EOFError:
            code = self.proc.exitcode if self.proc else None
            self.stop()
            return {"outcome": "crash", "detail": f"worker process died (exit code {code})"}
        if result.get("outcome") == "crash":
            self.stop()
        return result

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                try:
                    self.conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
                self.proc.join(2)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5)
        self.proc = None
        self.conn = None


# --- search strategies ------------------------------------------------------------------------


class Search:
    """Proposes batches of variants; told the outcome of each before the next batch."""

    def __init__(self, spec, fixed: dict, target: arch.Target, max_trials: int, seed: int):
        self.spec, self.fixed, self.target, self.max_trials = spec, fixed, target, max_trials
        self.rng = random.Random(seed)
        self.seen: dict[variant_mod.Variant, float] = {}  # variant -> time (inf if failed)

    def tell(self, v: variant_mod.Variant, time_ms: float | None) -> None:
        self.seen[v] = time_ms if time_ms is not None else float("inf")

    def next_batch(self) -> list[variant_mod.Variant]:
        raise NotImplementedError


class Exhaustive(Search):
    """Every variant of the space; a seeded uniform sample of ``max_trials`` when it is larger."""

    def __init__(self, *args):
        super().__init__(*args)
        self.pending = variant_mod.sample_space(self.spec, self.max_trials, self.fixed, self.rng.randrange(2**31))

    def next_batch(self):
        batch, self.pending = self.pending, []
        return batch


REPAIR_CHANGES = 2  # other tunables coordinate descent may change to make a value fit
REPAIR_WIDTH = 3  # nearest fitting points tried for such a value


class Coordinate(Search):
    """Coordinate descent: sweep each free axis in turn from the best point so far."""

    def __init__(self, *args):
        super().__init__(*args)
        start = variant_mod.make(self.spec, self.fixed)
        self.point = variant_mod.nearest_feasible(start, self.target, keep=self.fixed) or start
        self.axes = [t.name for t in self.spec.tunables if t.name not in self.fixed and len(t.values) > 1]
        self.axis_index = 0
        self.improved_in_pass = False
        self.started = False
        self.passes = 0

    def _best(self):
        ok = [(t, v) for v, t in self.seen.items() if t != float("inf")]
        return min(ok, key=lambda x: x[0])[1] if ok else None

    def next_batch(self):
        if not self.started:
            self.started = True
            return [self.point]
        while self.passes < 3:
            # Move to the best point so far first: the last axis of a pass can improve it too.
            best = self._best() or self.point
            if best != self.point:
                self.point, self.improved_in_pass = best, True
            if self.axis_index >= len(self.axes):
                if not self.improved_in_pass:
                    return []
                self.passes += 1
                self.axis_index, self.improved_in_pass = 0, False
                continue
            axis = self.axes[self.axis_index]
            self.axis_index += 1
            batch = []
            for value in self.spec.tunable(axis).values:
                cand = self.point.with_values(**{axis: value})
                # A value that fits only with another tunable changed (a cluster needs a static
                # or persistent schedule, a deeper ring smaller tiles) is tried at the nearest
                # points where it fits: constraints must not hide part of the space.
                fits = variant_mod.feasible_neighbours(cand, self.target, keep={*self.fixed, axis},
                                                       max_changes=REPAIR_CHANGES)
                for c in fits[:REPAIR_WIDTH] or [cand]:
                    if c not in self.seen and c not in batch:
                        batch.append(c)
            if batch:
                return batch
        return []


def make_search(strategy: str, spec, fixed: dict, target: arch.Target, max_trials: int, seed: int) -> Search:
    if strategy not in STRATEGIES:
        raise TuningError(f"strategy {strategy!r} is not one of {list(STRATEGIES)}")
    if strategy == "auto":
        strategy = "exhaustive" if variant_mod.space_size(spec, fixed) <= max_trials else "coordinate"
    cls = Exhaustive if strategy == "exhaustive" else Coordinate
    return cls(spec, fixed, target, max_trials, seed)


# --- the tuning loop --------------------------------------------------------------------------


def tune(config: TuneConfig, progress: Callable[[str], None] = print) -> list[TuneResult]:
    """Tune ``config.spec`` for each shape in ``config.shapes``; returns one result per shape."""
    from . import bench

    spec = spec_mod.load(config.spec)
    if config.target is None:
        from .runtime import device_info

        target = device_info(0).target
        if target is None:
            raise TuningError("the GPU is of no known target")
    else:
        target = arch.target(config.target)
    if target.name not in spec.targets:
        raise TuningError(f"{spec.name} does not target {target.name} (targets: {', '.join(spec.targets)})")
    database = db.TuningDB(config.db_path)
    shapes = [s if isinstance(s, bench.Shape) else bench.parse_shapes(s)[0] for s in config.shapes]
    pool = compile_pool(config.jobs)  # one set of compile processes for the whole session
    try:
        return [_tune_shape(spec, shape, target, config, database, progress, pool) for shape in shapes]
    except BaseException:  # Ctrl-C: stop the compiles now (the GPU worker is stopped by _tune_shape)
        abort_pool(pool)
        raise
    finally:
        pool.shutdown()


def _tune_shape(spec, shape, target, config: TuneConfig, database: db.TuningDB, progress, pool) -> TuneResult:
    from .families.mla_prefill import problem_key

    t0 = time.time()
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    mask = "causal" if shape.causal else "none"
    problem = str(problem_key(shape.heads, shape.total_q, shape.total_k, shape.batch, shape.causal))
    fixed = {**config.fixed, "mask": mask}
    search = make_search(config.strategy, spec, fixed, target, config.max_trials, config.seed)
    progress(f"{shape.id} ({problem}): tuning {spec.name} on {target.name}, run {run_id}")

    worker = GpuWorker(spec.path, shape, config.seed, config.iters, config.warmup, config.timeout_s)
    info = worker.start()
    key = dispatch.record_key(spec, problem, device=info["device"], sm_count=info["sm_count"], driver=info["driver"],
                              target=target)
    trials: list[TrialResult] = []
    try:
        while len(trials) < config.max_trials:
            batch = [v for v in search.next_batch() if v not in search.seen][: config.max_trials - len(trials)]
            if not batch:
                break
            for r in _run_batch(batch, target, worker, config, progress, len(trials), pool):
                trials.append(r)
                search.tell(r.variant, r.time_ms if r.outcome == "ok" else None)
                database.add_trial(db.Trial(key, dict(r.variant.tunables), r.variant.symbol, r.outcome, r.time_ms,
                                            r.tflops, r.max_error, r.registers, r.spills, r.detail, run_id))
    finally:
        worker.stop()
    ok = [r for r in trials if r.outcome == "ok"]
    # A variant that spills registers to local memory is recorded but never made the winner
    # (unless nothing else passed): spills make a kernel's speed fragile across inputs.
    eligible = [r for r in ok if not r.spills] or ok
    best = min(eligible, key=lambda r: r.time_ms) if eligible else None
    default_v = variant_mod.make(spec, fixed)
    default = next((r for r in trials if r.variant == default_v), None)
    if best is not None:
        database.set_best(db.Best(key, dict(best.variant.tunables), best.variant.symbol, best.time_ms, best.tflops,
                                  run_id, time.time()))
    return TuneResult(shape.id, problem, run_id, trials, best, default, time.time() - t0)


def _run_batch(batch, target, worker: GpuWorker, config: TuneConfig, progress, done: int,
               pool=None) -> Iterable[TrialResult]:
    builds = build_many(batch, [target.name], jobs=config.jobs, pool=pool)
    for i, b in enumerate(builds):
        n = done + i + 1
        if b.status == "pruned":  # by the resource model, or after compiling because it spills
            rep = b.report
            r = TrialResult(b.variant, "pruned", registers=rep.registers if rep else None,
                            spills=(rep.spill_stores + rep.spill_loads) if rep else None, detail="; ".join(b.reasons))
        elif b.status == "compile_error":
            r = TrialResult(b.variant, "compile_error", detail=b.reasons[0][:4000] if b.reasons else "")
        else:
            rep = b.report
            payload = worker.run(dict(b.variant.values))
            r = TrialResult(b.variant, payload.get("outcome", "crash"), payload.get("time_ms"), payload.get("tflops"),
                            payload.get("max_error"), rep.registers if rep else None,
                            (rep.spill_stores + rep.spill_loads) if rep else None, payload.get("detail", ""))
        speed = f" {r.time_ms:.3f} ms {r.tflops:.1f} TFLOP/s" if r.outcome == "ok" else ""
        note = "" if r.outcome == "ok" else f" ({r.detail.splitlines()[0][:100]})" if r.detail else ""
        progress(f"  [{n}] {r.outcome:13s}{speed} {r.variant.symbol}{note}")
        yield r
