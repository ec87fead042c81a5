"""One shape class tuned: the search loop, the trials recorded, the winner chosen and kept."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterable

from .. import db, dispatch, knobs, resources
from .. import variant as variant_mod
from .. import verify as verify_mod
from ..errors import MlagenError
from ..shapes import WorkloadItem, parse_shape
from .config import TrialResult, TuneConfig, TuneResult, family_of, problem_of
from .finals import _final_round
from .runner import TrialRunner
from .search import Ask, Global, Search, make_search

KNOWN_REPAIRS = 3       # fitting neighbours measured for a known winner that the fixed values make unfit
FINAL_SHARE = 0.1       # part of a class's budget kept for the final re-timing


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
        for n in resources.feasible_neighbours(v, target, keep=fixed, max_changes=2, limit=20_000)[:KNOWN_REPAIRS]:
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


def class_fixed(spec, shape, config: TuneConfig) -> dict:
    """The axes a class's search holds: every specialization axis (the shape's value, else the axis's
    first value: a specialization is what the kernel computes, never a tunable, so a shape of the
    default geometry and plain scores is never tried on a kernel of another geometry or with a
    sink), and the tunables ``--fixed`` names."""
    return {**{name: values[0] for name, values in spec.specialize}, **config.fixed,
            **family_of(spec).specialization(shape)}


def _class_search(spec, shape, target, config: TuneConfig, database: db.TuningDB, key: db.RecordKey):
    """(the tunables held fixed, a new search) for one shape class: the same search whenever
    the arguments are the same (the first batch can be compiled before the class is tuned)."""
    fixed = class_fixed(spec, shape, config)
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
        recorder.add(r.trial(key, run_id), logged(r, f"{r.outcome} {r.variant.symbol}"))

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
                    r = TrialResult.resumed_from(a.variant, old)
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
                r = TrialResult.resumed_from(a.variant, old)
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


