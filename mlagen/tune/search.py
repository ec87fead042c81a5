"""Search strategies: which variants to measure next, told the outcome of each batch."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

from .. import arch, resources
from .. import variant as variant_mod
from ..errors import TuningError

STRATEGIES = ("auto", "global", "exhaustive", "coordinate")



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
            start = resources.nearest_feasible(start, self.target, keep=self.fixed) or start
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
            fits = resources.feasible_neighbours(cand, self.target, keep={*self.fixed, axis},
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
        self.local_starts, self.eta, self.repair_width = local_starts, eta, repair_width
        default = variant_mod.make(spec, fixed)
        default = resources.nearest_feasible(default, target, keep=fixed) or default
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
