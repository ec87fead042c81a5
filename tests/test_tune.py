"""mlagen.tune search strategies, driven with a synthetic cost instead of a GPU."""

from __future__ import annotations

from mlagen import arch, resources
from mlagen import spec as spec_mod
from mlagen import variant as variant_mod
from mlagen.tune import Coordinate, Exhaustive, Global, make_search

S80 = spec_mod.load("mla_prefill_sm80")
SM90A = arch.target("sm_90a")
FIXED = {"mask": "causal"}


def run(search, cost) -> variant_mod.Variant:
    """Feed the search until it stops; pruned variants fail, as in the tuner. Returns the best."""
    while True:
        batch = search.next_batch()
        if not batch:
            break
        for v in batch:
            search.tell(v, cost(v) if resources.check(v, SM90A).ok else None)
    return min(search.seen, key=search.seen.get)


def test_coordinate_descent_uses_a_gain_found_on_the_last_axis():
    # q_in_regs (the last axis) pays off alone; stages=3 pays off only once q_in_regs is off, so
    # finding it needs a second pass that starts from the point the last axis moved to.
    def cost(v):
        return 10.0 - 3 * (not v["q_in_regs"]) - 2 * (v["stages"] == 3 and not v["q_in_regs"])

    best = run(Coordinate(S80, FIXED, SM90A, 200, 0), cost)
    assert best["q_in_regs"] is False and best["stages"] == 3


def test_coordinate_descent_stops_when_a_pass_improves_nothing():
    search = Coordinate(S80, FIXED, SM90A, 200, 0)
    run(search, lambda v: 1.0)
    assert search.passes == 0
    free = [t for t in S80.tunables if len(t.values) > 1]
    # The default, then one sweep (values that only fit elsewhere may land on an already seen point).
    assert len(search.seen) <= 1 + sum(len(t.values) - 1 for t in free)
    for t in free:
        assert {v[t.name] for v in search.seen} == set(t.values), t.name


def test_coordinate_descent_reaches_values_behind_constraints():
    # A 4-deep ring of 128-key tiles does not fit in shared memory: the sweep of the stages axis
    # must try 4 stages where they fit (smaller tiles) instead of recording them as pruned.
    s90 = spec_mod.load("mla_prefill_sm90")
    search = Coordinate(s90, FIXED, SM90A, 500, 0)
    best = run(search, lambda v: 1.0 - 0.5 * (v["stages"] == 4))
    assert best["stages"] == 4 and resources.check(best, SM90A).ok
    first = next(v for v in search.seen if v["stages"] == 4)  # seen keeps proposal order
    assert resources.check(first, SM90A).ok and first["block_n"] < 128
    # Held tunables are never changed to make a value fit.
    search = Coordinate(s90, {**FIXED, "block_n": 128}, SM90A, 500, 0)
    run(search, lambda v: 1.0)
    assert all(v["block_n"] == 128 for v in search.seen)


def test_coordinate_descent_reaches_clusters():
    # cluster 2 does not fit the default (dynamic) scheduler; it is tried on a static or
    # persistent one, and the next pass tunes the scheduler with the cluster in place.
    s90 = spec_mod.load("mla_prefill_sm90")
    search = Coordinate(s90, FIXED, SM90A, 500, 0)
    best = run(search, lambda v: 1.0 - 0.5 * (v["cluster"] == 2) - 0.1 * (v["cluster"] == 2 and
                                                                           v["scheduler"] == "static"))
    assert best["cluster"] == 2 and best["scheduler"] == "static"


def test_exhaustive_covers_a_small_space_and_auto_picks_it():
    assert isinstance(make_search("auto", S80, FIXED, SM90A, 200, 0), Exhaustive)
    assert isinstance(make_search("auto", S80, FIXED, SM90A, 10, 0), Global)
    search = Exhaustive(S80, FIXED, SM90A, 200, 0)
    assert len(search.next_batch()) == variant_mod.space_size(S80, FIXED) and search.next_batch() == []
