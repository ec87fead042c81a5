"""What a report shows, read from the tuning database and from ``mlagen bench --json`` files.

A shape class is the trials of one kernel spec on one problem bucket, dtype and device (every
run, source hash and toolchain together), with the winner the database records for it, the spec's
default variant and the shipped record that dispatch used before the tune.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from .. import db as db_mod
from ..errors import BenchError, DatabaseError

FASTEST = 8  # ok trials shown as finalists (the tune re-times the fastest few of these)


@dataclass(eq=False)
class ShapeClass:
    family: str
    spec: str
    problem: str
    dtypes: str
    device: str
    sm_count: int
    trials: list[db_mod.Trial]
    best: db_mod.Best | None = None          # the database's winner for this class
    shipped: db_mod.Best | None = None       # the record shipped with the package (what the tune replaced)
    defaults: dict | None = None             # the spec's default tunables; None if the spec is unknown here
    values: dict[str, tuple] = field(default_factory=dict)  # each tunable's allowed values, in spec order

    @property
    def title(self) -> str:
        return f"{self.spec} · {self.problem} · {self.dtypes} · {self.device} ({self.sm_count} SMs)"

    @property
    def anchor(self) -> str:
        return "c-" + "".join(c if c.isalnum() else "-" for c in f"{self.spec}-{self.problem}-{self.dtypes}")

    @functools.cached_property
    def timed(self) -> list[db_mod.Trial]:
        """The ok trials (every ok trial has a time)."""
        return [t for t in self.trials if t.outcome == "ok" and t.time_ms is not None]

    def fastest(self, n: int = FASTEST) -> list[db_mod.Trial]:
        """The n fastest ok trials, one per variant (a variant measured in two runs counts once)."""
        seen, out = set(), []
        for t in sorted(self.timed, key=lambda t: t.time_ms):
            if t.symbol not in seen:
                seen.add(t.symbol)
                out.append(t)
            if len(out) == n:
                break
        return out

    def default_trial(self) -> db_mod.Trial | None:
        """The fastest ok trial of the spec's default variant, if one was measured."""
        if not self.defaults:
            return None
        hits = [t for t in self.timed if t.variant and all(self.defaults.get(k) == v for k, v in t.variant.items())]
        return min(hits, key=lambda t: t.time_ms, default=None)

    @functools.cached_property
    def _seen(self) -> dict[str, dict[tuple, object]]:
        """Each tunable's values over the trials (by :func:`value_key`)."""
        seen: dict[str, dict[tuple, object]] = {}
        for t in self.trials:
            for k, v in t.variant.items():
                seen.setdefault(k, {})[value_key(v)] = v
        return seen

    @functools.cached_property
    def varied(self) -> list[str]:
        """Tunables whose value varies over the trials, the spec's order first."""
        order = list(self.values) + sorted(k for k in self._seen if k not in self.values)
        return [k for k in order if len(self._seen.get(k, ())) > 1]

    def held(self) -> dict[str, object]:
        """Tunables held at one value in every trial."""
        return {k: next(iter(v.values())) for k, v in self._seen.items() if len(v) == 1}

    def value_order(self, name: str) -> list:
        """A tunable's values as the axis lists them: the spec's order, then any others seen."""
        known = list(self.values.get(name, ()))
        keys = {value_key(v) for v in known}
        extra = [v for k, v in self._seen.get(name, {}).items() if k not in keys]
        return known + sorted(extra, key=lambda v: (type(v).__name__, str(v)))

    @functools.lru_cache(maxsize=None)
    def importance(self, name: str) -> float:
        """How much a tunable matters: the slowest of its values' best times over the fastest
        (1.0: any value reaches the same best time)."""
        bests: dict[tuple, float] = {}
        for t in self.timed:
            if name in t.variant:
                k = value_key(t.variant[name])
                if t.time_ms < bests.get(k, math.inf):
                    bests[k] = t.time_ms
        return max(bests.values()) / min(bests.values()) if len(bests) > 1 else 1.0


_SCALARS = frozenset((int, float, str, bool, type(None)))


def value_key(v) -> tuple:
    """A tunable value as a key that tells 1 from True from "1" (and takes any JSON value)."""
    return (v.__class__, v) if v.__class__ in _SCALARS else (str, json.dumps(v, default=str))


