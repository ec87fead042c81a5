"""The autotuner: search a spec's variants for each shape class, record every trial, keep the winner.

What is tuned. ``TuneConfig.shapes`` lists shapes (BENCHMARKS.md ids, descriptions such as
``b=4,q=4096,h=16,causal``, or the spec's family's shape objects) or weighted
:class:`~mlagen.shapes.WorkloadItem` entries from a workload file; texts are read by the spec's
family (:func:`mlagen.shapes.parse_shape`). Shapes are grouped by shape
class (the dispatcher's problem key: mask, and heads, mean query and key length rounded up to
powers of two), because a tuning record applies to a class. Every distinct class is tuned once,
on its heaviest shape; the classes run in order of their summed weight, heaviest first, and
``budget_s`` is split between them in proportion to that weight (equal weights without a
workload file). ``max_trials`` is per class.

How. A search strategy proposes variants; the resource model prunes them; the rest compile on
the CPU pool while one measuring worker process per GPU (``devices``) checks each compiled
variant against the float32 reference (a small ragged problem with odd lengths, then two heads
of the real shape) and times it if right. Failures are data: a compile error, a wrong result, a
crash (the worker dies or the CUDA context is lost) and a hang (the trial outlives its timeout;
the worker is killed) are recorded like successes and never selected. Results reach the search
in proposal order, so the trials and records do not depend on how many GPUs ran them. With
several GPUs every measurement is split into equal shares, one per GPU, and each check of a new
trial runs once, on one of them (:class:`TrialRunner` says how; ``docs/notes.md`` why).

Strategies: ``global`` (default for spaces larger than ``max_trials``): random feasible samples
plus known good starts (the spec default, winners recorded for other shape classes), successive
halving with re-timing (keep the fastest third, time them again with twice the calls, until
``LOCAL_STARTS`` remain), then coordinate descent from each survivor (``docs/notes.md`` says how
these numbers were chosen). ``exhaustive`` (default for
small spaces) and ``coordinate`` (descent from the default) stay available.

Choosing. The fastest few correct variants (and the spec default) are re-timed in interleaved
rounds (in shares on every GPU); the winner is the lowest median. Finalists within the measured noise of the
fastest are tied, and a tie goes to the variant closest to the spec default, then the first
symbol in sort order, so that runs with different seeds agree. ``resume`` reuses the trials the
database already holds for the same record key and variant symbol instead of repeating them.
"""

from __future__ import annotations

import collections
import itertools
import math
import multiprocessing
import os
import random
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator, Mapping

from . import arch, db, dispatch, knobs
from . import verify as verify_mod
from . import spec as spec_mod
from . import variant as variant_mod
from .build import CompileQueue, abort_pool, compile_pool
from .errors import MlagenError, TuningError
from .shapes import WorkloadItem, parse_shape

STRATEGIES = ("auto", "global", "exhaustive", "coordinate")
FINALISTS = 4           # variants re-timed at the end, besides the spec default
FINAL_ROUNDS = 3        # interleaved rounds of the final re-timing
EXTRA_ROUNDS = 3        # more rounds for the finalists whose rounds still overlap the fastest's
FINALIST_DISTANCE = 3   # tunables in which a finalist differs from every faster one (while the ranking has such)
KNOWN_REPAIRS = 3       # fitting neighbours measured for a known winner that the fixed values make unfit
NOISE_FLOOR = 0.005     # finalists closer than this (or their measured spread) are tied ...
NOISE_CAP = 0.015       # ... but never when further apart than this
FINAL_SHARE = 0.1       # part of a class's budget kept for the final re-timing


@dataclass
class TuneConfig:
    """What to tune and how; ``mlagen tune`` fills it from its options."""

    spec: str
    shapes: tuple  # ids ("D1"), descriptions ("b=4,q=4096,h=16"), the family's shapes or WorkloadItem objects
    strategy: str = "auto"
    max_trials: int = 200
    fixed: dict = field(default_factory=dict)
    timeout_s: float = 60.0
    iters: int = 20
    warmup: int = 3
    jobs: int | None = None
    db_path: str | None = None
    seed: int = 0
    target: str | None = None     # default: the target of the GPU the trials run on
    budget_s: float | None = None  # whole tune, all classes; None: no limit but max_trials
    resume: bool = False
    devices: tuple[int, ...] | None = None  # CUDA ordinals; None: every visible GPU like device 0
    finalists: int = FINALISTS
    final_rounds: int = FINAL_ROUNDS


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
    resumed: bool = False   # taken from the database (--resume), not run again


@dataclass
class Final:
    """One finalist's re-timing: the median of its block medians, and their spread."""

    variant: variant_mod.Variant
    block_ms: list[float]

    @property
    def median_ms(self) -> float:
        return _median(self.block_ms)

    @property
    def noise(self) -> float:
        """Relative spread of the block medians."""
        return (max(self.block_ms) - min(self.block_ms)) / self.median_ms if self.block_ms else math.inf


@dataclass
class TuneResult:
    shape: str
    problem: str
    run_id: str
    trials: list[TrialResult]
    best: TrialResult | None
    default: TrialResult | None
    seconds: float
    weight: float = 1.0
    finals: list[Final] = field(default_factory=list)
    stopped: str = ""   # why the search stopped early ("budget"), empty if it finished
    in_use: str = ""    # the record calls used before the tune (symbol and origin), empty if none
    kept: bool = False  # that record won the final re-timing and stays: nothing was recorded


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


# --- the family -------------------------------------------------------------------------------
# Everything specific to an operation (shape classes, inputs, reference, call, FLOPs) comes from
# the spec's family through the protocol of mlagen/families/base.py; this module names none.


def family_of(spec):
    from . import families

    return families.get(spec.family, spec.path)


def problem_of(shape, family) -> str:
    """The shape class (record key problem) of ``shape``."""
    return family.problem_key(shape)


# --- GPU worker process -----------------------------------------------------------------------


