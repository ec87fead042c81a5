"""The final re-timing of the fastest variants and the choice of the winner within the noise."""

from __future__ import annotations

from dataclasses import replace

from .. import variant as variant_mod
from .config import EXTRA_ROUNDS, FINALIST_DISTANCE, NOISE_CAP, NOISE_FLOOR, Final, TuneConfig, _median
from .runner import TrialRunner
from .search import Ask

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
    tied = [f for f in finals if f.median_ms <= fastest.median_ms * (1 + noise_allowance(fastest, f))]
    winner = min(tied, key=lambda f: (_distance(f.variant, default), f.variant.symbol))
    kept = next((f for f in finals if f.variant == keep), None)
    if kept is None or kept is winner or beats(winner, kept):
        return winner
    return kept


def noise_allowance(a: Final, b: Final) -> float:
    """How far apart (a fraction of the faster median) two finalists' medians may be and still
    count as tied: the larger relative spread of their rounds, at least NOISE_FLOOR, at most
    NOISE_CAP. :func:`choose` ties finalists by it; ``mlagen db compare --retime`` judges two
    databases' winners by it."""
    return min(NOISE_CAP, max(NOISE_FLOOR, a.noise, b.noise))


def beats(a: Final, b: Final) -> bool:
    """``a`` was faster than ``b`` in every round both ran, by NOISE_FLOOR in the median ratio."""
    ratios = [x / y for x, y in zip(a.block_ms, b.block_ms)]
    return bool(ratios) and max(ratios) < 1 and _median(ratios) <= 1 - NOISE_FLOOR