def gather(database: db_mod.TuningDB, run_id: str | None = None, shapes: tuple[str, ...] = ()) -> list[ShapeClass]:
    """The shape classes of ``database`` (only run ``run_id``; only the problem buckets ``shapes``),
    in the order of their first trial."""
    path = Path(database.path)
    if not path.is_file():
        raise DatabaseError(f"{path}: no such tuning database")
    trials = database.trials(run_id=run_id)
    if run_id is not None and not trials:
        known = sorted({r["run_id"] for r in database.runs()})
        raise DatabaseError(f"{path}: no trials of run {run_id!r}; runs: {', '.join(known) or 'none'}")
    if shapes:
        known = sorted({t.key.problem for t in trials})
        missing = [s for s in shapes if s not in known]
        if missing:
            raise DatabaseError(f"{path}: no trials of shape class {missing[0]!r}; shape classes: "
                                f"{', '.join(known) or 'none'}")
        trials = [t for t in trials if t.key.problem in shapes]
    groups: dict[tuple, list[db_mod.Trial]] = {}
    for t in sorted(trials, key=lambda t: t.created):
        k = t.key
        groups.setdefault((k.family, k.spec, k.problem, k.dtypes, k.device, k.sm_count), []).append(t)
    bests = database.bests()
    shipped = db_mod.shipped_records()
    specs: dict[str, object] = {}
    out = []
    for key, ts in groups.items():
        c = ShapeClass(*key, trials=ts)
        c.best = _newest([b for b in bests if _same_class(b.key, key)
                          and (run_id is None or b.run_id == run_id)])
        c.shipped = _newest([b for b in shipped if _same_class(b.key, key)])
        spec = _spec(c.spec, specs)
        if spec is not None:
            c.defaults = {t.name: t.default for t in spec.tunables}
            c.values = {t.name: tuple(t.values) for t in spec.tunables}
        out.append(c)
    return out


def _same_class(key: db_mod.RecordKey, cls: tuple) -> bool:
    return (key.family, key.spec, key.problem, key.dtypes, key.device, key.sm_count) == cls


def _newest(records: list[db_mod.Best]) -> db_mod.Best | None:
    return max(records, key=lambda b: b.updated, default=None)


def _spec(name: str, cache: dict):
    """The packaged spec ``name``, or None when this mlagen has none of that name (an old record)."""
    from .. import spec as spec_mod

    if name not in cache:
        known = {p.stem: p for p in spec_mod.available()}
        cache[name] = spec_mod.load(known[name]) if name in known else None
    return cache[name]


# --- bench JSON --------------------------------------------------------------------------------


@dataclass
class PeerBar:
    name: str
    median_s: float | None
    rounds_s: tuple[float, ...]      # each round's median
    error: str | None
    note: str
    ours: bool


@dataclass
class BenchShape:
    family: str
    shape: str
    description: str
    flops: float
    peers: list[PeerBar]

    def strongest(self) -> PeerBar | None:
        """The fastest peer that is not ours (the one to beat); the fastest of all if every peer is ours."""
        timed = [p for p in self.peers if p.median_s is not None]
        rivals = [p for p in timed if not p.ours] or timed
        return min(rivals, key=lambda p: p.median_s, default=None)

    def tflops(self, seconds: float | None) -> float | None:
        return self.flops / seconds / 1e12 if seconds and self.flops else None


@dataclass
class BenchFile:
    path: str
    environment: dict
    shapes: list[BenchShape]

    @property
    def device(self) -> str:
        return str(self.environment.get("device", "unknown device"))


def read_bench(path: Path | str) -> BenchFile:
    """A file written by ``mlagen bench --json``; a file of another kind is refused in one line."""
    path = Path(path)
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise BenchError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BenchError(f"{path}: not a bench JSON file ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise BenchError(f"{path}: not a bench JSON file (expected an object with \"results\", as "
                         "mlagen bench --json writes)")
    env = doc.get("environment") if isinstance(doc.get("environment"), dict) else {}
    shapes = []
    for i, r in enumerate(doc["results"]):
        where = f"{path}: results[{i}]"
        if not isinstance(r, dict) or not isinstance(r.get("peers"), dict):
            raise BenchError(f"{where}: expected an object with \"peers\"")
        ratios = r.get("ratios") if isinstance(r.get("ratios"), dict) else {}
        ours = {k.split("/", 1)[0] for k in ratios}
        peers = [_peer(name, p, name in ours, f"{where}.peers.{name}") for name, p in r["peers"].items()]
        flops = r.get("flops")
        if not _number(flops) or flops <= 0:
            raise BenchError(f"{where}.flops: expected a positive number, got {flops!r}")
        shapes.append(BenchShape(str(r.get("family", "")), str(r.get("shape", f"#{i}")),
                                 str(r.get("description", "")), float(flops), peers))
    return BenchFile(str(path), env, shapes)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _peer(name: str, p, ours: bool, where: str) -> PeerBar:
    if not isinstance(p, dict):
        raise BenchError(f"{where}: expected an object")
    timing = p.get("timing")
    median, rounds = None, ()
    if isinstance(timing, dict):
        median = timing.get("median_s")
        if not _number(median) or median <= 0:
            raise BenchError(f"{where}.timing.median_s: expected a positive number, got {median!r}")
        blocks = timing.get("block_medians_s") or []
        if not isinstance(blocks, list) or not all(_number(b) and b > 0 for b in blocks):
            raise BenchError(f"{where}.timing.block_medians_s: expected a list of positive numbers")
        rounds = tuple(float(b) for b in blocks)
    error = p.get("error")
    check = p.get("check")
    if isinstance(check, dict) and check.get("problem"):  # measured, but its output was wrong
        error = f"WRONG ({check['problem']})"
    return PeerBar(str(name), float(median) if median is not None else None, rounds,
                   None if error is None else str(error), str(p.get("note") or ""), ours)