def _worker_main(conn, spec_path: str, shape, seed: int, warmup: int, visible: str | None) -> None:
    """Runs in a spawned process: owns one GPU's CUDA context, the inputs and the references.

    Requests are ``{"values": ..., "iters": n, "warmup": w, "verify": parts}``: check the variant
    with those parts of :data:`mlagen.verify.PARTS` (None: every part not checked here before;
    the tuner spreads a variant's checks over its GPUs), then time it with ``w`` calls to warm up
    (default: the ``warmup`` given at start) and ``n`` timed calls, if the checks passed. The
    answer says how long loading, checking and timing took (``load_s``, ``verify_s``,
    ``time_s``), so the tuner can say where its GPU time went."""
    if visible is not None:  # before anything initialises CUDA in this process
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    try:
        import torch

        from . import measure, verify
        from .runtime import device_info

        spec = spec_mod.load(spec_path)
        family = family_of(spec)
        device = torch.device("cuda", torch.cuda.current_device())
        trial = verify.Verifier(family, shape, device, seed, dtype=str(dict(spec.problem).get("dtype", "bf16")))
        flush = measure.L2Flush(device)
        info = device_info(device.index)
        conn.send(("ready", {"device": info.name, "sm_count": info.sm_count, "driver": info.driver_version,
                             "pci": getattr(info, "pci", "")}))
    except Exception:
        conn.send(("setup_failed", traceback.format_exc()))
        return

    checked: dict[variant_mod.Variant, dict[str, float]] = {}   # parts passed here, with their errors
    while True:
        msg = conn.recv()
        if msg is None:
            return
        t0 = time.perf_counter()
        v = variant_mod.make(spec, msg["values"])
        try:
            sel = dispatch.dispatcher().select(family.name, "", {}, device.index, None, variant=v)
        except MlagenError as exc:
            conn.send({"outcome": "launch_error", "detail": str(exc)})
            continue
        t1 = time.perf_counter()
        try:
            done = checked.setdefault(v, {})
            parts = msg.get("verify")
            parts = [p for p in (verify.PARTS if parts is None else parts) if p not in done]
            spent = {}
            for part in parts:
                t = time.perf_counter()
                problem, err = trial.verify(v, parts=(part,))
                spent[part] = time.perf_counter() - t
                if problem is not None:
                    conn.send({"outcome": "wrong_result", "max_error": err, "detail": problem})
                    break
                done[part] = err
            else:
                t2 = time.perf_counter()
                outputs = trial.outputs()
                for _ in range(msg.get("warmup", warmup)):
                    trial.call(v, outputs)
                samples = measure.time_calls(lambda: trial.call(v, outputs), msg["iters"], flush)
                med = measure.median(samples)
                conn.send({"outcome": "ok", "time_ms": med * 1e3, "tflops": trial.flops() / med / 1e12,
                           "max_error": max((e for e in done.values() if e is not None), default=None),
                           "registers": sel.binary.resources.registers,
                           "spills": sel.binary.resources.spill_stores + sel.binary.resources.spill_loads,
                           "load_s": t1 - t0, "verify_s": t2 - t1, "time_s": time.perf_counter() - t2,
                           "checks_s": spent})
        except Exception as exc:
            # A CUDA error poisons the context: report and exit so the parent starts a fresh worker.
            conn.send({"outcome": "crash", "detail": f"{type(exc).__name__}: {exc}"})
            return


class GpuWorker:
    """A worker process on one GPU with a per-trial timeout; restarted after a crash or a hang.

    ``device`` is a CUDA ordinal as this process sees it; the worker sees only that GPU."""

    def __init__(self, spec_path: str, shape, seed: int, warmup: int, timeout_s: float, device: int | None = None,
                 setup_timeout_s: float = 300.0):
        self.args = (spec_path, shape, seed, warmup, _visible_name(device))
        self.device = device
        self.timeout_s = timeout_s
        self.setup_timeout_s = setup_timeout_s
        self.ctx = multiprocessing.get_context("spawn")
        self.proc = None
        self.conn = None
        self._stopping = False

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

    def run(self, values: dict, iters: int, warmup: int | None = None, verify: tuple[str, ...] | None = None) -> dict:
        """Measure one variant (the request of :func:`_worker_main`); starts the worker first if
        it is not running."""
        if self.proc is None or not self.proc.is_alive():
            self.start()
        msg = {"values": values, "iters": iters, "verify": verify}
        if warmup is not None:
            msg["warmup"] = warmup
        self.conn.send(msg)
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

    def ask_stop(self) -> None:
        """Tell the worker to exit, without waiting (:meth:`stop` waits)."""
        if self.proc is not None and self.proc.is_alive() and not self._stopping:
            self._stopping = True
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.ask_stop()
                self.proc.join(2)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5)
        self.proc = None
        self.conn = None
        self._stopping = False


def _visible_name(device: int | None) -> str | None:
    """The CUDA_VISIBLE_DEVICES entry of ordinal ``device`` as this process numbers it."""
    if device is None:
        return None
    current = os.environ.get("CUDA_VISIBLE_DEVICES")
    if current:
        names = [n.strip() for n in current.split(",") if n.strip()]
        if device >= len(names):
            raise TuningError(f"--devices {device}: only {len(names)} GPU(s) visible (CUDA_VISIBLE_DEVICES={current})")
        return names[device]
    return str(device)


