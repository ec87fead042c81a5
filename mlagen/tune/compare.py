"""Two tunes' winners side by side (``mlagen db compare A.sqlite B.sqlite [--retime]``).

Two tunes of one workload (a local tune and a cluster tune, two seeds, two hosts' databases) may
record different winners for a shape class while neither is faster: the tuner ties finalists
within their measured noise, and the search's path follows noisy single timings. The times the
two databases recorded come from different runs (other clocks, another temperature), so they do
not settle it. :func:`pairs` finds the record keys both databases hold and their two winners;
:func:`retime` checks both winners against the reference and times them in one process on this
GPU, in interleaved rounds (the L2 flushed before every call, the two taking turns to go first),
and judges them as the tuner judges its finalists: medians within
:func:`mlagen.tune.finals.noise_allowance` of each other are a tie.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from .. import spec as spec_mod
from .. import variant as variant_mod
from ..db import TuningDB
from ..records import Best, RecordKey, source_hash
from .config import EXTRA_ROUNDS, FINAL_ROUNDS, Final, family_of
from .finals import noise_allowance

ROUNDS = FINAL_ROUNDS + EXTRA_ROUNDS   # the rounds the tuner's final re-timing gives two close finalists
ITERS = 20                            # timed calls per round (the tuner's default --iters)
WARMUP = 3                            # calls before each round's timed ones (the tuner's warm-up)


@dataclass(frozen=True)
class Pair:
    """One record key both databases hold, with each database's winner for it."""

    key: RecordKey
    a: Best
    b: Best

    @property
    def same(self) -> bool:
        return self.a.symbol == self.b.symbol

    def differing(self) -> list[tuple[str, object, object]]:
        """The tunables the two winners set differently: (name, A's value, B's value)."""
        names = list(self.a.variant) + [k for k in self.b.variant if k not in self.a.variant]
        return [(k, self.a.variant.get(k), self.b.variant.get(k)) for k in names
                if self.a.variant.get(k) != self.b.variant.get(k)]


@dataclass
class Retimed:
    """Both winners re-timed on one shape: each round's median in ms, A's and B's rounds in turn."""

    shape: str
    a: Final
    b: Final

    @property
    def ratio(self) -> float:
        """B's median over A's."""
        return self.b.median_ms / self.a.median_ms

    @property
    def allowance(self) -> float:
        return noise_allowance(self.a, self.b)

    @property
    def within(self) -> bool:
        """Tied by the tuner's rule: the slower median no further than the allowance above the faster."""
        fast, slow = sorted((self.a.median_ms, self.b.median_ms))
        return slow <= fast * (1 + self.allowance)


@dataclass
class Comparison:
    """What ``db compare`` found for one pair: its verdict, and the re-timing if one was made."""

    pair: Pair
    retimed: Retimed | None = None
    note: str = ""    # why it was not re-timed, or what failed

    @property
    def verdict(self) -> str:
        if self.pair.same:
            return "same"
        if self.retimed is None:
            return "differ" + (f" (not re-timed: {self.note})" if self.note else " (not re-timed; --retime times them here)")
        if self.retimed.within:
            return "within noise"
        return f"{'A' if self.retimed.ratio > 1 else 'B'} faster beyond the noise"


@dataclass
class Listing:
    """Every record key of two databases: the pairs both hold, and the winners only one holds."""

    pairs: list[Pair]
    only_a: list[Best] = field(default_factory=list)
    only_b: list[Best] = field(default_factory=list)


def pairs(a: TuningDB, b: TuningDB, spec: str | None = None) -> Listing:
    """The winners of ``a`` and ``b`` matched by record key (family, spec, shape class, dtypes,
    device, driver, compiler, source hash), in ``a``'s order; ``spec`` keeps only that spec's."""
    where = {} if spec is None else {"spec": spec}
    ours = {r.key: r for r in a.bests(**where)}
    theirs = {r.key: r for r in b.bests(**where)}
    return Listing([Pair(k, r, theirs[k]) for k, r in ours.items() if k in theirs],
                   [r for k, r in ours.items() if k not in theirs], [r for k, r in theirs.items() if k not in ours])


def interleave(items: Sequence, rounds: int, block: Callable[[object], float]) -> list[list[float]]:
    """``block(item)`` (one round's median of ``item``) for every item in each of ``rounds``
    rounds, the order reversed every other round, so neither goes first in every round (the
    first after a pause runs at other clocks). Returns each item's rounds, in the items' order."""
    out: list[list[float]] = [[] for _ in items]
    order = list(range(len(items)))
    for r in range(rounds):
        for i in (order if r % 2 == 0 else order[::-1]):
            out[i].append(block(items[i]))
    return out


