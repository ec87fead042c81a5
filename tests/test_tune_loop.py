"""The tuning loop on the CPU: fake GPU workers with synthetic timings, a fake compiler, a fake
clock. Covers the global search, budgets, resume, several devices, finalists and tie-breaks."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import replace

import pytest

from mlagen import arch, db, dispatch, resources
from mlagen import spec as spec_mod
from mlagen import variant as variant_mod
from mlagen.build import BuildResult
from mlagen.errors import MlagenError, ShapeError, TuningError
from mlagen.families import get as get_family
from mlagen.families.mla_prefill.problem import SHAPES, Shape, parse_shape
from mlagen.shapes import WorkloadItem
from mlagen.tune import (LOOKAHEAD, Ask, Coordinate, Final, Global, ShapeClass, TrialRunner, TuneConfig, choose,
                         parse_devices, problem_of, shape_classes, tune_class)
from mlagen.tune import orchestrate
from mlagen.tune import worker as worker_mod
from mlagen.verify import PARTS

DENSE = get_family("mla_prefill")

S90 = spec_mod.load("mla_prefill_sm90")
SM90A = arch.target("sm_90a")
FIXED = {"mask": "causal"}
DEFAULT = resources.nearest_feasible(variant_mod.make(S90, FIXED), SM90A, keep=FIXED)
# The global optimum: 9 tunables away from the default (Q in registers, 2-CTA static clusters ...).
FAR = DEFAULT.with_values(q_operand="regs", epilogue="direct", cluster=2, scheduler="static", consumer_regs=232,
                          producer_regs=32, swizzle_v=64, load_warps=1, block_n=112)


def make(values):
    return variant_mod.make(S90, values)


def distance(a, b) -> int:
    return sum(a[k] != b[k] for k in a.tunables)


def two_basins(v) -> float:
    """A narrow, steep basin at the default (5 ms) and a broad, shallow one at FAR (4 ms): one
    step from the default towards FAR costs more than the default, so descent from the default
    stays; most random points lie in FAR's basin. (Slope 0.2: the spec's constraints turn the step
    to Q in registers into a jump of three tunables, with the static scheduler and the direct
    epilogue, 6 from FAR, which must still cost more than the default: 4 + 0.2 * 6 > 5.)"""
    return min(5.0 + 0.4 * distance(v, DEFAULT), 4.0 + 0.2 * distance(v, FAR))


class FakeWorker:
    """Times a variant with ``cost`` (ms), optionally with noise and a per-call clock advance."""

    def __init__(self, cost, clock=None, seconds=0.0, noise=0.0, seed=0, fail_after=None, delay=0.0):
        self.cost, self.clock, self.seconds, self.noise = cost, clock, seconds, noise
        self.rng = random.Random(seed)
        self.calls: list[tuple[dict, int]] = []
        self.requests: list[dict] = []   # what each call asked besides the calls: warmup, verify
        self.fail_after, self.delay = fail_after, delay
        self.lock = threading.Lock()

    def run(self, values, iters, **request):
        with self.lock:
            if self.fail_after is not None and len(self.calls) >= self.fail_after:
                raise RuntimeError("power cut")
            self.calls.append((values, iters))
            self.requests.append(request)
            if self.clock is not None:
                self.clock.now += self.seconds
            jitter = 1 + self.noise * self.rng.uniform(-1, 1)
        if self.delay:
            time.sleep(self.delay * self.rng.random())
        v = variant_mod.make(S90, values)
        t = self.cost(v) * jitter
        return {"outcome": "ok", "time_ms": t, "tflops": 1e3 / t, "max_error": 1e-3, "registers": 168, "spills": 0}


class FakeBuild:
    """Prunes with the real resource model and 'compiles' everything else instantly."""

    def __init__(self):
        self.built: list[str] = []

    def __call__(self, variants, on_built):
        for v in variants:
            verdict = resources.check(v, SM90A)
            if verdict.ok:
                self.built.append(v.symbol)
                on_built(BuildResult(v, "sm_90a", verdict.resources, "ok"))
            else:
                on_built(BuildResult(v, "sm_90a", verdict.resources, "pruned", verdict.reasons))


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


KEY = db.RecordKey("mla_prefill", "mla_prefill_sm90", "causal/h128/q8192/k8192", "bf16", "Fake GPU", 132, "13.0",
                   "nvrtc 13.0", "abc")


class FakePrefetch:
    """Compiles guesses instantly (those the resource model accepts), as build.CompileQueue would."""

    def __init__(self):
        self.queued: list = []
        self.cancels = 0

    def __call__(self, variants, on_compiled=None):
        for v in variants:
            self.queued.append(v)
            if on_compiled is not None and resources.check(v, SM90A).ok:
                on_compiled(v)

    def cancel(self):
        self.cancels += 1
        return 0


def run_class(tmp_path, strategy="global", max_trials=200, workers=None, seed=0, budget_s=None, clock=None,
              resume=False, build=None, cost=two_basins, finalists=4, db_name="t.sqlite", prefetch=None,
              progress=lambda line: None):
    config = TuneConfig(spec=S90.path, shapes=("D1",), strategy=strategy, max_trials=max_trials, seed=seed,
                        iters=10, resume=resume, finalists=finalists)
    workers = workers or [FakeWorker(cost)]
    runner = TrialRunner(workers, build or FakeBuild(), config.iters, prefetch=prefetch)
    shape_class = ShapeClass(KEY.problem, SHAPES["D1"], 1.0, [SHAPES["D1"]])
    return tune_class(S90, shape_class, SM90A, config, db.TuningDB(tmp_path / db_name), runner, KEY,
                      progress=progress, budget_s=budget_s, clock=clock or time.monotonic)


# --- search ------------------------------------------------------------------------------------


def test_far_optimum_fits_and_defeats_coordinate_descent(tmp_path):
    assert resources.check(FAR, SM90A).ok and distance(DEFAULT, FAR) == 9
    result = run_class(tmp_path, strategy="coordinate")
    assert result.best.variant == DEFAULT and result.best.time_ms == pytest.approx(5.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_global_search_finds_the_far_optimum(tmp_path, seed):
    result = run_class(tmp_path, seed=seed)
    assert result.best.variant == FAR, result.best.variant.symbol
    assert result.best.time_ms == pytest.approx(4.0)
    assert len(result.trials) <= 200


def test_global_search_is_seeded():
    a = Global(S90, FIXED, SM90A, 200, seed=5).population
    b = Global(S90, FIXED, SM90A, 200, seed=5).population
    c = Global(S90, FIXED, SM90A, 200, seed=6).population
    assert a == b and a != c
    assert a[0] == DEFAULT and len(a) == 1 + 60 and len(set(a)) == len(a)
    assert all(resources.check(v, SM90A).ok for v in a)


def test_global_search_measures_known_starts_first():
    g = Global(S90, FIXED, SM90A, 200, seed=0, starts=[FAR, DEFAULT])
    assert g.population[:2] == [DEFAULT, FAR]


def test_known_winners_that_fixed_values_make_unfit_are_repaired_to_their_nearest_neighbours():
    """The FP8 records of the nineteenth session (three consumer warpgroups, no two-level accumulation)
    with o_flush 4 held fixed do not fit 160 registers with the copy in registers; their nearest fitting
    neighbour (the copy in shared memory) is measured in their place, not dropped."""
    from mlagen.tune import known_starts

    fp8 = spec_mod.load("mla_prefill_sm90_fp8")
    old = {"block_n": 96, "cluster": 1, "consumer_regs": 160, "consumers": 3, "diagonal": "half", "epilogue": "direct",
           "load_warps": 1, "order": "none", "overlap": True, "producer_regs": 32, "pv_wait": "late",
           "q_operand": "smem", "rescale": "lazy", "scheduler": "dynamic", "stages": 2, "swizzle_k": 64,
           "swizzle_q": 64, "swizzle_v": 32, "v_transpose": "kernel", "o_flush": 0}

    class Db:
        def bests(self, **_):
            return [type("B", (), {"variant": old})()]

    key = type("K", (), {"device": "none such", "sm_count": 132})()
    fixed = {"mask": "none", "o_flush": 4}
    starts = known_starts(fp8, fixed, SM90A, Db(), key)
    assert not resources.check(variant_mod.make(fp8, {**old, **fixed}), SM90A).ok
    assert variant_mod.make(fp8, {**old, **fixed, "o_copy": "smem"}) in starts
    assert all(resources.check(v, SM90A).ok and v["o_flush"] == 4 for v in starts)


def test_finalists_are_the_fastest_of_different_schedules():
    """Near copies of one schedule (one or two tunables apart) do not crowd out the next schedule;
    the places left are filled by rank."""
    from mlagen.tune import diverse_finalists

    a = DEFAULT
    trials = [type("T", (), {"variant": v})() for v in
              (a, a.with_values(swizzle_q=64), a.with_values(swizzle_q=64, stages=3), FAR, FAR.with_values(stages=2))]
    picked = diverse_finalists(trials, 3)
    assert [t.variant for t in picked] == [a, FAR, a.with_values(swizzle_q=64)]
    assert diverse_finalists(trials, 1) == trials[:1]
    assert len(diverse_finalists(trials, 9)) == 5


def test_halving_retimes_survivors_with_more_calls():
    g = Global(S90, FIXED, SM90A, 30, seed=0, samples=26)
    first = g.next_batch()
    assert len(first) == 27 and not any(isinstance(a, Ask) for a in first)
    for v in first:
        g.tell(v, two_basins(v))
    rung = g.next_batch()
    assert all(a.retime and a.scale == 2 for a in rung) and len(rung) == 9
    want = sorted(first, key=lambda v: (two_basins(v), v.symbol))[:9]
    assert [a.variant for a in rung] == want
    lucky = rung[0].variant   # its longer timing shows the first was luck: it drops out
    for a in rung:
        g.tell(a.variant, 100.0 if a.variant == lucky else two_basins(a.variant), retime=True)
    rung = g.next_batch()
    assert len(rung) == 3 and all(a.scale == 4 for a in rung) and lucky not in [a.variant for a in rung]
    want = want[1:]
    for a in rung:
        g.tell(a.variant, two_basins(a.variant), retime=True)
    local = g.next_batch()  # three left: descent from the first survivor starts with its first axis
    assert local and not any(isinstance(a, Ask) for a in local) and len(g.descents) == 3
    assert [d.point for d in g.descents] == [a.variant for a in rung] == want[:3]


def test_halving_puts_re_timings_on_the_trials_scale():
    """A rung's longer blocks time every survivor slower (the GPU at its power cap: 8% here); the
    survivors keep trial-scale times, so a descent's neighbours (plain trials) do not beat its start
    by that bias alone, and a survivor whose re-timing is off by more (a lucky trial) still drops."""
    g = Global(S90, FIXED, SM90A, 30, seed=0, samples=26)
    first = g.next_batch()
    for v in first:
        g.tell(v, two_basins(v))
    rung = g.next_batch()
    lucky = rung[1].variant
    for a in rung:
        g.tell(a.variant, two_basins(a.variant) * (1.5 if a.variant == lucky else 1.08), retime=True)
    rung2 = g.next_batch()
    assert lucky not in [a.variant for a in rung2]
    for a in rung:
        if a.variant != lucky:
            assert g.seen[a.variant] == pytest.approx(two_basins(a.variant))
            assert g.retimed[a.variant] == pytest.approx(two_basins(a.variant) * 1.08)
    assert g.seen[lucky] == pytest.approx(two_basins(lucky) * 1.5 / 1.08)
    assert g.trial_ms[lucky] == two_basins(lucky)


def test_noisy_timings_still_pick_the_far_basin_with_every_seed(tmp_path):
    picks = []
    for seed in range(3):
        worker = FakeWorker(two_basins, noise=0.02, seed=seed)
        result = run_class(tmp_path, seed=seed, workers=[worker], db_name=f"n{seed}.sqlite")
        picks.append(two_basins(result.best.variant))
    assert max(picks) <= 4.0 * 1.02, picks


def test_coordinate_descents_from_two_starts_stay_in_their_basins():
    seen = {}
    a = Coordinate(S90, FIXED, SM90A, 500, 0, start=DEFAULT, seen=seen)
    b = Coordinate(S90, FIXED, SM90A, 500, 0, start=FAR, seen=seen)
    for search in (a, b):
        while batch := search.next_batch():
            for v in batch:
                search.tell(v, two_basins(v) if resources.check(v, SM90A).ok else None)
    assert a.point == DEFAULT and b.point == FAR


# --- finalists ---------------------------------------------------------------------------------


def test_choose_breaks_ties_within_noise_by_a_stable_key():
    near = DEFAULT.with_values(stages=3)           # 1 tunable from the default
    far = FAR                                      # 9 tunables away
    # far is 0.3% faster: inside the noise floor, so the variant closer to the default wins
    finals = [Final(far, [1.000, 1.001, 0.999]), Final(near, [1.003, 1.003, 1.003])]
    assert choose(finals, DEFAULT).variant == near
    # 3% faster is outside the noise: the faster one wins
    finals = [Final(far, [0.97, 0.971, 0.969]), Final(near, [1.0, 1.0, 1.0])]
    assert choose(finals, DEFAULT).variant == far
    # a noisy fastest widens the tie, but never beyond NOISE_CAP
    finals = [Final(far, [0.98, 0.94, 1.00]), Final(near, [1.0, 1.0, 1.0])]
    assert choose(finals, DEFAULT).variant == far
    finals = [Final(far, [0.992, 0.987, 0.997]), Final(near, [1.0, 1.0, 1.0])]
    assert choose(finals, DEFAULT).variant == near


def test_choose_replaces_the_record_in_use_only_when_every_round_says_so():
    near = DEFAULT.with_values(stages=3)
    finals = [Final(near, [1.000, 1.001, 0.999]), Final(FAR, [1.003, 1.003, 1.003])]
    assert choose(finals, DEFAULT).variant == near
    assert choose(finals, DEFAULT, keep=FAR).variant == FAR          # a tie
    finals = [Final(near, [0.97, 0.97, 0.97]), Final(FAR, [1.0, 1.0, 1.0])]   # 3% in every round
    assert choose(finals, DEFAULT, keep=FAR).variant == near
    # 2% faster in the median, but slower in one round (the rounds drift together at the power cap)
    finals = [Final(near, [0.95, 0.98, 1.06]), Final(FAR, [0.97, 1.0, 1.05])]
    assert choose(finals, DEFAULT).variant == near and choose(finals, DEFAULT, keep=FAR).variant == FAR
    # a slow round shared by both does not hide a steady lead (the spread is 29%, the lead 3%)
    finals = [Final(near, [0.97, 1.26, 0.98]), Final(FAR, [1.0, 1.3, 1.01])]
    assert choose(finals, DEFAULT, keep=FAR).variant == near


def test_beats_compares_the_rounds_both_ran():
    from mlagen.tune import beats

    a, b = DEFAULT, FAR
    assert beats(Final(a, [0.97, 0.98, 0.97, 0.99]), Final(b, [1.0, 1.0, 1.0]))       # the extra round unpaired
    assert not beats(Final(a, [0.97, 0.98, 0.97]), Final(b, [1.0, 1.0, 0.96]))
    assert not beats(Final(a, [0.998, 0.998, 0.998]), Final(b, [1.0, 1.0, 1.0]))       # under NOISE_FLOOR
    assert not beats(Final(a, []), Final(b, [1.0]))


def test_unsettled_finalists_are_those_whose_rounds_overlap_the_fastest():
    from mlagen.tune import unsettled

    a, b, c = DEFAULT, DEFAULT.with_values(stages=3), FAR
    finals = [Final(a, [1.00, 1.02, 1.01]), Final(b, [1.015, 1.03, 1.04]), Final(c, [1.03, 1.04, 1.05])]
    assert [f.variant for f in unsettled(finals)] == [a, b]
    assert unsettled([]) == [] and len(unsettled(finals[:1])) == 1


def _put_in_use(monkeypatch, tmp_path, variant, origin):
    """``variant`` as the record in use for KEY: a shipped record, or the user's in the tune's database."""
    best = db.Best(KEY, dict(variant.tunables), variant.symbol, 1.0, None, "r0", 0.0)
    if origin == "user":
        db.TuningDB(tmp_path / "t.sqlite").set_best(best)
        monkeypatch.setattr(db, "shipped_records", lambda: ())
    else:
        monkeypatch.setattr(db, "shipped_records", lambda: (replace(best, origin="shipped:h100.json"),))


def test_a_tune_keeps_the_shipped_record_in_use_when_nothing_beats_it(tmp_path, monkeypatch):
    """A near twin of FAR is shipped; the search finds FAR, 0.3% faster (inside the noise): the
    record stays and nothing is written (a user record would shadow the records a later version
    ships)."""
    twin = FAR.with_values(swizzle_q=64)
    assert resources.check(twin, SM90A).ok
    _put_in_use(monkeypatch, tmp_path, twin, "shipped")
    lines = []
    result = run_class(tmp_path, cost=lambda v: 4.012 if v == twin else two_basins(v), progress=lines.append)
    assert {FAR, twin} <= {f.variant for f in result.finals}
    assert result.kept and result.best.variant == twin and result.in_use == f"{twin.symbol} (shipped:h100.json)"
    assert db.TuningDB(tmp_path / "t.sqlite").bests() == []
    assert any("kept the record in use" in line for line in lines)


def test_a_tune_replaces_the_record_in_use_when_a_variant_is_faster(tmp_path, monkeypatch):
    slow = DEFAULT.with_values(swizzle_q=64)      # 5.4 ms: the search finds FAR at 4.0
    assert resources.check(slow, SM90A).ok
    _put_in_use(monkeypatch, tmp_path, slow, "shipped")
    result = run_class(tmp_path)
    assert not result.kept and result.best.variant == FAR
    assert slow in {f.variant for f in result.finals}
    assert [b.symbol for b in db.TuningDB(tmp_path / "t.sqlite").bests()] == [FAR.symbol]


def test_the_record_in_use_is_measured_when_the_search_does_not_reach_it(tmp_path, monkeypatch):
    """Coordinate descent from the default never reaches FAR; as the user's record in use it is
    checked and timed after the search, wins the final, and is written again (a user record)."""
    _put_in_use(monkeypatch, tmp_path, FAR, "user")
    lines = []
    result = run_class(tmp_path, strategy="coordinate", max_trials=20, progress=lines.append)
    assert FAR in [t.variant for t in result.trials]
    assert any("measuring the record in use" in line for line in lines)
    assert result.best.variant == FAR and not result.kept
    assert [b.symbol for b in db.TuningDB(tmp_path / "t.sqlite").bests()] == [FAR.symbol]


def test_a_record_in_use_that_fails_its_check_is_replaced(tmp_path, monkeypatch):
    _put_in_use(monkeypatch, tmp_path, FAR, "shipped")

    class Wrong(FakeWorker):
        def run(self, values, iters, **request):
            r = super().run(values, iters, **request)
            if variant_mod.make(S90, values) == FAR:
                r = {**r, "outcome": "wrong_result", "max_error": 1.0}
            return r

    lines = []
    result = run_class(tmp_path, workers=[Wrong(two_basins)], progress=lines.append)
    assert result.best.variant != FAR and not result.kept
    assert any("failed here (wrong_result): replaced" in line for line in lines)
    assert [b.symbol for b in db.TuningDB(tmp_path / "t.sqlite").bests()] == [result.best.variant.symbol]


def test_a_record_in_use_that_disagrees_with_fixed_values_is_not_a_finalist(tmp_path, monkeypatch):
    from mlagen.tune import record_in_use

    _put_in_use(monkeypatch, tmp_path, FAR, "shipped")
    database = db.TuningDB(tmp_path / "t.sqlite")
    config = TuneConfig(spec=S90.path, shapes=("D1",))
    assert record_in_use(S90, SHAPES["D1"], SM90A, config, database, KEY)[0] == FAR
    config = TuneConfig(spec=S90.path, shapes=("D1",), fixed={"swizzle_q": 64})
    assert record_in_use(S90, SHAPES["D1"], SM90A, config, database, KEY) is None
    monkeypatch.setenv("MLAGEN_NO_TUNED", "1")
    assert record_in_use(S90, SHAPES["D1"], SM90A, TuneConfig(spec=S90.path, shapes=("D1",)), database, KEY) is None


def test_a_database_that_fails_mid_tune_stops_the_tune_with_its_error(tmp_path, monkeypatch):
    """A write that fails on the recorder's thread (a full disk, a lock held past the timeout) used
    to end a GPU-serving thread inside the batch and leave the tune waiting for ever."""
    from mlagen.errors import DatabaseError

    calls = [0]
    real = db.TuningDB.add_trials

    def add_trials(self, trials):
        calls[0] += 1
        if calls[0] >= 3:
            raise DatabaseError("database or disk is full")
        return real(self, trials)

    monkeypatch.setattr(db.TuningDB, "add_trials", add_trials)
    outcome = []

    def tune_it():
        try:
            run_class(tmp_path, workers=[FakeWorker(two_basins, delay=0.002)])
        except DatabaseError as exc:
            outcome.append(exc)

    t = threading.Thread(target=tune_it, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the tune hung after the database failed"
    assert outcome and "disk is full" in str(outcome[0])


def test_finalists_are_retimed_in_shares_on_every_gpu_and_the_winner_recorded(tmp_path):
    workers = [FakeWorker(two_basins), FakeWorker(lambda v: 1.1 * two_basins(v))]
    lines = []
    result = run_class(tmp_path, workers=workers, progress=lines.append)
    assert 2 <= len(result.finals) <= 5 and all(len(f.block_ms) == 3 for f in result.finals)
    # every finalist's rounds are the mean of a share on each GPU (the second 10% slower)
    for f in result.finals:
        assert f.block_ms == pytest.approx([1.05 * two_basins(f.variant)] * 3)
    finals = {f.variant for f in result.finals}
    for w in workers:
        assert sum(make(values) in finals for values, _ in w.calls[-3 * len(finals):]) == 3 * len(finals)
    assert sum(line.startswith("  GPU worker ") for line in lines) == 2
    assert DEFAULT in {f.variant for f in result.finals}   # the default is re-timed beside them
    (best,) = db.TuningDB(tmp_path / "t.sqlite").bests()
    assert best.symbol == FAR.symbol == result.best.variant.symbol
    assert best.time_ms == pytest.approx(4.2)


def test_spilling_variants_are_never_the_winner(tmp_path):
    class Spilling(FakeWorker):
        def run(self, values, iters, **request):
            out = super().run(values, iters, **request)
            out["spills"] = 8 if variant_mod.make(S90, values) == FAR else 0
            return out

    result = run_class(tmp_path, workers=[Spilling(two_basins)])
    assert result.best.variant != FAR and result.best.time_ms > 4.0


# --- budget and resume --------------------------------------------------------------------------


def test_budget_stops_the_search(tmp_path):
    clock = Clock()
    worker = FakeWorker(two_basins, clock=clock, seconds=1.0)
    result = run_class(tmp_path, workers=[worker], budget_s=40.0, clock=clock)
    assert result.stopped == "budget"
    # 90% of the budget for the search at a second per measurement; then the final re-timing
    searched = len(worker.calls) - sum(len(f.block_ms) for f in result.finals)
    assert searched == 36 and len(result.trials) == 36
    assert result.best is not None
    full = run_class(tmp_path, db_name="full.sqlite")
    assert not full.stopped and len(full.trials) > 36


def test_resume_repeats_no_finished_trial(tmp_path):
    build = FakeBuild()
    with pytest.raises(RuntimeError, match="power cut"):
        run_class(tmp_path, workers=[FakeWorker(two_basins, fail_after=50)], build=build)
    database = db.TuningDB(tmp_path / "t.sqlite")
    done = {t.symbol for t in database.trials()}
    assert 40 <= len(done) <= 50 and database.bests() == []

    build2 = FakeBuild()
    result = run_class(tmp_path, resume=True, build=build2)
    assert not set(build2.built) & done               # nothing finished is compiled or run again
    resumed = [t for t in result.trials if t.resumed]
    assert {t.variant.symbol for t in resumed} == {t.symbol for t in database.trials()} & done
    assert len(resumed) == len(done)
    assert result.best.variant == FAR
    # the same search as one uninterrupted tune
    straight = run_class(tmp_path, db_name="straight.sqlite")
    assert [t.variant for t in result.trials] == [t.variant for t in straight.trials]


def test_without_resume_everything_runs_again(tmp_path):
    run_class(tmp_path, max_trials=20)
    build = FakeBuild()
    run_class(tmp_path, max_trials=20, build=build)
    assert len(build.built) >= 15


# --- several devices ----------------------------------------------------------------------------


def test_runner_returns_results_in_ask_order_and_uses_every_worker():
    workers = [FakeWorker(two_basins, seed=i, delay=0.01) for i in range(3)]
    runner = TrialRunner(workers, FakeBuild(), 10)
    variants = variant_mod.sample_space(S90, 1000, FIXED, seed=3)
    variants = [v for v in variants if resources.check(v, SM90A).ok][:24]
    assert len(variants) == 24
    asks = [Ask(v) for v in variants] + [Ask(variants[0], retime=True, scale=4)]
    results = runner.run(asks)
    assert [r.variant for r in results] == [a.variant for a in asks]
    assert all(r.outcome == "ok" and r.time_ms == pytest.approx(two_basins(r.variant)) for r in results)
    # every measurement is split: each worker times every variant with a third of the calls
    # (10 -> 4 each, the re-timing's 4 x 10 -> 14 each)
    for w in workers:
        assert sorted(it for _, it in w.calls) == [4] * 24 + [14]
        assert (dict(variants[0].values), 14) in w.calls
    # each new trial is checked once: its two checks on two workers, taking turns
    for v in variants:
        checks = [c for w in workers for (values, _), r in zip(w.calls, w.requests)
                  if values == dict(v.values) for c in r["verify"]]
        assert sorted(checks) == sorted(PARTS)
    firsts = [[r["verify"][:1] for r in w.requests if r["verify"]] for w in workers]
    assert all(firsts), firsts       # every worker runs some of the checks
    assert all(r["verify"] == () for w in workers for (_, it), r in zip(w.calls, w.requests) if it == 14)


def test_one_worker_checks_everything_then_times_as_before():
    worker = FakeWorker(two_basins)
    results = TrialRunner([worker], FakeBuild(), 10, warmup=3).run([Ask(DEFAULT), Ask(FAR, retime=True, scale=2)])
    assert [r.time_ms for r in results] == [two_basins(DEFAULT), two_basins(FAR)]
    assert worker.calls == [(dict(FAR.values), 20), (dict(DEFAULT.values), 10)]
    assert worker.requests == [{"warmup": None, "verify": ()}, {"warmup": None, "verify": PARTS}]


def test_the_runner_accounts_for_the_compiles_each_batch_waited_for():
    """The log line 'compiles: ...' (how long batches waited for their own builds, and how many
    new variants were compiled ahead) comes from these counts."""
    import time as time_mod
    from mlagen.compiler import Binary

    class SlowBuild(FakeBuild):
        """The first variant of every batch takes 50 ms; FAR was compiled ahead (a cache hit)."""

        def __call__(self, variants, on_built):
            for k, v in enumerate(variants):
                if k == 0:
                    time_mod.sleep(0.05)
                verdict = resources.check(v, SM90A)
                binary = Binary(b"", "sm_90a", v.symbol, "k", None, "fake", from_cache=v == FAR)
                on_built(BuildResult(v, "sm_90a", verdict.resources, "ok", binary=binary))

    runner = TrialRunner([FakeWorker(two_basins)], SlowBuild(), 10)
    runner.run([Ask(DEFAULT), Ask(FAR)])
    runner.run([Ask(DEFAULT, retime=True, scale=2)])   # re-timings build nothing
    c = runner.compile
    assert (c.batches, c.variants, c.ahead) == (1, 2, 1)
    assert 0.05 <= c.first <= c.all < 5


def test_a_wrong_result_found_by_one_share_fails_the_trial_and_skips_the_rest():
    class Checking(FakeWorker):
        """Wrong on the real shape for FAR: only the worker that checks the shape sees it."""

        def run(self, values, iters, **request):
            out = super().run(values, iters, **request)
            if values == dict(FAR.values) and "shape" in request["verify"]:
                return {"outcome": "wrong_result", "max_error": 0.5, "detail": "shape: relative L2 error 5e-01"}
            return out

    workers = [Checking(two_basins), Checking(two_basins)]
    runner = TrialRunner(workers, FakeBuild(), 10, warmup=3)
    results = runner.run([Ask(DEFAULT), Ask(FAR)])
    assert results[0].outcome == "ok" and results[0].max_error == 1e-3
    assert results[1].outcome == "wrong_result" and results[1].time_ms is None and results[1].max_error == 0.5
    assert all(r["warmup"] == 2 for w in workers for r in w.requests)    # 3 warm-up calls split, rounded up
    # a share that has not started when another fails is not measured
    release = threading.Event()

    class Slow(Checking):
        def run(self, values, iters, **request):
            release.wait(5)
            return super().run(values, iters, **request)

    fast, slow = Checking(two_basins), Slow(two_basins)
    runner = TrialRunner([fast, slow], FakeBuild(), 10)
    done = []
    # the slow worker is held in DEFAULT's share while the fast one checks FAR's shape and fails it
    thread = threading.Thread(target=lambda: done.append(runner.run([Ask(DEFAULT), Ask(FAR)])))
    thread.start()
    deadline = time.monotonic() + 5
    while not (runner._batch and runner._batch.failed[1]) and time.monotonic() < deadline:
        time.sleep(0.01)
    release.set()
    thread.join(5)
    assert done and done[0][0].outcome == "ok" and done[0][1].outcome == "wrong_result"
    assert [c for c, _ in slow.calls] == [dict(DEFAULT.values)]   # FAR's share there was skipped


def test_runner_measures_while_compiling():
    """A worker starts on the first built variant while later ones still compile."""
    order = []
    worker = FakeWorker(two_basins)
    original = worker.run

    def run(values, iters, **request):
        order.append("run")
        return original(values, iters, **request)

    worker.run = run

    def slow_build(variants, on_built):
        for v in variants:
            order.append("built")
            on_built(BuildResult(v, "sm_90a", None, "ok"))
            time.sleep(0.05)

    variants = [DEFAULT, FAR, DEFAULT.with_values(stages=3)]
    TrialRunner([worker], slow_build, 10).run([Ask(v) for v in variants])
    assert order.index("run") < len(order) - 1 and order[-1] == "run" and order.count("run") == 3
    assert order[:2] == ["built", "run"] or order[1] == "built"


def test_runner_stops_dispatching_when_told():
    worker = FakeWorker(two_basins)
    runner = TrialRunner([worker], FakeBuild(), 10)
    asks = [Ask(DEFAULT), Ask(FAR), Ask(DEFAULT.with_values(swizzle_v=64))]
    results = runner.run(asks, should_stop=lambda: len(worker.calls) >= 1)
    assert results[0] is not None and results[1:] == [None, None]


def test_a_worker_that_fails_stops_the_batch():
    runner = TrialRunner([FakeWorker(two_basins, fail_after=0)], FakeBuild(), 10)
    with pytest.raises(RuntimeError, match="power cut"):
        runner.run([Ask(DEFAULT)])


def test_trials_and_records_do_not_depend_on_the_number_of_gpus(tmp_path):
    one = run_class(tmp_path, workers=[FakeWorker(two_basins)], db_name="one.sqlite")
    three = run_class(tmp_path, workers=[FakeWorker(two_basins, delay=0.002, seed=i) for i in range(3)],
                      db_name="three.sqlite")
    assert [(t.variant, t.outcome, t.time_ms) for t in one.trials] == \
        [(t.variant, t.outcome, t.time_ms) for t in three.trials]
    assert one.best.variant == three.best.variant
    a = sorted((t.symbol, t.outcome) for t in db.TuningDB(tmp_path / "one.sqlite").trials())
    b = sorted((t.symbol, t.outcome) for t in db.TuningDB(tmp_path / "three.sqlite").trials())
    assert a == b


class TimedWorker(FakeWorker):
    """Takes ``seconds`` of wall time per 10 timed calls (a sleep: no CPU) and logs when it was busy."""

    def __init__(self, cost, seconds, log, name):
        super().__init__(cost)
        self.seconds, self.log, self.name = seconds, log, name

    def run(self, values, iters, **request):
        t0 = time.monotonic()
        time.sleep(self.seconds * iters / 10)
        out = super().run(values, iters, **request)
        self.log.append((self.name, t0, time.monotonic()))
        return out


def overlap(log) -> float:
    """Of the time any worker was busy, the part during which two were."""
    edges = sorted([(t0, 1) for _, t0, _ in log] + [(t1, -1) for _, _, t1 in log])
    busy = both = 0.0
    level, last = 0, None
    for t, step in edges:
        if last is not None:
            busy += (t - last) * (level >= 1)
            both += (t - last) * (level >= 2)
        level, last = level + step, t
    return both / busy


def test_two_workers_share_a_tune_evenly_and_are_busy_together(tmp_path):
    """With two GPUs every measurement is split into a share on each, so the descent's batches of
    one variant keep both busy. Counts and overlap, not wall time."""
    log: list = []
    workers = [TimedWorker(two_basins, 0.05, log, name) for name in (0, 1)]
    result = run_class(tmp_path, max_trials=80, workers=workers, prefetch=FakePrefetch())
    assert len(workers[0].calls) == len(workers[1].calls)
    assert sorted(it for _, it in workers[0].calls) == sorted(it for _, it in workers[1].calls)
    # Both busy for most of the time either is (0.9 and more on an idle machine; the shares of a
    # variant start together, a loaded machine's threads lag a little).
    assert overlap(log) >= 0.6, overlap(log)
    # the same search as on one GPU
    alone = run_class(tmp_path, max_trials=80, db_name="alone.sqlite")
    assert [(t.variant, t.outcome, t.time_ms) for t in result.trials] == \
        [(t.variant, t.outcome, t.time_ms) for t in alone.trials]
    assert result.best.variant == alone.best.variant


def test_halving_retimes_go_to_every_worker_in_equal_shares():
    """Each re-timed variant is timed on every GPU with an equal share of the calls; the result is
    the mean, so a GPU that runs 10% slower shifts every variant alike and the order holds."""
    variants = [v for v in variant_mod.sample_space(S90, 800, FIXED, seed=4) if resources.check(v, SM90A).ok][:6]
    workers = [FakeWorker(two_basins), FakeWorker(lambda v: 1.1 * two_basins(v))]
    results = TrialRunner(workers, FakeBuild(), 10).run([Ask(v, retime=True, scale=2) for v in variants])
    for w in workers:
        assert sorted(it for _, it in w.calls) == [10] * 6
        assert sorted(c["block_n"] for c, _ in w.calls) == sorted(v["block_n"] for v in variants)
    # the workers start at different places in the list
    assert workers[0].calls[0][0] == dict(variants[0].values) and workers[1].calls[0][0] == dict(variants[3].values)
    for v, r in zip(variants, results):
        assert r.variant == v and r.time_ms == pytest.approx(1.05 * two_basins(v))
    order = sorted(variants, key=two_basins)
    assert sorted(variants, key=lambda v: results[variants.index(v)].time_ms) == order


def test_halving_in_a_tune_uses_both_workers(tmp_path):
    workers = [FakeWorker(two_basins), FakeWorker(two_basins)]
    result = run_class(tmp_path, workers=workers)
    # rungs 2 and 3 re-time 7 and 3 variants with 4 and 8 x 10 calls: 20 and 40 on each worker
    for iters, count in ((20, 7), (40, 3)):
        rung = [sorted(tuple(sorted(c.items())) for c, it in w.calls if it == iters) for w in workers]
        assert len(rung[0]) == count and rung[0] == rung[1]
    assert result.best.variant == FAR


def test_a_failed_share_fails_the_retiming():
    class Broken(FakeWorker):
        def run(self, values, iters, **request):
            return {"outcome": "crash", "detail": "worker process died (exit code -11)"}

    results = TrialRunner([FakeWorker(two_basins), Broken(two_basins)], FakeBuild(), 10).run(
        [Ask(DEFAULT, retime=True, scale=2), Ask(FAR, retime=True, scale=2)])
    assert [r.outcome for r in results] == ["crash", "crash"]


def test_guesses_are_compiled_ahead_and_never_measured_until_asked():
    guess = FAR.with_values(swizzle_v=128)
    assert resources.check(guess, SM90A).ok
    guessed = threading.Event()

    class Guessing(FakePrefetch):
        def __call__(self, variants, on_compiled=None):
            super().__call__(variants, on_compiled)
            guessed.set()

    class Measuring(FakeWorker):   # as a GPU would, still measuring while the guesses are made
        def run(self, values, iters, **request):
            assert guessed.wait(5)
            return super().run(values, iters, **request)

    workers = [Measuring(two_basins), Measuring(two_basins)]
    prefetch = Guessing()
    runner = TrialRunner(workers, FakeBuild(), 10, prefetch=prefetch)
    recorded = []
    first = runner.run([Ask(DEFAULT), Ask(FAR), Ask(DEFAULT.with_values(swizzle_v=64))],
                       on_result=lambda a, r: recorded.append(a.variant),
                       lookahead=lambda partial: [[guess], [DEFAULT]])
    assert all(r.outcome == "ok" for r in first) and len(recorded) == 3
    assert set(prefetch.queued) == {guess}       # what the batch holds is not guessed
    assert all(dict(guess.values) not in [c for c, _ in w.calls] for w in workers)
    second = runner.run([Ask(guess)], on_result=lambda a, r: recorded.append(a.variant))
    assert second[0].time_ms == pytest.approx(two_basins(guess)) and recorded[-1] == guess
    assert all([c for c, _ in w.calls].count(dict(guess.values)) == 1 for w in workers)


def test_prefetch_is_fed_while_a_batch_builds_and_never_cancelled_by_it():
    """Guesses queue behind the batch (the compile queue puts wanted variants first), so a real
    build no longer cancels them: a guess for the batch after next must survive the next batch."""
    events = []
    guessed = threading.Event()

    class Recording(FakePrefetch):
        def __call__(self, variants, on_compiled=None):
            events.append("guess")
            guessed.set()
            super().__call__(variants, on_compiled)

        def cancel(self):
            events.append("cancel")
            return super().cancel()

    class Measuring(FakeWorker):   # as a GPU would, still measuring while the guesses are made
        def run(self, values, iters, **request):
            assert guessed.wait(5)
            return super().run(values, iters, **request)

    def build(variants, on_built):
        events.append("build")
        FakeBuild()(variants, on_built)

    runner = TrialRunner([Measuring(two_basins)], build, 10, prefetch=Recording())
    runner.run([Ask(DEFAULT)], lookahead=lambda partial: [[FAR]])
    guessed.clear()
    runner.run([Ask(FAR, retime=True)], lookahead=lambda partial: [[DEFAULT.with_values(stages=3)]])
    assert sorted(events) == ["build", "guess", "guess"]


def test_a_failing_build_fails_the_batch_with_its_error():
    def build(variants, on_built):
        raise RuntimeError("the compile pool broke")

    runner = TrialRunner([FakeWorker(two_basins)], build, 10)
    with pytest.raises(RuntimeError, match="the compile pool broke"):
        runner.run([Ask(DEFAULT)])


def test_coordinate_lookahead_guesses_the_next_batches_while_the_point_stays():
    search = Coordinate(S90, FIXED, SM90A, 500, 0)
    guessed = []
    while batch := search.next_batch():
        if guessed:
            assert batch == guessed[0]
        guessed = list(search.lookahead())
        # the next LOOKAHEAD sweeps from the point, then one from each variant of the batch (the
        # point may move there)
        assert len(guessed) <= LOOKAHEAD + len(batch)
        last = batch
        # made before this batch is measured: the tuner leaves out what this batch holds
        guessed = [g for g in ([v for v in b if v not in batch] for b in guessed) if g]
        for v in batch:
            search.tell(v, 1.0 if resources.check(v, SM90A).ok else None)   # flat: the point never moves
    assert len(guessed) <= len(last)    # at the end only the sweeps from where the point might move


def test_coordinate_lookahead_guesses_the_next_batch_when_the_point_moves():
    """A descent moves its point after many sweeps; the guesses hold the batch that follows
    whichever variant the point moves to (so it is compiled ahead)."""
    start = FAR.with_values(block_n=64, stages=3, swizzle_v=128, load_warps=2)
    assert resources.check(start, SM90A).ok and distance(start, FAR) == 4
    search = Coordinate(S90, FIXED, SM90A, 500, 0, start=start)
    moves = missed = 0
    guessed: set = set()
    point = None
    while batch := search.next_batch():
        if point is not None:
            moves += search.point != point
            missed += not set(batch) <= guessed
        point = search.point
        guessed = {v for b in search.lookahead() for v in b}
        for v in batch:
            search.tell(v, two_basins(v) if resources.check(v, SM90A).ok else None)
    assert moves >= 2 and missed == 0


def test_coordinate_lookahead_puts_first_the_sweep_from_a_result_that_beats_the_point():
    """Told part of the batch (as the tuner is while the GPUs measure it): when a result already
    beats the point, the first guess is the sweep from it, which is the next batch when nothing
    later in the batch beats it."""
    start = FAR.with_values(block_n=64, stages=3, swizzle_v=128, load_warps=2)
    search = Coordinate(S90, FIXED, SM90A, 500, 0, start=start)
    hits = tried = 0
    while batch := search.next_batch():
        here = search.seen.get(search.point)
        times = {v: two_basins(v) if resources.check(v, SM90A).ok else None for v in batch}
        better = [v for v in batch if times[v] is not None and here is not None and times[v] < here]
        if better:
            first = better[0]   # the first result in that beats the point
            partial = {v: times[v] for v in batch[:batch.index(first) + 1]}
            guesses = list(search.lookahead(partial))
            best = min(better, key=lambda v: (times[v], v.symbol))
            if best == first:   # no later result of the batch beats it: the point moves there
                tried += 1
                for v in batch:
                    search.tell(v, times[v])
                nxt = search.next_batch()
                hits += bool(nxt) and nxt == guesses[0]
                if not nxt:
                    break
                batch = nxt
                times = {v: two_basins(v) if resources.check(v, SM90A).ok else None for v in batch}
        for v in batch:
            search.tell(v, times[v])
    assert tried >= 1 and hits == tried


def test_two_workers_resume_and_seeds(tmp_path):
    """With two workers and guessing: an interrupted tune resumes without repeating a finished
    trial and ends with the trials of an uninterrupted one; a seed gives the same trials."""
    build = FakeBuild()
    # The second worker fails in the first re-timing, after its shares of the 61 global trials: a
    # trial with a share cut off is no trial, so where it fails decides what was recorded.
    with pytest.raises(RuntimeError, match="power cut"):
        run_class(tmp_path, workers=[FakeWorker(two_basins), FakeWorker(two_basins, fail_after=61)], build=build,
                  prefetch=FakePrefetch())
    database = db.TuningDB(tmp_path / "t.sqlite")
    done = {t.symbol for t in database.trials()}
    assert len(done) == 61 and database.bests() == []
    build2 = FakeBuild()
    resumed = run_class(tmp_path, resume=True, build=build2, workers=[FakeWorker(two_basins), FakeWorker(two_basins)],
                        prefetch=FakePrefetch())
    assert not set(build2.built) & done
    assert sum(t.resumed for t in resumed.trials) == len(done)
    straight = run_class(tmp_path, db_name="straight.sqlite", workers=[FakeWorker(two_basins), FakeWorker(two_basins)],
                         prefetch=FakePrefetch())
    assert [t.variant for t in resumed.trials] == [t.variant for t in straight.trials]
    again = run_class(tmp_path, db_name="again.sqlite", workers=[FakeWorker(two_basins), FakeWorker(two_basins)],
                      prefetch=FakePrefetch())
    other = run_class(tmp_path, db_name="other.sqlite", seed=1,
                      workers=[FakeWorker(two_basins), FakeWorker(two_basins)], prefetch=FakePrefetch())
    assert [t.variant for t in again.trials] == [t.variant for t in straight.trials]
    assert [t.variant for t in other.trials] != [t.variant for t in straight.trials]


def test_workers_on_one_gpu_are_refused():
    from mlagen.errors import TuningError
    from mlagen.tune.orchestrate import _record_key

    one = {"device": "NVIDIA H200", "sm_count": 132, "driver": "13.0", "pci": "0000:1b:00"}
    other = {**one, "pci": "0000:43:00"}
    assert _record_key(S90, KEY.problem, SM90A, [one, other], (0, 1)).device == "NVIDIA H200"
    with pytest.raises(TuningError, match="two workers run on one GPU"):
        _record_key(S90, KEY.problem, SM90A, [one, dict(one)], (0, 1))


def test_parse_devices():
    assert parse_devices("0,1, 3") == (0, 1, 3)
    with pytest.raises(ValueError, match="'x' is not a GPU index"):
        parse_devices("0,x")
    with pytest.raises(ValueError, match="listed twice"):
        parse_devices("1,1")


# --- shape classes ------------------------------------------------------------------------------


def test_shape_classes_group_by_problem_key_and_order_by_weight():
    small = parse_shape("b=4,q=4000,h=16")            # same class as D2 (q rounds up to 4096)
    items = [WorkloadItem(SHAPES["D1"], 2), WorkloadItem(SHAPES["D2"], 3), WorkloadItem(small, 5),
             WorkloadItem(SHAPES["D3"], 1)]
    classes = shape_classes(items, DENSE)
    assert [c.problem for c in classes] == [problem_of(SHAPES["D2"], DENSE), problem_of(SHAPES["D1"], DENSE),
                                            problem_of(SHAPES["D3"], DENSE)]
    assert classes[0].weight == 8 and classes[0].shape == small and classes[0].members == [SHAPES["D2"], small]
    plain = shape_classes(["D1", "D2", Shape("X", (4096,) * 4, (4096,) * 4, 16, True)], DENSE)
    assert [c.weight for c in plain] == [1, 2][::-1] or [c.shape.id for c in plain] == ["D2", "D1"]


def test_tune_splits_the_budget_by_weight_and_starts_one_worker_per_device(tmp_path, monkeypatch):
    from mlagen import tune as tune_mod

    clock = Clock()
    started, workers, early = [], {}, []
    compiling = threading.Event()

    class Worker(FakeWorker):
        def __init__(self, spec_path, shape, seed, warmup, timeout_s, device=None):
            # half a second of the fake clock per share; a little real time, so that the two
            # workers take turns as GPUs would
            super().__init__(two_basins, clock=clock, seconds=1.0 / 2, delay=0.004, seed=device or 0)
            started.append((shape.id, device))
            workers.setdefault(shape.id, []).append(self)

        def start(self):
            # the search's first batch is handed to the compile pool while the workers start
            assert compiling.wait(5)
            return {"device": "Fake GPU", "sm_count": 132, "driver": "13.0"}

        def stop(self):
            pass

    class Guesses(FakePrefetch):
        """Records what is compiled ahead; never says a guess compiled, so none is measured
        (a guess measured would move the fake clock)."""

        pending = 0
        build = FakeBuild()

        def __call__(self, variants, on_compiled=None):
            early.append(list(variants))
            compiling.set()

        def close(self):
            pass

    from mlagen import runtime

    monkeypatch.setattr(orchestrate, "GpuWorker", Worker)
    monkeypatch.setattr(runtime, "device_count", lambda: 2)
    monkeypatch.setattr(runtime, "device_info", lambda i: type("I", (), {"name": "Fake GPU", "sm_count": 132,
                                                                        "driver_version": "13.0"})())
    monkeypatch.setattr(orchestrate, "CompileQueue", lambda pool, target, jobs: Guesses())
    # The shipped H100 records would be the records in use on this fake GPU of the same target:
    # with one as a finalist, a class whose search finds nothing faster records nothing.
    monkeypatch.setenv("MLAGEN_NO_SHIPPED", "1")
    config = TuneConfig(spec=S90.path, shapes=(WorkloadItem(SHAPES["D1"], 1), WorkloadItem(SHAPES["D2"], 3)),
                        db_path=str(tmp_path / "t.sqlite"), target="sm_90a", devices=(0, 1), budget_s=80.0,
                        jobs=1)
    results = tune_mod.tune(config, progress=lambda line: None, clock=clock)
    assert [r.shape for r in results] == ["D2", "D1"] and [r.weight for r in results] == [3, 1]
    assert started == [("D2", 0), ("D2", 1), ("D1", 0), ("D1", 1)]
    assert all(r.stopped == "budget" for r in results)
    # 60 s for D2 and 20 s for D1, 90% of each for the search, at half a second per share (each
    # measurement, a finalist's round too, is a share on each worker). A measurement one worker
    # has begun is finished by the other after the deadline: these fake workers take no time, so
    # one can run many shares ahead of the other (GPUs stay within a share or two).
    for r, want in zip(results, (108, 36)):
        calls = sum(len(w.calls) for w in workers[r.shape]) - 2 * sum(len(f.block_ms) for f in r.finals)
        assert want <= calls <= want + 30, (r.shape, calls)
    assert {b.key.problem for b in db.TuningDB(tmp_path / "t.sqlite").bests()} == {r.problem for r in results}
    # the first thing compiled ahead for D2 is its global stage: the default, then the samples
    first = early[0]
    # (the budget ends inside it: a measurement whose other share was cut off is no trial)
    tried = [t.variant for t in results[0].trials]
    assert len(first) == 1 + 60 and 40 <= len(tried) <= 61 and tried == [v for v in first if v in set(tried)]
    with pytest.raises(TuningError, match="--devices 2: only 2 GPU"):
        tune_mod.tune(replace(config, devices=(0, 2)), progress=lambda line: None, clock=clock)


def test_an_interrupted_batch_records_nothing_more_and_does_not_wait():
    release = threading.Event()
    recorded = []

    class Blocking(FakeWorker):
        def run(self, values, iters, **request):
            release.wait(5)
            return super().run(values, iters, **request)

    def interrupted_build(variants, on_built):
        on_built(BuildResult(variants[0], "sm_90a", None, "ok"))
        raise KeyboardInterrupt

    runner = TrialRunner([Blocking(two_basins)], interrupted_build, 10)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        runner.run([Ask(DEFAULT), Ask(FAR)], on_result=lambda a, r: recorded.append(r))
    assert time.monotonic() - t0 < 2
    release.set()
    time.sleep(0.1)
    assert recorded == []


def test_worker_protocol_verifies_once_then_times(monkeypatch):
    """_worker_main in a thread with a fake verifier: the request/answer protocol of the GPU worker."""
    import multiprocessing

    import torch

    from mlagen import measure, runtime, verify

    verified, timed = [], []

    class FakeVerifier:
        def __init__(self, family, shape, device, seed, dtype="bf16"):
            assert family.name == "mla_prefill" and shape.id == "D1"

        def verify(self, v, parts=PARTS):
            verified.append((v, parts))
            if v["block_n"] == 64 and "shape" in parts:
                return "shape: relative L2 error 5e-01 > 2e-02", 0.5
            return None, {"check problem": 1e-3, "shape": 2e-3, "stress": None}[parts[0]]  # no stress inputs

        def outputs(self):
            return None

        def call(self, v, outputs, check=False):
            if v["block_n"] == 80:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            timed.append(v)

        def flops(self):
            return 2e12

    class FakeDispatcher:
        def select(self, family, problem, specialization, device, accepts, variant=None):
            if variant["stages"] == 4:
                raise MlagenError("no such kernel")
            res = type("R", (), {"registers": 168, "spill_stores": 0, "spill_loads": 4})()
            return type("S", (), {"binary": type("B", (), {"resources": res})()})()

    monkeypatch.setattr(verify, "Verifier", FakeVerifier)
    monkeypatch.setattr(dispatch, "dispatcher", lambda: FakeDispatcher())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(measure, "L2Flush", lambda device: None)
    monkeypatch.setattr(measure, "time_calls", lambda fn, iters, flush: [(fn(), 1e-3)[1] for _ in range(iters)])
    monkeypatch.setattr(runtime, "device_info", lambda i: type("I", (), {"name": "Fake", "sm_count": 132,
                                                                        "driver_version": "13.0"})())
    parent, child = multiprocessing.Pipe()
    thread = threading.Thread(target=worker_mod._worker_main, args=(child, S90.path, SHAPES["D1"], 0, 2, None))
    thread.start()
    assert parent.recv() == ("ready", {"device": "Fake", "sm_count": 132, "driver": "13.0", "pci": ""})

    def ask(v, iters=5, **request):
        parent.send({"values": dict(v.values), "iters": iters, **request})
        return parent.recv()

    ok = ask(DEFAULT)
    assert ok["outcome"] == "ok" and ok["time_ms"] == pytest.approx(1.0) and ok["tflops"] == pytest.approx(2000)
    assert ok["spills"] == 4 and ok["max_error"] == 2e-3
    assert all(ok[k] >= 0 for k in ("load_s", "verify_s", "time_s")) and set(ok["checks_s"]) == set(PARTS)
    assert ask(DEFAULT, iters=20)["outcome"] == "ok"
    assert verified == [(DEFAULT, ("check problem",)), (DEFAULT, ("shape",)), (DEFAULT, ("stress",))]  # each once
    assert len(timed) == (2 + 5) + (2 + 20)                                       # warmup + iters
    # the tuner's requests: the checks to run here (none: time at once), the warm-up calls
    other = DEFAULT.with_values(block_n=96)
    timed.clear()
    only = ask(other, verify=["shape"], warmup=1)
    assert only["outcome"] == "ok" and only["max_error"] == 2e-3 and len(timed) == 1 + 5
    assert ask(other, verify=[])["max_error"] == 2e-3 and verified[-1] == (other, ("shape",))
    unchecked = ask(DEFAULT.with_values(block_n=112), verify=[])
    assert unchecked["outcome"] == "ok" and unchecked["max_error"] is None
    assert ask(DEFAULT.with_values(block_n=64), verify=["check problem"])["outcome"] == "ok"
    assert ask(DEFAULT.with_values(block_n=64))["outcome"] == "wrong_result"
    assert ask(DEFAULT.with_values(stages=4))["outcome"] == "launch_error"
    crash = ask(DEFAULT.with_values(block_n=80))
    assert crash["outcome"] == "crash" and "illegal memory access" in crash["detail"]
    thread.join(5)
    assert not thread.is_alive()   # a crash ends the worker: the parent starts a fresh one


def test_shape_classes_read_texts_with_the_specs_family():
    with pytest.raises(ShapeError, match="unknown shape id 'S1'; choose from D1"):
        shape_classes(["D1", "S1"], DENSE)


@pytest.mark.parametrize("spec_name, dtype", [("mla_prefill_sm90", "bf16"), ("mla_prefill_sm90_fp8", "fp8_e4m3")])
def test_worker_verifies_with_the_specs_input_dtype(monkeypatch, spec_name, dtype):
    """The GPU worker builds its inputs and references in the spec's problem.dtype, so an FP8
    spec is tuned on e4m3 inputs (with descales) and compared with the FP8 tolerance."""
    import multiprocessing

    import torch

    from mlagen import measure, runtime, verify

    seen = []

    class FakeVerifier:
        def __init__(self, family, shape, device, seed, dtype="bf16"):
            seen.append(dtype)

    monkeypatch.setattr(verify, "Verifier", FakeVerifier)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(measure, "L2Flush", lambda device: None)
    monkeypatch.setattr(runtime, "device_info", lambda i: type("I", (), {"name": "Fake", "sm_count": 132,
                                                                        "driver_version": "13.0"})())
    parent, child = multiprocessing.Pipe()
    thread = threading.Thread(target=worker_mod._worker_main,
                              args=(child, spec_mod.load(spec_name).path, SHAPES["D1"], 0, 2, None))
    thread.start()
    assert parent.recv()[0] == "ready"
    parent.send(None)
    thread.join(5)
    assert seen == [dtype]


def test_the_recorder_keeps_commits_off_the_workers_and_writes_in_order(tmp_path):
    from mlagen.tune.loop import _Recorder

    class SlowDB(db.TuningDB):
        commits: list = []

        def add_trials(self, trials):
            time.sleep(0.2)
            self.commits.append(len(trials))
            super().add_trials(trials)

    database = SlowDB(tmp_path / "t.sqlite")
    lines: list = []
    recorder = _Recorder(database, lines.append)
    t0 = time.monotonic()
    for n in range(5):
        trial = db.Trial(KEY, dict(DEFAULT.tunables), f"v{n}", "ok", 1.0, 1.0, 1e-3, 168, 0, "", "run")
        recorder.add(trial, lambda n=n: lines.append(f"trial {n}"))
        recorder.say(f"after {n}")
    assert time.monotonic() - t0 < 0.15          # adding waits for no commit
    recorder.close()
    assert [t.symbol for t in database.trials()] == [f"v{n}" for n in range(5)]
    assert lines == [x for n in range(5) for x in (f"trial {n}", f"after {n}")]
    assert sum(database.commits) == 5 and len(database.commits) < 5   # several trials per commit

    class BrokenDB(db.TuningDB):
        def add_trials(self, trials):
            raise db.DatabaseError("disk full")

    broken = _Recorder(BrokenDB(tmp_path / "b.sqlite"), lines.append)
    broken.add(db.Trial(KEY, dict(DEFAULT.tunables), "x", "ok", 1.0, 1.0, 1e-3, 168, 0, "", "run"), lambda: None)
    with pytest.raises(db.DatabaseError, match="disk full"):
        broken.close()


class SlowCompileQueue(FakePrefetch):
    """A compile queue whose guesses are compiled at once while every build takes ``build_s``
    (as when the guesses for a batch are still under way): the GPUs idle while a batch waits,
    and guesses are there to measure ahead."""

    def __init__(self, build_s: float):
        super().__init__()
        self.results: dict = {}
        self.build_s = build_s

    def __call__(self, variants, on_compiled=None):
        super().__call__(variants, on_compiled)
        for v in variants:
            verdict = resources.check(v, SM90A)
            self.results.setdefault(v, BuildResult(v, "sm_90a", verdict.resources, "ok" if verdict.ok else "pruned"))

    def build(self, variants, on_built):
        time.sleep(self.build_s)
        FakeBuild()(variants, on_built)


def test_measuring_guesses_ahead_while_the_gpus_wait_changes_no_trial(tmp_path):
    """With compiles slow, the runner measures compiled guesses while every GPU waits; a trial
    the search then asks for is answered by that measurement (no second measurement), and the
    trials are those of a tune that never measures ahead."""
    def tune_with(ahead: bool, name: str):
        queue = SlowCompileQueue(0.05)
        workers = [FakeWorker(two_basins), FakeWorker(two_basins)]
        config = TuneConfig(spec=S90.path, shapes=("D1",), max_trials=40, seed=0, iters=10)
        runner = TrialRunner(workers, queue.build, config.iters, prefetch=queue, measure_ahead=ahead)
        shape_class = ShapeClass(KEY.problem, SHAPES["D1"], 1.0, [SHAPES["D1"]])
        result = tune_class(S90, shape_class, SM90A, config, db.TuningDB(tmp_path / name), runner, KEY,
                            progress=lambda line: None)
        return result, runner, workers

    plain, plain_runner, plain_workers = tune_with(False, "plain.sqlite")
    ahead, runner, workers = tune_with(True, "ahead.sqlite")
    assert plain_runner.ahead_made == 0
    assert runner.ahead_made > 0 and runner.ahead_used > 0
    assert [t.variant for t in ahead.trials] == [t.variant for t in plain.trials]
    assert [t.time_ms for t in ahead.trials] == [t.time_ms for t in plain.trials]
    assert ahead.best.variant == plain.best.variant
    # A trial answered ahead is not measured again: each worker measured what the plain tune
    # did plus the guesses never asked for (one may still be running when the tune ends).
    wasted = runner.ahead_made - runner.ahead_used
    for w, p in zip(workers, plain_workers):
        assert len(p.calls) + wasted - 1 <= len(w.calls) <= len(p.calls) + wasted


def test_a_class_search_holds_every_specialization_axis():
    """A D1-class tune searches schedules of the kernel D1 needs, never a kernel of another head
    geometry or with score traits (a sink kernel run without a sink read a null pointer: 3 trials
    of a D1 tune crashed on the H200, 2026-12-02, before the search held these axes)."""
    from mlagen import arch, shapes
    from mlagen import spec as spec_mod
    from mlagen.tune.config import TuneConfig
    from mlagen.tune.loop import class_fixed
    from mlagen.tune.search import make_search

    spec = spec_mod.load("mla_prefill_sm90")
    shape = shapes.parse_shape("D1", "mla_prefill")
    fixed = class_fixed(spec, shape, TuneConfig(spec="mla_prefill_sm90", shapes=("D1",)))
    assert {name for name, _ in spec.specialize} <= set(fixed)
    assert fixed["mask"] == "causal" and fixed["geometry"] == "n128r64v128" and fixed["score"] == "plain"
    search = make_search("global", spec, fixed, arch.target("sm_90a"), 60, 0)
    proposed = []
    for _ in range(3):
        batch = search.next_batch()
        if not batch:
            break
        for ask in batch:
            v = getattr(ask, "variant", ask)
            search.tell(v, 1.0 + (sum(map(ord, v.symbol)) % 97) / 100, retime=getattr(ask, "retime", False))
            proposed.append(v)
    assert proposed and {(v["geometry"], v["score"], v["mask"]) for v in proposed} == {("n128r64v128", "plain", "causal")}


def test_a_trial_result_is_a_trial_without_its_key():
    """TrialResult and the database's Trial share records.MEASURED, in order; a result becomes the
    trial the database stores and a stored trial the result a resumed tune takes, field for field."""
    from dataclasses import fields

    from mlagen.records import MEASURED
    from mlagen.tune.config import TrialResult

    assert tuple(f.name for f in fields(TrialResult))[1:-1] == MEASURED
    assert tuple(f.name for f in fields(db.Trial))[3:-2] == MEASURED
    r = TrialResult(DEFAULT, "wrong_result", 1.5, 600.0, 0.25, 168, 2, "max error 0.25")
    t = r.trial(KEY, "run-x")
    assert (t.key, t.variant, t.symbol, t.run_id) == (KEY, dict(DEFAULT.tunables), DEFAULT.symbol, "run-x")
    assert (t.outcome, t.time_ms, t.tflops, t.max_error, t.registers, t.spills, t.detail) == \
        ("wrong_result", 1.5, 600.0, 0.25, 168, 2, "max error 0.25")
    assert TrialResult.resumed_from(DEFAULT, t) == replace(r, resumed=True)