def parse_devices(text: str) -> tuple[int, ...]:
    """``"0,1"`` into (0, 1). Raises ValueError naming the bad entry."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit():
            raise ValueError(f"--devices: {item!r} is not a GPU index; expected a list like 0,1")
        if int(item) in out:
            raise ValueError(f"--devices: {item} is listed twice")
        out.append(int(item))
    return tuple(out)


def default_devices() -> tuple[int, ...]:
    """Every visible GPU of the same kind (name and SM count) as device 0."""
    from .runtime import device_count, device_info

    first = device_info(0)
    return tuple(i for i in range(device_count())
                 if (device_info(i).name, device_info(i).sm_count) == (first.name, first.sm_count))


# --- search strategies ------------------------------------------------------------------------


@dataclass(frozen=True)
class Ask:
    """A measurement a search wants: a new trial of ``variant``, or (``retime``) another timing of
    one already measured, with ``scale`` times the configured timed calls."""

    variant: variant_mod.Variant
    retime: bool = False
    scale: int = 1


class Search:
    """Proposes batches of variants (or :class:`Ask` s); told the outcome of each before the next batch."""

    def __init__(self, spec, fixed: dict, target: arch.Target, max_trials: int, seed: int):
        self.spec, self.fixed, self.target, self.max_trials = spec, fixed, target, max_trials
        self.rng = random.Random(seed)
        self.seen: dict[variant_mod.Variant, float] = {}  # variant -> its time on the trials' scale (inf if failed)
        self.trial_ms: dict[variant_mod.Variant, float] = {}  # variant -> its trial's time
        self.retimed: dict[variant_mod.Variant, float] = {}   # variant -> its latest re-timing (Ask.retime)

    def tell(self, v: variant_mod.Variant, time_ms: float | None, retime: bool = False) -> None:
        """A trial's time (or None if it failed); with ``retime``, a re-timing's (longer blocks of
        calls), which a search puts on the trials' scale itself before it ranks by it."""
        t = time_ms if time_ms is not None else float("inf")
        if retime:
            self.retimed[v] = t
            if t == float("inf"):   # failed when re-timed: out of every ranking
                self.seen[v] = t
        else:
            self.seen[v] = self.trial_ms[v] = t

    def next_batch(self) -> list:
        raise NotImplementedError

    def lookahead(self, partial: Mapping | None = None) -> Iterator[list]:
        """Guesses, made before all results of the batch just proposed are in, at the batches
        that will follow it, nearest first, each computed when asked for (a guess costs
        resource-model checks). ``partial``: the results of that batch so far (variant -> ms,
        None if it failed); the tuner asks again as they come. It compiles the guesses while
        the batch is measured; a guess changes no trial (it is measured only when the search
        proposes it), it only saves compile time when right."""
        return iter(())