def retime(pair: Pair, rounds: int = ROUNDS, iters: int = ITERS, warmup: int = WARMUP, seed: int = 0,
           shape_text: str | None = None, device=None, info=None, flush=None) -> Comparison:
    """Check both winners of ``pair`` and time them on this GPU (:func:`interleave`, each round
    ``warmup`` calls then ``iters`` calls timed by CUDA events with the L2 flushed before each,
    :func:`mlagen.measure.time_calls`), on ``shape_text`` if it is of the pair's shape class, else
    on the first named shape of the class (the shapes ``mlagen check --gpu`` times). A pair made
    on another device or for other kernel sources is not re-timed, and the comparison says why.
    Needs a CUDA GPU (:func:`mlagen.measure.require_gpu`)."""
    from .. import measure, verify

    if pair.same:
        return Comparison(pair)
    measure.require_gpu("db compare --retime")
    import torch

    from ..runtime import device_info
    from ..shapes import parse_shape

    device = torch.device("cuda", torch.cuda.current_device()) if device is None else device
    info = device_info(device.index) if info is None else info
    key = pair.key
    if (info.name, info.sm_count) != (key.device, key.sm_count):
        return Comparison(pair, note=f"made on {key.device} ({key.sm_count} SMs), this GPU is {info.name} "
                                     f"({info.sm_count} SMs)")
    spec = spec_mod.load(key.spec)
    if source_hash(spec) != key.source_hash:
        return Comparison(pair, note=f"made for other sources of {spec.name} ({key.source_hash}, "
                                     f"now {source_hash(spec)})")
    family = family_of(spec)
    shape = None
    if shape_text is not None:
        shape = parse_shape(shape_text, spec)
        if not family.problem_covers(key.problem, shape):   # (an old sparse key covers every pool size)
            shape = None
    if shape is None:
        named = family.check_shapes(key.problem)
        if not named:
            return Comparison(pair, note=f"no named shape of class {key.problem}; give --shape")
        shape = named[0]
    special = family.problem_specialization(key.problem)
    variants = [variant_mod.make(spec, {**r.variant, **special}) for r in (pair.a, pair.b)]
    trial = verify.Verifier(family, shape, device, seed, dtype=str(dict(spec.problem).get("dtype", "bf16")))
    for label, v in zip("AB", variants):
        problem, _ = trial.verify(v)
        if problem is not None:
            return Comparison(pair, note=f"{label}'s winner is wrong here: {problem}")
    flush = measure.L2Flush(device) if flush is None else flush
    outputs = trial.outputs()

    def block(v) -> float:
        for _ in range(warmup):
            trial.call(v, outputs)
        return measure.median(measure.time_calls(lambda: trial.call(v, outputs), iters, flush)) * 1e3

    ms_a, ms_b = interleave(variants, rounds, block)
    return Comparison(pair, Retimed(getattr(shape, "id", "") or family.describe_shape(shape),
                                    Final(variants[0], ms_a), Final(variants[1], ms_b)))


def lines(listing: Listing, compared: list[Comparison]) -> list[str]:
    """What ``db compare`` prints: per pair both winners, the tunables they differ in, the
    re-timing and the verdict; then the keys only one database holds, and a count of verdicts."""
    out = []
    for c in compared:
        p, k = c.pair, c.pair.key
        out.append(f"{k.spec} {k.problem} {k.dtypes} on {k.device} ({k.sm_count} SMs):")
        out.append(f"  A {p.a.symbol} (recorded {p.a.time_ms:.3f} ms)")
        out.append(f"  B {p.b.symbol} (recorded {p.b.time_ms:.3f} ms)")
        if not p.same:
            out.append("  tunables that differ (A | B): " + ", ".join(f"{n} {x} | {y}" for n, x, y in p.differing()))
        r = c.retimed
        if r is not None:
            out.append(f"  re-timed on {r.shape}, {len(r.a.block_ms)} rounds: A {r.a.median_ms:.3f} ms "
                       f"(rounds {min(r.a.block_ms):.3f}-{max(r.a.block_ms):.3f}), B {r.b.median_ms:.3f} ms "
                       f"(rounds {min(r.b.block_ms):.3f}-{max(r.b.block_ms):.3f}); B/A {r.ratio:.3f}, "
                       f"noise allowance {r.allowance:.1%}")
        out.append(f"  verdict: {c.verdict}")
    for label, only in (("A", listing.only_a), ("B", listing.only_b)):
        for b in only:
            out.append(f"only in {label}: {b.key.spec} {b.key.problem} {b.key.dtypes} on {b.key.device} "
                       f"({b.key.sm_count} SMs): {b.symbol}")
    counts: dict[str, int] = {}
    for c in compared:
        v = c.verdict.split(" (")[0]
        counts[v] = counts.get(v, 0) + 1
    out.append(f"{len(compared)} shape class(es) in both" + "".join(f", {n} {v}" for v, n in counts.items())
               + f"; {len(listing.only_a)} only in A, {len(listing.only_b)} only in B")
    return out