class Exhaustive(Search):
    """Every variant of the space; a seeded uniform sample of ``max_trials`` when it is larger."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args)
        self.pending = variant_mod.sample_space(self.spec, self.max_trials, self.fixed, self.rng.randrange(2**31))

    def next_batch(self):
        batch, self.pending = self.pending, []
        return batch


AHEAD_POLL_S = 0.005   # how often a batch waiting for compiles looks for idle GPUs
LOOKAHEAD = 8  # batches a descent guesses ahead (each guess costs resource-model checks)
REPAIR_CHANGES = 2  # other tunables coordinate descent may change to make a value fit
REPAIR_WIDTH = 3  # nearest fitting points tried for such a value


class Coordinate(Search):
    """Coordinate descent: sweep each free axis in turn from the best point so far.

    ``start`` (default: the spec default, or the nearest variant that fits) is where it starts;
    ``seen`` may be shared with other searches: points already measured are not proposed again,
    and only points this descent considered can move it (so descents from several starts stay
    in their own basins)."""

    def __init__(self, spec, fixed, target, max_trials, seed, start=None, seen=None, max_passes: int = 3,
                 repair_width: int = REPAIR_WIDTH, sweeps: dict | None = None):
        super().__init__(spec, fixed, target, max_trials, seed)
        self.repair_width = repair_width
        if seen is not None:
            self.seen = seen
        if start is None:
            start = variant_mod.make(self.spec, self.fixed)
            start = variant_mod.nearest_feasible(start, self.target, keep=self.fixed) or start
        self.point = start
        self.own = {start}
        self.axes = [t.name for t in self.spec.tunables if t.name not in self.fixed and len(t.values) > 1]
        self.axis_index = 0
        self.improved_in_pass = False
        self.started = False
        self.passes = 0
        self.max_passes = max_passes
        self._sweeps: dict = {} if sweeps is None else sweeps   # may be shared by descents of one search
        self.last: list = []    # the batch proposed last

    def _best(self):
        ok = [(t, v.symbol, v) for v in self.own if (t := self.seen.get(v, float("inf"))) != float("inf")]
        return min(ok)[2] if ok else None

    def next_batch(self):
        if not self.started:
            self.started = True
            if self.point not in self.seen:
                self.last = [self.point]
                return [self.point]
        while self.passes < self.max_passes:
            # Move to the best point so far first: the last axis of a pass can improve it too.
            best = self._best() or self.point
            # Move only to a strictly faster point: an equal time is no reason to wander.
            if best != self.point and self.seen.get(best, math.inf) < self.seen.get(self.point, math.inf):
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
            for c in self._sweep(self.point, axis):
                self.own.add(c)
                if c not in self.seen and c not in batch:
                    batch.append(c)
            if batch:
                self.last = batch
                return batch
        return []

    def _sweep(self, point, axis: str) -> list:
        """The points that sweeping ``axis`` from ``point`` measures (remembered: lookahead asks
        for the same sweeps ahead of time)."""
        key = (point, axis)
        if key not in self._sweeps:
            self._sweeps[key] = self._new_sweep(point, axis)
        return self._sweeps[key]

    def _new_sweep(self, point, axis: str) -> list:
        out = []
        for value in self.spec.tunable(axis).values:
            cand = point.with_values(**{axis: value})
            # A value that fits only with another tunable changed (a cluster needs a static or
            # persistent schedule, a deeper ring smaller tiles) is tried at the nearest points
            # where it fits: constraints must not hide part of the space.
            fits = variant_mod.feasible_neighbours(cand, self.target, keep={*self.fixed, axis},
                                                   max_changes=REPAIR_CHANGES)
            out += [c for c in fits[:self.repair_width] or [cand] if c not in out]
        return out

    def lookahead(self, partial: Mapping | None = None) -> Iterator[list]:
        """The sweeps to come, nearest first: the next sweep of this pass from where the point
        will be (the current point, or the best result of the batch just proposed that is
        already in, ``partial``, when it beats the point); then, for each variant of that batch
        whose result is not in yet, the next sweep from it (the point moves there if it wins);
        then the further sweeps (up to ``LOOKAHEAD`` in all) from where the point will be. A
        descent's batches are small (a sweep with most values measured is one or two variants,
        measured in a tenth of a second on two GPUs), so a compile (a second or more) must
        begin several batches ahead."""
        if not self.started and self.point not in self.seen:
            yield [self.point]
            return
        point, index, passes, last = self.point, self.axis_index, self.passes, list(self.last)   # as now
        if passes >= self.max_passes:
            return
        if index < len(self.axes):
            rest = self.axes[index:]
        elif passes + 1 < self.max_passes:
            rest = self.axes   # a new pass if the point moves, or has moved in this one
        else:
            return
        guessed: set = set(last)   # being measured: compiled already

        def sweeps(start, most):
            made = 0
            for axis in rest:
                if made == most:
                    return
                batch = [c for c in self._sweep(start, axis) if c not in self.seen and c not in guessed]
                if batch:
                    made += 1
                    guessed.update(batch)
                    yield batch

        partial = partial or {}
        ok = [(t, v.symbol, v) for v, t in partial.items() if t is not None and v in self.own and v != point]
        mover = min(ok)[2] if ok and min(ok)[0] < self.seen.get(point, math.inf) else None
        # Where the point will be: at the best result so far of the batch, else where it is
        # (if this pass goes on there).
        ahead = mover or (point if index < len(self.axes) or self.improved_in_pass else None)
        later = sweeps(ahead, LOOKAHEAD) if ahead is not None else iter(())
        yield from itertools.islice(later, 1)
        for c in last:   # a result still to come may beat it
            if c != point and c not in partial:
                yield from sweeps(c, 1)
        yield from later


GLOBAL_SHARE = 0.3   # part of max_trials spent on random samples
LOCAL_STARTS = 3     # halving survivors that coordinate descent starts from
LOCAL_REPAIR_WIDTH = 1  # a value that fits only elsewhere is tried at its nearest fitting point only
ETA = 3              # successive halving keeps the fastest 1/ETA of each rung


class Global(Search):
    """Global stage, successive halving, then local descents (the module docstring says why).

    ``starts`` are variants worth measuring whatever the seed (winners recorded for other shape
    classes); the spec default (or the nearest fitting variant) is always one. ``samples``
    random feasible variants (default ``GLOBAL_SHARE`` of ``max_trials``) join them."""

    def __init__(self, spec, fixed, target, max_trials, seed, starts: Iterable = (), samples: int | None = None,
                 local_starts: int = LOCAL_STARTS, eta: int = ETA, repair_width: int = LOCAL_REPAIR_WIDTH):
        super().__init__(spec, fixed, target, max_trials, seed)
        from . import resources

        self.local_starts, self.eta, self.repair_width = local_starts, eta, repair_width
        default = variant_mod.make(spec, fixed)
        default = variant_mod.nearest_feasible(default, target, keep=fixed) or default
        population = [default]
        for v in starts:
            if v not in population and resources.check(v, target).ok:
                population.append(v)
        want = len(population) + (samples if samples is not None else max(4, int(max_trials * GLOBAL_SHARE)))
        total = variant_mod.space_size(spec, fixed)
        axes = [(k, vals) for k, vals in spec.specialize] + [(t.name, t.values) for t in spec.tunables]
        held = dict(default.values)
        tries = 0
        while len(population) < min(want, total) and tries < 200 * want:
            tries += 1
            v = variant_mod.Variant(spec, tuple((k, held[k] if k in fixed else self.rng.choice(vals))
                                                for k, vals in axes))
            if v not in population and resources.check(v, target).ok:
                population.append(v)
        self.population = population
        self.stage = "global"
        self.rung = 0
        self.sweeps: dict = {}   # (point, axis) -> the points of that sweep, for every descent
        self.descents: list[Coordinate] = []

    def ranked(self, variants) -> list:
        """Correct variants fastest first; equal times by symbol (a stable order)."""
        ok = [v for v in variants if self.seen.get(v, math.inf) != math.inf]
        return sorted(ok, key=lambda v: (self.seen[v], v.symbol))

    def _calibrate_rung(self) -> None:
        """Put the rung's re-timings on the trials' scale: divide each by the rung's median ratio of
        re-timing to trial. A rung's longer blocks run the GPU into its power cap and time every
        variant slower than its trial (on the H100, 4-14% in the fifteenth session's calls r and
        s); ranked raw against trials of their neighbours, the survivors would lose to them
        unfairly in the descents and in the choice of finalists. A variant whose re-timing is off by more than the rung's common
        factor (a lucky first trial) still moves by that much."""
        ratios = sorted(self.retimed[v] / self.trial_ms[v] for v in self.population
                        if math.isfinite(self.retimed.get(v, math.inf)) and math.isfinite(self.trial_ms.get(v, math.inf))
                        and self.trial_ms[v] > 0)
        if not ratios:
            return
        factor = ratios[len(ratios) // 2]
        for v in self.population:
            if math.isfinite(self.retimed.get(v, math.inf)):
                self.seen[v] = self.retimed[v] / factor

    def next_batch(self):
        if self.stage == "global":
            self.stage = "halving"
            return list(self.population)
        if self.stage == "halving":
            if self.rung:
                self._calibrate_rung()
            ranked = self.ranked(self.population)
            if len(ranked) > self.local_starts:
                self.rung += 1
                self.population = ranked[:max(self.local_starts, math.ceil(len(ranked) / self.eta))]
                return [Ask(v, retime=True, scale=2 ** self.rung) for v in self.population]
            self.population = ranked
            self.stage = "local"
            self.descents = [Coordinate(self.spec, self.fixed, self.target, self.max_trials, 0, start=v,
                                        seen=self.seen, repair_width=self.repair_width, sweeps=self.sweeps)
                             for v in ranked[:self.local_starts]]
        while self.descents:
            batch = self.descents[0].next_batch()
            if batch:
                return batch
            self.descents.pop(0)
        return []

    def lookahead(self, partial: Mapping | None = None) -> Iterator[list]:
        """The current descent's next sweeps (it sees ``partial``), then the first sweep of each
        descent after it; during halving, the first sweeps of descents from the leaders so far."""
        if self.stage == "halving":
            leaders = self.ranked(self.population)[:self.local_starts] if self.rung else []
            descents = [Coordinate(self.spec, self.fixed, self.target, self.max_trials, 0, start=v, seen=self.seen,
                                   repair_width=self.repair_width, sweeps=self.sweeps) for v in leaders]
        else:
            descents = list(self.descents)
        local = self.stage == "local"
        guessed: set = set()
        for n, d in enumerate(descents):
            for k, batch in enumerate(d.lookahead(partial if n == 0 and local else None)):
                if k and not (n == 0 and local):
                    break
                batch = [v for v in batch if v not in guessed]
                if batch:
                    guessed.update(batch)
                    yield batch


def make_search(strategy: str, spec, fixed: dict, target: arch.Target, max_trials: int, seed: int,
                starts: Iterable = ()) -> Search:
    """The search object for ``strategy`` (``auto``: exhaustive if the space fits ``max_trials``,
    else global)."""
    if strategy not in STRATEGIES:
        raise TuningError(f"strategy {strategy!r} is not one of {list(STRATEGIES)}")
    if strategy == "auto":
        strategy = "exhaustive" if variant_mod.space_size(spec, fixed) <= max_trials else "global"
    if strategy == "global":
        return Global(spec, fixed, target, max_trials, seed, starts=starts)
    cls = Exhaustive if strategy == "exhaustive" else Coordinate
    return cls(spec, fixed, target, max_trials, seed)


# --- running trials on several GPUs ------------------------------------------------------------


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


@dataclass
class ShapeClass:
    """Shapes of one problem key, tuned together on the heaviest one."""

    problem: str
    shape: object   # the family's shape
    weight: float
    members: list


def shape_classes(items: Iterable, family) -> list[ShapeClass]:
    """Group shapes (ids, descriptions, ``family``'s shapes or WorkloadItem) by ``family``'s problem
    key; heaviest class first (ties: first given), each represented by its heaviest shape. Texts
    are read by ``family``."""
    classes: dict[str, ShapeClass] = {}
    best_weight: dict[str, float] = {}
    for item in items:
        if isinstance(item, WorkloadItem):
            shape, weight = item.shape, item.weight
        else:
            shape, weight = (parse_shape(item, family) if isinstance(item, str) else item), 1.0
        problem = problem_of(shape, family)
        c = classes.get(problem)
        if c is None:
            classes[problem] = ShapeClass(problem, shape, weight, [shape])
            best_weight[problem] = weight
            continue
        c.weight += weight
        if shape not in c.members:
            c.members.append(shape)
        if weight > best_weight[problem]:
            c.shape, best_weight[problem] = shape, weight
    order = list(classes)
    return sorted(classes.values(), key=lambda c: (-c.weight, order.index(c.problem)))


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
                runner = TrialRunner(workers, queue.build, config.iters, prefetch=queue, warmup=config.warmup)
                results.append(tune_class(spec, c, target, config, database, runner, key, progress, bar=bar,
                                          budget_s=budget, clock=clock))
            finally:
                _stop_all(workers)
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
        from .runtime import device_info

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
        from .runtime import device_count

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
    from .runtime import device_info

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


def known_starts(spec, fixed: dict, target, database: db.TuningDB | None, key: db.RecordKey | None) -> list:
    """Winners recorded for this spec on this kind of GPU (other shape classes too), as variants
    with ``fixed`` applied: good regions found before are worth measuring whatever the seed."""
    records = []
    if database is not None and key is not None:
        try:
            records += database.bests(spec=spec.name, device=key.device, sm_count=key.sm_count)
        except MlagenError:
            pass
        records += [b for b in db.shipped_records() if b.key.spec == spec.name and b.key.device == key.device]
    out = []
    for b in records:
        try:
            v = variant_mod.make(spec, {**b.variant, **fixed})
        except MlagenError:
            continue
        # A winner that no longer fits as ``fixed`` leaves it (a tunable held at a value its schedule
        # cannot take: the FP8 records with o_flush 4 need o_copy smem, twentieth session) stands in
        # for its nearest fitting neighbours.
        for n in variant_mod.feasible_neighbours(v, target, keep=fixed, max_changes=2, limit=20_000)[:KNOWN_REPAIRS]:
            if n not in out:
                out.append(n)
    return out


def record_in_use(spec, shape, target, config: TuneConfig, database: db.TuningDB | None,
                  key: db.RecordKey | None) -> tuple[variant_mod.Variant, db.Best] | None:
    """The tuning record a call of this shape class runs before the tune (what dispatch picks: the
    user's database and the shipped records, nearest class first), if it agrees with the tunables
    held fixed. The tune measures it and re-times it with the finalists, and a tie keeps it, so a
    tune never records a winner slower than what the calls already get (a user record for the
    class would then shadow a faster shipped one)."""
    if key is None or knobs.no_tuned():
        return None
    specialization = family_of(spec).specialization(shape)
    try:
        for v, best in dispatch.recorded_variants(spec, key, specialization, target, database):
            if all(v.get(k) == value for k, value in config.fixed.items()):
                return v, best
            return None   # dispatch would run this one: a record behind it is not what calls get
    except MlagenError:
        return None
    return None


def _class_search(spec, shape, target, config: TuneConfig, database: db.TuningDB, key: db.RecordKey):
    """(the tunables held fixed, a new search) for one shape class: the same search whenever
    the arguments are the same (the first batch can be compiled before the class is tuned)."""
    fixed = {**config.fixed, **family_of(spec).specialization(shape)}
    starts = known_starts(spec, fixed, target, database, key)
    return fixed, make_search(config.strategy, spec, fixed, target, config.max_trials, config.seed, starts=starts)


def _finished_trials(database: db.TuningDB, key: db.RecordKey) -> dict[str, db.Trial]:
    """Trials the database holds for ``key``, by variant symbol (the latest one of each)."""
    return {t.symbol: t for t in database.trials(**key.as_dict())}


def tune_class(spec, shape_class: ShapeClass, target, config: TuneConfig, database: db.TuningDB, runner: TrialRunner,
               key: db.RecordKey, progress: Callable[[str], None] = print, bar=None, budget_s: float | None = None,
               clock: Callable[[], float] = time.monotonic) -> TuneResult:
    """Search, re-time the finalists, record every trial and the winner for one shape class."""
    shape, problem = shape_class.shape, shape_class.problem
    t0 = clock()
    wall0 = time.time()
    deadline = None if budget_s is None else t0 + budget_s * (1 - FINAL_SHARE)
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    fixed, search = _class_search(spec, shape, target, config, database, key)
    finished = _finished_trials(database, key) if config.resume else {}
    in_use = record_in_use(spec, shape, target, config, database, key)
    progress(f"{shape.id} ({problem}, weight {shape_class.weight:g}): tuning {spec.name} on {target.name} with "
             f"{type(search).__name__.lower()} search, {len(runner.workers)} GPU(s), run {run_id}"
             + (f", {len(finished)} finished trial(s) in the database" if config.resume else ""))
    if in_use is not None:
        progress(f"  in use for this class: {in_use[0].symbol} ({in_use[1].origin}); it joins the final re-timing")
    if bar is not None:
        bar.start(config.max_trials, label=shape.id, budget_s=budget_s)

    trials: list[TrialResult] = []
    measured: dict[variant_mod.Variant, TrialResult] = {}
    stopped = ""

    def out_of_time() -> bool:
        return deadline is not None and clock() >= deadline

    done = [0]
    recorder = _Recorder(database, progress)
    say = recorder.say   # the search's lines go through the recorder, to stay in order with the trials'

    def logged(r: TrialResult, note: str):
        def log():
            done[0] += 1
            _log_trial(progress, done[0], r)
            if bar is not None:
                bar.update(note=note)
        return log

    def record(ask: Ask, r: TrialResult) -> None:
        """Called as each measurement finishes (any worker thread, one at a time): the database,
        the log and the bar, on the recorder's thread. The search hears of it later, in proposal
        order."""
        if ask.retime:
            return
        recorder.add(db.Trial(key, dict(r.variant.tunables), r.variant.symbol, r.outcome, r.time_ms, r.tflops,
                              r.max_error, r.registers, r.spills, r.detail, run_id),
                     logged(r, f"{r.outcome} {r.variant.symbol}"))

    try:
        idle = 0
        while idle < 100:  # a search that keeps proposing only measured points ends too
            if out_of_time():
                stopped = "budget"
                say(f"  budget reached after {clock() - t0:.0f} s; re-timing the finalists")
                break
            asks = [a if isinstance(a, Ask) else Ask(a) for a in search.next_batch()]
            _log_stage(say, search, asks, config.iters)
            new = [a for a in asks if a.retime or a.variant not in measured]
            if not asks:
                break
            room = config.max_trials - len(trials)
            fresh = [a for a in new if not a.retime]
            if room <= 0 and not any(a.retime for a in new):
                break
            keep = {id(a) for a in fresh[:max(room, 0)]}
            new = [a for a in new if a.retime or id(a) in keep]
            to_run, done_now = [], []
            for a in new:
                old = None if a.retime else finished.get(a.variant.symbol)
                if old is not None:
                    r = TrialResult(a.variant, old.outcome, old.time_ms, old.tflops, old.max_error, old.registers,
                                    old.spills, old.detail, resumed=True)
                    done_now.append((a, r))
                    recorder.add(None, logged(r, f"resumed {r.variant.symbol}"))
                else:
                    to_run.append(a)
            # Guesses at the next batches, compiled while this one is measured.
            def lookahead(partial):
                for b in search.lookahead(partial):
                    yield [v for v in b if v not in measured and v.symbol not in finished]

            ran = runner.run(to_run, should_stop=out_of_time, on_result=record, lookahead=lookahead) if to_run else []
            by_ask = {id(a): r for a, r in done_now}
            by_ask.update({id(a): r for a, r in zip(to_run, ran)})
            for a in new:  # in proposal order: the search sees the same sequence on any number of GPUs
                r = by_ask.get(id(a))
                if r is None:
                    continue
                t = r.time_ms if r.outcome == "ok" else None
                search.tell(a.variant, t, retime=a.retime)
                if a.retime:
                    continue
                trials.append(r)
                measured[a.variant] = r
            idle = 0 if new else idle + 1
        if in_use is not None and in_use[0] not in measured:
            # The search did not reach it (few trials, a budget): checked and timed as a trial.
            a = Ask(in_use[0])
            old = finished.get(a.variant.symbol)
            if old is not None:
                r = TrialResult(a.variant, old.outcome, old.time_ms, old.tflops, old.max_error, old.registers,
                                old.spills, old.detail, resumed=True)
                recorder.add(None, logged(r, f"resumed {r.variant.symbol}"))
            else:
                say(f"  measuring the record in use, {a.variant.symbol}")
                r = runner.run([a], on_result=record)[0]
            if r is not None:
                trials.append(r)
                measured[a.variant] = r
    finally:
        recorder.close()   # every trial in the database before going on (or giving up)
    runner.cancel_prefetch()
    searched = clock() - t0
    in_use_v = in_use[0] if in_use is not None else None
    finals, best = _final_round(spec, fixed, trials, search, runner, config, progress, keep=in_use_v)
    _log_time(progress, runner, searched, clock() - t0)
    default_v = variant_mod.make(spec, fixed)
    default = measured.get(default_v)
    kept = best is not None and in_use is not None and best.variant == in_use_v and \
        not in_use[1].origin.startswith("user")
    if in_use is not None and in_use_v in measured and measured[in_use_v].outcome != "ok":
        progress(f"  the record in use ({in_use[1].origin}) failed here ({measured[in_use_v].outcome}): replaced")
    if kept:
        # Nothing faster beyond the noise: calls keep the shipped record (a user record of the same
        # variant would only shadow the records a later version ships).
        progress(f"  kept the record in use ({in_use[1].origin}): no variant was faster beyond the noise; "
                 "nothing recorded as winner")
    elif best is not None:
        database.set_best(db.Best(key, dict(best.variant.tunables), best.variant.symbol, best.time_ms, best.tflops,
                                  run_id, time.time()))
    if bar is not None:
        bar.finish()
    return TuneResult(shape.id, problem, run_id, trials, best, default, time.time() - wall0, shape_class.weight,
                      finals, stopped, in_use=f"{in_use_v.symbol} ({in_use[1].origin})" if in_use else "",
                      kept=kept)


class _Recorder:
    """Writes trials to the database, and lines to the log, on a thread of its own, in the order
    they come: a commit (a disk flush or more, on some machines a good part of a trial's time)
    never holds up a GPU worker, and the trials that finish during one commit are written
    together in the next. Lines (``say``) wait for the trials before them. :meth:`close` waits
    until everything is written and raises what writing raised."""

    def __init__(self, database: db.TuningDB, progress: Callable[[str], None]):
        self.database, self.progress = database, progress
        self._cond = threading.Condition()
        self._items: list = []          # (trial or None, what to log), in order
        self._writing = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def add(self, trial: db.Trial | None, log: Callable[[], None]) -> None:
        """Write ``trial`` (None: nothing) and then call ``log``."""
        with self._cond:
            if self._error is not None:
                raise self._error
            self._items.append((trial, log))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def say(self, line: str) -> None:
        self.add(None, lambda: self.progress(line))

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items:
                    self._writing = False
                    self._cond.notify_all()
                    if not self._cond.wait(1.0) and not self._items:
                        self._thread = None   # idle: a later add() starts another
                        return
                items, self._items, self._writing = self._items, [], True
            try:
                trials = [t for t, _ in items if t is not None]
                if trials:
                    self.database.add_trials(trials)
                for _, log in items:
                    log()
            except BaseException as exc:
                with self._cond:
                    self._error, self._writing, self._thread = exc, False, None
                    self._cond.notify_all()
                return

    def close(self) -> None:
        with self._cond:
            while (self._items or self._writing) and self._error is None and self._thread is not None:
                self._cond.wait()
            if self._error is not None:
                raise self._error


def _log_stage(progress, search: Search, asks: list[Ask], iters: int) -> None:
    if not isinstance(search, Global) or not asks:
        return
    if asks[0].retime:
        progress(f"  halving: re-timing the fastest {len(asks)} with {iters * asks[0].scale} calls each")
    elif search.stage == "halving":
        progress(f"  global: {len(asks)} variants (the default, winners known for other shape classes, random samples)")
    elif search.stage == "local" and search.descents and not search.descents[0].passes \
            and search.descents[0].axis_index == 1:
        progress(f"  local: coordinate descent from {search.descents[0].point.symbol}")


def _log_time(progress, runner: TrialRunner, searched: float, total: float) -> None:
    """Where the GPUs' time went: one line per worker (the device measurement reads it)."""
    progress(f"  search {searched:.1f} s, finalists {total - searched:.1f} s")
    c = runner.compile
    if c.batches:
        # The GPUs may be re-timing earlier asks meanwhile, so this bounds their idle time from above.
        progress(f"  compiles: {c.batches} batches of new variants waited {c.first:.1f} s for their first build "
                 f"and {c.all:.1f} s for all; {c.ahead} of {c.variants} new variants were compiled ahead")
    summary = getattr(runner.prefetch, "summary", None)
    if summary is not None:
        progress(f"  compile queue: {summary()}")
    if runner.ahead_made:
        progress(f"  measured ahead while every GPU waited for compiles: {runner.ahead_made} guesses, "
                 f"{runner.ahead_used} of them then asked for by the search")
    for w, t in enumerate(runner.time):
        other = t.busy - t.load - t.verify - t.timing   # messages, restarts, the worker's own overhead
        checks = ", ".join(f"{part} {t.checks[part]:.1f} s" for part in verify_mod.PARTS if part in t.checks)
        progress(f"  GPU worker {w}: {t.measurements} measurements, busy {t.busy:.1f} s of {total:.1f} s "
                 f"(loading {t.load:.1f} s, checking {t.verify:.1f} s{f' ({checks})' if checks else ''}, "
                 f"timing {t.timing:.1f} s, other {other:.1f} s)")


def _log_trial(progress, n: int, r: TrialResult) -> None:
    speed = f" {r.time_ms:.3f} ms {r.tflops:.1f} TFLOP/s" if r.outcome == "ok" else ""
    note = "" if r.outcome == "ok" else f" ({r.detail.splitlines()[0][:100]})" if r.detail else ""
    progress(f"  [{n}] {r.outcome:13s}{speed} {r.variant.symbol}{note}{' (resumed)' if r.resumed else ''}")


def _final_round(spec, fixed, trials, search, runner: TrialRunner, config: TuneConfig, progress,
                 keep: variant_mod.Variant | None = None):
    """Re-time the fastest correct variants (and the default, and ``keep``: the record in use) in
    interleaved rounds, each re-timing in equal shares on every GPU (so every finalist sees the same
    chips); then up to EXTRA_ROUNDS more rounds of those whose rounds still overlap the fastest's.
    Returns (finals, winner as a TrialResult with the re-timed median)."""
    ok = [t for t in trials if t.outcome == "ok"]
    # A variant that spills registers to local memory is recorded but never made the winner
    # (unless nothing else passed): spills make a kernel's speed fragile across inputs.
    eligible = [t for t in ok if not t.spills] or ok
    if not eligible:
        return [], None
    estimate = {t.variant: search.seen.get(t.variant, t.time_ms) for t in eligible}
    ranked = sorted(eligible, key=lambda t: (estimate[t.variant], t.variant.symbol))
    picked = diverse_finalists(ranked, max(1, config.finalists))
    default_v = variant_mod.make(spec, fixed)
    default = next((t for t in eligible if t.variant == default_v), None)
    if default is not None and default not in picked:
        picked.append(default)
    kept = next((t for t in eligible if t.variant == keep), None) if keep is not None else None
    if kept is not None and kept not in picked:
        picked.append(kept)
    by_variant = {t.variant: t for t in picked}
    if len(picked) < 2 or config.final_rounds < 1:
        return [], picked[0]
    blocks: dict = {t.variant: [] for t in picked}

    def rounds(variants, n):
        asks = [Ask(v, retime=True) for _ in range(n) for v in variants]
        for a, r in zip(asks, runner.run(asks)):
            if blocks.get(a.variant) is None:
                continue
            if r is not None and r.outcome == "ok":
                blocks[a.variant].append(r.time_ms)
            elif r is not None:
                blocks[a.variant] = None  # failed when re-timed: out

    rounds([t.variant for t in picked], config.final_rounds)
    close = unsettled([Final(v, b) for v, b in blocks.items() if b])
    if len(close) > 1 and EXTRA_ROUNDS > 0:
        progress(f"  {len(close)} finalists within each other's rounds: {EXTRA_ROUNDS} more rounds for them")
        rounds([f.variant for f in close], EXTRA_ROUNDS)
    finals = [Final(v, b) for v, b in blocks.items() if b]
    if not finals:
        return [], None
    winner = choose(finals, default_v, keep=keep)
    w = by_variant[winner.variant]
    flops_per_ms = w.tflops * w.time_ms if w.tflops and w.time_ms else None
    best = replace(w, time_ms=winner.median_ms, tflops=flops_per_ms / winner.median_ms if flops_per_ms else None)
    for f in sorted(finals, key=lambda f: f.median_ms):
        mark = "*" if f is winner else ("=" if f.variant == keep else " ")
        progress(f"  final {mark} {f.median_ms:.3f} ms (rounds {min(f.block_ms):.3f}–{max(f.block_ms):.3f}) "
                 f"{f.variant.symbol}")
    return finals, best


def diverse_finalists(ranked: list, n: int, distance: int = FINALIST_DISTANCE) -> list:
    """The first ``n`` of ``ranked`` (trials, fastest first) that differ from every one picked before
    in at least ``distance`` tunables, then the next fastest if too few do. Near copies of one
    schedule time alike in the search and would fill every place, while another schedule whose
    single pass came out a few percent slow never gets the interleaved re-timing that would have
    shown it faster (twentieth session: D3's FP8 search ranked five variants of one two-warpgroup
    schedule first; in one process the 13th, of another schedule, was 4% faster than all of them)."""
    picked = []
    for t in ranked:
        if len(picked) < n and all(_distance(t.variant, p.variant) >= distance for p in picked):
            picked.append(t)
    for t in ranked:
        if len(picked) < n and t not in picked:
            picked.append(t)
    return picked


def _distance(a: variant_mod.Variant, b: variant_mod.Variant) -> int:
    return sum(a[k] != b[k] for k in a.tunables)


def unsettled(finals: list[Final]) -> list[Final]:
    """The fastest finalist and those whose rounds overlap its rounds (the slowest round of the
    fastest is slower than their fastest round): their order is not settled by the rounds."""
    if not finals:
        return []
    fastest = min(finals, key=lambda f: (f.median_ms, f.variant.symbol))
    return [f for f in finals if f is fastest or min(f.block_ms) <= max(fastest.block_ms)]


def choose(finals: list[Final], default: variant_mod.Variant, keep: variant_mod.Variant | None = None) -> Final:
    """The fastest finalist; those within the measured noise of it (the larger spread of the two
    between rounds, at least NOISE_FLOOR, at most NOISE_CAP) are tied, and a tie goes to the fewest
    tunables changed from ``default``, then the first symbol in sort order. ``keep`` (the record
    in use) stays unless that choice beats it in every round both ran, by NOISE_FLOOR or more in
    the median of the rounds' ratios: the rounds are interleaved, so each round compares the two
    at the same clocks and temperature, which the spread between rounds does not (on the H100 at
    its power cap one finalist's rounds spread 5-25% in the twenty-first session's short tunes)."""
    fastest = min(finals, key=lambda f: (f.median_ms, f.variant.symbol))

    def tolerance(f: Final) -> float:
        return min(NOISE_CAP, max(NOISE_FLOOR, fastest.noise, f.noise))

    tied = [f for f in finals if f.median_ms <= fastest.median_ms * (1 + tolerance(f))]
    winner = min(tied, key=lambda f: (_distance(f.variant, default), f.variant.symbol))
    kept = next((f for f in finals if f.variant == keep), None)
    if kept is None or kept is winner or beats(winner, kept):
        return winner
    return kept


def beats(a: Final, b: Final) -> bool:
    """``a`` was faster than ``b`` in every round both ran, by NOISE_FLOOR in the median ratio."""
    ratios = [x / y for x, y in zip(a.block_ms, b.block_ms)]
    return bool(ratios) and max(ratios) < 1 and _median(ratios) <= 1 - NOISE_FLOOR
